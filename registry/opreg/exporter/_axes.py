"""Axes counted from the front: the ai.onnx nodes the recorder makes name their axes so, where the
rank is known, once for every impl (:func:`normalize`), instead of each impl doing it.

Impls pass torch's ``dim`` through, and torch's is often ``-1``. ONNX allows a negative axis, but
not every consumer handles one: ``onnx.reference``'s GatherElements compares the wrong dims when
the axis is negative and the index is smaller than the data, so ``program.run(...,
runtime="reference")`` failed on ``torch.gather(x, -1, i)`` and ``x.max(-1)``, and onnxscript's
constant folder, which evaluates nodes with it, silently kept such nodes (kornia's gaussian
kernel: 24 nodes computed at every run). A negative axis becomes ``axis + rank``.

:data:`AXIS_OPS` says which attribute or input of which op is an axis, and the rank it counts in:
its data input's, plus the dims the op adds (Unsqueeze's new axes, OneHot's one). Left as torch
gives them (:data:`FUSION_SPELLED`): the ops whose last axis fusion tools match as ``-1`` (the
patterns of onnxscript's ``ort_fusions`` and ``rules/fusion``, and opreg-ort-contrib's rules:
RMS and layer normalization, rotary embeddings, attention); ``onnx.reference`` and the folder
handle those (``tests/test_axes.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir


@dataclasses.dataclass(frozen=True)
class AxisSlot:
    """Where an op holds axes, and the rank they count in.

    Fields:
        attribute: the attribute holding an axis (``axis``) or axes (``axes``), or ``None``.
        input: the index of the input holding axes as a constant tensor, or ``None``.
        added: dims the op adds to its data input's rank before the axes count (``"axes"``:
            as many as the axes given, Unsqueeze's; an int: that many, OneHot's 1).
    """

    attribute: str | None = None
    input: int | None = None
    added: int | str = 0


_AXIS = AxisSlot(attribute="axis")
_AXES_INPUT_1 = AxisSlot(attribute="axes", input=1)  # an attribute up to an opset, an input since

_AXIS_OPS_ONE = (
    "ArgMax", "ArgMin", "Concat", "Compress", "DequantizeLinear", "DFT", "Flatten", "Gather", "GatherElements",
    "Hardmax", "LayerNormalization", "LogSoftmax", "LpNormalization", "QuantizeLinear", "RMSNormalization",
    "Scatter", "ScatterElements", "Softmax", "Split", "SplitToSequence", "TopK", "Unique",
)  # fmt: skip
_REDUCTIONS = (
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd",
    "ReduceSum", "ReduceSumSquare",
)  # fmt: skip

FUSION_SPELLED = frozenset(
    {"Concat", "LayerNormalization", "ReduceMean", "Slice", "Softmax", "Split", "Squeeze", "Unsqueeze"}
)
"""Ops that fusion patterns match with axis ``-1`` (module docstring): not normalized."""

AXIS_OPS: dict[str, AxisSlot] = {
    **dict.fromkeys(_AXIS_OPS_ONE, _AXIS),
    **dict.fromkeys(_REDUCTIONS, _AXES_INPUT_1),
    **dict.fromkeys(("CenterCropPad", "MeanVarianceNormalization", "Resize"), AxisSlot(attribute="axes")),
    "OneHot": AxisSlot(attribute="axis", added=1),
    "CumSum": AxisSlot(input=1),
    "Slice": AxisSlot(input=3),
    "Pad": AxisSlot(input=3),
    "Squeeze": _AXES_INPUT_1,
    "Unsqueeze": AxisSlot(attribute="axes", input=1, added="axes"),
}
"""The ai.onnx ops whose axes :func:`normalize` makes non-negative (Flatten's ``axis`` may be
``r``; ``axis + r`` is right for its negative values too)."""

_LARGEST = 64
"""An axes input of more elements than this is left as it is (it is not a list of axes)."""


def _rank(value: ir.Value | None) -> int | None:
    shape = None if value is None else value.shape
    return None if shape is None else len(shape)


def _normalized(axes: Sequence[int], rank: int) -> list[int] | None:
    """``axes`` counted from the front, or ``None`` when none is negative or one is out of range
    (left for ONNX's check to name)."""
    if all(a >= 0 for a in axes) or any(not -rank <= a < rank + 1 for a in axes):
        return None
    return [a + rank if a < 0 else a for a in axes]


def normalize(
    op_type: str,
    inputs: list[ir.Value | None],
    attributes: list[ir.Attr],
    constant: Callable[[Any, ir.DataType], ir.Value],
) -> tuple[list[ir.Value | None], list[ir.Attr]]:
    """``inputs`` and ``attributes`` of an ai.onnx ``op_type`` node, its negative axes counted from
    the front where the rank is known; a constant axes input is replaced by a new one made with
    ``constant`` (the old one may be shared)."""
    slot = AXIS_OPS.get(op_type)
    if slot is None or not inputs or op_type in FUSION_SPELLED:
        return inputs, attributes
    rank = _rank(inputs[0])
    if rank is None:
        return inputs, attributes
    if slot.attribute is not None:
        for i, attr in enumerate(attributes):
            if attr.name != slot.attribute:
                continue
            single = attr.type == ir.AttributeType.INT
            axes = [attr.value] if single else list(attr.value)
            fixed = _normalized(axes, rank + (len(axes) if slot.added == "axes" else int(slot.added)))
            if fixed is not None:
                attributes = [*attributes]
                attributes[i] = ir.AttrInt64(attr.name, fixed[0]) if single else ir.AttrInt64s(attr.name, fixed)
    if slot.input is not None and len(inputs) > slot.input:
        value = inputs[slot.input]
        tensor = None if value is None else value.const_value
        if tensor is not None and tensor.dtype in (ir.DataType.INT64, ir.DataType.INT32) and tensor.size <= _LARGEST:
            array = tensor.numpy()
            axes = [int(a) for a in array.reshape(-1)]
            fixed = _normalized(axes, rank + (len(axes) if slot.added == "axes" else int(slot.added)))
            if fixed is not None:
                inputs = [*inputs]
                inputs[slot.input] = constant(np.asarray(fixed, dtype=array.dtype).reshape(array.shape), tensor.dtype)
    return inputs, attributes
