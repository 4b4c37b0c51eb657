"""Attention masks that mask nothing, dropped.

transformers 5's mask functions skip the mask of a model without padding only when they can look at
its values; under torch.export they cannot, and they give sdpa a bool mask computed from positions,
``arange(n) >= 0`` broadcast to (batch, 1, S, S) (wav2vec2, HuBERT and the other audio encoders
called without ``attention_mask``). Every element is true at every size, but only the graph's
structure says so: no value is known at export time, so constant folding keeps it.

ONNX Runtime 1.32's CPU kernel of ai.onnx ``Attention`` runs 1.5-2x slower with a mask than
without (bench/attention_kernel.py, BENCHMARKS.md); with these masks, the audio encoders' latency
was 1.2-1.6x optimum-onnx's, whose graphs have no mask. :class:`DropAllTrueMasks` removes from each
``Attention`` a bool mask :func:`all_true` proves true everywhere. The output is the same: a true
element of a bool mask adds 0 to its score.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.exporter.passes.pipeline import all_graphs

MAX_DEPTH = 16
"""How many producers up :func:`all_true` and the bounds look before giving up."""

_SAME_VALUES = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Expand", "Identity", "Flatten", "Transpose"})
"""Ops whose output holds only values of their first input (moved, repeated, or reshaped)."""


def _const(value: ir.Value | None) -> np.ndarray | None:
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def _moved_from(value: ir.Value) -> ir.Value | None:
    """The input whose values ``value``'s producer only moves or repeats, if it is such a node."""
    node = value.producer()
    if node is None or node.domain or node.op_type not in _SAME_VALUES or node.inputs[0] is None:
        return None
    return node.inputs[0]


def _bound(value: ir.Value, lowest: bool, depth: int = 0) -> float | None:
    """A number every element of ``value`` is at least (``lowest``) or at most, as far as its
    producers show: a constant's extreme, a ``Range``'s start where its step goes the other way
    (or is 0), a size (``Shape``, ``Size``: at least 0); ``None`` if the graph does not say."""
    array = _const(value)
    if array is not None:
        return None if array.size == 0 else float(array.min() if lowest else array.max())
    if depth > MAX_DEPTH:
        return None
    source = _moved_from(value)
    if source is not None:
        return _bound(source, lowest, depth + 1)
    node = value.producer()
    if node is None or node.domain:
        return None
    if node.op_type in ("Shape", "Size") and lowest:
        return 0.0
    if node.op_type == "Range":
        start, delta = _const(node.inputs[0]), _const(node.inputs[2])
        if start is not None and delta is not None and start.size == delta.size == 1:
            ahead = float(delta.reshape(())) >= 0 if lowest else float(delta.reshape(())) <= 0
            return float(start.reshape(())) if ahead else None
    return None


def _always(smaller: ir.Value | None, larger: ir.Value | None, strict: bool) -> bool:
    """Every element of ``smaller`` is below (``strict``) or at most every element of ``larger``."""
    if smaller is None or larger is None:
        return False
    high, low = _bound(smaller, lowest=False), _bound(larger, lowest=True)
    return high is not None and low is not None and (high < low if strict else high <= low)


_COMPARISONS = {"GreaterOrEqual": (1, 0, False), "Greater": (1, 0, True), "LessOrEqual": (0, 1, False),
                "Less": (0, 1, True)}  # fmt: skip
"""Each comparison ``op(a, b)``: which input is the smaller one, which the larger, and whether strictly."""


def all_true(value: ir.Value, depth: int = 0) -> bool:
    """Whether every element of the bool ``value`` is true whatever the model's inputs, as far as its
    producers show: a constant all true; a comparison whose operands' bounds decide it
    (``arange(n) >= 0``); ``And`` of such, ``Or`` with one; and what only moves or repeats them."""
    array = _const(value)
    if array is not None:
        return array.dtype == np.bool_ and bool(array.all())
    node = value.producer()
    if node is None or node.domain or depth > MAX_DEPTH:
        return False
    source = _moved_from(value)
    if source is not None:
        return all_true(source, depth + 1)
    if node.op_type in _COMPARISONS:
        smaller, larger, strict = _COMPARISONS[node.op_type]
        return _always(node.inputs[smaller], node.inputs[larger], strict)
    if node.op_type in ("And", "Or"):
        proven = [v is not None and all_true(v, depth + 1) for v in node.inputs]
        return all(proven) if node.op_type == "And" else any(proven)
    return False


class DropAllTrueMasks(InPlacePass):
    """Remove from each ai.onnx ``Attention`` its bool mask where :func:`all_true` proves it true
    everywhere (see the module docstring); the nodes that computed it go with the next removal of
    unused nodes."""

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        for owner in all_graphs(model):
            for node in ir.traversal.RecursiveGraphIterator(owner):
                if node.op_type != "Attention" or node.domain or len(node.inputs) < 4:
                    continue
                mask = node.inputs[3]
                if mask is None or mask.dtype != ir.DataType.BOOL or not all_true(mask):
                    continue
                node.replace_input_with(3, None)
                if len(node.inputs) == 4:
                    node.resize_inputs(3)
                modified = True
        return PassResult(model, modified)
