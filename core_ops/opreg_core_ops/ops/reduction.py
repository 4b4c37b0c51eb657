"""Reductions: sum/mean/prod, amax/amin/max/min, any/all, argmax/argmin, var/std, diff, sort/topk, logsumexp (the
cumulative ones are in ``cumulative``).

NaN: torch propagates it through max/min, amax/amin, max.dim/min.dim, argmax/argmin,
sort and topk, treating NaN as larger than every number (+inf included): a slice
holding a NaN reduces to NaN, argmax *and* argmin return the first NaN's index,
ascending sorts put NaNs last and descending ones first. ONNX leaves NaN unspecified
and ONNX Runtime's ReduceMax/ArgMax skip it (and its TopK changed in 1.32), so the
floating impls spell torch's semantics out with as few extra nodes as exactness
allows; integer and bool inputs take the plain ops.

- amax/amin/max/min: ``ReduceMax(x) - ReduceSum(Where(IsNaN(x), x, 0))``: the second
  term is 0 (so the result is exact, -0.0 included) unless the slice holds a NaN.
- argmax/argmin, max.dim/min.dim, sort, topk on float16/bfloat16/float32: the same op on
  a wider key (float32 for the half types, float64 for float32) where NaN is +inf
  (-inf for argmin/min.dim) and +/-inf is the largest finite number (Clip), so NaN
  wins every comparison and ties keep TopK/ArgMax's lower-index-first order; values
  are then gathered from the input with the indices.
- float64 has no wider type: argmax/argmin and max.dim/min.dim pick the first NaN
  (ArgMax of the IsNaN mask) where the slice has one; sort/topk sort stably twice,
  by value with NaN as +inf, then by the NaN flag (so +inf stays before NaN).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import FLOAT_TYPES, HALF_TYPES, Tensor, is_integral, rank_of

_INT64_MAX = int(np.iinfo(np.int64).max)


def _dims(dim, rank: int | None) -> list[int] | None:
    """torch's ``dim`` (int, list, empty or None) as ONNX axes; None means every dim."""
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return None
    if rank == 0:
        return []  # dim 0 / -1 of a 0-d tensor: nothing to reduce
    return dims


def _reduce(reduce, x, dim, keepdim: bool):
    """``reduce`` (ReduceSum, ReduceMax, ...) over ``dim`` (None: all dims); a 0-d input is returned as is."""
    axes = _dims(dim, rank_of(x))
    if axes == [] or rank_of(x) == 0:
        return op18.Identity(x)
    if axes is None:
        return reduce(x, keepdims=int(keepdim))
    return reduce(x, axes, keepdims=int(keepdim))


def _accumulating(reduce, self, dim, keepdim: bool, dtype: int | None):
    """sum/prod (``reduce``: ReduceSum, ReduceProd): integers and bools accumulate in INT64, half floats in FLOAT."""
    if dtype is not None:
        self = op18.Cast(self, to=dtype)
        out_type = ir.DataType(dtype)
    elif is_integral(self.dtype):
        self = op18.Cast(self, to=ir.DataType.INT64)
        out_type = ir.DataType.INT64
    else:
        out_type = self.dtype
    if out_type in HALF_TYPES:
        return op18.Cast(_reduce(reduce, op18.Cast(self, to=ir.DataType.FLOAT), dim, keepdim), to=out_type)
    if out_type == ir.DataType.BOOL:
        # no BOOL ReduceSum/ReduceProd: 0/1 in INT64 (exact), nonzero -> True
        return op18.Cast(_reduce(reduce, op18.Cast(self, to=ir.DataType.INT64), dim, keepdim), to=out_type)
    return _reduce(reduce, self, dim, keepdim)


@opreg.impl("aten::sum.default")
def aten_sum(self: Tensor, dtype: int | None = None):
    """sum(Tensor self, *, ScalarType? dtype=None) -> Tensor: ReduceSum over all dims (ints as INT64)."""
    return _accumulating(op18.ReduceSum, self, None, False, dtype)


@opreg.impl("aten::sum.dim_IntList")
def aten_sum_dim(self: Tensor, dim: Sequence[int] | None, keepdim: bool = False, dtype: int | None = None):
    """sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor: ReduceSum (ints as INT64)."""
    return _accumulating(op18.ReduceSum, self, dim, keepdim, dtype)


@opreg.impl("aten::prod.default")
def aten_prod(self: Tensor, dtype: int | None = None):
    """prod(Tensor self, *, ScalarType? dtype=None) -> Tensor: ReduceProd over all dims (ints as INT64)."""
    return _accumulating(op18.ReduceProd, self, None, False, dtype)


@opreg.impl("aten::prod.dim_int")
def aten_prod_dim(self: Tensor, dim: int, keepdim: bool = False, dtype: int | None = None):
    """prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor: ReduceProd (ints as INT64)."""
    return _accumulating(op18.ReduceProd, self, [dim], keepdim, dtype)


def _mean(self, dim, keepdim: bool, dtype: int | None):
    if dtype is not None:
        self = op18.Cast(self, to=dtype)
    if is_integral(self.dtype):
        raise ValueError(f"mean of {self.dtype} is an error in torch: pass dtype= a floating type")
    if self.dtype in HALF_TYPES:
        out_type = self.dtype
        return op18.Cast(_reduce(op18.ReduceMean, op18.Cast(self, to=ir.DataType.FLOAT), dim, keepdim), to=out_type)
    return _reduce(op18.ReduceMean, self, dim, keepdim)


@opreg.impl("aten::mean.default")
def aten_mean(self: Tensor, dtype: int | None = None):
    """mean(Tensor self, *, ScalarType? dtype=None) -> Tensor: ReduceMean over all dims."""
    return _mean(self, None, False, dtype)


@opreg.impl("aten::mean.dim")
def aten_mean_dim(self: Tensor, dim: Sequence[int] | None, keepdim: bool = False, dtype: int | None = None):
    """mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor: ReduceMean."""
    return _mean(self, dim, keepdim, dtype)


def _extremum(reduce, self, dim, keepdim: bool):
    """``reduce``, ReduceMax or ReduceMin; bools go through UINT8 (ReduceMax takes BOOL only from opset 20);
    floats propagate NaN (see the module docstring)."""
    if self.dtype == ir.DataType.BOOL:
        reduced = _reduce(reduce, op18.Cast(self, to=ir.DataType.UINT8), dim, keepdim)
        return op18.Cast(reduced, to=ir.DataType.BOOL)
    reduced = _reduce(reduce, self, dim, keepdim)
    if self.dtype not in FLOAT_TYPES or rank_of(self) == 0 or _dims(dim, rank_of(self)) == []:
        return reduced  # integers have no NaN; a 0-d input is returned as is
    nans = op18.Where(op18.IsNaN(self), self, op18.CastLike(0.0, self))
    return op18.Sub(reduced, _reduce(op18.ReduceSum, nans, dim, keepdim))  # x - 0 is exact, -0.0 included


def _nan_key(self, nan_largest: bool):
    """float16/bfloat16/float32 ``self`` in a wider type, ordered like torch orders it: NaN is
    +inf (or -inf when not ``nan_largest``), +/-inf the wider type's largest finite number."""
    wider = ir.DataType.FLOAT if self.dtype in HALF_TYPES else ir.DataType.DOUBLE
    key = op18.Cast(self, to=wider)
    # numpy scalars of the wider type: a Python float would become a FLOAT constant first
    # (CastLike(DBL_MAX, key) folds to inf)
    big = np.finfo(wider.numpy()).max
    clipped = op18.Clip(key, None, big) if nan_largest else op18.Clip(key, -big, None)
    nan = np.array(np.inf if nan_largest else -np.inf, dtype=wider.numpy())
    return op18.Where(op18.IsNaN(key), nan, clipped)


def _first_nan_or(indices, self, axis: int):
    """float64: the index of the first NaN along ``axis`` where there is one, else ``indices``
    (both with the axis kept)."""
    nan = op18.IsNaN(self)
    first = op18.ArgMax(op18.Cast(nan, to=ir.DataType.UINT8), axis=axis, keepdims=1)
    return op18.Where(op18.GatherElements(nan, first, axis=axis), first, indices)


def _nan_arg(arg, self, axis: int, keepdim: bool):
    """``arg`` (ArgMax or ArgMin) of floating ``self`` along ``axis`` with NaN winning, first occurrence."""
    if self.dtype == ir.DataType.DOUBLE:
        found = _first_nan_or(arg(self, axis=axis, keepdims=1), self, axis)
        return found if keepdim else op18.Squeeze(found, [axis])
    return arg(_nan_key(self, nan_largest=arg == op18.ArgMax), axis=axis, keepdims=int(keepdim))


@opreg.impl("aten::amax")
def aten_amax(self: Tensor, dim: Sequence[int] = (), keepdim: bool = False):
    """amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor: ReduceMax (every dim when dim=[])."""
    return _extremum(op18.ReduceMax, self, dim, keepdim)


@opreg.impl("aten::amin")
def aten_amin(self: Tensor, dim: Sequence[int] = (), keepdim: bool = False):
    """amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor: ReduceMin (every dim when dim=[])."""
    return _extremum(op18.ReduceMin, self, dim, keepdim)


@opreg.impl("aten::max.default")
def aten_max(self: Tensor):
    """max(Tensor self) -> Tensor: ReduceMax over all dims."""
    return _extremum(op18.ReduceMax, self, None, False)


@opreg.impl("aten::min.default")
def aten_min(self: Tensor):
    """min(Tensor self) -> Tensor: ReduceMin over all dims."""
    return _extremum(op18.ReduceMin, self, None, False)


def _arg(arg, self, dim: int | None, keepdim: bool):
    """``arg`` (ArgMax or ArgMin) along ``dim`` (None: of the flattened input)."""
    rank = rank_of(self)
    if self.dtype == ir.DataType.BOOL:
        self = op18.Cast(self, to=ir.DataType.UINT8)
    if rank == 0:
        return op18.Constant(value_int=0)
    if self.dtype in FLOAT_TYPES:
        if dim is None:
            flat = _nan_arg(arg, op18.Reshape(self, [-1]), 0, False)
            return op18.Reshape(flat, [1] * rank) if keepdim else flat
        return _nan_arg(arg, self, dim, keepdim)
    if dim is None:
        flat = arg(op18.Reshape(self, [-1]), axis=0, keepdims=0)
        return op18.Reshape(flat, [1] * rank) if keepdim else flat
    return arg(self, axis=dim, keepdims=int(keepdim))


def _max_min_dim(reduce, arg, self, dim: int, keepdim: bool):
    """max.dim/min.dim: ``reduce`` (ReduceMax or ReduceMin) and ``arg`` (ArgMax or ArgMin)."""
    if rank_of(self) == 0:
        return op18.Identity(self), op18.Constant(value_int=0)
    if self.dtype not in FLOAT_TYPES:
        return _extremum(reduce, self, [dim], keepdim), _arg(arg, self, dim, keepdim)
    indices = _nan_arg(arg, self, dim, True)  # NaN first; values gathered with the indices: exact
    values = op18.GatherElements(self, indices, axis=dim)
    if keepdim:
        return values, indices
    return op18.Squeeze(values, [dim]), op18.Squeeze(indices, [dim])


@opreg.impl("aten::max.dim")
def aten_max_dim(self: Tensor, dim: int, keepdim: bool = False):
    """max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices): ReduceMax and ArgMax."""
    return _max_min_dim(op18.ReduceMax, op18.ArgMax, self, dim, keepdim)


@opreg.impl("aten::min.dim")
def aten_min_dim(self: Tensor, dim: int, keepdim: bool = False):
    """min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices): ReduceMin and ArgMin."""
    return _max_min_dim(op18.ReduceMin, op18.ArgMin, self, dim, keepdim)


@opreg.impl("aten::argmax")
def aten_argmax(self: Tensor, dim: int | None = None, keepdim: bool = False):
    """argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor: ArgMax (of the flattened input when dim=None)."""
    return _arg(op18.ArgMax, self, dim, keepdim)


@opreg.impl("aten::argmin")
def aten_argmin(self: Tensor, dim: int | None = None, keepdim: bool = False):
    """argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor: ArgMin (of the flattened input when dim=None)."""
    return _arg(op18.ArgMin, self, dim, keepdim)


def _any_all(reduce, self, dim, keepdim: bool):
    """any/all: Cast to BOOL (nonzero), then ``reduce`` (ReduceMax or ReduceMin) through UINT8."""
    flags = self if self.dtype == ir.DataType.BOOL else op18.Cast(self, to=ir.DataType.BOOL)
    return _extremum(reduce, flags, dim, keepdim)


@opreg.impl("aten::any.default")
@opreg.impl("aten::any.dim")
@opreg.impl("aten::any.dims")
def aten_any(self: Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False):
    """any(Tensor self) -> Tensor: Cast to BOOL and ReduceMax over all dims.

    any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor: Cast to BOOL and ReduceMax.

    any.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor: the same over several dims (all when None)."""
    return _any_all(op18.ReduceMax, self, dim, keepdim)


@opreg.impl("aten::all.default")
@opreg.impl("aten::all.dim")
@opreg.impl("aten::all.dims")
def aten_all(self: Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False):
    """all(Tensor self) -> Tensor: Cast to BOOL and ReduceMin over all dims.

    all.dim(Tensor self, int dim, bool keepdim=False) -> Tensor: Cast to BOOL and ReduceMin.

    all.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor: the same over several dims (all when None)."""
    return _any_all(op18.ReduceMin, self, dim, keepdim)


@opreg.impl("aten::_is_all_true")
def aten_is_all_true(self: Tensor):
    """_is_all_true(Tensor self) -> Tensor: all() of a bool tensor (``torch._check(t.all())`` leaves it): ReduceMin over all dims."""
    return aten_all(self)


@opreg.impl("aten::_is_any_true")
def aten_is_any_true(self: Tensor):
    """_is_any_true(Tensor self) -> Tensor: any() of a bool tensor: ReduceMax over all dims."""
    return aten_any(self)


def _variance(self, dim, correction, keepdim: bool):
    """Sum of squared deviations from the mean over ``dim``, divided by max(0, n - correction)."""
    correction = 1.0 if correction is None else float(correction)
    rank = rank_of(self)
    out_type = self.dtype
    if out_type in HALF_TYPES:
        self = op18.Cast(self, to=ir.DataType.FLOAT)
    axes = _dims(dim, rank)
    axes_all = [] if rank == 0 or axes == [] else list(range(rank)) if axes is None else [a % rank for a in axes]
    if axes_all:
        mean = op18.ReduceMean(self, axes_all, keepdims=1)
        deviation = op18.Sub(self, mean)
        total = op18.ReduceSum(op18.Mul(deviation, deviation), axes_all, keepdims=int(keepdim))
    else:
        total = op18.Sub(self, self)
    count = _count(self, axes_all)
    if isinstance(count, int):
        divisor = op18.CastLike(max(0.0, count - correction), self)
    else:
        divisor = op18.Max(op18.Sub(count, op18.CastLike(correction, self)), op18.CastLike(0.0, self))
    result = op18.Div(total, divisor)
    return result, out_type


def _count(self, axes: list[int]):
    """How many elements of ``self`` each slice over ``axes`` holds: an int when static, else a value typed like ``self``."""
    sizes = [self.shape[a] for a in axes]
    if all(isinstance(s, int) for s in sizes):
        return math.prod(sizes)
    count = op18.ReduceProd(op18.Gather(op18.Shape(self), axes), keepdims=0)
    return op18.CastLike(count, self)


@opreg.impl("aten::var.correction")
def aten_var_correction(
    self: Tensor, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
):
    """var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor: ReduceMean, Sub, Mul, ReduceSum, Div."""
    result, out_type = _variance(self, dim, correction, keepdim)
    return result if result.dtype == out_type else op18.Cast(result, to=out_type)


@opreg.impl("aten::var.dim")
def aten_var_dim(self: Tensor, dim: Sequence[int] | None, unbiased: bool = True, keepdim: bool = False):
    """var.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor: ReduceMean, Sub, Mul, ReduceSum, Div."""
    result, out_type = _variance(self, dim, 1 if unbiased else 0, keepdim)
    return result if result.dtype == out_type else op18.Cast(result, to=out_type)


@opreg.impl("aten::std.correction")
def aten_std_correction(
    self: Tensor, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
):
    """std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor: Sqrt of the variance."""
    result, out_type = _variance(self, dim, correction, keepdim)
    result = op18.Sqrt(result)
    return result if result.dtype == out_type else op18.Cast(result, to=out_type)


@opreg.impl("aten::std.dim")
def aten_std_dim(self: Tensor, dim: Sequence[int] | None, unbiased: bool = True, keepdim: bool = False):
    """std.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor: Sqrt of the variance."""
    result, out_type = _variance(self, dim, 1 if unbiased else 0, keepdim)
    result = op18.Sqrt(result)
    return result if result.dtype == out_type else op18.Cast(result, to=out_type)


@opreg.impl("aten::diff")
def aten_diff(self: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None, append: Tensor | None = None):
    """diff(Tensor self, int n=1, int dim=-1, Tensor? prepend=None, Tensor? append=None) -> Tensor: n times Sub of two
    Slices along dim, one element apart (Xor for bool), after Concat of prepend and append."""
    parts = [p for p in (prepend, self, append) if p is not None]
    if len(parts) > 1:
        self = op18.Concat(*parts, axis=dim)
    for _ in range(n):
        later = op18.Slice(self, [1], [_INT64_MAX], [dim])
        earlier = op18.Slice(self, [0], [-1], [dim])
        self = op18.Xor(later, earlier) if self.dtype == ir.DataType.BOOL else op18.Sub(later, earlier)
    return op18.Identity(self) if n == 0 and len(parts) == 1 else self


def _whole(self, axis: int):
    """TopK's k for the whole of ``axis``: a constant when the size is static."""
    size = self.shape[axis]
    return [size] if isinstance(size, int) else op18.Shape(self, start=axis, end=axis + 1)


def _nan_top_k(self, k, axis: int, largest: bool):
    """TopK of floating ``self`` with NaN the largest value, ties in index order (stable)."""
    if self.dtype != ir.DataType.DOUBLE:
        _keys, indices = op18.TopK(_nan_key(self, nan_largest=True), k, axis=axis, largest=int(largest), sorted=1)
        return op18.GatherElements(self, indices, axis=axis), indices
    # float64: stably by value with NaN as +inf, then stably by the NaN flag (+inf before NaN).
    nan = op18.IsNaN(self)
    by_value = op18.Where(nan, op18.CastLike(float("inf"), self), self)
    _values, order = op18.TopK(by_value, _whole(self, axis), axis=axis, largest=int(largest), sorted=1)
    flags = op18.GatherElements(op18.Cast(nan, to=ir.DataType.INT32), order, axis=axis)
    _flags, by_flag = op18.TopK(flags, k, axis=axis, largest=int(largest), sorted=1)
    indices = op18.GatherElements(order, by_flag, axis=axis)
    return op18.GatherElements(self, indices, axis=axis), indices


def _sorted(self, dim: int, descending: bool):
    if rank_of(self) == 0:
        return op18.Identity(self), op18.Constant(value_int=0)
    rank = rank_of(self)
    axis = dim % rank
    k = _whole(self, axis)
    if self.dtype == ir.DataType.BOOL:
        # no BOOL TopK: sort 0/1 as INT32 (ties keep TopK's index order) and cast the values back
        values, indices = op18.TopK(
            op18.Cast(self, to=ir.DataType.INT32), k, axis=axis, largest=int(descending), sorted=1
        )
        return op18.Cast(values, to=ir.DataType.BOOL), indices
    if self.dtype in FLOAT_TYPES:
        return _nan_top_k(self, k, axis, descending)
    values, indices = op18.TopK(self, k, axis=axis, largest=int(descending), sorted=1)
    return values, indices


@opreg.impl("aten::sort.default")
def aten_sort(self: Tensor, dim: int = -1, descending: bool = False):
    """sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices): TopK of the whole dim (stable)."""
    return _sorted(self, dim, descending)


@opreg.impl("aten::sort.stable")
def aten_sort_stable(self: Tensor, stable: bool | None = None, dim: int = -1, descending: bool = False):
    """sort.stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices): TopK of the whole dim (stable: ties keep their order)."""
    return _sorted(self, dim, descending)


@opreg.impl("aten::topk")
def aten_topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, Tensor indices): TopK (always sorted)."""
    k = op18.Reshape(k, [1]) if isinstance(k, ir.Value) else [k]
    if rank_of(self) == 0:
        return op18.Identity(self), op18.Constant(value_int=0)
    if self.dtype in FLOAT_TYPES:
        return _nan_top_k(self, k, dim % rank_of(self), largest)
    values, indices = op18.TopK(self, k, axis=dim, largest=int(largest), sorted=1)
    return values, indices


@opreg.impl("aten::logsumexp")
def aten_logsumexp(self: Tensor, dim: Sequence[int], keepdim: bool = False):
    """logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor: ReduceMax, Exp, ReduceSum, Log (max-shifted)."""
    if is_integral(self.dtype):
        self = op18.Cast(self, to=ir.DataType.FLOAT)
    out_type = self.dtype
    if out_type in HALF_TYPES:
        self = op18.Cast(self, to=ir.DataType.FLOAT)
    axes = _dims(dim, rank_of(self))
    if rank_of(self) == 0 or axes == []:
        result = op18.Identity(self)
    else:
        peak = _reduce(op18.ReduceMax, self, axes, True)
        peak = op18.Where(op18.IsInf(peak), op18.CastLike(0.0, peak), peak)
        total = _reduce(op18.ReduceSum, op18.Exp(op18.Sub(self, peak)), axes, keepdim)
        if not keepdim:
            peak = _reduce(op18.ReduceMax, peak, axes, False)
        result = op18.Add(op18.Log(total), peak)
    return result if out_type == result.dtype else op18.Cast(result, to=out_type)


@opreg.impl("aten::var_mean.correction")
def aten_var_mean_correction(
    self: Tensor, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
):
    """var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor): the variance, and ReduceSum / count (NaN for an empty slice, as torch)."""
    variance = aten_var_correction(self, dim, correction, keepdim)
    out_type = self.dtype
    x = op18.Cast(self, to=ir.DataType.FLOAT) if out_type in HALF_TYPES else self
    rank = rank_of(x)
    axes = _dims(dim, rank)
    if rank == 0 or axes == []:
        return variance, op18.Identity(self)
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    count = _count(x, axes)
    mean = op18.Div(op18.ReduceSum(x, axes, keepdims=int(keepdim)), op18.CastLike(count, x))
    return variance, mean if out_type == mean.dtype else op18.Cast(mean, to=out_type)


def _vector_norm(x, ord: float, dim, keepdim: bool):
    """``ord``-norm of float ``x`` over ``dim`` (None: all dims), as torch.linalg.vector_norm."""
    if rank_of(x) == 0 or _dims(dim, rank_of(x)) == []:
        return op18.Cast(op18.Not(op18.Equal(x, op18.CastLike(0, x))), to=x.dtype) if ord == 0 else op18.Abs(x)
    if ord == 2:
        return _reduce(op18.ReduceL2, x, dim, keepdim)
    if ord == 1:
        return _reduce(op18.ReduceL1, x, dim, keepdim)
    if ord in (math.inf, -math.inf):
        return _extremum(op18.ReduceMax if ord > 0 else op18.ReduceMin, op18.Abs(x), dim, keepdim)
    if ord == 0:
        nonzero = op18.Cast(op18.Not(op18.Equal(x, op18.CastLike(0, x))), to=x.dtype)
        return _reduce(op18.ReduceSum, nonzero, dim, keepdim)
    powered = op18.Pow(op18.Abs(x), op18.CastLike(ord, x))
    return op18.Pow(_reduce(op18.ReduceSum, powered, dim, keepdim), op18.CastLike(1.0 / ord, x))


@opreg.impl("aten::linalg_vector_norm")
def aten_linalg_vector_norm(
    self: Tensor, ord: float = 2, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: int | None = None
):
    """linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor: ReduceL2, ReduceL1, ReduceMax/ReduceMin of Abs, or Pow-ReduceSum-Pow (half floats in float32)."""
    if dtype is not None:
        self = op18.Cast(self, to=dtype)
    out_type = self.dtype
    if out_type in HALF_TYPES:
        self = op18.Cast(self, to=ir.DataType.FLOAT)
    result = _vector_norm(self, float(ord), dim, keepdim)
    return result if result.dtype == out_type else op18.Cast(result, to=out_type)


@opreg.impl("aten::dist")
def aten_dist(self: Tensor, other: Tensor, p: float = 2):
    """dist(Tensor self, Tensor other, Scalar p=2) -> Tensor: the p-norm of self - other (broadcast) over every element."""
    difference = op18.Sub(self, other)
    return aten_linalg_vector_norm(difference, p)


@opreg.impl("aten::argsort.default")
def aten_argsort(self: Tensor, dim: int = -1, descending: bool = False):
    """argsort(Tensor self, int dim=-1, bool descending=False) -> Tensor: the indices of a TopK of the whole dim (stable)."""
    return _sorted(self, dim, descending)[1]


@opreg.impl("aten::argsort.stable")
def aten_argsort_stable(self: Tensor, stable: bool = False, dim: int = -1, descending: bool = False):
    """argsort.stable(Tensor self, *, bool stable, int dim=-1, bool descending=False) -> Tensor: the indices of a TopK of the whole dim (stable: TopK puts the lower index first among equal values, in either direction)."""
    return _sorted(self, dim, descending)[1]
