"""Matrix products and distances: linear, matmul, mm, addmm, bmm, baddbmm, dot, cdist, pdist."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg_core_ops.ops._helpers import Tensor, rank_of
from opreg_core_ops.ops._promotion import FLOAT_TYPES

_GEMM_TYPES = FLOAT_TYPES  # ONNX Runtime has no integer Gemm


def _gemm_ok(a, b) -> bool:
    """Gemm suits 2-D floating operands with a known, non-zero inner size: ONNX Runtime has
    no integer Gemm, and with K=0 its Gemm does not reduce to ``beta * C``."""
    inner = a.shape[-1] if a.shape is not None and len(a.shape) == 2 else None
    return rank_of(b) == 2 and a.dtype in _GEMM_TYPES and isinstance(inner, int) and inner > 0


def aten_linear(input: Tensor, weight: Tensor, bias: Tensor | None = None):
    """linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor: Gemm for 2-D floating input, else MatMul (+ Add)."""
    if _gemm_ok(input, weight):
        if bias is None:
            return op18.Gemm(input, weight, transB=1)
        return op18.Gemm(input, weight, bias, transB=1)
    result = op18.MatMul(input, op18.Transpose(weight, perm=[1, 0]))
    return result if bias is None else op18.Add(result, bias)


def aten_matmul(self: Tensor, other: Tensor):
    """matmul(Tensor self, Tensor other) -> Tensor: MatMul."""
    return op18.MatMul(self, other)


def aten_mm(self: Tensor, mat2: Tensor):
    """mm(Tensor self, Tensor mat2) -> Tensor: MatMul."""
    return op18.MatMul(self, mat2)


def aten_bmm(self: Tensor, mat2: Tensor):
    """bmm(Tensor self, Tensor mat2) -> Tensor: MatMul."""
    return op18.MatMul(self, mat2)


def _scaled_sum(self, product, beta, alpha):
    """``beta * self + alpha * product`` as torch computes it (self ignored when beta=0)."""
    if alpha != 1:
        product = op18.Mul(product, op18.CastLike(alpha, product))
    if beta == 0:
        return op18.Expand(product, op18.Shape(op18.Add(self, product)))
    if beta != 1:
        self = op18.Mul(self, op18.CastLike(beta, self))
    return op18.Add(self, product)


def aten_addmm(self: Tensor, mat1: Tensor, mat2: Tensor, beta: float = 1.0, alpha: float = 1.0):
    """addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor: Gemm (floating, K > 0), else MatMul, Mul, Add."""
    if _gemm_ok(mat1, mat2) and beta != 0:
        return op18.Gemm(mat1, mat2, self, alpha=float(alpha), beta=float(beta))
    return _scaled_sum(self, op18.MatMul(mat1, mat2), beta, alpha)


def aten_baddbmm(self: Tensor, batch1: Tensor, batch2: Tensor, beta: float = 1.0, alpha: float = 1.0):
    """baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor: MatMul, Mul, Add (self ignored when beta=0)."""
    return _scaled_sum(self, op18.MatMul(batch1, batch2), beta, alpha)


def aten_dot(self: Tensor, tensor: Tensor):
    """dot(Tensor self, Tensor tensor) -> Tensor: MatMul of two vectors."""
    return op18.MatMul(self, tensor)


def _distances(x1, x2, p: float):
    """p-norm distances between the rows of x1 (..., P, M) and x2 (..., R, M): (..., P, R)."""
    difference = op18.Sub(op18.Unsqueeze(x1, [-2]), op18.Unsqueeze(x2, [-3]))
    # ONNX Runtime's reductions return an empty input unreduced, so the result is reshaped
    # to (..., P, R) explicitly (allowzero: a 0 there is a size, not "copy").
    shape = op18.Shape(difference, end=-1)
    return op18.Reshape(_reduce_norm(difference, p), shape, allowzero=1)


def _reduce_norm(difference, p: float):
    if p == 2:
        return op18.ReduceL2(difference, [-1], keepdims=0)
    if p == 1:
        return op18.ReduceL1(difference, [-1], keepdims=0)
    if p == float("inf"):
        return op18.ReduceMax(op18.Abs(difference), [-1], keepdims=0)
    if p == 0:
        nonzero = op18.Cast(op18.Not(op18.Equal(difference, op18.CastLike(0, difference))), to=difference.dtype)
        return op18.ReduceSum(nonzero, [-1], keepdims=0)
    powered = op18.Pow(op18.Abs(difference), op18.CastLike(p, difference))
    return op18.Pow(op18.ReduceSum(powered, [-1], keepdims=0), op18.CastLike(1.0 / p, difference))


def aten_cdist_forward(x1: Tensor, x2: Tensor, p: float, compute_mode: int | None):
    """_cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor: Sub of broadcast rows, then ReduceL2/ReduceL1/ReduceMax/Pow-ReduceSum."""
    return _distances(x1, x2, p)


def aten_pdist_forward(self: Tensor, p: float = 2.0):
    """_pdist_forward(Tensor self, float p=2.) -> Tensor: all distances, then GatherND of the upper triangle (Trilu, NonZero)."""
    full = _distances(self, self, p)
    upper = op18.Trilu(op18.Expand(op18.CastLike(1, full), op18.Shape(full)), 1, upper=1)
    pairs = op18.Transpose(op18.NonZero(op18.Cast(upper, to=ir.DataType.BOOL)), perm=[1, 0])
    return op18.GatherND(full, pairs)


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::linear", aten_linear)
    registry.register("aten::matmul", aten_matmul)
    registry.register("aten::mm", aten_mm)
    registry.register("aten::bmm", aten_bmm)
    registry.register("aten::addmm", aten_addmm)
    registry.register("aten::baddbmm", aten_baddbmm)
    registry.register("aten::dot", aten_dot)
    registry.register("aten::_cdist_forward", aten_cdist_forward)
    registry.register("aten::_pdist_forward", aten_pdist_forward)
