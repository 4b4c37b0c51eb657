"""A model at an ai.onnx older than its impls' opset (``target=17``, torch.onnx's ``opset_version=17``):
each node emitted against a newer opset (``op18.Gemm``) is read at the model's, and means the same
there when its op's schema is the same (:func:`opreg.registry.versions.since`). The registry chooses
impls that visibly reach the target (:mod:`opreg.registry.reach`); every emitted node is judged here,
helpers' and functions' nodes included, and the ops that need a newer opset are named.

The common ops whose schema changed at 18 are spelled in their older schema instead, where the
node uses nothing the newer one added (:func:`older_spelling`), so the impls written with
``op18`` that emit them reach 16 and 17 with no variant written by hand: the reductions whose axes
became an input (ReduceMean, ReduceMax, ... take them as an attribute before 18), and Pad, Resize,
ScatterElements, ScatterND and Split used without their opset-18 additions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from opreg.registry.reach import AXES_BECAME_INPUT
from opreg.registry.versions import since

Use = Any
"""An :class:`opreg.exporter._recorder.Use` (not imported: the recorder imports this module)."""

_ADDED_AT_18 = {
    "Pad": (3, ()),  # the axes input
    "Resize": (4, ("antialias", "axes", "keep_aspect_ratio_policy")),
    "ScatterElements": (None, ()),  # reduction max/min: checked below
    "ScatterND": (None, ()),
    "Split": (None, ("num_outputs",)),
}
"""Ops whose opset-18 schema added inputs (from that index) or attributes: without them, a node
means the same in the older schema (the rest of :data:`opreg.registry.reach.RESPELLED`)."""


def older_spelling(
    op_type: str, version: int, target: int, inputs: list[ir.Value | None], attributes: list[ir.Attr]
) -> tuple[int, list[ir.Value | None], list[ir.Attr]] | None:
    """``(version, inputs, attributes)`` of an ai.onnx node emitted against ``version`` (18 or newer)
    spelled in the schema the model's ``target`` (below 18) reads, or ``None`` when it cannot be (its
    axes are not a constant, or it uses what 18 added)."""
    older = since(op_type, target)
    if older is None or older == since(op_type, version) or since(op_type, version) != 18:
        return None
    if op_type in AXES_BECAME_INPUT:
        if any(a.name == "noop_with_empty_axes" and a.value for a in attributes):
            return None
        axes = inputs[1] if len(inputs) > 1 else None
        tensor = None if axes is None else axes.const_value
        if axes is not None and tensor is None:
            return None
        listed = [] if tensor is None else [int(a) for a in tensor.numpy().reshape(-1)]
        kept = [a for a in attributes if a.name != "noop_with_empty_axes"]
        return older, inputs[:1], kept + ([ir.AttrInt64s("axes", listed)] if listed else [])
    added = _ADDED_AT_18.get(op_type)
    if added is None:
        return None
    first, names = added
    if first is not None and any(v is not None for v in inputs[first:]):
        return None
    if any(a.name in names for a in attributes):
        return None
    if op_type.startswith("Scatter") and any(a.name == "reduction" and a.value in ("max", "min") for a in attributes):
        return None
    return older, list(inputs[:first] if first is not None else inputs), attributes


def reaches(use: Use, version: int) -> bool:
    """Whether ``use``, emitted at a newer ai.onnx, means the same read at ``version``. A kept
    function's use is judged by its nodes' (the recorder records each)."""
    if use.what.startswith("function "):
        return True
    op = use.what.removeprefix("ai.onnx::")
    found = since(op, use.version) if use.version is not None else None
    return found is not None and found == since(op, version)


def refusal(below: Mapping[str, Sequence[Use]], version: int) -> str:
    """What an export at ai.onnx ``version`` says of the ops it cannot hold (``below``: each op's uses):
    each op with the version its schema needs and who emitted it."""
    parts, newest = [], version + 1
    for what, found in sorted(below.items()):
        op, emitted = what.removeprefix("ai.onnx::"), max(u.version or 0 for u in found)
        needs = since(op, emitted) or emitted
        newest = max(newest, needs)
        emitters = ", ".join(sorted({u.emitter for u in found}))
        parts.append(f"{op} needs ai.onnx {needs} (its schema at {version} differs; emitted by {emitters})")
    return (
        f"target ai.onnx {version} cannot hold the model: {'; '.join(parts)}. Export at target={newest} or newer, "
        f"or register impls of those ops written against ai.onnx opset {version}"
    )
