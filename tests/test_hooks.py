"""One contract per hook: the loader, the exporter, the command line and the conformance kit check a
hook's result against the contract on its spec (``@contract`` in ``opreg.packs.hookspecs``, collected in
``opreg.packs.hookspecs.CONTRACTS``; the checks in ``opreg.packs.hookchecks``) and word a mistake the same way."""

from __future__ import annotations

import inspect
import logging
import re

import pytest
import torch

import opreg
from opreg import cli
from opreg.packs import hookchecks, hookspecs
from opreg.packs.plugins import hook_names
from opreg.pluginapi import HookError
from opreg.testing import check_pack


def test_every_hook_has_one_contract_saying_when_it_is_called():
    assert sorted(hookspecs.CONTRACTS) == sorted(hook_names())
    for name, contract in hookspecs.CONTRACTS.items():
        assert contract.hook == name and contract.when, name
        assert inspect.isfunction(contract.check)
        assert getattr(getattr(hookspecs, name), hookchecks.CONTRACT_ATTRIBUTE) is contract  # on its spec


def called(docstring: str) -> str:
    """A spec docstring's paragraph that says when opreg calls the hook ("Called ..."), as plain
    text: reST roles and literals unwrapped, white space folded."""
    paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(docstring).split("\n\n")]
    (paragraph,) = [p for p in paragraphs if p.startswith("Called ")]
    return re.sub(r":\w+:`([^`]*)`|``([^`]*)``", lambda m: m.group(1) or m.group(2), paragraph)


@pytest.mark.parametrize("hook", sorted(hookspecs.CONTRACTS))
def test_each_spec_says_when_it_is_called_as_its_contract_does(hook):
    """The docstring a pack author reads and the contract opreg checks say the same moment."""
    contract = hookspecs.CONTRACTS[hook]
    assert called(getattr(hookspecs, hook).__doc__).startswith(f"Called {contract.when}"), contract.when


def test_the_when_check_reads_literals_and_roles_and_fails_on_a_mismatch():
    doc = """Do it.

    Called once per export (unless ``opreg.export(...,
    rewrite=False)``), after :func:`opreg_targets`.
    """
    assert called(doc) == "Called once per export (unless opreg.export(..., rewrite=False)), after opreg_targets."
    assert not called(doc).startswith(f"Called {hookchecks.REGISTRY_BUILD}")


BAD_TARGETS = """
@opreg.hookimpl
def opreg_targets():
    return ["not", "a", "dict"]
"""

PROBLEM = "must return a dict {profile: {domain: version}}, got list"


def test_a_bad_registration_hook_reads_the_same_in_the_loader_and_the_kit(make_pack):
    make_pack("badtargets", BAD_TARGETS)
    registry = opreg.build_registry()
    report = registry.packs.report("badtargets")
    assert (report.status, report.hook, report.reason) == ("failed", "opreg_targets", PROBLEM)
    assert report.describe().endswith(f"failed in hook opreg_targets: {PROBLEM}")
    (row,) = [r for r in check_pack("badtargets").results if r.check == "load"]
    assert row.status == "failed" and PROBLEM in row.detail
    with pytest.raises(opreg.PluginError, match=f"failed in hook opreg_targets: {PROBLEM}"):
        opreg.build_registry(strict=True)


BAD_RULES = """
@opreg.hookimpl
def opreg_rewrite_rules(target):
    return ["not a rule"]
"""

RAISING_RULES = """
@opreg.hookimpl
def opreg_rewrite_rules(target):
    raise ValueError("rules broke")
"""

RULES_PROBLEM = (
    "returned 'not a rule', which is neither an onnxscript RewriteRule or RewriteRuleSet nor an onnx_ir.passes.PassBase"
)


MODELS = """
import torch


def make():
    return torch.nn.ReLU(), (torch.randn(3),)
"""


def test_a_raising_hook_logs_its_traceback_at_debug_once(make_pack, caplog):
    """The warning is one line; the hook's own exception, with its traceback, is at DEBUG, once
    however often the hook is called (mutation testing found these unchecked)."""
    make_pack("raisingrules", RAISING_RULES)
    registry = opreg.build_registry(plugins=["raisingrules"])
    model, x = torch.nn.ReLU(), torch.randn(3)
    with caplog.at_level(logging.DEBUG, logger="opreg"):
        opreg.export(model, (x,), target=18, registry=registry)
        opreg.export(model, (x,), target=18, registry=registry)
    sentence = "pack 'raisingrules' failed in hook opreg_rewrite_rules: raised ValueError: rules broke"
    ours = [r for r in caplog.records if r.name.startswith("opreg") and "raisingrules" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in ours] == [
        (logging.WARNING, f"{sentence}; leaving it out"),
        (logging.DEBUG, f"{sentence}: traceback"),
    ]
    assert ours[1].exc_info[0] is ValueError and str(ours[1].exc_info[1]) == "rules broke"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("body", "problem"), [(BAD_RULES, RULES_PROBLEM), (RAISING_RULES, "raised ValueError: rules broke")]
)
def test_a_bad_rewrite_hook_reads_the_same_in_the_exporter_the_cli_and_the_kit(
    make_pack, tmp_path, capsys, caplog, body, problem
):
    """Issue 27, defect 3: a raising (or wrong) opreg_rewrite_rules is reported like any failed hook
    (which pack, which hook, the error) on the CLI too, and --strict fails on it."""
    make_pack("badrules", body)
    sentence = f"pack 'badrules' failed in hook opreg_rewrite_rules: {problem}"
    model, x = torch.nn.ReLU(), torch.randn(3)

    with caplog.at_level(logging.WARNING, logger="opreg"):  # the exporter: logged, the pack's rewrites left out
        program = opreg.export(model, (x,), target=18, plugins=["badrules"])
    assert [n.op_type for n in program.model_proto.graph.node] == ["Relu"]
    assert sentence in caplog.text
    with pytest.raises(HookError, match=sentence.replace("(", r"\(").replace(")", r"\)")):
        opreg.export(model, (x,), target=18, registry=opreg.build_registry(plugins=["badrules"], strict=True))

    (tmp_path / "models.py").write_text(MODELS)  # the command line: a warning, or with --strict an error
    out = tmp_path / "relu.onnx"
    code, _, err = run(capsys, "export", f"{tmp_path}/models.py:make", "-o", str(out), "-t", "18", "-p", "badrules")
    assert code == 0 and f"warning: {sentence}; left out" in " ".join(err.split())
    out.unlink()
    code, _, err = run(
        capsys, "export", f"{tmp_path}/models.py:make", "-o", str(out), "-t", "18", "-p", "badrules", "--strict"
    )
    assert code == 1 and f"\nopreg: error: {sentence}\n" in err and not out.exists()

    kit = [r for r in check_pack("badrules").results if r.subject == "opreg_rewrite_rules"]  # the kit
    assert [(r.check, r.status, r.detail) for r in kit] == [("hooks", "failed", problem)]


def test_target_parsing_reads_data_and_runs_no_pack_code(make_pack):
    """A domain is known when an impl emits it or a profile names it; a pack's hooks are not asked."""
    make_pack(
        "badrules",
        RAISING_RULES + '\n@opreg.hookimpl\ndef opreg_targets():\n    return {"br": {"": 18, "my.ops": 1}}\n',
    )
    registry = opreg.build_registry(plugins=["badrules"], strict=True)  # strict: any hook call would raise
    assert registry.target("onnx,my.ops=1").get("my.ops") == 1
    with pytest.raises(opreg.InvalidTargetError, match=r"emits domain 'my\.opz'.*did you mean 'my\.ops'"):
        registry.target("onnx,my.opz=1")
