"""Pooling, resampling and spatial rearrangement: max/avg/adaptive pools, upsampling
(Resize), reflection/replication padding, grid sampling, col2im/im2col,
pixel (un)shuffle, and dropout outside training."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg
from opreg_core_ops.ops._helpers import expand_param, node_arg, rank_of, symmetric_pads


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


# -- max pooling -------------------------------------------------------------------------


def _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, spatial: int, with_indices: bool):
    kernel = expand_param(kernel_size, spatial)
    x, added = _batched(self, spatial)
    pooled, indices = op18.MaxPool(
        x,
        kernel_shape=kernel,
        strides=expand_param(stride, spatial) if stride else kernel,
        pads=symmetric_pads(padding, spatial),
        dilations=expand_param(dilation, spatial),
        ceil_mode=int(ceil_mode),
    )
    if not with_indices:
        return _unbatch(pooled, added)
    # ONNX counts indices over the whole tensor, torch within each (n, c) plane.
    dims = _static_dims(x, 2)
    plane = math.prod(dims) if dims is not None else op18.ReduceProd(op18.Shape(x, start=2), keepdims=0)
    indices = op18.Mod(indices, plane)
    return _unbatch(pooled, added), _unbatch(indices, added)


def aten_max_pool1d(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
):
    """max_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], int[1] dilation=[1], bool ceil_mode=False) -> Tensor: MaxPool."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 1, with_indices=False)


def aten_max_pool2d(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
):
    """max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> Tensor: MaxPool."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2, with_indices=False)


def aten_max_pool3d(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    dilation: Sequence[int] = (1, 1, 1),
    ceil_mode: bool = False,
):
    """max_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False) -> Tensor: MaxPool."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3, with_indices=False)


def aten_max_pool1d_with_indices(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
):
    """max_pool1d_with_indices(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=0, int[1] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor): MaxPool (Indices made per-channel with Mod)."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 1, with_indices=True)


def aten_max_pool2d_with_indices(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
):
    """max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor): MaxPool (Indices made per-channel with Mod)."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2, with_indices=True)


def aten_max_pool3d_with_indices(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    dilation: Sequence[int] = (1, 1, 1),
    ceil_mode: bool = False,
):
    """max_pool3d_with_indices(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor): MaxPool (Indices made per-channel with Mod)."""
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3, with_indices=True)


# -- average pooling --------------------------------------------------------------------


def _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, spatial: int):
    kernel = expand_param(kernel_size, spatial)
    x, added = _batched(self, spatial)
    pooled = op18.AveragePool(
        x,
        kernel_shape=kernel,
        strides=expand_param(stride, spatial) if stride else kernel,
        pads=symmetric_pads(padding, spatial),
        ceil_mode=int(ceil_mode),
        count_include_pad=int(count_include_pad or divisor_override is not None),
    )
    if divisor_override is not None:  # full windows only (the predicate rejects ceil_mode): mean * size / divisor
        pooled = op18.Mul(pooled, op18.CastLike(math.prod(kernel) / divisor_override, pooled))
    return _unbatch(pooled, added)


def aten_avg_pool1d(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
):
    """avg_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], bool ceil_mode=False, bool count_include_pad=True) -> Tensor: AveragePool."""
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)


def aten_avg_pool2d(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
):
    """avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor: AveragePool (and Mul for divisor_override)."""
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)


def aten_avg_pool3d(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
):
    """avg_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor: AveragePool (and Mul for divisor_override)."""
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3)


def _avg_pool_covered(node) -> bool:
    """divisor_override is exact only when every window is whole (no ceil_mode)."""
    return node_arg(node, 6, "divisor_override") is None or not node_arg(node, 4, "ceil_mode", False)


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
    if all(d % s == 0 for d, s in zip(dims, size, strict=True)):
        kernel = [d // s for d, s in zip(dims, size, strict=True)]
        return _unbatch(op18.AveragePool(x, kernel_shape=kernel, strides=kernel), added)
    # Uneven bins: average each spatial dim in turn with a (size, out) matrix.
    rank = spatial + 2
    y = x
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
    return _unbatch(y, added)


def aten_adaptive_avg_pool1d(self, output_size: Sequence[int]):
    """adaptive_avg_pool1d(Tensor self, int[1] output_size) -> Tensor: GlobalAveragePool, AveragePool (even bins) or MatMul (uneven)."""
    return _adaptive_avg_pool(self, output_size, 1)


def aten_adaptive_avg_pool2d(self, output_size: Sequence[int]):
    """adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor: GlobalAveragePool, AveragePool (even bins) or MatMul (uneven)."""
    return _adaptive_avg_pool(self, output_size, 2)


def aten_adaptive_avg_pool2d_internal(self, output_size: Sequence[int]):
    """_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor: GlobalAveragePool, AveragePool (even bins) or MatMul (uneven)."""
    return _adaptive_avg_pool(self, output_size, 2)


def aten_adaptive_avg_pool3d(self, output_size: Sequence[int]):
    """adaptive_avg_pool3d(Tensor self, SymInt[3] output_size) -> Tensor: GlobalAveragePool, AveragePool (even bins) or MatMul (uneven)."""
    return _adaptive_avg_pool(self, output_size, 3)


def aten_adaptive_avg_pool3d_internal(self, output_size: Sequence[int]):
    """_adaptive_avg_pool3d(Tensor self, SymInt[3] output_size) -> Tensor: GlobalAveragePool, AveragePool (even bins) or MatMul (uneven)."""
    return _adaptive_avg_pool(self, output_size, 3)


def _static_spatial_output(node) -> bool:
    """Adaptive pools need static input sizes unless the output is all ones."""
    size = node_arg(node, 1, "output_size")
    value = node.args[0].meta.get("val")
    if isinstance(size, (list, tuple)) and all(s == 1 for s in size):
        return True
    return value is not None and all(isinstance(d, int) for d in value.shape) and all(isinstance(s, int) for s in size)


# -- upsampling (Resize) -------------------------------------------------------------------


def _resize(input, output_size, scale_factors, mode: str, align_corners: bool):
    """torch's upsample_* as Resize. The attributes used are all in Resize-18 and unchanged since."""
    if mode == "nearest":
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        attrs = dict(
            mode=mode,
            coordinate_transformation_mode="align_corners" if align_corners else "pytorch_half_pixel",
        )
        if mode == "cubic":
            attrs["cubic_coeff_a"] = -0.75
    if output_size is None:
        scales = np.array([1.0, 1.0, *scale_factors], dtype=np.float32)
        return op18.Resize(input, None, scales, **attrs)
    sizes = op18.Concat(op18.Shape(input, start=0, end=2), output_size, axis=0)
    return op18.Resize(input, None, None, sizes, **attrs)


def aten_upsample_nearest1d(input, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None):
    """upsample_nearest1d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor: Resize (nearest, asymmetric, floor)."""
    return _resize(input, output_size, scale_factors, "nearest", False)


def aten_upsample_nearest2d(input, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None):
    """upsample_nearest2d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor: Resize (nearest, asymmetric, floor)."""
    return _resize(input, output_size, scale_factors, "nearest", False)


def aten_upsample_nearest3d(input, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None):
    """upsample_nearest3d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor: Resize (nearest, asymmetric, floor)."""
    return _resize(input, output_size, scale_factors, "nearest", False)


def aten_upsample_linear1d(
    input, output_size: Sequence[int] | None, align_corners: bool, scale_factors: Sequence[float] | None
):
    """upsample_linear1d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (linear)."""
    return _resize(input, output_size, scale_factors, "linear", align_corners)


def aten_upsample_bilinear2d(
    input, output_size: Sequence[int] | None, align_corners: bool, scale_factors: Sequence[float] | None
):
    """upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (linear)."""
    return _resize(input, output_size, scale_factors, "linear", align_corners)


def aten_upsample_trilinear3d(
    input, output_size: Sequence[int] | None, align_corners: bool, scale_factors: Sequence[float] | None
):
    """upsample_trilinear3d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (linear)."""
    return _resize(input, output_size, scale_factors, "linear", align_corners)


def aten_upsample_bicubic2d(
    input, output_size: Sequence[int] | None, align_corners: bool, scale_factors: Sequence[float] | None
):
    """upsample_bicubic2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (cubic, a=-0.75)."""
    return _resize(input, output_size, scale_factors, "cubic", align_corners)


# -- padding ------------------------------------------------------------------------------


def _pad(self, padding, mode: str):
    if not isinstance(padding, (list, tuple)) or not all(isinstance(p, int) for p in padding):
        raise ValueError(f"{mode} padding needs static pad sizes, got {padding}")
    count = len(padding) // 2
    lead = [0] * (rank_of(self) - count)
    # torch lists (begin, end) pairs from the last dim backwards; ONNX all begins, then all ends.
    begins = [padding[2 * (count - 1 - i)] for i in range(count)]
    ends = [padding[2 * (count - 1 - i) + 1] for i in range(count)]
    return op18.Pad(self, lead + begins + lead + ends, mode=mode)


def aten_reflection_pad1d(self, padding: Sequence[int]):
    """reflection_pad1d(Tensor self, SymInt[2] padding) -> Tensor: Pad (reflect)."""
    return _pad(self, padding, "reflect")


def aten_reflection_pad2d(self, padding: Sequence[int]):
    """reflection_pad2d(Tensor self, SymInt[4] padding) -> Tensor: Pad (reflect)."""
    return _pad(self, padding, "reflect")


def aten_reflection_pad3d(self, padding: Sequence[int]):
    """reflection_pad3d(Tensor self, SymInt[6] padding) -> Tensor: Pad (reflect)."""
    return _pad(self, padding, "reflect")


def aten_replication_pad1d(self, padding: Sequence[int]):
    """replication_pad1d(Tensor self, SymInt[2] padding) -> Tensor: Pad (edge)."""
    return _pad(self, padding, "edge")


def aten_replication_pad2d(self, padding: Sequence[int]):
    """replication_pad2d(Tensor self, SymInt[4] padding) -> Tensor: Pad (edge)."""
    return _pad(self, padding, "edge")


def aten_replication_pad3d(self, padding: Sequence[int]):
    """replication_pad3d(Tensor self, SymInt[6] padding) -> Tensor: Pad (edge)."""
    return _pad(self, padding, "edge")


def _static_padding(node) -> bool:
    padding = node_arg(node, 1, "padding")
    return isinstance(padding, (list, tuple)) and all(isinstance(p, int) for p in padding)


# -- grid sampling ------------------------------------------------------------------------

_GRID_PADDING = ("zeros", "border", "reflection")


def aten_grid_sampler_2d(input, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    """grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor: GridSample-16 (modes bilinear/nearest/bicubic)."""
    return op18.GridSample(
        input,
        grid,
        mode=("bilinear", "nearest", "bicubic")[interpolation_mode],
        padding_mode=_GRID_PADDING[padding_mode],
        align_corners=int(align_corners),
    )


def aten_grid_sampler_2d_opset20(input, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    """grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor: GridSample-20 (modes linear/nearest/cubic)."""
    return op20.GridSample(
        input,
        grid,
        mode=("linear", "nearest", "cubic")[interpolation_mode],
        padding_mode=_GRID_PADDING[padding_mode],
        align_corners=int(align_corners),
    )


# -- col2im / im2col ---------------------------------------------------------------------


def aten_col2im(
    self,
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


def aten_im2col(
    self,
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
):
    """im2col(Tensor self, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor: Conv with a one-hot depthwise kernel, then Reshape."""
    x, added = _batched(self, 2)
    channels = x.shape[1]
    if not isinstance(channels, int):
        raise ValueError(f"im2col needs a static channel count, got {self.shape}")
    kh, kw = expand_param(kernel_size, 2)
    # Output channel c*kh*kw + i*kw + j picks input channel c at kernel offset (i, j).
    weight = np.zeros((channels, kh * kw, 1, kh, kw), dtype=np.float32)
    for i in range(kh):
        for j in range(kw):
            weight[:, i * kw + j, 0, i, j] = 1.0
    weight = weight.reshape(channels * kh * kw, 1, kh, kw)  # a constant in x's dtype
    patches = op18.Conv(
        x,
        weight,
        kernel_shape=[kh, kw],
        strides=expand_param(stride, 2),
        pads=symmetric_pads(padding, 2),
        dilations=expand_param(dilation, 2),
        group=channels,
    )
    return _unbatch(op18.Reshape(patches, [0, 0, -1]), added)


def _float_static_channels(node) -> bool:
    value = node.args[0].meta.get("val")
    return value is not None and value.is_floating_point() and isinstance(value.shape[-3], int)


# -- pixel shuffle ----------------------------------------------------------------------


def _as_4d(x):
    """x (*, C, H, W) as (B, C, H, W), and the leading shape to restore (None if already 4-D)."""
    if rank_of(x) == 4:
        return x, None
    lead = op18.Shape(x, start=0, end=-3)
    return op18.Reshape(x, op18.Concat([-1], op18.Shape(x, start=-3), axis=0)), lead


def _from_4d(y, lead):
    if lead is None:
        return y
    return op18.Reshape(y, op18.Concat(lead, op18.Shape(y, start=1), axis=0))


def aten_pixel_shuffle(self, upscale_factor: int):
    """pixel_shuffle(Tensor self, int upscale_factor) -> Tensor: DepthToSpace (CRD)."""
    x, lead = _as_4d(self)
    return _from_4d(op18.DepthToSpace(x, blocksize=upscale_factor, mode="CRD"), lead)


def aten_pixel_unshuffle(self, downscale_factor: int):
    """pixel_unshuffle(Tensor self, int downscale_factor) -> Tensor: SpaceToDepth, then Reshape/Transpose to torch's channel order."""
    x, lead = _as_4d(self)
    r2 = downscale_factor * downscale_factor
    y = op18.SpaceToDepth(x, blocksize=downscale_factor)  # channel (i*r + j)*C + c; torch wants c*r*r + i*r + j
    shape = op18.Shape(y)
    split = op18.Concat(op18.Shape(y, start=0, end=1), [r2, -1], op18.Shape(y, start=2), axis=0)
    y = op18.Reshape(op18.Transpose(op18.Reshape(y, split), perm=[0, 2, 1, 3, 4]), shape)
    return _from_4d(y, lead)


# -- dropout outside training --------------------------------------------------------------


def aten_dropout(input, p: float, train: bool):
    """dropout(Tensor input, float p, bool train) -> Tensor: Identity (eval only)."""
    return op18.Identity(input)


def aten_native_dropout(input, p: float, train: bool | None):
    """native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor): Identity and an all-true mask (eval only)."""
    return op18.Identity(input), op18.Expand(True, op18.Shape(input))


def _not_training(node) -> bool:
    return node_arg(node, 2, "train") is False or node_arg(node, 1, "p") == 0


def register(registry: opreg.Registrar) -> None:
    for name, fn in (
        ("max_pool1d", aten_max_pool1d),
        ("max_pool2d", aten_max_pool2d),
        ("max_pool3d", aten_max_pool3d),
        ("max_pool1d_with_indices", aten_max_pool1d_with_indices),
        ("max_pool2d_with_indices", aten_max_pool2d_with_indices),
        ("max_pool3d_with_indices", aten_max_pool3d_with_indices),
        ("avg_pool1d", aten_avg_pool1d),
        ("upsample_nearest1d.vec", aten_upsample_nearest1d),
        ("upsample_nearest2d.vec", aten_upsample_nearest2d),
        ("upsample_nearest3d.vec", aten_upsample_nearest3d),
        ("upsample_linear1d.vec", aten_upsample_linear1d),
        ("upsample_bilinear2d.vec", aten_upsample_bilinear2d),
        ("upsample_trilinear3d.vec", aten_upsample_trilinear3d),
        ("upsample_bicubic2d.vec", aten_upsample_bicubic2d),
        ("col2im", aten_col2im),
        ("pixel_shuffle", aten_pixel_shuffle),
        ("pixel_unshuffle", aten_pixel_unshuffle),
    ):
        registry.register(f"aten::{name}", fn, opset=18)
    registry.register("aten::avg_pool2d", aten_avg_pool2d, opset=18, predicate=_avg_pool_covered)
    registry.register("aten::avg_pool3d", aten_avg_pool3d, opset=18, predicate=_avg_pool_covered)
    for name, fn in (
        ("adaptive_avg_pool1d", aten_adaptive_avg_pool1d),
        ("adaptive_avg_pool2d", aten_adaptive_avg_pool2d),
        ("_adaptive_avg_pool2d", aten_adaptive_avg_pool2d_internal),
        ("adaptive_avg_pool3d", aten_adaptive_avg_pool3d),
        ("_adaptive_avg_pool3d", aten_adaptive_avg_pool3d_internal),
    ):
        registry.register(f"aten::{name}", fn, opset=18, predicate=_static_spatial_output)
    for name, fn in (
        ("reflection_pad1d", aten_reflection_pad1d),
        ("reflection_pad2d", aten_reflection_pad2d),
        ("reflection_pad3d", aten_reflection_pad3d),
        ("replication_pad1d", aten_replication_pad1d),
        ("replication_pad2d", aten_replication_pad2d),
        ("replication_pad3d", aten_replication_pad3d),
    ):
        registry.register(f"aten::{name}", fn, opset=18, predicate=_static_padding)
    registry.register("aten::grid_sampler_2d", aten_grid_sampler_2d, opset=(18, 19))
    registry.register("aten::grid_sampler_2d", aten_grid_sampler_2d_opset20, opset=20)
    registry.register("aten::im2col", aten_im2col, opset=18, predicate=_float_static_channels)
    registry.register("aten::dropout", aten_dropout, opset=18, predicate=_not_training)
    registry.register("aten::native_dropout", aten_native_dropout, opset=18, predicate=_not_training)
