"""torchvision's C++ ops to standard ONNX.

Where ONNX has the op at the target it is used: NonMaxSuppression (10),
RoiAlign (16, ``coordinate_transformation_mode`` for ``aligned``), MaxRoiPool
(1) and DeformConv (19). The others are decompositions over standard ops whose
arithmetic follows torchvision's CPU kernels (``torchvision/csrc/ops/cpu``):
``ps_roi_align`` is RoiAlign over every channel, each output bin taking its own
channel (PH*PW times the work of a fused kernel, exact); ``ps_roi_pool`` sums
each bin with two masked MatMuls; ``deform_conv2d`` below ai.onnx 19 samples
its inputs with GatherElements and multiplies with MatMul.

ONNX Runtime (1.32) has no kernel for RoiAlign and MaxRoiPool version 22, which
only widened their types, so from ai.onnx 22 on (the default ``onnx`` target
is 23) the RoI ops are decompositions too: RoIAlign samples each bin's grid
with GridSample (border padding, as the kernel clamps samples within a pixel
of the map to its edge; samples farther out masked to 0) and averages; its
memory grows with N*C*K*PH*PW*grid_h*grid_w (an adaptive sampling ratio takes
the largest roi's grid for all). RoIPool takes each bin's maximum over a
mask, memory K*C*PH*PW*H*W: it suits small maps (torchvision's detectors use
RoIAlign).

Every impl takes the op's arguments as torchvision's schema names them.
Half-precision inputs are computed in float, as ONNX's NonMaxSuppression,
RoiAlign and MaxRoiPool run float and double only.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset19 as op19
from onnxscript.onnx_opset import opset22 as op22

import opreg
from opreg.ops import Tensor

FLOAT = ir.DataType.FLOAT
INT64 = ir.DataType.INT64
INT32 = ir.DataType.INT32
DEFORM_CONV_OPSET = 19
"""The ai.onnx version that introduced DeformConv."""
LAST_ROI_OPSET = 21
"""The newest ai.onnx version whose RoiAlign (16) and MaxRoiPool (1) ONNX Runtime runs: 1.32 has no kernel
for their version 22 (which only adds types), so a model importing ai.onnx 22 cannot hold them."""
GRID_OPSET = LAST_ROI_OPSET + 1
"""From here on the RoI ops are decompositions (GridSample for RoIAlign)."""
MAX_FLOAT32 = float(np.finfo(np.float32).max)
"""``FLT_MAX``: what torchvision's roi_pool starts each bin's maximum from."""


# -- helpers --------------------------------------------------------------------------------------


def _float(x: Tensor) -> Tensor:
    """``x`` in float or double (ONNX's RoI ops take no half types)."""
    return x if x.dtype in (FLOAT, ir.DataType.DOUBLE) else op18.Cast(x, to=FLOAT)


def _like(result: Tensor, reference: Tensor) -> Tensor:
    return result if result.dtype == reference.dtype else op18.Cast(result, to=reference.dtype)


def _column(rois: Tensor, start: int, end: int) -> Tensor:
    """``rois[:, start:end]``."""
    return op18.Slice(rois, [start], [end], [1])


def _batch_indices(rois: Tensor) -> Tensor:
    """``rois[:, 0]`` as int64 image indices (truncated, as the C++ kernels' ``int`` cast does)."""
    return op18.Cast(op18.Reshape(_column(rois, 0, 1), [-1]), to=INT64)


def _scalar(value: float, like: Tensor) -> Tensor:
    return op18.CastLike(op18.Constant(value_float=float(value)), like)


def _round_half_away(x: Tensor) -> Tensor:
    """C's ``round``: halves away from zero (ONNX's Round goes to even)."""
    whole = op18.Cast(op18.Cast(x, to=INT64), to=x.dtype)  # truncates towards zero
    fraction = op18.Sub(x, whole)
    half = _scalar(0.5, x)
    up = op18.Cast(op18.GreaterOrEqual(fraction, half), to=x.dtype)
    down = op18.Cast(op18.LessOrEqual(fraction, op18.Neg(half)), to=x.dtype)
    return op18.Sub(op18.Add(whole, up), down)


def _bin_edges(start: Tensor, size: Tensor, bins: int, upper: Tensor) -> tuple[Tensor, Tensor]:
    """The integer bins of torchvision's roi_pool/ps_roi_pool along one axis: ``[floor(p * size / bins),
    ceil((p + 1) * size / bins))`` shifted by ``start`` and clipped to ``[0, upper]``, for each roi (rows)
    and bin (columns). ``size`` is the roi's extent (float, shape (K, 1)), ``start`` its first index (int)."""
    bin_size = op18.Div(size, op18.CastLike(op18.Constant(value_float=float(bins)), size))
    index = op18.CastLike(op18.Constant(value=ir.tensor(np.arange(bins + 1, dtype=np.float32))), size)
    scaled = op18.Mul(index, bin_size)  # (K, bins + 1): p * bin_size, as the kernel computes it
    lower = op18.Cast(op18.Floor(op18.Slice(scaled, [0], [bins], [1])), to=INT64)
    higher = op18.Cast(op18.Ceil(op18.Slice(scaled, [1], [bins + 1], [1])), to=INT64)
    zero = op18.Constant(value_int=0)
    lower = op18.Min(op18.Max(op18.Add(lower, start), zero), upper)
    higher = op18.Min(op18.Max(op18.Add(higher, start), zero), upper)
    return lower, higher


def _inside(lower: Tensor, higher: Tensor, length: Tensor) -> Tensor:
    """``lower[k, p] <= i < higher[k, p]`` for ``i`` in ``range(length)``: shape (K, bins, length)."""
    positions = op18.Range(op18.Constant(value_int=0), length, op18.Constant(value_int=1))
    low = op18.Unsqueeze(lower, [2])
    high = op18.Unsqueeze(higher, [2])
    return op18.And(op18.GreaterOrEqual(positions, low), op18.Less(positions, high))


def _dims(x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``N, C, H, W`` of an NCHW tensor as 0-d int64 values."""
    shape = op18.Shape(x)
    return tuple(op18.Squeeze(op18.Slice(shape, [i], [i + 1], [0]), [0]) for i in range(4))  # type: ignore[return-value]


def _channel_mapping(count: Tensor, channels_out: int, pooled_height: int, pooled_width: int) -> Tensor:
    """The ps ops' second output: the input channel each output element read, ``(c_out * PH + ph) * PW + pw``,
    as int32 of shape (K, C_out, PH, PW)."""
    mapping = np.arange(channels_out * pooled_height * pooled_width, dtype=np.int32)
    mapping = mapping.reshape(1, channels_out, pooled_height, pooled_width)
    shape = op18.Concat(op18.Reshape(count, [1]), op18.Constant(value_ints=[1, 1, 1]), axis=0)
    return op18.Tile(op18.Constant(value=ir.tensor(mapping)), shape)


def _position_sensitive(
    pooled: Tensor, count: Tensor, channels_out: int, pooled_height: int, pooled_width: int
) -> Tensor:
    """From ``pooled`` (K, C, PH, PW), bin (ph, pw) of each output channel from input channel
    ``(c_out * PH + ph) * PW + pw``: shape (K, C_out, PH, PW)."""
    bins = pooled_height * pooled_width
    grouped = op18.Reshape(pooled, op18.Concat(op18.Reshape(count, [1]), [channels_out, bins, bins], axis=0))
    diagonal = np.arange(bins, dtype=np.int64).reshape(1, 1, bins, 1)  # channel sub-index == bin
    where = op18.Concat(op18.Shape(grouped, end=3), [1], axis=0)  # (K, C_out, bins, 1)
    picked = op18.GatherElements(grouped, op18.Expand(op18.Constant(value=ir.tensor(diagonal)), where), axis=3)
    return op18.Reshape(
        picked, op18.Concat(op18.Reshape(count, [1]), [channels_out, pooled_height, pooled_width], axis=0)
    )


def _channels_out(input: Tensor, pooled_height: int, pooled_width: int, op: str) -> int:
    channels = input.shape[1] if input.shape is not None else None
    if not isinstance(channels, int):
        raise opreg.ExportError(f"torchvision::{op} needs a static channel count, got {input.shape}")
    if channels % (pooled_height * pooled_width):
        raise opreg.ExportError(
            f"torchvision::{op}: {channels} input channels are not a multiple of pooled_height * pooled_width "
            f"= {pooled_height * pooled_width}"
        )
    return channels // (pooled_height * pooled_width)


# -- nms --------------------------------------------------------------------------------------------


@opreg.impl("torchvision::nms", opset=18)
def torchvision_nms(dets: Tensor, scores: Tensor, iou_threshold: float):
    """nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor: NonMaxSuppression over one batch and
    class, keeping up to every box; its selected indices, by decreasing score (ties: the lower index first,
    as torchvision's stable sort)."""
    boxes = op18.Unsqueeze(_float(dets), [0])  # (1, N, 4); ONNX's y1, x1, y2, x2 order gives the same IoU
    ranked = op18.Unsqueeze(_float(scores), [0, 1])  # (1, 1, N)
    keep_all = op18.Shape(dets, start=0, end=1)
    threshold = op18.Constant(value_floats=[float(iou_threshold)])
    selected = op18.NonMaxSuppression(boxes, ranked, keep_all, threshold)
    return op18.Reshape(_column(selected, 2, 3), [-1])


# -- roi_align ---------------------------------------------------------------------------------------


@opreg.impl("torchvision::roi_align", opset=(18, LAST_ROI_OPSET))
@opreg.impl("torchvision::roi_align", opset=GRID_OPSET)
def torchvision_roi_align(
    input: Tensor,
    rois: Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
    *,
    opset: int,
):
    """roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width,
    int sampling_ratio, bool aligned) -> Tensor: RoiAlign-16, average mode; ``aligned`` is the half_pixel
    coordinate transformation (output_half_pixel otherwise), a sampling ratio of 0 or less adaptive. From
    ai.onnx 22, where ONNX Runtime has no RoiAlign kernel, GridSample at each bin's sampling grid, averaged
    (see the module)."""
    pooled = (int(pooled_height), int(pooled_width))
    return _like(_bin_averages(input, rois, spatial_scale, pooled, int(sampling_ratio), aligned, opset=opset), input)


@opreg.impl("torchvision::ps_roi_align", opset=(18, LAST_ROI_OPSET))
@opreg.impl("torchvision::ps_roi_align", opset=GRID_OPSET)
def torchvision_ps_roi_align(
    input: Tensor,
    rois: Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    *,
    opset: int,
):
    """ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width,
    int sampling_ratio) -> (Tensor, Tensor): RoIAlign (half pixel; RoiAlign-16, or GridSample from ai.onnx 22)
    over every channel, bin (ph, pw) of output channel c taken from input channel (c * PH + ph) * PW + pw; a
    bin whose adaptive sampling grid is empty (a roi of size (-PH, 0]) is NaN, as torchvision divides by its
    zero sample count; and the channel mapping."""
    channels_out = _channels_out(input, pooled_height, pooled_width, "ps_roi_align")
    pooled = (int(pooled_height), int(pooled_width))
    count = op18.Shape(rois, start=0, end=1)
    averaged = _bin_averages(input, rois, spatial_scale, pooled, int(sampling_ratio), True, opset=opset, floor=False)
    picked = _position_sensitive(averaged, count, channels_out, *pooled)
    if opset < GRID_OPSET and sampling_ratio <= 0:  # RoiAlign floors the count at 1, torchvision's does not:
        boxes = _column(_float(rois), 1, 5)  # count = ceil(h / PH) * ceil(w / PW), 0 for a point roi (NaN)
        scale = _scalar(spatial_scale, boxes)
        half = _scalar(0.5, boxes)
        start = op18.Sub(op18.Mul(_column(boxes, 0, 2), scale), half)
        end = op18.Sub(op18.Mul(_column(boxes, 2, 4), scale), half)
        grid = op18.Ceil(op18.Div(op18.Sub(end, start), op18.CastLike(op18.Constant(
            value_floats=[float(pooled_width), float(pooled_height)]), boxes)))  # fmt: skip
        samples = op18.ReduceProd(grid, [1], keepdims=1)  # (K, 1)
        empty = op18.Reshape(op18.Equal(samples, _scalar(0.0, samples)), [-1, 1, 1, 1])
        picked = op18.Where(empty, op18.CastLike(op18.Constant(value_float=float("nan")), picked), picked)
    return _like(picked, input), _channel_mapping(count, channels_out, *pooled)


def _bin_averages(input: Tensor, rois: Tensor, spatial_scale: float, pooled: tuple[int, int], sampling_ratio: int,
                  aligned: bool, *, opset: int, floor: bool = True) -> Tensor:  # fmt: skip
    """RoIAlign: each roi's bins averaged, (K, C, PH, PW) in float or double. Up to ai.onnx 21 RoiAlign-16,
    average mode: ``aligned`` is its half_pixel coordinate transformation (output_half_pixel otherwise), a
    sampling ratio of 0 or less adaptive, and a bin without samples averages 0; from ai.onnx 22, where ONNX
    Runtime has no RoiAlign kernel, :func:`_sampled_bins` (GridSample), where a bin without samples is NaN
    unless ``floor`` (the sample count floored at 1, as RoiAlign's)."""
    if opset >= GRID_OPSET:
        return _sampled_bins(input, rois, spatial_scale, pooled, sampling_ratio, aligned, floor)
    return op18.RoiAlign(
        _float(input), _column(_float(rois), 1, 5), _batch_indices(rois),
        coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel", mode="avg",
        output_height=pooled[0], output_width=pooled[1], sampling_ratio=max(sampling_ratio, 0),
        spatial_scale=float(spatial_scale),
    )  # fmt: skip


def _sampled_bins(input: Tensor, rois: Tensor, spatial_scale: float, pooled: tuple[int, int], sampling_ratio: int,
                  aligned: bool, floor_count: bool) -> Tensor:  # fmt: skip
    """RoIAlign without RoiAlign: each bin's sample sum over its count, (K, C, PH, PW) (see the module).

    Follows torchvision's ``roi_align_forward_kernel_impl``: corners ``x * scale`` (minus 0.5 when
    ``aligned``; otherwise a size of at least 1), ``grid = sampling_ratio`` or ``ceil(size / pooled)`` samples
    per bin at ``(start + p * bin) + (i + 0.5) * bin / grid``, divided by ``grid_h * grid_w`` (at least 1 when
    ``floor_count``, as RoIAlign does; ``ps_roi_align`` divides by 0)."""
    data = _float(input)
    boxes = _column(_float(rois), 1, 5)
    scaled = op18.Sub(op18.Mul(boxes, _scalar(spatial_scale, boxes)), _scalar(0.5 if aligned else 0.0, boxes))
    start = _column(scaled, 0, 2)  # (K, 2): x, y
    size = op18.Sub(_column(scaled, 2, 4), start)
    if not aligned:
        size = op18.Max(size, _scalar(1.0, size))
    pooled_xy = op18.CastLike(op18.Constant(value_floats=[float(pooled[1]), float(pooled[0])]), size)
    bin_size = op18.Div(size, pooled_xy)
    if sampling_ratio > 0:
        grid = op18.Expand(
            op18.CastLike(op18.Constant(value_floats=[float(sampling_ratio)] * 2), size), op18.Shape(size)
        )
    else:
        grid = op18.Ceil(op18.Div(size, pooled_xy))
    count = op18.ReduceProd(grid, [1], keepdims=0)  # (K,)
    if floor_count:
        count = op18.Max(count, _scalar(1.0, count))
    # the grid every roi is sampled on: the largest roi's (at least 1), masked per roi
    ones = op18.CastLike(op18.Constant(value=ir.tensor(np.ones((1, 2), dtype=np.float32))), grid)
    largest = op18.ReduceMax(op18.Concat(grid, ones, axis=0), [0], keepdims=0)
    largest = op18.Cast(largest, to=INT64)
    _, _, height, width = _dims(input)
    axes = []
    for axis, (bins, extent) in enumerate(((pooled[1], width), (pooled[0], height))):  # x, then y
        samples = op18.Squeeze(op18.Slice(largest, [axis], [axis + 1]), [0])
        index = op18.CastLike(op18.Range(op18.Constant(value_int=0), samples, op18.Constant(value_int=1)), size)
        p = op18.CastLike(op18.Constant(value=ir.tensor(np.arange(bins, dtype=np.float32).reshape(1, bins, 1))), size)
        origin = op18.Unsqueeze(_column(start, axis, axis + 1), [2])  # (K, 1, 1)
        step = op18.Unsqueeze(_column(bin_size, axis, axis + 1), [2])
        count_axis = op18.Unsqueeze(_column(grid, axis, axis + 1), [2])
        offset = op18.Div(op18.Mul(op18.Add(index, _scalar(0.5, index)), step), count_axis)
        position = op18.Add(op18.Add(origin, op18.Mul(p, step)), offset)  # (K, bins, samples)
        extent_f = op18.CastLike(extent, position)
        valid = op18.And(op18.And(op18.GreaterOrEqual(position, _scalar(-1.0, position)),
                                  op18.LessOrEqual(position, extent_f)), op18.Less(index, count_axis))  # fmt: skip
        normalized = op18.Sub(op18.Div(op18.Add(op18.Mul(position, _scalar(2.0, position)), _scalar(1.0, position)),
                                       extent_f), _scalar(1.0, position))  # fmt: skip  # align_corners=0
        axes.append((normalized, valid))
    (x_norm, x_valid), (y_norm, y_valid) = axes
    # (K, PH, Gy, PW, Gx): the y of the row, the x of the column
    y_full = op18.Unsqueeze(y_norm, [3, 4])
    x_full = op18.Unsqueeze(x_norm, [1, 2])
    shape = op18.Shape(op18.Add(y_full, x_full))
    points = op18.Concat(op18.Unsqueeze(op18.Expand(x_full, shape), [5]), op18.Unsqueeze(op18.Expand(y_full, shape),
                                                                                        [5]), axis=5)  # fmt: skip
    columns = op18.Mul(op18.Shape(points, start=3, end=4), op18.Shape(points, start=4, end=5))
    batch = op18.Shape(data, start=0, end=1)
    grid_points = op18.Expand(op18.Reshape(points, op18.Concat([1, -1], columns, [2], axis=0)),  # -1: 0 rois too
                              op18.Concat(batch, [1, 1, 1], axis=0))  # fmt: skip
    sampled = op22.GridSample(data, op18.CastLike(grid_points, data), align_corners=0, mode="linear",
                              padding_mode="border")  # fmt: skip  # (N, C, K*PH*Gy, PW*Gx)
    per_roi = op18.Reshape(sampled, op18.Concat(batch, op18.Shape(data, start=1, end=2), op18.Shape(points, end=5),
                                                axis=0))  # fmt: skip  # (N, C, K, PH, Gy, PW, Gx)
    per_roi = op18.Transpose(per_roi, perm=[0, 2, 1, 3, 4, 5, 6])  # (N, K, C, ...)
    count_rois = op18.Shape(rois, start=0, end=1)
    which = op18.Concat(op18.Unsqueeze(_batch_indices(rois), [1]), op18.Unsqueeze(op18.Range(
        op18.Constant(value_int=0), op18.Squeeze(count_rois, [0]), op18.Constant(value_int=1)), [1]), axis=1)  # fmt: skip
    own = op18.GatherND(per_roi, which)  # (K, C, PH, Gy, PW, Gx): each roi on its own image
    valid = op18.And(op18.Unsqueeze(y_valid, [1, 4, 5]), op18.Unsqueeze(x_valid, [1, 2, 3]))  # (K, 1, PH, Gy, PW, Gx)
    summed = op18.ReduceSum(op18.Where(valid, own, _scalar(0.0, own)), [3, 5], keepdims=0)  # (K, C, PH, PW)
    return op18.Div(summed, op18.Reshape(op18.CastLike(count, summed), [-1, 1, 1, 1]))


# -- roi_pool ----------------------------------------------------------------------------------------


def _pool_bins(rois: Tensor, spatial_scale: float, pooled: tuple[int, int], height: Tensor, width: Tensor,
               plus_one: int, clip_minus: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Row and column bins (lower, higher), each (K, P), of torchvision's integer RoI pooling:
    corners rounded half away from zero, a size of ``end - start + plus_one`` (at least 1),
    bins clipped to ``[0, extent - clip_minus]``."""
    boxes = _column(_float(rois), 1, 5)
    corners = op18.Cast(_round_half_away(op18.Mul(boxes, _scalar(spatial_scale, boxes))), to=INT64)
    start_w, start_h = _column(corners, 0, 1), _column(corners, 1, 2)
    end_w, end_h = _column(corners, 2, 3), _column(corners, 3, 4)
    one = op18.Constant(value_int=1)
    extra = op18.Constant(value_int=plus_one)
    size_w = op18.Cast(op18.Max(op18.Add(op18.Sub(end_w, start_w), extra), one), to=FLOAT)
    size_h = op18.Cast(op18.Max(op18.Add(op18.Sub(end_h, start_h), extra), one), to=FLOAT)
    clip = op18.Constant(value_int=clip_minus)
    rows = _bin_edges(start_h, size_h, pooled[0], op18.Sub(height, clip))
    cols = _bin_edges(start_w, size_w, pooled[1], op18.Sub(width, clip))
    return (*rows, *cols)


def _roi_pool_regions(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                      pooled_width: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """For torchvision's roi_pool bins: the values (K, C, 1, 1, H, W) of each roi's image, the bins' regions
    (K, 1, PH, PW, H, W), and H * W as a 0-d value."""
    data = _float(input)
    _, _, height, width = _dims(input)
    row_low, row_high, col_low, col_high = _pool_bins(
        rois, spatial_scale, (pooled_height, pooled_width), height, width, plus_one=1, clip_minus=0
    )
    rows = _inside(row_low, row_high, height)  # (K, PH, H)
    cols = _inside(col_low, col_high, width)  # (K, PW, W)
    region = op18.And(op18.Unsqueeze(rows, [2, 4]), op18.Unsqueeze(cols, [1, 3]))  # (K, PH, PW, H, W)
    image = op18.Gather(data, _batch_indices(rois), axis=0)  # (K, C, H, W)
    return op18.Unsqueeze(image, [2, 3]), op18.Unsqueeze(region, [1]), op18.Mul(height, width), data


def _roi_pool_argmax(values: Tensor, region: Tensor, pooled: Tensor, area: Tensor) -> Tensor:
    """Each bin's first position (``h * W + w``) holding its maximum ``pooled`` above ``-FLT_MAX``, else -1."""
    hit = op18.And(region, op18.Equal(values, op18.Unsqueeze(pooled, [4, 5])))  # (K, C, PH, PW, H, W)
    hit = op18.And(hit, op18.Greater(values, _scalar(-MAX_FLOAT32, values)))  # the kernel starts from -FLT_MAX
    flat = op18.Reshape(hit, op18.Concat(op18.Shape(hit, end=4), op18.Reshape(area, [1]), axis=0))
    positions = op18.Range(op18.Constant(value_int=0), area, op18.Constant(value_int=1))
    first = op18.ReduceMin(op18.Where(flat, positions, area), [-1], keepdims=0)
    return op18.Cast(op18.Where(op18.Equal(first, area), op18.Constant(value_int=-1), first), to=INT32)


@opreg.impl("torchvision::roi_pool", opset=(18, LAST_ROI_OPSET))
@opreg.impl("torchvision::roi_pool", opset=GRID_OPSET)
def torchvision_roi_pool(
    input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int, pooled_width: int, *, opset: int
):
    """roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width)
    -> (Tensor, Tensor): MaxRoiPool (from ai.onnx 22, where ONNX Runtime has no MaxRoiPool kernel, each bin's
    maximum over its region from ``-FLT_MAX``, 0 when empty, memory K*C*PH*PW*H*W); the argmax (int32,
    ``h * W + w`` of each bin's first maximum, -1 for an empty bin) by a decomposition of the same memory,
    which inference never reads (the lean pass drops it)."""
    values, region, area, data = _roi_pool_regions(input, rois, spatial_scale, pooled_height, pooled_width)
    if opset >= GRID_OPSET:
        lowest = _scalar(-MAX_FLOAT32, values)
        counted = op18.Where(op18.And(region, op18.Not(op18.IsNaN(values))), values, lowest)
        pooled = op18.Max(op18.ReduceMax(counted, [4, 5], keepdims=0), lowest)
        covered = op18.ReduceSum(op18.Cast(region, to=FLOAT), [4, 5], keepdims=0)  # (K, 1, PH, PW) pixels per bin
        pooled = op18.Where(op18.LessOrEqual(covered, _scalar(0.0, covered)), _scalar(0.0, pooled), pooled)
    else:
        pooled = op18.MaxRoiPool(data, _float(rois), pooled_shape=[int(pooled_height), int(pooled_width)],
                                 spatial_scale=float(spatial_scale))  # fmt: skip
    return _like(pooled, input), _roi_pool_argmax(values, region, pooled, area)


@opreg.impl("torchvision::ps_roi_pool", opset=18)
def torchvision_ps_roi_pool(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                            pooled_width: int):  # fmt: skip
    """ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width)
    -> (Tensor, Tensor): each bin's mean (0 when empty), as torchvision bins it (rounded corners, size at
    least 1, bins clipped to ``[0, H - 1]``), by two masked MatMuls per image; and the channel mapping."""
    channels_out = _channels_out(input, pooled_height, pooled_width, "ps_roi_pool")
    data = _float(input)
    _, _, height, width = _dims(input)
    row_low, row_high, col_low, col_high = _pool_bins(
        rois, spatial_scale, (pooled_height, pooled_width), height, width, plus_one=0, clip_minus=1
    )
    rows = op18.Cast(_inside(row_low, row_high, height), to=data.dtype)  # (K, PH, H)
    cols = op18.Cast(_inside(col_low, col_high, width), to=data.dtype)  # (K, PW, W)
    image = op18.Gather(data, _batch_indices(rois), axis=0)  # (K, C, H, W)
    summed = op18.MatMul(op18.MatMul(op18.Unsqueeze(rows, [1]), image), op18.Unsqueeze(op18.Transpose(
        cols, perm=[0, 2, 1]), [1]))  # fmt: skip  # (K, C, PH, PW)
    area = op18.Mul(op18.Unsqueeze(op18.Sub(row_high, row_low), [2]), op18.Unsqueeze(op18.Sub(col_high, col_low), [1]))
    area = op18.Cast(op18.Unsqueeze(area, [1]), to=data.dtype)  # (K, 1, PH, PW)
    empty = op18.LessOrEqual(area, _scalar(0.0, area))
    mean = op18.Where(empty, _scalar(0.0, summed), op18.Div(summed, op18.Max(area, _scalar(1.0, area))))
    count = op18.Shape(rois, start=0, end=1)
    picked = _position_sensitive(mean, count, channels_out, pooled_height, pooled_width)
    return _like(picked, input), _channel_mapping(count, channels_out, pooled_height, pooled_width)


# -- deform_conv2d ---------------------------------------------------------------------------------------


def _deform_arguments(weight: Tensor, groups: int, offset_groups: int) -> tuple[int, int]:
    if weight.shape is None or not all(isinstance(d, int) for d in weight.shape):
        raise opreg.ExportError(f"torchvision::deform_conv2d needs a weight of static shape, got {weight.shape}")
    return int(weight.shape[2]), int(weight.shape[3])


def _deform_conv(input: Tensor, weight: Tensor, offset: Tensor, mask: Tensor, bias: Tensor, stride: tuple,
                 pad: tuple, dilation: tuple, groups: int, offset_groups: int, use_mask: bool) -> Tensor:  # fmt: skip
    """DeformConv-19 with torchvision's arguments."""
    (stride_h, stride_w), (pad_h, pad_w), (dilation_h, dilation_w) = stride, pad, dilation
    kernel_h, kernel_w = _deform_arguments(weight, groups, offset_groups)
    data = _float(input)
    inputs = [data, op18.CastLike(weight, data), op18.CastLike(offset, data), op18.CastLike(bias, data)]
    if use_mask:
        inputs.append(op18.CastLike(mask, data))
    result = op19.DeformConv(
        *inputs, dilations=[int(dilation_h), int(dilation_w)], group=int(groups), kernel_shape=[kernel_h, kernel_w],
        offset_group=int(offset_groups), pads=[int(pad_h), int(pad_w), int(pad_h), int(pad_w)],
        strides=[int(stride_h), int(stride_w)],
    )  # fmt: skip
    return _like(result, input)


@opreg.impl("torchvision::deform_conv2d", opset=18)
@opreg.impl("torchvision::deform_conv2d", opset=DEFORM_CONV_OPSET)
def torchvision_deform_conv2d(
    input: Tensor,
    weight: Tensor,
    offset: Tensor,
    mask: Tensor,
    bias: Tensor,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
    *,
    opset: int,
):
    """deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h,
    SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups,
    SymInt offset_groups, bool use_mask) -> Tensor: DeformConv-19 (the mask input only with ``use_mask``); at
    ai.onnx 18 each kernel tap samples its channels bilinearly at its offset position (zero outside the image,
    as torchvision's ``bilinear_interpolate``) with GatherElements, times the mask, then a grouped MatMul with
    the weight."""
    if opset >= DEFORM_CONV_OPSET:
        return _deform_conv(input, weight, offset, mask, bias, (stride_h, stride_w), (pad_h, pad_w),
                            (dilation_h, dilation_w), groups, offset_groups, use_mask)  # fmt: skip
    kernel_h, kernel_w = _deform_arguments(weight, groups, offset_groups)
    taps = kernel_h * kernel_w
    data = _float(input)
    batch, channels, height, width = _dims(input)
    static_channels = input.shape[1] if input.shape is not None else None
    if not isinstance(static_channels, int):
        raise opreg.ExportError(f"torchvision::deform_conv2d needs a static channel count, got {input.shape}")
    out_h = op18.Squeeze(op18.Shape(offset, start=2, end=3), [0])
    out_w = op18.Squeeze(op18.Shape(offset, start=3, end=4), [0])
    zero, one = op18.Constant(value_int=0), op18.Constant(value_int=1)
    y, x = _deform_positions(data, offset, batch, (out_h, out_w), (stride_h, stride_w), (pad_h, pad_w),
                             (dilation_h, dilation_w), (kernel_h, kernel_w), offset_groups, zero, one)  # fmt: skip
    per_group = static_channels // int(offset_groups)
    sampled = _deform_sampled(data, offset, (batch, channels, height, width), y, x, per_group, taps, offset_groups,
                              zero, one)  # fmt: skip
    if use_mask:
        masks = op18.Reshape(op18.CastLike(mask, data), op18.Concat(
            op18.Reshape(batch, [1]), [int(offset_groups), 1, taps], op18.Shape(offset, start=2), axis=0))  # fmt: skip
        sampled = op18.Mul(sampled, masks)
    # grouped convolution as MatMul: (groups, O/groups, C/groups*T) @ (B, groups, C/groups*T, oh*ow)
    columns = op18.Reshape(sampled, op18.Concat(op18.Reshape(batch, [1]), [int(groups), -1], op18.Reshape(
        op18.Mul(out_h, out_w), [1]), axis=0))  # fmt: skip
    kernels = op18.Reshape(op18.CastLike(weight, data), [int(groups), -1, (static_channels // int(groups)) * taps])
    out = op18.MatMul(kernels, columns)  # (B, groups, O/groups, oh*ow)
    out = op18.Reshape(out, op18.Concat(op18.Reshape(batch, [1]), [-1], op18.Shape(offset, start=2), axis=0))
    out = op18.Add(out, op18.Reshape(op18.CastLike(bias, data), [1, -1, 1, 1]))
    return _like(out, input)


def _deform_positions(data: Tensor, offset: Tensor, batch: Tensor, out_size: tuple, stride: tuple, pad: tuple,
                      dilation: tuple, kernel: tuple[int, int], offset_groups: int, zero: Tensor,
                      one: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Where each kernel tap samples, its offsets added: rows and columns, (B, G, T, oh, ow), fractional
    (``out_size``, ``stride``, ``pad``, ``dilation`` and ``kernel`` are (h, w) pairs)."""
    (out_h, out_w), (stride_h, stride_w), (pad_h, pad_w), (dilation_h, dilation_w) = out_size, stride, pad, dilation
    kernel_h, kernel_w = kernel
    taps = kernel_h * kernel_w
    # base positions: (out_y * stride - pad) + i * dilation, for each tap (T) and output row / column
    rows = op18.Cast(op18.Sub(op18.Mul(op18.Range(zero, out_h, one), op18.Constant(value_int=int(stride_h))),
                              op18.Constant(value_int=int(pad_h))), to=data.dtype)  # fmt: skip
    cols = op18.Cast(op18.Sub(op18.Mul(op18.Range(zero, out_w, one), op18.Constant(value_int=int(stride_w))),
                              op18.Constant(value_int=int(pad_w))), to=data.dtype)  # fmt: skip
    tap_rows = np.repeat(np.arange(kernel_h) * int(dilation_h), kernel_w).astype(np.float32).reshape(taps, 1, 1)
    tap_cols = np.tile(np.arange(kernel_w) * int(dilation_w), kernel_h).astype(np.float32).reshape(taps, 1, 1)
    base_y = op18.Add(op18.Reshape(rows, [1, -1, 1]), op18.CastLike(op18.Constant(value=ir.tensor(tap_rows)), data))
    base_x = op18.Add(op18.Reshape(cols, [1, 1, -1]), op18.CastLike(op18.Constant(value=ir.tensor(tap_cols)), data))
    # offsets: (B, G, T, 2, oh, ow), [.., 0] the row offset, [.., 1] the column offset
    shifts = op18.Reshape(op18.CastLike(offset, data), op18.Concat(
        op18.Reshape(batch, [1]), [int(offset_groups), taps, 2], op18.Shape(offset, start=2), axis=0))  # fmt: skip
    y = op18.Add(op18.Squeeze(op18.Slice(shifts, [0], [1], [3]), [3]), base_y)  # (B, G, T, oh, ow)
    x = op18.Add(op18.Squeeze(op18.Slice(shifts, [1], [2], [3]), [3]), base_x)
    return y, x


def _deform_sampled(data: Tensor, offset: Tensor, dims: tuple, y: Tensor, x: Tensor, per_group: int, taps: int,
                    offset_groups: int, zero: Tensor, one: Tensor) -> Tensor:  # fmt: skip
    """Each channel sampled bilinearly at its offset group's positions ``y``, ``x`` (zero outside the
    image, as torchvision's ``bilinear_interpolate``): (B, G, C/G, T, oh, ow); ``dims`` are the input's
    (batch, channels, height, width)."""
    batch, channels, height, width = dims
    height_f, width_f = op18.CastLike(height, data), op18.CastLike(width, data)
    minus_one = _scalar(-1.0, data)
    inside = op18.And(op18.And(op18.Greater(y, minus_one), op18.Less(y, height_f)),
                      op18.And(op18.Greater(x, minus_one), op18.Less(x, width_f)))  # fmt: skip
    y_low, x_low = op18.Floor(y), op18.Floor(x)
    ly, lx = op18.Sub(y, y_low), op18.Sub(x, x_low)
    hy, hx = op18.Sub(_scalar(1.0, ly), ly), op18.Sub(_scalar(1.0, lx), lx)
    y_low, x_low = op18.Cast(y_low, to=INT64), op18.Cast(x_low, to=INT64)
    y_high, x_high = op18.Add(y_low, one), op18.Add(x_low, one)
    flat = op18.Reshape(data, op18.Concat(op18.Reshape(batch, [1]), op18.Reshape(channels, [1]), [-1], axis=0))
    sampled = None
    for row, col, weight_value in ((y_low, x_low, op18.Mul(hy, hx)), (y_low, x_high, op18.Mul(hy, lx)),
                                   (y_high, x_low, op18.Mul(ly, hx)), (y_high, x_high, op18.Mul(ly, lx))):  # fmt: skip
        valid = op18.And(op18.And(op18.GreaterOrEqual(row, zero), op18.Less(row, height)),
                         op18.And(op18.GreaterOrEqual(col, zero), op18.Less(col, width)))  # fmt: skip
        index = op18.Where(valid, op18.Add(op18.Mul(row, width), col), zero)  # (B, G, T, oh, ow)
        # each channel reads its offset group's positions: (B, G, 1, T*oh*ow) -> (B, C, T*oh*ow)
        grouped = op18.Unsqueeze(op18.Reshape(index, op18.Concat(op18.Reshape(batch, [1]), [int(offset_groups), -1],
                                                                  axis=0)), [2])  # fmt: skip
        spread = op18.Expand(grouped, op18.Concat(op18.Reshape(batch, [1]), [int(offset_groups), per_group, 1],
                                                   axis=0))  # fmt: skip
        spread = op18.Reshape(spread, op18.Concat(op18.Reshape(batch, [1]), op18.Reshape(channels, [1]), [-1],
                                                   axis=0))  # fmt: skip
        values = op18.GatherElements(flat, spread, axis=2)
        values = op18.Reshape(values, op18.Concat(op18.Reshape(batch, [1]), [int(offset_groups), per_group, taps],
                                                   op18.Shape(offset, start=2), axis=0))  # fmt: skip
        term = op18.Mul(values, op18.Unsqueeze(weight_value, [2]))
        term = op18.Where(op18.Unsqueeze(valid, [2]), term, _scalar(0.0, term))  # not 0 * value: inf stays out
        sampled = term if sampled is None else op18.Add(sampled, term)
    assert sampled is not None
    sampled = op18.Where(op18.Unsqueeze(inside, [2]), sampled, _scalar(0.0, sampled))  # (B, G, C/G, T, oh, ow)
    return sampled
