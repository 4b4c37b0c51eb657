"""Bad input, faults and surprises, each met with the right behaviour: one clear line that
names the thing and says what to do (exit code 2 or 1 on the command line, an ``OpregError``
subclass in Python), or correct output; and nothing half-written left on disk.

One table per surface. The interrupt cases (SIGKILL, SIGTERM, SIGINT in the middle of a
save) are in ``tests/test_save.py``, which signals a real child process at a point it
chooses; ``tests/test_inspect.py`` has the broken files ``opreg inspect`` must refuse.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import opreg
from tests.test_cli import run

MODELS = textwrap.dedent(
    """
    import argparse, sys, torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x)

    def make():
        return Net().eval(), (torch.randn(2, 4),)

    def wrong_shape():
        return Net().eval(), (torch.randn(2, 5),)

    def exits():
        sys.exit(3)

    def parses():  # a script of its own: its argparse must not see opreg's arguments
        parser = argparse.ArgumentParser()
        parser.add_argument("--size", type=int, default=4)
        size = parser.parse_args().size
        return Net().eval(), (torch.randn(2, size),)

    class Marked(Net):
        def forward(self, x):
            open(sys.argv[0] + ".ran", "w").close()  # proof that the export started
            return super().forward(x)

    def marked():
        return Marked().eval(), (torch.randn(2, 4),)
    """
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    return tmp_path


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts)


@dataclasses.dataclass(frozen=True)
class Case:
    """One command line: its arguments (``{dir}`` is the test's folder), the exit code, a
    pattern its one line of error (or its output) must match, and the files left after."""

    argv: tuple[str, ...]
    code: int
    message: str
    files: tuple[str, ...] = ("models.py",)
    setup: Callable[[Path], None] | None = None


CLI_CASES = {
    # 3: a dim index past the input's rank, and a dim named twice
    "dynamic-dim-out-of-range": Case(
        ("export", "{dir}/models.py:make", "-o", "{dir}/m.onnx", "--dynamic", "x:5=seq"), 2,
        r"input 'x' has 2 dim\(s\), so DIM is 0 to 1 \(or -2 to -1\), not 5",
    ),
    "dynamic-dim-twice": Case(
        ("export", "{dir}/models.py:make", "-o", "{dir}/m.onnx", "--dynamic", "x:0=a,0=b"), 2,
        r"dim 0 of input 'x' is named twice",
    ),
    # 5: a pack named after an installed or well-known distribution would replace it
    "new-pack-torch": Case(
        ("new-pack", "torch", "-o", "{dir}/pack"), 2, r"installed here \(version .*\): installing the new pack would"
    ),
    "new-pack-installed": Case(
        ("new-pack", "opreg-ort-contrib", "-o", "{dir}/pack"), 2, r"'opreg-ort-contrib', one of opreg's own packages"
    ),
    # 6: unwritable locations, named as the user gave them, never a hidden temp file
    "export-to-proc": Case(
        ("export", "{dir}/models.py:make", "-o", "/proc/m.onnx"), 2,
        r"cannot write /proc/m.onnx: cannot create files in /proc .*choose a writable location",
    ),
    "export-to-a-directory": Case(("export", "{dir}/models.py:make", "-o", "{dir}"), 2, r"it is a directory"),
    "new-pack-to-sys": Case(("new-pack", "opreg-zz", "-o", "/sys/zz"), 2, r"cannot create files in /sys"),
    "new-pack-missing-parent": Case(
        ("new-pack", "opreg-zz", "-o", "{dir}/no/pack"), 2, r"directory .*/no does not exist: create it first"
    ),
    # 10: the output path is checked before the export starts (the model's forward never runs)
    "output-checked-first": Case(("export", "{dir}/models.py:marked", "-o", "/proc/m.onnx"), 2, r"cannot write"),
    # 13: typo'd and duplicate target domains, duplicate dims, a typo'd pack, and targets a user cannot guess
    "target-typo-domain": Case(
        ("explain", "aten::relu", "-t", "onnx,com.microsfot=1"), 2, r"did you mean 'com.microsoft'\?"
    ),
    "target-twice": Case(("explain", "aten::relu", "-t", "ai.onnx=18,ai.onnx=20"), 2, r"gives ai.onnx twice"),
    "target-empty": Case(("explain", "aten::relu", "-t", ""), 2, r"the target is empty: write a profile name"),
    "target-no-ai-onnx": Case(
        ("explain", "aten::relu", "-t", "com.microsoft=1"), 2, r"e\.g\. 'onnx,com\.microsoft=1' or '18,"
    ),
    "target-too-old": Case(("explain", "aten::relu", "-t", "17"), 2, r"use a version from 18 to \d+"),
    "exclude-typo": Case(("plugins", "-p", "no:ort_contirb"), 2, r"no installed pack named 'ort_contirb'"),
    "factory-exits": Case(
        ("check", "{dir}/models.py:exits"), 2, r"called sys\.exit\(3\) while opreg loaded it: a factory must return"
    ),
    "model-path-is-a-directory": Case(("check", "{dir}:make"), 2, r"is a directory; MODEL names a Python file in it"),
    # 13: a script's own argparse does not see opreg's arguments: the export works
    "script-with-argparse": Case(
        ("export", "{dir}/models.py:parses", "-o", "{dir}/m.onnx"), 0, r"wrote .*m\.onnx", ("m.onnx", "models.py")
    ),
    # 13: -o through a symlink writes its target and keeps the link
    "output-through-symlink": Case(
        ("export", "{dir}/models.py:make", "-o", "{dir}/link.onnx"), 0, r"wrote .*real\.onnx",
        ("link.onnx", "models.py", "real.onnx"), lambda d: (d / "link.onnx").symlink_to(d / "real.onnx"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_command_line(capsys, folder, name):
    case = CLI_CASES[name]
    if case.setup is not None:
        case.setup(folder)
    argv = [a.format(dir=folder) for a in case.argv]
    code, out, err = run(capsys, *argv)
    assert code == case.code, (out, err)
    if code == 2:
        assert err.startswith("opreg: error: ") and err.count("\n") == 1, err
        assert "Traceback" not in err and ".opreg-staging" not in err
    assert re.search(case.message, err if code else out), (out, err)
    assert files(folder) == sorted(case.files), files(folder)
    if name == "output-through-symlink":
        assert (folder / "link.onnx").is_symlink()


def test_a_torch_error_is_one_line_without_its_traceback(folder):
    """11: torch logs the traceback of the error it raises; the command line shows one line."""
    done = subprocess.run(
        [sys.executable, "-m", "opreg", "export", f"{folder}/models.py:wrong_shape", "-o", f"{folder}/m.onnx"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if not line.startswith("done ")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "must have same reduction dim" in errors[0] and "Traceback" not in done.stderr
    assert files(folder) == ["models.py"]


TIE = """
from onnxscript.onnx_opset import opset18 as op18


def aten_relu(self):
    return op18.Relu(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::relu", aten_relu, opset=18)
"""


def test_a_tie_with_the_core_pack_is_reported_and_fails_strict(capsys, make_pack):
    """4: the tie goes to core, not to the name that sorts first; plugins lists it, strict refuses it."""
    make_pack("aaa", TIE)
    code, out, _ = run(capsys, "plugins")
    assert code == 0 and "1 conflict(s)" in out and "aten::relu.default: core:aten_relu, aaa:aten_relu" in out
    code, out, _ = run(capsys, "plugins", "--json")
    assert {r["name"]: r["conflicts"] for r in json.loads(out)}["aaa"] == ["aten::relu.default"]
    code, _, err = run(capsys, "plugins", "--strict")
    assert code == 1 and "tie (settle it with prefer=" in err
    code, _, err = run(capsys, "plugins", "--strict", "--prefer", "aten::relu=aaa")
    assert code == 0
    code, out, _ = run(capsys, "explain", "aten::relu", "-t", "18")
    assert "the core pack wins ties" in out


def test_a_failed_packs_profile_names_the_failure(capsys, make_pack):
    """12: a profile a failed pack would have defined is not just 'unknown'."""
    make_pack("broken", "raise ImportError('missing dependency frob')\n")
    code, _, err = run(capsys, "explain", "aten::relu", "-t", "brokenprofile")
    assert code == 2 and "unknown target profile 'brokenprofile'" in err
    assert "packs that did not load and may define it: pack 'broken'" in err and "missing dependency frob" in err


def test_a_slow_pack_is_reported_and_fails_the_kit(capsys, make_pack, monkeypatch):
    """12: a pack that takes seconds to import is not healthy. The pack sleeps 2 s, eight times the
    threshold the test sets: no machine is fast enough to miss it."""
    monkeypatch.setenv(opreg.plugins.SLOW_IMPORT_ENV, "0.25")
    outranking = TIE.replace("opset=18)", "opset=18, priority=1)")  # no tie here: only the import is slow
    make_pack("sleepy", "import time\ntime.sleep(2.0)\n" + outranking)
    _, out, _ = run(capsys, "plugins", "--json")
    reports = {r["name"]: r for r in json.loads(out)}
    assert reports["sleepy"]["status"] == "loaded" and reports["sleepy"]["seconds"] >= 2
    assert "slow import: importing opreg_testpack_sleepy" in reports["sleepy"]["reason"]
    from opreg.testing import check_pack

    (row,) = [r for r in check_pack("sleepy").results if r.check == "import"]
    assert row.status == "failed" and "importing the pack takes" in row.detail and "more than 0.25 s" in row.detail
    monkeypatch.setenv(opreg.plugins.SLOW_IMPORT_ENV, "60")  # the suite's threshold: every pack is fast enough
    opreg.plugins.clear_cache()
    _, out, _ = run(capsys, "plugins", "--json")
    assert "slow import" not in {r["name"]: r for r in json.loads(out)}["sleepy"]["reason"]
    (row,) = [r for r in check_pack("sleepy").results if r.check == "import"]
    assert row.status == "passed"


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_wrong_slow_import_threshold_is_named(monkeypatch, value):
    monkeypatch.setenv(opreg.plugins.SLOW_IMPORT_ENV, value)
    with pytest.raises(opreg.InvalidArgumentError, match=f"OPREG_SLOW_IMPORT_SECONDS='{value}': give a positive"):
        opreg.plugins.slow_import_seconds()


def test_a_failed_pack_is_logged_once_per_process_with_its_traceback_at_debug(make_pack, caplog):
    """12: Python output is quiet: one WARNING line per failed pack, the traceback at DEBUG."""
    make_pack("broken", "raise ImportError('missing dependency frob')\n")
    with caplog.at_level(logging.DEBUG, logger="opreg"):
        opreg.plugins.build_registry()
        opreg.plugins.build_registry()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "'broken'" in r.getMessage()]
    assert len(warnings) == 1 and "missing dependency frob" in warnings[0].getMessage()
    assert warnings[0].exc_info is None
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


X = torch.randn(2, 4)


@pytest.fixture(scope="module")
def program():
    return opreg.export(Net().eval(), (X,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})


PYTHON_CASES = {
    # 3
    "dynamic-dim-out-of-range": (
        lambda p: opreg.export(Net().eval(), (X,), dynamic_shapes={"x": {5: torch.export.Dim("b")}}),
        opreg.ExportError, r"names dim 5 of input 'x', which has 2 dim\(s\): use 0 to 1",
    ),
    # 7
    "registry-as-a-string": (
        lambda p: opreg.export(Net().eval(), (X,), registry="core"),
        opreg.InvalidArgumentError, r"registry= takes an opreg.Registry .* got str 'core'",
    ),
    "plugins-as-a-string": (
        lambda p: opreg.export(Net().eval(), (X,), plugins="ort_contrib"),
        opreg.InvalidArgumentError, r"plugins= takes a list of pack names, got the string 'ort_contrib'",
    ),
    # 9: run and verify take the inputs the model takes, or say which one is wrong and how
    "run-wrong-width": (
        lambda p: p.run(torch.randn(2, 5)), opreg.InvalidInputError, r"dim 1 of input 'x' is fixed at 4 .* got 5",
    ),
    "verify-wrong-dtype": (
        lambda p: p.verify(X.double()), opreg.InvalidInputError, r"input 'x' must be torch.float32, got torch.float64",
    ),
    "run-wrong-count": (
        lambda p: p.run(X, X), opreg.InvalidInputError,
        r"expected 1 positional argument\(s\) and no keyword arguments, got 2 positional",
    ),
    "reference-wrong-rank": (
        lambda p: p.run(torch.randn(4), runtime="reference"), opreg.InvalidInputError,
        r"input 'x' must have 2 dim\(s\) \[batch, 4\], got shape \(4,\)",
    ),
    # 6
    "save-to-proc": (lambda p: p.save("/proc/m.onnx"), opreg.SaveError, r"cannot create files in /proc"),
    "save-to-missing-folder": (
        lambda p: p.save("/nonexistent-folder/m.onnx"), opreg.SaveError, r"does not exist; create it first",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PYTHON_CASES))
def test_python_api(program, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    call, error, message = PYTHON_CASES[name]
    with pytest.raises(error, match=message):
        call(program)
    assert list(tmp_path.iterdir()) == []


def test_verify_leaves_a_training_module_as_it_was():
    """verify runs eager PyTorch on a copy of a module in train(): its statistics do not move."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    program = opreg.export(model, (torch.randn(8, 4),), target=18)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    program.verify(torch.randn(8, 4))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- an impl's result is checked as it is produced, and the fault is the impl's ----------------------


def _relu_returning_none(self):
    return None


def _relu_as_double(self):
    from onnxscript.onnx_opset import opset18 as op

    return op.Cast(op.Relu(self), to=11)  # DOUBLE where torch computes FLOAT


def _relu_flattened(self):
    from onnxscript.onnx_opset import opset18 as op

    return op.Reshape(op.Relu(self), op.Constant(value_ints=[-1]))  # rank 1 where torch keeps rank 2


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


@pytest.mark.parametrize(
    ("impl", "message"),
    [
        (_relu_returning_none, r"returned None where the op has a FLOAT rank-2 tensor output"),
        (_relu_as_double, r"returned a DOUBLE tensor where torch computes FLOAT"),
        (_relu_flattened, r"returned a rank-1 tensor where torch computes rank 2"),
    ],
    ids=["none", "dtype", "rank"],
)
@pytest.mark.parametrize("way", ["pack", "table"])
def test_a_wrong_impl_result_is_an_error_naming_the_pack_impl_and_node(impl, message, way):
    if way == "pack":
        registry = opreg.default_registry().copy()
        registrar = opreg.Registrar("brokenpack")
        assert registrar.register("aten::relu", impl, opset=18, priority=5) is not None
        registry.add(*registrar.impls)
    else:
        registry = opreg.pack_from_translation_table("brokentable", {torch.ops.aten.relu.default: impl}, priority=5)
    pack = "brokenpack" if way == "pack" else "brokentable"
    where = rf"impl {pack}:{impl.__name__} for aten::relu(\.default)? \(node relu"
    with pytest.raises(opreg.ExportError, match=rf"{where}.*{message}"):
        opreg.export(_Block().eval(), (torch.randn(2, 4),), registry=registry, target=18)
