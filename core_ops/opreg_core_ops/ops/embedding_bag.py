"""embedding_bag: sums, means or maxima of embedding rows over bags of indices.

Indices are 1-D (``F.embedding_bag`` flattens 2-D input into equal bags before calling the op);
bag ``b`` holds positions ``offsets[b] <= p < offsets[b + 1]`` (the last bag runs to the end, or to
``offsets[-1]`` with ``include_last_offset``). Each position's bag is the number of bag starts at or
before it, minus one; a one-hot (bags x positions) matrix, with positions whose index is
``padding_idx`` left out, then sums by MatMul, counts for the mean, and masks the rows for the max.
An empty bag gives zeros, as in torch; a mean with ``include_last_offset`` divides the last bag by
the positions to the end of indices, as torch's kernel does (its sum stops at ``offsets[-1]``). Only the first output (the bags) is exported: the others
(offset2bag, bag_size, max_indices) serve torch's backward pass, and a graph that reads them is
refused by the predicate.
"""

from __future__ import annotations

import math
import operator

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor

_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(weight, indices, offsets, mode: int, per_sample_weights, include_last_offset: bool, padding_idx: int):
    indices = op18.Reshape(indices, [-1])
    offsets = op18.Cast(op18.Reshape(offsets, [-1]), to=ir.DataType.INT64)
    positions = op18.Range(0, op18.Squeeze(op18.Shape(indices), [0]), 1)
    starts = op18.Slice(offsets, [0], [-1], [0]) if include_last_offset else offsets
    bag_of = op18.Sub(  # (positions,): the bag each position falls in
        op18.ReduceSum(
            op18.Cast(
                op18.GreaterOrEqual(op18.Unsqueeze(positions, [1]), op18.Unsqueeze(starts, [0])), to=ir.DataType.INT64
            ),
            [1],
            keepdims=0,
        ),
        1,
    )
    bag_ids = op18.Range(0, op18.Squeeze(op18.Shape(starts), [0]), 1)
    member = op18.Equal(op18.Unsqueeze(bag_ids, [1]), op18.Unsqueeze(bag_of, [0]))  # (bags, positions)
    if padding_idx >= 0:
        kept = op18.Not(op18.Equal(indices, op18.CastLike(padding_idx, indices)))
        member = op18.And(member, op18.Unsqueeze(kept, [0]))
    counted = member  # torch's bag sizes count the last bag to the end of indices, even with include_last_offset
    if include_last_offset:
        member = op18.And(member, op18.Unsqueeze(op18.Less(positions, op18.Gather(offsets, -1)), [0]))
    rows = op18.Gather(weight, indices, axis=0)  # (positions, dim)
    if per_sample_weights is not None:
        rows = op18.Mul(rows, op18.Unsqueeze(op18.CastLike(per_sample_weights, rows), [1]))
    if mode == _MAX:
        masked = op18.Where(op18.Unsqueeze(member, [2]), op18.Unsqueeze(rows, [0]), op18.CastLike(-math.inf, rows))
        peak = op18.ReduceMax(masked, [1], keepdims=0)
        filled = op18.ReduceMax(op18.Cast(member, to=ir.DataType.UINT8), [1], keepdims=1)
        return op18.Where(op18.Cast(filled, to=ir.DataType.BOOL), peak, op18.CastLike(0, peak))
    total = op18.MatMul(op18.CastLike(member, rows), rows)
    if mode == _SUM:
        return total
    count = op18.ReduceSum(op18.CastLike(counted, rows), [1], keepdims=1)
    return op18.Div(total, op18.Max(count, op18.CastLike(1, count)))


def _only_the_bags(node) -> bool:
    """Only output 0 is read (the others serve torch's backward pass)."""
    return all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)


def _outputs(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    bags = _bags(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)
    empty = op18.Constant(value_ints=[0])
    return bags, empty, empty, empty


@opreg.impl("aten::_embedding_bag_forward_only", predicate=_only_the_bags)
@opreg.impl("aten::_embedding_bag", predicate=_only_the_bags)
@opreg.impl("aten::embedding_bag", predicate=_only_the_bags)
def aten_embedding_bag(
    weight: Tensor,
    indices: Tensor,
    offsets: Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
):
    """_embedding_bag_forward_only(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False, int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1) -> (Tensor, Tensor, Tensor, Tensor): Gather, then MatMul by bag membership (sum, mean) or a masked ReduceMax.

    _embedding_bag(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False, int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1) -> (Tensor, Tensor, Tensor, Tensor): as _embedding_bag_forward_only.

    embedding_bag(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False, int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False) -> (Tensor, Tensor, Tensor, Tensor): as _embedding_bag_forward_only, no padding index (its schema has none: -1)."""
    return _outputs(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)


@opreg.impl("aten::embedding_bag.padding_idx", predicate=_only_the_bags)
def aten_embedding_bag_padding_idx(
    weight: Tensor,
    indices: Tensor,
    offsets: Tensor,
    scale_grad_by_freq: bool,
    mode: int,
    sparse: bool,
    per_sample_weights: Tensor | None,
    include_last_offset: bool,
    padding_idx: int | None,
):
    """embedding_bag.padding_idx(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq, int mode, bool sparse, Tensor? per_sample_weights, bool include_last_offset, int? padding_idx) -> (Tensor, Tensor, Tensor, Tensor): as _embedding_bag_forward_only."""
    padding = -1 if padding_idx is None else padding_idx
    if padding < -1 or (padding == -1 and padding_idx is not None):  # a negative index counts from the end
        padding += weight.shape[0]
    return _outputs(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding)
