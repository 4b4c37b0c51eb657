"""Elementwise arithmetic: add, sub, mul, div."""

from __future__ import annotations

from onnxscript.onnx_opset import opset18 as op18

import opreg


def aten_add(self, other, alpha: float = 1.0):
    """add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: Add (and Mul for alpha)."""
    if alpha != 1.0:
        other = op18.Mul(other, op18.CastLike(alpha, other))
    return op18.Add(self, other)


def aten_sub(self, other, alpha: float = 1.0):
    """sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: Sub (and Mul for alpha)."""
    if alpha != 1.0:
        other = op18.Mul(other, op18.CastLike(alpha, other))
    return op18.Sub(self, other)


def aten_mul(self, other):
    """mul.Tensor(Tensor self, Tensor other) -> Tensor: Mul."""
    return op18.Mul(self, other)


def aten_div(self, other):
    """div.Tensor(Tensor self, Tensor other) -> Tensor: Div."""
    return op18.Div(self, other)


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::add.Tensor", aten_add, opset=18)
    registry.register("aten::sub.Tensor", aten_sub, opset=18)
    registry.register("aten::mul.Tensor", aten_mul, opset=18)
    registry.register("aten::div.Tensor", aten_div, opset=18)
