"""Distinct values: unique (ONNX's Unique, sorted) and unique_consecutive (runs of equal neighbours).

torch sorts unique's values on CPU whatever ``sorted`` says, and returns empty int64 tensors for the
inverse indices and counts it was not asked for; so do these impls. ONNX Runtime's Unique takes
float, double, int8 and int64; other types go through int64 or float32 (exactly).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, rank_of

_INT64 = ir.DataType.INT64
_UNIQUE_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.INT8, ir.DataType.INT64})


def _empty():
    return op18.Constant(value=ir.tensor([], dtype=_INT64))


@opreg.impl("aten::_unique2")
def aten_unique2(self: Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False):
    """_unique2(Tensor self, bool sorted=True, bool return_inverse=False, bool return_counts=False) -> (Tensor, Tensor, Tensor): Unique (sorted) of the flattened input."""
    flat = op18.Reshape(self, [-1])
    out_type = self.dtype
    if out_type not in _UNIQUE_TYPES:
        flat = op18.Cast(flat, to=ir.DataType.FLOAT if out_type.is_floating_point() else _INT64)
    values, _first, inverse, counts = op18.Unique(flat, sorted=1)
    if values.dtype != out_type:
        values = op18.Cast(values, to=out_type)
    inverse = op18.Reshape(inverse, op18.Shape(self)) if return_inverse else _empty()
    return values, inverse, counts if return_counts else _empty()


@opreg.impl("aten::unique_consecutive")
def aten_unique_consecutive(
    self: Tensor, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None
):
    """unique_consecutive(Tensor self, bool return_inverse=False, bool return_counts=False, int? dim=None) -> (Tensor, Tensor, Tensor): Compress where a run starts (Not Equal to the previous: each NaN its own run, as in torch), CumSum for the inverse, differences of the starts for the counts."""
    rank = rank_of(self)
    if dim is None or rank in (0, 1):  # along the only dim: the same as flattened
        rows, axis = op18.Reshape(self, [-1, 1]), None
    else:
        axis = dim % rank
        moved = op18.Transpose(self, perm=[axis, *(d for d in range(rank) if d != axis)])
        rows = op18.Reshape(moved, op18.Concat(op18.Shape(moved, end=1), [-1], axis=0))
    length = op18.Shape(rows, end=1)
    differs = op18.Not(op18.Equal(op18.Slice(rows, [1], [2**62], [0]), op18.Slice(rows, [0], [-1], [0])))
    changed = op18.ReduceMax(op18.Cast(differs, to=ir.DataType.UINT8), [1], keepdims=0)
    first = op18.Slice(op18.Constant(value_ints=[1]), [0], op18.Min(length, [1]), [0])  # [] for an empty input
    starts = op18.Cast(op18.Concat(op18.Cast(first, to=ir.DataType.UINT8), changed, axis=0), to=ir.DataType.BOOL)
    if axis is None:
        values = op18.Compress(op18.Reshape(self, [-1]), starts, axis=0)
    else:
        values = op18.Compress(self, starts, axis=axis)
    inverse = _empty()
    if return_inverse:
        inverse = op18.Sub(op18.CumSum(op18.Cast(starts, to=_INT64), 0), 1)
        if axis is None:
            inverse = op18.Reshape(inverse, op18.Shape(self))
    counts = _empty()
    if return_counts:
        positions = op18.Reshape(op18.NonZero(starts), [-1])
        ends = op18.Concat(op18.Slice(positions, [1], [2**62], [0]), length, axis=0)
        counts = op18.Sub(ends, positions)
    return values, inverse, counts
