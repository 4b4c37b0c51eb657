"""``opreg inspect`` says whether a file is usable: broken files are never summarised as fine."""

from __future__ import annotations

import json
import re
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


def _external_entry(proto: onnx.ModelProto, key: str, value: str) -> None:
    (tensor,) = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    entries = {e.key: e.value for e in tensor.external_data}
    entries[key] = value
    del tensor.external_data[:]
    for k, v in entries.items():
        tensor.external_data.add(key=k, value=v)


def _unknown_type(proto: onnx.ModelProto) -> None:
    proto.graph.initializer[0].data_type = 99
    proto.graph.input[0].type.tensor_type.elem_type = 99


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda p: _external_entry(p, "offset", "-64"), r"tensor 'weight' has external data offset '-64': it must be "
         r"a whole number >= 0"),
        (lambda p: _external_entry(p, "length", "lots"), r"external data length 'lots': it must be a whole number"),
        (_unknown_type, r"tensor 'weight' has data type 99, which no ONNX version defines"),
        (lambda p: _external_entry(p, "location", "../elsewhere.data"), r"external data location '../elsewhere.data' "
         r"of tensor 'weight' goes up with '..': runtimes read external data only from the model's folder"),
        (lambda p: _external_entry(p, "location", "/etc/passwd"), r"'/etc/passwd' of tensor 'weight' is an absolute "
         r"path"),
        (lambda p: _external_entry(p, "location", "zero"), r"'zero' of tensor 'weight' is a link to /dev/zero, outside "
         r"the model's folder"),
        (lambda p: _external_entry(p, "location", "fifo"), r"external data file fifo is a FIFO \(named pipe\), not a "
         r"regular file"),
        (lambda p: _external_entry(p, "location", "a\0b.data"), r"external data location 'a\\x00b.data' of tensor "
         r"'weight' holds a NUL character: no file can have that name"),  # round 4: it was an internal error
    ],
    ids=["negative-offset", "length-not-a-number", "unknown-data-type", "dot-dot", "absolute", "link-out", "fifo",
         "nul"],
)  # fmt: skip
def test_a_model_with_bad_external_data_or_types_is_unusable_with_the_reason(capsys, saved, tmp_path, edit, problem):
    import os

    model, _ = copy_pair(saved, tmp_path)
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    proto = onnx.load(str(model), load_external_data=False)
    edit(proto)
    model.write_bytes(proto.SerializeToString())
    code, report, err = inspect(capsys, model)
    assert code == 1 and not report["usable"], err
    assert any(re.search(problem, p) for p in report["problems"]), report["problems"]
    code, out, _ = run(capsys, "inspect", str(model))  # the table is printed, the reason too
    assert code == 1 and "unusable: " in out and "nodes by op" in out


@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("fifo", r"a FIFO \(named pipe\)")])
def test_a_device_or_a_fifo_is_named_not_called_empty(capsys, tmp_path, path, kind):
    import os

    if path == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)  # opening it would block: it must not be opened
    code, report, err = inspect(capsys, path)
    assert code == 2 and report is None
    assert re.fullmatch(rf"opreg: error: {path} is {kind}, not a regular file: give an \.onnx file\n", err), err
