"""Activations: relu, gelu (Gelu from opset 20, its decomposition before), elu/selu/celu,
leaky_relu, hardtanh, silu, hardswish, hardsigmoid, softplus, mish, softmax and log_softmax."""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg
from opreg_core_ops.ops._helpers import Tensor, rank_of
from opreg_core_ops.ops._promotion import FLOAT_TYPES, HALF_TYPES


def aten_relu(self: Tensor):
    """relu(Tensor self) -> Tensor: Relu, or Max with 0 for integers (ONNX Runtime has no integer Relu-14)."""
    if self.dtype not in FLOAT_TYPES:
        return op18.Max(self, op18.CastLike(0, self))
    return op18.Relu(self)


def aten_gelu(self: Tensor, approximate: str = "none"):
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


def aten_gelu_opset20(self: Tensor, approximate: str = "none"):
    """gelu(Tensor self, *, str approximate='none') -> Tensor: Gelu (opset 20)."""
    return op20.Gelu(self, approximate=approximate)


def aten_elu(self: Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0):
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


def aten_celu(self: Tensor, alpha: float = 1.0):
    """celu(Tensor self, Scalar alpha=1.) -> Tensor: Celu (16-bit floats through float32: Celu takes float only)."""
    if self.dtype in HALF_TYPES:
        return op18.Cast(op18.Celu(op18.Cast(self, to=ir.DataType.FLOAT), alpha=float(alpha)), to=self.dtype)
    return op18.Celu(self, alpha=float(alpha))


def aten_leaky_relu(self: Tensor, negative_slope: float = 0.01):
    """leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor: LeakyRelu."""
    return op18.LeakyRelu(self, alpha=float(negative_slope))


def aten_hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0):
    """hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor: Clip."""
    return op18.Clip(self, op18.CastLike(min_val, self), op18.CastLike(max_val, self))


def aten_silu(self: Tensor):
    """silu(Tensor self) -> Tensor: Mul by Sigmoid (not Swish-24: onnxruntime 1.31 has no kernel for it)."""
    return op18.Mul(self, op18.Sigmoid(self))


def aten_hardswish(self: Tensor):
    """hardswish(Tensor self) -> Tensor: HardSwish."""
    return op18.HardSwish(self)


def aten_hardsigmoid(self: Tensor):
    """hardsigmoid(Tensor self) -> Tensor: HardSigmoid (alpha 1/6, beta 1/2)."""
    return op18.HardSigmoid(self, alpha=1.0 / 6.0, beta=0.5)


def aten_softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0):
    """softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor: Softplus (scaled by beta), Where above the threshold."""
    scaled = self if beta == 1 else op18.Mul(self, op18.CastLike(float(beta), self))
    soft = op18.Softplus(scaled)
    if beta != 1:
        soft = op18.Div(soft, op18.CastLike(float(beta), self))
    return op18.Where(op18.Greater(scaled, op18.CastLike(float(threshold), self)), self, soft)


def aten_mish(self: Tensor):
    """mish(Tensor self) -> Tensor: Mish."""
    return op18.Mish(self)


def _softmax(softmax, self, dim: int, dtype: int | None):
    """``softmax`` (Softmax or LogSoftmax) along ``dim``, after a Cast to ``dtype`` (the result's
    dtype, if given); a 0-d input as 1-D."""
    x = self if dtype is None or self.dtype == dtype else op18.Cast(self, to=dtype)
    if rank_of(self) == 0:
        return op18.Squeeze(softmax(op18.Unsqueeze(x, [0]), axis=0), [0])
    return softmax(x, axis=dim)


def aten_softmax_internal(self: Tensor, dim: int, half_to_float: bool):
    """_softmax(Tensor self, int dim, bool half_to_float) -> Tensor: Softmax (float32 result for half_to_float)."""
    return _softmax(op18.Softmax, self, dim, ir.DataType.FLOAT if half_to_float else None)


def aten_log_softmax_internal(self: Tensor, dim: int, half_to_float: bool):
    """_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor: LogSoftmax (float32 result for half_to_float)."""
    return _softmax(op18.LogSoftmax, self, dim, ir.DataType.FLOAT if half_to_float else None)


def aten_softmax(self: Tensor, dim: int, dtype: int | None = None):
    """softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor: Softmax (after a Cast to dtype)."""
    return _softmax(op18.Softmax, self, dim, dtype)


def aten_log_softmax(self: Tensor, dim: int, dtype: int | None = None):
    """log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor: LogSoftmax (after a Cast to dtype)."""
    return _softmax(op18.LogSoftmax, self, dim, dtype)


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::relu", aten_relu)
    registry.register("aten::gelu", aten_gelu)
    registry.register("aten::gelu", aten_gelu_opset20)
    registry.register("aten::elu", aten_elu)
    registry.register("aten::celu", aten_celu)
    registry.register("aten::leaky_relu", aten_leaky_relu)
    registry.register("aten::hardtanh", aten_hardtanh)
    registry.register("aten::silu", aten_silu)
    registry.register("aten::hardswish", aten_hardswish)
    registry.register("aten::hardsigmoid", aten_hardsigmoid)
    registry.register("aten::softplus", aten_softplus)
    registry.register("aten::mish", aten_mish)
    registry.register("aten::_softmax", aten_softmax_internal)
    registry.register("aten::_log_softmax", aten_log_softmax_internal)
    registry.register("aten::softmax.int", aten_softmax)
    registry.register("aten::log_softmax.int", aten_log_softmax)
