"""Quantization: ``quantized_decomposed`` quantize/dequantize (per tensor, per channel, per token,
per channel group), ``choose_qparams``, and ATen's ``fake_quantize_*`` -> QuantizeLinear/DequantizeLinear.

What PyTorch's pt2e flow (``prepare_pt2e``/``convert_pt2e``) leaves in a graph, and what
quantization-aware training's fake quantizers are, as the QDQ pairs ONNX Runtime fuses:

- ``quantize_*``: QuantizeLinear into the ONNX type torch's ``dtype`` names (int8/uint8;
  int16/uint16 from opset 21), its zero point cast to that type (QuantizeLinear's output type
  is its zero point's). A ``[quant_min, quant_max]`` narrower than the type is a Clip of the
  quantized value (int8/uint8; ONNX Runtime has no 16-bit Clip, so 16-bit ranges clip the
  float input to the values that quantize to the bounds, which gives the same integers).
  From opset 21 a range that fits 4 bits (``int8`` with ``[-8, 7]``, ``uint8`` with ``[0, 15]``:
  how torch spells int4) quantizes to INT4/UINT4, whose saturation is the clamp, then Cast.
- ``dequantize_*``: DequantizeLinear (int8/uint8/int32; int16/uint16 from 21), Cast to ``out_dtype``.
- A type QuantizeLinear cannot produce at the target (int16 before 21, int32, float8) is torch's
  own arithmetic: ``Round(x * (1 / scale)) + zero_point``, Clip, Cast.

Rounding: both round half to even. torch multiplies by ``1 / scale`` where ONNX divides by
``scale``, so an element whose ``x / scale`` lies within a float32 ulp of a half-integer may
land one quantization step away (a few in 10^5 elements); the arithmetic forms are exact.

Per token (and per channel group) scales broadcast along rows, which QuantizeLinear expresses
only as blocked quantization (opset 21, static sizes) and torch computes in another order
(``round(x / scale + zero_point)``, rounding after the zero point is added): those are
torch's arithmetic, exactly.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset21 as op21

import opreg
from opreg.ops import Tensor, rank_of

_FLOAT = ir.DataType.FLOAT
_RANGES = {
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT16: (-(2**15), 2**15 - 1),
    ir.DataType.UINT16: (0, 2**16 - 1),
    ir.DataType.INT4: (-8, 7),
    ir.DataType.UINT4: (0, 15),
}
"""Integer types Quantize/DequantizeLinear produce or read, and their ranges."""

_QDQ_TYPES = {
    18: (ir.DataType.INT8, ir.DataType.UINT8),
    21: (ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16),
}
"""The integer types QuantizeLinear and DequantizeLinear take, by the version an impl is registered at."""

_QDQ_OPSETS = {18: op18, 21: op21}
"""The opset QuantizeLinear and DequantizeLinear come from, by the version an impl is registered at:
every impl with a 16-bit or 4-bit form is registered at 18 and at 21, the newest the target allows wins."""

_CLIPPABLE = (ir.DataType.INT8, ir.DataType.UINT8)
"""Integer types ONNX Runtime's Clip runs on (it has no 16-bit integer Clip)."""

_NIBBLES = {ir.DataType.INT8: ir.DataType.INT4, ir.DataType.UINT8: ir.DataType.UINT4}
"""torch's spelling of 4-bit quantization (a byte type with a 4-bit range) -> ONNX's 4-bit type (opset 21)."""


# -- parameters ------------------------------------------------------------------------------


def _scalar(value, dtype: ir.DataType):
    """A per-tensor parameter (a Python number, or a 0-d or 1-element tensor) as a 0-d ``dtype`` value."""
    if not isinstance(value, ir.Value):
        return op18.Cast(value, to=int(dtype))
    if rank_of(value) != 0:
        value = op18.Reshape(value, [])
    return op18.Cast(value, to=int(dtype))


def _per_axis(value, dtype: ir.DataType):
    return op18.Cast(value, to=int(dtype))


def _inverse(scale):
    """``1 / scale`` rounded to float32, as torch computes it (in float64 from a Python float or ``.item()``)."""
    if not isinstance(scale, ir.Value):
        return op18.Cast(1.0 / scale, to=int(_FLOAT))
    wide = op18.Cast(scale, to=int(ir.DataType.DOUBLE))
    return op18.Cast(op18.Reciprocal(wide), to=int(_FLOAT))


def _along(value, axis: int, rank: int):
    """A per-channel vector reshaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    shape = [1] * rank
    shape[axis % rank] = -1
    return op18.Reshape(value, shape)


# -- quantize --------------------------------------------------------------------------------


def _qdq_type(version: int, dtype: ir.DataType, quant_min, quant_max) -> ir.DataType | None:
    """The ONNX type QuantizeLinear produces for torch's ``dtype`` and range at ``version``, or None."""
    if dtype not in _QDQ_TYPES[version]:
        return None
    nibble = _NIBBLES.get(dtype)
    if version >= 21 and nibble and isinstance(quant_min, int) and isinstance(quant_max, int):
        low, high = _RANGES[nibble]
        if low <= quant_min and quant_max <= high:
            return nibble
    return dtype


def _quantize(version: int, x, scale, zero_point, axis: int | None, quant_min, quant_max, dtype: int):
    """torch's ``clamp(round(x / scale) + zero_point, quant_min, quant_max).to(dtype)``: QuantizeLinear
    of opset ``version`` where the type allows, else arithmetic. ``axis`` is None per tensor."""
    dtype = ir.DataType(dtype)
    x = op18.Cast(x, to=int(_FLOAT)) if x.dtype != _FLOAT else x
    qtype = _qdq_type(version, dtype, quant_min, quant_max)
    if qtype is None:
        return _quantize_arithmetic(x, scale, zero_point, axis, quant_min, quant_max, dtype)
    if axis is None:
        scale, zero_point = _scalar(scale, _FLOAT), _scalar(zero_point, qtype)
    else:
        scale, zero_point = _per_axis(scale, _FLOAT), _per_axis(zero_point, qtype)
    low, high = _RANGES[qtype]
    static = isinstance(quant_min, int) and isinstance(quant_max, int)
    narrower = not static or quant_min > low or quant_max < high
    if narrower and dtype not in _CLIPPABLE:  # 16-bit: clip the input to what quantizes to the bounds
        x = _clamp_input(x, scale, zero_point, axis, quant_min, quant_max)
    axes = {} if axis is None else {"axis": axis}
    quantized = _QDQ_OPSETS[version].QuantizeLinear(x, scale, zero_point, **axes)
    if qtype != dtype:
        quantized = op18.Cast(quantized, to=int(dtype))
    if narrower and dtype in _CLIPPABLE and (not static or (quant_min, quant_max) != _RANGES[qtype]):
        quantized = op18.Clip(quantized, _scalar(quant_min, dtype), _scalar(quant_max, dtype))
    return quantized


def _clamp_input(x, scale, zero_point, axis: int | None, quant_min, quant_max):
    """``x`` limited to ``[(quant_min - zero_point) * scale, (quant_max - zero_point) * scale]``: the
    inputs that quantize to the bounds, so QuantizeLinear of it gives torch's clamped integers."""
    zero = _float(zero_point)
    if axis is not None:
        zero, scale = _along(zero, axis, rank_of(x)), _along(scale, axis, rank_of(x))
    low = op18.Mul(op18.Sub(_scalar(quant_min, _FLOAT), zero), scale)
    high = op18.Mul(op18.Sub(_scalar(quant_max, _FLOAT), zero), scale)
    return op18.Min(op18.Max(x, low), high)


def _quantize_arithmetic(x, scale, zero_point, axis: int | None, quant_min, quant_max, dtype: ir.DataType):
    """torch's quantize formula as it computes it: ``x * (1 / scale)`` in float32, Round, Add, Clip, Cast."""
    inverse, zero = _inverse(scale), _float(zero_point)
    if axis is not None:
        inverse, zero = _along(inverse, axis, rank_of(x)), _along(zero, axis, rank_of(x))
    elif isinstance(zero_point, ir.Value):
        inverse, zero = _scalar(inverse, _FLOAT), _scalar(zero, _FLOAT)
    rounded = op18.Add(op18.Round(op18.Mul(x, inverse)), zero)
    clamped = op18.Clip(rounded, _scalar(quant_min, _FLOAT), _scalar(quant_max, _FLOAT))
    return op18.Cast(clamped, to=int(dtype))


def _float(value):
    return op18.Cast(value, to=int(_FLOAT))


# -- dequantize ------------------------------------------------------------------------------


def _dequantize(version: int, x, scale, zero_point, axis: int | None, out_dtype: int | None):
    """torch's ``(x.to(out_dtype) - zero_point) * scale``: DequantizeLinear (float32) where ``x``'s type
    allows, else arithmetic; then Cast to ``out_dtype`` (default float32)."""
    per = _scalar if axis is None else _per_axis
    if x.dtype in _QDQ_TYPES[version] or x.dtype == ir.DataType.INT32:
        inputs = [x, per(scale, _FLOAT)]
        if zero_point is not None:
            inputs.append(per(zero_point, x.dtype))
        result = _QDQ_OPSETS[version].DequantizeLinear(*inputs, **({} if axis is None else {"axis": axis}))
    else:
        result = _dequantize_arithmetic(x, scale, zero_point, axis)
    if out_dtype is None or ir.DataType(out_dtype) == _FLOAT:
        return result
    return op18.Cast(result, to=out_dtype)


def _dequantize_arithmetic(x, scale, zero_point, axis: int | None):
    scale = _float(scale)
    zero = None if zero_point is None else _float(zero_point)
    if axis is not None:
        scale = _along(scale, axis, rank_of(x))
        zero = None if zero is None else _along(zero, axis, rank_of(x))
    shifted = _float(x) if zero is None else op18.Sub(_float(x), zero)
    return op18.Mul(shifted, scale)


# -- quantized_decomposed: per tensor ---------------------------------------------------------


@opreg.impl("quantized_decomposed::quantize_per_tensor.default", opset=18)
@opreg.impl("quantized_decomposed::quantize_per_tensor.default", opset=21)
@opreg.impl("quantized_decomposed::quantize_per_tensor.tensor", opset=18)
@opreg.impl("quantized_decomposed::quantize_per_tensor.tensor", opset=21)
@opreg.impl("quantized_decomposed::quantize_per_tensor.tensor2", opset=18)
@opreg.impl("quantized_decomposed::quantize_per_tensor.tensor2", opset=21)
def qd_quantize_per_tensor(
    input: Tensor,
    scale: Tensor | float,
    zero_point: Tensor | int,
    quant_min: Tensor | int,
    quant_max: Tensor | int,
    dtype: int,
    *,
    opset: int,
):
    """quantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype) -> Tensor: QuantizeLinear (int8/uint8), Clip to a narrower range; from opset 21 also 16-bit (and 4-bit) types.

    quantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, int quant_max, ScalarType dtype) -> Tensor: the same, scale and zero point 0-d or 1-element tensors.

    quantize_per_tensor.tensor2(Tensor input, Tensor scale, Tensor zero_point, Tensor quant_min, Tensor quant_max, ScalarType dtype) -> Tensor: the same, the range tensors too (a Clip to it)."""
    return _quantize(opset, input, scale, zero_point, None, quant_min, quant_max, dtype)


@opreg.impl("quantized_decomposed::dequantize_per_tensor.default", opset=18)
@opreg.impl("quantized_decomposed::dequantize_per_tensor.default", opset=21)
@opreg.impl("quantized_decomposed::dequantize_per_tensor.tensor", opset=18)
@opreg.impl("quantized_decomposed::dequantize_per_tensor.tensor", opset=21)
@opreg.impl("quantized_decomposed::dequantize_per_tensor.tensor2", opset=18)
@opreg.impl("quantized_decomposed::dequantize_per_tensor.tensor2", opset=21)
def qd_dequantize_per_tensor(
    input: Tensor,
    scale: Tensor | float,
    zero_point: Tensor | int,
    quant_min: Tensor | int,
    quant_max: Tensor | int,
    dtype: int,
    out_dtype: int | None = None,
    *,
    opset: int,
):
    """dequantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor: DequantizeLinear; from opset 21 also 16-bit (and 4-bit) types.

    dequantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor: the same, scale and zero point 0-d or 1-element tensors.

    dequantize_per_tensor.tensor2(Tensor input, Tensor scale, Tensor zero_point, Tensor quant_min, Tensor quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor: the same, the range tensors too (unread: DequantizeLinear does not clip)."""
    return _dequantize(opset, input, scale, zero_point, None, out_dtype)


# -- quantized_decomposed: per channel ---------------------------------------------------------


@opreg.impl("quantized_decomposed::quantize_per_channel.default", opset=18)
@opreg.impl("quantized_decomposed::quantize_per_channel.default", opset=21)
def qd_quantize_per_channel(
    input: Tensor,
    scales: Tensor,
    zero_points: Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: int,
    *,
    opset: int,
):
    """quantize_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis, int quant_min, int quant_max, ScalarType dtype) -> Tensor: QuantizeLinear along axis; from opset 21 also 16-bit (and 4-bit) types."""
    return _quantize(opset, input, scales, zero_points, axis, quant_min, quant_max, dtype)


@opreg.impl("quantized_decomposed::dequantize_per_channel.default", opset=18)
@opreg.impl("quantized_decomposed::dequantize_per_channel.default", opset=21)
def qd_dequantize_per_channel(
    input: Tensor,
    scales: Tensor,
    zero_points: Tensor | None,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: int,
    out_dtype: int | None = None,
    *,
    opset: int,
):
    """dequantize_per_channel(Tensor input, Tensor scales, Tensor? zero_points, int axis, int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor: DequantizeLinear along axis; from opset 21 also 16-bit (and 4-bit) types."""
    return _dequantize(opset, input, scales, zero_points, axis, out_dtype)


# -- quantized_decomposed: per token and per channel group (torch's arithmetic) ----------------


def _rowwise_quantize(x, scales, zero_points, quant_min: int, quant_max: int, dtype: int):
    """``x.mul(1 / scales).add(zero_points).round().clamp(quant_min, quant_max).to(dtype)``, as torch does."""
    x = _float(x)
    scaled = op18.Mul(x, _float(op18.Reciprocal(op18.Cast(scales, to=int(ir.DataType.DOUBLE)))))
    rounded = op18.Round(op18.Add(scaled, _float(zero_points)))
    return op18.Cast(op18.Clip(rounded, _scalar(quant_min, _FLOAT), _scalar(quant_max, _FLOAT)), to=dtype)


@opreg.impl("quantized_decomposed::quantize_per_token.default")
def qd_quantize_per_token(
    input: Tensor, scales: Tensor, zero_points: Tensor, quant_min: int, quant_max: int, dtype: int
):
    """quantize_per_token(Tensor input, Tensor scales, Tensor zero_points, int quant_min, int quant_max, ScalarType dtype) -> Tensor: Mul by the reciprocal, Add, Round, Clip, Cast (torch's order)."""
    return _rowwise_quantize(input, scales, zero_points, quant_min, quant_max, dtype)


@opreg.impl("quantized_decomposed::dequantize_per_token.default")
def qd_dequantize_per_token(
    input: Tensor,
    scales: Tensor,
    zero_points: Tensor,
    quant_min: int,
    quant_max: int,
    dtype: int,
    output_dtype: int = int(_FLOAT),
):
    """dequantize_per_token(Tensor input, Tensor scales, Tensor zero_points, int quant_min, int quant_max, ScalarType dtype, ScalarType output_dtype) -> Tensor: Sub, Mul (in float64, as torch), Cast."""
    double = int(ir.DataType.DOUBLE)
    shifted = op18.Sub(op18.Cast(input, to=double), op18.Cast(zero_points, to=double))
    return op18.Cast(op18.Mul(shifted, op18.Cast(scales, to=double)), to=output_dtype)


def _groups(x, group_size: int):
    return op18.Reshape(x, [-1, group_size])


@opreg.impl("quantized_decomposed::quantize_per_channel_group.default")
def qd_quantize_per_channel_group(
    input: Tensor,
    scales: Tensor,
    zero_points: Tensor,
    quant_min: int,
    quant_max: int,
    dtype: int,
    group_size: int,
):
    """quantize_per_channel_group(Tensor input, Tensor scales, Tensor zero_points, int quant_min, int quant_max, ScalarType dtype, int group_size) -> Tensor: per group of the last dim, as per token."""
    grouped = _groups(input, group_size)
    scales, zero_points = op18.Reshape(scales, [-1, 1]), op18.Reshape(zero_points, [-1, 1])
    quantized = _rowwise_quantize(grouped, scales, zero_points, quant_min, quant_max, dtype)
    return op18.Reshape(quantized, op18.Shape(input))


@opreg.impl("quantized_decomposed::dequantize_per_channel_group.default")
def qd_dequantize_per_channel_group(
    input: Tensor,
    scales: Tensor,
    zero_points: Tensor | None,
    quant_min: int,
    quant_max: int,
    dtype: int,
    group_size: int,
    output_dtype: int,
):
    """dequantize_per_channel_group(Tensor input, Tensor scales, Tensor? zero_points, int quant_min, int quant_max, ScalarType dtype, int group_size, ScalarType output_dtype) -> Tensor: Sub, Mul per group, Cast."""
    grouped = _float(_groups(input, group_size))
    if zero_points is not None:
        grouped = op18.Sub(grouped, _float(op18.Reshape(zero_points, [-1, 1])))
    result = op18.Mul(grouped, _float(op18.Reshape(scales, [-1, 1])))
    return op18.Cast(op18.Reshape(result, op18.Shape(input)), to=output_dtype)


# -- quantized_decomposed: choose_qparams --------------------------------------------------------


def _choose(x, quant_min: int, quant_max: int, eps: float, dtype: int, symmetric: bool):
    """torch.ao's ``determine_qparams`` for a whole tensor: scale (float64) and zero point (int64), shape [1]."""
    x = _float(x)
    zero = op18.Constant(value_float=0.0)
    min_neg = op18.Min(op18.ReduceMin(x, keepdims=0), zero)
    max_pos = op18.Max(op18.ReduceMax(x, keepdims=0), zero)
    floor = op18.Cast([eps], to=int(_FLOAT))
    if symmetric:
        half_range = float(quant_max - quant_min) / 2
        scale = op18.Max(op18.Div(op18.Max(op18.Neg(min_neg), max_pos), half_range), floor)
        zero_point = op18.Constant(value_ints=[128 if ir.DataType(dtype) == ir.DataType.UINT8 else 0])
    else:
        scale = op18.Max(op18.Div(op18.Sub(max_pos, min_neg), float(quant_max - quant_min)), floor)
        shifted = op18.Sub(float(quant_min), op18.Round(op18.Div(min_neg, scale)))
        zero_point = op18.Cast(op18.Clip(shifted, float(quant_min), float(quant_max)), to=int(ir.DataType.INT64))
    return op18.Cast(scale, to=int(ir.DataType.DOUBLE)), zero_point


@opreg.impl("quantized_decomposed::choose_qparams.tensor")
def qd_choose_qparams_tensor(input: Tensor, quant_min: int, quant_max: int, eps: float, dtype: int):
    """choose_qparams.tensor(Tensor input, int quant_min, int quant_max, float eps, ScalarType dtype) -> (Tensor, Tensor): ReduceMin/ReduceMax, affine scale and zero point."""
    return _choose(input, quant_min, quant_max, eps, dtype, symmetric=False)


@opreg.impl("quantized_decomposed::choose_qparams_symmetric.tensor")
def qd_choose_qparams_symmetric_tensor(input: Tensor, quant_min: int, quant_max: int, eps: float, dtype: int):
    """choose_qparams_symmetric.tensor(Tensor input, int quant_min, int quant_max, float eps, ScalarType dtype) -> (Tensor, Tensor): ReduceMin/ReduceMax, symmetric scale (zero point 0, 128 for uint8)."""
    return _choose(input, quant_min, quant_max, eps, dtype, symmetric=True)


@opreg.impl("quantized_decomposed::choose_qparams_per_token.default")
def qd_choose_qparams_per_token(input: Tensor, dtype: int):
    """choose_qparams_per_token(Tensor input, ScalarType dtype) -> (Tensor, Tensor): max |x| per row / 127 (at least 1e-5 / 127), zero points 0.

    Typed as torch.export's graph says (float64 scales, int64 zero points: the op's meta kernel);
    its eager kernel returns both as float32, with the same values."""
    x = input if input.dtype != ir.DataType.FLOAT16 else _float(input)
    peak = op18.ReduceMax(op18.Abs(x), [-1], keepdims=1)
    scales = op18.Div(op18.Max(peak, op18.CastLike(1e-5, peak)), op18.CastLike(127.0, peak))
    zero_points = op18.Cast(op18.Sub(scales, scales), to=int(ir.DataType.INT64))
    return op18.Cast(scales, to=int(ir.DataType.DOUBLE)), zero_points


@opreg.impl("quantized_decomposed::choose_qparams_per_token_asymmetric.default")
@opreg.impl("quantized_decomposed::_choose_qparams_per_token_asymmetric_impl.default")
def qd_choose_qparams_per_token_asymmetric(input: Tensor, dtype: int):
    """choose_qparams_per_token_asymmetric(Tensor input, ScalarType dtype) -> (Tensor, Tensor): per row, XNNPACK's int8 scale and zero point.

    _choose_qparams_per_token_asymmetric_impl(Tensor input, ScalarType dtype) -> (Tensor, Tensor): the same."""
    return _per_token_asymmetric(input)


def _per_token_asymmetric(x):
    quant_min, quant_max = -128.0, 127.0
    zero = op18.CastLike(0.0, x)
    min_neg = op18.Min(op18.ReduceMin(x, [-1], keepdims=1), zero)
    max_pos = op18.Max(op18.ReduceMax(x, [-1], keepdims=1), zero)
    scale = op18.Div(op18.Sub(max_pos, min_neg), op18.CastLike(quant_max - quant_min, x))
    scale = op18.Max(scale, op18.CastLike(float(np.finfo(np.float32).eps), x))
    low, high = op18.Div(min_neg, scale), op18.Div(max_pos, scale)
    from_min = op18.Add(op18.CastLike(quant_min, x), low)
    from_max = op18.Add(op18.CastLike(quant_max, x), high)
    zero_point = op18.Where(
        op18.Greater(op18.Add(from_min, from_max), zero),
        op18.Sub(op18.CastLike(quant_min, x), low),
        op18.Sub(op18.CastLike(quant_max, x), high),
    )
    zero_point = op18.Round(op18.Clip(zero_point, op18.CastLike(quant_min, x), op18.CastLike(quant_max, x)))
    return op18.Cast(scale, to=int(ir.DataType.DOUBLE)), op18.Cast(zero_point, to=int(ir.DataType.INT64))


# -- ATen fake quantization ---------------------------------------------------------------------


def _fake_type(version: int, quant_min: int, quant_max: int) -> tuple[ir.DataType | None, bool]:
    """The ONNX type a QuantizeLinear/DequantizeLinear pair fakes ``[quant_min, quant_max]`` with at
    ``version``, and whether the quantized value needs a Clip (None: no type holds the range)."""
    types = (*_QDQ_TYPES[version], *((ir.DataType.INT4, ir.DataType.UINT4) if version >= 21 else ()))
    for qtype in types:
        if _RANGES[qtype] == (quant_min, quant_max):
            return qtype, False
    for qtype in types:
        low, high = _RANGES[qtype]
        if low <= quant_min and quant_max <= high and qtype not in _NIBBLES.values():  # no 4-bit Clip
            return qtype, qtype in _CLIPPABLE
    return None, False


def _fake_quantize(version: int, x, scale, zero_point, axis: int | None, quant_min: int, quant_max: int):
    """``(clamp(round(x / scale) + zero_point, quant_min, quant_max) - zero_point) * scale``: a
    QuantizeLinear/DequantizeLinear pair in the narrowest type holding the range (x's dtype kept)."""
    out_type = x.dtype
    x = _float(x) if x.dtype != _FLOAT else x
    qtype, clip = _fake_type(version, quant_min, quant_max)
    per = _scalar if axis is None else _per_axis
    axes = {} if axis is None else {"axis": axis}
    if qtype is None:
        result = _fake_arithmetic(x, scale, zero_point, axis, quant_min, quant_max)
    else:
        scale, zero_point = per(scale, _FLOAT), per(zero_point, qtype)
        if qtype not in _CLIPPABLE and _RANGES[qtype] != (quant_min, quant_max):
            x = _clamp_input(x, scale, zero_point, axis, quant_min, quant_max)
        qdq = _QDQ_OPSETS[version]
        quantized = qdq.QuantizeLinear(x, scale, zero_point, **axes)
        if clip:
            quantized = op18.Clip(quantized, _scalar(quant_min, qtype), _scalar(quant_max, qtype))
        result = qdq.DequantizeLinear(quantized, scale, zero_point, **axes)
    return result if out_type == _FLOAT else op18.Cast(result, to=int(out_type))


def _fake_arithmetic(x, scale, zero_point, axis: int | None, quant_min: int, quant_max: int):
    scale, zero = (_scalar(scale, _FLOAT), _scalar(zero_point, _FLOAT)) if axis is None else (scale, zero_point)
    if axis is not None:
        scale, zero = _along(_float(scale), axis, rank_of(x)), _along(_float(zero), axis, rank_of(x))
    level = op18.Add(op18.Round(op18.Mul(x, op18.Reciprocal(scale))), zero)
    clamped = op18.Clip(level, _scalar(quant_min, _FLOAT), _scalar(quant_max, _FLOAT))
    return op18.Mul(op18.Sub(clamped, zero), scale)


def _in_range_mask(x, scale, zero_point, axis: int | None, quant_min: int, quant_max: int):
    """torch's cachemask: whether ``round(x * (1 / scale)) + zero_point`` lies in the range."""
    x = _float(x)
    scale, zero = (_scalar(scale, _FLOAT), _scalar(zero_point, _FLOAT)) if axis is None else (scale, zero_point)
    if axis is not None:
        scale, zero = _along(_float(scale), axis, rank_of(x)), _along(_float(zero), axis, rank_of(x))
    level = op18.Add(op18.Round(op18.Mul(x, op18.Reciprocal(scale))), zero)
    return op18.And(
        op18.GreaterOrEqual(level, _scalar(quant_min, _FLOAT)), op18.LessOrEqual(level, _scalar(quant_max, _FLOAT))
    )


def _fake_quantize_and_mask(version: int, x, scale, zero_point, axis: int | None, quant_min: int, quant_max: int):
    """The cachemask ops' two results: the fake-quantized ``x`` and torch's in-range mask."""
    mask = _in_range_mask(x, scale, zero_point, axis, quant_min, quant_max)
    return _fake_quantize(version, x, scale, zero_point, axis, quant_min, quant_max), mask


@opreg.impl("aten::fake_quantize_per_tensor_affine.default", opset=18)
@opreg.impl("aten::fake_quantize_per_tensor_affine.default", opset=21)
@opreg.impl("aten::fake_quantize_per_tensor_affine.tensor_qparams", opset=18)
@opreg.impl("aten::fake_quantize_per_tensor_affine.tensor_qparams", opset=21)
def aten_fake_quantize_per_tensor_affine(
    self: Tensor, scale: Tensor | float, zero_point: Tensor | int, quant_min: int, quant_max: int, *, opset: int
):
    """fake_quantize_per_tensor_affine(Tensor self, float scale, int zero_point, int quant_min, int quant_max) -> Tensor: QuantizeLinear, DequantizeLinear; from opset 21 also 16-bit (and 4-bit) types.

    fake_quantize_per_tensor_affine.tensor_qparams(Tensor self, Tensor scale, Tensor zero_point, int quant_min, int quant_max) -> Tensor: the same, scale and zero point tensors."""
    return _fake_quantize(opset, self, scale, zero_point, None, quant_min, quant_max)


@opreg.impl("aten::fake_quantize_per_tensor_affine_cachemask.default", opset=18)
@opreg.impl("aten::fake_quantize_per_tensor_affine_cachemask.default", opset=21)
def aten_fake_quantize_per_tensor_affine_cachemask(
    self: Tensor,
    scale: float,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    *,
    opset: int,
):
    """fake_quantize_per_tensor_affine_cachemask(Tensor self, float scale, int zero_point, int quant_min, int quant_max) -> (Tensor output, Tensor mask): QuantizeLinear, DequantizeLinear; the in-range mask; from opset 21 also 16-bit (and 4-bit) types."""
    return _fake_quantize_and_mask(opset, self, scale, zero_point, None, quant_min, quant_max)


def _enabled(fake_quant_enabled, fake, mask, self):
    """With ``fake_quant_enabled`` 0, torch returns the input and an all-true mask."""
    on = op18.Cast(op18.Reshape(fake_quant_enabled, []), to=int(ir.DataType.BOOL))
    everywhere = op18.Expand(on, op18.Shape(self))
    return op18.Where(on, fake, self), op18.Or(op18.And(everywhere, mask), op18.Not(everywhere))


@opreg.impl("aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default", opset=18)
@opreg.impl("aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default", opset=21)
def aten_fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
    self: Tensor,
    scale: Tensor,
    zero_point: Tensor,
    fake_quant_enabled: Tensor,
    quant_min: int,
    quant_max: int,
    *,
    opset: int,
):
    """_fake_quantize_per_tensor_affine_cachemask_tensor_qparams(Tensor self, Tensor scale, Tensor zero_point, Tensor fake_quant_enabled, int quant_min, int quant_max) -> (Tensor output, Tensor mask): QuantizeLinear, DequantizeLinear where enabled; from opset 21 also 16-bit (and 4-bit) types."""
    fake, mask = _fake_quantize_and_mask(opset, self, scale, zero_point, None, quant_min, quant_max)
    return _enabled(fake_quant_enabled, fake, mask, self)


@opreg.impl("aten::fake_quantize_per_channel_affine.default", opset=18)
@opreg.impl("aten::fake_quantize_per_channel_affine.default", opset=21)
def aten_fake_quantize_per_channel_affine(
    self: Tensor,
    scale: Tensor,
    zero_point: Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    *,
    opset: int,
):
    """fake_quantize_per_channel_affine(Tensor self, Tensor scale, Tensor zero_point, int axis, int quant_min, int quant_max) -> Tensor: QuantizeLinear, DequantizeLinear along axis; from opset 21 also 16-bit (and 4-bit) types."""
    return _fake_quantize(opset, self, scale, zero_point, axis, quant_min, quant_max)


@opreg.impl("aten::fake_quantize_per_channel_affine_cachemask.default", opset=18)
@opreg.impl("aten::fake_quantize_per_channel_affine_cachemask.default", opset=21)
def aten_fake_quantize_per_channel_affine_cachemask(
    self: Tensor,
    scale: Tensor,
    zero_point: Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    *,
    opset: int,
):
    """fake_quantize_per_channel_affine_cachemask(Tensor self, Tensor scale, Tensor zero_point, int axis, int quant_min, int quant_max) -> (Tensor output, Tensor mask): QuantizeLinear, DequantizeLinear along axis; the mask; from opset 21 also 16-bit (and 4-bit) types."""
    return _fake_quantize_and_mask(opset, self, scale, zero_point, axis, quant_min, quant_max)


@opreg.impl("quantized_decomposed::fake_quant_per_channel.default", opset=18)
@opreg.impl("quantized_decomposed::fake_quant_per_channel.default", opset=21)
def qd_fake_quant_per_channel(
    input: Tensor,
    scales: Tensor,
    zero_points: Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    *,
    opset: int,
):
    """fake_quant_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis, int quant_min, int quant_max) -> Tensor: QuantizeLinear, DequantizeLinear along axis; from opset 21 also 16-bit (and 4-bit) types."""
    return _fake_quantize(opset, input, scales, zero_points, axis, quant_min, quant_max)
