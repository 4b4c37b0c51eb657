"""Rotary embedding rules: ``x * cos + rotate_half(x) * sin`` (and the interleaved form) becomes ai.onnx
``RotaryEmbedding`` (opset 23), fed the cos/sin of the frequencies themselves."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from opreg_ort_contrib.fusions.values import dims_of, float32, ints, scalar, shaped, size_of, size_source


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
            if ints(s1) != [0] or ints(s2) != [1] or (ints(e1) or [0])[0] < size or (ints(e2) or [0])[0] < size:
                return "the slices are not the even and odd positions"
            return None if [ints(step) for step in steps] == [[2], [2]] else "the slices do not step by 2"
        half = size // 2
        if ints(s1) != [0] or ints(e1) != [half] or ints(s2) != [half] or (ints(e2) or [0])[0] < size:
            return "the slices are not the two halves"
        return None

    def check(self, context, x, cos, sin, s1, e1, ax1, s2, e2, ax2, step1=None, step2=None, at1=None, at2=None, **_):
        result = pattern.MatchResult()
        dims = dims_of(x)
        if dims is None or len(dims) != 4 or not isinstance(dims[1], int) or not isinstance(dims[3], int):
            return result.fail("x is not (batch, heads, seq, head size) with static heads and size")
        size = dims[3]
        if size % 2 or ints(ax1) not in ([-1], [3]) or ints(ax2) not in ([-1], [3]):
            return result.fail("not a rotation of the halves of the last axis")
        if (why := self._slices_fail(size, s1, e1, s2, e2, (step1, step2))) is not None:
            return result.fail(why)
        if self._interleaved:
            flattened = context.root.inputs[1].producer().inputs[0]  # Mul(rotated, sin): the Reshape
            pairs = flattened.producer().inputs[0].producer()
            if (
                ints(at1) not in ([-1], [4])
                or ints(at2) not in ([-1], [4])
                or pairs.attributes["axis"].as_int() not in (-1, 4)
            ):
                return result.fail("the pairs are not stacked on a new last axis")
            if dims_of(flattened) != dims:
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
            f = dims_of(table)
            if f is None or len(f) != 3 or f[2] != half or f[1] != dims[2]:
                return result.fail("frequencies are not (batch, seq, head size / 2)")
        if not float32(x, cos, sin, *tables):
            return result.fail("float32 only")
        self._heads = dims[1]
        self._batch = size_source(context, x, 0)
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
            batch = op.Concat(size_of(op, self._batch), op.Shape(table, start=1), axis=0)
            cos, sin = op.Expand(cos, batch), op.Expand(sin, batch)
        interleaved = {"interleaved": 1} if self._interleaved else {}
        if not moved:
            return op.RotaryEmbedding(x, cos, sin, **interleaved)
        view = producer.inputs[0]
        if _heads_split(producer):  # split off a projection
            source = view.producer().inputs[0]
        else:  # e.g. normalised head by head (Qwen3's, LFM2's q/k norms)
            b, s, h, d = view.shape
            source = shaped(op.Reshape(view, op.Constant(value_ints=[0, 0, -1])), [b, s, h * d], x)
        rotated = shaped(op.RotaryEmbedding(source, cos, sin, num_heads=self._heads, **interleaved), source.shape, x)
        heads = shaped(op.Reshape(rotated, op.Shape(view)), view.shape, x)
        return op.Transpose(heads, perm=[0, 2, 1, 3])


def _half_table(value: ir.Value) -> ir.Value | None:
    """``t`` if ``value`` is ``Unsqueeze(cat(t, t), [1])`` on the last axis, else ``None``: the
    cos (or sin) of each position and frequency, repeated for the two halves of the head."""
    unsqueeze = value.producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or ints(unsqueeze.inputs[1]) != [1]:
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
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or ints(unsqueeze.inputs[1]) != [1]:
        return None
    table, scale = unsqueeze.inputs[0].producer(), None
    if table is not None and table.op_type == "Mul" and scalar(table.inputs[1]) is not None:
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
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or ints(unsqueeze.inputs[1]) not in ([3], [-1]):
        return None
    freqs = unsqueeze.inputs[0]
    f, pairs, flat = dims_of(freqs), dims_of(expand.outputs[0]), dims_of(value)
    if f is None or pairs is None or flat is None or len(f) != 3 or pairs != [*f, 2]:
        return None
    return freqs if flat[:2] == f[:2] and isinstance(f[2], int) and flat[2] == 2 * f[2] else None


def _heads_moved(transpose: ir.Node) -> bool:
    """``transpose`` is Transpose(v, [0, 2, 1, 3]) of a (batch, seq, heads, size) ``v``, heads and size static."""
    perm = transpose.attributes.get("perm")
    dims = dims_of(transpose.inputs[0]) if transpose.inputs[0] is not None else None
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
