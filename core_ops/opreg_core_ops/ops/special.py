"""Special functions ONNX has no op for: erfc, erfcx (scaled erfc), exp2, ldexp.

erfc is ``1 - erf(x)`` only where that is exact enough (|x| < 0.5); beyond, ``1 - erf``
cancels to 0 long before erfc underflows (erfc(5) = 1.5e-12 is 0 in float32), so it is
Numerical Recipes' Chebyshev fit ``erfc(x) = t * exp(-x^2 + P(t))``, ``t = 1 / (1 + |x| / 2)``,
whose relative error is below 1.2e-7 everywhere (float32's precision; float64 inputs get
that precision too, not float64's). erfcx is ``t * exp(P(t))``, the ``exp(-x^2)`` cancelled.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, as_float, promote

_ERFC_FIT = (
    -1.26551223,
    1.00002368,
    0.37409196,
    0.09678418,
    -0.18628806,
    0.27886807,
    -1.13520398,
    1.48851587,
    -0.82215223,
    0.17087277,
)
"""Coefficients of P(t), lowest degree first (Numerical Recipes, ``erfcc``)."""


def _floating(self):
    """``self`` as torch computes a float function of it: integers as float32, bfloat16 and float16 through float32."""
    if self.dtype in (ir.DataType.BFLOAT16, ir.DataType.FLOAT16):
        return op18.Cast(self, to=int(ir.DataType.FLOAT)), self.dtype
    x = as_float(self)
    return x, x.dtype


def _fit(x):
    """``(t, P(t))`` for ``|x|`` (Horner's scheme)."""
    t = op18.Reciprocal(op18.Add(op18.CastLike(1.0, x), op18.Mul(op18.Abs(x), op18.CastLike(0.5, x))))
    poly = op18.CastLike(_ERFC_FIT[-1], x)
    for coefficient in reversed(_ERFC_FIT[:-1]):
        poly = op18.Add(op18.Mul(poly, t), op18.CastLike(coefficient, x))
    return t, poly


def _back(result, out_type):
    return result if result.dtype == out_type else op18.Cast(result, to=int(out_type))


@opreg.impl("aten::erfc")
def aten_erfc(self: Tensor):
    """erfc(Tensor self) -> Tensor: 1 - Erf near 0, else the Chebyshev fit (2 - it for x < 0)."""
    x, out_type = _floating(self)
    t, poly = _fit(x)
    tail = op18.Mul(t, op18.Exp(op18.Sub(poly, op18.Mul(x, x))))
    tail = op18.Where(op18.Less(x, op18.CastLike(0.0, x)), op18.Sub(op18.CastLike(2.0, x), tail), tail)
    near = op18.Less(op18.Abs(x), op18.CastLike(0.5, x))
    return _back(op18.Where(near, op18.Sub(op18.CastLike(1.0, x), op18.Erf(x)), tail), out_type)


@opreg.impl("aten::special_erfcx")
def aten_special_erfcx(self: Tensor):
    """special_erfcx(Tensor self) -> Tensor: exp(x^2) * erfc(x), with exp(-x^2) cancelled from the fit for x >= 0."""
    x, out_type = _floating(self)
    t, poly = _fit(x)
    scaled = op18.Mul(t, op18.Exp(poly))  # erfcx(|x|)
    # x < 0: erfcx(x) = 2 exp(x^2) - erfcx(|x|) (overflows to inf as torch's does)
    negative = op18.Sub(op18.Mul(op18.CastLike(2.0, x), op18.Exp(op18.Mul(x, x))), scaled)
    return _back(op18.Where(op18.Less(x, op18.CastLike(0.0, x)), negative, scaled), out_type)


@opreg.impl("aten::exp2")
def aten_exp2(self: Tensor):
    """exp2(Tensor self) -> Tensor: Pow(2, x)."""
    x, out_type = _floating(self)
    return _back(op18.Pow(op18.CastLike(2.0, x), x), out_type)


@opreg.impl("aten::ldexp.Tensor")
def aten_ldexp(self: Tensor, other: Tensor):
    """ldexp.Tensor(Tensor self, Tensor other) -> Tensor: self * Pow(2, other), in the promoted float type."""
    _, (x, exponent) = promote(self, other)
    x, out_type = _floating(x)
    return _back(op18.Mul(x, op18.Pow(op18.CastLike(2.0, x), op18.CastLike(exponent, x))), out_type)
