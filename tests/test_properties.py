"""Property tests: resolution guarantees over random registries and targets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import opreg
from opreg import Impl, OpName, OpsetRequirement, Target, VersionRange
from opreg.registry.targets import onnx_opset_range

LOW, HIGH = onnx_opset_range()
DOMAINS = ("com.microsoft", "test.customop")
OPS = [OpName("testns", f"op{i}") for i in range(3)]


def _function(*args, **kwargs):
    return None


@st.composite
def version_ranges(draw, low=1, high=4):
    lo = draw(st.integers(low, high))
    hi = draw(st.one_of(st.none(), st.integers(lo, high)))
    return VersionRange(lo, hi)


@st.composite
def requirements(draw):
    onnx = draw(version_ranges(LOW, HIGH))
    domains = draw(st.lists(st.sampled_from(DOMAINS), unique=True, max_size=2))
    return OpsetRequirement(onnx, tuple(sorted((d, draw(version_ranges())) for d in domains)))


@st.composite
def impls(draw):
    return Impl(
        op=draw(st.sampled_from(OPS)),
        function=_function,
        requirement=draw(requirements()),
        priority=draw(st.integers(-2, 2)),
        predicate=draw(st.sampled_from([None, None, None, lambda node: node % 2 == 0])),
        pack=draw(st.sampled_from(["a", "b", "c"])),
        override=draw(st.integers(0, 4)) == 0,
        name=draw(st.sampled_from(["f", "g"])),
    )


@st.composite
def targets(draw):
    versions = {"": draw(st.integers(LOW, HIGH))}
    for domain in draw(st.lists(st.sampled_from(DOMAINS), unique=True)):
        versions[domain] = draw(st.integers(1, 4))
    return Target.of(versions)


def build(impl_list):
    return opreg.Registry.build(impl_list)


def identity(impl):
    return None if impl is None else (impl.pack, impl.name, impl.requirement, impl.priority, impl.override)


@settings(max_examples=300, deadline=None)
@given(st.lists(impls(), max_size=12), targets(), st.integers(0, 3))
def test_resolution_guarantees(impl_list, target, node):
    registry = build(impl_list)
    for op in OPS:
        mine = [i for i in registry.impls(op)]
        eligible = [i for i in mine if target.unmet(i.requirement) is None]
        for with_node in (None, node):
            chosen = registry.resolve(op, target, with_node)
            applicable = [
                i for i in eligible if i.predicate is None or (with_node is not None and i.accepts(with_node))
            ]
            # Never beyond the target; something whenever something applies.
            assert (chosen is None) == (not applicable)
            if chosen is None:
                continue
            assert target.unmet(chosen.requirement) is None
            assert chosen.accepts(with_node) if with_node is not None else chosen.predicate is None
            # Nothing applicable ranks strictly better on override, priority, requirement.
            best = max(applicable, key=lambda i: (i.override, i.priority, i.requirement.rank()))
            assert (chosen.override, chosen.priority, chosen.requirement.rank()) == (
                best.override,
                best.priority,
                best.requirement.rank(),
            )
            # explain agrees with resolve and accounts for every impl once.
            explanation = registry.explain(op, target, with_node)
            assert explanation.chosen is chosen
            assert sorted(map(id, (c.impl for c in explanation.candidates))) == sorted(map(id, mine))
            for c in explanation.candidates:
                assert (c.status == "dropped") == (c.impl not in eligible)
                if c.status == "dropped":
                    assert c.reason == target.unmet(c.impl.requirement)


@settings(max_examples=200, deadline=None)
@given(st.lists(impls(), max_size=10), targets(), st.randoms(use_true_random=False))
def test_resolution_is_independent_of_registration_order(impl_list, target, rnd):
    shuffled = list(impl_list)
    rnd.shuffle(shuffled)
    first, second = build(impl_list), build(shuffled)
    for op in OPS:
        assert identity(first.resolve(op, target)) == identity(second.resolve(op, target))
        assert identity(first.resolve(op, target, 2)) == identity(second.resolve(op, target, 2))


@settings(max_examples=200, deadline=None)
@given(st.lists(impls(), max_size=10), targets())
def test_conflicts_are_exactly_the_top_ties(impl_list, target):
    registry = build(impl_list)
    conflicted = {c.op: c for c in registry.conflicts(target)}
    for op in OPS:
        unconditional = [i for i in registry.candidates(op, target) if i.predicate is None]
        if not unconditional:
            assert op not in conflicted
            continue
        top = max(i.tie_key() for i in unconditional)
        tied = [i for i in unconditional if i.tie_key() == top]
        assert (op in conflicted) == (len(tied) > 1)
        if op in conflicted:
            assert conflicted[op].impls[0] is registry.resolve(op, target)
            assert set(conflicted[op].impls) == set(tied)


@settings(max_examples=200, deadline=None)
@given(targets())
def test_targets_round_trip_through_their_spelling(target):
    assert Target.of(str(target)) == target
    assert Target.of(target.as_dict()) == target
