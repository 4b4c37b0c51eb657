"""`opreg check`, `opreg export` and `opreg inspect` on a model file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from opreg.targets import DEFAULT_ONNX_OPSET
from tests.test_cli import run

MODEL_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.fc = nn.Linear(4 * 6 * 6, 5)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv(x)), 2)
            return self.fc(torch.flatten(x, 1))


    if not hasattr(torch.ops.opreg_cli_tests, "secret"):  # each test loads this file anew
        @torch.library.custom_op("opreg_cli_tests::secret", mutates_args=())
        def _secret(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @_secret.register_fake
        def _(x):
            return torch.empty_like(x)

    secret = torch.ops.opreg_cli_tests.secret


    class Partly(nn.Module):
        def forward(self, x):
            return secret(torch.inverse(torch.relu(x)))


    def make():
        torch.manual_seed(0)
        return Net().eval(), (torch.randn(2, 1, 14, 14),)


    def partly():
        return Partly(), (torch.randn(4, 4),), {}


    def broken():
        return "not a module", ()
    """
)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(MODEL_FILE)
    return path


def test_check_passes_a_covered_model(capsys, model_file):
    code, out, _ = run(capsys, "check", f"{model_file}:make")
    assert code == 0
    assert "every op" in out


def test_check_lists_every_missing_op_and_exits_1(capsys, model_file):
    code, out, _ = run(capsys, "check", f"{model_file}:partly", "--json")
    assert code == 1
    report = json.loads(out)
    assert [m["op"] for m in report["missing"]] == ["aten::linalg_inv_ex.default", "opreg_cli_tests::secret.default"]
    assert all(m["count"] == 1 and "net.py:" in m["locations"][0] for m in report["missing"])
    assert report["missing"][0]["elsewhere"][0].startswith("ort_contrib:")

    code, out, _ = run(capsys, "check", f"{model_file}:partly")
    assert code == 1 and "aten::linalg_inv_ex.default" in out and "opreg_cli_tests::secret.default" in out


def test_export_writes_verifies_and_shows_stages(capsys, model_file, tmp_path):
    output = tmp_path / "net.onnx"
    code, out, err = run(
        capsys, "export", f"{model_file}:make", "-o", str(output), "--verify", "--dynamic", "x:0=batch", "-t", "18"
    )
    assert code == 0, err
    for stage in ("capture", "plan", "translate", "finish", "save", "verify"):
        assert f"done {stage}" in err
    assert "verified with onnxruntime" in out
    model = onnx.load(str(output))
    assert {o.domain: o.version for o in model.opset_import} == {"": 18}
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_export_of_an_uncovered_model_fails_with_the_list(capsys, model_file, tmp_path):
    output = tmp_path / "partly.onnx"
    code, _, err = run(capsys, "export", f"{model_file}:partly", "-o", str(output))
    assert code == 1
    assert "aten::linalg_inv_ex.default" in err and "opreg_cli_tests::secret.default" in err
    assert not output.exists()


def test_inspect_reports_opsets_ops_provenance_and_weights(capsys, model_file, tmp_path):
    output = tmp_path / "net.onnx"
    assert run(capsys, "export", f"{model_file}:make", "-o", str(output))[0] == 0
    code, out, _ = run(capsys, "inspect", str(output), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["ir_version"] == onnx.helper.find_min_ir_version_for(
        [onnx.helper.make_opsetid("", DEFAULT_ONNX_OPSET)]
    )
    assert report["opset_imports"] == {"ai.onnx": DEFAULT_ONNX_OPSET}
    ops = {(r["domain"], r["op"]): r["count"] for r in report["ops"]}
    assert ops[("ai.onnx", "Conv")] == 1 and ops[("ai.onnx", "Gemm")] == 1
    assert report["provenance"]["packs"] == {"core": report["node_count"]}
    assert {r["torch_op"] for r in report["provenance"]["torch_ops"]} >= {
        "aten::conv2d.default",
        "aten::linear.default",
    }
    assert report["initializers"] == {"count": 4, "bytes": (4 * 9 + 4 + 144 * 5 + 5) * 4, "external": False}

    code, out, _ = run(capsys, "inspect", str(output))
    assert code == 0 and "Conv" in out and "provenance" in out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nowhere.py:make", "does not exist"),
        ("{file}:missing", "has no 'missing'"),
        ("{file}:broken", "expected a torch.nn.Module"),
        ("{file}", "must be 'path/to/file.py:factory'"),
        ("no_such_module_xyz:make", "cannot import module"),
    ],
)
def test_bad_model_arguments_are_one_clear_line(capsys, model_file, spec, message):
    code, _, err = run(capsys, "check", spec.format(file=model_file))
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_dynamic_spec_names_the_inputs(capsys, model_file, tmp_path):
    code, _, err = run(capsys, "export", f"{model_file}:make", "-o", str(tmp_path / "m.onnx"), "--dynamic", "y:0")
    assert code == 2 and "forward has no input 'y'" in err and "x" in err


def test_inspect_of_a_non_model_file(capsys, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_text("not a model")
    code, _, err = run(capsys, "inspect", str(junk))
    assert code == 2 and "not a readable ONNX model" in err


def test_console_script_exports(model_file, tmp_path):
    output = tmp_path / "cli.onnx"
    script = Path(sys.executable).parent / "opreg"  # the console script of the environment running the suite
    proc = subprocess.run([script, "export", f"{model_file}:make", "-o", str(output)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert output.exists()
