"""Shapes and views: view/reshape, flatten, permute/transpose, (un)squeeze, sizes."""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg_core_ops.ops._helpers import rank_of


def aten_view(self, size: Sequence[int]):
    """view(Tensor(a) self, SymInt[] size) -> Tensor(a): Reshape."""
    return op18.Reshape(self, size)


def aten_reshape(self, shape: Sequence[int]):
    """reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a): Reshape."""
    return op18.Reshape(self, shape)


def aten_unsafe_view(self, size: Sequence[int]):
    """_unsafe_view(Tensor self, SymInt[] size) -> Tensor: Reshape."""
    return op18.Reshape(self, size)


def aten_flatten(self, start_dim: int = 0, end_dim: int = -1):
    """flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a): Flatten or Reshape."""
    rank = rank_of(self)
    if rank is None:
        raise ValueError("flatten needs the input's rank")
    if rank == 0:
        return op18.Reshape(self, [1])
    start = start_dim % rank
    end = end_dim % rank
    if end == rank - 1:
        return op18.Flatten(self, axis=start) if start > 0 else op18.Reshape(self, [-1])
    shape = op18.Shape(self)
    head = op18.Slice(shape, [0], [start])
    tail = op18.Slice(shape, [end + 1], [rank])
    return op18.Reshape(self, op18.Concat(head, [-1], tail, axis=0))


def aten_permute(self, dims: Sequence[int]):
    """permute(Tensor(a) self, int[] dims) -> Tensor(a): Transpose."""
    rank = len(dims)
    return op18.Transpose(self, perm=[d % rank for d in dims])


def aten_t(self):
    """t(Tensor(a) self) -> Tensor(a): Transpose (identity below 2-D)."""
    if (rank_of(self) or 0) < 2:
        return op18.Identity(self)
    return op18.Transpose(self, perm=[1, 0])


def aten_transpose(self, dim0: int, dim1: int):
    """transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a): Transpose."""
    rank = rank_of(self)
    perm = list(range(rank))
    perm[dim0 % rank], perm[dim1 % rank] = perm[dim1 % rank], perm[dim0 % rank]
    return op18.Transpose(self, perm=perm)


def aten_unsqueeze(self, dim: int):
    """unsqueeze(Tensor(a) self, int dim) -> Tensor(a): Unsqueeze."""
    rank = rank_of(self)
    if dim < 0 and rank is not None:
        dim = dim + rank + 1
    return op18.Unsqueeze(self, [dim])


def aten_squeeze_dims(self, dim: Sequence[int]):
    """squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a): Squeeze of the dims of size 1."""
    rank = rank_of(self)
    axes = [d % rank for d in dim if self.shape[d % rank] == 1] if rank else []
    if not axes:
        return op18.Identity(self)
    return op18.Squeeze(self, axes)


def aten_sym_size(self, dim: int):
    """sym_size.int(Tensor self, int dim) -> SymInt: Shape (one dim) as a scalar INT64."""
    rank = rank_of(self)
    start = dim % rank if rank is not None else dim
    end = start + 1 if start != -1 else None
    return op18.Squeeze(op18.Shape(self, start=start, end=end), [0])


def aten_clone(self, memory_format: str | None = None):
    """clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor: Identity."""
    return op18.Identity(self)


def aten_expand(self, size: Sequence[int], implicit: bool = False):
    """expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a): Expand (-1 keeps a dim)."""
    if isinstance(size, (list, tuple)) and any(s == -1 for s in size if isinstance(s, int)):
        shape = op18.Shape(self)
        offset = len(size) - rank_of(self)
        parts = [
            op18.Slice(shape, [i - offset], [i - offset + 1]) if s == -1 else op18.Constant(value_ints=[s])
            for i, s in enumerate(size)
        ]
        return op18.Expand(self, op18.Concat(*parts, axis=0))
    return op18.Expand(self, size)


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::view", aten_view, opset=18)
    registry.register("aten::reshape", aten_reshape, opset=18)
    registry.register("aten::_unsafe_view", aten_unsafe_view, opset=18)
    registry.register("aten::flatten.using_ints", aten_flatten, opset=18)
    registry.register("aten::permute", aten_permute, opset=18)
    registry.register("aten::t", aten_t, opset=18)
    registry.register("aten::transpose.int", aten_transpose, opset=18)
    registry.register("aten::unsqueeze", aten_unsqueeze, opset=18)
    registry.register("aten::squeeze.dims", aten_squeeze_dims, opset=18)
    registry.register("aten::sym_size.int", aten_sym_size, opset=18)
    registry.register("aten::clone", aten_clone, opset=18)
    registry.register("aten::expand", aten_expand, opset=18)
