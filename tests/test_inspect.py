"""``opreg inspect`` says whether a file is usable: broken files are never summarised as fine."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch

import opreg
from tests.test_cli import run


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A model with external data (a Linear of 64x64: its weight goes to the data file)."""
    folder = tmp_path_factory.mktemp("inspect")
    program = opreg.export(torch.nn.Linear(64, 64).eval(), (torch.randn(2, 64),), target=18)
    return program.save(folder / "linear.onnx", external_data=True)


def copy_pair(saved: Path, folder: Path) -> tuple[Path, Path]:
    (data,) = saved.parent.glob("linear.onnx.*.data")
    model, copied = folder / saved.name, folder / data.name
    model.write_bytes(saved.read_bytes())
    copied.write_bytes(data.read_bytes())
    return model, copied


def inspect(capsys, path: Path) -> tuple[int, dict | None, str]:
    code, out, err = run(capsys, "inspect", str(path), "--json")
    return code, json.loads(out) if out else None, err


def test_a_good_model_is_usable(capsys, saved):
    code, report, _ = inspect(capsys, saved)
    assert code == 0 and report["usable"] and report["problems"] == []
    assert report["initializers"]["external"]
    code, out, _ = run(capsys, "inspect", str(saved))
    assert code == 0 and "usable: onnx.checker accepts the model with its data" in out


def test_an_empty_file_is_refused(capsys, tmp_path):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    code, report, err = inspect(capsys, empty)
    assert code == 2 and report is None and "is empty (0 bytes)" in err


def test_a_file_cut_mid_field_is_refused(capsys, saved, tmp_path):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    code, _, err = inspect(capsys, cut)
    assert code == 2 and "not a readable ONNX model (truncated or not ONNX)" in err


@pytest.mark.parametrize(
    ("field", "problem"),
    [("graph", "the model has no graph"), ("opset_import", "the model imports no opset")],
)
def test_a_file_cut_at_a_field_boundary_is_unusable(capsys, saved, tmp_path, field, problem):
    model, _ = copy_pair(saved, tmp_path)
    proto = onnx.load(str(model), load_external_data=False)
    proto.ClearField(field)  # what a truncation that ends between two top-level fields leaves
    model.write_bytes(proto.SerializeToString())
    code, report, _ = inspect(capsys, model)
    assert code == 1 and not report["usable"] and any(problem in p for p in report["problems"]), report["problems"]


def test_a_missing_data_file_is_unusable(capsys, saved, tmp_path):
    model, data = copy_pair(saved, tmp_path)
    data.unlink()
    code, report, _ = inspect(capsys, model)
    assert code == 1 and report["problems"] == [
        f"external data file {data.name} is missing (expected beside the model in {tmp_path})"
    ]
    code, out, _ = run(capsys, "inspect", str(model))
    assert code == 1 and "unusable: external data file" in out


def test_a_truncated_data_file_is_unusable(capsys, saved, tmp_path):
    model, data = copy_pair(saved, tmp_path)
    data.write_bytes(data.read_bytes()[:100])
    code, report, _ = inspect(capsys, model)
    assert code == 1 and "is truncated: 100 bytes, the weights need 16,384" in report["problems"][0]


def test_an_opset_the_installed_onnx_does_not_know_is_unusable(capsys, saved, tmp_path):
    model, _ = copy_pair(saved, tmp_path)
    proto = onnx.load(str(model), load_external_data=False)
    proto.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    model.write_bytes(proto.SerializeToString())
    code, report, _ = inspect(capsys, model)
    assert code == 1 and "newer than the installed onnx" in report["problems"][0]


def test_a_directory_and_a_missing_file_are_named(capsys, tmp_path):
    assert "is a directory" in inspect(capsys, tmp_path)[2]
    assert "no such file" in inspect(capsys, tmp_path / "nope.onnx")[2]


class Branchy(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x.sin() * 2, lambda x: x.cos(), (x,))


def test_subgraphs_are_counted_and_their_provenance_shown(capsys, tmp_path):
    path = opreg.export(Branchy().eval(), (torch.randn(3),), target=18).save(tmp_path / "branchy.onnx")
    code, report, _ = inspect(capsys, path)
    assert code == 0
    ops = {row["op"]: row["count"] for row in report["ops"]}
    assert ops["If"] == 1 and ops["Sin"] == ops["Mul"] == ops["Cos"] == 1  # nodes inside the branches are counted
    then_branch, else_branch = report["subgraphs"]
    assert (then_branch["op"], then_branch["attribute"], then_branch["nodes"]) == ("If", "then_branch", 2)
    assert then_branch["torch_op"] == "cond" and then_branch["packs"] == {"core": 2}
    assert else_branch["nodes"] == 1
    code, out, _ = run(capsys, "inspect", str(path))
    assert "subgraphs" in out and "then_branch" in out
