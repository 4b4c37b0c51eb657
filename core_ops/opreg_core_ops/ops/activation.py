"""Activations: relu, gelu (Gelu from opset 20, its decomposition before), elu/selu/celu,
leaky_relu, hardtanh, silu, hardswish, hardsigmoid, softplus, mish, softmax and log_softmax."""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg
from opreg.ops import FLOAT_TYPES, HALF_TYPES, Tensor, rank_of


@opreg.impl("aten::relu")
def aten_relu(self: Tensor):
    """relu(Tensor self) -> Tensor: Relu, or Max with 0 for integers (ONNX Runtime has no integer Relu-14)."""
    if self.dtype not in FLOAT_TYPES:
        return op18.Max(self, op18.CastLike(0, self))
    return op18.Relu(self)


@opreg.impl("aten::gelu", opset=18)
@opreg.impl("aten::gelu", opset=20)
def aten_gelu(self: Tensor, approximate: str = "none", *, opset: int):
    """gelu(Tensor self, *, str approximate='none') -> Tensor: Gelu from opset 20, before it the Erf or Tanh decomposition.

    Spelled ``x * (0.5 * (erf(x / sqrt(2)) + 1))`` (and the tanh form likewise), the order
    ONNX Runtime's fusion tools match to make Gelu/FastGelu and BiasGelu."""
    if opset >= 20:
        return op20.Gelu(self, approximate=approximate)
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


@opreg.impl("aten::elu")
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


@opreg.impl("aten::celu")
def aten_celu(self: Tensor, alpha: float = 1.0):
    """celu(Tensor self, Scalar alpha=1.) -> Tensor: Celu (16-bit floats through float32: Celu takes float only)."""
    if self.dtype in HALF_TYPES:
        return op18.Cast(op18.Celu(op18.Cast(self, to=ir.DataType.FLOAT), alpha=float(alpha)), to=self.dtype)
    return op18.Celu(self, alpha=float(alpha))


@opreg.impl("aten::leaky_relu")
def aten_leaky_relu(self: Tensor, negative_slope: float = 0.01):
    """leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor: LeakyRelu."""
    return op18.LeakyRelu(self, alpha=float(negative_slope))


@opreg.impl("aten::hardtanh")
def aten_hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0):
    """hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor: Clip."""
    return op18.Clip(self, op18.CastLike(min_val, self), op18.CastLike(max_val, self))


@opreg.impl("aten::silu")
def aten_silu(self: Tensor):
    """silu(Tensor self) -> Tensor: Mul by Sigmoid (not Swish-24: onnxruntime 1.31 has no kernel for it)."""
    return op18.Mul(self, op18.Sigmoid(self))


@opreg.impl("aten::hardswish")
def aten_hardswish(self: Tensor):
    """hardswish(Tensor self) -> Tensor: HardSwish."""
    return op18.HardSwish(self)


@opreg.impl("aten::hardsigmoid")
def aten_hardsigmoid(self: Tensor):
    """hardsigmoid(Tensor self) -> Tensor: HardSigmoid (alpha 1/6, beta 1/2)."""
    return op18.HardSigmoid(self, alpha=1.0 / 6.0, beta=0.5)


@opreg.impl("aten::softplus")
def aten_softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0):
    """softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor: Softplus (scaled by beta), Where above the threshold."""
    scaled = self if beta == 1 else op18.Mul(self, op18.CastLike(float(beta), self))
    soft = op18.Softplus(scaled)
    if beta != 1:
        soft = op18.Div(soft, op18.CastLike(float(beta), self))
    return op18.Where(op18.Greater(scaled, op18.CastLike(float(threshold), self)), self, soft)


@opreg.impl("aten::mish")
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


@opreg.impl("aten::_softmax")
def aten_softmax_internal(self: Tensor, dim: int, half_to_float: bool):
    """_softmax(Tensor self, int dim, bool half_to_float) -> Tensor: Softmax (float32 result for half_to_float)."""
    return _softmax(op18.Softmax, self, dim, ir.DataType.FLOAT if half_to_float else None)


@opreg.impl("aten::_log_softmax")
def aten_log_softmax_internal(self: Tensor, dim: int, half_to_float: bool):
    """_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor: LogSoftmax (float32 result for half_to_float)."""
    return _softmax(op18.LogSoftmax, self, dim, ir.DataType.FLOAT if half_to_float else None)


@opreg.impl("aten::softmax.int")
def aten_softmax(self: Tensor, dim: int, dtype: int | None = None):
    """softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor: Softmax (after a Cast to dtype)."""
    return _softmax(op18.Softmax, self, dim, dtype)


@opreg.impl("aten::log_softmax.int")
def aten_log_softmax(self: Tensor, dim: int, dtype: int | None = None):
    """log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor: LogSoftmax (after a Cast to dtype)."""
    return _softmax(op18.LogSoftmax, self, dim, dtype)
