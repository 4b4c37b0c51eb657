"""How far below its own opset an impl reaches: an impl written against ai.onnx ``N`` (``op18.Add``)
is valid at a target ``M < N`` when every ai.onnx op it emits has the same schema at ``M`` as at
``N`` (:func:`opreg.registry.versions.since`). Read from the ops its code visibly emits
(:func:`opreg.registry._opsets.emitted_ops`), once per impl and only when a target below its own
opset asks: a lint, as that is; the exporter checks every emitted node again
(:func:`opreg.exporter._finish.settle_versions`).

Targets below ai.onnx 18 (16 and 17, torch.onnx's ``opset_version=17``) choose among the impls that
reach them; the rest need the opset they were written for.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from opreg.registry import versions
from opreg.registry._opsets import emitted_ops
from opreg.registry.targets import LOWEST_TARGET_OPSET, ONNX_DOMAIN

AXES_BECAME_INPUT = frozenset(
    {
        "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceSumSquare",
    }
)  # fmt: skip
"""The reductions whose ``axes`` are an input from ai.onnx 18 on, an attribute before."""

RESPELLED = AXES_BECAME_INPUT | {"Pad", "Resize", "ScatterElements", "ScatterND", "Split"}
"""The ops whose opset-18 nodes the exporter spells in the older schema below 18 where the node uses
nothing 18 added (:func:`opreg.exporter._older.older_spelling`): they hold no impl above 16 here;
the exporter judges each node."""


@dataclasses.dataclass(frozen=True)
class Reach:
    """The lowest ai.onnx version an impl is valid at, and the ops that set it.

    Fields:
        lowest: that version: the impl's own minimum when its code cannot be read or emits an op onnx
            has no schema for; :data:`opreg.registry.targets.LOWEST_TARGET_OPSET` when no ai.onnx op it
            visibly emits holds it higher. Only ops with an older, different schema hold it: an op
            that did not exist before (BitwiseAnd-18, which an impl may emit for some dtypes only)
            cannot be misread, and each node of it is refused by name when a model is exported, as
            are helpers' nodes.
        set_by: the ops whose schema starts there (``ReduceMean-18``), each as ``Op-since``.
    """

    lowest: int
    set_by: tuple[str, ...] = ()


_reaches: dict[Any, Reach] = {}
"""Each impl's :class:`Reach`, read once (impls are values; a registry holds hundreds)."""


def reach(impl: Any) -> Reach:
    """The :class:`Reach` of ``impl`` (an :class:`opreg.Impl`)."""
    found = _reaches.get(impl)
    if found is None:
        found = _reaches[impl] = _read(impl)
    return found


def _read(impl: Any) -> Reach:
    own = impl.requirement.onnx.min
    try:
        ops = emitted_ops(impl.function)
    except Exception:  # code that cannot be read reaches no lower than its own opset
        return Reach(own)
    needed: dict[str, int] = {}
    for domain, version, op in ops:
        if domain not in (ONNX_DOMAIN, "ai.onnx"):
            continue
        start = versions.since(op, version or own)
        if start is None:
            return Reach(own)
        if versions.since(op, LOWEST_TARGET_OPSET) is None:
            continue  # no older schema to mistake it for: a node of it is refused by name (an impl may branch)
        if op in RESPELLED and start == 18:  # spelled in the older schema where the node allows it
            start = versions.since(op, LOWEST_TARGET_OPSET) or start
        needed[op] = max(needed.get(op, 0), start)
    lowest = min(own, max(needed.values(), default=LOWEST_TARGET_OPSET))
    return Reach(lowest, tuple(sorted(f"{op}-{v}" for op, v in needed.items() if v == lowest)))
