"""Elementwise arithmetic and math: add/sub/mul/div (and their Scalar and rounding-mode
overloads), pow, fmod/remainder, atan2, maximum/minimum, clamp, where, and the unary
math functions. Operands are promoted as torch promotes them before the ONNX op."""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import FLOAT_TYPES, HALF_TYPES, Tensor, as_float, cast_to, promote, where

_POW_TYPES = frozenset({ir.DataType.INT32, ir.DataType.INT64}) | FLOAT_TYPES


# -- helpers (Python-side, run while tracing) ------------------------------------------------


def float_unary(self, compute):
    """``compute`` of ``self`` as a float: integers and bool as float32 (as torch), bfloat16
    through float32 and back (most ONNX math ops do not take bfloat16)."""
    if self.dtype == ir.DataType.BFLOAT16:
        return op18.Cast(compute(op18.Cast(self, to=int(ir.DataType.FLOAT))), to=int(ir.DataType.BFLOAT16))
    return compute(as_float(self))


def trunc(x):
    """Rounding toward zero of a float tensor (ONNX has no Trunc)."""
    return op18.Where(op18.Less(x, op18.CastLike(0, x)), op18.Ceil(x), op18.Floor(x))


def isinf(x):
    """IsInf of a float tensor (16-bit floats through float32: IsInf takes them only from opset 20)."""
    if x.dtype in HALF_TYPES:
        x = op18.Cast(x, to=int(ir.DataType.FLOAT))
    return op18.IsInf(x)


def _fmod(a, b):
    return op18.Mod(a, b, fmod=1)


def _python_remainder(a, b):
    """torch's float remainder: fmod, moved by ``b`` when the signs of ``b`` and it differ."""
    mod = _fmod(a, b)
    zero = op18.CastLike(0, a)
    wrong_sign = op18.And(op18.Not(op18.Equal(mod, zero)), op18.Xor(op18.Less(b, zero), op18.Less(mod, zero)))
    return op18.Where(wrong_sign, op18.Add(mod, b), mod)


def _floor_divide(a, b, dtype: ir.DataType):
    """torch's floor division (``div(rounding_mode="floor")``) of ``a`` and ``b`` of ``dtype``."""
    if dtype not in FLOAT_TYPES:
        # Mod (fmod=0) on integers has the divisor's sign, so a - mod is an exact multiple of b
        return op18.Div(op18.Sub(a, op18.Mod(a, b)), b)
    # c10's div_floor_floating: through fmod, so 1 // 0.1 is 9 as in Python, not floor(1 / 0.1)
    zero = op18.CastLike(0, a)
    one = op18.CastLike(1, a)
    mod = _fmod(a, b)
    div = op18.Div(op18.Sub(a, mod), b)
    wrong_sign = op18.And(op18.Not(op18.Equal(mod, zero)), op18.Xor(op18.Less(b, zero), op18.Less(mod, zero)))
    div = op18.Where(wrong_sign, op18.Sub(div, one), div)
    floordiv = op18.Floor(div)
    floordiv = op18.Where(
        op18.Greater(op18.Sub(div, floordiv), op18.CastLike(0.5, a)), op18.Add(floordiv, one), floordiv
    )
    return op18.Where(op18.Equal(b, zero), op18.Div(a, b), floordiv)


def _divide(self, other, rounding_mode: str | None):
    dtype, (a, b) = promote(self, other)
    if rounding_mode is None:
        if dtype not in FLOAT_TYPES:
            a, b = as_float(a), as_float(b)
        return op18.Div(a, b)
    if rounding_mode == "trunc":
        if dtype in HALF_TYPES:
            # torch truncates the float32 quotient rounded to 16 bits (ONNX Runtime's 16-bit Div can differ)
            quotient = op18.Cast(op18.Div(cast_to(a, ir.DataType.FLOAT), cast_to(b, ir.DataType.FLOAT)), to=int(dtype))
            return op18.Cast(trunc(op18.Cast(quotient, to=int(ir.DataType.FLOAT))), to=int(dtype))
        # integer Div truncates toward zero
        return trunc(op18.Div(a, b)) if dtype in FLOAT_TYPES else op18.Div(a, b)
    if rounding_mode == "floor":
        return _floor_divide(a, b, dtype)
    raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


def _add(self, other, alpha: float, subtract: bool):
    dtype, (a, b) = promote(self, other)
    if dtype == ir.DataType.BOOL and not subtract:
        return op18.Or(a, b) if alpha else op18.Identity(a)
    if alpha != 1:
        b = op18.Mul(b, cast_to(alpha, dtype))
    return op18.Sub(a, b) if subtract else op18.Add(a, b)


def _mul(self, other):
    dtype, (a, b) = promote(self, other)
    if dtype == ir.DataType.BOOL:
        return op18.And(a, b)
    return op18.Mul(a, b)


def _pow(self, exponent):
    dtype, (base, power) = promote(self, exponent)
    if dtype in _POW_TYPES:
        return op18.Pow(base, power)
    # small integer types (and bool): ONNX Pow has none, compute in int64 and wrap back
    wide = op18.Pow(cast_to(base, ir.DataType.INT64), cast_to(power, ir.DataType.INT64))
    return op18.Cast(wide, to=int(dtype))


def _remainder(self, other):
    dtype, (a, b) = promote(self, other)
    if dtype in FLOAT_TYPES:
        return _python_remainder(a, b)
    return op18.Mod(a, b)  # fmod=0: the divisor's sign, as Python


def _fmod_promoted(self, other):
    _, (a, b) = promote(self, other)
    return _fmod(a, b)


def _extremum(self, other, maximum: bool):
    dtype, (a, b) = promote(self, other)
    if dtype == ir.DataType.BOOL:
        return op18.Or(a, b) if maximum else op18.And(a, b)
    # Max and Min propagate NaN (onnxruntime and the ONNX reference), as torch does
    return op18.Max(a, b) if maximum else op18.Min(a, b)


# -- add, sub, mul, div --------------------------------------------------------------------


@opreg.impl("aten::add.Tensor")
@opreg.impl("aten::add.Scalar")
def aten_add(self: Tensor, other: Tensor | float, alpha: float = 1.0):
    """add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: Add (and Mul for alpha; Or for bool), after torch's promotion.

    add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor: the same, other a number."""
    return _add(self, other, alpha, subtract=False)


@opreg.impl("aten::sub.Tensor")
@opreg.impl("aten::sub.Scalar")
def aten_sub(self: Tensor, other: Tensor | float, alpha: float = 1.0):
    """sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: Sub (and Mul for alpha), after torch's promotion.

    sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor: the same, other a number."""
    return _add(self, other, alpha, subtract=True)


@opreg.impl("aten::rsub.Tensor")
@opreg.impl("aten::rsub.Scalar")
def aten_rsub(self: Tensor, other: Tensor | float, alpha: float = 1.0):
    """rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: Sub of other and alpha times self, after torch's promotion.

    rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor: the same, other a number."""
    return _add(other, self, alpha, subtract=True)


@opreg.impl("aten::mul.Tensor")
@opreg.impl("aten::mul.Scalar")
@opreg.impl("aten::multiply.Tensor")
@opreg.impl("aten::multiply.Scalar")
def aten_mul(self: Tensor, other: Tensor | float):
    """mul.Tensor(Tensor self, Tensor other) -> Tensor: Mul (And for bool), after torch's promotion.

    mul.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number.

    multiply.Tensor(Tensor self, Tensor other) -> Tensor: mul's other name (``torch.multiply``), kept by torch.export.

    multiply.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _mul(self, other)


@opreg.impl("aten::div.Tensor")
@opreg.impl("aten::div.Scalar")
@opreg.impl("aten::div.Tensor_mode")
@opreg.impl("aten::div.Scalar_mode")
def aten_div(self: Tensor, other: Tensor | float, rounding_mode: str | None = None):
    """div.Tensor(Tensor self, Tensor other) -> Tensor: Div (integers cast to float first).

    div.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number.

    div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor: Div, with Floor/Ceil/Where for trunc and Mod for floor.

    div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor: the same, other a number."""
    return _divide(self, other, rounding_mode)


@opreg.impl("aten::floor_divide")
@opreg.impl("aten::floor_divide.Scalar")
def aten_floor_divide(self: Tensor, other: Tensor | float):
    """floor_divide(Tensor self, Tensor other) -> Tensor: div with rounding_mode="floor" (torch's floor_divide rounds down).

    floor_divide.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _divide(self, other, "floor")


# -- pow, fmod, remainder, atan2 -------------------------------------------------------------


@opreg.impl("aten::pow.Tensor_Tensor")
@opreg.impl("aten::pow.Tensor_Scalar")
@opreg.impl("aten::pow.Scalar")
def aten_pow(self: Tensor | float, exponent: Tensor | float):
    """pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor: Pow, after torch's promotion.

    pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor: the same, the exponent a number. Squares stay
    ``Pow(x, 2)``, the form fusion tools match in RMS norm; ONNX Runtime computes it as ``x * x``, bit for bit,
    as torch does.

    pow.Scalar(Scalar self, Tensor exponent) -> Tensor: the same, of a constant base."""
    return _pow(self, exponent)


@opreg.impl("aten::square")
def aten_square(self: Tensor):
    """square(Tensor self) -> Tensor: ``Pow(x, 2)``, as pow.Tensor_Scalar writes a square (bool squares to int64, as torch's does)."""
    return _pow(self, 2)


@opreg.impl("aten::fmod.Tensor")
@opreg.impl("aten::fmod.Scalar")
def aten_fmod(self: Tensor, other: Tensor | float):
    """fmod.Tensor(Tensor self, Tensor other) -> Tensor: Mod (fmod=1), after torch's promotion.

    fmod.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number."""
    return _fmod_promoted(self, other)


@opreg.impl("aten::remainder.Tensor")
@opreg.impl("aten::remainder.Scalar")
@opreg.impl("aten::remainder.Scalar_Tensor")
def aten_remainder(self: Tensor | float, other: Tensor | float):
    """remainder.Tensor(Tensor self, Tensor other) -> Tensor: Mod (integers) or Mod(fmod=1) and Where (floats): the divisor's sign.

    remainder.Scalar(Tensor self, Scalar other) -> Tensor: the same, other a number.

    remainder.Scalar_Tensor(Scalar self, Tensor other) -> Tensor: the same, self a number."""
    return _remainder(self, other)


@opreg.impl("aten::atan2")
def aten_atan2(self: Tensor, other: Tensor):
    """atan2(Tensor self, Tensor other) -> Tensor: Atan of the ratio with Where for the quadrant, zeros and infinities (ONNX has no Atan2)."""
    dtype, (y, x) = promote(self, other)
    if dtype == ir.DataType.BFLOAT16:  # Atan takes no bfloat16
        return op18.Cast(
            _atan2(op18.Cast(y, to=int(ir.DataType.FLOAT)), op18.Cast(x, to=int(ir.DataType.FLOAT))), to=int(dtype)
        )
    return _atan2(as_float(y), as_float(x))


def _atan2(y, x):
    zero = op18.CastLike(0, x)
    pi = op18.CastLike(math.pi, x)
    # both infinite: the angle of (sign y, sign x); both zero: +-0, then +-pi if x is negative
    ratio = op18.Where(op18.And(isinf(x), isinf(y)), op18.Div(op18.Sign(y), op18.Sign(x)), op18.Div(y, x))
    angle = op18.Where(op18.And(op18.Equal(x, zero), op18.Equal(y, zero)), y, op18.Atan(ratio))
    # negative x, -0.0 included: turn by pi toward y's side, -0.0 counting as below
    shift = op18.Where(_negative(y), op18.Neg(pi), pi)
    return op18.Where(_negative(x), op18.Add(angle, shift), angle)


def _negative(x):
    """x < 0 or x is -0.0 (whose reciprocal is -inf)."""
    zero = op18.CastLike(0, x)
    return op18.Or(op18.Less(x, zero), op18.Less(op18.Reciprocal(x), zero))


# -- maximum, minimum, clamp, where ---------------------------------------------------------------


@opreg.impl("aten::maximum")
@opreg.impl("aten::max.other")
def aten_maximum(self: Tensor, other: Tensor):
    """maximum(Tensor self, Tensor other) -> Tensor: Max (Or for bool), after torch's promotion.

    max.other(Tensor self, Tensor other) -> Tensor: as maximum."""
    return _extremum(self, other, maximum=True)


@opreg.impl("aten::minimum")
@opreg.impl("aten::min.other")
def aten_minimum(self: Tensor, other: Tensor):
    """minimum(Tensor self, Tensor other) -> Tensor: Min (And for bool), after torch's promotion.

    min.other(Tensor self, Tensor other) -> Tensor: as minimum."""
    return _extremum(self, other, maximum=False)


@opreg.impl("aten::clamp")
def aten_clamp(self: Tensor, min: float | None = None, max: float | None = None):
    """clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor: Clip, after torch's promotion."""
    dtype, (x, low, high) = promote(self, min, max)
    if dtype == ir.DataType.BOOL:
        raise ValueError("clamp of a bool tensor is not supported (torch does not support it either)")
    if low is None and high is None:
        return op18.Identity(x)
    return op18.Clip(x, low, high)  # keeps NaN, as torch does


@opreg.impl("aten::clamp.Tensor")
def aten_clamp_tensor(self: Tensor, min: Tensor | None = None, max: Tensor | None = None):
    """clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor: Max and Min (the bounds broadcast)."""
    _, (x, low, high) = promote(self, min, max)
    if low is not None:
        x = _extremum(x, low, maximum=True)
    if high is not None:
        x = _extremum(x, high, maximum=False)
    return op18.Identity(x) if low is None and high is None else x


@opreg.impl("aten::where.self")
@opreg.impl("aten::where.ScalarOther")
@opreg.impl("aten::where.ScalarSelf")
def aten_where(condition: Tensor, self: Tensor | float, other: Tensor | float):
    """where.self(Tensor condition, Tensor self, Tensor other) -> Tensor: Where (And/Or/Not for bool), after torch's promotion of self and other.

    where.ScalarOther(Tensor condition, Tensor self, Scalar other) -> Tensor: the same, other a number.

    where.ScalarSelf(Tensor condition, Scalar self, Tensor other) -> Tensor: the same, self a number."""
    _, (a, b) = promote(self, other)
    return where(cast_to(condition, ir.DataType.BOOL), a, b)


# -- unary math ---------------------------------------------------------------------------------


@opreg.impl("aten::abs")
def aten_abs(self: Tensor):
    """abs(Tensor self) -> Tensor: Abs."""
    return op18.Abs(self)


@opreg.impl("aten::neg")
def aten_neg(self: Tensor):
    """neg(Tensor self) -> Tensor: Neg (Sub from 0 for unsigned integers, which wrap as in torch)."""
    if self.dtype in (ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64):
        return op18.Sub(op18.CastLike(0, self), self)
    return op18.Neg(self)


@opreg.impl("aten::sign")
def aten_sign(self: Tensor):
    """sign(Tensor self) -> Tensor: Sign (NaN -> 0 as torch; Identity for bool)."""
    if self.dtype == ir.DataType.BOOL:
        return op18.Identity(self)
    result = op18.Sign(self)
    if self.dtype in FLOAT_TYPES:
        result = op18.Where(op18.IsNaN(self), op18.CastLike(0, self), result)
    return result


def _rounding(self, rounder):
    if self.dtype not in FLOAT_TYPES:
        return op18.Identity(self)  # torch rounds integers to themselves
    return float_unary(self, rounder)


@opreg.impl("aten::ceil")
def aten_ceil(self: Tensor):
    """ceil(Tensor self) -> Tensor: Ceil (Identity for integers)."""
    return _rounding(self, op18.Ceil)


@opreg.impl("aten::floor")
def aten_floor(self: Tensor):
    """floor(Tensor self) -> Tensor: Floor (Identity for integers)."""
    return _rounding(self, op18.Floor)


@opreg.impl("aten::round")
def aten_round(self: Tensor):
    """round(Tensor self) -> Tensor: Round (half to even, as torch; Identity for integers)."""
    return _rounding(self, op18.Round)


def _round_decimals(x, decimals: int):
    scale = op18.CastLike(10.0 ** abs(decimals), x)
    if decimals > 0:
        return op18.Div(op18.Round(op18.Mul(x, scale)), scale)
    return op18.Mul(op18.Round(op18.Div(x, scale)), scale)


@opreg.impl("aten::round.decimals")
def aten_round_decimals(self: Tensor, decimals: int):
    """round.decimals(Tensor self, *, int decimals) -> Tensor: Mul, Round and Div by the power of ten (as torch computes it)."""
    if decimals == 0:
        return aten_round(self)
    return _rounding(self, lambda x: _round_decimals(x, decimals))


@opreg.impl("aten::trunc")
def aten_trunc(self: Tensor):
    """trunc(Tensor self) -> Tensor: Ceil below zero, Floor above (ONNX has no Trunc; Identity for integers)."""
    return _rounding(self, trunc)


@opreg.impl("aten::acos")
def aten_acos(self: Tensor):
    """acos(Tensor self) -> Tensor: Acos."""
    return float_unary(self, op18.Acos)


@opreg.impl("aten::acosh")
def aten_acosh(self: Tensor):
    """acosh(Tensor self) -> Tensor: Acosh."""
    return float_unary(self, op18.Acosh)


@opreg.impl("aten::asin")
def aten_asin(self: Tensor):
    """asin(Tensor self) -> Tensor: Asin."""
    return float_unary(self, op18.Asin)


@opreg.impl("aten::asinh")
def aten_asinh(self: Tensor):
    """asinh(Tensor self) -> Tensor: Asinh."""
    return float_unary(self, op18.Asinh)


@opreg.impl("aten::atan")
def aten_atan(self: Tensor):
    """atan(Tensor self) -> Tensor: Atan."""
    return float_unary(self, op18.Atan)


@opreg.impl("aten::atanh")
def aten_atanh(self: Tensor):
    """atanh(Tensor self) -> Tensor: Atanh."""
    return float_unary(self, op18.Atanh)


@opreg.impl("aten::cos")
def aten_cos(self: Tensor):
    """cos(Tensor self) -> Tensor: Cos."""
    return float_unary(self, op18.Cos)


@opreg.impl("aten::cosh")
def aten_cosh(self: Tensor):
    """cosh(Tensor self) -> Tensor: Cosh."""
    return float_unary(self, op18.Cosh)


@opreg.impl("aten::sin")
def aten_sin(self: Tensor):
    """sin(Tensor self) -> Tensor: Sin."""
    return float_unary(self, op18.Sin)


@opreg.impl("aten::sinh")
def aten_sinh(self: Tensor):
    """sinh(Tensor self) -> Tensor: Sinh."""
    return float_unary(self, op18.Sinh)


@opreg.impl("aten::tan")
def aten_tan(self: Tensor):
    """tan(Tensor self) -> Tensor: Tan."""
    return float_unary(self, op18.Tan)


@opreg.impl("aten::tanh")
def aten_tanh(self: Tensor):
    """tanh(Tensor self) -> Tensor: Tanh."""
    return float_unary(self, op18.Tanh)


@opreg.impl("aten::erf")
def aten_erf(self: Tensor):
    """erf(Tensor self) -> Tensor: Erf."""
    return float_unary(self, op18.Erf)


@opreg.impl("aten::exp")
def aten_exp(self: Tensor):
    """exp(Tensor self) -> Tensor: Exp."""
    return float_unary(self, op18.Exp)


def _expm1(x):
    one = op18.CastLike(1, x)
    u = op18.Exp(x)
    um1 = op18.Sub(u, one)
    # (u - 1) * x / log(u) cancels the rounding of u; exact when u rounds to 1, -1 when u is 0
    corrected = op18.Div(op18.Mul(um1, x), op18.Log(u))
    corrected = op18.Where(op18.Equal(u, one), x, corrected)
    return op18.Where(op18.Or(op18.Equal(um1, op18.Neg(one)), isinf(u)), um1, corrected)


@opreg.impl("aten::expm1")
def aten_expm1(self: Tensor):
    """expm1(Tensor self) -> Tensor: Exp, Sub, and Kahan's correction (Log, Div) to keep precision near 0."""
    return float_unary(self, _expm1)


@opreg.impl("aten::log")
def aten_log(self: Tensor):
    """log(Tensor self) -> Tensor: Log."""
    return float_unary(self, op18.Log)


def _log1p(x):
    one = op18.CastLike(1, x)
    u = op18.Add(x, one)
    corrected = op18.Div(op18.Mul(op18.Log(u), x), op18.Sub(u, one))
    return op18.Where(op18.Or(op18.Equal(u, one), isinf(u)), op18.Where(op18.Equal(u, one), x, u), corrected)


@opreg.impl("aten::log1p")
def aten_log1p(self: Tensor):
    """log1p(Tensor self) -> Tensor: Add, Log, and Kahan's correction (Mul, Div) to keep precision near 0."""
    return float_unary(self, _log1p)


def _log2(x):
    return op18.Div(op18.Log(x), op18.CastLike(math.log(2.0), x))


@opreg.impl("aten::log2")
def aten_log2(self: Tensor):
    """log2(Tensor self) -> Tensor: Log and Div by ln 2."""
    return float_unary(self, _log2)


def _log10(x):
    return op18.Div(op18.Log(x), op18.CastLike(math.log(10.0), x))


@opreg.impl("aten::log10")
def aten_log10(self: Tensor):
    """log10(Tensor self) -> Tensor: Log and Div by ln 10."""
    return float_unary(self, _log10)


@opreg.impl("aten::reciprocal")
def aten_reciprocal(self: Tensor):
    """reciprocal(Tensor self) -> Tensor: Reciprocal."""
    return float_unary(self, op18.Reciprocal)


@opreg.impl("aten::sqrt")
def aten_sqrt(self: Tensor):
    """sqrt(Tensor self) -> Tensor: Sqrt."""
    return float_unary(self, op18.Sqrt)


@opreg.impl("aten::rsqrt")
def aten_rsqrt(self: Tensor):
    """rsqrt(Tensor self) -> Tensor: Sqrt and Reciprocal."""
    return float_unary(self, lambda x: op18.Reciprocal(op18.Sqrt(x)))


@opreg.impl("aten::sigmoid")
def aten_sigmoid(self: Tensor):
    """sigmoid(Tensor self) -> Tensor: Sigmoid."""
    return float_unary(self, op18.Sigmoid)


_UNARY = (
    ("aten::abs", aten_abs),
    ("aten::neg", aten_neg),
    ("aten::sign", aten_sign),
    ("aten::ceil", aten_ceil),
    ("aten::floor", aten_floor),
    ("aten::round", aten_round),
    ("aten::round.decimals", aten_round_decimals),
    ("aten::trunc", aten_trunc),
    ("aten::acos", aten_acos),
    ("aten::acosh", aten_acosh),
    ("aten::asin", aten_asin),
    ("aten::asinh", aten_asinh),
    ("aten::atan", aten_atan),
    ("aten::atanh", aten_atanh),
    ("aten::cos", aten_cos),
    ("aten::cosh", aten_cosh),
    ("aten::sin", aten_sin),
    ("aten::sinh", aten_sinh),
    ("aten::tan", aten_tan),
    ("aten::tanh", aten_tanh),
    ("aten::erf", aten_erf),
    ("aten::exp", aten_exp),
    ("aten::expm1", aten_expm1),
    ("aten::log", aten_log),
    ("aten::log1p", aten_log1p),
    ("aten::log2", aten_log2),
    ("aten::log10", aten_log10),
    ("aten::reciprocal", aten_reciprocal),
    ("aten::sqrt", aten_sqrt),
    ("aten::rsqrt", aten_rsqrt),
    ("aten::sigmoid", aten_sigmoid),
)
