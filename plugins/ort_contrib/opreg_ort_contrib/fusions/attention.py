"""Attention rules: the keys and values ``repeat_kv`` repeated, read unrepeated by GroupQueryAttention
(below ai.onnx 23) or by Attention with ``kv_num_heads`` (at 23 and 24); and the attention kernels
reading a KV cache in its (batch, heads, seq, size) layout instead of a moved copy of it; and, for
ONNX Runtime releases before 1.22, MultiHeadAttention's bias expanded to its heads and GroupQueryAttention
with a bias made MultiHeadAttention on repeated keys and values."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from opreg_ort_contrib import CONTRIB_DOMAIN
from opreg_ort_contrib.fusions.values import dims_of, float32, ints, shaped, size_of, size_source


def _merged(op, heads, shape):
    """The pattern of (batch, heads, seq, size) ``heads`` moved into (batch, seq, hidden) by Reshape to ``shape``."""
    return op.Reshape(op.Transpose(heads, perm=[0, 2, 1, 3]), shape, _allow_other_attributes=True)


def _repeated_heads(op, x, axes, shape5, shape4, shape3):
    """transformers' ``repeat_kv`` of (batch, kv heads, seq, size) heads, merged into (batch, seq, hidden)."""
    heads = op.Reshape(op.Expand(op.Unsqueeze(x, axes), shape5), shape4, _allow_other_attributes=True)
    return _merged(op, heads, shape3)


def _attention(kernel, query, key, value, **domain):
    """The pattern of an attention node (``op.Attention``, or ``op.MultiHeadAttention`` with
    ``_domain=CONTRIB_DOMAIN``) on ``query``, ``key`` and ``value`` and whatever other inputs and
    attributes, its output named ``out``."""
    return kernel(query, key, value, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["out"], **domain)


def _merges_heads(shape_k, shape_v) -> bool:
    """Both Reshapes of :func:`_merged` merge the heads into (batch, seq, hidden)."""
    return ints(shape_k) == [0, 0, -1] and ints(shape_v) == [0, 0, -1]


def _check_repeated(result, query, key, value, axes_k, axes_v, bsd_k, bsd_v, heads: int):
    """``None`` if the keys and values are ``heads // kv heads`` repeats of float32 (batch, kv
    heads, seq, size) heads of the query's length, else the failed ``result``."""
    if ints(axes_k) != [2] or ints(axes_v) != [2] or ints(bsd_k) != [0, 0, -1] or ints(bsd_v) != [0, 0, -1]:
        return result.fail("not a repeat of the heads (Unsqueeze axis 2) into (batch, seq, hidden)")
    q, k, v = dims_of(query), dims_of(key), dims_of(value)
    if q is None or k is None or v is None or len(q) != 3 or len(k) != 4 or len(v) != 4:
        return result.fail("shapes unknown")
    kv_heads, size = k[1], k[3]
    if not isinstance(kv_heads, int) or not isinstance(size, int) or kv_heads == heads or heads % kv_heads:
        return result.fail("not fewer key/value heads than query heads")
    if v[1] != kv_heads or k[2] != v[2] or q[2] != heads * size:
        return result.fail("keys and values do not match")
    return None if float32(query, key, value) else result.fail("float32 only")


def _heads_last(op, x):
    """(batch, heads, seq, size) -> (batch, seq, heads * size), shaped."""
    b, h, s, d = x.shape
    merged = op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))
    return shaped(merged, [b, s, h * d], x)


class GroupQueryAttention(pattern.RewriteRuleClassBase):
    """MultiHeadAttention over ``repeat_kv``'d keys and values -> GroupQueryAttention (below ai.onnx 23)."""

    def pattern(self, op, query, key, value, keys5, values5, keys4, values4, axes_k, axes_v, bsd_k, bsd_v):
        key = _repeated_heads(op, key, axes_k, keys5, keys4, bsd_k)
        value = _repeated_heads(op, value, axes_v, values5, values4, bsd_v)
        return _attention(op.MultiHeadAttention, query, key, value, _domain=CONTRIB_DOMAIN)

    def check(self, context, query, key, value, axes_k, axes_v, bsd_k, bsd_v, out, **_):
        result = pattern.MatchResult()
        node = out.producer()
        extra = list(node.inputs[3:])
        if len(extra) > 3 or any(v is not None for v in extra[:2]):
            return result.fail("MultiHeadAttention with a packed bias or a key padding mask")
        if any(a.name not in ("num_heads", "scale", "unidirectional") for a in node.attributes.values()):
            return result.fail("MultiHeadAttention attributes GroupQueryAttention has no counterpart for")
        heads = node.attributes["num_heads"].as_int()
        failed = _check_repeated(result, query, key, value, axes_k, axes_v, bsd_k, bsd_v, heads)
        if failed is not None:
            return failed
        if dims_of(query)[1] != dims_of(key)[2]:
            return result.fail("query and key lengths differ (GroupQueryAttention without a cache needs them equal)")
        self._heads, self._kv_heads = heads, dims_of(key)[1]
        self._batch, self._length = size_source(context, query, 0), size_source(context, query, 1)
        self._attributes = {a.name: a.value for a in node.attributes.values() if a.name == "scale"}
        self._causal = node.attributes["unidirectional"].as_int() if "unidirectional" in node.attributes else 0
        self._bias = extra[2] if len(extra) == 3 else None
        return result

    def rewrite(self, op, query, key, value, **_):
        # the key's length is the query's (checked): read it where every layer can share it
        total = op.Cast(size_of(op, self._length), to=ir.DataType.INT32)
        one = op.Constant(value=ir.tensor(np.array([1], dtype=np.int32)))
        seqlens = op.Expand(op.Sub(total, one), size_of(op, self._batch))
        return op.GroupQueryAttention(
            query, _heads_last(op, key), _heads_last(op, value), None, None, seqlens, op.Squeeze(total), None, None,
            None, self._bias, num_heads=self._heads, kv_num_heads=self._kv_heads, causal=self._causal,
            _domain=CONTRIB_DOMAIN, _outputs=1, **self._attributes,
        )  # fmt: skip


class GroupedAttention(pattern.RewriteRuleClassBase):
    """ai.onnx Attention (3-D) over ``repeat_kv``'d keys and values -> Attention with ``kv_num_heads``
    on the unrepeated ones: no copies of the keys and values."""

    def pattern(self, op, query, key, value, keys5, values5, keys4, values4, axes_k, axes_v, bsd_k, bsd_v):
        key = _repeated_heads(op, key, axes_k, keys5, keys4, bsd_k)
        value = _repeated_heads(op, value, axes_v, values5, values4, bsd_v)
        return _attention(op.Attention, query, key, value)

    def check(self, context, query, key, value, axes_k, axes_v, bsd_k, bsd_v, out, **_):
        result = pattern.MatchResult()
        node = out.producer()
        if len(node.inputs) > 4 or "q_num_heads" not in node.attributes:
            return result.fail("not a 3-D Attention without a cache")
        heads = node.attributes["q_num_heads"].as_int()
        failed = _check_repeated(result, query, key, value, axes_k, axes_v, bsd_k, bsd_v, heads)
        if failed is not None:
            return failed
        self._kv_heads = dims_of(key)[1]
        self._mask = node.inputs[3] if len(node.inputs) == 4 else None
        self._attributes = {a.name: a.value for a in node.attributes.values() if a.name != "kv_num_heads"}
        return result

    def rewrite(self, op, query, key, value, **_):
        return op.Attention(
            query, _heads_last(op, key), _heads_last(op, value), self._mask,
            kv_num_heads=self._kv_heads, _outputs=1, **self._attributes,
        )  # fmt: skip


class MultiHeadAttentionOnHeads(pattern.RewriteRuleClassBase):
    """MultiHeadAttention whose keys and values are still moved from (batch, heads, seq, size)
    into (batch, seq, hidden) -> MultiHeadAttention on the 4-D keys and values, which it takes
    as they are. The move cancels out where the heads were just split off a projection (the
    lean pass removes it before the rules run); it stays where they were not, as a KV cache
    read whole in a decode step, and there it is a copy of the whole cache per layer."""

    def pattern(self, op, query, key, value, shape_k, shape_v):
        key, value = _merged(op, key, shape_k), _merged(op, value, shape_v)
        return _attention(op.MultiHeadAttention, query, key, value, _domain=CONTRIB_DOMAIN)

    def check(self, context, query, key, value, shape_k, shape_v, out, **_):
        result = pattern.MatchResult()
        node = out.producer()
        if not _merges_heads(shape_k, shape_v):
            return result.fail("not the heads merged into (batch, seq, hidden)")
        extra = list(node.inputs[3:])
        if len(extra) > 3 or any(v is not None for v in extra[:2]):
            return result.fail("MultiHeadAttention with a packed bias or a key padding mask")
        k, v = dims_of(key), dims_of(value)
        heads = node.attributes["num_heads"].as_int()
        if k is None or v is None or len(k) != 4 or len(v) != 4 or k[1] != heads or v[1] != heads:
            return result.fail("keys and values are not (batch, heads, seq, size)")
        self._node = node
        return result

    def rewrite(self, op, query, key, value, **_):
        node = self._node
        extra = list(node.inputs[3:])
        attributes = {a.name: a.value for a in node.attributes.values()}
        return op.MultiHeadAttention(query, key, value, *extra, _domain=CONTRIB_DOMAIN, _outputs=1, **attributes)


class AttentionOnHeads(pattern.RewriteRuleClassBase):
    """ai.onnx Attention (3-D) whose keys and values are still moved from (batch, heads, seq, size)
    into (batch, seq, hidden) -> the 4-D Attention on them as they are (the query, one token in a
    decode step, is moved instead). See :class:`MultiHeadAttentionOnHeads`."""

    def pattern(self, op, query, key, value, shape_k, shape_v):
        return _attention(op.Attention, query, _merged(op, key, shape_k), _merged(op, value, shape_v))

    def check(self, context, query, key, value, shape_k, shape_v, out, **_):
        result = pattern.MatchResult()
        node = out.producer()
        if not _merges_heads(shape_k, shape_v):
            return result.fail("not the heads merged into (batch, seq, hidden)")
        q, k, v = dims_of(query), dims_of(key), dims_of(value)
        if len(node.inputs) > 4 or "q_num_heads" not in node.attributes or q is None or len(q) != 3:
            return result.fail("not a 3-D Attention without a cache")
        if (
            k is None
            or v is None
            or len(k) != 4
            or len(v) != 4
            or not isinstance(k[3], int)
            or not isinstance(v[3], int)
        ):
            return result.fail("keys and values are not (batch, heads, seq, size)")
        self._heads, self._size = node.attributes["q_num_heads"].as_int(), k[3]
        self._mask = node.inputs[3] if len(node.inputs) == 4 else None
        names = ("q_num_heads", "kv_num_heads")
        self._attributes = {a.name: a.value for a in node.attributes.values() if a.name not in names}
        return result

    def rewrite(self, op, query, key, value, **_):
        b, s, _hidden = query.shape
        heads = op.Reshape(query, op.Constant(value_ints=[0, 0, self._heads, self._size]))
        query4 = op.Transpose(shaped(heads, [b, s, self._heads, self._size], query), perm=[0, 2, 1, 3])
        out = op.Attention(
            shaped(query4, [b, self._heads, s, self._size], query), key, value, self._mask,
            _outputs=1, **self._attributes,
        )  # fmt: skip
        return _heads_last(op, shaped(out, [b, self._heads, s, value.shape[3]], query))


class _Biased(pattern.RewriteRuleClassBase):
    """A rule on a com.microsoft attention node (:attr:`KERNEL`) of one output with an ``attention_bias``,
    its input :attr:`BIAS` and last."""

    KERNEL, BIAS = "", 0

    def pattern(self, op, query, key, value):
        return _attention(getattr(op, self.KERNEL), query, key, value, _domain=CONTRIB_DOMAIN)

    def check(self, context, query, key, value, out, **_):
        result = pattern.MatchResult()
        node = out.producer()
        inputs = list(node.inputs)
        if len(inputs) != self.BIAS + 1 or inputs[-1] is None or len(node.outputs) != 1:
            return result.fail("no attention_bias, or more inputs or outputs after it")
        return self._check_biased(result, node)

    def _check_biased(self, result, node):
        """``result``, or it failed, for ``node``, which has a bias."""
        raise NotImplementedError


class BiasPerHead(_Biased):
    """MultiHeadAttention with an ``attention_bias`` of one head for all ((batch or 1, 1, S, T), what
    the sdpa impl gives it) -> the same node with the bias expanded to its heads. ONNX Runtime takes
    the shared head from 1.22 on; 1.18 refuses it ("dimension 1 should be same as number of heads")
    and 1.20 computes a wrong result (2026-12-07, BENCHMARKS.md "Runtime facts"), so policy.py offers
    this rule to the targets of those releases only (``OLDER_RELEASE``)."""

    KERNEL, BIAS = "MultiHeadAttention", 5

    def _check_biased(self, result, node):
        heads = node.attributes["num_heads"].as_int()
        dims = dims_of(node.inputs[5])
        if dims is None or len(dims) != 4 or dims[1] == heads or heads == 1:
            return result.fail("not a bias of one head for all")  # (its dim 1 is 1, or unknown: 1 or heads)
        self._node, self._heads, self._dims = node, heads, dims
        return result

    def rewrite(self, op, query, key, value, **_):
        *extra, bias = self._node.inputs[3:]
        batch, _one, rows, columns = self._dims
        heads = op.Expand(bias, op.Constant(value_ints=[1, self._heads, 1, 1]))
        attributes = {a.name: a.value for a in self._node.attributes.values()}
        return op.MultiHeadAttention(
            query, key, value, *extra, shaped(heads, [batch, self._heads, rows, columns], bias),
            _domain=CONTRIB_DOMAIN, _outputs=1, **attributes,
        )  # fmt: skip


def _repeated(op, x, kv_heads: int, group: int, dims):
    """(batch, seq, kv heads * size) -> (batch, seq, kv heads * group * size): each head ``group`` times
    in a row, as torch's ``enable_gqa`` (and ``repeat_kv``) pairs query heads with key/value heads."""
    heads = op.Reshape(x, op.Constant(value_ints=[0, 0, kv_heads, 1, -1]))
    repeated = op.Reshape(
        op.Expand(heads, op.Constant(value_ints=[1, 1, 1, group, 1])), op.Constant(value_ints=[0, 0, -1])
    )
    return shaped(repeated, None if dims is None else [dims[0], dims[1], dims[2] * group], x)


class UngroupedBias(_Biased):
    """GroupQueryAttention without a cache but with an ``attention_bias`` (its 11th input, what the sdpa
    impl and :class:`GroupQueryAttention` give it for a masked ``enable_gqa``) -> MultiHeadAttention on
    the keys and values repeated to the query's heads. ONNX Runtime's GroupQueryAttention takes the bias
    from 1.22 on; 1.18 and 1.20 take 9 inputs ("input size 11 not in range [min=7, max=9]", 2026-12-07),
    so policy.py offers this rule to the targets of those releases only (``OLDER_RELEASE``), before
    :class:`BiasPerHead`, which those releases' MultiHeadAttention needs next."""

    KERNEL, BIAS = "GroupQueryAttention", 10

    def _check_biased(self, result, node):
        if any(node.inputs[i] is not None for i in (3, 4, 7, 8, 9)):
            return result.fail("a cache, rotary tables or positions")
        if any(a.name not in ("num_heads", "kv_num_heads", "scale", "causal") for a in node.attributes.values()):
            return result.fail("GroupQueryAttention attributes MultiHeadAttention has no counterpart for")
        heads, kv_heads = node.attributes["num_heads"].as_int(), node.attributes["kv_num_heads"].as_int()
        if heads % kv_heads:
            return result.fail("query heads not a multiple of the key/value heads")
        self._node, self._heads, self._kv_heads = node, heads, kv_heads
        return result

    def rewrite(self, op, query, key, value, **_):
        attributes = {a.name: a.value for a in self._node.attributes.values() if a.name == "scale"}
        causal = self._node.attributes["causal"].as_int() if "causal" in self._node.attributes else 0
        group = self._heads // self._kv_heads
        key, value = (_repeated(op, x, self._kv_heads, group, dims_of(x)) for x in (key, value))
        return op.MultiHeadAttention(
            query, key, value, None, None, self._node.inputs[10],
            num_heads=self._heads, unidirectional=causal, _domain=CONTRIB_DOMAIN, _outputs=1, **attributes,
        )  # fmt: skip
