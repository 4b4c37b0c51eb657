"""Cumulative ops along one dim: cumsum, cumprod, cummax/cummin (values and indices), logcumsumexp.

cumsum is CumSum, and cumprod CumProd from ai.onnx 26. Before 26 ONNX has no cumulative product,
and a sum of logarithms fails on zeros and negative values; so cumprod, cummax, cummin and
logcumsumexp reduce *prefix rows*: along ``dim`` moved last, an n x n matrix whose row i holds
elements 0..i and a neutral fill after (1 for a product, -inf for a max), reduced over its last
axis. That is exact for zeros, signs, infinities and NaN, and takes n^2 elements per slice.

Each is computed in the type torch's CPU kernels accumulate in (float64 for float32, float32 for
float16 and bfloat16, int64 for integers and bool) and each result cast back, as torch rounds it.
"""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset26 as op26

import opreg
from opreg.ops import HALF_TYPES, Tensor, is_integral, rank_of

_INT64 = ir.DataType.INT64
_EXTREMES = {True: (-math.inf, -(2**63)), False: (math.inf, 2**63 - 1)}
"""The fill of a max's prefix rows (``True``) and a min's: below (above) every value, float and int64."""


def _accumulator(dtype: ir.DataType, asked: int | None = None) -> ir.DataType:
    """The type torch's CPU kernel accumulates ``dtype`` (or the ``dtype=`` asked for) in."""
    dtype = ir.DataType(asked) if asked is not None else dtype
    if is_integral(dtype):
        return _INT64
    if dtype in HALF_TYPES:
        return ir.DataType.FLOAT
    return ir.DataType.DOUBLE


def _dim_last(x, dim: int):
    """``x`` with ``dim`` swapped with its last axis, and the permutation that swaps it back (``None``
    when ``dim`` is last already, negative or not)."""
    rank = rank_of(x)
    axis = dim % rank
    if axis == rank - 1:
        return x, None
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    return op18.Transpose(x, perm=perm), perm


def _back(x, perm):
    return x if perm is None else op18.Transpose(x, perm=perm)


def _prefix_rows(last, fill):
    """Each position's prefix along ``last``'s last axis as a row: ``rows[..., i, j]`` is
    ``last[..., j]`` for ``j <= i`` and ``fill`` after; and the mask ``j <= i`` (n x n, bool)."""
    size = op18.Shape(last, start=-1)
    square = op18.Concat(size, size, axis=0)
    prefix = op18.Cast(op18.Trilu(op18.Expand(op18.Constant(value_int=1), square), upper=0), to=ir.DataType.BOOL)
    return op18.Where(prefix, op18.Unsqueeze(last, [-2]), op18.CastLike(fill, last)), prefix


@opreg.impl("aten::cumsum")
def aten_cumsum(self: Tensor, dim: int, dtype: int | None = None):
    """cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor: CumSum (ints as INT64)."""
    if dtype is not None:
        self = op18.Cast(self, to=dtype)
    elif is_integral(self.dtype):
        self = op18.Cast(self, to=_INT64)
    if rank_of(self) == 0:
        return op18.Identity(self)
    out_type = self.dtype
    if out_type in HALF_TYPES:
        return op18.Cast(op18.CumSum(op18.Cast(self, to=ir.DataType.FLOAT), dim), to=out_type)
    return op18.CumSum(self, dim)


@opreg.impl("aten::cumprod", opset=18)
@opreg.impl("aten::cumprod", opset=26)
def aten_cumprod(self: Tensor, dim: int, dtype: int | None = None, *, opset: int):
    """cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor: CumProd from ai.onnx 26, before it
    ReduceProd of prefix rows (ones after each position); in torch's accumulation type, each result cast back.

    Integers and bool give int64 (as torch promotes them), a ``dtype`` given is cast to first."""
    out_type = _INT64 if dtype is None and is_integral(self.dtype) else ir.DataType(dtype or self.dtype)
    x = op18.Cast(self, to=_accumulator(self.dtype, dtype))
    if rank_of(x) == 0:
        return op18.Cast(x, to=out_type)
    if opset >= 26:
        return op18.Cast(op26.CumProd(x, op18.Constant(value_int=dim)), to=out_type)
    last, perm = _dim_last(x, dim)
    rows, _ = _prefix_rows(last, 1)
    return op18.Cast(_back(op18.ReduceProd(rows, [-1], keepdims=0), perm), to=out_type)


def _cumulative_extreme(self, dim: int, largest: bool):
    """cummax (``largest``) or cummin: the running extreme and the last index holding it, as torch's
    kernel keeps them (a later equal value takes the index; a NaN wins and holds, the last NaN's index)."""
    if rank_of(self) == 0:
        return op18.Identity(self), op18.Constant(value_int=0)
    x = op18.Cast(self, to=_accumulator(self.dtype))
    last, perm = _dim_last(x, dim)
    float_fill, int_fill = _EXTREMES[largest]
    rows, prefix = _prefix_rows(last, int_fill if x.dtype == _INT64 else float_fill)
    reduce = op18.ReduceMax if largest else op18.ReduceMin
    if x.dtype == _INT64:
        best = reduce(rows, [-1], keepdims=1)
        hit = op18.And(prefix, op18.Equal(rows, best))
        values = op18.Squeeze(best, [-1])
    else:
        nan = op18.IsNaN(rows)  # the fill is no NaN: only a prefix's own
        best = reduce(op18.Where(nan, op18.CastLike(float_fill, rows), rows), [-1], keepdims=1)
        has_nan = op18.Cast(op18.ReduceMax(op18.Cast(nan, to=ir.DataType.INT32), [-1], keepdims=1), to=ir.DataType.BOOL)
        held = op18.And(prefix, op18.Equal(rows, best))  # a bool Where: ONNX Runtime has no kernel for one
        hit = op18.Or(op18.And(has_nan, nan), op18.And(op18.Not(has_nan), held))
        values = op18.Squeeze(op18.Where(has_nan, op18.CastLike(math.nan, best), best), [-1])
    positions = op18.Range(op18.Constant(value_int=0), op18.Squeeze(op18.Shape(last, start=-1), [0]), 1)
    indices = op18.ReduceMax(op18.Where(hit, positions, op18.Constant(value_int=-1)), [-1], keepdims=0)
    return op18.Cast(_back(values, perm), to=self.dtype), _back(indices, perm)


@opreg.impl("aten::cummax")
def aten_cummax(self: Tensor, dim: int):
    """cummax(Tensor self, int dim) -> (Tensor values, Tensor indices): ReduceMax of prefix rows (-inf or int64's
    least after each position); the index is the last in the prefix holding the max (or its last NaN)."""
    return _cumulative_extreme(self, dim, largest=True)


@opreg.impl("aten::cummin")
def aten_cummin(self: Tensor, dim: int):
    """cummin(Tensor self, int dim) -> (Tensor values, Tensor indices): ReduceMin of prefix rows (+inf or int64's
    largest after each position); the index is the last in the prefix holding the min (or its last NaN)."""
    return _cumulative_extreme(self, dim, largest=False)


@opreg.impl("aten::logcumsumexp")
def aten_logcumsumexp(self: Tensor, dim: int):
    """logcumsumexp(Tensor self, int dim) -> Tensor: per position, a max-shifted logsumexp of its prefix row (-inf after it; half floats in float32).

    One shift for the whole slice would underflow the prefixes far below the slice's max
    (log(0) = -inf for a true -200); each prefix has its own shift here, so it is exact."""
    out_type = self.dtype
    x = op18.Cast(self, to=ir.DataType.FLOAT) if out_type in HALF_TYPES else self
    if rank_of(x) == 0:
        return op18.Identity(self)
    last, perm = _dim_last(x, dim)
    rows, _ = _prefix_rows(last, -math.inf)  # (..., i, j<=i)
    peak = op18.ReduceMax(rows, [-1], keepdims=1)
    peak = op18.Where(op18.IsInf(peak), op18.CastLike(0.0, peak), peak)  # all -inf, or +inf: no shift
    total = op18.ReduceSum(op18.Exp(op18.Sub(rows, peak)), [-1], keepdims=0)
    result = _back(op18.Add(op18.Log(total), op18.Squeeze(peak, [-1])), perm)
    return result if out_type == result.dtype else op18.Cast(result, to=out_type)
