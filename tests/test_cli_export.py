"""`opreg check`, `opreg export` and `opreg inspect` on a model file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from opreg.cli import main
from opreg.registry.targets import DEFAULT_ONNX_OPSET, MIN_ONNX_OPSET
from tests.test_cli import run

ROOT = Path(__file__).resolve().parents[1]

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


    def one():
        torch.manual_seed(0)
        return Net().eval(), (torch.randn(1, 1, 14, 14),)


    def warns():
        import warnings

        warnings.warn("the factory warns")
        return make()


    def partly():
        return Partly(), (torch.randn(4, 4),), {}


    def broken():
        return "not a module", ()


    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.norm(self.conv(x))


    def normed():
        torch.manual_seed(0)
        model = Normed()
        model.norm.running_mean.uniform_(-1, 1)
        return model.eval(), (torch.randn(2, 1, 8, 8),)


    class Rounding(nn.Module):
        def forward(self, x):
            from opreg_test_customop import addandround_op

            return addandround_op(x)


    def rounding():
        return Rounding(), (torch.tensor([0.25, 0.75, -1.3]),)


    def bf16():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.GELU()).to(torch.bfloat16), (torch.randn(2, 8, dtype=torch.bfloat16),)
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


def test_export_from_one_image_keeps_the_batch_dynamic(capsys, model_file, tmp_path):
    """``--dynamic x:0=batch`` from a factory's batch of one: the model runs at other batch sizes."""
    import runpy

    import onnxruntime
    import torch

    output = tmp_path / "one.onnx"
    code, out, err = run(capsys, "export", f"{model_file}:one", "-o", str(output), "--dynamic", "x:0=batch", "--verify")
    assert code == 0, err
    assert "verified with onnxruntime" in out
    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", 1, 14, 14]
    model, _ = runpy.run_path(str(model_file))["one"]()
    for batch in (3, 5):
        x = torch.randn(batch, 1, 14, 14)
        (got,) = session.run(None, {"x": x.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), model(x).detach(), rtol=1e-4, atol=1e-5)


def test_export_dynamic_auto_reports_the_fixed_dims_and_inspect_shows_them(capsys, model_file, tmp_path):
    output = tmp_path / "auto.onnx"
    code, out, err = run(capsys, "export", f"{model_file}:one", "-o", str(output), "--dynamic", "auto", "--json")
    assert code == 0, err
    fixed = json.loads(out)["fixed_dims"]
    assert [(f["input"], f["dim"], f["size"], f["guard"]) for f in fixed] == [
        ("x", 1, 1, "guard x.shape[1] == 1"),
    ]
    assert fixed[0]["source"].endswith("in forward") and "net.py:" in fixed[0]["source"]
    # the Linear after the flatten needs the image to pool to 6x6: a guard the ONNX model cannot check
    (guard,) = json.loads(out)["shape_guards"]
    assert json.loads(out)["grown_dims"] == []  # captured from its example: the dims torch fixed are reported
    assert guard["dims"] == ["x.shape[2]", "x.shape[3]"] and guard["guard"].endswith(" == 144")
    assert guard["source"].endswith("in forward") and "net.py:" in guard["source"]
    (line,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "does not check" in line and f"{guard['guard']} ({guard['source']})" in line
    code, out, _ = run(capsys, "inspect", str(output))
    assert code == 0
    assert "inputs: x FLOAT['x_dim0', 1, 'x_dim2', 'x_dim3']" in out
    assert "fixed by torch.export" in out and "x.shape[1] == 1" in out
    assert f"shape guard the model does not check: x.shape[2], x.shape[3]: {guard['guard']}" in out
    code, out, _ = run(capsys, "inspect", str(output), "--json")
    assert json.loads(out)["fixed_dims"] == fixed and json.loads(out)["shape_guards"] == [guard]
    both = ("--dynamic", "auto", "--dynamic", "x:0")
    code, _, err = run(capsys, "export", f"{model_file}:one", "-o", str(output), *both)
    assert code == 2 and "--dynamic auto makes every dim dynamic: give it alone" in err


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
    # the onnx profile is a ceiling: Conv-11 and Gemm-13 need no more than opreg's oldest target
    assert report["ir_version"] == 10  # opset 18 allows IR 8; node metadata needs 10
    assert report["opset_imports"] == {"ai.onnx": MIN_ONNX_OPSET} and DEFAULT_ONNX_OPSET > MIN_ONNX_OPSET
    assert report["opset_floors"] == {"ai.onnx": {"version": MIN_ONNX_OPSET, "set_by": []}}
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
    """Through the console script, from a factory that warns: the warning (no pack's fault, no
    shape guard) is shown as Python shows it, once. Showing it while the command still recorded
    warnings recorded it again, endlessly: the process is capped, so that fails, not the machine."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    output = tmp_path / "cli.onnx"
    script = Path(sys.executable).parent / "opreg"  # the console script of the environment running the suite
    command = [script, "export", f"{model_file}:warns", "-o", str(output)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, preexec_fn=cap)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert output.exists()
    assert proc.stderr.count("UserWarning: the factory warns") == 1


# -- every flag the docs name ----------------------------------------------------------------------


def test_version_prints_the_installed_distributions(capsys):
    import importlib.metadata

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"opreg {importlib.metadata.version('opreg')}\n"


def test_keep_functions_keeps_script_impls_as_model_local_functions(capsys, model_file, tmp_path):
    """test_customop's impl is an @onnxscript.script function: inlined by default, kept with the flag."""
    for flag, functions in (((), []), (("--keep-functions",), [("test.customop", "custom_addandround")])):
        output = tmp_path / f"rounding{len(flag)}.onnx"
        code, _, err = run(capsys, "export", f"{model_file}:rounding", "-o", str(output), "-t", "test_customop", *flag)
        assert code == 0, err
        model = onnx.load(str(output))
        assert [(f.domain, f.name) for f in model.functions] == functions
        called = [(n.domain, n.op_type) for n in model.graph.node]
        assert (("test.customop", "custom_addandround") in called) == bool(flag)


def test_keep_weights_keeps_every_weight_as_the_state_dict_has_it(capsys, model_file, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("net_for_keep_weights", model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state = module.normed()[0].state_dict()
    for flag in ((), ("--keep-weights",)):
        output = tmp_path / f"normed{len(flag)}.onnx"
        assert run(capsys, "export", f"{model_file}:normed", "-o", str(output), "--verify", *flag)[0] == 0
        model = onnx.load(str(output))
        ops = [n.op_type for n in model.graph.node]
        weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
        metadata = {p.key for p in model.metadata_props}
        if flag:
            assert ops == ["Conv", "BatchNormalization"] and "opreg.folded_weights" not in metadata
            assert set(weights) == {k for k in state if k != "norm.num_batches_tracked"}
            for name, value in weights.items():
                assert (value == state[name].numpy()).all(), name
        else:  # batch norm folded into the convolution, the metadata saying how
            assert ops == ["Conv"] and "opreg.folded_weights" in metadata
            assert not (weights["conv.weight"] == state["conv.weight"].numpy()).all()


def test_external_data_writes_weights_beside_the_model(capsys, model_file, tmp_path):
    output = tmp_path / "net.onnx"
    assert run(capsys, "export", f"{model_file}:make", "-o", str(output), "--external-data")[0] == 0
    (data,) = [p.name for p in tmp_path.iterdir() if p.name != "net.onnx" and p.suffix == ".data"]
    assert re.fullmatch(r"net\.onnx\.[0-9a-f]{8}\.data", data)
    code, out, _ = run(capsys, "inspect", str(output), "--json")
    assert code == 0 and json.loads(out)["initializers"]["external"] is True
    without = tmp_path / "inline.onnx"
    assert run(capsys, "export", f"{model_file}:make", "-o", str(without))[0] == 0
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".data"] == [data]  # small weights stay inside


def test_the_docs_name_every_flag_and_command_the_cli_has():
    """README's table names every command, docs/exporting.md every flag of `opreg export`, and
    each flag they name exists (the tests above run each of export's)."""
    import argparse

    from opreg.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    readme = (ROOT / "README.md").read_text()
    for name in commands.choices:
        assert f"`opreg {name}" in readme, f"README's CLI table lacks opreg {name}"
    export = commands.choices["export"]
    flags = {f for a in export._actions for f in a.option_strings if f.startswith("--") and f != "--help"}
    guide = (ROOT / "docs" / "exporting.md").read_text()
    for flag in flags:
        assert f"`{flag}" in guide, f"docs/exporting.md does not document opreg export {flag}"
    named = set(re.findall(r"`(--[a-z][a-z0-9-]*)", readme + guide))

    def parsers(parser_):  # every parser, nested commands' (opreg llm export) too
        yield parser_
        for action in parser_._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    known = {f for parser_ in parsers(parser) for a in parser_._actions for f in a.option_strings}
    assert named <= known, f"the docs name flags the CLI lacks: {sorted(named - known)}"


def test_export_verify_says_the_file_was_written_when_the_runtime_cannot_run_it(capsys, model_file, tmp_path):
    """issue 53: --verify exited 2 on a runtime error without saying the .onnx was written. A bfloat16
    model ONNX Runtime's CPU provider has no kernels for: written, not verified, the nodes and the
    remedy named; with --keep-float32 it runs, verified at bfloat16's tolerances, which the line says."""
    output = tmp_path / "bf16.onnx"
    code, out, err = run(capsys, "export", f"{model_file}:bf16", "-o", str(output), "--verify")
    assert code == 2 and output.exists()
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"opreg: error: wrote {output}, but could not verify it: ONNX Runtime cannot load"), line
    assert "Gemm(13) on T=bfloat16 (its kernels take double, float)" in line and "--keep-float32" in line
    code, out, err = run(capsys, "export", f"{model_file}:bf16", "-o", str(output), "--verify", "--json")
    assert code == 2 and json.loads(out)["verified"] is False and "keep_float32" in json.loads(out)["error"]
    code, out, err = run(capsys, "export", f"{model_file}:bf16", "-o", str(output), "--verify", "--keep-float32")
    assert code == 0, err
    assert "match eager PyTorch (max abs 0; rtol=0.016, atol=1e-05 (bfloat16's default))" in out


def test_an_error_before_the_save_does_not_say_a_file_was_written(capsys, model_file, tmp_path):
    output = tmp_path / "net.onnx"
    code, _, err = run(capsys, "export", f"{model_file}:make", "-o", str(output), "--verify", "-t", "onnx,ai.onnx=99")
    assert code == 2 and not output.exists() and "wrote" not in err


def test_export_from_the_shell_exports_random_ops_where_onnx_runtime_runs_them(capsys, tmp_path):
    """``opreg export`` hands the exporter the target it resolved: the default profile still leaves
    ai.onnx open, so a model that draws random numbers is written at the opset its nodes need (below
    RandomNormalLike-22, which has no CPU kernel) and verified in ONNX Runtime."""
    path = tmp_path / "noise.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch


            class Noise(torch.nn.Module):
                def forward(self, x):
                    return x + torch.randn_like(x)


            def make():
                return Noise(), (torch.zeros(3),)
            """
        )
    )
    output = tmp_path / "noise.onnx"
    code, _, err = run(capsys, "export", f"{path}:make", "-o", str(output), "--verify")
    assert code == 1 and "differ from eager PyTorch (onnxruntime," in err  # ran in ONNX Runtime: random values
    assert {o.domain: o.version for o in onnx.load(str(output)).opset_import} == {"": MIN_ONNX_OPSET}
    code, _, err = run(capsys, "export", f"{path}:make", "-o", str(output), "-t", "onnx,ai.onnx=23")
    assert code == 0 and {o.domain: o.version for o in onnx.load(str(output)).opset_import} == {"": 23}
