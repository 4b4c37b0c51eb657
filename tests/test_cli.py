"""The opreg command line: tables, --json, -p selection, clear errors and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opreg.cli import main
from opreg.cli import plugins as cli_plugins
from opreg.packs.plugins import AUTOLOAD_ENV
from tests.test_plugins import GOOD


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_console_script_is_installed_and_prints_packs():
    script = Path(sys.executable).parent / "opreg"  # the console script of the environment running the suite
    proc = subprocess.run([script, "plugins", "--json"], capture_output=True, text=True, check=True)
    packs = {p["name"]: p for p in json.loads(proc.stdout)}
    assert packs["core"]["distribution"] == "opreg" and packs["core"]["status"] == "loaded"
    assert packs["ort_contrib"]["profiles"] == ["onnxruntime"]


def test_plugins_table_shows_failures_with_reason(capsys, make_pack):
    make_pack("broken", "raise ImportError('missing dependency frob')")
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "broken" in out and "failed" in out and "missing dependency frob" in out
    assert "opreg-testpack-broken" in out
    code, _, err = run(capsys, "plugins", "--strict")
    assert code == 1 and err.startswith("opreg: error: strict mode: pack 'broken'")


def test_plugins_selection_flags(capsys, make_pack, monkeypatch):
    make_pack("extra", GOOD)
    _, out, _ = run(capsys, "plugins", "--json", "-p", "no:extra", "-p", "no:ort_contrib")
    status = {p["name"]: p["status"] for p in json.loads(out)}
    assert status["extra"] == "disabled" and status["ort_contrib"] == "disabled" and status["core"] == "loaded"
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    _, out, _ = run(capsys, "plugins", "--json", "-p", "extra")
    status = {p["name"]: p["status"] for p in json.loads(out)}
    assert status["core"] == "loaded" and status["extra"] == "loaded"
    others = {name: state for name, state in status.items() if name not in ("core", "extra")}
    assert {"ort_contrib", "test_customop", "torchvision", "transformers"} <= others.keys()
    assert set(others.values()) == {"disabled"}


def test_ops_lists_impls_with_requirements(capsys):
    code, out, _ = run(capsys, "ops", "aten::gelu*", "--json", "--target", "18")
    assert code == 0
    data = json.loads(out)
    assert data["target"] == {"": 18}
    rows = {(r["pack"], r["function"], r["onnx"]): r for r in data["impls"]}
    assert rows["core", "aten_gelu", ">=18"]["status"] == "chosen"
    assert rows["core", "aten_gelu", ">=20"]["status"] == "unusable"  # one body, registered at 18 and at 20
    assert rows["ort_contrib", "aten_gelu_contrib", ">=18"]["domains"] == {"com.microsoft": ">=1"}
    assert rows["core", "aten_gelu", ">=20"]["source"].endswith("activation.py:24")
    assert {r["op"] for r in data["impls"]} == {"aten::gelu.default"}
    code, out, _ = run(capsys, "ops", "gelu", "--pack", "core")
    assert code == 0 and "ai.onnx>=20" in out and "aten_gelu_contrib" not in out


def test_explain_shows_the_choice_and_why(capsys):
    code, out, _ = run(capsys, "explain", "aten::gelu", "--target", "onnxruntime", "--json")
    data = json.loads(out)
    assert code == 0 and data["chosen"] == "core:aten_gelu"
    statuses = {(c["function"], c["requires"]): (c["status"], c["reason"]) for c in data["candidates"]}
    # ORT's Gelu kernel is float32 only: a predicate, which only a node can answer
    contrib = statuses["aten_gelu_contrib", "ai.onnx>=18, com.microsoft>=1"]
    assert contrib == ("conditional", "has a predicate; no node to test it on")
    chosen = statuses["aten_gelu", "ai.onnx>=20"]
    assert chosen[0] == "chosen" and chosen[1].startswith("newest opset requirement")  # not contrib's priority 10
    assert "passed over: ort_contrib:aten_gelu_contrib (has a predicate; no node to test it on)" in chosen[1]
    assert statuses["aten_gelu", "ai.onnx>=18"] == (
        "outranked",
        "ranked below core:aten_gelu at ai.onnx>=20: newest opset requirement "
        "(ai.onnx>=20 vs ai.onnx>=18 of core:aten_gelu)",
    )  # why it lost, as the chosen row says why it won
    sources = {c["source"] for c in data["candidates"]}
    assert {s.rsplit("/", 1)[-1] for s in sources} == {"activation.py:22", "activation.py:24"}, sources
    code, out, _ = run(capsys, "explain", "aten::gelu", "-t", "18", "--json")
    reasons = [c["reason"] for c in json.loads(out)["candidates"]]
    assert code == 0 and "needs ai.onnx>=20, target has 18" in reasons and "needs com.microsoft>=1" in reasons[1]
    code, out, _ = run(capsys, "explain", "aten::gelu", "-t", "18")
    assert code == 0 and "core_ops/opreg_core_ops/ops/activation.py:24" in out  # where each impl is defined


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["explain", "gelu"], "is neither a torch op (namespace::name) nor a capture patch"),
        (["explain", "aten::gelu", "-t", "99"], "use a version from 16 to"),
        (["explain", "aten::gelu", "-t", "15"], "use a version from 16 to"),
        (["explain", "aten::gelu", "-t", ""], "the target is empty: write a profile name"),
        (["explain", "aten::gelu", "-t", "com.microsoft=1"], "e.g. 'onnx,com.microsoft=1'"),
        (["explain", "aten::gelu", "-t", "ai.onnx=18,ai.onnx=20"], "gives ai.onnx twice"),
        (["explain", "aten::gelu", "-t", "onnx,com.microsfot=1"], "did you mean 'com.microsoft'?"),
        (["ops", "-t", "nosuch"], "unknown target profile 'nosuch'"),
        (["plugins", "-p", "nosuch"], "no installed pack named 'nosuch'"),
        (["plugins", "-p", "no:"], "-p needs a pack name"),
        (["ops", "--pack", "nosuch"], "no pack named nosuch"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("opreg: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_no_traceback_without_debug_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "opreg.cli", "explain", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "opreg: error:" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "opreg.cli", "explain", "nope", "--debug"], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_each_command_is_one_module_listed_once_in_commands():
    """A command is a module of opreg/cli with add_parser and run, and an entry in COMMANDS: a
    module left out of COMMANDS, or a parser whose run is not its module's, fails here."""
    import argparse
    import pkgutil

    import opreg.cli

    modules = {m.name for m in pkgutil.iter_modules(opreg.cli.__path__) if not m.name.startswith("_")}
    assert sorted(c.__name__.rpartition(".")[2] for c in opreg.cli.COMMANDS) == sorted(modules)
    (commands,) = [a for a in opreg.cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    runs = {name: parser.get_default("run") for name, parser in commands.choices.items()}
    runs["llm"] = commands.choices["llm"]._subparsers._group_actions[0].choices["export"].get_default("run")
    assert {name: run.__module__ for name, run in runs.items()} == {
        c.__name__.rpartition(".")[2].replace("_", "-"): c.__name__ for c in opreg.cli.COMMANDS
    }


def test_building_the_parser_imports_nothing_heavy():
    code = (
        "import sys; from opreg.cli import build_parser; build_parser(); "
        "heavy = {'torch', 'rich', 'onnx', 'opreg.registry.registry', 'opreg.packs.plugins', 'opreg.settings'}; "
        "heavy &= set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_command_runs_with_the_collector_quiet_and_leaves_it_as_it_was(capsys, monkeypatch):
    """A command runs with a full collection every FULL_EVERY middle ones (``opreg._heap.quiet``);
    after it, the caller's collector is as it was (the exit freeze is the script's:
    test_heap.py::test_the_opreg_command_freezes_its_objects_before_the_process_exits)."""
    import gc

    from opreg._heap import FULL_EVERY

    thresholds = gc.get_threshold()
    assert gc.get_freeze_count() == 0 and thresholds[2] < FULL_EVERY
    seen = []
    monkeypatch.setattr(cli_plugins, "run", lambda args: seen.append(gc.get_threshold()[2]) or 0)
    assert main(["plugins", "--json"]) == 0
    assert seen == [FULL_EVERY]
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds
    capsys.readouterr()
