"""Test support only: torchvision's C++ ops, defined in Python when its extension cannot load.

The registry's torchvision wheel is a CUDA build; beside the CPU torch of our
machines its ``_C`` extension does not load, so ``torchvision::nms`` and the
other ops do not exist, and ``import torchvision`` fails (its meta
registrations name them). transformers imports torchvision whenever it is
installed, so every model import would fail with it.

This distribution is installed by the dev set-up only (``requirements-dev.in``;
never by a pack, never on a user's machine). Its ``.pth`` file calls
:func:`install`, which adds an import hook and nothing else: torch is not
imported until something imports torchvision. Then, if torchvision's own
extension loads, nothing is changed. If it does not, every op is defined with
torchvision's schemas (read from its ``_C.so``), with Python CPU kernels for
the forward ops (``nms``, ``roi_align``, ``roi_pool``, ``ps_roi_align``,
``ps_roi_pool``, ``deform_conv2d``; checked against hand-computed cases and
torchvision's documented semantics in ``tests/test_torchvision_shim.py``), and
``torchvision.extension._has_ops()`` answers True so torchvision's wrappers
call them. They are the eager reference the ``opreg-torchvision`` pack is
verified against here, so they follow the arithmetic of torchvision's CPU
kernels (``torchvision/csrc/ops/cpu``), not just their intent.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import math
import sys
from typing import Any

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, "
    "int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "bool aligned) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) "
    "-> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor",
    "_cuda_version() -> int",
)
"""torchvision 0.28's op schemas, as its ``_C.so`` defines them."""

_library: Any = None  # the torch.library.Library holding the definitions (kept alive)
shimmed = False
"""True once the ops were defined here (torchvision's extension did not load)."""


def install() -> None:
    """Add the import hook (from the ``.pth`` file at interpreter start; cheap)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Defines the ops before ``torchvision`` runs, and patches ``torchvision.extension`` after."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in ("torchvision", "torchvision.extension"):
            return None
        spec = _spec_without(self, name, path)
        if spec is None:
            return None
        if name == "torchvision":
            _define_ops(spec)
        elif shimmed and spec.loader is not None:
            spec.loader = _PatchedExtensionLoader(spec.loader)
        return spec


def _spec_without(finder: _Finder, name: str, path: Any) -> importlib.machinery.ModuleSpec | None:
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(name, path)
        if spec is not None:
            return spec
    return None


class _PatchedExtensionLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        module._has_ops = lambda: True


def _define_ops(spec: importlib.machinery.ModuleSpec) -> None:
    global _library, shimmed
    if _library is not None or shimmed:
        return
    import torch

    locations = list(spec.submodule_search_locations or [])
    for folder in locations:
        try:
            torch.ops.load_library(f"{folder}/_C.so")
            return  # the real extension loads: nothing to do
        except (OSError, RuntimeError):
            continue
    _library = torch.library.Library("torchvision", "DEF")
    for schema in SCHEMAS:
        _library.define(schema)
    for name, kernel in _kernels().items():
        _library.impl(name, kernel, "CPU")
    _library.impl("_cuda_version", lambda: -1, "CompositeExplicitAutograd")  # no CUDA here
    shimmed = True


def _kernels() -> dict[str, Any]:
    return {
        "nms": nms,
        "roi_align": roi_align,
        "roi_pool": roi_pool,
        "ps_roi_align": ps_roi_align,
        "ps_roi_pool": ps_roi_pool,
        "deform_conv2d": deform_conv2d,
    }


# -- the arithmetic of torchvision's CPU kernels (torchvision/csrc/ops/cpu), on scalars of their type T ----


def _scalar_type(tensor: Any) -> Any:
    """The numpy scalar type the C++ kernel computes in for ``tensor`` (its ``T``)."""
    import numpy as np
    import torch

    return {torch.float64: np.float64, torch.float16: np.float16}.get(tensor.dtype, np.float32)


def _c_round(value: float) -> int:
    """C's ``round``: halves away from zero (Python's round goes to even)."""
    whole = math.trunc(value)
    if abs(value - whole) >= 0.5:
        whole += 1 if value > 0 else -1
    return int(whole)


def _rounded_roi(roi: Any, scale: Any, T: Any) -> tuple[int, int, int, int, int]:
    """``(batch, start_w, start_h, end_w, end_h)``: ``int(roi[0])`` and ``round(roi[i] * spatial_scale)`` in T."""
    values = [T(v) for v in roi.tolist()]
    return (int(values[0]), *(_c_round(float(T(v * scale))) for v in values[1:]))  # type: ignore[return-value]


def _bins(start: int, size: int, bins: int, lowest: int, highest: int, T: Any) -> list[tuple[int, int]]:
    """Integer bins ``[floor(p * size / bins), ceil((p + 1) * size / bins))`` + ``start``, clipped."""
    bin_size = T(T(size) / T(bins))
    edges = []
    for p in range(bins):
        low = math.floor(T(T(p) * bin_size)) + start
        high = math.ceil(T(T(p + 1) * bin_size)) + start
        edges.append((min(max(low, lowest), highest), min(max(high, lowest), highest)))
    return edges


def roi_pool(input: Any, rois: Any, spatial_scale: float, pooled_height: int, pooled_width: int) -> Any:
    """torchvision's ``roi_pool_forward_kernel_impl``: per roi, corners ``round(x * scale)``, size
    ``max(end - start + 1, 1)``, bins ``[floor(p * bin), ceil((p + 1) * bin))`` clipped to the map; each
    bin's maximum starting from ``-FLT_MAX`` (0 for an empty bin) and its first position ``h * W + w``
    in row-major order (``-1`` when nothing exceeded ``-FLT_MAX``)."""
    import numpy as np
    import torch

    T = _scalar_type(input)
    rois_count, channels, height, width = rois.shape[0], input.shape[1], input.shape[2], input.shape[3]
    output = input.new_zeros((rois_count, channels, pooled_height, pooled_width))
    argmax = torch.full(output.shape, -1, dtype=torch.int32)
    lowest = -float(np.finfo(np.float32).max)
    scale = T(spatial_scale)
    for k in range(rois_count):
        batch, start_w, start_h, end_w, end_h = _rounded_roi(rois[k], scale, T)
        rows = _bins(start_h, max(end_h - start_h + 1, 1), pooled_height, 0, height, T)
        cols = _bins(start_w, max(end_w - start_w + 1, 1), pooled_width, 0, width, T)
        for ph, (h0, h1) in enumerate(rows):
            for pw, (w0, w1) in enumerate(cols):
                if h1 <= h0 or w1 <= w0:
                    continue  # empty: 0, argmax -1
                region = input[batch, :, h0:h1, w0:w1].reshape(channels, -1)
                counted = torch.where(torch.isnan(region) | (region <= lowest), float("-inf"), region)
                best = counted.argmax(dim=1)  # the first maximum, as the kernel's strict `>`
                value = counted.gather(1, best[:, None])[:, 0]
                none = torch.isinf(value) & (value < 0)
                output[k, :, ph, pw] = torch.where(none, torch.tensor(lowest, dtype=input.dtype), value)
                position = (h0 + best // (w1 - w0)) * width + w0 + best % (w1 - w0)
                argmax[k, :, ph, pw] = torch.where(none, -1, position).to(torch.int32)
    return output, argmax


def ps_roi_pool(input: Any, rois: Any, spatial_scale: float, pooled_height: int, pooled_width: int) -> Any:
    """torchvision's ``ps_roi_pool_forward_kernel_impl``: corners ``round(x * scale)``, size
    ``max(end - start, 1)``, bins clipped to ``[0, H - 1]`` (sic); output channel c, bin (ph, pw) is the
    mean of input channel ``(c * PH + ph) * PW + pw`` over the bin (0 when empty); and that channel."""
    import torch

    T = _scalar_type(input)
    rois_count, channels, height, width = rois.shape[0], input.shape[1], input.shape[2], input.shape[3]
    channels_out = channels // (pooled_height * pooled_width)
    output = input.new_zeros((rois_count, channels_out, pooled_height, pooled_width))
    mapping = _channel_mapping(rois_count, channels_out, pooled_height, pooled_width)
    scale = T(spatial_scale)
    for k in range(rois_count):
        batch, start_w, start_h, end_w, end_h = _rounded_roi(rois[k], scale, T)
        rows = _bins(start_h, max(end_h - start_h, 1), pooled_height, 0, height - 1, T)
        cols = _bins(start_w, max(end_w - start_w, 1), pooled_width, 0, width - 1, T)
        for ph, (h0, h1) in enumerate(rows):
            for pw, (w0, w1) in enumerate(cols):
                if h1 <= h0 or w1 <= w0:
                    continue
                source = mapping[k, :, ph, pw].long()
                area = torch.tensor(float((h1 - h0) * (w1 - w0)), dtype=input.dtype)
                output[k, :, ph, pw] = input[batch, source, h0:h1, w0:w1].sum(dim=(1, 2)) / area
    return output, mapping


def _channel_mapping(rois_count: int, channels_out: int, pooled_height: int, pooled_width: int) -> Any:
    """``(c * PH + ph) * PW + pw`` for each output element, int32 (K, C_out, PH, PW)."""
    import torch

    per_roi = torch.arange(channels_out * pooled_height * pooled_width, dtype=torch.int32)
    return per_roi.reshape(1, channels_out, pooled_height, pooled_width).repeat(rois_count, 1, 1, 1)


def _roi_align_sample(planes: Any, y: Any, x: Any) -> Any:
    """torchvision's RoIAlign ``bilinear_interpolate`` of ``planes`` (K, C, H, W) at float coordinates
    ``y``, ``x`` (K, S) of each roi's plane: 0 outside ``[-1, H] x [-1, W]`` (NaN too), clamped to the last
    row/column, ``hy * hx * v1 + hy * lx * v2 + ly * hx * v3 + ly * lx * v4``; (K, C, S)."""
    import torch

    height, width = planes.shape[-2], planes.shape[-1]
    outside = ~((y >= -1.0) & (y <= height) & (x >= -1.0) & (x <= width))
    y = torch.where(outside | (y <= 0), torch.zeros_like(y), y)
    x = torch.where(outside | (x <= 0), torch.zeros_like(x), x)
    y_low, x_low = y.long(), x.long()  # truncation of non-negative values
    last_y, last_x = y_low >= height - 1, x_low >= width - 1
    y_low = torch.where(last_y, height - 1, y_low)
    x_low = torch.where(last_x, width - 1, x_low)
    y = torch.where(last_y, y_low.to(y.dtype), y)
    x = torch.where(last_x, x_low.to(x.dtype), x)
    y_high = torch.where(last_y, y_low, y_low + 1)
    x_high = torch.where(last_x, x_low, x_low + 1)
    ly, lx = y - y_low.to(y.dtype), x - x_low.to(x.dtype)
    hy, hx = 1.0 - ly, 1.0 - lx
    flat = planes.reshape(planes.shape[0], planes.shape[1], height * width)

    def read(row: Any, col: Any) -> Any:
        index = (row * width + col)[:, None, :].expand(flat.shape[0], flat.shape[1], row.shape[1])
        return flat.gather(2, index)

    w1, w2, w3, w4 = ((hy * hx)[:, None], (hy * lx)[:, None], (ly * hx)[:, None], (ly * lx)[:, None])
    value = w1 * read(y_low, x_low) + w2 * read(y_low, x_high) + w3 * read(y_high, x_low) + w4 * read(y_high, x_high)
    return torch.where(outside[:, None], torch.zeros_like(value), value)


def ps_roi_align(
    input: Any, rois: Any, spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int
) -> Any:
    """torchvision's ``ps_roi_align_forward_kernel_impl``: corners ``x * scale - 0.5`` (no minimum size),
    the samples of :func:`roi_align`, their sum divided by ``grid_h * grid_w`` (NaN when that is 0);
    output channel c, bin (ph, pw) read from input channel ``(c * PH + ph) * PW + pw``."""
    import torch

    channels_out = input.shape[1] // (pooled_height * pooled_width)
    sums, count = _roi_align_sums(input, rois, spatial_scale, (pooled_height, pooled_width), sampling_ratio, True)
    bins = torch.arange(pooled_height * pooled_width)
    grouped = sums.reshape(len(rois), channels_out, pooled_height * pooled_width, pooled_height * pooled_width)
    picked = grouped[:, :, bins, bins].reshape(len(rois), channels_out, pooled_height, pooled_width)
    mapping = _channel_mapping(len(rois), channels_out, pooled_height, pooled_width)
    return picked / count[:, None, None, None], mapping


def deform_conv2d(
    input: Any,
    weight: Any,
    offset: Any,
    mask: Any,
    bias: Any,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> Any:
    """torchvision's ``deform_conv2d_forward_kernel``: each kernel tap (i, j) of output position (oy, ox)
    samples its channel at ``(oy * stride - pad + i * dilation + offset_y, ...)``, offsets laid out
    ``(offset group, tap, [y, x])``, bilinearly with zero outside ``(-1, H) x (-1, W)`` and for corners
    off the map; times the mask (``use_mask``); then a grouped matrix product with the weight, plus bias."""
    import torch

    batch, channels, height, width = input.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    taps = kernel_h * kernel_w
    out_h = (height + 2 * pad_h - (dilation_h * (kernel_h - 1) + 1)) // stride_h + 1
    out_w = (width + 2 * pad_w - (dilation_w * (kernel_w - 1) + 1)) // stride_w + 1
    shifts = offset.reshape(batch, offset_groups, taps, 2, out_h, out_w)
    tap_y = (torch.arange(kernel_h) * dilation_h).repeat_interleave(kernel_w).to(input.dtype)
    tap_x = (torch.arange(kernel_w) * dilation_w).repeat(kernel_h).to(input.dtype)
    base_y = (torch.arange(out_h) * stride_h - pad_h).to(input.dtype)
    base_x = (torch.arange(out_w) * stride_w - pad_w).to(input.dtype)
    y = (base_y[None, None, None, :, None] + tap_y[None, None, :, None, None]) + shifts[:, :, :, 0]
    x = (base_x[None, None, None, None, :] + tap_x[None, None, :, None, None]) + shifts[:, :, :, 1]
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    y_low, x_low = torch.floor(y), torch.floor(x)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    y_low, x_low = y_low.long(), x_low.long()
    per_group = channels // offset_groups
    planes = input.reshape(batch, offset_groups, per_group, height * width)
    value = None
    for row, col, corner in ((y_low, x_low, hy * hx), (y_low, x_low + 1, hy * lx),
                             (y_low + 1, x_low, ly * hx), (y_low + 1, x_low + 1, ly * lx)):  # fmt: skip
        valid = (row >= 0) & (row < height) & (col >= 0) & (col < width)
        index = torch.where(valid, row * width + col, 0).reshape(batch, offset_groups, 1, -1)
        read = planes.gather(3, index.expand(batch, offset_groups, per_group, index.shape[-1]))
        read = read.reshape(batch, offset_groups, per_group, taps, out_h, out_w)
        term = torch.where(valid[:, :, None], corner[:, :, None] * read, torch.zeros((), dtype=input.dtype))
        value = term if value is None else value + term
    assert value is not None
    value = torch.where(inside[:, :, None], value, torch.zeros((), dtype=input.dtype))
    if use_mask:
        value = value * mask.reshape(batch, offset_groups, 1, taps, out_h, out_w)
    columns = value.reshape(batch, groups, (channels // groups) * taps, out_h * out_w)
    kernels = weight.reshape(groups, out_channels // groups, (channels // groups) * taps)
    out = torch.matmul(kernels, columns).reshape(batch, out_channels, out_h, out_w)
    return out + bias.reshape(1, out_channels, 1, 1)


def nms(dets: Any, scores: Any, iou_threshold: float) -> Any:
    """Greedy NMS as torchvision's CPU kernel does it: boxes by descending score (a stable sort, so
    ties keep their order), a box is dropped when its IoU with a kept one is above ``iou_threshold``.

    One step per kept box, each comparing it with every later box at once."""
    import torch

    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    order = torch.sort(scores, descending=True, stable=True).indices
    x1, y1, x2, y2 = dets[order].unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    alive = torch.ones(order.numel(), dtype=torch.bool)
    keep = []
    position = 0
    while True:
        later = torch.nonzero(alive[position:])
        if later.numel() == 0:
            break
        i = position + int(later[0, 0])
        keep.append(i)
        rest = slice(i + 1, None)
        w = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        h = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter)
        alive[rest] &= ~(iou > iou_threshold)
        position = i + 1
    return order[torch.tensor(keep, dtype=torch.long)]


def roi_align(
    input: Any,
    rois: Any,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> Any:
    """torchvision's ``roi_align_forward_kernel_impl``: corners ``x * scale`` (minus 0.5 when ``aligned``;
    otherwise a size of at least 1), ``grid = sampling_ratio`` or ``ceil(size / pooled)`` samples per bin,
    their sum divided by ``max(grid_h * grid_w, 1)``. (torchvision's Python ``_roi_align`` differs from
    the C++ kernel for boxes that leave the map, so it is not the reference.)"""
    sums, count = _roi_align_sums(input, rois, spatial_scale, (pooled_height, pooled_width), sampling_ratio, aligned)
    return sums / count.clamp(min=1)[:, None, None, None]


def _roi_align_sums(
    input: Any, rois: Any, spatial_scale: float, pooled: tuple[int, int], sampling_ratio: int, aligned: bool
) -> tuple[Any, Any]:
    """For every roi at once: the sums over each bin's samples (K, C, PH, PW) and the samples per bin
    ``grid_h * grid_w`` (K,), in the arithmetic the RoIAlign kernels share, each step rounded to the input's
    type as the C++ does: ``start = x * scale - offset``, ``bin = size / pooled``, sample ``i`` of bin ``p`` at
    ``(start + p * bin) + (i + 0.5) * bin / grid`` (:func:`_roi_align_sample`). The grid is the largest roi's,
    each roi's extra samples masked."""
    import torch

    dtype = input.dtype
    boxes = rois[:, 1:5].to(dtype)
    scaled = boxes * torch.tensor(spatial_scale, dtype=dtype) - torch.tensor(0.5 if aligned else 0.0, dtype=dtype)
    start, size = scaled[:, :2], scaled[:, 2:] - scaled[:, :2]  # (K, 2): x, y
    if not aligned:
        size = size.clamp(min=1.0)
    bins = torch.tensor([pooled[1], pooled[0]], dtype=dtype)
    bin_size = size / bins
    grid = torch.full_like(size, float(sampling_ratio)) if sampling_ratio > 0 else torch.ceil(size / bins)
    count = grid.prod(dim=1)
    largest = [int(max(grid[:, axis].max().item(), 1.0)) if len(rois) else 1 for axis in (0, 1)]
    axes = []
    for axis in (0, 1):
        p = torch.arange(int(bins[axis]), dtype=dtype)[None, :, None]
        i = torch.arange(largest[axis], dtype=dtype)[None, None, :]
        step, first, samples = bin_size[:, axis, None, None], start[:, axis, None, None], grid[:, axis, None, None]
        position = (first + p * step) + (i + 0.5) * step / samples  # (K, bins, largest)
        axes.append((position, (i < samples).expand(position.shape)))
    (x, x_used), (y, y_used) = axes
    count_rois, rows, columns = len(rois), y.shape[1] * y.shape[2], x.shape[1] * x.shape[2]
    samples = rows * columns
    ys = y.reshape(count_rois, rows, 1).expand(count_rois, rows, columns).reshape(count_rois, samples)
    xs = x.reshape(count_rois, 1, columns).expand(count_rois, rows, columns).reshape(count_rois, samples)
    used = y_used.reshape(count_rois, rows, 1) & x_used.reshape(count_rois, 1, columns)
    used = used.reshape(count_rois, 1, samples)
    planes = input[rois[:, 0].long()]  # each roi's image (the kernel's int cast of the index)
    values = _roi_align_sample(planes, ys, xs) * used.to(dtype)  # (K, C, rows * columns)
    shape = (count_rois, input.shape[1], pooled[0], largest[1], pooled[1], largest[0])
    sums = values.reshape(shape).sum(dim=(3, 5))
    return sums, count
