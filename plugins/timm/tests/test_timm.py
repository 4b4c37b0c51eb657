"""opreg-timm: timm folders (``save_for_hf``'s ``config.json`` with ``architecture`` and
``pretrained_cfg``, and the weights) exported by ``opreg export FOLDER`` as optimum-onnx 0.1.0 lays
a timm model out; a ViT's sides fixed (timm's ``fixed_input_size``), a ResNet's any size, verified
at two sizes by the export and run by ONNX Runtime at a third; the refusals before any export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg

timm = pytest.importorskip("timm")


def test_conformance(opreg_pack_check):
    opreg_pack_check("timm").assert_ok()


def save(folder: Path, architecture: str, **kwargs) -> torch.nn.Module:
    """A tiny random timm model saved as the hub holds it (``save_for_hf``)."""
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model(architecture, pretrained=False, num_classes=3, **kwargs).eval()
    save_for_hf(model, folder, safe_serialization=True)
    return model


@pytest.mark.parametrize(
    ("architecture", "kwargs", "sides", "third"),
    [
        ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2), [32, 32], None),
        ("resnet18", dict(layers=[1, 1, 1, 1]), ["height", "width"], (1, 3, 96, 45)),
    ],
)
def test_a_timm_folder_is_exported_for_image_classification(architecture, kwargs, sides, third, tmp_path):
    eager = save(tmp_path / "ckpt", architecture, **kwargs)
    result = opreg.export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert (result.loader, result.library, result.inferred) == ("timm:timm", "timm", True)
    assert result.task == "image-classification"
    assert f"architecture {architecture!r}" in result.evidence
    assert result.files == ("config.json", "model.onnx") and [len(m.verified) for m in result.models] == [2]
    assert json.loads((result.folder / "config.json").read_text())["architecture"] == architecture  # copied as it is
    model = onnx.load(result.folder / "model.onnx")
    (pixels,) = model.graph.input
    assert pixels.name == "pixel_values"
    assert [d.dim_param or d.dim_value for d in pixels.type.tensor_type.shape.dim] == ["batch_size", 3, *sides]
    assert [o.name for o in model.graph.output] == ["logits"]
    if third is not None:  # a size neither verified, through the file alone, against the model timm saved
        x = torch.randn(third)
        session = onnxruntime.InferenceSession(result.folder / "model.onnx", providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {"pixel_values": x.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(got, eager(x).numpy(), rtol=1e-4, atol=1e-4)


def test_a_timm_folder_without_weights_or_with_an_unknown_architecture_is_refused(tmp_path):
    save(tmp_path / "ckpt", "resnet18", layers=[1, 1, 1, 1])
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    with pytest.raises(opreg.CheckpointError, match=r"has no weights \(model.safetensors, pytorch_model.bin\)"):
        opreg.export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, "architecture": "resnet_from_the_future"}))
    with pytest.raises(opreg.CheckpointError, match=r"architecture 'resnet_from_the_future', which timm .* does not"):
        opreg.export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_transformers_loader_leaves_timm_folders_to_this_one(tmp_path):
    save(tmp_path / "ckpt", "resnet18", layers=[1, 1, 1, 1])
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, "model_type": "resnet"}))
    with pytest.raises(opreg.CheckpointError, match="no loader of that library recognises"):
        opreg.export_checkpoint(tmp_path / "ckpt", tmp_path / "out", library="transformers")
