"""Indexing: gather/scatter, advanced indexing, select/slice (and their scatters), flip, repeat,
diagonal, nonzero, masked ops, embedding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import HALF_TYPES, Tensor, rank_of, where

_INT64_MAX = int(np.iinfo(np.int64).max)
_INT64_MIN = int(np.iinfo(np.int64).min)

_RENORM_EPS = 1e-7
"""What torch's embedding_renorm adds to a row's norm before dividing max_norm by it."""


def _as_1d(value):
    """A Python int or a symbolic scalar as a 1-D INT64 value of one element."""
    if isinstance(value, ir.Value):
        if value.dtype != ir.DataType.INT64:
            value = op18.Cast(value, to=ir.DataType.INT64)
        return op18.Reshape(value, [1])
    return [value]


def _dim_size(x, dim: int):
    """The size of one dim: a Python int when static, else a 1-D INT64 value."""
    size = x.shape[dim]
    if isinstance(size, int):
        return size
    rank = rank_of(x)
    axis = dim % rank
    return op18.Shape(x, start=axis, end=axis + 1)


# -- gather / scatter -------------------------------------------------------------------


def _int_index(index):
    """An index tensor as ONNX index ops take it (INT32 or INT64; torch also allows e.g. UINT8)."""
    if index.dtype in (ir.DataType.INT32, ir.DataType.INT64):
        return index
    return op18.Cast(index, to=ir.DataType.INT64)


@opreg.impl("aten::gather")
def aten_gather(self: Tensor, dim: int, index: Tensor, sparse_grad: bool = False):
    """gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor: GatherElements (0-d self as 1-D)."""
    index = _int_index(index)
    if rank_of(self) == 0:
        picked = op18.GatherElements(op18.Reshape(self, [1]), op18.Reshape(index, [-1]), axis=0)
        return op18.Reshape(picked, op18.Shape(index))
    if rank_of(index) != rank_of(self):
        # torch skips its rank check for an empty index: the result is empty, shaped like it
        return op18.Expand(op18.CastLike(0, self), op18.Shape(index))
    return op18.GatherElements(self, index, axis=dim)


@opreg.impl("aten::index_select")
def aten_index_select(self: Tensor, dim: int, index: Tensor):
    """index_select(Tensor self, int dim, Tensor index) -> Tensor: Gather of the 1-D index."""
    index = _int_index(index)
    if rank_of(self) == 0:
        # torch keeps a 0-d result for a 0-d self (the index holds one element)
        return op18.Reshape(op18.Gather(op18.Reshape(self, [1]), op18.Reshape(index, [-1]), axis=0), [])
    return op18.Gather(self, op18.Reshape(index, [-1]), axis=dim)


@opreg.impl("aten::embedding")
def aten_embedding(
    weight: Tensor, indices: Tensor, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False
):
    """embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor: Gather along dim 0."""
    return op18.Gather(weight, indices, axis=0)


@opreg.impl("aten::embedding_renorm")
def aten_embedding_renorm(self: Tensor, indices: Tensor, max_norm: float, norm_type: float):
    """embedding_renorm(Tensor self, Tensor indices, float max_norm, float norm_type) -> Tensor: the rows that indices
    name and whose norm exceeds max_norm scaled by max_norm / (norm + 1e-7) (ReduceL1/L2/Max or Pow and ReduceSum)."""
    magnitude = op18.Abs(self)
    if norm_type == 1:
        norms = op18.ReduceL1(self, [1], keepdims=1)
    elif norm_type == 2:
        norms = op18.ReduceL2(self, [1], keepdims=1)
    elif norm_type == float("inf"):
        norms = op18.ReduceMax(magnitude, [1], keepdims=1)
    else:
        power = op18.CastLike(float(norm_type), self)
        total = op18.ReduceSum(op18.Pow(magnitude, power), [1], keepdims=1)
        norms = op18.Pow(total, op18.Div(op18.CastLike(1.0, self), power))
    flat = op18.Reshape(_int_index(indices), [-1])
    named = op18.ScatterElements(
        op18.Expand(op18.CastLike(0, flat), op18.Shape(self, start=0, end=1)),
        flat,
        op18.Expand(op18.CastLike(1, flat), op18.Shape(flat)),
        axis=0,
    )
    limit = op18.CastLike(float(max_norm), self)
    renorm = op18.And(op18.Unsqueeze(op18.Cast(named, to=ir.DataType.BOOL), [1]), op18.Greater(norms, limit))
    scale = op18.Div(limit, op18.Add(norms, op18.CastLike(_RENORM_EPS, self)))
    return op18.Where(renorm, op18.Mul(self, scale), self)


def _scatter_updates(index, src):
    """torch uses only the index-shaped corner of src; ONNX wants updates shaped like the index."""
    if src.shape is not None and index.shape is not None and list(src.shape) == list(index.shape):
        return src
    rank = rank_of(index)
    return op18.Slice(src, [0] * rank, op18.Shape(index), list(range(rank)))


_REDUCE_IN_FLOAT = HALF_TYPES | {ir.DataType.BOOL}
"""Types ONNX Runtime's ScatterElements cannot reduce: they reduce in FLOAT (exact for BOOL: Cast back maps
a positive sum, product, max or min to True, i.e. any/all as torch's bool reductions)."""


def _scatter_elements(data, index, updates, axis: int, reduction: str = "none"):
    """ScatterElements; a reduction on the types of :data:`_REDUCE_IN_FLOAT` runs in FLOAT."""
    if reduction == "none" or data.dtype not in _REDUCE_IN_FLOAT:
        return op18.ScatterElements(data, index, updates, axis=axis, reduction=reduction)
    wide = [op18.Cast(v, to=ir.DataType.FLOAT) for v in (data, updates)]
    result = op18.ScatterElements(wide[0], index, wide[1], axis=axis, reduction=reduction)
    return op18.Cast(result, to=data.dtype)


def _flat(scatter, self, index, src, *args):
    """``scatter`` (an impl taking self, dim, index, src, …) on a 0-d self as 1-D: ScatterElements needs rank >= 1."""
    src = op18.Reshape(src, [-1]) if isinstance(src, ir.Value) else src
    result = scatter(op18.Reshape(self, [1]), 0, op18.Reshape(index, [-1]), src, *args)
    return op18.Reshape(result, [])


@opreg.impl("aten::scatter.src")
def aten_scatter_src(self: Tensor, dim: int, index: Tensor, src: Tensor):
    """scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor: ScatterElements."""
    if rank_of(self) == 0:
        return _flat(aten_scatter_src, self, index, src)
    index = _int_index(index)
    return op18.ScatterElements(self, index, op18.CastLike(_scatter_updates(index, src), self), axis=dim)


@opreg.impl("aten::scatter.value")
def aten_scatter_value(self: Tensor, dim: int, index: Tensor, value: float):
    """scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor: ScatterElements of the value expanded to the index."""
    if rank_of(self) == 0:
        return _flat(aten_scatter_value, self, index, value)
    index = _int_index(index)
    updates = op18.Expand(op18.CastLike(value, self), op18.Shape(index))
    return op18.ScatterElements(self, index, updates, axis=dim)


_SCATTER_REDUCTIONS = {"add": "add", "multiply": "mul"}
"""scatter's legacy ``reduce=`` names -> ScatterElements reductions."""


@opreg.impl("aten::scatter.reduce")
def aten_scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str):
    """scatter.reduce(Tensor self, int dim, Tensor index, Tensor src, *, str reduce) -> Tensor: ScatterElements(reduction="add" or "mul")."""
    if rank_of(self) == 0:
        return _flat(aten_scatter_reduce, self, index, src, reduce)
    index = _int_index(index)
    updates = op18.CastLike(_scatter_updates(index, src), self)
    return _scatter_elements(self, index, updates, dim, _SCATTER_REDUCTIONS[reduce])


@opreg.impl("aten::scatter.value_reduce")
def aten_scatter_value_reduce(self: Tensor, dim: int, index: Tensor, value: float, reduce: str):
    """scatter.value_reduce(Tensor self, int dim, Tensor index, Scalar value, *, str reduce) -> Tensor: ScatterElements(reduction="add" or "mul") of the value expanded to the index."""
    if rank_of(self) == 0:
        return _flat(aten_scatter_value_reduce, self, index, value, reduce)
    index = _int_index(index)
    updates = op18.Expand(op18.CastLike(value, self), op18.Shape(index))
    return _scatter_elements(self, index, updates, dim, _SCATTER_REDUCTIONS[reduce])


@opreg.impl("aten::scatter_add")
def aten_scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor):
    """scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor: ScatterElements(reduction="add")."""
    if rank_of(self) == 0:
        return _flat(aten_scatter_add, self, index, src)
    index = _int_index(index)
    return _scatter_elements(self, index, op18.CastLike(_scatter_updates(index, src), self), dim, "add")


def _identity(reduce: str, dtype: ir.DataType):
    import numpy as np

    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    numpy_type = dtype.numpy()
    if dtype == ir.DataType.BOOL:
        return reduce == "amin"
    if np.issubdtype(numpy_type, np.floating) or dtype == ir.DataType.BFLOAT16:
        return float("-inf") if reduce == "amax" else float("inf")
    info = np.iinfo(numpy_type)
    return int(info.min) if reduce == "amax" else int(info.max)


_SCATTER_REDUCE_TWO = {"sum": "add", "mean": "add", "prod": "mul", "amax": "max", "amin": "min"}
"""scatter_reduce's ``reduce`` names -> ScatterElements reductions (mean: a sum, divided by the count after)."""


@opreg.impl("aten::scatter_reduce.two")
def aten_scatter_reduce_two(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True):
    """scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True) -> Tensor: ScatterElements with add/mul/max/min (mean: sum / count)."""
    if rank_of(self) == 0:
        return _flat(aten_scatter_reduce_two, self, index, src, reduce, include_self)
    reduction = _SCATTER_REDUCE_TWO[reduce]
    index = _int_index(index)
    src = _scatter_updates(index, src)
    base = self
    if not include_self:
        fill = op18.Expand(op18.CastLike(_identity(reduce, self.dtype), self), op18.Shape(index))
        base = op18.ScatterElements(self, index, fill, axis=dim)
    result = _scatter_elements(base, index, src, dim, reduction)
    if reduce != "mean":
        return result
    ones = op18.Expand(op18.CastLike(1, self), op18.Shape(self))
    counts = ones
    if not include_self:
        counts = op18.ScatterElements(ones, index, op18.Expand(op18.CastLike(0, self), op18.Shape(index)), axis=dim)
    counts = _scatter_elements(counts, index, op18.Expand(op18.CastLike(1, self), op18.Shape(index)), dim, "add")
    if self.dtype.is_floating_point():
        return op18.Div(result, counts)
    # torch floors integer means
    quotient = op18.Div(result, counts)
    negative = op18.And(
        op18.Less(op18.Mul(result, counts), op18.CastLike(0, self)),
        op18.Not(op18.Equal(op18.Mul(quotient, counts), result)),
    )
    return op18.Where(negative, op18.Sub(quotient, op18.CastLike(1, self)), quotient)


# -- select / slice ----------------------------------------------------------------------


@opreg.impl("aten::select.int")
def aten_select(self: Tensor, dim: int, index: int):
    """select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a): Gather of a scalar index."""
    if isinstance(index, ir.Value):
        index = op18.Reshape(op18.Cast(index, to=ir.DataType.INT64), [])
    else:
        index = op18.Constant(value_int=index)
    return op18.Gather(self, index, axis=dim)


@opreg.impl("aten::slice.Tensor")
def aten_slice(self: Tensor, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1):
    """slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a): Slice."""
    if rank_of(self) == 0:
        return op18.Identity(self)
    start = 0 if start is None else start
    end = _INT64_MAX if end is None else end
    if isinstance(start, int) and isinstance(end, int) and isinstance(step, int) and start == 0 and step == 1:
        size = self.shape[dim]
        if end == _INT64_MAX or (isinstance(size, int) and end >= size):
            return op18.Identity(self)
    return op18.Slice(self, _as_1d(start), _as_1d(end), [dim], _as_1d(step))


def _positions(self, src, dim: int, start, step):
    """The indices of ``self`` along ``dim`` that a slice [start::step] shaped like ``src`` covers, expanded to src."""
    rank = rank_of(self)
    axis = dim % rank
    size = _dim_size(self, axis)
    if isinstance(start, int) and isinstance(size, int):
        first = min(max(start + size if start < 0 else start, 0), size)
    else:
        start_v = op18.Cast(op18.Reshape(start, [1]), to=ir.DataType.INT64) if isinstance(start, ir.Value) else [start]
        size_v = op18.Constant(value_ints=[size]) if isinstance(size, int) else size
        wrapped = op18.Where(op18.Less(start_v, [0]), op18.Add(start_v, size_v), start_v)
        first = op18.Reshape(op18.Min(op18.Max(wrapped, [0]), size_v), [])
    count = op18.Reshape(_dim_size(src, axis) if not isinstance(src.shape[axis], int) else [src.shape[axis]], [])
    step = op18.Reshape(op18.Cast(step, to=ir.DataType.INT64), []) if isinstance(step, ir.Value) else step
    if isinstance(first, int):
        first = op18.Constant(value_int=first)
    end = op18.Add(first, op18.Mul(count, op18.CastLike(step, count)))
    positions = op18.Range(first, end, op18.CastLike(step, first))
    shape = [1] * rank
    shape[axis] = -1
    return op18.Expand(op18.Reshape(positions, shape), op18.Shape(src))


@opreg.impl("aten::slice_scatter")
def aten_slice_scatter(
    self: Tensor, src: Tensor, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1
):
    """slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor: ScatterElements at Range(start, end, step) along dim."""
    start = 0 if start is None else start
    src = op18.CastLike(src, self)
    whole = isinstance(start, int) and start == 0 and isinstance(step, int) and step == 1
    static = self.shape is not None and src.shape is not None and all(isinstance(d, int) for d in self.shape)
    if whole and static and list(src.shape) == list(self.shape):
        return op18.Identity(src)
    return op18.ScatterElements(self, _positions(self, src, dim, start, step), src, axis=dim)


@opreg.impl("aten::select_scatter")
def aten_select_scatter(self: Tensor, src: Tensor, dim: int, index: int):
    """select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor: ScatterElements of Unsqueeze(src) at index along dim."""
    rank = rank_of(self)
    axis = dim % rank
    src = op18.Unsqueeze(op18.CastLike(src, self), [axis])
    index = op18.Reshape(op18.Cast(index, to=ir.DataType.INT64), [1]) if isinstance(index, ir.Value) else [index]
    shape = [1] * rank
    indices = op18.Expand(op18.Reshape(index, shape), op18.Shape(src))
    return op18.ScatterElements(self, indices, src, axis=axis)


# -- rearranging ------------------------------------------------------------------------------


@opreg.impl("aten::flip")
def aten_flip(self: Tensor, dims: Sequence[int]):
    """flip(Tensor self, int[] dims) -> Tensor: Slice with step -1."""
    if not dims or rank_of(self) == 0:
        return op18.Identity(self)
    count = len(dims)
    return op18.Slice(self, [-1] * count, [_INT64_MIN] * count, list(dims), [-1] * count)


@opreg.impl("aten::repeat")
def aten_repeat(self: Tensor, repeats: Sequence[int]):
    """repeat(Tensor self, SymInt[] repeats) -> Tensor: Tile (leading dims added by Unsqueeze)."""
    rank = rank_of(self)
    count = repeats.shape[0] if isinstance(repeats, ir.Value) else len(repeats)
    if count > rank:
        self = op18.Unsqueeze(self, list(range(count - rank)))
    if count == 0:
        return op18.Identity(self)
    return op18.Tile(self, repeats)


@opreg.impl("aten::diagonal")
def aten_diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a): Transpose, Slice and GatherElements."""
    rank = rank_of(self)
    d1, d2 = dim1 % rank, dim2 % rank
    rest = [d for d in range(rank) if d not in (d1, d2)]
    moved = op18.Transpose(self, perm=[*rest, d1, d2])
    if offset >= 0:
        moved = op18.Slice(moved, [offset], [_INT64_MAX], [-1])
    else:
        moved = op18.Slice(moved, [-offset], [_INT64_MAX], [-2])
    shape = op18.Shape(moved)
    rows = op18.Shape(moved, start=-2, end=-1)
    cols = op18.Shape(moved, start=-1)
    length = op18.Min(rows, cols)
    moved = op18.Slice(moved, [0], length, [-2])
    index = op18.Reshape(op18.Range(0, op18.Reshape(length, []), 1), [-1, 1])
    target = op18.Concat(op18.Slice(shape, [0], [-2]), length, [1], axis=0)
    gathered = op18.GatherElements(moved, op18.Expand(index, target), axis=-1)
    return op18.Squeeze(gathered, [-1])


@opreg.impl("aten::nonzero")
def aten_nonzero(self: Tensor):
    """nonzero(Tensor self) -> Tensor: NonZero, transposed to (count, rank) (a 0-d self gives (count, 0))."""
    if rank_of(self) == 0:
        found = op18.Transpose(op18.NonZero(op18.Reshape(self, [1])), perm=[1, 0])
        return op18.Slice(found, [0], [0], [1])
    return op18.Transpose(op18.NonZero(self), perm=[1, 0])


# -- masks ----------------------------------------------------------------------------------------


@opreg.impl("aten::masked_fill.Scalar")
def aten_masked_fill_scalar(self: Tensor, mask: Tensor, value: float):
    """masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor: Where."""
    if isinstance(value, ir.Value):
        value = op18.Reshape(value, [])
    return where(_bool(mask), op18.CastLike(value, self), self)


@opreg.impl("aten::masked_fill.Tensor")
def aten_masked_fill_tensor(self: Tensor, mask: Tensor, value: Tensor):
    """masked_fill.Tensor(Tensor self, Tensor mask, Tensor value) -> Tensor: Where."""
    return where(_bool(mask), op18.CastLike(value, self), self)


def _bool(mask):
    return mask if mask.dtype == ir.DataType.BOOL else op18.Cast(mask, to=ir.DataType.BOOL)


@opreg.impl("aten::masked_scatter")
def aten_masked_scatter(self: Tensor, mask: Tensor, source: Tensor):
    """masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor: CumSum of the mask, Gather from source
    (an empty source too), Where (self and mask broadcast)."""
    mask = _bool(mask)
    shape = op18.Shape(self)
    if self.shape is None or mask.shape is None or list(self.shape) != list(mask.shape):
        shape = op18.Shape(op18.Expand(self, op18.Shape(mask)))  # Expand broadcasts both ways
        self = op18.Expand(self, shape)
    flags = op18.Reshape(op18.Expand(mask, shape), [-1])
    positions = op18.Sub(op18.CumSum(op18.Cast(flags, to=ir.DataType.INT64), op18.Constant(value_int=0)), [1])
    positions = op18.Max(positions, [0])
    flat = op18.Reshape(source, [-1])  # one element more, so an empty source (nothing masked) can be gathered from
    taken = op18.Gather(op18.Concat(flat, op18.CastLike([0], flat), axis=0), positions, axis=0)
    result = where(flags, op18.CastLike(taken, self), op18.Reshape(self, [-1]))
    return op18.Reshape(result, shape)


# -- advanced indexing ------------------------------------------------------------------------------


def _index_tensors(self, indices):
    """Boolean masks replaced by the integer indices of their true elements (one per dim they cover).

    Returns (position of each index tensor, the INT64 index tensors)."""
    dims: list[int] = []
    tensors = []
    position = 0
    for index in indices:
        if index is None:
            position += 1
            continue
        if index.dtype in (ir.DataType.BOOL, ir.DataType.UINT8):
            covered = rank_of(index)
            found = op18.NonZero(_bool(index))  # (covered, count)
            for k in range(covered):
                dims.append(position + k)
                tensors.append(op18.Reshape(op18.Gather(found, k, axis=0), [-1]))
            position += covered
        else:
            dims.append(position)
            tensors.append(index if index.dtype == ir.DataType.INT64 else op18.Cast(index, to=ir.DataType.INT64))
            position += 1
    return dims, tensors


def _broadcast(tensors):
    """The index tensors broadcast to one shape; returns them and that shape (a 1-D INT64 value)."""
    if len(tensors) == 1:
        return tensors, op18.Shape(tensors[0])
    shapes = [t.shape for t in tensors]
    if all(s is not None for s in shapes) and all(list(s) == list(shapes[0]) for s in shapes):
        return tensors, op18.Shape(tensors[0])
    total = tensors[0]
    for t in tensors[1:]:
        total = op18.Add(total, t)
    shape = op18.Shape(total)
    return [op18.Expand(t, shape) for t in tensors], shape


def _index_plan(self, indices):
    """How ``self[indices]`` maps to GatherND/ScatterND on ``self`` with its indexed dims moved first."""
    rank = rank_of(self)
    dims, tensors = _index_tensors(self, indices)
    tensors, index_shape = _broadcast(tensors)
    others = [d for d in range(rank) if d not in dims]
    perm = dims + others
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    stacked = op18.Concat(*[op18.Unsqueeze(t, [-1]) for t in tensors], axis=-1)
    return dims, perm, others, adjacent, stacked, index_shape


def _index_rank(indices) -> int:
    ranks = []
    for index in indices:
        if index is None:
            continue
        ranks.append(1 if index.dtype in (ir.DataType.BOOL, ir.DataType.UINT8) else rank_of(index))
    return max(ranks)


@opreg.impl("aten::index.Tensor")
def aten_index(self: Tensor, indices: Sequence[Tensor | None]):
    """index.Tensor(Tensor self, Tensor?[] indices) -> Tensor: Gather (one index tensor) or Transpose and GatherND (boolean masks via NonZero)."""
    given = [i for i, index in enumerate(indices) if index is not None]
    if len(given) == 1 and indices[given[0]].dtype not in (ir.DataType.BOOL, ir.DataType.UINT8):
        return op18.Gather(self, indices[given[0]], axis=given[0])
    rank = rank_of(self)
    dims, perm, others, adjacent, stacked, _ = _index_plan(self, indices)
    moved = self if perm == list(range(rank)) else op18.Transpose(self, perm=perm)
    result = op18.GatherND(moved, stacked)
    first = dims[0]
    if not adjacent or first == 0:
        return result
    # torch puts the indexed dims where they were when they are adjacent
    index_rank = _index_rank(indices)
    before = list(range(index_rank, index_rank + first))
    order = before + list(range(index_rank)) + list(range(index_rank + first, index_rank + len(others)))
    return op18.Transpose(result, perm=order)


@opreg.impl("aten::index_put")
def aten_index_put(self: Tensor, indices: Sequence[Tensor | None], values: Tensor, accumulate: bool = False):
    """index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor: ScatterND (reduction="add" to accumulate), transposed when the indexed dims are not leading."""
    rank = rank_of(self)
    dims, perm, others, adjacent, stacked, index_shape = _index_plan(self, indices)
    values = op18.CastLike(values, self)
    identity = perm == list(range(rank))
    moved = self if identity else op18.Transpose(self, perm=perm)
    shape = op18.Shape(self)
    rest = op18.Gather(shape, others) if others else None
    first = dims[0]
    index_rank = _index_rank(indices)
    if adjacent and first > 0:
        # values broadcast against torch's result layout (indexed dims in place), then move those dims first
        layout = [op18.Gather(shape, list(range(first))), index_shape]
        if len(others) > first:
            layout.append(op18.Gather(shape, others[first:]))
        updates = op18.Expand(values, op18.Concat(*layout, axis=0))
        order = (
            list(range(first, first + index_rank))
            + list(range(first))
            + list(range(first + index_rank, index_rank + len(others)))
        )
        updates = op18.Transpose(updates, perm=order)
    else:
        target = index_shape if rest is None else op18.Concat(index_shape, rest, axis=0)
        updates = op18.Expand(values, target)
    if accumulate and self.dtype in _REDUCE_IN_FLOAT:  # no float16/bool ScatterND add in ONNX Runtime
        wide = op18.ScatterND(
            op18.Cast(moved, to=ir.DataType.FLOAT), stacked, op18.Cast(updates, to=ir.DataType.FLOAT), reduction="add"
        )
        result = op18.Cast(wide, to=self.dtype)
    else:
        result = op18.ScatterND(moved, stacked, updates, reduction="add" if accumulate else "none")
    if identity:
        return result
    inverse = [perm.index(d) for d in range(rank)]
    return op18.Transpose(result, perm=inverse)
