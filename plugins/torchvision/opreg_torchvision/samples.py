"""Samples for the conformance kit: op calls with their edge cases, and small detectors for the capture patches.

:func:`op_samples` feeds each impl boxes outside the image, empty and inverted boxes, no boxes at
all and, for ``nms``, exact ties in score. :func:`patch_samples` runs torchvision's own detection
models (:func:`detector`: each detector class on a small backbone, at 64 pixels) through each
patch on images giving no, one and many detections. Imported by the hooks that need it (it imports
torch and torchvision), never with the pack.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

import torch
import torchvision

KINDS = ("fasterrcnn", "maskrcnn", "keypointrcnn", "retinanet", "fcos", "ssd", "ssdlite")
"""The detector classes of ``torchvision.models.detection`` :func:`detector` builds."""
SIZE = 64
"""The image side of the small detectors (their transform resizes to it)."""


def _generator(seed: int) -> Any:
    return torch.Generator().manual_seed(seed)


def _boxes(count: int, extent: float, generator: Any) -> Any:
    """``count`` boxes ``(x1, y1, x2, y2)`` with corners in ``[0, extent)`` and positive size."""
    corners = torch.rand(count, 2, generator=generator) * extent
    sizes = torch.rand(count, 2, generator=generator) * extent / 2 + 0.5
    return torch.cat([corners, corners + sizes], dim=1)


def _rois(generator: Any) -> Any:
    """Rois ``(batch, x1, y1, x2, y2)`` over a 2-image batch of 10 x 12 maps: inside, partly and wholly
    outside, empty (a point) and inverted boxes, fractional corners and halves (rounding)."""
    fixed = torch.tensor([
        [0, 1.0, 1.0, 8.0, 6.0],
        [1, -3.0, -2.0, 4.0, 5.0],  # partly outside
        [0, 11.0, 9.0, 20.0, 14.0],  # mostly outside
        [1, -9.0, -9.0, -4.0, -5.0],  # wholly outside
        [1, 2.5, 3.5, 2.5, 3.5],  # a point
        [0, 6.0, 5.0, 2.0, 1.0],  # inverted
        [0, 0.0, 0.0, 11.0, 9.0],  # the whole map
        [1, 0.5, 1.5, 5.5, 7.5],  # halves: round away from zero
    ])  # fmt: skip
    batch = torch.randint(0, 2, (4, 1), generator=generator).float()
    return torch.cat([fixed, torch.cat([batch, _boxes(4, 10.0, generator)], dim=1)])


def op_samples() -> dict[str, list[Any]]:
    """``{torch op: [Sample, ...]}`` for every op of :mod:`opreg_torchvision.ops`."""
    from opreg.testing import Sample

    g = _generator(0)
    none = torch.zeros(0, 5)
    features = torch.randn(2, 3, 10, 12, generator=g)
    rois = _rois(g)
    boxes = _boxes(40, 100.0, g)
    tied = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 10, 10.5], [1, 1, 11, 11]])
    outside = torch.tensor([[-20.0, -20.0, -5.0, -5.0], [-18.0, -19.0, -4.0, -6.0], [900.0, 900.0, 990.0, 1000.0]])
    ps_features = torch.randn(2, 8, 10, 12, generator=g)  # 2 output channels of 2 x 2 bins
    nms = [
        Sample.of(boxes, torch.rand(40, generator=g), 0.5),
        Sample.of(boxes, torch.rand(40, generator=g), 0.0),
        Sample.of(tied, torch.tensor([0.9, 0.9, 0.9, 0.9, 0.8]), 0.5),  # ties: the lower index first
        Sample.of(outside, torch.tensor([0.3, 0.6, 0.2]), 0.4),
        Sample.of(torch.zeros(0, 4), torch.zeros(0), 0.5),
    ]
    roi_align = [
        Sample.of(features, rois, 1.0, 3, 3, 2, False),
        Sample.of(features, rois, 0.5, 2, 4, -1, True),  # adaptive sampling, aligned
        Sample.of(features, rois, 1.0, 3, 3, 0, False),
        Sample.of(features, rois, 2.0, 3, 2, 1, True),
        Sample.of(features, none, 1.0, 3, 3, 2, False),  # no boxes
    ]
    roi_pool = [
        Sample.of(features, rois, 1.0, 3, 3),
        Sample.of(features, rois, 0.5, 2, 4),
        Sample.of(features, none, 1.0, 2, 2),
    ]
    ps_roi_align = [
        Sample.of(ps_features, rois, 1.0, 2, 2, 2),
        Sample.of(ps_features, rois, 0.5, 2, 2, -1),  # adaptive: a point box has no sample (NaN)
        Sample.of(ps_features, none, 1.0, 2, 2, 2),
    ]
    ps_roi_pool = [
        Sample.of(ps_features, rois, 1.0, 2, 2),
        Sample.of(ps_features, rois, 0.5, 2, 2),
        Sample.of(ps_features, none, 1.0, 2, 2),
    ]
    return {
        "torchvision::nms": nms,
        "torchvision::roi_align": roi_align,
        "torchvision::roi_pool": roi_pool,
        "torchvision::ps_roi_align": ps_roi_align,
        "torchvision::ps_roi_pool": ps_roi_pool,
        "torchvision::deform_conv2d": _deform_samples(g),
        "opreg_torchvision::heatmaps_to_keypoints": _keypoint_samples(g),
    }


def _deform_samples(g: Any) -> list[Any]:
    from opreg.testing import Sample

    x = torch.randn(2, 4, 7, 8, generator=g)
    grouped = torch.randn(6, 2, 3, 3, generator=g)  # groups 2
    single = torch.randn(5, 4, 3, 3, generator=g)
    bias6, bias5 = torch.randn(6, generator=g), torch.randn(5, generator=g)
    # stride 1, pad 1: 7 x 8 outputs; offsets of +-3 pixels push samples off the map
    offset = torch.randn(2, 2 * 2 * 9, 7, 8, generator=g) * 3
    mask = torch.rand(2, 2 * 9, 7, 8, generator=g)
    # stride 2, no padding, dilation 2: (7 - 5) // 2 + 1 = 2 rows, 2 columns
    offset_small = torch.randn(2, 2 * 9, 2, 2, generator=g) * 2
    no_mask = torch.zeros(2, 1)
    return [
        Sample.of(x, grouped, offset, mask, bias6, 1, 1, 1, 1, 1, 1, 2, 2, True),
        Sample.of(x, grouped, offset, no_mask, bias6, 1, 1, 1, 1, 1, 1, 2, 2, False),
        Sample.of(x, single, offset_small, no_mask, bias5, 2, 2, 0, 0, 2, 2, 1, 1, False),
        Sample.of(x, single, torch.zeros(2, 18, 2, 2), torch.ones(2, 9, 2, 2), bias5, 2, 2, 0, 0, 2, 2, 1, 1, True),
    ]


def _keypoint_samples(g: Any) -> list[Any]:
    from opreg.testing import Sample

    maps = torch.randn(3, 2, 8, 8, generator=g)
    boxes = torch.tensor([[2.0, 3.0, 20.0, 11.0], [5.0, 5.0, 5.2, 9.0], [0.0, 0.0, 3.5, 2.5]])
    return [Sample.of(maps, boxes), Sample.of(torch.zeros(0, 2, 8, 8), torch.zeros(0, 4))]


# -- small detectors ----------------------------------------------------------------------------------


def _backbone(channels: int = 32) -> Any:
    from torch import nn

    class Backbone(nn.Module):
        """Two feature maps, strides 4 and 8, as torchvision's detectors take them (an ordered dict);
        32 channels, as FCOS's GroupNorm(32) needs."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, channels, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            )  # fmt: skip
            self.down = nn.Sequential(nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.ReLU())
            self.out_channels = channels

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            first = self.stem(x)
            return collections.OrderedDict([("0", first), ("1", self.down(first))])

    return Backbone()


def detector(kind: str, score_thresh: float = 0.05, *, seed: int = 0, size: int = SIZE) -> Any:
    """A ``torchvision.models.detection`` detector of class ``kind`` (one of :data:`KINDS`) on a small
    random backbone, for images resized to ``size``, keeping detections scored above ``score_thresh``."""
    from torchvision.models import detection
    from torchvision.models.detection.anchor_utils import AnchorGenerator, DefaultBoxGenerator
    from torchvision.models.detection.ssd import SSDHead
    from torchvision.models.detection.ssdlite import SSDLiteHead
    from torchvision.ops import MultiScaleRoIAlign

    torch.manual_seed(seed)
    backbone = _backbone()
    levels = ["0", "1"]
    common = dict(min_size=size, max_size=size)
    anchors = AnchorGenerator(sizes=((8, 16), (24, 32)), aspect_ratios=((0.5, 1.0, 2.0),) * 2)
    rcnn = dict(
        rpn_anchor_generator=anchors, rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=30,
        box_roi_pool=MultiScaleRoIAlign(levels, 7, 2), box_score_thresh=score_thresh, box_detections_per_img=20,
        **common,
    )  # fmt: skip
    if kind == "fasterrcnn":
        model = detection.FasterRCNN(backbone, num_classes=4, **rcnn)
    elif kind == "maskrcnn":
        model = detection.MaskRCNN(backbone, num_classes=4, mask_roi_pool=MultiScaleRoIAlign(levels, 14, 2), **rcnn)
    elif kind == "keypointrcnn":
        model = detection.KeypointRCNN(
            backbone, num_classes=2, num_keypoints=5, keypoint_roi_pool=MultiScaleRoIAlign(levels, 14, 2), **rcnn
        )
    elif kind == "retinanet":
        model = detection.RetinaNet(
            backbone, num_classes=4, anchor_generator=anchors, score_thresh=score_thresh, topk_candidates=100,
            detections_per_img=20, **common,
        )  # fmt: skip
    elif kind == "fcos":
        points = AnchorGenerator(sizes=((8,), (16,)), aspect_ratios=((1.0,),) * 2)
        model = detection.FCOS(
            backbone, num_classes=4, anchor_generator=points, score_thresh=score_thresh, topk_candidates=100,
            detections_per_img=20, **common,
        )  # fmt: skip
    elif kind in ("ssd", "ssdlite"):
        from torchvision.models.detection.ssd import SSD

        boxes = DefaultBoxGenerator([[2], [2, 3]])
        channels = [backbone.out_channels] * 2
        head_class = SSDHead if kind == "ssd" else SSDLiteHead
        extra = {} if kind == "ssd" else {"norm_layer": torch.nn.BatchNorm2d}
        head = head_class(channels, boxes.num_anchors_per_location(), 4, **extra)
        model = SSD(
            backbone, boxes, (size, size), num_classes=4, head=head, score_thresh=score_thresh,
            topk_candidates=100, detections_per_img=20,
        )  # fmt: skip
    else:
        raise ValueError(f"no detector kind {kind!r}; kinds: {', '.join(KINDS)}")
    for name, module in model.named_modules():  # RetinaNet's and FCOS's heads start every score near 0.01
        if name.startswith("head.") and isinstance(module, torch.nn.Conv2d):
            module.reset_parameters()  # spread them: default init for the head's convolutions
        if name.endswith("cls_logits"):
            torch.nn.init.normal_(module.weight, std=1.0)
            torch.nn.init.constant_(module.bias, -2.0)
    return model.eval()


class FirstImage(torch.nn.Module):
    """A detector taking one image tensor and returning its detections (a dict), as one exports it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.model([image])[0]


class CallsBatchedNms(torch.nn.Module):
    """A model of one's own calling ``torchvision.ops.batched_nms``."""

    def forward(self, boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torchvision.ops.batched_nms(boxes, scores, labels, 0.5)


def patch_samples() -> dict[str, list[Any]]:
    """``{patch name: [ModelSample, ...]}``: the small detectors that run through each patch."""
    from opreg.testing import ModelSample

    def runs(kind: str) -> list[Any]:
        """The detector on images giving no, one and several detections."""
        model, chosen = calibrated_quickly(kind)
        return [ModelSample.of(FirstImage(model), image) for image in chosen]

    g = _generator(2)
    many = _boxes(1500, 200.0, g)  # > 4000 coordinates: torchvision loops over classes instead
    nms_call = CallsBatchedNms()
    batched = [
        ModelSample.of(nms_call, many, torch.rand(1500, generator=g), torch.randint(0, 5, (1500,), generator=g)),
        ModelSample.of(nms_call, many[:30], torch.rand(30, generator=g), torch.randint(0, 3, (30,), generator=g)),
        ModelSample.of(nms_call, torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64)),
    ]
    return {
        "batched_nms": [*batched, *runs("retinanet")[2:]],
        "nms_fake_size": runs("fasterrcnn")[:2],
        "multiscale_roi_align": runs("fasterrcnn")[2:],
        "box_coder_decode": runs("keypointrcnn")[2:],
        "heatmaps_to_keypoints": runs("keypointrcnn")[1:],
        "paste_masks_in_image": runs("maskrcnn"),
        "resize_image": [*runs("fcos")[2:], ModelSample.of(FirstImage(detector("fasterrcnn")), torch.rand(3, 48, 80))],
    }


def set_score_thresh(model: torch.nn.Module, value: float) -> None:
    """Set a detector's score threshold (its ``roi_heads`` for the R-CNNs)."""
    holder = getattr(model, "roi_heads", model)
    holder.score_thresh = value


def candidate_images(count: int = 8, seed: int = 5, size: int = SIZE) -> list[torch.Tensor]:
    """``count`` images: black, then textures (noise at several scales and contrasts), whose pixels all
    differ, so no two detections score exactly alike (equal scores make NMS keep either box)."""
    g = _generator(seed)
    found = [torch.zeros(3, size, size)]
    while len(found) < count:
        coarse = torch.rand(3, 4 * len(found), 4 * len(found), generator=g)
        smooth = torch.nn.functional.interpolate(coarse[None], size=(size, size), mode="bilinear")[0]
        found.append((smooth + 0.2 * torch.rand(3, size, size, generator=g)).clamp(0, 1))
    return found


CALIBRATED = {
    "fasterrcnn": (0, 0.26595062017440796, (0, 2, 1)),
    "maskrcnn": (1, 0.2572617530822754, (4, 1, 3)),
    "keypointrcnn": (0, 0.4972148686647415, (0, 1, 4)),
    "retinanet": (0, 0.23858840763568878, (4, 1, 3)),
    "fcos": (4, 0.840898185968399, (7, 0, 5)),
    "ssd": (0, 0.3419808894395828, (0, 2, 1)),
    "ssdlite": (0, 0.32713985443115234, (0, 3, 1)),
}
"""What :func:`calibrated` finds for each kind at the default size, as ``(seed, score threshold, indices of
the candidate images giving no, one and several detections)``: :func:`calibrated_quickly` uses it without
running the detector on every candidate (the suite's tests check the counts, so a drift shows)."""


def calibrated_quickly(kind: str) -> tuple[torch.nn.Module, list[Any]]:
    """:func:`calibrated`'s result for ``kind`` from :data:`CALIBRATED`, the detector run once as
    :func:`calibrated` leaves it: the R-CNNs' ``MultiScaleRoIAlign`` infers its feature scales from the first
    image it sees and keeps them, so a first image of another size would give other detections."""
    seed, threshold, chosen = CALIBRATED[kind]
    candidates = candidate_images()
    model = detector(kind, threshold, seed=seed)
    with torch.no_grad():
        model([candidates[0]])
    return model, [candidates[i] for i in chosen]


def calibrated(
    kind: str, *, seed: int = 0, size: int = SIZE, many: int = 3, tries: int = 5
) -> tuple[torch.nn.Module, list[Any]]:
    """A :func:`detector` of ``kind`` and three images on which it detects nothing, exactly one object and
    ``many`` or more: its score threshold is set between the two best scores of the second image, above
    every score of the first, below ``many`` scores of the third (a detector keeps the same detections
    above a higher threshold, minus those scored below it), with margins of 1e-4 and no two detections of
    the third image within 1e-5 of each other. Detectors of seeds ``seed``, ``seed + 1``, ... are tried
    until one fits (random detectors score alike; some seeds give no such images). Raises ``LookupError``
    if none of ``tries`` does."""
    for attempt in range(seed, seed + tries):
        found = _calibrate(detector(kind, 0.0, seed=attempt, size=size), candidate_images(size=size), many)
        if found is not None:
            return found
    raise LookupError(f"no score threshold gives {kind} no, one and {many}+ detections on the candidate images")


def _calibrate(model: torch.nn.Module, candidates: list[torch.Tensor], many: int) -> Any:
    with torch.no_grad():
        scores = [model([image])[0]["scores"].sort(descending=True).values.tolist() for image in candidates]
    cap = getattr(model, "roi_heads", model).detections_per_img

    def distinct(values: list[float]) -> bool:
        return all(a - b > 1e-5 for a, b in itertools.pairwise(values))

    for one, top in enumerate(scores):
        if len(top) < 2 or top[0] - top[1] < 1e-4:
            continue
        threshold = (top[0] + top[1]) / 2
        zero = next((i for i, s in enumerate(scores) if i != one and (not s or s[0] < threshold - 1e-4)), None)
        lots = next((
            i for i, s in enumerate(scores)
            if i != one and many <= len(above := [v for v in s if v > threshold]) < cap
            and min(above) > threshold + 1e-4 and distinct(above)
        ), None)  # fmt: skip
        if zero is not None and lots is not None:
            set_score_thresh(model, threshold)
            return model, [candidates[zero], candidates[one], candidates[lots]]
    return None
