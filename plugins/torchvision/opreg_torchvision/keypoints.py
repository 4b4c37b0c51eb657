"""Keypoint R-CNN's ``heatmaps_to_keypoints`` as one torch op, so ``torch.export`` captures it.

torchvision resizes each detection's heatmaps to the detection's own size (bicubic) and takes
their maximum, in a Python loop over detections whose sizes are only known at run time. The
capture patch calls ``opreg_torchvision::heatmaps_to_keypoints`` instead: eagerly it runs
torchvision's own function (so the patched model computes exactly what torchvision does), and
``torch.export`` sees one node with a fake kernel; :func:`heatmaps_to_keypoints_impl` exports it
as an ONNX Loop over the detections, each resizing with Resize (cubic, a = -0.75, half pixel:
``F.interpolate(mode="bicubic", align_corners=False)``) and taking ArgMax.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnxscript
from onnxscript import FLOAT
from onnxscript.onnx_opset import opset18 as op18

import opreg

OP = "opreg_torchvision::heatmaps_to_keypoints"
FUNCTIONS = onnxscript.values.Opset("opreg_torchvision.functions", 1)
"""The domain of the pack's script impls when kept as model-local functions (``inline=False``)."""
_eager: list[Callable[..., Any]] = []
"""torchvision's own ``heatmaps_to_keypoints``, which the op's CPU kernel runs (set by :func:`define`)."""


def define(original: Callable[..., Any] | None = None) -> Any:
    """Define the torch op (once per process) and return it; ``original`` is torchvision's function
    its eager kernel runs (by default looked up in ``torchvision.models.detection.roi_heads``)."""
    import torch

    if original is not None and not _eager:
        _eager.append(original)
    namespace, name = OP.split("::")
    if hasattr(getattr(torch.ops, namespace), name):
        return getattr(getattr(torch.ops, namespace), name).default

    @torch.library.custom_op(OP, mutates_args=(), schema="(Tensor maps, Tensor rois) -> (Tensor, Tensor)")
    def heatmaps_to_keypoints(maps: Any, rois: Any) -> Any:
        if not _eager:
            from torchvision.models.detection import roi_heads

            _eager.append(roi_heads.heatmaps_to_keypoints)
        keypoints, scores = _eager[0](maps, rois)
        return keypoints.contiguous(), scores.contiguous()

    @heatmaps_to_keypoints.register_fake
    def _(maps: Any, rois: Any) -> Any:
        count, points = maps.shape[0], maps.shape[1]
        keypoints = maps.new_empty((count, points, 3), dtype=torch.float32)
        return keypoints, maps.new_empty((count, points), dtype=torch.float32)

    return getattr(getattr(torch.ops, namespace), name).default


def heatmaps_to_keypoints(original: Callable[..., Any], maps: Any, rois: Any) -> Any:
    """The capture patch's replacement: the op, whose eager kernel is ``original``."""
    return define(original)(maps, rois)


@opreg.impl(OP, opset=18)
@onnxscript.script(FUNCTIONS, default_opset=op18)
def heatmaps_to_keypoints_impl(maps: FLOAT, rois: FLOAT) -> tuple[FLOAT, FLOAT]:
    """heatmaps_to_keypoints(Tensor maps, Tensor rois) -> (Tensor, Tensor): a Loop over the detections; each
    resizes its (N, H, W) heatmaps to (ceil(height), ceil(width)) of its box (at least 1) with cubic Resize,
    takes each heatmap's first maximum (ArgMax) and maps it back into the box: ``(x + 0.5) * width / ceil(width)
    + x1`` (``y`` alike), visibility 1, and the resized heatmap's value there."""
    count = op18.Shape(maps, start=0, end=1)
    points = op18.Shape(maps, start=1, end=2)
    one = op18.Constant(value_float=1.0)
    half = op18.Constant(value_float=0.5)
    empty = op18.Concat(op18.Constant(value_ints=[0]), points, axis=0)
    keypoints = op18.ConstantOfShape(op18.Concat(empty, op18.Constant(value_ints=[3]), axis=0))
    scores = op18.ConstantOfShape(empty)
    for i in range(op18.Squeeze(count)):
        heatmaps = op18.Unsqueeze(op18.Gather(maps, i, axis=0), [0])  # (1, N, H, W)
        box = op18.Gather(rois, i, axis=0)  # (4,)
        corner = op18.Slice(box, [0], [2])  # x1, y1
        size = op18.Max(op18.Sub(op18.Slice(box, [2], [4]), corner), one)  # width, height, at least 1
        resized_size = op18.Ceil(size)
        sizes = op18.Concat(op18.Constant(value_ints=[1]), points, op18.Cast(
            op18.Concat(op18.Slice(resized_size, [1], [2]), op18.Slice(resized_size, [0], [1]), axis=0), to=7),
            axis=0)  # fmt: skip
        resized = op18.Resize(heatmaps, None, None, sizes, mode="cubic", cubic_coeff_a=-0.75,
                              coordinate_transformation_mode="half_pixel", exclude_outside=0)  # fmt: skip
        flat = op18.Reshape(resized, op18.Concat(points, op18.Constant(value_ints=[-1]), axis=0))
        position = op18.ArgMax(flat, axis=1, keepdims=1)  # (N, 1)
        score = op18.Reshape(op18.GatherElements(flat, position, axis=1), [1, -1])
        width = op18.Cast(op18.Slice(resized_size, [0], [1]), to=7)
        x_int = op18.Mod(position, width)
        y_int = op18.Div(op18.Sub(position, x_int), width)
        correction = op18.Div(size, resized_size)  # width / ceil(width), height / ceil(height)
        x = op18.Add(op18.Mul(op18.Add(op18.Cast(x_int, to=1), half), op18.Slice(correction, [0], [1])),
                     op18.Slice(corner, [0], [1]))  # fmt: skip
        y = op18.Add(op18.Mul(op18.Add(op18.Cast(y_int, to=1), half), op18.Slice(correction, [1], [2])),
                     op18.Slice(corner, [1], [2]))  # fmt: skip
        point = op18.Unsqueeze(op18.Concat(x, y, op18.Expand(one, op18.Shape(x)), axis=1), [0])  # (1, N, 3)
        keypoints = op18.Concat(keypoints, point, axis=0)
        scores = op18.Concat(scores, score, axis=0)
    return keypoints, scores


__all__ = ["OP", "define", "heatmaps_to_keypoints", "heatmaps_to_keypoints_impl"]
