"""Activations: relu, gelu (Gelu from opset 20, its decomposition before), elu/selu/celu,
leaky_relu, hardtanh, silu, hardswish, hardsigmoid, softplus, mish."""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg

_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def aten_relu(self):
    """relu(Tensor self) -> Tensor: Relu, or Max with 0 for integers (ONNX Runtime has no integer Relu-14)."""
    if self.dtype not in _FLOAT_TYPES:
        return op18.Max(self, op18.CastLike(0, self))
    return op18.Relu(self)


def aten_gelu(self, approximate: str = "none"):
    """gelu(Tensor self, *, str approximate='none') -> Tensor: Erf or Tanh decomposition.

    Spelled ``x * (0.5 * (erf(x / sqrt(2)) + 1))`` (and the tanh form likewise), the order
    ONNX Runtime's fusion tools match to make Gelu/FastGelu and BiasGelu."""
    half = op18.CastLike(0.5, self)
    one = op18.CastLike(1.0, self)
    if approximate == "tanh":
        inner = op18.Mul(
            op18.CastLike(math.sqrt(2.0 / math.pi), self),
            op18.Add(self, op18.Mul(op18.CastLike(0.044715, self), op18.Pow(self, op18.CastLike(3.0, self)))),
        )
        return op18.Mul(self, op18.Mul(half, op18.Add(op18.Tanh(inner), one)))
    erf = op18.Erf(op18.Div(self, op18.CastLike(math.sqrt(2.0), self)))
    return op18.Mul(self, op18.Mul(half, op18.Add(erf, one)))


def aten_gelu_opset20(self, approximate: str = "none"):
    """gelu(Tensor self, *, str approximate='none') -> Tensor: Gelu (opset 20)."""
    return op20.Gelu(self, approximate=approximate)


def aten_elu(self, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0):
    """elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor: Elu, Selu (scaled, as selu becomes), or their decomposition."""
    if scale == 1 and input_scale == 1:
        return op18.Elu(self, alpha=float(alpha))
    if input_scale == 1:
        return op18.Selu(self, alpha=float(alpha), gamma=float(scale))
    # x > 0: scale * x; else: scale * alpha * (exp(input_scale * x) - 1)
    zero = op18.CastLike(0, self)
    negative = op18.Mul(
        op18.CastLike(float(alpha) * float(scale), self),
        op18.Sub(op18.Exp(op18.Mul(self, op18.CastLike(float(input_scale), self))), op18.CastLike(1, self)),
    )
    return op18.Where(op18.Greater(self, zero), op18.Mul(self, op18.CastLike(float(scale), self)), negative)


def aten_celu(self, alpha: float = 1.0):
    """celu(Tensor self, Scalar alpha=1.) -> Tensor: Celu (16-bit floats through float32: Celu takes float only)."""
    if self.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return op18.Cast(op18.Celu(op18.Cast(self, to=ir.DataType.FLOAT), alpha=float(alpha)), to=self.dtype)
    return op18.Celu(self, alpha=float(alpha))


def aten_leaky_relu(self, negative_slope: float = 0.01):
    """leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor: LeakyRelu."""
    return op18.LeakyRelu(self, alpha=float(negative_slope))


def aten_hardtanh(self, min_val: float = -1.0, max_val: float = 1.0):
    """hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor: Clip."""
    return op18.Clip(self, op18.CastLike(min_val, self), op18.CastLike(max_val, self))


def aten_silu(self):
    """silu(Tensor self) -> Tensor: Mul by Sigmoid (not Swish-24: onnxruntime 1.31 has no kernel for it)."""
    return op18.Mul(self, op18.Sigmoid(self))


def aten_hardswish(self):
    """hardswish(Tensor self) -> Tensor: HardSwish."""
    return op18.HardSwish(self)


def aten_hardsigmoid(self):
    """hardsigmoid(Tensor self) -> Tensor: HardSigmoid (alpha 1/6, beta 1/2)."""
    return op18.HardSigmoid(self, alpha=1.0 / 6.0, beta=0.5)


def aten_softplus(self, beta: float = 1.0, threshold: float = 20.0):
    """softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor: Softplus (scaled by beta), Where above the threshold."""
    scaled = self if beta == 1 else op18.Mul(self, op18.CastLike(float(beta), self))
    soft = op18.Softplus(scaled)
    if beta != 1:
        soft = op18.Div(soft, op18.CastLike(float(beta), self))
    return op18.Where(op18.Greater(scaled, op18.CastLike(float(threshold), self)), self, soft)


def aten_mish(self):
    """mish(Tensor self) -> Tensor: Mish."""
    return op18.Mish(self)


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::relu", aten_relu, opset=18)
    registry.register("aten::gelu", aten_gelu, opset=18)
    registry.register("aten::gelu", aten_gelu_opset20, opset=20)
    registry.register("aten::elu", aten_elu, opset=18)
    registry.register("aten::celu", aten_celu, opset=18)
    registry.register("aten::leaky_relu", aten_leaky_relu, opset=18)
    registry.register("aten::hardtanh", aten_hardtanh, opset=18)
    registry.register("aten::silu", aten_silu, opset=18)
    registry.register("aten::hardswish", aten_hardswish, opset=18)
    registry.register("aten::hardsigmoid", aten_hardsigmoid, opset=18)
    registry.register("aten::softplus", aten_softplus, opset=18)
    registry.register("aten::mish", aten_mish, opset=18)
