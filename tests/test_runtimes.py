"""ONNX Runtime releases as targets (``onnxruntime==1.22``, ``onnx@onnxruntime==1.22``), the kernel
tables they are judged by, and the opset a model needs rather than the newest (issue 50)."""

from __future__ import annotations

import json

import pytest
import torch
from onnxscript import values
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset22 as op22

import opreg
from opreg.registry import runtimes
from opreg.registry.targets import MIN_ONNX_OPSET
from opreg.registry.versions import FLOOR_KEY
from tests.optest import Lambda

CONTRIB = "onnxruntime" in opreg.default_registry().profiles
needs_contrib = pytest.mark.skipif(not CONTRIB, reason="opreg-ort-contrib is not installed")


# -- the tables ------------------------------------------------------------------------------------


def test_the_installed_releases_table_is_what_it_reads_itself():
    """The data's entry for the installed release holds the same kernels (version ranges) as the
    installed onnxruntime's own table, read live."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    installed = runtimes.installed_version()
    held = {r.version: r for r in runtimes.releases()}
    if installed not in held:
        pytest.skip(f"the tables do not hold the installed onnxruntime {installed}")
    live: dict[tuple[str, str], set] = {}
    for k in state.get_all_opkernel_def():
        if k.provider == "CPUExecutionProvider":
            start, end = k.version_range
            live.setdefault(("" if k.domain == "ai.onnx" else k.domain, k.op_name), set()).add(
                (start, None if end >= 2**31 - 1 else end)
            )
    assert {key: set(ranges) for key, ranges in held[installed].kernels.items()} == live
    assert held[installed].max_opset == opreg.registry.targets.newest_onnxruntime_opset()


def test_releases_know_their_opset_limits_and_kernels():
    limits = {r.version: (r.max_opset, r.max_ir) for r in runtimes.releases()}
    assert limits["1.18.1"] == (21, 10) and limits["1.22.1"] == (22, 10) and limits["1.30.0"] == (26, 13)
    old, new = runtimes.release("1.20"), runtimes.release("1.22")
    assert not old.runs("", "Sin", 22) and new.runs("", "Sin", 22) and old.runs("", "Sin", 7)
    assert not new.runs("", "RandomNormalLike", 22) and new.runs("", "RandomNormalLike", 1)
    assert new.runs("", "Constant", 21) and new.runs("", "Gelu", 20)  # folded; a function, expanded
    assert runtimes.first_with("com.microsoft", "GatherBlockQuantized", 1).version == "1.20.1"


# -- targets that name a release -------------------------------------------------------------------


@needs_contrib
def test_a_release_target_caps_the_opset_and_keeps_the_profile():
    target = opreg.default_registry().target("onnxruntime==1.22")
    assert (target.onnx, target.get("com.microsoft"), target.runtime, target.pinned) == (22, 1, "1.22.1", False)
    assert opreg.default_registry().target("onnxruntime").runtime == runtimes.installed_version()


@pytest.mark.parametrize(
    ("spec", "onnx", "runtime"),
    [("onnx@onnxruntime==1.22", 22, "1.22.1"), ("onnx@onnxruntime==1.24", 23, "1.24.4"),
     ("onnx@onnxruntime==1.18.1", 21, "1.18.1"), ("onnx@onnxruntime==1.24,20", 20, "1.24.4")],
)  # fmt: skip
def test_the_plain_runtime_restricted_to_a_release(spec, onnx, runtime):
    target = opreg.Target.of(spec)
    assert (target.onnx, target.runtime, target.get("com.microsoft")) == (onnx, runtime, None)
    assert target != opreg.Target.of({"": onnx})  # a release restricts what it may use


@pytest.mark.parametrize(
    ("spec", "message"),
    [("onnx@onnxruntime==1.99", r"no kernel table for onnxruntime 1\.99: known releases are 1\.18\.1, .*ort_kernels"),
     ("onnx@onnxruntime==1.22,ai.onnx=23", r"'ai\.onnx=23' is newer than onnxruntime 1\.22\.1 loads \(ai\.onnx up"),
     ("onnx@onnxruntime==", r"not a runtime release: write onnxruntime==1\.22"),
     ("onnx@tensorrt==10", r"not a runtime release"), ("nope@onnxruntime==1.22", r"unknown target profile 'nope'"),
     ("onnx@onnxruntime==1.x", r"give a release as numbers")],
)  # fmt: skip
def test_a_release_target_that_cannot_be_is_refused(spec, message):
    with pytest.raises(opreg.InvalidTargetError, match=message):
        opreg.Target.of(spec)


# -- ops the runtime runs ------------------------------------------------------------------------


def _draw_22(x):
    """A draw spelled with RandomNormalLike-22, which no ONNX Runtime release has a CPU kernel for."""
    return op22.Add(op22.RandomNormalLike(x), x)


def _draw_18(x):
    """The same draw with RandomNormalLike-1 (op18)."""
    return op18.Add(op18.RandomNormalLike(x), x)


def test_an_impl_whose_op_the_release_lacks_loses_to_one_it_has():
    registry = opreg.Registry()
    registry.register("aten::rand_like", _draw_22, opset=22, priority=1)
    registry.register("aten::rand_like", _draw_18)
    assert registry.resolve("aten::rand_like", "onnx,22").function is _draw_22  # no release named: the best
    assert registry.resolve("aten::rand_like", "onnx@onnxruntime==1.22").function is _draw_18
    why = registry.unmet(registry.impls("aten::rand_like")[0], "onnx@onnxruntime==1.22")
    assert "emits RandomNormalLike-22 (ai.onnx), which onnxruntime 1.22.1 has no CPU kernel for" in why
    assert "no onnxruntime release opreg knows has one" in why


def test_an_op_only_a_newer_release_has_is_named_with_that_release():
    msft = values.Opset("com.microsoft", 1)

    def gathered(self, index):
        """A com.microsoft op ONNX Runtime 1.20 added."""
        return msft.GatherBlockQuantized(self, index, self)

    registry = opreg.Registry()
    registry.register("aten::take", gathered, domains={"com.microsoft": 1})
    why = registry.unmet(registry.impls("aten::take")[0], "onnx@onnxruntime==1.18,com.microsoft=1")
    assert why == (
        "emits GatherBlockQuantized-1 (com.microsoft), which onnxruntime 1.18.1 has no CPU kernel for "
        "(onnxruntime 1.20.1 and later have one)"
    )
    assert registry.unmet(registry.impls("aten::take")[0], "onnx@onnxruntime==1.20,com.microsoft=1") is None


def test_an_export_for_a_release_refuses_an_op_no_impl_can_place():
    registry = opreg.Registry()
    registry.register("aten::randn_like", _draw_22, opset=22)
    model = Lambda(torch.randn_like)
    with pytest.raises(opreg.UnsupportedOpsError, match=r"aten::randn_like"):
        opreg.export(model, (torch.randn(3),), registry=registry, target="onnx@onnxruntime==1.22")
    assert opreg.export(model, (torch.randn(3),), registry=registry, target=22).model.opset_imports[""] == 22


# -- the opset a model needs -------------------------------------------------------------------------


def test_a_profile_is_a_ceiling_and_the_floor_is_said():
    program = opreg.export(Lambda(lambda x: torch.nn.functional.gelu(x).softmax(-1)), (torch.randn(2, 4),))
    assert program.model.opset_imports[""] == 20 and program.model.ir_version == 10
    assert program.opset_floors == {"ai.onnx": {"version": 20, "set_by": ["Gelu-20"]}}
    assert json.loads(program.model.metadata_props[FLOOR_KEY]) == program.opset_floors


def test_a_model_of_old_ops_imports_opregs_oldest_target():
    program = opreg.export(Lambda(torch.relu), (torch.randn(3),))
    assert program.model.opset_imports[""] == MIN_ONNX_OPSET


@pytest.mark.parametrize("target", [23, "23", {"": 23}, "onnx,ai.onnx=23", "onnx@onnxruntime==1.24,23"], ids=repr)
def test_a_target_that_names_its_version_is_kept(target):
    program = opreg.export(Lambda(torch.relu), (torch.randn(3),), target=target)
    assert program.model.opset_imports[""] == 23 and program.opset_floors == {}


@needs_contrib
def test_a_pinned_runtime_profile_keeps_its_version():
    program = opreg.export(Lambda(torch.relu), (torch.randn(3),), target="onnxruntime,ai.onnx=25")
    assert program.model.opset_imports[""] == 25


def test_a_node_whose_types_only_a_newer_schema_takes_raises_the_floor():
    """A bfloat16 Conv (emitted with op18) is valid only from Conv-22, which added bfloat16."""
    conv = torch.nn.Conv2d(2, 2, 3).to(torch.bfloat16).eval()
    program = opreg.export(conv, (torch.randn(1, 2, 5, 5, dtype=torch.bfloat16),))
    assert program.model.opset_imports[""] == 22 and "Conv-22" in program.opset_floors["ai.onnx"]["set_by"]
    float_program = opreg.export(conv.float(), (torch.randn(1, 2, 5, 5),))
    assert float_program.model.opset_imports[""] == MIN_ONNX_OPSET  # Conv-11 holds float


def test_ir_version_follows_the_opset():
    assert opreg.export(Lambda(torch.relu), (torch.randn(3),), target=25).model.ir_version == 13  # onnx's table
    assert opreg.export(Lambda(torch.relu), (torch.randn(3),)).model.ir_version == 10


GELU_FILE = """
import torch


class Gelu(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x).softmax(-1)


def make():
    return Gelu(), (torch.randn(2, 4),)
"""


def test_the_command_line_says_which_ops_set_the_opset(capsys, tmp_path):
    from tests.test_cli import run

    (tmp_path / "gelu.py").write_text(GELU_FILE)
    output = tmp_path / "gelu.onnx"
    code, out, _ = run(capsys, "export", f"{tmp_path / 'gelu.py'}:make", "-o", str(output))
    assert code == 0 and "opsets ai.onnx=20 (set by Gelu-20))" in out
    code, out, _ = run(capsys, "inspect", str(output))
    assert code == 0 and "opsets: ai.onnx=20 (set by Gelu-20)" in out
    code, out, _ = run(capsys, "export", f"{tmp_path / 'gelu.py'}:make", "-o", str(output), "-t", "23", "--json")
    assert code == 0 and json.loads(out)["opsets"] == {"ai.onnx": 23} and json.loads(out)["opset_floors"] == {}
