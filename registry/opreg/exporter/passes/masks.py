"""Attention masks that mask nothing, dropped.

transformers 5's mask functions skip the mask of a model without padding only when they can look at
its values; under torch.export they cannot, and they give sdpa a bool mask computed from positions,
``arange(n) >= 0`` broadcast to (batch, 1, S, S) (wav2vec2, HuBERT and the other audio encoders
called without ``attention_mask``). Every element is true at every size, but only the graph's
structure says so: no value is known at export time, so constant folding keeps it.

ONNX Runtime 1.32's CPU kernel of ai.onnx ``Attention`` runs up to 2.2x slower with a mask than
without (1.7x at the audio encoders' head size 16, 2 heads, 1600 frames: bench/attention_kernel.py,
BENCHMARKS.md); with these masks, their latency was 1.2-1.6x optimum-onnx's, whose graphs have
none. :class:`DropNoOpMasks` removes from each attention node (:data:`MASK_INPUTS`) a bool mask
:meth:`Proof.everywhere` proves true everywhere, or a float mask or bias it proves 0 everywhere (the
contrib kernels' ``attention_bias``, ``Where(mask, 0, -inf)`` of such a mask), and the contrib
impl's multiplication of the output by "the row has a key" (``ReduceMax(Cast(mask))``), 1
everywhere. The output is the same: a bias of 0 adds 0 to every score, and x * 1 is x.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.exporter.passes.pipeline import all_graphs

MAX_DEPTH = 16
"""How many producers up :meth:`Proof.everywhere` and the bounds look before giving up."""

LARGEST_CONSTANT = 1 << 22
"""The most elements a constant may have for its values to be read (a static mask of 2048 x 2048)."""

_SAME_VALUES = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Expand", "Identity", "Flatten", "Transpose"})
"""Ops whose output holds only values of their first input (moved, repeated, or reshaped)."""

_PASS_VALUE = frozenset({"Cast", "CastLike", "ReduceMax", "ReduceMin"})
"""Ops whose every output element is an input element, or its cast: a tensor of one value 0 or 1
(or true) stays one."""

_COMPARISONS = {"GreaterOrEqual": (1, 0, False), "Greater": (1, 0, True), "LessOrEqual": (0, 1, False),
                "Less": (0, 1, True)}  # fmt: skip
"""Each comparison ``op(a, b)``: which input is the smaller one, which the larger, and whether strictly."""

MASK_INPUTS = {("", "Attention"): 3, ("com.microsoft", "MultiHeadAttention"): 5, ("com.microsoft", "Attention"): 5,
               ("com.microsoft", "GroupQueryAttention"): 10}  # fmt: skip
"""The input each attention op adds to its scores (a bool mask: where true, 0): ai.onnx
``attn_mask``, the contrib kernels' ``attention_bias``."""


def _moved_from(value: ir.Value) -> ir.Value | None:
    """The input whose values ``value``'s producer only moves or repeats, if it is such a node."""
    node = value.producer()
    if node is None or node.domain or node.op_type not in _SAME_VALUES or node.inputs[0] is None:
        return None
    return node.inputs[0]


def _same_shape(a: ir.Value, b: ir.Value) -> bool:
    """Both shapes known, every dim known (symbolic ones by name) and equal."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(isinstance(d, int) or d.value is not None for d in a.shape) and list(a.shape) == list(b.shape)


class Proof:
    """What a graph's structure proves of a value's elements whatever the model's inputs, reading
    no value of ``weights`` (the model's ``state_dict`` entries, by initializer name): what a
    weight holds at export time says nothing of what it will hold (an RMS norm's weight starts as
    ones). Constants the graph computed, folded or written by impls, are read."""

    def __init__(self, weights: frozenset[str]) -> None:
        self.weights = weights

    def const(self, value: ir.Value | None) -> np.ndarray | None:
        if value is None or value.name in self.weights:
            return None
        tensor = ir.convenience.get_const_tensor(value)
        return None if tensor is None or tensor.size > LARGEST_CONSTANT else tensor.numpy()

    def decided_by(self, value: ir.Value, depth: int) -> tuple[np.ndarray | None, ir.Node | None]:
        """What decides ``value``'s elements, past the nodes that only move or repeat them: a
        constant's array, or else the ai.onnx node that computed them; ``(None, None)`` if neither."""
        for _ in range(MAX_DEPTH):
            array = self.const(value)
            if array is not None:
                return array, None
            source = _moved_from(value)
            if source is None:
                break
            value = source
        node = value.producer()
        return None, (node if node is not None and not node.domain and depth <= MAX_DEPTH else None)

    def bound(self, value: ir.Value, lowest: bool) -> float | None:
        """A number every element of ``value`` is at least (``lowest``) or at most: a constant's
        extreme, a ``Range``'s start where its step goes the other way (or is 0), a size (``Shape``,
        ``Size``: at least 0); ``None`` if the graph does not say."""
        array, node = self.decided_by(value, 0)
        if array is not None:
            return None if array.size == 0 else float(array.min() if lowest else array.max())
        if node is None:
            return None
        if node.op_type in ("Shape", "Size") and lowest:
            return 0.0
        if node.op_type == "Range":
            start, delta = self.const(node.inputs[0]), self.const(node.inputs[2])
            if start is not None and delta is not None and start.size == delta.size == 1:
                ahead = float(delta.reshape(())) >= 0 if lowest else float(delta.reshape(())) <= 0
                return float(start.reshape(())) if ahead else None
        return None

    def always(self, smaller: ir.Value | None, larger: ir.Value | None, strict: bool) -> bool:
        """Every element of ``smaller`` is below (``strict``) or at most every element of ``larger``."""
        if smaller is None or larger is None:
            return False
        high, low = self.bound(smaller, lowest=False), self.bound(larger, lowest=True)
        return high is not None and low is not None and (high < low if strict else high <= low)

    def everywhere(self, value: ir.Value, target: int, depth: int = 0) -> bool:
        """Whether every element of ``value`` equals ``target`` (0, or 1: true for a bool): a
        constant; a comparison whose operands' bounds decide it (``arange(n) >= 0`` is 1
        everywhere); ``And`` of such, ``Or`` with one; ``Where(c, x, y)`` with ``c`` 1 and ``x``
        ``target`` everywhere; what only moves, repeats, casts or reduces them."""
        array, node = self.decided_by(value, depth)
        if array is not None:
            return bool((array == target).all())
        if node is None:
            return False
        if node.op_type in _COMPARISONS:
            smaller, larger, strict = _COMPARISONS[node.op_type]
            return target == 1 and self.always(node.inputs[smaller], node.inputs[larger], strict)
        if node.op_type in ("And", "Or") and target == 1:
            proven = [v is not None and self.everywhere(v, 1, depth + 1) for v in node.inputs]
            return all(proven) if node.op_type == "And" else any(proven)
        if node.op_type in _PASS_VALUE and node.inputs[0] is not None:
            return self.everywhere(node.inputs[0], target, depth + 1)
        if node.op_type == "Where" and all(v is not None for v in node.inputs[:2]):
            return self.everywhere(node.inputs[0], 1, depth + 1) and self.everywhere(node.inputs[1], target, depth + 1)
        return False

    def masks_nothing(self, value: ir.Value) -> bool:
        """A bool mask true everywhere or an additive one 0 everywhere (:meth:`everywhere`)."""
        return self.everywhere(value, 1 if value.dtype == ir.DataType.BOOL else 0)

    def times_ones(self, node: ir.Node) -> ir.Value | None:
        """``x`` if ``node`` is ``Mul(x, ones)`` (either order) of ``x``'s shape and dtype, ``ones``
        1 everywhere: what the contrib kernels' output is multiplied by, "the row has a key", for a
        mask that masks nothing."""
        if node.op_type != "Mul" or node.domain or len(node.inputs) != 2 or None in node.inputs:
            return None
        out = node.outputs[0]
        for x, ones in (node.inputs, reversed(node.inputs)):
            if x.dtype == out.dtype and _same_shape(x, out) and self.everywhere(ones, 1):
                return x
        return None


class DropNoOpMasks(InPlacePass):
    """Remove from each attention node (:data:`MASK_INPUTS`) a mask that :meth:`Proof.masks_nothing`
    (see the module docstring), and a multiplication by ones computed from such a mask
    (:meth:`Proof.times_ones`), never reading ``weights`` (:class:`Proof`); the nodes that computed
    them go with the next removal of unused nodes."""

    def __init__(self, weights: frozenset[str]) -> None:
        self.weights = weights

    def call(self, model: ir.Model) -> PassResult:
        proof, modified = Proof(self.weights), False
        for owner in all_graphs(model):
            for node in ir.traversal.RecursiveGraphIterator(owner):
                kept = None if node.outputs[0].is_graph_output() else proof.times_ones(node)
                if kept is not None:
                    ir.convenience.replace_all_uses_with(node.outputs[0], kept)
                    modified = True
                    continue
                index = MASK_INPUTS.get((node.domain, node.op_type))
                if index is None or len(node.inputs) <= index:
                    continue
                mask = node.inputs[index]
                if mask is None or not proof.masks_nothing(mask):
                    continue
                node.replace_input_with(index, None)
                while node.inputs and node.inputs[-1] is None:
                    node.resize_inputs(len(node.inputs) - 1)
                modified = True
        return PassResult(model, modified)
