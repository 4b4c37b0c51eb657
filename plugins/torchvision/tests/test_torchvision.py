"""opreg-torchvision: torchvision's ops exported and checked by the conformance kit, and each detector
class of torchvision.models.detection exported with a data-dependent number of detections, checked
against eager PyTorch on images giving none, one and many.

The detectors are torchvision's own classes on a small backbone at 64 pixels (``samples.detector``);
``bench/detection.py`` exports the full models. Here torchvision's C++ ops come from the test shim."""

from __future__ import annotations

import pytest
import torch

import opreg

torchvision = pytest.importorskip("torchvision")

from opreg_torchvision import samples  # noqa: E402 - needs torchvision

OUTPUTS = {
    "fasterrcnn": ("boxes", "labels", "scores"),
    "maskrcnn": ("boxes", "labels", "scores", "masks"),
    "keypointrcnn": ("boxes", "labels", "scores", "keypoints", "keypoints_scores"),
    "retinanet": ("boxes", "scores", "labels"),
    "fcos": ("boxes", "scores", "labels"),
    "ssd": ("boxes", "scores", "labels"),
    "ssdlite": ("boxes", "scores", "labels"),
}


def test_conformance(opreg_pack_check):
    opreg_pack_check("torchvision").assert_ok()


def canonical(detections: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detections in one order whatever order equal scores came in: by score (rounded to 1e-5, so
    ONNX Runtime's last-digit differences do not reorder), then label, then box."""
    boxes = detections["boxes"].double()
    keys = [boxes[:, i] for i in (3, 2, 1, 0)] + [detections["labels"].double(), -detections["scores"].double().round(
        decimals=5)]  # fmt: skip
    order = torch.arange(len(boxes))
    for key in keys:  # least significant first, stable sorts
        order = order[torch.sort(key[order], stable=True).indices]
    return {name: value[order] for name, value in detections.items()}


def assert_same_detections(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], kind: str) -> None:
    assert set(got) == set(expected) == set(OUTPUTS[kind])
    got, expected = canonical(got), canonical(expected)
    for name in OUTPUTS[kind]:
        tolerance = {"masks": 1e-4, "keypoints": 1e-3}.get(name, 1e-4)
        torch.testing.assert_close(got[name], expected[name], rtol=tolerance, atol=tolerance, msg=name)


@pytest.mark.parametrize("kind", samples.KINDS)
def test_detector_exports_with_a_data_dependent_number_of_detections(kind):
    model, images = samples.calibrated_quickly(kind)
    wrapped = samples.FirstImage(model)
    program = opreg.export(wrapped, (images[2],))  # the default target (ai.onnx 23): RoIAlign by GridSample
    applied = {o.name for o in program.capture_patches if o.status == "applied"}
    assert {"batched_nms", "nms_fake_size"} <= applied
    for image, count in zip(images, (0, 1, None), strict=True):
        with torch.no_grad():
            expected = wrapped(image)
        assert (count is None and len(expected["scores"]) >= 3) or len(expected["scores"]) == count
        assert_same_detections(program.run(image), expected, kind)


@pytest.mark.parametrize("kind", ["fasterrcnn", "ssdlite"])
def test_detector_takes_images_of_any_size(kind):
    """The image size is dynamic too: R-CNNs resize by the shorter side (the resize_image patch keeps the
    scale an expression of it), SSDs to their fixed size."""
    model, images = samples.calibrated_quickly(kind)
    wrapped = samples.FirstImage(model)
    height, width = torch.export.Dim("height", min=32, max=256), torch.export.Dim("width", min=32, max=256)
    program = opreg.export(wrapped, (images[2],), dynamic_shapes={"image": {1: height, 2: width}})
    assert [d for d in program.model.graph.inputs[0].shape][1:] == ["height", "width"]
    for size in ((48, 80), (100, 60), (64, 64)):
        image = torch.nn.functional.interpolate(images[2][None], size=size, mode="bilinear")[0]
        with torch.no_grad():
            expected = wrapped(image)
        assert_same_detections(program.run(image), expected, kind)


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "lraspp_mobilenet_v3_large"])
def test_classification_and_segmentation_models_keep_exporting(name):
    model = torchvision.models.get_model(name, weights=None, weights_backbone=None).eval()
    if name == "mobilenet_v3_small":
        model = torchvision.models.get_model(name, weights=None).eval()
    x = torch.rand(1, 3, 64, 64)
    program = opreg.export(model, (x,))
    assert not [o for o in program.capture_patches if o.status == "applied" and o.calls]
    program.verify(x, rtol=1e-3, atol=1e-4)


def test_every_impl_is_checked_against_its_ops_schema():
    """With torchvision imported (the pack never imports it itself), each impl's signature is checked."""
    import torchvision  # noqa: F401  (defines torchvision::* here, whichever tests ran before in this process)
    from opreg_torchvision import keypoints

    keypoints.define()  # as the capture patch does when it patches Keypoint R-CNN
    registry = opreg.build_registry(plugins=["torchvision"])
    impls = [i for i in registry.impls() if i.pack == "torchvision"]
    assert len(impls) == 11 and all(i.schema_checked for i in impls), [i.label for i in impls if not i.schema_checked]
