"""Bad input, faults and surprises, each met with the right behaviour: one clear line that
names the thing and says what to do (exit code 2 or 1 on the command line, an ``OpregError``
subclass in Python), or correct output; and nothing half-written left on disk.

One table per surface. The interrupt cases (SIGKILL, SIGTERM, SIGINT in the middle of a
save) are in ``tests/test_save.py``, which signals a real child process at a point it
chooses; ``tests/test_inspect.py`` has the broken files ``opreg inspect`` must refuse.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from onnxscript.onnx_opset import opset18 as op18

import opreg
import opreg.packs.plugins
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

    def four():
        return Net().eval(), (torch.randn(2, 4),), {}, "extra"

    def big():  # 16 KB of weights: they go to a data file with --external-data
        return torch.nn.Linear(64, 64).eval(), (torch.randn(2, 64),)

    def relu():
        return torch.nn.Sequential(Net(), torch.nn.ReLU()).eval(), (torch.randn(2, 4),)
    """
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    return tmp_path


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts)


def same_files(names: list[str], patterns: tuple[str, ...]) -> bool:
    """Whether ``names`` (sorted) are the files ``patterns`` (regexes, in the names' order) describe."""
    return len(names) == len(patterns) and all(re.fullmatch(p, n) for p, n in zip(patterns, names, strict=True))


@dataclasses.dataclass(frozen=True)
class Case:
    """One command line: its arguments (``{dir}`` is the test's folder), the exit code, a
    pattern its one line of error (or its output) must match, and the files left after."""

    argv: tuple[str, ...]
    code: int
    message: str
    files: tuple[str, ...] = ("models.py",)
    """Regexes, one per file left, in the order of the sorted names."""
    setup: Callable[[Path], None] | None = None
    after: Callable[[Path], None] | None = None
    """More checks of what is on disk."""


LONG = "a" * 300
"""A file name over the 255 bytes of common file systems."""
LONGISH = "a" * 250
"""A model name that fits (255 bytes with .onnx), but not its data file's name (+14)."""


def foreign_model(folder: Path) -> None:
    """m.onnx from elsewhere, whose external data is the user's victim.txt."""
    from tests.test_save import foreign_model as write

    write(folder / "m.onnx", "victim.txt")
    (folder / "victim.txt").write_bytes(b"user data")


def saved_and_copied(folder: Path) -> None:
    """m.onnx saved by opreg with its data file, and `cp m.onnx m_backup.onnx`."""
    opreg.export(torch.nn.Linear(64, 64).eval(), (torch.randn(2, 64),)).save(folder / "m.onnx", external_data=True)
    (folder / "m_backup.onnx").write_bytes((folder / "m.onnx").read_bytes())


def backup_still_loads(folder: Path) -> None:
    import onnxruntime

    from opreg.exporter._save import referenced_data

    assert referenced_data(folder / "m_backup.onnx") != referenced_data(folder / "m.onnx")
    for name in ("m.onnx", "m_backup.onnx"):
        onnxruntime.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])


DATA = r"m\.onnx\.[0-9a-f]{8}\.data"


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
    "new-pack-to-sys": Case(("new-pack", "opreg-zz", "--empty", "-o", "/sys/zz"), 2, r"cannot create files in /sys"),
    "new-pack-missing-parent": Case(
        ("new-pack", "opreg-zz", "--empty", "-o", "{dir}/no/pack"), 2, r"directory .*/no does not exist: create it"
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
    "target-too-old": Case(("explain", "aten::relu", "-t", "15"), 2, r"use a version from 16 to \d+"),
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
    # round 3, defect 1: an export over a model deletes only the data file opreg wrote for it
    "foreign-location-is-kept": Case(
        ("export", "{dir}/models.py:make", "-o", "{dir}/m.onnx"), 0, r"wrote .*m\.onnx",
        ("m.onnx", "models.py", "victim.txt"), foreign_model,
        lambda d: (d / "victim.txt").read_bytes() == b"user data" or pytest.fail("victim.txt changed"),
    ),
    "copy-keeps-its-data": Case(
        ("export", "{dir}/models.py:big", "-o", "{dir}/m.onnx", "--external-data"), 0, r"wrote .*m\.onnx",
        ("m.onnx", DATA, DATA, "m_backup.onnx", "models.py"), saved_and_copied, backup_still_loads,
    ),
    # round 3, defect 7: a name the file system cannot hold, said before the export starts
    "name-too-long": Case(
        ("export", "{dir}/models.py:marked", "-o", f"{{dir}}/{LONG}.onnx"), 2,
        r"the file name is 305 bytes, more than the 255 the file system allows; choose a shorter one",
    ),
    "data-name-too-long": Case(
        ("export", "{dir}/models.py:marked", "-o", f"{{dir}}/{LONGISH}.onnx", "--external-data"), 2,
        r"with external data: the data file's name .* would be 269 bytes, .* choose a model file name of at most "
        r"241 bytes",
    ),
    # round 3, smaller gaps
    "prefer-a-misspelled-op": Case(
        ("check", "{dir}/models.py:make", "--prefer", "aten::rleu=core"), 2,
        r"cannot prefer pack 'core' for aten::rleu.default: it has no impl of it \(did you mean aten::relu.default\?\)",
    ),
    "prefer-a-pack-without-the-op": Case(
        ("export", "{dir}/models.py:make", "-o", "{dir}/m.onnx", "--prefer", "aten::relu=ort_contrib"), 2,
        r"cannot prefer pack 'ort_contrib' for aten::relu.default: it has no impl of it \(packs with an impl of it: "
        r"core\)",
    ),
    "external-data-on-small-weights": Case(
        ("export", "{dir}/models.py:make", "-o", "{dir}/m.onnx", "--external-data"), 0,
        r"note: no weight is over 256 bytes, so every weight is inside .*m\.onnx and --external-data wrote no "
        r"data file", ("m.onnx", "models.py"),
    ),
    "factory-returns-four": Case(
        ("check", "{dir}/models.py:four"), 2,
        r"models.py:four returned a tuple of 4 items; it must return \(module, args\) or \(module, args, kwargs\)",
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
    assert same_files(files(folder), case.files), files(folder)
    if case.after is not None:
        case.after(folder)
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
    monkeypatch.setenv(opreg.packs.plugins.SLOW_IMPORT_ENV, "0.25")
    outranking = TIE.replace("opset=18)", "opset=18, priority=1)")  # no tie here: only the import is slow
    make_pack("sleepy", "import time\ntime.sleep(2.0)\n" + outranking)
    _, out, _ = run(capsys, "plugins", "--json")
    reports = {r["name"]: r for r in json.loads(out)}
    assert reports["sleepy"]["status"] == "loaded" and reports["sleepy"]["seconds"] >= 2
    assert "slow import: importing opreg_testpack_sleepy" in reports["sleepy"]["reason"]
    from opreg.testing import check_pack

    (row,) = [r for r in check_pack("sleepy").results if r.check == "import"]
    assert row.status == "failed" and "importing the pack takes" in row.detail and "more than 0.25 s" in row.detail
    monkeypatch.setenv(opreg.packs.plugins.SLOW_IMPORT_ENV, "60")  # the suite's threshold: every pack is fast enough
    opreg.packs.plugins.clear_cache()
    _, out, _ = run(capsys, "plugins", "--json")
    assert "slow import" not in {r["name"]: r for r in json.loads(out)}["sleepy"]["reason"]
    (row,) = [r for r in check_pack("sleepy").results if r.check == "import"]
    assert row.status == "passed"


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_wrong_slow_import_threshold_is_named(monkeypatch, value):
    monkeypatch.setenv(opreg.packs.plugins.SLOW_IMPORT_ENV, value)
    with pytest.raises(opreg.InvalidArgumentError, match=f"OPREG_SLOW_IMPORT_SECONDS='{value}': give a positive"):
        opreg.packs.plugins.slow_import_seconds()


def test_a_failed_pack_is_logged_once_per_process_with_its_traceback_at_debug(make_pack, caplog):
    """12: Python output is quiet: one WARNING line per failed pack, the traceback at DEBUG."""
    make_pack("broken", "raise ImportError('missing dependency frob')\n")
    with caplog.at_level(logging.DEBUG, logger="opreg"):
        opreg.packs.plugins.build_registry()
        opreg.packs.plugins.build_registry()
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


class Loud(Net):
    """A model whose capture would say so: a wrong argument must be refused before it."""

    def forward(self, x):
        raise AssertionError("the model was captured")


def _relu_as_max(self):
    from onnxscript.onnx_opset import opset18 as op

    return op.Max(self, op.CastLike(0.0, self))


RELU_TABLE = {torch.ops.aten.relu.default: _relu_as_max}


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
    # round 3, defect 7 and Python arguments: one clear error, before anything is captured or written
    "save-name-too-long": (
        lambda p: p.save(f"{LONG}.onnx"), opreg.SaveError,
        r"the file name is 305 bytes, more than the 255 the file system allows; choose a shorter one",
    ),
    "save-data-name-too-long": (
        lambda p: p.save(f"{LONGISH}.onnx", external_data=True), opreg.SaveError,
        r"the data file's name .* would be 269 bytes",
    ),
    "save-path-too-long": (
        lambda p: p.save("x/" * 3000 + "m.onnx"), opreg.SaveError, r"the file name or path is too long",
    ),
    "save-none": (lambda p: p.save(None), opreg.InvalidArgumentError, r"a path is a str or a pathlib.Path .*got None"),
    "save-nul": (lambda p: p.save("a\0b"), opreg.InvalidArgumentError, r"holds a NUL character"),
    "save-number": (lambda p: p.save(3), opreg.InvalidArgumentError, r"a path is a str .*got int 3"),
    "export-none": (
        lambda p: opreg.export(None, (X,)), opreg.InvalidArgumentError,
        r"the model to export is a torch.nn.Module or a torch.export.ExportedProgram, got None$",
    ),
    "export-a-function": (
        lambda p: opreg.export(torch.relu, (X,)), opreg.InvalidArgumentError,
        r"got builtin_function_or_method .*: wrap it in a torch.nn.Module whose forward calls it",
    ),
    "export-a-class": (
        lambda p: opreg.export(Net, (X,)), opreg.InvalidArgumentError, r"pass an instance, e.g. Model\(\)",
    ),
    "args-a-list": (
        lambda p: opreg.export(Loud(), [X, X]), opreg.InvalidArgumentError,
        r"args= takes a tuple .*got a list of 2: write tuple\(args\) for that many inputs, or \(args,\)",
    ),
    "args-a-dict": (
        lambda p: opreg.export(Loud(), {"x": X}), opreg.InvalidArgumentError, r"pass keyword inputs as kwargs=",
    ),
    "args-a-number": (lambda p: opreg.export(Loud(), 3), opreg.InvalidArgumentError, r"got int 3: write \(value,\)"),
    "kwargs-a-list": (
        lambda p: opreg.export(Loud(), (X,), [X]), opreg.InvalidArgumentError, r"kwargs= takes a dict .*got list",
    ),
    "seed-a-string": (
        lambda p: opreg.export(Loud(), (X,), seed="x"), opreg.InvalidArgumentError,
        r"seed= takes an int \(or None for unseeded random nodes\), got str 'x'",
    ),
    "seed-a-bool": (lambda p: opreg.export(Loud(), (X,), seed=True), opreg.InvalidArgumentError, r"got bool True"),
    "inline-a-string": (
        lambda p: opreg.export(Loud(), (X,), inline="no"), opreg.InvalidArgumentError,
        r"inline= takes True, False or a node count N >= 0 .*got str 'no'",
    ),
    "optimize-a-string": (
        lambda p: opreg.export(Loud(), (X,), optimize="no"), opreg.InvalidArgumentError,
        r"optimize= takes True or False, got str 'no'",
    ),
    "verify-negative-rtol": (
        lambda p: p.verify(X, rtol=-1), opreg.InvalidArgumentError,
        r"rtol= takes a tolerance: a finite number >= 0 such as 1e-4, or None for the dtype's default "
        r"\(torch.testing's\), got -1",
    ),
    "verify-string-atol": (lambda p: p.verify(X, atol="a"), opreg.InvalidArgumentError, r"atol= .* got 'a'"),
    "verify-string-rtol": (lambda p: p.verify(X, rtol="a"), opreg.InvalidArgumentError, r"rtol= .* got 'a'"),
    "prefer-a-misspelled-op": (
        lambda p: opreg.default_registry(prefer={"aten::rleu": "core"}), opreg.InvalidArgumentError,
        r"cannot prefer pack 'core' for aten::rleu.default: it has no impl of it \(did you mean aten::relu.default\?\)",
    ),
    "verify-nan-rtol": (lambda p: p.verify(X, rtol=float("nan")), opreg.InvalidArgumentError, r"got nan"),
    # round 4: locate's tolerances are checked as verify's; a runtime is one of three names
    "locate-negative-atol": (
        lambda p: p.locate(X, atol=-1), opreg.InvalidArgumentError,
        r"^atol= takes a tolerance: a finite number >= 0 such as 1e-4, or None for the dtype's default "
        r"\(torch.testing's\), got -1$",
    ),
    "locate-string-rtol": (lambda p: p.locate(X, rtol="a"), opreg.InvalidArgumentError, r"^rtol= .* got 'a'$"),
    "locate-infinite-atol": (lambda p: p.locate(X, atol=float("inf")), opreg.InvalidArgumentError, r"got inf$"),
    "locate-bool-rtol": (lambda p: p.locate(X, rtol=True), opreg.InvalidArgumentError, r"got True$"),
    "verify-runtime-typo": (
        lambda p: p.verify(X, runtime="ort"), opreg.InvalidArgumentError,
        r"^runtime= takes 'onnxruntime', 'reference', 'auto', got 'ort'$",
    ),
    "locate-runtime-none": (lambda p: p.locate(X, runtime=None), opreg.InvalidArgumentError, r"got None$"),
    "verify-locate-a-string": (
        lambda p: p.verify(X, locate="yes"), opreg.InvalidArgumentError,
        r"^locate= takes True or False, got str 'yes'$",
    ),
    # round 3, defect 5: a translation table's pack name is its own
    "table-named-core": (
        lambda p: opreg.pack_from_translation_table("core", RELU_TABLE), opreg.InvalidArgumentError,
        r"pack name 'core' is taken by the installed pack 'core' \(opreg .*\): the table's impls would pass as "
        r"that pack's; pass a name of your own, e.g. pack_from_translation_table\('core_table', table\)",
    ),
    "table-named-ort-contrib": (
        lambda p: opreg.pack_from_translation_table("ort_contrib", RELU_TABLE), opreg.InvalidArgumentError,
        r"'ort_contrib' is taken by the installed pack 'ort_contrib' \(opreg-ort-contrib",
    ),
    "table-named-after-an-excluded-pack": (
        lambda p: opreg.pack_from_translation_table(
            "test_customop", RELU_TABLE, registry=opreg.default_registry(exclude=["test_customop"])
        ),
        opreg.InvalidArgumentError, r"'test_customop' is taken by the installed pack",
    ),
    "table-named-after-a-pack-of-the-registry": (
        lambda p: opreg.pack_from_translation_table(
            "mylib", RELU_TABLE, registry=opreg.pack_from_translation_table("mylib", RELU_TABLE)
        ),
        opreg.InvalidArgumentError, r"'mylib' is taken by pack 'mylib' of the registry",
    ),
    "table-named-user": (
        lambda p: opreg.pack_from_translation_table("<user>", RELU_TABLE), opreg.InvalidArgumentError,
        r"opreg's name for impls registered by hand",
    ),
    "table-named-42": (
        lambda p: opreg.pack_from_translation_table(42, RELU_TABLE), opreg.InvalidArgumentError,
        r"first argument names the new pack, a non-empty string such as 'mylib', got int 42",
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
    """verify runs eager PyTorch on a copy of a module in train(): its statistics do not move,
    nor does the program's state."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    for state in ("io", "drop"):
        program = opreg.export(model, (torch.randn(8, 4),), target=18, state=state)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        kept = {k: v.clone() for k, v in program.state.items()}
        program.verify(torch.randn(8, 4))
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert program.state.keys() == kept.keys() and all(torch.equal(kept[k], program.state[k]) for k in kept)


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


def _relu_twice(self):
    from onnxscript.onnx_opset import opset18 as op

    return op.Relu(self), op.Relu(self)  # two values for an op with one output


def _max_values_only(self, dim: int, keepdim: bool = False):
    from onnxscript.onnx_opset import opset18 as op

    return op.ReduceMax(self, [dim], keepdims=int(keepdim))  # max.dim also returns the indices


def _rand_like_as_double(
    self,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    memory_format: str | None = None,
):
    from onnxscript.onnx_opset import opset18 as op

    return op.RandomUniformLike(self, dtype=11)  # DOUBLE where torch draws FLOAT


def _returning_none(like: Callable, name: str) -> Callable:
    """An impl with ``like``'s signature that returns None."""

    @functools.wraps(like)
    def impl(*args, **kwargs):
        return None

    impl.__name__ = impl.__qualname__ = name
    return impl


_rand_like_returning_none = _returning_none(_rand_like_as_double, "_rand_like_returning_none")


def _complex_mul_of_real_parts(self, other):
    from onnxscript.onnx_opset import opset18 as op

    real = op.Gather(self, 0, axis=-1)  # drops the trailing pair dimension complex values travel with
    return op.Mul(real, op.Gather(other, 0, axis=-1))


def _complex_mul_returning_none(self, other):
    return None


class _MaxDim(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.max(x, dim=1)
        return values, indices


class _Noise(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)


class _ComplexMul(torch.nn.Module):
    def forward(self, a, b):
        return a * b


A = torch.randn(3, dtype=torch.complex64)


@pytest.mark.parametrize(
    ("op", "impl", "complex_", "model", "inputs", "message"),
    [
        ("aten::relu", _relu_twice, False, _Block(), (X,), r"returned 2 values; the op has one output"),
        ("aten::max.dim", _max_values_only, False, _MaxDim(), (X,), r"returned 1 value\(s\); the op has 2 outputs"),
        (
            "aten::rand_like", _rand_like_as_double, False, _Noise(), (X,),
            r"returned a DOUBLE tensor where torch computes FLOAT",
        ),
        (
            "aten::rand_like", _rand_like_returning_none, False, _Noise(), (X,),
            r"returned None where the op has a FLOAT rank-2 tensor output",
        ),
        (
            "aten::mul.Tensor", _complex_mul_of_real_parts, True, _ComplexMul(), (A, A),
            r"returned a rank-1 tensor where torch computes rank 2 \(shape \(3,\)\)",
        ),
        (
            "aten::mul.Tensor", _complex_mul_returning_none, True, _ComplexMul(), (A, A),
            r"returned None where the op has a FLOAT rank-2 tensor output",
        ),
    ],
    ids=["two-for-one", "one-for-two", "random-dtype", "random-none", "complex-rank", "complex-none"],
)  # fmt: skip
def test_wrong_results_of_multi_output_random_and_complex_impls_name_the_pack(
    op, impl, complex_, model, inputs, message
):
    registry = opreg.default_registry().copy()
    registrar = opreg.Registrar("brokenpack")
    assert registrar.register(op, impl, opset=18, priority=5, complex=complex_) is not None, registrar.rejected
    registry.add(*registrar.impls)
    where = rf"impl brokenpack:{impl.__name__} for {re.escape(str(opreg.OpName.of(op)))} \(node "
    with pytest.raises(opreg.ExportError, match=rf"{where}.*{message}"):
        opreg.export(model.eval(), inputs, registry=registry, target=18)


# -- round 3 through the command line: failed packs, a wrong impl, a live save, an OSError ----------

NONE_RELU = """
import sys


@opreg.impl("aten::relu", opset=18, priority=1)
def aten_relu(self):
    return None


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register_module(sys.modules[__name__])
"""


def test_check_and_export_report_failed_packs_and_fail_on_one_asked_for(capsys, folder, make_pack):
    make_pack("broken", "raise ImportError('missing dependency frob')\n")
    code, _, err = run(capsys, "check", f"{folder}/models.py:make")
    assert code == 0, err
    assert re.search(r"warning: pack 'broken' did not load and is left out: .*missing dependency frob", err), err
    for command in ("check", "export"):
        output = ["-o", f"{folder}/m.onnx"] if command == "export" else []
        argv = [command, f"{folder}/models.py:make", "-p", "broken", *output]
        code, _, err = run(capsys, *argv)
        assert code == 1 and err.count("\n") == 1, err
        assert re.fullmatch(
            r"opreg: error: pack 'broken', asked for with -p broken, did not load: .*missing dependency frob.*; "
            r"fix or reinstall it \(opreg-testpack-broken\), or leave out -p broken\n",
            err,
        ), err
    assert [f for f in files(folder) if not f.startswith("site")] == ["models.py"]  # site: the packs


def test_export_names_the_pack_whose_impl_returned_none(capsys, folder, make_pack):
    """Defect 2 on the command line: no model with a constant NaN output, but the pack named."""
    make_pack("nonepack", NONE_RELU)
    code, _, err = run(capsys, "export", f"{folder}/models.py:relu", "-o", f"{folder}/m.onnx")
    err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("done "))  # progress
    assert code == 2 and err.count("\n") == 1, err
    assert re.search(
        r"impl nonepack:aten_relu for aten::relu.default \(node relu.*returned None where the op has a FLOAT rank-2 "
        r"tensor output: return the ONNX value the impl computed",
        err,
    ), err
    assert [f for f in files(folder) if not f.startswith("site")] == ["models.py"]


def test_export_keeps_the_staging_folder_of_a_live_save_whatever_its_pid(capsys, folder):
    """Defect 6 on the command line: another container's save (a PID that means nothing here)
    holds its folder's lock, so the folder stays; once the lock is free, the next export removes it."""
    import fcntl

    from opreg.exporter._save import STAGING_PREFIX

    staging = folder / f"{STAGING_PREFIX}999999999-live"
    staging.mkdir()
    (staging / "m.onnx").write_bytes(b"half written")
    fd = os.open(staging / "lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code, _, err = run(capsys, "export", f"{folder}/models.py:make", "-o", f"{folder}/m.onnx")
        assert code == 0, err
        assert (staging / "m.onnx").read_bytes() == b"half written"
    finally:
        os.close(fd)
    code, _, err = run(capsys, "export", f"{folder}/models.py:make", "-o", f"{folder}/m.onnx")
    assert code == 0 and files(folder) == ["m.onnx", "models.py"], err


def _small_file_size_limit() -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_any_os_error_while_saving_is_one_save_error_line(folder):
    """Defect 7: an OSError met while writing (here EFBIG: a file-size limit of 4 KB, the model
    has 16 KB of weights) is one line, and nothing is left behind."""
    done = subprocess.run(
        [sys.executable, "-m", "opreg", "export", f"{folder}/models.py:big", "-o", f"{folder}/m.onnx"],
        capture_output=True, text=True, check=False, preexec_fn=_small_file_size_limit,
    )  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if not line.startswith("done ")]
    assert done.returncode == 2 and errors == [
        f"opreg: error: cannot write {folder}/m.onnx: file too large; check the location and the device, or "
        "choose another location"
    ], done.stderr
    assert files(folder) == ["models.py"]


def test_export_help_says_a_model_file_is_run():
    from opreg.cli import build_parser

    text = " ".join(build_parser()._subparsers._group_actions[0].choices["export"].format_help().split())
    assert "opreg runs that file, with its folder first on sys.path" in text


def test_save_takes_a_bytes_path(program, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert program.save(b"m.onnx") == Path("m.onnx") and files(tmp_path) == ["m.onnx"]


class _Stateful(torch.nn.Module):
    """Batch norm in training: a buffer mutation (exported as state, state="io"), so the export decomposes too."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm = torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return torch.nn.functional.gelu(self.norm(self.fc(x)))


def test_exports_from_several_threads_all_succeed():
    """torch.export's tracing state is global: opreg captures one model at a time (without the
    lock, about 3 in 4 of these exports fail inside torch). The models are made here, not in the
    threads: ``torch.manual_seed`` called while another thread captures can fail inside torch
    (``KeyError: 'custom'``), a race opreg's lock cannot reach (docs/exporting.md, "Threads")."""
    from concurrent.futures import ThreadPoolExecutor

    cases = []
    for seed in range(12):
        torch.manual_seed(seed)
        cases.append((_Stateful().train(), torch.randn(8, 4)))

    def export_and_verify(case: tuple[torch.nn.Module, torch.Tensor]) -> float:
        model, x = case
        return opreg.export(model, (x,), target=18, state="io").verify(x).outputs[0].max_abs

    with ThreadPoolExecutor(max_workers=6) as pool:
        errors = list(pool.map(export_and_verify, cases))
    assert len(errors) == 12 and max(errors) < 1e-4


_EAGER_RUNS: list[bool] = []
"""For each eager call of ``opreg_threads::probe``: whether another thread could take the capture lock."""


def _capture_lock_free() -> bool:
    from opreg.exporter._capture import TRACING_LOCK

    taken: list[bool] = []

    def try_it() -> None:
        taken.append(TRACING_LOCK.acquire(blocking=False))
        if taken[0]:
            TRACING_LOCK.release()

    other = threading.Thread(target=try_it)
    other.start()
    other.join()
    return taken[0]


def probe_impl(x):
    """probe(Tensor x) -> Tensor"""
    return op18.Add(x, op18.CastLike(1.0, x))


def test_eager_runs_of_verify_and_locate_hold_the_capture_lock():
    """While one thread captures, torch marks the whole process as exporting, and a custom op's
    Python kernel (kept from dynamo) then edits torch's global trace metadata: verify's and
    locate's eager runs take the capture lock, so they never run beside an opreg capture."""
    from tests.optest import Lambda

    if not hasattr(torch.ops.opreg_threads, "probe"):

        @torch.library.custom_op("opreg_threads::probe", mutates_args=())
        def probe(x: torch.Tensor) -> torch.Tensor:
            _EAGER_RUNS.append(_capture_lock_free())
            return x + 1

        probe.register_fake(torch.empty_like)
    registry = opreg.Registry()
    registry.register("opreg_threads::probe", probe_impl)
    model, x = Lambda(torch.ops.opreg_threads.probe), torch.randn(3)
    program = opreg.export(model, (x,), target=18, registry=registry)
    _EAGER_RUNS.clear()
    program.verify(x)
    program.locate(x)
    assert _EAGER_RUNS == [False, False]


# -- round four --------------------------------------------------------------------------------------


class _DoublesItsInput(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


@pytest.mark.parametrize("state", ["drop", "io"])
def test_verify_never_changes_the_callers_tensors(state):
    """Defect 1: eager and the ONNX model each run on their own copy of the inputs, whatever
    ``state=`` did with the in-place update: no false mismatch, the caller's tensor unchanged."""
    x = torch.arange(4.0)
    program = opreg.export(_DoublesItsInput(), (x.clone(),), target=18, state=state)
    kept = x.clone()
    assert program.verify(x).max_abs == 0
    assert torch.equal(x, kept)


class _ComplexState(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(3, dtype=torch.complex64))

    def forward(self, x, y):
        self.acc.add_(x)
        y.mul_(2)
        return self.acc * 2 + y


def test_complex_state_runs_as_its_real_pair_and_comes_back_complex():
    """Round 4: a complex64 buffer exported with state="io" was fed to ONNX Runtime as complex
    (a raw RuntimeError); the buffer and an updated input now travel as real pairs, as every
    complex value does, and come back complex, as eager PyTorch leaves them."""
    torch.manual_seed(0)
    x, y = torch.randn(3, dtype=torch.complex64), torch.randn(3, dtype=torch.complex64)
    program = opreg.export(_ComplexState(), (x, y.clone()), target=18, state="io")
    eager, mine, theirs = _ComplexState(), y.clone(), y.clone()
    for _ in range(2):  # the state carries from one run to the next
        expected, got = eager(x, theirs), program.run(x, mine)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(mine, theirs)
    assert program.state["acc"].dtype == torch.complex64
    torch.testing.assert_close(program.state["acc"], eager.acc)
    assert program.verify(x, y).max_abs < 1e-6


WRONG_OPTIONS = {
    "target": 3.5, "dynamic_shapes": 7, "plugins": ["ort_contrib", 3], "exclude": "ort_contrib",
    "registry": "core", "host": "core", "inline": "no", "embed_functions": 1, "optimize": "no", "fold_weights": None,
    "rewrite": "yes", "seed": "1", "strict": 0, "state": "keep", "passes": [3], "patches": "no",
    "exclude_patches": "x", "progress": "stages", "weights": 3, "keep_float32": "yes",
    "input_names": "x", "output_names": [3], "dynamic_axes": [0], "opset_version": "17",
}  # fmt: skip
"""A wrong value for every keyword option of opreg.export (a new option without one fails the test below)."""


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(opreg.ExportSettings)])
def test_every_export_option_is_checked_before_the_capture(name):
    """Round 4: each wrong value is an InvalidArgumentError naming the option, raised before the model
    is captured (``dynamic_shapes="batch"`` reached torch.export and came back as its AssertionError)."""
    with pytest.raises(opreg.InvalidArgumentError) as caught:
        opreg.export(Loud(), (X,), **{name: WRONG_OPTIONS[name]})
    assert re.search(rf"\b{name}\b", str(caught.value)), caught.value
    assert "captured" not in str(caught.value)
