"""Graph-level rewrites for the `onnxruntime` target: patterns that span several ops.

Each rule is an onnxscript ``RewriteRule`` that opreg applies after translation and
the lean pass (see ``opreg_rewrite_rules`` in docs/writing-packs.md). Which ones the pack
offers, and for which targets, is :func:`rules`; why each is there (or is not) is
measured by ``bench/ort_contrib.py`` (and, for a decoder, ``bench/llm.py``) on ONNX
Runtime's CPU build.

onnxscript's maintained rules, where they do what the pack's own did (the same nodes fused
on BERT, GPT-2 and Llama), under the pack's names and float32 only (:func:`_onnxscript_rules`):

- ``RMSNormalization``, ``RMSNormalizationWeightLast``: ``x * rsqrt(mean(x**2) + eps) *
  weight`` becomes ai.onnx ``RMSNormalization`` (opset 23) (``rules.fusion``'s RmsNormFusion).
- ``BiasGelu``: ``Gelu(x + bias)`` (erf) becomes BiasGelu (``ort_fusions``' BiasGeluFusion).
- ``FusedMatMul``: ``MatMul(x, Transpose(y))`` becomes ``FusedMatMul(x, y, transB=1)``: as fast
  in whole models (0.99-1.00x), and a weight keeps its ``state_dict`` layout and name, with no
  Transpose left in the graph (``ort_fusions``' TransposeMatMul2).

The pack's own, which onnxscript's rules do not match in opreg's graphs, each measured:

- ``GroupQueryAttention``: transformers' ``repeat_kv`` (Unsqueeze, Expand, Reshape
  of the key/value heads) feeding a MultiHeadAttention becomes GroupQueryAttention
  on the unrepeated heads: no copies of the keys and values (onnxscript's GQA fusion reads
  torch.onnx's SDPA and com.microsoft RotaryEmbedding, which opreg does not emit).
- ``RotaryEmbedding``: ``x * cos + rotate_half(x) * sin`` with the cos/sin of
  duplicated frequencies (``cat(freqs, freqs)``, as every RoPE model computes them, scaled or
  not) becomes ai.onnx ``RotaryEmbedding`` (opset 23), fed the cos/sin of the frequencies
  themselves, on the (batch, seq, hidden) heads before they are moved first when it can: the
  projection they were split off, or the heads merged when something acts on them between
  (Qwen3's and LFM2's per-head norms); the attention kernel can then take them directly
  (onnxscript's RotaryEmbedding23 wants the cos/sin unscaled and the heads split).
- ``InterleavedRotaryEmbedding``: the same for interleaved pairs (GPT-J's ``rotate_every_two``,
  Cohere's: ``stack(-x[..., 1::2], x[..., ::2]).flatten(-2)``, cos/sin of ``repeat_interleave(f, 2)``),
  with ``interleaved=1``. Where the tables are ``cat(c, c)`` of a cos already taken (Qwen2-VL's
  3-D rotary picks each section of ``c`` from another position stream), ``c`` itself is the
  kernel's per-token cos (not interleaved).
- ``ResidualSum``: the residual ``Add`` whose only user is a LayerNormalization
  becomes a ``Sum``. ONNX Runtime fuses ``Add`` + ``LayerNormalization`` into its
  SkipLayerNormalization on its own, and that kernel is many times slower than the
  two it replaces on the CPU build; a ``Sum`` is the same addition, which it leaves be.
- ``GroupedAttention``, ``AttentionOnHeads``, ``MultiHeadAttentionOnHeads``: the same
  for ai.onnx Attention (``kv_num_heads``), and the attention kernels reading a KV cache
  in its (batch, heads, seq, size) layout instead of a moved copy of it.
- ``FastGelu``, ``FastGeluHalfFirst`` (the tanh formula in torch's order and GPT-2's
  ``gelu_new``'s, neither of which onnxscript's GeluTanhFusion matches), ``FastGeluBias`` (a
  bias added before it), ``QuickGelu`` (``x * sigmoid(alpha * x)``, SiLU being alpha 1).

Then the passes of a decoder (:mod:`opreg_ort_contrib.kv_cache`, :mod:`opreg_ort_contrib.gqa_fusions`)
and of weights quantized in PyTorch (:class:`opreg_ort_contrib.quantize.TorchaoWeights`).

Measured and left out: SkipLayerNormalization and SkipSimplifiedLayerNormalization,
slower than the kernels they replace (see ``ResidualSum`` and ``RMSNormalization``).

All of them are exact but for rounding (the kernels sum in another order): each is
checked against eager PyTorch by the conformance kit (``samples.py``) and the tests.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from opreg_ort_contrib import CONTRIB_DOMAIN

_FLOAT = ir.DataType.FLOAT


def _const(value: ir.Value | None) -> np.ndarray | None:
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def _scalar(value: ir.Value | None) -> float | None:
    array = _const(value)
    return None if array is None or array.size != 1 else float(array.reshape(()))


def _is(value: ir.Value | None, expected: float, rel: float = 1e-6) -> bool:
    found = _scalar(value)
    return found is not None and math.isclose(found, expected, rel_tol=rel, abs_tol=rel)


def _ints(value: ir.Value | None) -> list[int] | None:
    array = _const(value)
    return None if array is None else [int(v) for v in array.reshape(-1)]


def _dims(value: ir.Value) -> list | None:
    return None if value.shape is None else list(value.shape)


def _float32(*values: ir.Value | None) -> bool:
    return all(v is not None and v.dtype == _FLOAT for v in values)


def _shaped(value: ir.Value, dims, like: ir.Value) -> ir.Value:
    """``value`` (made by a rewrite) given ``dims`` and ``like``'s type, so later rules and the
    lean pass's shape checks see it; returns it."""
    value.shape = None if dims is None else ir.Shape(dims)
    value.type = like.type
    return value


# -- attention --------------------------------------------------------------------------------


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
    return _ints(shape_k) == [0, 0, -1] and _ints(shape_v) == [0, 0, -1]


def _check_repeated(result, query, key, value, axes_k, axes_v, bsd_k, bsd_v, heads: int):
    """``None`` if the keys and values are ``heads // kv heads`` repeats of float32 (batch, kv
    heads, seq, size) heads of the query's length, else the failed ``result``."""
    if _ints(axes_k) != [2] or _ints(axes_v) != [2] or _ints(bsd_k) != [0, 0, -1] or _ints(bsd_v) != [0, 0, -1]:
        return result.fail("not a repeat of the heads (Unsqueeze axis 2) into (batch, seq, hidden)")
    q, k, v = _dims(query), _dims(key), _dims(value)
    if q is None or k is None or v is None or len(q) != 3 or len(k) != 4 or len(v) != 4:
        return result.fail("shapes unknown")
    kv_heads, size = k[1], k[3]
    if not isinstance(kv_heads, int) or not isinstance(size, int) or kv_heads == heads or heads % kv_heads:
        return result.fail("not fewer key/value heads than query heads")
    if v[1] != kv_heads or k[2] != v[2] or q[2] != heads * size:
        return result.fail("keys and values do not match")
    return None if _float32(query, key, value) else result.fail("float32 only")


def _size_source(context, value: ir.Value, axis: int) -> tuple[ir.Value, int]:
    """A value and axis holding ``value``'s size at ``axis``: a graph input with the same symbolic
    dim if there is one (every layer then reads the same ``Shape``, which the lean pass computes
    once), else ``value`` itself."""
    dim = value.shape[axis] if value.shape is not None else None
    if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
        for graph_input in context.graph_or_function.inputs:
            for index, other in enumerate(graph_input.shape or ()):
                if isinstance(other, ir.SymbolicDim) and other.value == dim.value:
                    return graph_input, index
    return value, axis % len(value.shape)


def _size(op, source: tuple[ir.Value, int]) -> ir.Value:
    value, axis = source
    return op.Shape(value, start=axis, end=axis + 1)


def _heads_last(op, x):
    """(batch, heads, seq, size) -> (batch, seq, heads * size), shaped."""
    b, h, s, d = x.shape
    merged = op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))
    return _shaped(merged, [b, s, h * d], x)


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
        if _dims(query)[1] != _dims(key)[2]:
            return result.fail("query and key lengths differ (GroupQueryAttention without a cache needs them equal)")
        self._heads, self._kv_heads = heads, _dims(key)[1]
        self._batch, self._length = _size_source(context, query, 0), _size_source(context, query, 1)
        self._attributes = {a.name: a.value for a in node.attributes.values() if a.name == "scale"}
        self._causal = node.attributes["unidirectional"].as_int() if "unidirectional" in node.attributes else 0
        self._bias = extra[2] if len(extra) == 3 else None
        return result

    def rewrite(self, op, query, key, value, **_):
        # the key's length is the query's (checked): read it where every layer can share it
        total = op.Cast(_size(op, self._length), to=ir.DataType.INT32)
        one = op.Constant(value=ir.tensor(np.array([1], dtype=np.int32)))
        seqlens = op.Expand(op.Sub(total, one), _size(op, self._batch))
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
        self._kv_heads = _dims(key)[1]
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
        k, v = _dims(key), _dims(value)
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
        q, k, v = _dims(query), _dims(key), _dims(value)
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
        query4 = op.Transpose(_shaped(heads, [b, s, self._heads, self._size], query), perm=[0, 2, 1, 3])
        out = op.Attention(
            _shaped(query4, [b, self._heads, s, self._size], query), key, value, self._mask,
            _outputs=1, **self._attributes,
        )  # fmt: skip
        return _heads_last(op, _shaped(out, [b, self._heads, s, value.shape[3]], query))


# -- rotary embedding ---------------------------------------------------------------------------


class RotaryEmbedding(pattern.RewriteRuleClassBase):
    """``x * cos + cat(-x2, x1) * sin`` (rotate_half) with cos/sin of ``cat(f, f)`` -> RotaryEmbedding-23;
    with ``interleaved``, ``x * cos + stack(-x[..., 1::2], x[..., ::2]).flatten(-2) * sin`` (GPT-J's
    rotate_every_two, Cohere's, GLM's, ERNIE's) with cos/sin of ``repeat_interleave(f, 2)`` -> the
    same with ``interleaved=1``.

    The cos/sin tables are shared by every layer, so they are not part of the pattern:
    :func:`_angle_table` reads them back to the frequencies ``f``; where they are ``cat(c, c)``
    and ``cat(s, s)`` of tables already computed (Qwen2-VL's 3-D rotary picks each section of
    ``c`` from the cos of another position stream), ``c`` and ``s`` are RotaryEmbedding-23's caches
    as they are (:func:`_half_table`)."""

    def __init__(self, name: str, interleaved: bool = False) -> None:
        super().__init__(name)
        self._interleaved = interleaved

    def pattern(self, op, x, cos, sin, s1, e1, ax1, s2, e2, ax2, step1, step2, at1, at2):
        if self._interleaved:  # x[..., ::2] and x[..., 1::2], stacked as (-odd, even) pairs, flattened
            first, second = op.Slice(x, s1, e1, ax1, step1), op.Slice(x, s2, e2, ax2, step2)
            pairs = op.Concat(op.Unsqueeze(op.Neg(second), at2), op.Unsqueeze(first, at1), _allow_other_attributes=True)
            rotated = op.Reshape(pairs, _allow_other_inputs=True, _allow_other_attributes=True)
        else:
            first = op.Slice(x, s1, e1, ax1, _allow_other_inputs=True)
            second = op.Slice(x, s2, e2, ax2, _allow_other_inputs=True)
            rotated = op.Concat(op.Neg(second), first, axis=-1)
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def _slices_fail(self, size: int, s1, e1, s2, e2, steps) -> str | None:
        """Why the slices are not the two halves (or the even and odd positions) of a head, or ``None``."""
        if self._interleaved:
            if _ints(s1) != [0] or _ints(s2) != [1] or (_ints(e1) or [0])[0] < size or (_ints(e2) or [0])[0] < size:
                return "the slices are not the even and odd positions"
            return None if [_ints(step) for step in steps] == [[2], [2]] else "the slices do not step by 2"
        half = size // 2
        if _ints(s1) != [0] or _ints(e1) != [half] or _ints(s2) != [half] or (_ints(e2) or [0])[0] < size:
            return "the slices are not the two halves"
        return None

    def check(self, context, x, cos, sin, s1, e1, ax1, s2, e2, ax2, step1=None, step2=None, at1=None, at2=None, **_):
        result = pattern.MatchResult()
        dims = _dims(x)
        if dims is None or len(dims) != 4 or not isinstance(dims[1], int) or not isinstance(dims[3], int):
            return result.fail("x is not (batch, heads, seq, head size) with static heads and size")
        size = dims[3]
        if size % 2 or _ints(ax1) not in ([-1], [3]) or _ints(ax2) not in ([-1], [3]):
            return result.fail("not a rotation of the halves of the last axis")
        if (why := self._slices_fail(size, s1, e1, s2, e2, (step1, step2))) is not None:
            return result.fail(why)
        if self._interleaved:
            flattened = context.root.inputs[1].producer().inputs[0]  # Mul(rotated, sin): the Reshape
            pairs = flattened.producer().inputs[0].producer()
            if (
                _ints(at1) not in ([-1], [4])
                or _ints(at2) not in ([-1], [4])
                or pairs.attributes["axis"].as_int() not in (-1, 4)
            ):
                return result.fail("the pairs are not stacked on a new last axis")
            if _dims(flattened) != dims:
                return result.fail("the pairs are not flattened back to x's shape")
        half = size // 2
        cos_table = _angle_table(cos, "Cos", self._interleaved)
        sin_table = _angle_table(sin, "Sin", self._interleaved)
        halves = (None, None) if self._interleaved else (_half_table(cos), _half_table(sin))
        if cos_table is not None and sin_table is not None and cos_table[0] is sin_table[0]:
            self._freqs, self._scales, self._tables = cos_table[0], (cos_table[1], sin_table[1]), None
            tables = [cos_table[0]]
        elif halves[0] is not None and halves[1] is not None:
            self._freqs, self._scales, self._tables = None, (None, None), halves
            tables = list(halves)
        else:
            return result.fail("cos/sin are not Cos/Sin of one cat(freqs, freqs) nor cat(c, c), over the heads")
        for table in tables:
            f = _dims(table)
            if f is None or len(f) != 3 or f[2] != half or f[1] != dims[2]:
                return result.fail("frequencies are not (batch, seq, head size / 2)")
        if not _float32(x, cos, sin, *tables):
            return result.fail("float32 only")
        self._heads = dims[1]
        self._batch = _size_source(context, x, 0)
        return result

    def rewrite(self, op, x, **_):
        cos, sin = self._tables or (op.Cos(self._freqs), op.Sin(self._freqs))
        cos_scale, sin_scale = self._scales
        if cos_scale is not None:
            cos = op.Mul(cos, cos_scale)
        if sin_scale is not None:
            sin = op.Mul(sin, sin_scale)
        producer = x.producer()
        # x the heads of (batch, seq, heads, size) moved first: rotate them merged as (batch, seq,
        # hidden) (the projection itself when they were split off it), move them after, so the
        # attention kernel can take them directly (the lean pass cancels the round trip)
        moved = producer is not None and producer.op_type == "Transpose" and _heads_moved(producer)
        table = self._freqs if self._tables is None else self._tables[0]
        if table.shape[0] != x.shape[0]:  # ONNX Runtime wants the caches' batch to be x's, unbroadcast
            batch = op.Concat(_size(op, self._batch), op.Shape(table, start=1), axis=0)
            cos, sin = op.Expand(cos, batch), op.Expand(sin, batch)
        interleaved = {"interleaved": 1} if self._interleaved else {}
        if not moved:
            return op.RotaryEmbedding(x, cos, sin, **interleaved)
        view = producer.inputs[0]
        if _heads_split(producer):  # split off a projection
            source = view.producer().inputs[0]
        else:  # e.g. normalised head by head (Qwen3's, LFM2's q/k norms)
            b, s, h, d = view.shape
            source = _shaped(op.Reshape(view, op.Constant(value_ints=[0, 0, -1])), [b, s, h * d], x)
        rotated = _shaped(op.RotaryEmbedding(source, cos, sin, num_heads=self._heads, **interleaved), source.shape, x)
        heads = _shaped(op.Reshape(rotated, op.Shape(view)), view.shape, x)
        return op.Transpose(heads, perm=[0, 2, 1, 3])


def _half_table(value: ir.Value) -> ir.Value | None:
    """``t`` if ``value`` is ``Unsqueeze(cat(t, t), [1])`` on the last axis, else ``None``: the
    cos (or sin) of each position and frequency, repeated for the two halves of the head."""
    unsqueeze = value.producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or _ints(unsqueeze.inputs[1]) != [1]:
        return None
    concat = unsqueeze.inputs[0].producer()
    if concat is None or concat.op_type != "Concat" or concat.domain or len(concat.inputs) != 2:
        return None
    if concat.inputs[0] is not concat.inputs[1] or concat.attributes["axis"].as_int() not in (-1, 2):
        return None
    return concat.inputs[0]


def _angle_table(value: ir.Value, function: str, interleaved: bool = False) -> tuple[ir.Value, ir.Value | None] | None:
    """``(f, scale)`` if ``value`` is ``Unsqueeze(function(cat(f, f)) [* scale], [1])`` (with
    ``interleaved``, of ``repeat_interleave(f, 2, -1)``), else ``None``."""
    unsqueeze = value.producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or _ints(unsqueeze.inputs[1]) != [1]:
        return None
    table, scale = unsqueeze.inputs[0].producer(), None
    if table is not None and table.op_type == "Mul" and _scalar(table.inputs[1]) is not None:
        scale = table.inputs[1]
        table = table.inputs[0].producer()
    if table is None or table.op_type != function or table.domain:
        return None
    if interleaved:
        return None if (freqs := _repeated_interleaved(table.inputs[0])) is None else (freqs, scale)
    concat = table.inputs[0].producer()
    if concat is None or concat.op_type != "Concat" or len(concat.inputs) != 2:
        return None
    if concat.inputs[0] is not concat.inputs[1] or concat.attributes["axis"].as_int() not in (-1, 2):
        return None
    return concat.inputs[0], scale


def _repeated_interleaved(value: ir.Value) -> ir.Value | None:
    """``f`` if ``value`` is ``repeat_interleave(f, 2, -1)`` of a 3-D ``f``, as torch.export writes it:
    ``Reshape(Expand(Unsqueeze(f, [3]), (b, s, h, 2)), (b, s, 2h))``; else ``None``."""
    reshape = value.producer()
    expand = None if reshape is None or reshape.op_type != "Reshape" else reshape.inputs[0].producer()
    unsqueeze = None if expand is None or expand.op_type != "Expand" else expand.inputs[0].producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or _ints(unsqueeze.inputs[1]) not in ([3], [-1]):
        return None
    freqs = unsqueeze.inputs[0]
    f, pairs, flat = _dims(freqs), _dims(expand.outputs[0]), _dims(value)
    if f is None or pairs is None or flat is None or len(f) != 3 or pairs != [*f, 2]:
        return None
    return freqs if flat[:2] == f[:2] and isinstance(f[2], int) and flat[2] == 2 * f[2] else None


def _heads_moved(transpose: ir.Node) -> bool:
    """``transpose`` is Transpose(v, [0, 2, 1, 3]) of a (batch, seq, heads, size) ``v``, heads and size static."""
    perm = transpose.attributes.get("perm")
    dims = _dims(transpose.inputs[0]) if transpose.inputs[0] is not None else None
    if perm is None or list(perm.as_ints()) != [0, 2, 1, 3] or dims is None or len(dims) != 4:
        return False
    return isinstance(dims[2], int) and isinstance(dims[3], int)


def _heads_split(transpose: ir.Node) -> bool:
    """``transpose`` is Transpose(Reshape(p, (batch, seq, heads, size)), [0, 2, 1, 3]) of a 3-D ``p``."""
    perm = transpose.attributes.get("perm")
    reshape = transpose.inputs[0].producer() if transpose.inputs[0] is not None else None
    if perm is None or list(perm.as_ints()) != [0, 2, 1, 3] or reshape is None or reshape.op_type != "Reshape":
        return False
    source = reshape.inputs[0]
    return source is not None and source.shape is not None and len(source.shape) == 3


# -- normalization ------------------------------------------------------------------------------


class ResidualSum(pattern.RewriteRuleClassBase):
    """``LayerNormalization(Add(a, b))`` -> ``LayerNormalization(Sum(a, b))``: ONNX Runtime then
    keeps the two kernels instead of fusing them into its slower SkipLayerNormalization."""

    def pattern(self, op, a, b):
        return op.Add(a, b)

    def check(self, context, a, b, **_):
        result = pattern.MatchResult()
        users = context.output_values[0].uses()
        if len(users) != 1 or context.output_values[0].is_graph_output():
            return result.fail("the sum has other users: ONNX Runtime would not fuse it")
        node = next(iter(users)).node
        if node.op_type != "LayerNormalization" or node.domain or next(iter(users)).idx != 0:
            return result.fail("not the input of a LayerNormalization")
        if _dims(a) is None or _dims(a) != _dims(b) or len(_dims(a)) != 3:
            return result.fail("not two 3-D tensors of one shape (what ONNX Runtime fuses)")
        return result

    def rewrite(self, op, a, b):
        return op.Sum(a, b)


# -- activations -------------------------------------------------------------------------------


def _check_bias(x: ir.Value, bias: ir.Value) -> pattern.MatchResult:
    """``bias`` is a float32 constant of ``x``'s last dim (what the bias inputs of the kernels take)."""
    result = pattern.MatchResult()
    dims, b = _dims(x), _dims(bias)
    if _const(bias) is None or b is None or len(b) != 1 or dims is None or dims[-1] != b[0]:
        return result.fail("the bias is not a constant of the last dim")
    return result if _float32(x, bias) else result.fail("float32 only")


_TANH_SCALE = math.sqrt(2.0 / math.pi)


class FastGelu(pattern.RewriteRuleClassBase):
    """``x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``, in the orders torch's gelu and
    GPT-2's gelu_new spell it -> FastGelu."""

    def __init__(self, name: str, half_first: bool) -> None:
        super().__init__(name)
        self._half_first = half_first

    def pattern(self, op, x, three, k, c, one, half):
        def either(f, a, b, tag):  # a commutative op, its operands in either order
            return pattern.OrValue([f(a, b), f(b, a)], tag_var=tag)

        cube = either(op.Mul, k, op.Pow(x, three), "cube_order")
        inner = either(op.Mul, c, either(op.Add, x, cube, "sum_order"), "scale_order")
        t = either(op.Add, op.Tanh(inner), one, "one_order")
        if self._half_first:  # gelu_new: (0.5 * x) * (1 + tanh(...))
            return op.Mul(either(op.Mul, x, half, "half_order"), t)
        return op.Mul(x, either(op.Mul, half, t, "half_order"))  # torch: x * (0.5 * (tanh(...) + 1))

    def check(self, context, x, three, k, c, one, half, **_):
        result = pattern.MatchResult()
        constants = ((three, 3.0), (k, 0.044715), (c, _TANH_SCALE), (one, 1.0), (half, 0.5))
        if not all(_is(value, expected, 1e-5) for value, expected in constants):
            return result.fail("not the tanh GELU's constants")
        return result if _float32(x) else result.fail("float32 only")

    def rewrite(self, op, x, **_):
        return op.FastGelu(x, _domain=CONTRIB_DOMAIN)


class FastGeluBias(pattern.RewriteRuleClassBase):
    """``FastGelu(x + bias)`` with a 1-D constant bias -> FastGelu(x, bias)."""

    def pattern(self, op, x, bias):
        return op.FastGelu(op.Add(x, bias), _domain=CONTRIB_DOMAIN)

    def check(self, context, x, bias, **_):
        return _check_bias(x, bias)

    def rewrite(self, op, x, bias):
        return op.FastGelu(x, bias, _domain=CONTRIB_DOMAIN)


class QuickGelu(pattern.RewriteRuleClassBase):
    """``x * sigmoid(alpha * x)`` (SiLU: alpha 1) -> QuickGelu."""

    def __init__(self, name: str, sigmoid_first: bool) -> None:
        super().__init__(name)
        self._sigmoid_first = sigmoid_first

    def pattern(self, op, x, alpha):
        scaled = pattern.OrValue([op.Mul(x, alpha), op.Mul(alpha, x), x], tag_var="form")
        return op.Mul(op.Sigmoid(scaled), x) if self._sigmoid_first else op.Mul(x, op.Sigmoid(scaled))

    def check(self, context, x, form=None, alpha=None, **_):
        result = pattern.MatchResult()
        self._alpha = 1.0 if alpha is None else _scalar(alpha)
        if self._alpha is None:
            return result.fail("alpha is not a constant")
        return result if _float32(x) else result.fail("float32 only")

    def rewrite(self, op, x, **_):
        return op.QuickGelu(x, alpha=float(self._alpha), _domain=CONTRIB_DOMAIN)


# -- onnxscript's maintained rules ----------------------------------------------------------------


def _float32_only(rule_class: type, *names: str) -> type:
    """``rule_class`` (an onnxscript rule) matching only where the values bound to ``names`` are
    float32: the CPU kernels its rewrite makes (and the pack's tests) are float32's."""

    class Float32(rule_class):
        def check(self, context, **bindings):
            result = super().check(context, **bindings)
            if result and not _float32(*(bindings.get(name) for name in names)):
                return pattern.MatchResult().fail("float32 only")
            return result

    Float32.__name__ = Float32.__qualname__ = rule_class.__name__
    return Float32


def _onnxscript_rules() -> dict:
    """onnxscript's rules that do what the pack's own did, under the pack's names: RMS norms to
    RMSNormalization-23 (``rules.fusion``, which onnxscript's ``onnx_fusions`` applies; no public
    name), ``Gelu(x + bias)`` to BiasGelu and ``MatMul(x, Transpose(W))`` to FusedMatMul
    (``ort_fusions``, which its ``optimize_for_ort`` applies)."""
    from onnxscript.rewriter.ort_fusions.bias_gelu import BiasGeluFusion
    from onnxscript.rewriter.ort_fusions.fused_matmul_rule_sets import TransposeMatMul2
    from onnxscript.rewriter.rules.fusion._rms_normalization import RmsNormFusion

    rms = _float32_only(RmsNormFusion, "x", "scale")
    return {
        "RMSNormalization": rms.rule("RMSNormalization", mul_order=False),  # weight * normalized
        "RMSNormalizationWeightLast": rms.rule("RMSNormalizationWeightLast", mul_order=True),
        "BiasGelu": _float32_only(BiasGeluFusion, "input", "bias").rule("BiasGelu", contrib_op=True),
        "FusedMatMul": _float32_only(TransposeMatMul2, "x", "y").rule("FusedMatMul"),
    }


# -- what the pack offers ---------------------------------------------------------------------------

_MAINTAINED = _onnxscript_rules()

RULES = {
    rule.name: rule
    for rule in (
        GroupedAttention.rule("GroupedAttention"),
        GroupQueryAttention.rule("GroupQueryAttention"),
        AttentionOnHeads.rule("AttentionOnHeads"),
        MultiHeadAttentionOnHeads.rule("MultiHeadAttentionOnHeads"),
        RotaryEmbedding.rule("RotaryEmbedding"),
        RotaryEmbedding.rule("InterleavedRotaryEmbedding", interleaved=True),
        _MAINTAINED["RMSNormalization"],
        _MAINTAINED["RMSNormalizationWeightLast"],
        ResidualSum.rule("ResidualSum"),
        FastGelu.rule("FastGelu", half_first=False),
        FastGelu.rule("FastGeluHalfFirst", half_first=True),
        _MAINTAINED["BiasGelu"],
        FastGeluBias.rule("FastGeluBias"),
        QuickGelu.rule("QuickGelu", sigmoid_first=False),
        QuickGelu.rule("QuickGeluSigmoidFirst", sigmoid_first=True),
        _MAINTAINED["FusedMatMul"],
    )
}
"""Every rule, by name, in the order they are applied."""

ATTENTION_23 = range(23, 25)
"""The ai.onnx versions whose Attention ONNX Runtime 1.32 runs as a kernel: there the pack's
sdpa impl emits ai.onnx Attention, elsewhere com.microsoft MultiHeadAttention (attention.py)."""

OFFERED = {
    "GroupedAttention": lambda onnx: onnx in ATTENTION_23,
    "AttentionOnHeads": lambda onnx: onnx in ATTENTION_23,
    "GroupQueryAttention": lambda onnx: onnx not in ATTENTION_23,
    "MultiHeadAttentionOnHeads": lambda onnx: onnx not in ATTENTION_23,
    "RotaryEmbedding": lambda onnx: onnx >= 23,
    "InterleavedRotaryEmbedding": lambda onnx: onnx >= 23,
    "RMSNormalization": lambda onnx: onnx >= 23,
    "RMSNormalizationWeightLast": lambda onnx: onnx >= 23,
}
"""Rules offered only at some ai.onnx versions (the others at every one): those that rewrite
the attention op the sdpa impl emits there, and those that make opset-23 ops."""


def rules(target) -> list:
    """The rules for ``target``: none without com.microsoft 1, else those :data:`OFFERED` at its ai.onnx,
    then (where the attention is com.microsoft's) the decoder's attention on its KV cache."""
    if target.get(CONTRIB_DOMAIN) != 1:
        return []
    from opreg_ort_contrib.gqa_fusions import PackedQKV, RotaryInsideAttention
    from opreg_ort_contrib.kv_cache import GroupQueryAttentionOnCache
    from opreg_ort_contrib.quantize import TorchaoWeights

    offered = [TorchaoWeights()]  # first: on the products as the model writes them
    offered += [rule for name, rule in RULES.items() if OFFERED.get(name, lambda _: True)(target.onnx)]
    if target.onnx not in ATTENTION_23:
        offered.append(GroupQueryAttentionOnCache())
    if target.onnx > max(ATTENTION_23):  # they take RotaryEmbedding-23 into GroupQueryAttention
        offered += [RotaryInsideAttention(), PackedQKV()]
    return offered
