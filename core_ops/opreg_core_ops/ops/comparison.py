"""Comparison, logical and bitwise ops, isinf/isnan: operands promoted as torch promotes
them, bool results."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import FLOAT_TYPES, Tensor, cast_to, promote
from opreg_core_ops.ops.elementwise import isinf

_BOOL = ir.DataType.BOOL


def _equal(self, other):
    """Equal, after torch's promotion."""
    _, (a, b) = promote(self, other)
    return op18.Equal(a, b)


def _order(self, other, compare):
    """``compare`` (Less, LessOrEqual, Greater or GreaterOrEqual), after torch's promotion."""
    dtype, (a, b) = promote(self, other)
    if dtype == _BOOL:
        # ONNX orders numbers only: False < True as 0 < 1
        a, b = cast_to(a, ir.DataType.UINT8), cast_to(b, ir.DataType.UINT8)
    return compare(a, b)


@opreg.impl("aten::eq.Tensor")
@opreg.impl("aten::eq.Scalar")
def aten_eq(self: Tensor, other: Tensor | float):
    """eq.Tensor(Tensor self, Tensor other) -> Tensor: Equal, after torch's promotion.

    eq.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _equal(self, other)


@opreg.impl("aten::ne.Tensor")
@opreg.impl("aten::ne.Scalar")
def aten_ne(self: Tensor, other: Tensor | float):
    """ne.Tensor(Tensor self, Tensor other) -> Tensor: Not of Equal, after torch's promotion.

    ne.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return op18.Not(_equal(self, other))


@opreg.impl("aten::lt.Tensor")
@opreg.impl("aten::lt.Scalar")
def aten_lt(self: Tensor, other: Tensor | float):
    """lt.Tensor(Tensor self, Tensor other) -> Tensor: Less, after torch's promotion.

    lt.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _order(self, other, op18.Less)


@opreg.impl("aten::le.Tensor")
@opreg.impl("aten::le.Scalar")
def aten_le(self: Tensor, other: Tensor | float):
    """le.Tensor(Tensor self, Tensor other) -> Tensor: LessOrEqual, after torch's promotion.

    le.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _order(self, other, op18.LessOrEqual)


@opreg.impl("aten::gt.Tensor")
@opreg.impl("aten::gt.Scalar")
def aten_gt(self: Tensor, other: Tensor | float):
    """gt.Tensor(Tensor self, Tensor other) -> Tensor: Greater, after torch's promotion.

    gt.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _order(self, other, op18.Greater)


@opreg.impl("aten::ge.Tensor")
@opreg.impl("aten::ge.Scalar")
def aten_ge(self: Tensor, other: Tensor | float):
    """ge.Tensor(Tensor self, Tensor other) -> Tensor: GreaterOrEqual, after torch's promotion.

    ge.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _order(self, other, op18.GreaterOrEqual)


# -- logical --------------------------------------------------------------------------------


@opreg.impl("aten::logical_and")
def aten_logical_and(self: Tensor, other: Tensor):
    """logical_and(Tensor self, Tensor other) -> Tensor: And of the inputs as bool."""
    return op18.And(cast_to(self, _BOOL), cast_to(other, _BOOL))


@opreg.impl("aten::logical_or")
def aten_logical_or(self: Tensor, other: Tensor):
    """logical_or(Tensor self, Tensor other) -> Tensor: Or of the inputs as bool."""
    return op18.Or(cast_to(self, _BOOL), cast_to(other, _BOOL))


@opreg.impl("aten::logical_xor")
def aten_logical_xor(self: Tensor, other: Tensor):
    """logical_xor(Tensor self, Tensor other) -> Tensor: Xor of the inputs as bool."""
    return op18.Xor(cast_to(self, _BOOL), cast_to(other, _BOOL))


@opreg.impl("aten::logical_not")
def aten_logical_not(self: Tensor):
    """logical_not(Tensor self) -> Tensor: Not of the input as bool."""
    return op18.Not(cast_to(self, _BOOL))


# -- bitwise ------------------------------------------------------------------------------------


def _bitwise(self, other, bitwise, logical):
    """``bitwise`` (BitwiseAnd, ...) after torch's promotion; ``logical`` (And, ...) for bool."""
    dtype, (a, b) = promote(self, other)
    if dtype in FLOAT_TYPES:
        raise ValueError(f"{bitwise.__name__} of floating tensors is not defined (torch rejects it too)")
    if dtype == _BOOL:
        return logical(a, b)
    return bitwise(a, b)


_SIGNED_BITS = {ir.DataType.INT8: 8, ir.DataType.INT16: 16, ir.DataType.INT32: 32, ir.DataType.INT64: 64}
_UNSIGNED_BITS = {ir.DataType.UINT8: 8, ir.DataType.UINT16: 16, ir.DataType.UINT32: 32, ir.DataType.UINT64: 64}


def _shift(self, other, direction: str):
    """torch's ``<<``/``>>`` after its promotion, through BitShift on UINT64 (ONNX Runtime's BitShift takes
    unsigned types only): casts keep the two's-complement bits, a signed right shift is arithmetic
    (``~(~x >> n)`` for negative x), and a shift by the width or more gives 0 (-1 for a negative x >> n)."""
    dtype, (a, b) = promote(self, other)
    bits = _SIGNED_BITS.get(dtype) or _UNSIGNED_BITS.get(dtype)
    if bits is None:
        raise ValueError(f"bitwise shifts take integer tensors, got {dtype}")
    wide, count = ir.DataType.UINT64, op18.Cast(b, to=ir.DataType.UINT64)
    too_far = op18.Not(op18.Less(b, op18.CastLike(bits, b)))

    def shifted(x):
        return op18.Cast(op18.BitShift(op18.Cast(x, to=wide), count, direction=direction), to=dtype)

    zero = op18.CastLike(0, a)
    if direction == "LEFT" or dtype in _UNSIGNED_BITS:
        return op18.Where(too_far, zero, shifted(a))
    negative = op18.Less(a, zero)
    arithmetic = op18.Where(negative, op18.BitwiseNot(shifted(op18.BitwiseNot(a))), shifted(a))
    return op18.Where(too_far, op18.Where(negative, op18.CastLike(-1, a), zero), arithmetic)


@opreg.impl("aten::bitwise_left_shift.Tensor")
@opreg.impl("aten::bitwise_left_shift.Tensor_Scalar")
def aten_bitwise_left_shift(self: Tensor, other: Tensor | float):
    """bitwise_left_shift.Tensor(Tensor self, Tensor other) -> Tensor: BitShift LEFT (through UINT64).

    bitwise_left_shift.Tensor_Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _shift(self, other, "LEFT")


@opreg.impl("aten::bitwise_right_shift.Tensor")
@opreg.impl("aten::bitwise_right_shift.Tensor_Scalar")
def aten_bitwise_right_shift(self: Tensor, other: Tensor | float):
    """bitwise_right_shift.Tensor(Tensor self, Tensor other) -> Tensor: BitShift RIGHT (arithmetic for signed types).

    bitwise_right_shift.Tensor_Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _shift(self, other, "RIGHT")


@opreg.impl("aten::bitwise_and.Tensor")
@opreg.impl("aten::bitwise_and.Scalar")
@opreg.impl("aten::__and__.Tensor")
def aten_bitwise_and(self: Tensor, other: Tensor | float):
    """bitwise_and.Tensor(Tensor self, Tensor other) -> Tensor: BitwiseAnd (And for bool).

    bitwise_and.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number.

    __and__.Tensor(Tensor self, Tensor other) -> Tensor: the same (the ``&`` operator)."""
    return _bitwise(self, other, op18.BitwiseAnd, op18.And)


@opreg.impl("aten::bitwise_or.Tensor")
@opreg.impl("aten::bitwise_or.Scalar")
@opreg.impl("aten::__or__.Tensor")
def aten_bitwise_or(self: Tensor, other: Tensor | float):
    """bitwise_or.Tensor(Tensor self, Tensor other) -> Tensor: BitwiseOr (Or for bool).

    bitwise_or.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number.

    __or__.Tensor(Tensor self, Tensor other) -> Tensor: the same (the ``|`` operator)."""
    return _bitwise(self, other, op18.BitwiseOr, op18.Or)


@opreg.impl("aten::bitwise_xor.Tensor")
@opreg.impl("aten::bitwise_xor.Scalar")
def aten_bitwise_xor(self: Tensor, other: Tensor | float):
    """bitwise_xor.Tensor(Tensor self, Tensor other) -> Tensor: BitwiseXor (Xor for bool).

    bitwise_xor.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _bitwise(self, other, op18.BitwiseXor, op18.Xor)


@opreg.impl("aten::bitwise_not")
def aten_bitwise_not(self: Tensor):
    """bitwise_not(Tensor self) -> Tensor: BitwiseNot (Not for bool)."""
    if self.dtype == _BOOL:
        return op18.Not(self)
    return op18.BitwiseNot(self)


# -- isinf, isnan ------------------------------------------------------------------------------------


def _all_false(self):
    """False everywhere, shaped like ``self`` (integers are never inf or NaN)."""
    return op18.Not(op18.Equal(self, self))


@opreg.impl("aten::isinf")
def aten_isinf(self: Tensor):
    """isinf(Tensor self) -> Tensor: IsInf (all False for integers and bool)."""
    if self.dtype not in FLOAT_TYPES:
        return _all_false(self)
    return isinf(self)


@opreg.impl("aten::isnan")
def aten_isnan(self: Tensor):
    """isnan(Tensor self) -> Tensor: IsNaN (all False for integers and bool)."""
    if self.dtype not in FLOAT_TYPES:
        return _all_false(self)
    return op18.IsNaN(self)


@opreg.impl("aten::signbit")
def aten_signbit(self: Tensor):
    """signbit(Tensor self) -> Tensor: Less than 0, or -0.0 (1 / x is -inf); all False for bool and unsigned.

    ONNX cannot read a NaN's sign bit (it has no bitcast): NaN gives False, as +NaN does in torch."""
    if self.dtype in (_BOOL, ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64):
        return _all_false(self)
    zero = op18.CastLike(0, self)
    negative = op18.Less(self, zero)
    if self.dtype not in FLOAT_TYPES:
        return negative
    negative_zero = op18.And(op18.Equal(self, zero), op18.Less(op18.Div(op18.CastLike(1, self), self), zero))
    return op18.Or(negative, negative_zero)
