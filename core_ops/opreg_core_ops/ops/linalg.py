"""Matrix products and distances: linear, einsum, matmul, mm, addmm, addmv, addbmm, bmm, baddbmm, dot, _trilinear
(bilinear), cdist, pdist; determinants (det, slogdet)."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import FLOAT_TYPES, HALF_TYPES, Tensor, rank_of

_GEMM_TYPES = FLOAT_TYPES  # ONNX Runtime has no integer Gemm


def _gemm_ok(a, b) -> bool:
    """Gemm suits 2-D floating operands with a known, non-zero inner size: ONNX Runtime has
    no integer Gemm, and with K=0 its Gemm does not reduce to ``beta * C``."""
    inner = a.shape[-1] if a.shape is not None and len(a.shape) == 2 else None
    return rank_of(b) == 2 and a.dtype in _GEMM_TYPES and isinstance(inner, int) and inner > 0


@opreg.impl("aten::linear")
def aten_linear(input: Tensor, weight: Tensor, bias: Tensor | None = None):
    """linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor: Gemm for 2-D floating input, else MatMul (+ Add); a 1-D weight (D-FINE's projection) is a MatMul by the vector."""
    if rank_of(weight) == 1:
        result = op18.MatMul(input, weight)
        return result if bias is None else op18.Add(result, bias)
    if _gemm_ok(input, weight):
        if bias is None:
            return op18.Gemm(input, weight, transB=1)
        return op18.Gemm(input, weight, bias, transB=1)
    result = op18.MatMul(input, op18.Transpose(weight, perm=[1, 0]))
    return result if bias is None else op18.Add(result, bias)


def _einsum_covered(node) -> bool:
    """Float32/float64 operands (the types ONNX Runtime's Einsum computes in as torch does), and no
    ellipsis (ONNX's shape inference does not broadcast ellipses of different ranks, torch does)."""
    values = [t.meta.get("val") for t in node.args[1]]
    floats = all(v is not None and str(v.dtype) in ("torch.float32", "torch.float64") for v in values)
    return floats and "..." not in node.args[0]


@opreg.impl("aten::einsum", predicate=_einsum_covered)
def aten_einsum(equation: str, tensors: Sequence[Tensor], *, path: Sequence[int] | None = None):
    """einsum(str equation, Tensor[] tensors, *, int[]? path=None) -> Tensor: Einsum."""
    return op18.Einsum(*tensors, equation=equation.replace(" ", ""))


@opreg.impl("aten::matmul")
def aten_matmul(self: Tensor, other: Tensor):
    """matmul(Tensor self, Tensor other) -> Tensor: MatMul."""
    return op18.MatMul(self, other)


@opreg.impl("aten::mm")
def aten_mm(self: Tensor, mat2: Tensor):
    """mm(Tensor self, Tensor mat2) -> Tensor: MatMul."""
    return op18.MatMul(self, mat2)


@opreg.impl("aten::bmm")
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


@opreg.impl("aten::addmm")
def aten_addmm(self: Tensor, mat1: Tensor, mat2: Tensor, beta: float = 1.0, alpha: float = 1.0):
    """addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor: Gemm (floating, K > 0), else MatMul, Mul, Add."""
    if _gemm_ok(mat1, mat2) and beta != 0:
        return op18.Gemm(mat1, mat2, self, alpha=float(alpha), beta=float(beta))
    return _scaled_sum(self, op18.MatMul(mat1, mat2), beta, alpha)


@opreg.impl("aten::baddbmm")
def aten_baddbmm(self: Tensor, batch1: Tensor, batch2: Tensor, beta: float = 1.0, alpha: float = 1.0):
    """baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor: MatMul, Mul, Add (self ignored when beta=0)."""
    return _scaled_sum(self, op18.MatMul(batch1, batch2), beta, alpha)


@opreg.impl("aten::dot")
def aten_dot(self: Tensor, tensor: Tensor):
    """dot(Tensor self, Tensor tensor) -> Tensor: MatMul of two vectors."""
    return op18.MatMul(self, tensor)


def _distances(x1, x2, p: float):
    """p-norm distances between the rows of x1 (..., P, M) and x2 (..., R, M): (..., P, R)."""
    difference = op18.Sub(op18.Unsqueeze(x1, [-2]), op18.Unsqueeze(x2, [-3]))
    # ONNX Runtime before 1.32 returns an empty input to a reduction unreduced: a result known
    # to be empty is made directly, and one that may be is reshaped to (..., P, R) explicitly
    # (allowzero: a 0 there is a size, not "copy"; the lean pass keeps such a Reshape).
    dims = difference.shape
    if dims is not None and all(isinstance(d, int) for d in dims) and 0 in list(dims)[:-1]:
        return op18.Expand(op18.CastLike(0, difference), list(dims)[:-1])
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


@opreg.impl("aten::_cdist_forward")
def aten_cdist_forward(x1: Tensor, x2: Tensor, p: float, compute_mode: int | None):
    """_cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor: Sub of broadcast rows, then ReduceL2/ReduceL1/ReduceMax/Pow-ReduceSum."""
    return _distances(x1, x2, p)


@opreg.impl("aten::_pdist_forward")
def aten_pdist_forward(self: Tensor, p: float = 2.0):
    """_pdist_forward(Tensor self, float p=2.) -> Tensor: all distances, then GatherND of the upper triangle (Trilu, NonZero)."""
    full = _distances(self, self, p)
    upper = op18.Trilu(op18.Expand(op18.CastLike(1, full), op18.Shape(full)), 1, upper=1)
    pairs = op18.Transpose(op18.NonZero(op18.Cast(upper, to=ir.DataType.BOOL)), perm=[1, 0])
    return op18.GatherND(full, pairs)


@opreg.impl("aten::addmv")
def aten_addmv(self: Tensor, mat: Tensor, vec: Tensor, beta: float = 1.0, alpha: float = 1.0):
    """addmv(Tensor self, Tensor mat, Tensor vec, *, Scalar beta=1, Scalar alpha=1) -> Tensor: MatMul, Mul, Add (self ignored when beta=0)."""
    return _scaled_sum(self, op18.MatMul(mat, vec), beta, alpha)


@opreg.impl("aten::addbmm")
def aten_addbmm(self: Tensor, batch1: Tensor, batch2: Tensor, beta: float = 1.0, alpha: float = 1.0):
    """addbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor: MatMul, ReduceSum over the batch, Mul, Add."""
    batches = batch1.shape[0] if batch1.shape is not None else None
    if self.dtype in HALF_TYPES and isinstance(batches, int) and batches > 0:
        return _addbmm_rounded(self, batch1, batch2, batches, beta, alpha)
    total = op18.ReduceSum(op18.MatMul(batch1, batch2), [0], keepdims=0)
    return _scaled_sum(self, total, beta, alpha)


def _addbmm_rounded(self, batch1, batch2, batches: int, beta, alpha):
    """16-bit floats as torch's CPU kernel computes them: one addmm per batch, each in float32 and
    rounded to the 16-bit type (``result = beta * self + alpha * b1[0] @ b2[0]``, then ``+= alpha * ...``)."""
    out_type, wide = self.dtype, ir.DataType.FLOAT
    result = self
    for index in range(batches):
        product = op18.MatMul(*(op18.Cast(op18.Gather(b, index, axis=0), to=wide) for b in (batch1, batch2)))
        step = _scaled_sum(op18.Cast(result, to=wide), product, beta if index == 0 else 1, alpha)
        result = op18.Cast(step, to=out_type)
    return result


@opreg.impl("aten::_trilinear")
def aten_trilinear(
    i1: Tensor,
    i2: Tensor,
    i3: Tensor,
    expand1: Sequence[int],
    expand2: Sequence[int],
    expand3: Sequence[int],
    sumdim: Sequence[int],
    unroll_dim: int = 1,
):
    """_trilinear(Tensor i1, Tensor i2, Tensor i3, int[] expand1, int[] expand2, int[] expand3, int[] sumdim, int unroll_dim=1) -> Tensor: Unsqueeze each, Mul, ReduceSum over sumdim."""
    terms = [op18.Unsqueeze(t, list(e)) if e else t for t, e in ((i1, expand1), (i2, expand2), (i3, expand3))]
    product = op18.Mul(op18.Mul(terms[0], terms[1]), terms[2])
    return op18.ReduceSum(product, list(sumdim), keepdims=0) if sumdim else product


def _first_output_only(node) -> bool:
    """Only output 0 is read (det's LU factors and pivots have no ONNX form)."""
    return all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)


def _determinant(a):
    if a.dtype in FLOAT_TYPES - {ir.DataType.BFLOAT16}:
        return op18.Det(a), a.dtype
    return op18.Det(op18.Cast(a, to=ir.DataType.FLOAT)), a.dtype


@opreg.impl("aten::_linalg_det", predicate=_first_output_only)
def aten_linalg_det(A: Tensor):
    """_linalg_det(Tensor A) -> (Tensor result, Tensor LU, Tensor pivots): Det (only the result is exported)."""
    det, out_type = _determinant(A)
    det = det if det.dtype == out_type else op18.Cast(det, to=out_type)
    return det, op18.Identity(A), op18.Constant(value_ints=[0])


def _sign_and_log(node) -> bool:
    return all(user.target is operator.getitem and user.args[1] in (0, 1) for user in node.users)


@opreg.impl("aten::_linalg_slogdet", predicate=_sign_and_log)
def aten_linalg_slogdet(A: Tensor):
    """_linalg_slogdet(Tensor A) -> (Tensor sign, Tensor logabsdet, Tensor LU, Tensor pivots): Sign and Log(Abs) of Det (only those are exported).

    Det's value must fit the type: a matrix whose determinant overflows float32 (say 100 x 100
    of N(0, 1) entries) has a finite logabsdet in torch and inf here."""
    det, out_type = _determinant(A)
    sign, log = op18.Sign(det), op18.Log(op18.Abs(det))
    if det.dtype != out_type:
        sign, log = op18.Cast(sign, to=out_type), op18.Cast(log, to=out_type)
    return sign, log, op18.Identity(A), op18.Constant(value_ints=[0])
