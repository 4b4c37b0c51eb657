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
torchvision's schemas (read from its ``_C.so``), with small Python CPU kernels
for the ops tests call, and ``torchvision.extension._has_ops()`` answers True
so torchvision's wrappers call them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
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
    return {"nms": nms, "roi_align": roi_align}


def nms(dets: Any, scores: Any, iou_threshold: float) -> Any:
    """Greedy NMS as torchvision's CPU kernel does it: boxes by descending score (stable),
    a box is dropped when its IoU with a kept one is above ``iou_threshold``."""
    import torch

    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    order = torch.sort(scores, descending=True, stable=True).indices
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(dets.shape[0], dtype=torch.bool)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        iou = inter / (areas[i] + areas - inter)
        suppressed |= iou > iou_threshold
    return torch.tensor(keep, dtype=torch.long)


def roi_align(
    input: Any,
    rois: Any,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> Any:
    """torchvision's own Python RoIAlign (``torchvision.ops.roi_align._roi_align``)."""
    from torchvision.ops.roi_align import _roi_align

    return _roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
