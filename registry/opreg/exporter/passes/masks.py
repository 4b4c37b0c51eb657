"""Attention masks that mask nothing, dropped.

transformers 5's mask functions skip the mask of a model without padding only when they can look at
its values; under torch.export they cannot, and they give sdpa a bool mask computed from positions,
``arange(n) >= 0`` broadcast to (batch, 1, S, S) (wav2vec2, HuBERT and the other audio encoders
called without ``attention_mask``). Every element is true at every size, but only the graph's
structure says so: no value is known at export time, so constant folding keeps it.

ONNX Runtime 1.32's CPU kernel of ai.onnx ``Attention`` runs up to 2.2x slower with a mask than
without (1.7x at the audio encoders' head size 16, 2 heads, 1600 frames: bench/attention_kernel.py,
BENCHMARKS.md); with these masks, their latency was 1.2-1.6x optimum-onnx's, whose graphs have
none. :class:`DropAllTrueMasks` removes from each attention node (:data:`MASK_INPUTS`) a bool mask
:func:`all_true` proves true everywhere, or a float mask or bias :func:`all_zero` proves 0
everywhere (the contrib kernels' ``attention_bias``, ``Where(mask, 0, -inf)`` of such a mask). The
output is the same: either adds 0 to every score.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.exporter.passes.pipeline import all_graphs

MAX_DEPTH = 16
"""How many producers up :func:`all_true`, :func:`all_zero` and the bounds look before giving up."""

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


def _decided_by(value: ir.Value, depth: int) -> tuple[np.ndarray | None, ir.Node | None]:
    """What decides ``value``'s elements, past the nodes that only move or repeat them: a constant's
    array, or else the ai.onnx node that computed them; ``(None, None)`` if neither, or too deep."""
    for _ in range(MAX_DEPTH):
        array = _const(value)
        if array is not None:
            return array, None
        source = _moved_from(value)
        if source is None:
            break
        value = source
    node = value.producer()
    return None, (node if node is not None and not node.domain and depth <= MAX_DEPTH else None)


def _bound(value: ir.Value, lowest: bool) -> float | None:
    """A number every element of ``value`` is at least (``lowest``) or at most, as far as its
    producers show: a constant's extreme, a ``Range``'s start where its step goes the other way
    (or is 0), a size (``Shape``, ``Size``: at least 0); ``None`` if the graph does not say."""
    array, node = _decided_by(value, 0)
    if array is not None:
        return None if array.size == 0 else float(array.min() if lowest else array.max())
    if node is None:
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
    array, node = _decided_by(value, depth)
    if array is not None:
        return array.dtype == np.bool_ and bool(array.all())
    if node is None:
        return False
    if node.op_type in _COMPARISONS:
        smaller, larger, strict = _COMPARISONS[node.op_type]
        return _always(node.inputs[smaller], node.inputs[larger], strict)
    if node.op_type in ("And", "Or"):
        proven = [v is not None and all_true(v, depth + 1) for v in node.inputs]
        return all(proven) if node.op_type == "And" else any(proven)
    return False


def all_zero(value: ir.Value, depth: int = 0) -> bool:
    """Whether every element of ``value`` is 0 whatever the model's inputs, as far as its producers
    show: a constant of zeros; ``Where(c, x, y)`` with ``c`` :func:`all_true` and ``x`` all zero;
    and what only moves or repeats them."""
    array, node = _decided_by(value, depth)
    if array is not None:
        return not array.any()
    if node is None:
        return False
    if node.op_type == "Where" and all(v is not None for v in node.inputs[:2]):
        return all_true(node.inputs[0]) and all_zero(node.inputs[1], depth + 1)
    return False


MASK_INPUTS = {("", "Attention"): 3, ("com.microsoft", "MultiHeadAttention"): 5, ("com.microsoft", "Attention"): 5,
               ("com.microsoft", "GroupQueryAttention"): 10}  # fmt: skip
"""The input each attention op adds to its scores (a bool mask: where true, 0): ai.onnx
``attn_mask``, the contrib kernels' ``attention_bias``."""


def masks_nothing(value: ir.Value) -> bool:
    """A bool mask true everywhere (:func:`all_true`) or an additive one 0 everywhere (:func:`all_zero`)."""
    return all_true(value) if value.dtype == ir.DataType.BOOL else all_zero(value)


class DropAllTrueMasks(InPlacePass):
    """Remove from each attention node (:data:`MASK_INPUTS`) a mask that :func:`masks_nothing`
    (see the module docstring); the nodes that computed it go with the next removal of unused nodes."""

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        for owner in all_graphs(model):
            for node in ir.traversal.RecursiveGraphIterator(owner):
                index = MASK_INPUTS.get((node.domain, node.op_type))
                if index is None or len(node.inputs) <= index:
                    continue
                mask = node.inputs[index]
                if mask is None or not masks_nothing(mask):
                    continue
                node.replace_input_with(index, None)
                while node.inputs and node.inputs[-1] is None:
                    node.resize_inputs(len(node.inputs) - 1)
                modified = True
        return PassResult(model, modified)
