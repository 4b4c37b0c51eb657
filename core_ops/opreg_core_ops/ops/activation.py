"""Activations: relu, gelu (Gelu from opset 20, its decomposition before)."""

from __future__ import annotations

import math

from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg


def aten_relu(self):
    """relu(Tensor self) -> Tensor: Relu."""
    return op18.Relu(self)


def aten_gelu(self, approximate: str = "none"):
    """gelu(Tensor self, *, str approximate='none') -> Tensor: Erf or Tanh decomposition."""
    half = op18.CastLike(0.5, self)
    one = op18.CastLike(1.0, self)
    if approximate == "tanh":
        inner = op18.Mul(
            op18.CastLike(math.sqrt(2.0 / math.pi), self),
            op18.Add(self, op18.Mul(op18.CastLike(0.044715, self), op18.Pow(self, op18.CastLike(3.0, self)))),
        )
        return op18.Mul(op18.Mul(half, self), op18.Add(one, op18.Tanh(inner)))
    erf = op18.Erf(op18.Div(self, op18.CastLike(math.sqrt(2.0), self)))
    return op18.Mul(op18.Mul(half, self), op18.Add(one, erf))


def aten_gelu_opset20(self, approximate: str = "none"):
    """gelu(Tensor self, *, str approximate='none') -> Tensor: Gelu (opset 20)."""
    return op20.Gelu(self, approximate=approximate)


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::relu", aten_relu, opset=18)
    registry.register("aten::gelu", aten_gelu, opset=18)
    registry.register("aten::gelu", aten_gelu_opset20, opset=20)
