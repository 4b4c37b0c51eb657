"""An impl for a pack's own profile (issue 53, defect 8): a pack with a standard-ONNX impl for every runtime
and one for its profile, which emits its own op, gets the second at ``-t PACK``; an impl for a profile
that still never wins there fails ``pack-check``, and ``opreg explain`` says why it lost."""

from __future__ import annotations

import sys

import pytest

from opreg.authoring import scaffold
from tests.test_scaffold import SWISH, SWISHLIB, installed

IMPLS = """
from __future__ import annotations

import onnxscript
import opreg
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset23 as op23
from opreg.ops import Tensor

from opreg_profpack import DOMAIN, DOMAIN_VERSION

custom = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)


@opreg.impl("swishlib::fused_swish"{STANDARD})
def swishlib_fused_swish_standard(x: Tensor, beta: float):
    return op23.Mul(x, op23.Sigmoid(op23.Mul(x, op23.CastLike(beta, x))))


@opreg.impl("swishlib::fused_swish", profiles=("profpack",))
def swishlib_fused_swish(x: Tensor, beta: float):
    return custom.FusedSwish(x, beta=beta)


@onnxscript.script(custom)
def FusedSwish(x, beta: float):
    return op18.Mul(x, op18.Sigmoid(op18.Mul(x, op18.CastLike(beta, x))))
"""
"""The pack of the issue: a standard impl (ai.onnx 23, newer than the own op's 18) and one for its profile."""


@pytest.fixture
def profpack(tmp_path, monkeypatch):
    """Write the pack with ``IMPLS`` (``standard``: the standard impl's extra mark arguments), install it."""
    import opreg.packs.plugins

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "swishlib.py").write_text(SWISHLIB)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))

    def make(standard: str = "") -> None:
        pack = scaffold.new_pack("opreg-profpack", ops=[SWISH], directory=tmp_path / "pack")
        (pack / "opreg_profpack" / "impls.py").write_text(IMPLS.replace("{STANDARD}", standard))
        installed(pack, monkeypatch)

    yield make
    opreg.packs.plugins.clear_cache()
    for name in [m for m in sys.modules if m.startswith("opreg_profpack")]:
        del sys.modules[name]


def test_the_impl_for_the_profile_wins_at_the_profile_and_the_standard_one_elsewhere(profpack):
    import swishlib
    import torch

    import opreg
    from opreg.testing import check_pack

    profpack()
    registry = opreg.default_registry()
    assert registry.resolve("swishlib::fused_swish", "profpack").name == "swishlib_fused_swish"
    assert registry.resolve("swishlib::fused_swish", 23).name == "swishlib_fused_swish_standard"
    explained = registry.explain("swishlib::fused_swish", "profpack")
    (standard,) = [c for c in explained.candidates if c.impl.name == "swishlib_fused_swish_standard"]
    assert standard.reason == (
        "ranked below profpack:swishlib_fused_swish: for profile profpack, which this target serves "
        "(profpack:swishlib_fused_swish_standard is for every target)"
    )

    class Swish(torch.nn.Module):
        def forward(self, x):
            return swishlib.fused_swish(x, 1.5)

    x = torch.randn(2, 3)
    program = opreg.export(Swish(), (x,), target="profpack")
    assert [(n.domain, n.op_type) for n in program.model.graph] == [("profpack.ops", "FusedSwish")]
    program.verify(x)
    check_pack("profpack").assert_ok()


def test_an_impl_for_the_profile_that_never_wins_fails_the_kit_saying_why(profpack):
    import opreg
    from opreg.testing import check_pack

    profpack(standard=", priority=1")
    report = check_pack("profpack")
    (failure,) = report.failures()
    assert (failure.check, failure.subject) == (
        "conflicts",
        "profpack:swishlib_fused_swish for swishlib::fused_swish.default",
    )
    assert failure.detail == (
        "for profile profpack, but never chosen there (ranked below "
        "profpack:swishlib_fused_swish_standard: higher priority (1 > 0 of profpack:swishlib_fused_swish)): "
        "raise its priority, or remove the impl that wins"
    )
    explained = str(opreg.default_registry().explain("swishlib::fused_swish", "profpack"))
    assert "[outranked] profpack:swishlib_fused_swish" in explained and "higher priority (1 > 0" in explained
