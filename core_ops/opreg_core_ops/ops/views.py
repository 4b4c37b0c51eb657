"""Strided views and the ``*_copy`` forms of views: as_strided, unfold, resize, and the copies
(as_strided_copy, narrow_copy, permute_copy, unbind_copy, view_copy) torch's functional graphs use.

ONNX tensors have no storage: ``as_strided`` reads its input as torch lays it out, contiguous
(row-major), which is what every tensor an exported graph computes is. So with static sizes,
strides and offset it is a Gather of the flattened input at ``offset + sum_k(i_k * stride_k)``,
the index grid built from Range at run time (not a constant as large as the output).
A copy of a view holds the view's values: the view's impl serves it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, node_arg, rank_of
from opreg_core_ops.ops.indexing import aten_slice
from opreg_core_ops.ops.joining import aten_unbind
from opreg_core_ops.ops.shape import aten_permute, aten_view


def _strided_indices(size: Sequence[int], stride: Sequence[int], offset: int):
    """The flat storage index of every element of a ``size``-shaped view: broadcast Range grids."""
    rank = len(size)
    total = op18.Constant(value_int=offset)
    for axis, (extent, step) in enumerate(zip(size, stride, strict=True)):
        grid = op18.Mul(op18.Range(0, extent, 1), step)
        shape = [1] * rank
        shape[axis] = extent
        total = op18.Add(total, op18.Reshape(grid, shape))
    return op18.Expand(total, list(size))


def _as_strided(self, size: Sequence[int], stride: Sequence[int], storage_offset: int | None):
    flat = op18.Reshape(self, [-1])
    if not size:
        return op18.Reshape(op18.Gather(flat, [storage_offset or 0], axis=0), [])
    return op18.Gather(flat, _strided_indices(size, stride, storage_offset or 0), axis=0)


def _static_strides(node) -> bool:
    """Sizes, strides and offset are Python ints (a symbolic one has no ONNX reading of storage)."""
    values = [*node_arg(node, 1, "size", ()), *node_arg(node, 2, "stride", ())]
    offset = node_arg(node, 3, "storage_offset")
    return all(isinstance(v, int) for v in values) and (offset is None or isinstance(offset, int))


@opreg.impl("aten::as_strided", predicate=_static_strides)
def aten_as_strided(self: Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None):
    """as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a): Gather of the flattened input at the strided indices (static sizes)."""
    return _as_strided(self, size, stride, storage_offset)


@opreg.impl("aten::as_strided_copy", predicate=_static_strides)
def aten_as_strided_copy(self: Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None):
    """as_strided_copy(Tensor self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor: as as_strided."""
    return _as_strided(self, size, stride, storage_offset)


def _unfold(self, dimension: int, size: int, step: int):
    rank = rank_of(self)
    if rank == 0:
        return op18.Reshape(self, [1])  # a 0-d tensor unfolds (size 1) into one window of itself
    axis = dimension % rank
    length = op18.Shape(self, start=axis, end=axis + 1)
    windows = op18.Add(op18.Div(op18.Sub(length, size), step), 1)
    starts = op18.Mul(op18.Range(0, op18.Squeeze(windows, [0]), 1), step)
    indices = op18.Add(op18.Unsqueeze(starts, [1]), op18.Range(0, size, 1))  # (windows, size)
    gathered = op18.Gather(self, indices, axis=axis)  # the axis becomes (windows, size)
    perm = [*range(axis + 1), *range(axis + 2, rank + 1), axis + 1]
    return op18.Transpose(gathered, perm=perm)


@opreg.impl("aten::unfold")
def aten_unfold(self: Tensor, dimension: int, size: int, step: int):
    """unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a): Gather of the windows' indices along dimension, the window's axis moved last."""
    return _unfold(self, dimension, size, step)


def _resize_fits(node) -> bool:
    """A resize that grows the tensor exposes uninitialized memory: only shrinking (or keeping) is exported."""
    value = node.args[0].meta.get("val")
    size = node_arg(node, 1, "size", ())
    return (
        value is not None
        and all(isinstance(s, int) for s in (*size, *value.shape))
        and math.prod(size) <= value.numel()
    )


@opreg.impl("aten::resize", predicate=_resize_fits)
def aten_resize(self: Tensor, size: Sequence[int]):
    """resize(Tensor self, SymInt[] size, *, MemoryFormat? memory_format=None) -> Tensor: the first prod(size) elements, reshaped (no larger than the input)."""
    flat = op18.Reshape(self, [-1])
    return op18.Reshape(op18.Slice(flat, [0], [math.prod(size)], [0]), list(size))


def _static_narrow(node) -> bool:
    value, start = node.args[0].meta.get("val"), node_arg(node, 2, "start")
    return value is not None and (
        not isinstance(start, int) or start >= 0 or isinstance(value.shape[node.args[1]], int)
    )


@opreg.impl("aten::narrow_copy", predicate=_static_narrow)
def aten_narrow_copy(self: Tensor, dim: int, start: int, length: int):
    """narrow_copy(Tensor self, int dim, SymInt start, SymInt length) -> Tensor: Slice from start (negative: from the end) for length."""
    if isinstance(start, int) and start < 0:
        start += self.shape[dim]
    end = start + length if isinstance(start, int) and isinstance(length, int) else op18.Add(start, length)
    return aten_slice(self, dim, start, end)


@opreg.impl("aten::permute_copy")
def aten_permute_copy(self: Tensor, dims: Sequence[int]):
    """permute_copy(Tensor self, int[] dims) -> Tensor: as permute (Transpose)."""
    return aten_permute(self, dims)


@opreg.impl("aten::view_copy")
def aten_view_copy(self: Tensor, size: Sequence[int]):
    """view_copy(Tensor self, SymInt[] size) -> Tensor: as view (Reshape)."""
    return aten_view(self, size)


def _static_dim(node) -> bool:
    value = node.args[0].meta.get("val")
    dim = node_arg(node, 1, "dim", 0)
    return value is not None and value.dim() > 0 and isinstance(value.shape[dim], int)


@opreg.impl("aten::unbind_copy.int", predicate=_static_dim)
def aten_unbind_copy(self: Tensor, dim: int = 0):
    """unbind_copy.int(Tensor self, int dim=0) -> Tensor[]: as unbind (Split and Squeeze, static dim size)."""
    return aten_unbind(self, dim)
