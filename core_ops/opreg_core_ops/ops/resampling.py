"""Resampling: upsampling (Resize), grid sampling (GridSample), pixel (un)shuffle."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg
from opreg.ops import HALF_TYPES, Tensor, node_arg, rank_of

_TORCH_CUBIC_A = -0.75
"""The cubic convolution coefficient torch's bicubic interpolation uses (Resize's default is -0.75 too,
but says so only in the spec)."""


def _resize(input, output_size, scale_factors, mode: str, align_corners: bool, antialias: bool = False):
    """torch's upsample_* as Resize. The attributes used are all in Resize-18 and unchanged since."""
    if mode == "nearest":
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        attrs = dict(
            mode=mode,
            coordinate_transformation_mode="align_corners" if align_corners else "pytorch_half_pixel",
        )
        if mode == "cubic":
            attrs["cubic_coeff_a"] = _TORCH_CUBIC_A
        if antialias:  # torch's filter drops the taps outside the input and renormalizes: exclude_outside
            attrs.update(antialias=1, exclude_outside=1)
    if output_size is None:
        scales = np.array([1.0, 1.0, *scale_factors], dtype=np.float32)
        return op18.Resize(input, None, scales, **attrs)
    sizes = op18.Concat(op18.Shape(input, start=0, end=2), output_size, axis=0)
    return op18.Resize(input, None, None, sizes, **attrs)


@opreg.impl("aten::upsample_nearest1d.vec")
def aten_upsample_nearest1d(input: Tensor, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None):
    """upsample_nearest1d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor: Resize (nearest, asymmetric, floor)."""
    return _resize(input, output_size, scale_factors, "nearest", False)


@opreg.impl("aten::upsample_nearest2d.vec")
def aten_upsample_nearest2d(input: Tensor, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None):
    """upsample_nearest2d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor: Resize (nearest, asymmetric, floor)."""
    return _resize(input, output_size, scale_factors, "nearest", False)


@opreg.impl("aten::upsample_nearest3d.vec")
def aten_upsample_nearest3d(input: Tensor, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None):
    """upsample_nearest3d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor: Resize (nearest, asymmetric, floor)."""
    return _resize(input, output_size, scale_factors, "nearest", False)


@opreg.impl("aten::upsample_linear1d.vec")
@opreg.impl("aten::upsample_bilinear2d.vec")
@opreg.impl("aten::upsample_trilinear3d.vec")
def aten_upsample_linear(
    input: Tensor, output_size: Sequence[int] | None, align_corners: bool, scale_factors: Sequence[float] | None
):
    """upsample_linear1d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (linear).

    upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (linear).

    upsample_trilinear3d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (linear)."""
    return _resize(input, output_size, scale_factors, "linear", align_corners)


def _sized_by_output(node) -> bool:
    """Antialiasing with the output size only: given scale factors, torch derives its filter (and the
    sizes, in float64) from them, while Resize's antialias filter follows the sizes."""
    if node.target.__name__.endswith("vec"):
        return node_arg(node, 1, "output_size") is not None and node_arg(node, 3, "scale_factors") is None
    return node_arg(node, 3, "scales_h") is None and node_arg(node, 4, "scales_w") is None


@opreg.impl("aten::_upsample_bilinear2d_aa", predicate=_sized_by_output)
def aten_upsample_bilinear2d_aa(
    self: Tensor,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
):
    """_upsample_bilinear2d_aa(Tensor self, SymInt[2] output_size, bool align_corners, float? scales_h=None, float? scales_w=None) -> Tensor: Resize (linear, antialias: the filter widened by the downscale factor, taps outside the input dropped)."""
    return _resize(self, output_size, None, "linear", align_corners, antialias=True)


@opreg.impl("aten::_upsample_bilinear2d_aa.vec", predicate=_sized_by_output)
def aten_upsample_bilinear2d_aa_vec(
    input: Tensor, output_size: Sequence[int] | None, align_corners: bool, scale_factors: Sequence[float] | None
):
    """_upsample_bilinear2d_aa.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (linear, antialias)."""
    return _resize(input, output_size, scale_factors, "linear", align_corners, antialias=True)


@opreg.impl("aten::upsample_bicubic2d.vec")
def aten_upsample_bicubic2d(
    input: Tensor, output_size: Sequence[int] | None, align_corners: bool, scale_factors: Sequence[float] | None
):
    """upsample_bicubic2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor: Resize (cubic, a=-0.75)."""
    return _resize(input, output_size, scale_factors, "cubic", align_corners)


_GRID_PADDING = ("zeros", "border", "reflection")
"""GridSample's padding_mode for torch's padding_mode number."""

_GRID_SAMPLE = {
    18: (op18, ("bilinear", "nearest", "bicubic")),
    20: (op20, ("linear", "nearest", "cubic")),
}
"""GridSample's opset and its mode for torch's interpolation_mode number, by the version of the impl:
GridSample-20 renamed bilinear and bicubic, and rejects GridSample-16's names in a model of ai.onnx
20 or newer (so the opset-18 form is registered for 18 and 19 only)."""


def _grid_sample_inputs(input, grid):
    """(input, grid, out_type): 16-bit floats in float32 (ONNX Runtime's float16 GridSample is
    imprecise), with the type to cast the result back to (None: no cast)."""
    if input.dtype not in HALF_TYPES:
        return input, grid, None
    out_type = input.dtype
    return op18.Cast(input, to=ir.DataType.FLOAT), op18.Cast(grid, to=ir.DataType.FLOAT), out_type


@opreg.impl("aten::grid_sampler_2d", opset=(18, 19))
@opreg.impl("aten::grid_sampler_2d", opset=20)
def aten_grid_sampler_2d(
    input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int, align_corners: bool, *, opset: int
):
    """grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor: GridSample-16 (modes bilinear/nearest/bicubic), GridSample-20 from opset 20 (linear/nearest/cubic)."""
    grid_sample, modes = _GRID_SAMPLE[opset]
    input, grid, out_type = _grid_sample_inputs(input, grid)
    result = grid_sample.GridSample(
        input,
        grid,
        mode=modes[interpolation_mode],
        padding_mode=_GRID_PADDING[padding_mode],
        align_corners=int(align_corners),
    )
    return result if out_type is None else op18.Cast(result, to=out_type)


def _shuffle(x, factor: int, up: bool):
    """pixel (un)shuffle of x (*, C, H, W) as Reshape, Transpose, Reshape: exact for every dtype (ONNX Runtime
    has DepthToSpace/SpaceToDepth for floats only) and for empty tensors (allowzero: a 0 is a size)."""
    lead = rank_of(x) - 3
    r = op18.Constant(value_ints=[factor])
    head = op18.Shape(x, start=0, end=lead)
    c, h, w = (op18.Shape(x, start=lead + i, end=lead + i + 1) for i in range(3))
    if up:  # (*, C*r*r, H, W) -> (*, C, r, r, H, W) -> (*, C, H, r, W, r) -> (*, C, H*r, W*r)
        split = [op18.Div(c, op18.Mul(r, r)), r, r, h, w]
        perm = [0, 3, 1, 4, 2]
        joined = [split[0], op18.Mul(h, r), op18.Mul(w, r)]
    else:  # (*, C, H*r, W*r) -> (*, C, H, r, W, r) -> (*, C, r, r, H, W) -> (*, C*r*r, H, W)
        split = [c, op18.Div(h, r), r, op18.Div(w, r), r]
        perm = [0, 2, 4, 1, 3]
        joined = [op18.Mul(c, op18.Mul(r, r)), split[1], split[3]]
    y = op18.Reshape(x, op18.Concat(head, *split, axis=0), allowzero=1)
    y = op18.Transpose(y, perm=list(range(lead)) + [lead + d for d in perm])
    return op18.Reshape(y, op18.Concat(head, *joined, axis=0), allowzero=1)


@opreg.impl("aten::pixel_shuffle")
def aten_pixel_shuffle(self: Tensor, upscale_factor: int):
    """pixel_shuffle(Tensor self, int upscale_factor) -> Tensor: Reshape, Transpose, Reshape."""
    return _shuffle(self, upscale_factor, up=True)


@opreg.impl("aten::pixel_unshuffle")
def aten_pixel_unshuffle(self: Tensor, downscale_factor: int):
    """pixel_unshuffle(Tensor self, int downscale_factor) -> Tensor: Reshape, Transpose, Reshape."""
    return _shuffle(self, downscale_factor, up=False)
