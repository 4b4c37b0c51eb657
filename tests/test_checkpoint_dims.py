"""A checkpoint's dims in the ONNX model: named as the loader names them, whether torch.export
captured them as a named ``Dim``, a multiple of one (``M * Dim("NAME_divM")``) or ``Dim.AUTO``
(``DynamicDim(auto=True)``: a length whose guards torch cannot prove over the range), on a
throwaway pack installed as a real distribution."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg

FRAMES = '''
import torch


class Frames(torch.nn.Module):
    """Frames of a signal (kernel 10, stride 5), and a picture's 4 x 4 patches summed."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(1, 3, 10, stride=5)

    def forward(self, signal, picture):
        if signal.shape[1] == BRANCH:
            signal = signal * 2
        b, h, w = picture.shape
        patches = picture.reshape(b, h // 4, 4, w // 4, 4).sum(dim=(2, 4))
        return {"frames": self.conv(signal[:, None]).transpose(1, 2), "patches": patches}


def recognise(checkpoint):
    if checkpoint.json("frames.json") is None:
        return None
    return opreg.Recognition("frames", ("frames",), "frames", "frames.json")


def plan(checkpoint, task):
    dims = (
        opreg.DynamicDim("batch_size", 2, 3),
        opreg.DynamicDim("length", example=43, other=61, min=20, auto=True),
        opreg.DynamicDim("side", example=8, other=12, min=4, max=64, multiple=4),
    )
    inputs = (
        opreg.ModelInput("signal", ("batch_size", "length"), "float32", "normal"),
        opreg.ModelInput("picture", ("batch_size", "side", "side"), "float32", "normal"),
    )
    component = opreg.Component("model", "model.onnx", Frames, inputs, ("frames", "patches"), dims)
    return opreg.ExportPlan("frames", task, (component,))


@opreg.hookimpl
def opreg_checkpoint_loaders():
    return [opreg.CheckpointLoader("frames", "frames", "frames.json", recognise, plan)]
'''


@pytest.fixture
def frames(tmp_path: Path) -> Path:
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "frames.json").write_text("{}")
    return folder


def shapes(values) -> dict[str, list]:
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def test_auto_and_multiple_dims_keep_the_loaders_names_in_every_shape(make_pack, frames, tmp_path):
    module = importlib.import_module(make_pack("frames", "BRANCH = -1\n" + FRAMES))
    result = opreg.export_checkpoint(frames, tmp_path / "out")
    assert [len(m.verified) for m in result.models] == [2]
    model = onnx.load(tmp_path / "out" / "model.onnx")
    assert shapes(model.graph.input) == {"signal": ["batch_size", "length"], "picture": ["batch_size", "side", "side"]}
    outputs = shapes(model.graph.output)
    assert outputs["patches"] == ["batch_size", "(side//4)", "(side//4)"]
    assert outputs["frames"][0] == "batch_size" and "length" in outputs["frames"][1] and outputs["frames"][2] == 3
    bounds = json.loads({p.key: p.value for p in model.metadata_props}["opreg.dim_bounds"])
    assert bounds["side"] == [8, 64]  # the multiple's bounds in pixels (torch.export starts its range at 2 patches)
    session = onnxruntime.InferenceSession(tmp_path / "out" / "model.onnx", providers=["CPUExecutionProvider"])
    signal, picture = torch.randn(1, 333), torch.randn(1, 20, 20)  # sizes neither verified
    got = session.run(None, {"signal": signal.numpy(), "picture": picture.numpy()})
    with torch.no_grad():
        want = module.Frames()(signal, picture)
    assert got[0].shape == (1, 65, 3) and got[1].shape == (1, 5, 5)
    np.testing.assert_allclose(got[0], want["frames"].numpy(), rtol=1e-5, atol=1e-5)


def test_an_auto_dim_torch_fixes_is_refused_naming_it(make_pack, frames, tmp_path):
    make_pack("frames", "BRANCH = 43\n" + FRAMES)  # the example's length takes a branch of its own
    with pytest.raises(opreg.ExportError, match=r"torch.export fixed length \(dim 1 of signal\) at 43"):
        opreg.export_checkpoint(frames, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_auto_dim_takes_no_multiple():
    with pytest.raises(opreg.InvalidArgumentError, match="auto must be True or False, and True only without"):
        opreg.DynamicDim("length", example=8, other=12, multiple=4, auto=True)
