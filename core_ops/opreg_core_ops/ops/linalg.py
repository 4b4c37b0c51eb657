"""Matrix products: linear, matmul, mm, addmm, bmm."""

from __future__ import annotations

from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg_core_ops.ops._helpers import rank_of


def aten_linear(input, weight, bias=None):
    """linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor: Gemm for 2-D input, else MatMul (+ Add)."""
    if rank_of(input) == 2 and rank_of(weight) == 2:
        if bias is None:
            return op18.Gemm(input, weight, transB=1)
        return op18.Gemm(input, weight, bias, transB=1)
    result = op18.MatMul(input, op18.Transpose(weight, perm=[1, 0]))
    return result if bias is None else op18.Add(result, bias)


def aten_matmul(self, other):
    """matmul(Tensor self, Tensor other) -> Tensor: MatMul."""
    return op18.MatMul(self, other)


def aten_mm(self, mat2):
    """mm(Tensor self, Tensor mat2) -> Tensor: MatMul."""
    return op18.MatMul(self, mat2)


def aten_bmm(self, mat2):
    """bmm(Tensor self, Tensor mat2) -> Tensor: MatMul."""
    return op18.MatMul(self, mat2)


def aten_addmm(self, mat1, mat2, beta: float = 1.0, alpha: float = 1.0):
    """addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor: Gemm."""
    return op18.Gemm(mat1, mat2, self, alpha=float(alpha), beta=float(beta))


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::linear", aten_linear, opset=18)
    registry.register("aten::matmul", aten_matmul, opset=18)
    registry.register("aten::mm", aten_mm, opset=18)
    registry.register("aten::bmm", aten_bmm, opset=18)
    registry.register("aten::addmm", aten_addmm, opset=18)
