"""Shapes and views: view/reshape, flatten/unflatten, permute/transpose, (un)squeeze, expand,
repeat_interleave by an int, sizes."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, rank_of


def _reshape(self, size):
    """Reshape; a static 0 in the size is a real 0 (allowzero), not ONNX's "copy this dim"."""
    if isinstance(size, (list, tuple)) and 0 in size:
        return op18.Reshape(self, size, allowzero=1)
    return op18.Reshape(self, size)


@opreg.impl("aten::view")
@opreg.impl("aten::_unsafe_view")
def aten_view(self: Tensor, size: Sequence[int]):
    """view(Tensor(a) self, SymInt[] size) -> Tensor(a): Reshape.

    _unsafe_view(Tensor self, SymInt[] size) -> Tensor: the same."""
    return _reshape(self, size)


@opreg.impl("aten::reshape")
def aten_reshape(self: Tensor, shape: Sequence[int]):
    """reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a): Reshape."""
    return _reshape(self, shape)


@opreg.impl("aten::flatten.using_ints")
def aten_flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1):
    """flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a): Flatten or Reshape."""
    rank = rank_of(self)
    if rank is None:
        raise ValueError("flatten needs the input's rank")
    if rank == 0:
        return op18.Reshape(self, [1])
    start = start_dim % rank
    end = end_dim % rank
    if start == end:
        return op18.Identity(self)
    if end == rank - 1 and start <= 1:
        # ONNX Flatten always makes 2-D, so it is torch's flatten only from dim 1 on
        return op18.Flatten(self, axis=1) if start == 1 else op18.Reshape(self, [-1])
    tail = list(self.shape)[end + 1 :]
    if all(isinstance(d, int) and d > 0 for d in tail):
        # a 0 in Reshape's shape copies the input's dim at that index: right for the leading dims
        return op18.Reshape(self, [0] * start + [-1] + tail)
    shape = op18.Shape(self)
    head = op18.Slice(shape, [0], [start])
    tail = op18.Slice(shape, [end + 1], [rank])
    return op18.Reshape(self, op18.Concat(head, [-1], tail, axis=0))


def _static_sizes(node) -> bool:
    sizes = node.args[2] if len(node.args) > 2 else node.kwargs.get("sizes")
    return isinstance(sizes, (list, tuple)) and all(isinstance(s, int) for s in sizes)


@opreg.impl("aten::unflatten.int", predicate=_static_sizes)
def aten_unflatten(self: Tensor, dim: int, sizes: Sequence[int]):
    """unflatten.int(Tensor(a) self, int dim, SymInt[] sizes) -> Tensor(a): Reshape (the other dims kept)."""
    rank = rank_of(self)
    if rank is None:
        raise ValueError("unflatten needs the input's rank")
    axis = dim % rank
    dims = list(self.shape)
    if all(isinstance(d, int) for d in dims):
        return _reshape(self, dims[:axis] + list(sizes) + dims[axis + 1 :])
    parts = [op18.Shape(self, start=0, end=axis)] if axis else []
    parts.append(list(sizes))
    if axis + 1 < rank:
        parts.append(op18.Shape(self, start=axis + 1))
    return op18.Reshape(self, op18.Concat(*parts, axis=0), allowzero=int(0 in sizes))


def _int_repeats(node) -> bool:
    repeats = node.args[1] if len(node.args) > 1 else node.kwargs.get("repeats")
    value = node.args[0].meta.get("val")
    return isinstance(repeats, int) and value is not None


@opreg.impl("aten::repeat_interleave.self_int", predicate=_int_repeats)
def aten_repeat_interleave_self_int(
    self: Tensor, repeats: int, dim: int | None = None, *, output_size: int | None = None
):
    """repeat_interleave.self_int(Tensor self, SymInt repeats, int? dim=None, *, SymInt? output_size=None) -> Tensor: Unsqueeze, Expand and Reshape (a number of repeats; any sizes)."""
    dims = list(self.shape)
    if dim is None:
        flat = [math.prod(dims)] if all(isinstance(d, int) for d in dims) else [None]
        self, dims, axis = op18.Reshape(self, [-1]), flat, 0
    else:
        axis = dim % max(len(dims), 1)
    if not dims:  # a 0-d tensor along dim 0
        self, dims = op18.Reshape(self, [1]), [1]
    unsqueezed = op18.Unsqueeze(self, [axis + 1])
    if all(isinstance(d, int) for d in dims):
        wide = [*dims[: axis + 1], repeats, *dims[axis + 1 :]]
        return _reshape(op18.Expand(unsqueezed, wide), [*dims[:axis], dims[axis] * repeats, *dims[axis + 1 :]])
    rank = len(dims)
    expanded = op18.Expand(unsqueezed, [1] * (axis + 1) + [repeats] + [1] * (rank - axis - 1))
    parts = [op18.Shape(self, end=axis)] if axis else []
    parts.append(op18.Mul(op18.Shape(self, start=axis, end=axis + 1), [repeats]))
    if axis + 1 < rank:
        parts.append(op18.Shape(self, start=axis + 1))
    return op18.Reshape(expanded, op18.Concat(*parts, axis=0), allowzero=1)


@opreg.impl("aten::permute")
def aten_permute(self: Tensor, dims: Sequence[int]):
    """permute(Tensor(a) self, int[] dims) -> Tensor(a): Transpose."""
    rank = len(dims)
    if rank == 0:
        return op18.Identity(self)
    return op18.Transpose(self, perm=[d % rank for d in dims])


@opreg.impl("aten::t")
def aten_t(self: Tensor):
    """t(Tensor(a) self) -> Tensor(a): Transpose (identity below 2-D)."""
    if (rank_of(self) or 0) < 2:
        return op18.Identity(self)
    return op18.Transpose(self, perm=[1, 0])


@opreg.impl("aten::transpose.int")
def aten_transpose(self: Tensor, dim0: int, dim1: int):
    """transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a): Transpose."""
    rank = rank_of(self)
    if not rank:
        return op18.Identity(self)
    perm = list(range(rank))
    perm[dim0 % rank], perm[dim1 % rank] = perm[dim1 % rank], perm[dim0 % rank]
    return op18.Transpose(self, perm=perm)


@opreg.impl("aten::unsqueeze")
def aten_unsqueeze(self: Tensor, dim: int):
    """unsqueeze(Tensor(a) self, int dim) -> Tensor(a): Unsqueeze."""
    rank = rank_of(self)
    if dim < 0 and rank is not None:
        dim = dim + rank + 1
    return op18.Unsqueeze(self, [dim])


@opreg.impl("aten::squeeze.dims")
def aten_squeeze_dims(self: Tensor, dim: Sequence[int]):
    """squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a): Squeeze of the dims of size 1."""
    rank = rank_of(self)
    axes = [d % rank for d in dim if self.shape[d % rank] == 1] if rank else []
    if not axes:
        return op18.Identity(self)
    return op18.Squeeze(self, axes)


@opreg.impl("aten::sym_size.int")
def aten_sym_size(self: Tensor, dim: int):
    """sym_size.int(Tensor self, int dim) -> SymInt: Shape (one dim) as a scalar INT64."""
    rank = rank_of(self)
    start = dim % rank if rank is not None else dim
    end = start + 1 if start != -1 else None
    return op18.Squeeze(op18.Shape(self, start=start, end=end), [0])


@opreg.impl("aten::expand")
def aten_expand(self: Tensor, size: Sequence[int], implicit: bool = False):
    """expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a): Expand (-1, keep a dim, as 1)."""
    if isinstance(size, ir.Value):
        return op18.Expand(self, op18.Abs(size))  # sizes are >= 0 or -1; Expand broadcasts a 1
    return op18.Expand(self, [1 if s == -1 else s for s in size])


@opreg.impl("aten::expand_as")
def aten_expand_as(self: Tensor, other: Tensor):
    """expand_as(Tensor(a) self, Tensor other) -> Tensor(a): Expand to Shape(other)."""
    return op18.Expand(self, op18.Shape(other))


@opreg.impl("aten::reshape_as")
@opreg.impl("aten::view_as")
def aten_reshape_as(self: Tensor, other: Tensor):
    """reshape_as(Tensor(a) self, Tensor other) -> Tensor(a): Reshape to Shape(other).

    view_as(Tensor(a) self, Tensor other) -> Tensor(a): the same."""
    return op18.Reshape(self, op18.Shape(other), allowzero=1)


@opreg.impl("aten::squeeze.dim")
def aten_squeeze_dim(self: Tensor, dim: int):
    """squeeze.dim(Tensor(a) self, int dim) -> Tensor(a): Squeeze (Identity unless the dim has size 1)."""
    return aten_squeeze_dims(self, [dim])


@opreg.impl("aten::squeeze.default")
def aten_squeeze(self: Tensor):
    """squeeze(Tensor(a) self) -> Tensor(a): Squeeze of the dims of (static) size 1."""
    rank = rank_of(self)
    return aten_squeeze_dims(self, list(range(rank or 0)))


@opreg.impl("aten::sym_numel")
def aten_sym_numel(self: Tensor):
    """sym_numel(Tensor self) -> SymInt: Size."""
    return op18.Size(self)


@opreg.impl("aten::sym_stride.int")
def aten_sym_stride(self: Tensor, dim: int):
    """sym_stride.int(Tensor self, int dim) -> SymInt: ReduceProd of the later dims' sizes (contiguous strides)."""
    rank = rank_of(self)
    start = dim % rank
    if start == rank - 1:
        return op18.Constant(value_int=1)
    return op18.ReduceProd(op18.Shape(self, start=start + 1), keepdims=0)


def _read_by_assertions_only(node) -> bool:
    """Every user of ``node`` is a comparison whose every user is ``aten::_assert_scalar``."""
    import torch

    assert_scalar = torch.ops.aten._assert_scalar.default
    return all(
        user.target in _ASSERTION_INPUTS and user.users and all(u.target is assert_scalar for u in user.users)
        for user in node.users
    )


@opreg.impl("aten::sym_storage_offset", predicate=_read_by_assertions_only)
def aten_sym_storage_offset(self: Tensor):
    """sym_storage_offset(Tensor self) -> SymInt: 0. ONNX tensors have no storage; the predicate
    admits only offsets that nothing but torch's runtime assertions read (``offset >= 0``, which
    the exporter drops), as torch's own decompositions of views leave them."""
    return op18.Constant(value_int=0)


_ASSERTION_INPUTS = frozenset({operator.ge, operator.gt, operator.le, operator.lt, operator.eq, operator.ne})
