"""``Registry.explain`` states the true reason for every choice.

Each case builds a registry, reads the chosen row's reason, and holds it against the registry's
decision twice: the reason names what really sets the chosen impl apart (the impl it names is the
one ranked next, the numbers are theirs), and taking that cause away changes what resolution picks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg
from opreg.registry.registry import CORE_PACK, Impl, Registry, build_impl

OP = "aten::relu"
PROFILE = ("fastrt", {"": 23, "my.rt": 1}, "rtpack")
"""A runtime's profile: what ``profiles=("fastrt",)`` gates an impl on (``my.rt=1``)."""


def relu_a(self):
    return op18.Relu(self)


def relu_b(self):
    return op18.Relu(self)


def relu_new(self):
    return op20.Relu(self)


def impl(function: Callable[..., Any], pack: str, **kwargs: Any) -> Impl:
    settings = {"opset": None, "domains": None, "priority": 0, "predicate": None} | kwargs
    return build_impl(OP, function, pack=pack, override=False, **settings)


def floats(node: Any) -> bool:
    return node == "float"


def registry(*impls: Impl, prefer: str | None = None) -> Registry:
    return Registry.build(impls, profiles=[PROFILE], preferences={OP: prefer} if prefer else None)


def chosen_reason(reg: Registry, target: Any = 23, node: Any = None, op: str = OP) -> tuple[Impl, str]:
    """The chosen row of ``explain``, which must be what ``resolve`` picks."""
    explanation = reg.explain(op, target, node)
    picked = reg.resolve(op, target, node)
    assert explanation.chosen is picked is not None
    (row,) = [c for c in explanation.candidates if c.status == "chosen"]
    assert row.impl is picked
    return picked, row.reason


def runner_up(reg: Registry, picked: Impl, target: Any = 23) -> Impl:
    ordered = reg.candidates(OP, target)
    return ordered[ordered.index(picked) + 1]


A, B = impl(relu_a, "alpha"), impl(relu_b, "zeta")


def test_the_only_impl():
    picked, reason = chosen_reason(registry(A))
    assert picked is A and reason == "the only impl this target can use"
    assert registry().resolve(OP, 23) is None


def test_a_user_override():
    strong = impl(relu_b, "zeta", priority=5, opset=20)
    reg = registry(strong).copy()
    mine = reg.register(OP, relu_a)
    picked, reason = chosen_reason(reg)
    assert picked is mine and reason == "registered by the user (overrides packs)"
    assert registry(strong).resolve(OP, 23) is strong  # without the override


def test_a_higher_priority():
    high, newer = impl(relu_a, "alpha", priority=1), impl(relu_new, "zeta", opset=20)
    picked, reason = chosen_reason(registry(high, newer))
    assert picked is high and runner_up(registry(high, newer), high) is newer
    assert reason == "higher priority (1 > 0 of zeta:relu_new)"
    level = dataclasses.replace(high, priority=0)
    assert registry(level, newer).resolve(OP, 23) is newer  # same priority: the newer requirement wins


def test_the_newest_requirement():
    newer, older = impl(relu_new, "zeta", opset=20), impl(relu_a, "alpha", opset=18)
    picked, reason = chosen_reason(registry(newer, older))
    assert picked is newer
    assert reason == "newest opset requirement (ai.onnx>=20 vs ai.onnx>=18 of alpha:relu_a)"
    assert registry(newer, older).resolve(OP, 19) is older  # a target the newer one cannot serve


def test_a_preferred_pack():
    picked, reason = chosen_reason(registry(A, B, prefer="zeta"))
    assert picked is B and reason == "ties with alpha:relu_a; pack 'zeta' is preferred (prefer=)"
    assert registry(A, B).resolve(OP, 23) is A  # no preference: pack name decides


def test_a_predicate_that_accepts_the_node():
    conditional = impl(relu_b, "zeta", predicate=floats)
    picked, reason = chosen_reason(registry(A, conditional), node="float")
    assert picked is conditional
    assert reason == "its predicate accepts the node (tried before alpha:relu_a, which has none)"
    assert registry(A, conditional).resolve(OP, 23, "int") is A


def test_the_core_pack_wins_a_tie():
    core = impl(relu_b, CORE_PACK)
    picked, reason = chosen_reason(registry(A, core))
    assert picked is core
    assert reason == "ties with alpha:relu_a; the core pack wins ties unless another pack is preferred (prefer=)"
    assert registry(A, impl(relu_b, "zzz")).resolve(OP, 23) is A  # the same impl outside the core pack loses


def test_pack_and_function_name_break_a_tie():
    picked, reason = chosen_reason(registry(B, A))
    assert picked is A and reason == "ties with zeta:relu_b; broken by pack and function name (choose with prefer=)"
    renamed = impl(relu_a, "zzzz")
    assert registry(B, renamed).resolve(OP, 23) is B


@pytest.mark.parametrize(
    ("node", "why"), [(None, "has a predicate; no node to test it on"), ("int", "its predicate rejects the node")]
)
def test_a_conditional_impl_ranked_above_is_passed_over(node, why):
    """The reason the issue found wrong: a priority-10 impl with a predicate above a priority-0 one
    used to make explain say 'highest priority (0 > 10 ...)'."""
    conditional = impl(relu_b, "zeta", priority=10, predicate=floats)
    older = impl(relu_a, "alpha", opset=18)
    newer = impl(relu_new, "alpha", opset=20)
    reg = registry(conditional, older, newer)
    picked, reason = chosen_reason(reg, node=node)
    assert picked is newer
    assert reason == (
        "newest opset requirement (ai.onnx>=20 vs ai.onnx>=18 of alpha:relu_a); "
        f"ranked above it but passed over: zeta:relu_b ({why})"
    )
    assert reg.resolve(OP, 23, "float") is conditional  # a node it accepts: it is chosen


def test_only_a_conditional_impl_above():
    conditional = impl(relu_b, "zeta", priority=10, predicate=floats)
    picked, reason = chosen_reason(registry(conditional, A))
    assert picked is A
    assert reason == (
        "the only other impl this target can use; ranked above it but passed over: "
        "zeta:relu_b (has a predicate; no node to test it on)"
    )


def test_an_impl_for_a_profile():
    gated = impl(relu_b, "zeta", priority=1, profiles=("fastrt",))
    reg = registry(A, gated)
    picked, reason = chosen_reason(reg, "fastrt")
    assert picked is gated
    assert reason == "higher priority (1 > 0 of alpha:relu_a); for profile fastrt, which this target serves"
    assert reg.resolve(OP, 23) is A  # a target without the profile's my.rt=1
    (dropped,) = [c for c in reg.explain(OP, 23).candidates if c.status == "dropped"]
    assert dropped.impl is gated and dropped.reason == "only for profile fastrt, which needs my.rt=1"


def test_the_installed_gelu_at_onnxruntime():
    """``opreg explain aten::gelu -t onnxruntime``: ort_contrib's impl (priority 10, a predicate) is passed
    over without a node; core's newest impl is chosen because of its requirement, not its priority."""
    reg = opreg.default_registry()
    picked, reason = chosen_reason(reg, "onnxruntime", op="aten::gelu")
    assert picked.pack == CORE_PACK
    assert reason.startswith("newest opset requirement (ai.onnx>=20 vs ai.onnx>=18 of core:aten_gelu)")
    passed = "ranked above it but passed over: ort_contrib:aten_gelu_contrib (has a predicate; no node to test it on)"
    assert reason.endswith(passed)
    assert "priority" not in reason
