"""Comparison, logical and bitwise ops, isinf/isnan: operands promoted as torch promotes
them, bool results."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg_core_ops.ops._promotion import FLOAT_TYPES, cast_to, promote
from opreg_core_ops.ops.elementwise import isinf

_BOOL = ir.DataType.BOOL


def _compare(self, other, kind: str):
    dtype, (a, b) = promote(self, other)
    if dtype == _BOOL and kind not in ("eq", "ne"):
        # ONNX orders numbers only: False < True as 0 < 1
        a, b = cast_to(a, ir.DataType.UINT8), cast_to(b, ir.DataType.UINT8)
    if kind == "eq":
        return op18.Equal(a, b)
    if kind == "ne":
        return op18.Not(op18.Equal(a, b))
    if kind == "lt":
        return op18.Less(a, b)
    if kind == "le":
        return op18.LessOrEqual(a, b)
    if kind == "gt":
        return op18.Greater(a, b)
    return op18.GreaterOrEqual(a, b)


def aten_eq(self, other):
    """eq.Tensor(Tensor self, Tensor other) -> Tensor: Equal, after torch's promotion."""
    return _compare(self, other, "eq")


def aten_eq_scalar(self, other: float):
    """eq.Scalar(Tensor self, Scalar other) -> Tensor: Equal, after torch's promotion."""
    return _compare(self, other, "eq")


def aten_ne(self, other):
    """ne.Tensor(Tensor self, Tensor other) -> Tensor: Not of Equal, after torch's promotion."""
    return _compare(self, other, "ne")


def aten_ne_scalar(self, other: float):
    """ne.Scalar(Tensor self, Scalar other) -> Tensor: Not of Equal, after torch's promotion."""
    return _compare(self, other, "ne")


def aten_lt(self, other):
    """lt.Tensor(Tensor self, Tensor other) -> Tensor: Less, after torch's promotion."""
    return _compare(self, other, "lt")


def aten_lt_scalar(self, other: float):
    """lt.Scalar(Tensor self, Scalar other) -> Tensor: Less, after torch's promotion."""
    return _compare(self, other, "lt")


def aten_le(self, other):
    """le.Tensor(Tensor self, Tensor other) -> Tensor: LessOrEqual, after torch's promotion."""
    return _compare(self, other, "le")


def aten_le_scalar(self, other: float):
    """le.Scalar(Tensor self, Scalar other) -> Tensor: LessOrEqual, after torch's promotion."""
    return _compare(self, other, "le")


def aten_gt(self, other):
    """gt.Tensor(Tensor self, Tensor other) -> Tensor: Greater, after torch's promotion."""
    return _compare(self, other, "gt")


def aten_gt_scalar(self, other: float):
    """gt.Scalar(Tensor self, Scalar other) -> Tensor: Greater, after torch's promotion."""
    return _compare(self, other, "gt")


def aten_ge(self, other):
    """ge.Tensor(Tensor self, Tensor other) -> Tensor: GreaterOrEqual, after torch's promotion."""
    return _compare(self, other, "ge")


def aten_ge_scalar(self, other: float):
    """ge.Scalar(Tensor self, Scalar other) -> Tensor: GreaterOrEqual, after torch's promotion."""
    return _compare(self, other, "ge")


# -- logical --------------------------------------------------------------------------------


def aten_logical_and(self, other):
    """logical_and(Tensor self, Tensor other) -> Tensor: And of the inputs as bool."""
    return op18.And(cast_to(self, _BOOL), cast_to(other, _BOOL))


def aten_logical_or(self, other):
    """logical_or(Tensor self, Tensor other) -> Tensor: Or of the inputs as bool."""
    return op18.Or(cast_to(self, _BOOL), cast_to(other, _BOOL))


def aten_logical_xor(self, other):
    """logical_xor(Tensor self, Tensor other) -> Tensor: Xor of the inputs as bool."""
    return op18.Xor(cast_to(self, _BOOL), cast_to(other, _BOOL))


def aten_logical_not(self):
    """logical_not(Tensor self) -> Tensor: Not of the input as bool."""
    return op18.Not(cast_to(self, _BOOL))


# -- bitwise ------------------------------------------------------------------------------------


def _bitwise(self, other, kind: str):
    dtype, (a, b) = promote(self, other)
    if dtype in FLOAT_TYPES:
        raise ValueError(f"bitwise_{kind} of floating tensors is not defined (torch rejects it too)")
    if dtype == _BOOL:
        return {"and": op18.And, "or": op18.Or, "xor": op18.Xor}[kind](a, b)
    return {"and": op18.BitwiseAnd, "or": op18.BitwiseOr, "xor": op18.BitwiseXor}[kind](a, b)


def aten_bitwise_and(self, other):
    """bitwise_and.Tensor(Tensor self, Tensor other) -> Tensor: BitwiseAnd (And for bool)."""
    return _bitwise(self, other, "and")


def aten_bitwise_and_scalar(self, other: float):
    """bitwise_and.Scalar(Tensor self, Scalar other) -> Tensor: BitwiseAnd (And for bool)."""
    return _bitwise(self, other, "and")


def aten_bitwise_or(self, other):
    """bitwise_or.Tensor(Tensor self, Tensor other) -> Tensor: BitwiseOr (Or for bool)."""
    return _bitwise(self, other, "or")


def aten_bitwise_or_scalar(self, other: float):
    """bitwise_or.Scalar(Tensor self, Scalar other) -> Tensor: BitwiseOr (Or for bool)."""
    return _bitwise(self, other, "or")


def aten_bitwise_xor(self, other):
    """bitwise_xor.Tensor(Tensor self, Tensor other) -> Tensor: BitwiseXor (Xor for bool)."""
    return _bitwise(self, other, "xor")


def aten_bitwise_xor_scalar(self, other: float):
    """bitwise_xor.Scalar(Tensor self, Scalar other) -> Tensor: BitwiseXor (Xor for bool)."""
    return _bitwise(self, other, "xor")


def aten_and(self, other):
    """__and__.Tensor(Tensor self, Tensor other) -> Tensor: as bitwise_and (the ``&`` operator)."""
    return _bitwise(self, other, "and")


def aten_or(self, other):
    """__or__.Tensor(Tensor self, Tensor other) -> Tensor: as bitwise_or (the ``|`` operator)."""
    return _bitwise(self, other, "or")


def aten_bitwise_not(self):
    """bitwise_not(Tensor self) -> Tensor: BitwiseNot (Not for bool)."""
    if self.dtype == _BOOL:
        return op18.Not(self)
    return op18.BitwiseNot(self)


# -- isinf, isnan ------------------------------------------------------------------------------------


def _all_false(self):
    """False everywhere, shaped like ``self`` (integers are never inf or NaN)."""
    return op18.Not(op18.Equal(self, self))


def aten_isinf(self):
    """isinf(Tensor self) -> Tensor: IsInf (all False for integers and bool)."""
    if self.dtype not in FLOAT_TYPES:
        return _all_false(self)
    return isinf(self)


def aten_isnan(self):
    """isnan(Tensor self) -> Tensor: IsNaN (all False for integers and bool)."""
    if self.dtype not in FLOAT_TYPES:
        return _all_false(self)
    return op18.IsNaN(self)


def register(registry: opreg.Registrar) -> None:
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        registry.register(f"aten::{name}.Tensor", globals()[f"aten_{name}"])
        registry.register(f"aten::{name}.Scalar", globals()[f"aten_{name}_scalar"])
    registry.register("aten::logical_and", aten_logical_and)
    registry.register("aten::logical_or", aten_logical_or)
    registry.register("aten::logical_xor", aten_logical_xor)
    registry.register("aten::logical_not", aten_logical_not)
    for name in ("and", "or", "xor"):
        registry.register(f"aten::bitwise_{name}.Tensor", globals()[f"aten_bitwise_{name}"])
        registry.register(f"aten::bitwise_{name}.Scalar", globals()[f"aten_bitwise_{name}_scalar"])
    registry.register("aten::__and__.Tensor", aten_and)
    registry.register("aten::__or__.Tensor", aten_or)
    registry.register("aten::bitwise_not", aten_bitwise_not)
    registry.register("aten::isinf", aten_isinf)
    registry.register("aten::isnan", aten_isnan)
