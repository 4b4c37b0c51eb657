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


SCALED = "scalelib::scaled_add(Tensor x, Tensor y, float alpha, float beta, bool negate=False) -> Tensor"
SCALELIB = """
import torch


@torch.library.custom_op("scalelib::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float, beta: float, negate: bool = False) -> torch.Tensor:
    out = x * alpha + y * beta
    return -out if negate else out


@scaled_add.register_fake
def _(x, y, alpha, beta, negate=False):
    return torch.empty_like(x + y)
"""
SCALED_IMPL = """
import opreg
from onnxscript.onnx_opset import opset18 as op18
from opreg.ops import Tensor


@opreg.impl("scalelib::scaled_add")
def scalelib_scaled_add(x: Tensor, y: Tensor, alpha: float, beta: float, negate: bool = False):
    out = op18.Add(op18.Mul(x, op18.CastLike(ALPHA, x)), op18.Mul(y, op18.CastLike(BETA, y)))
    return op18.Neg(out) if NEGATE else out
"""


@pytest.mark.parametrize(
    ("alpha", "beta", "negate", "right"),
    [("alpha", "beta", "negate", True), ("beta", "alpha", "negate", False), ("alpha", "beta", "False", False)],
    ids=["right", "floats-swapped", "default-ignored"],
)
def test_the_generated_samples_fail_a_wrong_impl(tmp_path, monkeypatch, alpha, beta, negate, right):
    """Issue 53: the samples gave every float 0.5 and every argument its default, so an impl that swapped two
    floats or ignored an argument with a default passed them unchanged."""
    import opreg.packs.plugins
    from opreg.testing import check_pack

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "scalelib.py").write_text(SCALELIB)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    pack = scaffold.new_pack("opreg-scalepack", ops=[SCALED], directory=tmp_path / "pack")
    body = SCALED_IMPL.replace("ALPHA", alpha).replace("BETA", beta).replace("NEGATE", negate)
    (pack / "opreg_scalepack" / "impls.py").write_text(body)
    installed(pack, monkeypatch)
    try:
        failures = check_pack("scalepack").failures()
    finally:
        opreg.packs.plugins.clear_cache()
        for name in [m for m in sys.modules if m.startswith("opreg_scalepack")]:
            del sys.modules[name]
    assert (failures == []) is right, [str(f) for f in failures]
    assert all(f.check == "samples" and "out of tolerance" in f.detail for f in failures), [str(f) for f in failures]
