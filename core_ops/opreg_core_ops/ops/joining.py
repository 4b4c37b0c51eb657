"""Joining and splitting: cat and stack (dtypes promoted), split, split_with_sizes, unbind."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, rank_of, same_type


@opreg.impl("aten::cat")
def aten_cat(tensors: Sequence[Tensor], dim: int = 0):
    """cat(Tensor[] tensors, int dim=0) -> Tensor: Concat (dtypes promoted; legacy empty 1-D inputs dropped)."""
    ranks = {rank_of(t) for t in tensors}
    if len(ranks) > 1:
        tensors = [t for t in tensors if not (rank_of(t) == 1 and t.shape[0] == 0)] or tensors[:1]
    tensors = same_type(tensors)
    if len(tensors) == 1:
        return op18.Identity(tensors[0])
    return op18.Concat(*tensors, axis=dim)


@opreg.impl("aten::split_with_sizes")
def aten_split_with_sizes(self: Tensor, split_sizes: Sequence[int], dim: int = 0):
    """split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]: Split."""
    count = split_sizes.shape[0] if isinstance(split_sizes, ir.Value) else len(split_sizes)
    if count == 1:
        return (op18.Identity(self),)
    return _split_into(self, split_sizes, dim, count)


def _split_into(x, sizes, axis: int, count: int) -> tuple:
    """Split with ``count`` outputs; sizes may be a runtime value (then the count cannot be read off them)."""
    if isinstance(sizes, ir.Value):
        # op18.Split takes no _outputs; the opset's generic Op passes it on to the recorder
        split = op18["Split"]
        return tuple(split(x, sizes, axis=axis, _outputs=count))
    return tuple(op18.Split(x, list(sizes), axis=axis))


def _split_is_static(node) -> bool:
    self = node.args[0].meta.get("val")
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    size = self.shape[dim] if self is not None and self.dim() > 0 else None
    return isinstance(size, int) and isinstance(node.args[1], int) and node.args[1] > 0


@opreg.impl("aten::split.Tensor", predicate=_split_is_static)
def aten_split(self: Tensor, split_size: int, dim: int = 0):
    """split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]: Split (static sizes)."""
    size = self.shape[dim]
    if not isinstance(size, int) or not isinstance(split_size, int):
        raise ValueError("split.Tensor needs a static dim size and split size")
    sizes = [split_size] * (size // split_size) + ([size % split_size] if size % split_size else [])
    return aten_split_with_sizes(self, sizes or [0], dim)


@opreg.impl("aten::stack")
def aten_stack(tensors: Sequence[Tensor], dim: int = 0):
    """stack(Tensor[] tensors, int dim=0) -> Tensor: Unsqueeze each and Concat (dtypes promoted)."""
    rank = rank_of(tensors[0])
    axis = dim + rank + 1 if dim < 0 else dim
    tensors = same_type(tensors)
    parts = [op18.Unsqueeze(t, [axis]) for t in tensors]
    return parts[0] if len(parts) == 1 else op18.Concat(*parts, axis=axis)


def _unbind_is_static(node) -> bool:
    value = node.args[0].meta.get("val")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return value is not None and value.dim() > 0 and isinstance(value.shape[dim], int)


@opreg.impl("aten::unbind.int", predicate=_unbind_is_static)
def aten_unbind(self: Tensor, dim: int = 0):
    """unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]: Split into ones and Squeeze (static dim size)."""
    rank = rank_of(self)
    axis = dim % rank
    size = self.shape[axis]
    if not isinstance(size, int):
        raise ValueError(f"unbind needs a static size for dim {dim}, got {size}")
    if size == 1:
        return (op18.Squeeze(self, [axis]),)
    parts = _split_into(self, [1] * size, axis, size)
    return tuple(op18.Squeeze(p, [axis]) for p in parts)
