"""Capture patches for ``torchvision.models.detection``: its Python, rewritten so ``torch.export`` captures
the detectors with a data-dependent number of detections.

Each replacement computes what torchvision 0.28's function computes (the conformance kit runs the
detectors of :mod:`opreg_torchvision.samples` with and without each patch and compares), without the
Python that needs a concrete size: a branch on ``numel() == 0``, ``len()`` of a tensor, a loop over
detections, a ``min()`` of image sides. torchvision is imported inside the functions, never when this module is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opreg import CapturePatch

VERSIONS = "torchvision>=0.28,<0.29"
"""The torchvision releases whose code these replacements mirror (checked by the kit on each)."""


def batched_nms(boxes: Any, scores: Any, idxs: Any, iou_threshold: float) -> Any:
    """``torchvision.ops.boxes.batched_nms`` as its coordinate trick, for any number of boxes: every class's
    boxes shifted by ``class * (max coordinate + 1)`` so classes never overlap, then one ``nms``.

    torchvision switches to a per-class loop above 4000 box coordinates (a branch on a size only known at
    run time) and returns early for no boxes; both give the boxes the trick keeps (ties in score aside,
    which the two order differently). An empty ``boxes`` takes 0 as its maximum instead of failing."""
    import torch
    from torchvision.ops import boxes as box_ops

    max_coordinate = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
    offsets = idxs.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
    return box_ops.nms(boxes + offsets[:, None], scores, iou_threshold)


def _fake_nms(dets: Any, scores: Any, iou_threshold: float) -> Any:
    """torchvision's fake ``nms`` with a result size that may be 0 or 1."""
    import torch

    torch._check(dets.dim() == 2, lambda: f"boxes should be a 2d tensor, got {dets.dim()}D")
    torch._check(dets.size(1) == 4, lambda: f"boxes should have 4 elements in dimension 1, got {dets.size(1)}")
    torch._check(scores.dim() == 1, lambda: f"scores should be a 1d tensor, got {scores.dim()}")
    torch._check(dets.size(0) == scores.size(0), lambda: "boxes and scores should have the same number of boxes")
    kept = torch.library.get_ctx().new_dynamic_size()
    torch._check(kept <= dets.size(0))
    return dets.new_empty(kept, dtype=torch.long)


@contextlib.contextmanager
def nms_fake_size() -> Iterator[None]:
    """Registers :func:`_fake_nms` over torchvision's fake ``nms`` for the block, through a library fragment
    whose registrations are removed on exit (torch then runs torchvision's own again)."""
    import torch

    library = torch.library.Library("torchvision", "FRAGMENT")
    try:
        torch.library.register_fake("torchvision::nms", _fake_nms, lib=library)
        yield
    finally:
        library._destroy()


def multiscale_roi_align(
    x_filtered: list[Any],
    boxes: list[Any],
    output_size: list[int],
    sampling_ratio: int,
    scales: list[float] | None,
    mapper: Any,
) -> Any:
    """``torchvision.ops.poolers._multiscale_roi_align`` with ``rois.shape[0]`` for ``len(rois)`` (which needs
    a concrete int) and the per-level results put in place with ``index_put_``."""
    import torch
    from torchvision.ops import poolers, roi_align

    if scales is None or mapper is None:
        raise ValueError("scales and mapper should not be None")
    rois = poolers._convert_to_roi_format(boxes)
    if len(x_filtered) == 1:
        return roi_align(
            x_filtered[0], rois, output_size=output_size, spatial_scale=scales[0], sampling_ratio=sampling_ratio
        )
    levels = mapper(boxes)
    first = x_filtered[0]
    result = torch.zeros((rois.shape[0], first.shape[1], *output_size), dtype=first.dtype, device=first.device)
    for level, (per_level_feature, scale) in enumerate(zip(x_filtered, scales, strict=False)):
        idx_in_level = torch.where(levels == level)[0]
        pooled = roi_align(
            per_level_feature, rois[idx_in_level], output_size=output_size, spatial_scale=scale,
            sampling_ratio=sampling_ratio,
        )  # fmt: skip
        result.index_put_((idx_in_level,), pooled.to(result.dtype))
    return result


def box_coder_decode(original: Any, self: Any, rel_codes: Any, boxes: list[Any]) -> Any:
    """``BoxCoder.decode`` without its ``box_sum > 0`` branches when the codes hold one row per box (as every
    torchvision detector passes them): ``decode_single`` reshaped to ``(boxes, codes / 4, 4)``. Other
    shapes go to torchvision's own code."""
    import torch
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    box_sum = sum(b.size(0) for b in boxes)
    if rel_codes.dim() == 2 and rel_codes.shape[1] % 4 == 0 and guard_or_false(rel_codes.shape[0] == box_sum):
        decoded = self.decode_single(rel_codes, torch.cat(boxes, dim=0))
        return decoded.reshape(rel_codes.shape[0], rel_codes.shape[1] // 4, 4)
    return original(self, rel_codes, boxes)


def _paste_axis(low: Any, high: Any, size: int, resolution: int, dtype: Any) -> tuple[Any, ...]:
    """Along one image axis, for each detection: the two mask rows (or columns) each image row reads,
    their bilinear weights and whether the row is inside the pasted box. ``low``/``high`` are the box's
    first and last pixel; the mask of ``resolution`` pixels is resized to ``high - low + 1`` (at least 1)
    as ``F.interpolate(mode="bilinear", align_corners=False)`` does (source ``(i + 0.5) * scale - 0.5``,
    clamped at 0, scale ``resolution / resized``)."""
    import torch

    resized = (high - low + 1).clamp(min=1)
    pixel = torch.arange(size, device=low.device)[None, :]
    inside = (pixel >= low.clamp(min=0)[:, None]) & (pixel < torch.clamp(high + 1, max=size)[:, None])
    scale = resolution / resized.to(dtype)
    source = (scale[:, None] * ((pixel - low[:, None]).to(dtype) + 0.5) - 0.5).clamp(min=0)
    first = source.to(torch.int64).clamp(max=resolution - 1)
    second = torch.where(first < resolution - 1, first + 1, first)
    weight = source - first.to(dtype)
    return first, second, 1 - weight, weight, inside


def paste_masks_in_image(masks: Any, boxes: Any, img_shape: tuple[int, int], padding: int = 1) -> Any:
    """``roi_heads.paste_masks_in_image`` for all detections at once: each image pixel inside a detection's
    (expanded, integer) box reads the detection's mask resized bilinearly to the box, gathered from the two
    nearest mask rows and columns; pixels outside are 0. torchvision resizes and pastes in a Python loop
    over the detections, which needs their number."""
    import torch
    from torchvision.models.detection import roi_heads

    masks, scale = roi_heads.expand_masks(masks, padding=padding)
    boxes = roi_heads.expand_boxes(boxes, scale).to(dtype=torch.int64)
    im_h, im_w = img_shape
    mask = masks[:, 0]  # (N, M, M)
    count, resolution = mask.shape[0], mask.shape[-1]
    y0, y1, wy0, wy1, in_y = _paste_axis(boxes[:, 1], boxes[:, 3], im_h, resolution, mask.dtype)
    x0, x1, wx0, wx1, in_x = _paste_axis(boxes[:, 0], boxes[:, 2], im_w, resolution, mask.dtype)

    def rows(index: Any) -> Any:
        return torch.gather(mask, 1, index[:, :, None].expand(count, im_h, resolution))

    def columns(row: Any, index: Any) -> Any:
        return torch.gather(row, 2, index[:, None, :].expand(count, im_h, im_w))

    top, bottom = rows(y0), rows(y1)
    left, right = wx0[:, None, :], wx1[:, None, :]
    pasted = wy0[:, :, None] * (left * columns(top, x0) + right * columns(top, x1)) + wy1[:, :, None] * (
        left * columns(bottom, x0) + right * columns(bottom, x1)
    )
    pasted = torch.where(in_y[:, :, None] & in_x[:, None, :], pasted, torch.zeros((), dtype=pasted.dtype))
    return pasted[:, None]


def _keypoints(original: Any, maps: Any, rois: Any) -> Any:
    from opreg_torchvision import keypoints

    return keypoints.heatmaps_to_keypoints(original, maps, rois)


def resize_image(original: Any, image: Any, self_min_size: int, self_max_size: int, target: Any = None,
                 fixed_size: Any = None) -> Any:  # fmt: skip
    """``transform._resize_image_and_masks`` for inference without a fixed size: the scale
    ``min(min_size / min(h, w), max_size / max(h, w))`` with ``torch.sym_min``/``sym_max``, which
    ``torch.export`` keeps as expressions of a dynamic image size. Python's ``min`` picks one side at
    capture time and guards on it, so a model captured on a square image would only take square ones
    (ONNX has no such guard: others would give wrong boxes). Eagerly the same numbers."""
    import torch

    if target is not None or fixed_size is not None:
        return original(image, self_min_size, self_max_size, target, fixed_size)
    height, width = image.shape[-2:]
    scale = torch.sym_min(self_min_size / torch.sym_min(height, width), self_max_size / torch.sym_max(height, width))
    resized = torch.nn.functional.interpolate(
        image[None], scale_factor=scale, mode="bilinear", recompute_scale_factor=True, align_corners=False
    )
    return resized[0], target


PATCHES = (
    CapturePatch(
        name="batched_nms",
        module="torchvision.ops.boxes",
        function="batched_nms",
        versions=VERSIONS,
        replacement=batched_nms,
        reason="branches on boxes.numel() (> 4000, == 0); the patch always takes the coordinate trick",
    ),
    CapturePatch(
        name="nms_fake_size",
        module="torchvision._meta_registrations",
        function="meta_nms",
        versions=VERSIONS,
        context=nms_fake_size,
        reason="torchvision's fake nms sizes its result with create_unbacked_symint(), whose minimum is 2: a "
        "capture assumes at least 2 boxes kept and guards on it; the patch's size starts at 0",
    ),
    CapturePatch(
        name="multiscale_roi_align",
        module="torchvision.ops.poolers",
        function="_multiscale_roi_align",
        versions=VERSIONS,
        replacement=multiscale_roi_align,
        reason="len(rois) needs a concrete number of boxes; the patch reads rois.shape[0]",
    ),
    CapturePatch(
        name="box_coder_decode",
        module="torchvision.models.detection._utils",
        function="BoxCoder.decode",
        versions=VERSIONS,
        replacement=box_coder_decode,
        wraps_original=True,
        reason="branches on box_sum > 0, the data-dependent number of proposals; the patch reshapes without it",
    ),
    CapturePatch(
        name="heatmaps_to_keypoints",
        module="torchvision.models.detection.roi_heads",
        function="heatmaps_to_keypoints",
        versions=VERSIONS,
        replacement=_keypoints,
        wraps_original=True,
        reason="resizes each detection's heatmaps to its own size in a Python loop over detections; the patch "
        "calls the op opreg_torchvision::heatmaps_to_keypoints (torchvision's function, eagerly), exported as a Loop",
    ),
    CapturePatch(
        name="resize_image",
        module="torchvision.models.detection.transform",
        function="_resize_image_and_masks",
        versions=VERSIONS,
        replacement=resize_image,
        wraps_original=True,
        reason="picks the resize scale with Python's min(), which torch.export fixes to one side of the image at "
        "capture; the patch keeps it an expression of a dynamic image size (torch.sym_min)",
    ),
    CapturePatch(
        name="paste_masks_in_image",
        module="torchvision.models.detection.roi_heads",
        function="paste_masks_in_image",
        versions=VERSIONS,
        replacement=paste_masks_in_image,
        reason="resizes and pastes each mask in a Python loop over detections; the patch pastes all at once",
    ),
)
"""What :func:`opreg_torchvision.opreg_capture_patches` offers."""
