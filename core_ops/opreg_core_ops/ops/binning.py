"""Binning and counting: bucketize, searchsorted, histc, bincount.

ONNX has no binary search; over a sorted sequence, the insertion point of ``v`` is the number of
elements it must pass, so each value is compared with the whole sequence (the comparisons
broadcast: values x sequence) and the passes counted: ``not (v <= s)`` for the left side,
``not (v < s)`` for the right. Written so, a NaN value passes every element and lands at the end,
as in torch. histc and bincount count one-hot matches against the bins (values x bins).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import FLOAT_TYPES, Tensor, promote, rank_of

_INT64 = ir.DataType.INT64


def _insertion(sequence, values, right: bool, out_int32: bool, sorter=None):
    """Insertion points of ``values`` in ``sequence``'s last dim (1-D: for every value; N-D: row by row)."""
    if sorter is not None:
        sequence = op18.GatherElements(sequence, sorter, axis=-1)
    _, (sequence, values) = promote(sequence, values)
    if rank_of(sequence) == 1:
        expanded_values, expanded_sequence = op18.Unsqueeze(values, [-1]), sequence
    else:  # (..., M) and (..., K): compare (..., K, 1) with (..., 1, M)
        expanded_values, expanded_sequence = op18.Unsqueeze(values, [-1]), op18.Unsqueeze(sequence, [-2])
    stays = op18.Less if right else op18.LessOrEqual
    passed = op18.Not(stays(expanded_values, expanded_sequence))
    counts = op18.ReduceSum(op18.Cast(passed, to=_INT64), [-1], keepdims=0)
    return op18.Cast(counts, to=ir.DataType.INT32) if out_int32 else counts


def _side(right: bool, side: str | None) -> bool:
    return side == "right" if side is not None else right


@opreg.impl("aten::bucketize.Tensor")
def aten_bucketize(self: Tensor, boundaries: Tensor, out_int32: bool = False, right: bool = False):
    """bucketize.Tensor(Tensor self, Tensor boundaries, *, bool out_int32=False, bool right=False) -> Tensor: boundaries each value passes (compare with all, ReduceSum)."""
    return _insertion(boundaries, self, right, out_int32)


@opreg.impl("aten::bucketize.Scalar")
def aten_bucketize_scalar(self: float, boundaries: Tensor, out_int32: bool = False, right: bool = False):
    """bucketize.Scalar(Scalar self, Tensor boundaries, *, bool out_int32=False, bool right=False) -> Tensor: as bucketize.Tensor, of a 0-d value."""
    return _insertion(boundaries, op18.CastLike(self, boundaries), right, out_int32)


@opreg.impl("aten::searchsorted.Tensor")
def aten_searchsorted(
    sorted_sequence: Tensor,
    self: Tensor,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Tensor | None = None,
):
    """searchsorted.Tensor(Tensor sorted_sequence, Tensor self, *, bool out_int32=False, bool right=False, str? side=None, Tensor? sorter=None) -> Tensor: elements each value passes (compare with the whole row, ReduceSum)."""
    return _insertion(sorted_sequence, self, _side(right, side), out_int32, sorter)


@opreg.impl("aten::searchsorted.Scalar")
def aten_searchsorted_scalar(
    sorted_sequence: Tensor,
    self: float,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Tensor | None = None,
):
    """searchsorted.Scalar(Tensor sorted_sequence, Scalar self, *, bool out_int32=False, bool right=False, str? side=None, Tensor? sorter=None) -> Tensor: as searchsorted.Tensor, of a 0-d value."""
    value = op18.CastLike(self, sorted_sequence)
    if rank_of(sorted_sequence) != 1:
        value = op18.Expand(value, op18.Shape(sorted_sequence, end=-1))
        value = op18.Unsqueeze(value, [-1])
    return _insertion(sorted_sequence, value, _side(right, side), out_int32, sorter)


@opreg.impl("aten::histc")
def aten_histc(self: Tensor, bins: int = 100, min: float = 0, max: float = 0):
    """histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor: each value's bin (Floor), one-hot counts (ReduceSum); min = max = 0: the data's range."""
    x = op18.Reshape(self, [-1])
    if min == max:  # torch: the data's range, widened by 1 each way when it is a single value
        low, high = op18.ReduceMin(x, keepdims=0), op18.ReduceMax(x, keepdims=0)
        if min != 0:
            low, high = op18.CastLike(min, x), op18.CastLike(max, x)
        same = op18.Equal(low, high)
        one = op18.CastLike(1, x)
        low, high = op18.Where(same, op18.Sub(low, one), low), op18.Where(same, op18.Add(high, one), high)
    else:
        low, high = op18.CastLike(min, x), op18.CastLike(max, x)
    position = op18.Floor(op18.Div(op18.Mul(op18.Sub(x, low), op18.CastLike(bins, x)), op18.Sub(high, low)))
    position = op18.Cast(op18.Min(position, op18.CastLike(bins - 1, x)), to=_INT64)  # max falls in the last bin
    inside = op18.And(op18.GreaterOrEqual(x, low), op18.LessOrEqual(x, high))
    hits = op18.And(op18.Equal(op18.Unsqueeze(position, [1]), op18.Range(0, bins, 1)), op18.Unsqueeze(inside, [1]))
    return op18.ReduceSum(op18.CastLike(hits, x), [0], keepdims=0)


@opreg.impl("aten::bincount")
def aten_bincount(self: Tensor, weights: Tensor | None = None, minlength: int = 0):
    """bincount(Tensor self, Tensor? weights=None, SymInt minlength=0) -> Tensor: one-hot matches against Range(max(max + 1, minlength)), summed (weighted)."""
    values = op18.Cast(op18.Reshape(self, [-1]), to=_INT64)
    padded = op18.Concat(values, [-1], axis=0)  # an empty input has no max: -1 makes it 0 bins
    length = op18.Max(op18.Add(op18.ReduceMax(padded, keepdims=0), 1), op18.Cast(minlength, to=_INT64))
    hits = op18.Equal(op18.Unsqueeze(values, [1]), op18.Unsqueeze(op18.Range(0, length, 1), [0]))
    if weights is None:
        return op18.ReduceSum(op18.Cast(hits, to=_INT64), [0], keepdims=0)
    if weights.dtype not in FLOAT_TYPES:
        weights = op18.Cast(weights, to=ir.DataType.DOUBLE)  # torch counts integer weights in float64
    weighted = op18.Where(hits, op18.Unsqueeze(op18.Reshape(weights, [-1]), [1]), op18.CastLike(0, weights))
    return op18.ReduceSum(weighted, [0], keepdims=0)
