"""Pooling and sliding windows: max/avg/adaptive pools, col2im/im2col."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, expand_param, node_arg, rank_of, symmetric_pads


def _static_dims(x, start: int) -> list[int] | None:
    dims = list(x.shape[start:])
    return dims if all(isinstance(d, int) for d in dims) else None


def _batched(x, spatial: int):
    """(x as (N, C, *spatial), whether a batch dim was added): pools take unbatched input too."""
    if rank_of(x) == spatial + 1:
        return op18.Unsqueeze(x, [0]), True
    return x, False


def _unbatch(y, added: bool):
    return op18.Squeeze(y, [0]) if added else y


# -- windows, for pools ONNX has no exact op for ----------------------------------------------

_MAX_POOL_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.INT8, ir.DataType.UINT8}
)
"""The input types ONNX Runtime's MaxPool takes; other types are pooled over window slices."""


def _pool_output_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """torch's pooled size: with ceil_mode, a last window must start inside the input or its
    begin padding (ONNX before opset 19 keeps a window that starts in the end padding)."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool_geometry(x, kernel, stride, padding, dilation, ceil_mode):
    """(output sizes, ONNX pads giving them without ceil_mode) for x's static spatial dims,
    or None if they are not static."""
    spatial = len(kernel)
    dims = _static_dims(x, 2)
    if dims is None:
        return None
    pads = expand_param(padding, spatial)
    out = [_pool_output_size(*args, ceil_mode) for args in zip(dims, kernel, stride, pads, dilation, strict=True)]
    # The end padding that makes the last window (of a floor-mode pool) the last torch keeps.
    reach = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(out, stride, dilation, kernel, strict=True)]
    ends = [max(r - n - p, 0) for r, n, p in zip(reach, dims, pads, strict=True)]
    return out, pads + ends


def _window_slices(x, kernel, stride, dilation, pads, out, pad_value):
    """For each kernel offset (row-major), x's elements under it in every window: (N, C, *out)."""
    spatial = len(kernel)
    if any(pads):
        x = op18.Pad(x, [0, 0, *pads[:spatial], 0, 0, *pads[spatial:]], pad_value)
    axes = list(range(2, spatial + 2))
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = [o * d for o, d in zip(offset, dilation, strict=True)]
        ends = [b + (n - 1) * s + 1 for b, n, s in zip(starts, out, stride, strict=True)]
        yield offset, op18.Slice(x, starts, ends, axes, stride)


def _dtype_min(dtype: ir.DataType):
    """The least value of ``dtype`` (ml_dtypes' finfo knows bfloat16, numpy's does not)."""
    numpy_type = dtype.numpy()
    info = np.iinfo(numpy_type) if np.issubdtype(numpy_type, np.integer) else ml_dtypes.finfo(numpy_type)
    return np.array(info.min, dtype=numpy_type)


def _max_pool_slices(x, kernel, stride, dilation, geometry, with_indices: bool):
    """Max over window slices (padding is the dtype's minimum); indices of the first maximum
    within each (n, c) plane, as torch picks them."""
    out, pads = geometry
    dims = _static_dims(x, 2)
    pooled = indices = None
    for offset, window in _window_slices(x, kernel, stride, dilation, pads, out, _dtype_min(x.dtype)):
        if not with_indices:
            pooled = window if pooled is None else op18.Max(pooled, window)
            continue
        # Flat index, in the unpadded plane, of this offset's element in every window.
        grids = np.meshgrid(*(np.arange(n) for n in out), indexing="ij")
        positions = [
            g * s + o * d - p
            for g, s, o, d, p in zip(grids, stride, offset, dilation, pads[: len(kernel)], strict=True)
        ]
        flat = np.ravel_multi_index(positions, dims, mode="clip").astype(np.int64)
        if pooled is None:
            pooled, indices = window, op18.Expand(flat, op18.Shape(window))
        else:
            better = op18.Greater(window, pooled)
            pooled, indices = op18.Where(better, window, pooled), op18.Where(better, flat, indices)
    return pooled, indices


# -- max pooling -------------------------------------------------------------------------


def _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, spatial: int, with_indices: bool):
    kernel = expand_param(kernel_size, spatial)
    strides = expand_param(stride, spatial) if stride else kernel
    dilations = expand_param(dilation, spatial)
    x, added = _batched(self, spatial)
    geometry = _pool_geometry(x, kernel, strides, padding, dilations, ceil_mode)
    # With static sizes, torch's output size comes from explicit end pads, not ceil_mode
    # (whose rule ONNX changed at opset 19); pads must stay below the kernel for MaxPool.
    if geometry is not None and (
        self.dtype not in _MAX_POOL_TYPES or any(p >= k for p, k in zip(geometry[1], kernel * 2, strict=True))
    ):
        pooled, indices = _max_pool_slices(x, kernel, strides, dilations, geometry, with_indices)
        return (_unbatch(pooled, added), _unbatch(indices, added)) if with_indices else _unbatch(pooled, added)
    pooled, indices = op18.MaxPool(
        x,
        kernel_shape=kernel,
        strides=strides,
        pads=symmetric_pads(padding, spatial) if geometry is None else geometry[1],
        dilations=dilations,
        ceil_mode=int(ceil_mode) if geometry is None else 0,
    )
    if not with_indices:
        return _unbatch(pooled, added)
    # ONNX counts indices over the whole tensor, torch within each (n, c) plane.
    dims = _static_dims(x, 2)
    plane = math.prod(dims) if dims is not None else op18.ReduceProd(op18.Shape(x, start=2), keepdims=0)
    indices = op18.Mod(indices, plane)
    return _unbatch(pooled, added), _unbatch(indices, added)


@opreg.impl("aten::max_pool1d")
def aten_max_pool1d(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
):
    """max_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], int[1] dilation=[1], bool ceil_mode=False) -> Tensor: MaxPool."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 1, with_indices=False)


@opreg.impl("aten::max_pool2d")
def aten_max_pool2d(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
):
    """max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> Tensor: MaxPool."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2, with_indices=False)


@opreg.impl("aten::max_pool3d")
def aten_max_pool3d(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    dilation: Sequence[int] = (1, 1, 1),
    ceil_mode: bool = False,
):
    """max_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False) -> Tensor: MaxPool."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3, with_indices=False)


@opreg.impl("aten::max_pool1d_with_indices")
def aten_max_pool1d_with_indices(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
):
    """max_pool1d_with_indices(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=0, int[1] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor): MaxPool (Indices made per-channel with Mod)."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 1, with_indices=True)


@opreg.impl("aten::max_pool2d_with_indices")
def aten_max_pool2d_with_indices(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
):
    """max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor): MaxPool (Indices made per-channel with Mod)."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2, with_indices=True)


@opreg.impl("aten::max_pool3d_with_indices")
def aten_max_pool3d_with_indices(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    dilation: Sequence[int] = (1, 1, 1),
    ceil_mode: bool = False,
):
    """max_pool3d_with_indices(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor): MaxPool (Indices made per-channel with Mod)."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3, with_indices=True)


# -- average pooling --------------------------------------------------------------------


_AVERAGE_POOL_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16})


def _avg_divisors(dims, kernel, stride, pads, out, count_include_pad: bool) -> np.ndarray:
    """torch's divisor for every window (shape ``out``): the window clipped to the padded
    input, or to the input itself without count_include_pad."""
    per_dim = []
    for n, k, s, p, o in zip(dims, kernel, stride, pads, out, strict=True):
        begins = np.arange(o) * s - p
        ends = np.minimum(begins + k, n + p)
        if not count_include_pad:
            begins, ends = np.maximum(begins, 0), np.minimum(ends, n)
        per_dim.append(ends - begins)
    return math.prod(np.ix_(*per_dim))


def _avg_pool_slices(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Window sums over slices, divided as torch divides (integer division for integers)."""
    spatial = len(kernel)
    out, pads = _pool_geometry(x, kernel, stride, padding, [1] * spatial, ceil_mode)
    values = op18.Cast(x, to=ir.DataType.FLOAT) if x.dtype == ir.DataType.FLOAT16 else x
    zero = np.array(0, dtype=values.dtype.numpy())
    total = None
    for _offset, window in _window_slices(values, kernel, stride, [1] * spatial, pads, out, zero):
        total = window if total is None else op18.Add(total, window)
    if divisor_override is not None:
        divisor = np.array(divisor_override)
    else:
        divisor = _avg_divisors(_static_dims(x, 2), kernel, stride, pads[:spatial], out, count_include_pad)
    result = op18.Div(total, divisor.astype(values.dtype.numpy()))
    return op18.CastLike(result, x) if values is not x else result


def _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, spatial: int):
    kernel = expand_param(kernel_size, spatial)
    strides = expand_param(stride, spatial) if stride else kernel
    x, added = _batched(self, spatial)
    if divisor_override is not None or self.dtype not in _AVERAGE_POOL_TYPES:
        pooled = _avg_pool_slices(x, kernel, strides, padding, ceil_mode, count_include_pad, divisor_override)
        return _unbatch(pooled, added)
    pooled = op18.AveragePool(
        x,
        kernel_shape=kernel,
        strides=strides,
        pads=symmetric_pads(padding, spatial),
        ceil_mode=int(ceil_mode),
        count_include_pad=int(count_include_pad),
    )
    return _unbatch(pooled, added)


def _avg_pool_covered(node) -> bool:
    """divisor_override and non-float inputs are pooled over slices, which need static sizes."""
    value = node.args[0].meta.get("val")
    divisor_override = node_arg(node, 6, "divisor_override")
    if value is not None and value.is_floating_point() and divisor_override is None:
        return True
    return value is not None and all(isinstance(d, int) for d in value.shape)


@opreg.impl("aten::avg_pool1d", predicate=_avg_pool_covered)
def aten_avg_pool1d(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
):
    """avg_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], bool ceil_mode=False, bool count_include_pad=True) -> Tensor: AveragePool, or Slice/Add/Div over the windows (integers)."""
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)


@opreg.impl("aten::avg_pool2d", predicate=_avg_pool_covered)
def aten_avg_pool2d(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
):
    """avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor: AveragePool, or Slice/Add/Div over the windows (divisor_override, integers)."""
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)


@opreg.impl("aten::avg_pool3d", predicate=_avg_pool_covered)
def aten_avg_pool3d(
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
):
    """avg_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor: AveragePool, or Slice/Add/Div over the windows (divisor_override, integers)."""
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3)


# -- adaptive average pooling -----------------------------------------------------------


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """(size, out): column i averages torch's adaptive bin i (floor(i*n/m) .. ceil((i+1)*n/m))."""
    matrix = np.zeros((size, out), dtype=np.float32)
    for i in range(out):
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        matrix[start:end, i] = 1.0 / (end - start)
    return matrix


def _adaptive_avg_pool(self, output_size, spatial: int):
    size = expand_param(output_size, spatial)
    x, added = _batched(self, spatial)
    if all(s == 1 for s in size):
        return _unbatch(op18.GlobalAveragePool(x), added)
    dims = _static_dims(x, 2)
    if dims is None or not all(isinstance(s, int) for s in size):
        raise ValueError(f"adaptive_avg_pool to {size} needs static spatial sizes, got {self.shape}")
    if 0 in x.shape:  # nothing to average (and ONNX Runtime's MatMul rejects an empty batch)
        return _unbatch(op18.Expand(op18.CastLike(0, x), op18.Concat(op18.Shape(x, end=2), size, axis=0)), added)
    if all(d % s == 0 for d, s in zip(dims, size, strict=True)):
        kernel = [d // s for d, s in zip(dims, size, strict=True)]
        return _unbatch(op18.AveragePool(x, kernel_shape=kernel, strides=kernel), added)
    # Uneven bins: average each spatial dim in turn with a (size, out) matrix (float16 in float32, as torch sums).
    rank = spatial + 2
    y = op18.Cast(x, to=ir.DataType.FLOAT) if x.dtype == ir.DataType.FLOAT16 else x
    for axis, (d, s) in enumerate(zip(dims, size, strict=True), start=2):
        if d == s:
            continue
        matrix = _adaptive_matrix(d, s)  # a constant in y's dtype
        if axis == rank - 1:
            y = op18.MatMul(y, matrix)
        else:
            perm = list(range(rank))
            perm[axis], perm[-1] = perm[-1], perm[axis]
            y = op18.Transpose(op18.MatMul(op18.Transpose(y, perm=perm), matrix), perm=perm)
    return _unbatch(op18.CastLike(y, x) if y.dtype != x.dtype else y, added)


def _static_spatial_output(node) -> bool:
    """Adaptive pools need static input sizes unless the output is all ones."""
    size = node_arg(node, 1, "output_size")
    value = node.args[0].meta.get("val")
    if isinstance(size, (list, tuple)) and all(s == 1 for s in size):
        return True
    return value is not None and all(isinstance(d, int) for d in value.shape) and all(isinstance(s, int) for s in size)


@opreg.impl("aten::adaptive_avg_pool1d", predicate=_static_spatial_output)
@opreg.impl("aten::adaptive_avg_pool2d", predicate=_static_spatial_output)
@opreg.impl("aten::_adaptive_avg_pool2d", predicate=_static_spatial_output)
@opreg.impl("aten::adaptive_avg_pool3d", predicate=_static_spatial_output)
@opreg.impl("aten::_adaptive_avg_pool3d", predicate=_static_spatial_output)
def aten_adaptive_avg_pool(self: Tensor, output_size: Sequence[int]):
    """adaptive_avg_pool1d(Tensor self, int[1] output_size) -> Tensor: GlobalAveragePool, AveragePool (even bins) or MatMul (uneven).

    adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor: the same, over 2 spatial dims.

    _adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor: the same, over 2 spatial dims.

    adaptive_avg_pool3d(Tensor self, SymInt[3] output_size) -> Tensor: the same, over 3 spatial dims.

    _adaptive_avg_pool3d(Tensor self, SymInt[3] output_size) -> Tensor: the same, over 3 spatial dims.

    The spatial rank is output_size's length (torch requires 1, 2 or 3 sizes of these ops, and the
    predicate lets only a list through)."""
    return _adaptive_avg_pool(self, output_size, len(output_size))


def _adaptive_max_pool(self, output_size, spatial: int):
    """Static sizes (the predicate checks). Even bins: MaxPool with kernel = stride = input size /
    output size. Uneven bins (torch's bin i spans floor(i*n/m) .. ceil((i+1)*n/m)): one axis at a
    time, last first, ReduceMax and ArgMax over each bin's Slice; the coordinates found for the
    later axes follow the maxima chosen along each earlier one (GatherElements), so the index is
    the window's first maximum in row-major order, as torch picks it."""
    x, added = _batched(self, spatial)
    dims = _static_dims(x, 2)
    assert dims is not None
    size = expand_param(output_size, spatial)
    if all(d % s == 0 for d, s in zip(dims, size, strict=True)):
        kernel = [d // s for d, s in zip(dims, size, strict=True)]
        return _max_pool(self, kernel, kernel, [0] * spatial, [1] * spatial, False, spatial, with_indices=True)
    values, coordinates = x, []  # coordinates: (axis, chosen position along it), later axes first
    for axis in reversed(range(2, spatial + 2)):
        n, m = dims[axis - 2], size[axis - 2]
        maxima, positions = [], []
        for i in range(m):
            start, end = (i * n) // m, -((-(i + 1) * n) // m)
            window = op18.Slice(values, [start], [end], [axis])
            maxima.append(op18.ReduceMax(window, [axis], keepdims=1))
            positions.append(op18.Add(op18.ArgMax(window, axis=axis, keepdims=1), start))
        chosen = op18.Concat(*positions, axis=axis)
        coordinates = [(a, op18.GatherElements(c, chosen, axis=axis)) for a, c in coordinates]
        coordinates.append((axis, chosen))
        values = op18.Concat(*maxima, axis=axis)
    flat = None
    for axis, position in coordinates:
        stride = math.prod(dims[axis - 1 :])
        term = op18.Mul(position, stride) if stride != 1 else position
        flat = term if flat is None else op18.Add(flat, term)
    return _unbatch(values, added), _unbatch(flat, added)


def _static_bins(node) -> bool:
    """Static spatial sizes and output sizes (the bins are then known when exporting)."""
    size = node_arg(node, 1, "output_size")
    value = node.args[0].meta.get("val")
    if value is None or not isinstance(size, (list, tuple)):
        return False
    dims = list(value.shape[-len(size) :])
    return all(isinstance(d, int) and isinstance(s, int) and s > 0 for d, s in zip(dims, size, strict=True))


@opreg.impl("aten::adaptive_max_pool2d", predicate=_static_bins)
@opreg.impl("aten::adaptive_max_pool3d", predicate=_static_bins)
def aten_adaptive_max_pool(self: Tensor, output_size: Sequence[int]):
    """adaptive_max_pool2d(Tensor self, int[2] output_size) -> (Tensor, Tensor): MaxPool (even bins) or ReduceMax/ArgMax per bin.

    adaptive_max_pool3d(Tensor self, int[3] output_size) -> (Tensor, Tensor): the same, over 3 spatial dims (the
    spatial rank is output_size's length, which torch requires to be 2 or 3)."""
    return _adaptive_max_pool(self, output_size, len(output_size))


@opreg.impl("aten::max_pool2d_with_indices_backward")
def aten_max_pool2d_with_indices_backward(
    grad_output: Tensor,
    self: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
    indices: Tensor,
):
    """max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor: each gradient added at its maximum's place (ScatterElements with add over each plane)."""
    plane_shape = op18.Concat(op18.Shape(self, end=-2), [-1], axis=0)
    # ONNX Runtime's CPU ScatterElements adds float and double only: half types sum in float
    updates = grad_output
    if grad_output.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        updates = op18.Cast(grad_output, to=ir.DataType.FLOAT)
    zeros = op18.Reshape(op18.Expand(op18.CastLike(0, updates), op18.Shape(self)), plane_shape)
    grad = op18.ScatterElements(
        zeros,
        op18.Reshape(indices, plane_shape),
        op18.Reshape(updates, plane_shape),
        axis=-1,
        reduction="add",
    )
    grad = op18.Reshape(grad, op18.Shape(self))
    return grad if updates is grad_output else op18.CastLike(grad, grad_output)


# -- col2im / im2col ---------------------------------------------------------------------


@opreg.impl("aten::col2im")
def aten_col2im(
    self: Tensor,
    output_size: Sequence[int],
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
):
    """col2im(Tensor self, SymInt[2] output_size, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor: Col2Im."""
    x, added = (op18.Unsqueeze(self, [0]), True) if rank_of(self) == 2 else (self, False)
    image = op18.Col2Im(
        x,
        output_size,
        expand_param(kernel_size, 2),
        dilations=expand_param(dilation, 2),
        pads=symmetric_pads(padding, 2),
        strides=expand_param(stride, 2),
    )
    return _unbatch(image, added)


@opreg.impl("aten::im2col")
def aten_im2col(
    self: Tensor,
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
):
    """im2col(Tensor self, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor: a Slice per kernel offset, Concat, Reshape (any dtype, any sizes, exact).

    Offset ``o`` of a kernel of ``k`` (dilation ``d``) slices the padded side from ``o * d`` to
    ``d * (k - 1 - o)`` before its end, every ``stride``-th element: torch's window count, whatever
    the side's size, so the sizes may be dynamic."""
    x, added = _batched(self, 2)
    kernel, dilations, strides = expand_param(kernel_size, 2), expand_param(dilation, 2), expand_param(stride, 2)
    pads = expand_param(padding, 2)
    if any(pads):
        x = op18.Pad(x, [0, 0, *pads, 0, 0, *pads], np.array(0, dtype=x.dtype.numpy()))
    # (N, C, kh*kw, oh, ow): channel c*kh*kw + i*kw + j of the result is channel c at offset (i, j).
    windows = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = [o * d for o, d in zip(offset, dilations, strict=True)]
        ends = [-d * (k - 1 - o) or _TO_THE_END for o, d, k in zip(offset, dilations, kernel, strict=True)]
        windows.append(op18.Unsqueeze(op18.Slice(x, starts, ends, [2, 3], strides), [2]))
    patches = op18.Concat(*windows, axis=2)
    channels = self.shape[-3] if self.shape is not None else None
    if isinstance(channels, int):
        rows = [channels * math.prod(kernel)]
    else:
        rows = op18.Mul(op18.Shape(x, start=1, end=2), [math.prod(kernel)])
    windows_count = op18.Mul(op18.Shape(patches, start=3, end=4), op18.Shape(patches, start=4, end=5))
    shape = op18.Concat(op18.Shape(x, end=1), rows, windows_count, axis=0)
    return _unbatch(op18.Reshape(patches, shape, allowzero=1), added)


_TO_THE_END = np.iinfo(np.int64).max
"""A Slice end past any size."""
