"""Making the translated graph lean: what impls emit one node at a time leaves
work a whole-graph view removes. Each step is an ``onnx_ir`` pass;
:func:`lean_passes` lists them in order for the finishing pipeline.

- Constant folding (onnxscript's ``FoldConstantsPass``), except of nodes that
  read the model's weights (its ``state_dict`` entries): folding
  ``Transpose(weight)`` would replace a weight by an anonymous copy, and users
  look weights up by name. Non-persistent buffers and lifted constants are folded.
- Batch norm folded into the convolution (or Gemm) before it, and (after the
  lean pass, before the packs' rewrite rules, :class:`FoldWeightTransposes`) a
  weight read only through a Transpose stored transposed, the folded weight keeping the name of
  the one it replaces and the model's metadata saying how each was computed
  (``fold_weights=False`` keeps every weight as the ``state_dict`` has it).
- A few exact rewrites, repeated until none fires (onnxscript's rules where it
  has them): no-op Cast/Expand/Transpose, arithmetic with a scalar that is exactly
  neutral (``x * 1``, ``x + 0``, ``x - 0``, ``x / 1``; onnxscript's rules for these also
  take a scalar within 1e-8, an epsilon, for neutral), Cast of Cast,
  Reshape of Reshape, Transpose of Transpose, Unsqueeze of Unsqueeze,
  ``Unsqueeze(Squeeze(x))`` on a one-element 1-D ``x``, which symbolic sizes
  produce (``sym_size`` gives a scalar; ``view``'s shape list wants it back
  as ``[n]``), a Reshape (or two) whose result has the input's very
  shape (the same dims, symbolic ones by name), and (onnxscript's
  ``MaterializeReshapeShape``) a ``Reshape`` whose result has at most one size
  known only at run time gets a constant shape, ``-1`` for that size, so the
  nodes that computed it go; a ``GatherND`` of a 2-D tensor at the grid of its own positions
  (transformers' masks read the attention mask so) is that tensor with unit axes
  (:mod:`opreg.exporter.passes.grids`). Round trips between layouts (heads split and
  merged again around an attention kernel) leave these; ONNX Runtime would
  otherwise do some of them again at every session creation.
- An attention node's mask the graph proves masks nothing (``arange(n) >= 0``
  broadcast: transformers 5's mask of a model without padding, as traced; or the
  contrib kernels' bias made of it) dropped, and a product with ones computed from
  it (:mod:`opreg.exporter.passes.masks`): ONNX Runtime's kernels run slower with a mask.
- ``Abs`` of a size list dropped where every size is known to be >= 0 (``Shape``
  of something, constants, and what reshapes and concatenations make of them):
  ``expand`` writes ``Expand(x, Abs(sizes))`` so a ``-1`` keeps a dim, which
  ONNX Runtime's symbolic shape inference (behind its transformer optimizer)
  cannot follow; a ``-1`` in a constant part is folded to ``1`` instead.
- Common subexpressions computed once (``Shape`` of the same input, ...).
- Constants become initializers, as torch.onnx's graphs have them.

Random nodes (``_recorder.RANDOM_OPS``) are never folded nor merged: two draws are
two draws, even when they have the same inputs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassBase, PassResult
from onnx_ir.passes import common as common_passes
from onnxscript.optimizer import _constant_folding
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules import common as rules
from onnxscript.rewriter.rules.common._fuse_batchnorm import (
    FuseBatchNormIntoConv,
    FuseBatchNormIntoConvTranspose,
    FuseBatchNormIntoGemm,
)
from onnxscript.rewriter.rules.common._materialize_reshape_shape import MaterializeReshapeShape

from opreg.exporter._recorder import is_random
from opreg.exporter.passes.grids import GATHER_OF_OWN_POSITIONS
from opreg.exporter.passes.masks import DropNoOpMasks
from opreg.exporter.passes.pipeline import Pipeline, Rules, all_graphs


def _squeeze_unsqueeze(op, x, axes_squeeze, axes_unsqueeze):
    return op.Unsqueeze(op.Squeeze(x, axes_squeeze), axes_unsqueeze)


def _is_round_trip(context, x, axes_squeeze, axes_unsqueeze, **_) -> bool:
    """``x`` is 1-D with one element and both axes are ``[0]``: the pair is the identity."""
    shape = x.shape
    if shape is None or shape.rank() != 1 or shape[0] != 1:
        return False
    for axes in (axes_squeeze, axes_unsqueeze):
        value = ir.convenience.get_const_tensor(axes)
        if value is None or value.numpy().reshape(-1).tolist() not in ([0], [-1]):
            return False
    return True


def _identity(op, x, **_):
    return op.Identity(x)


_SQUEEZE_UNSQUEEZE = pattern.RewriteRule(_squeeze_unsqueeze, _identity, _is_round_trip)


def _reshape(op, x, shape):
    return op.Reshape(x, shape, _allow_other_attributes=True)


def _reshape_reshape(op, x, first, second):
    return op.Reshape(op.Reshape(x, first, _allow_other_attributes=True), second, _allow_other_attributes=True)


def _protective_reshape(node: ir.Node) -> bool:
    """A Reshape with ``allowzero=1``, kept even where shapes say it changes nothing: impls write it
    where a size may be 0, and runtimes get empty tensors wrong just before it (ONNX Runtime
    before 1.32 returns an empty input to ``ReduceL2`` and friends unreduced, which cdist's
    Reshape puts right)."""
    return node.op_type == "Reshape" and not node.domain and bool(node.attributes.get_int("allowzero", 0))


def _keeps_shape(context, x, **_) -> bool:
    """The Reshape(s) give back ``x``'s shape: every dim known and equal (symbolic dims by name);
    never a :func:`_protective_reshape`."""
    if any(_protective_reshape(n) for n in context.nodes):
        return False
    before, after = x.shape, context.output_values[0].shape
    if before is None or after is None or len(before) != len(after):
        return False
    known = all(isinstance(d, int) or d.value is not None for d in before)
    return known and list(before) == list(after)


_ZERO, _ONE = pattern.Constant(0, rel_tol=0.0, abs_tol=0.0), pattern.Constant(1, rel_tol=0.0, abs_tol=0.0)
"""Scalars matched exactly: onnxscript's own no-op rules (``add_0_rule``...) match a scalar within
1e-8 of 0 or 1, so an ``x + 1e-08`` (Helium's RMS norm epsilon) went, and a padded row's zero
embedding became ``0 * inf``."""


def _add_zero(op, x):
    return op.Add(x, _ZERO)


def _sub_zero(op, x):
    return op.Sub(x, _ZERO)


def _mul_one(op, x):
    return op.Mul(x, _ONE)


def _div_one(op, x):
    return op.Div(x, _ONE)


_NEUTRAL_SCALARS = (
    *pattern.RewriteRule(_mul_one, _identity, name="MulByOne").commute(),
    *pattern.RewriteRule(_add_zero, _identity, name="AddZero").commute(),
    pattern.RewriteRule(_sub_zero, _identity, name="SubZero"),
    pattern.RewriteRule(_div_one, _identity, name="DivByOne"),
)

_NO_OP_RESHAPE = pattern.RewriteRule(_reshape, _identity, _keeps_shape, name="NoOpReshape")
_RESHAPE_ROUND_TRIP = pattern.RewriteRule(_reshape_reshape, _identity, _keeps_shape, name="ReshapeRoundTrip")


class _MaterializeShape(MaterializeReshapeShape):
    """onnxscript's ``MaterializeReshapeShape``, with ``allowzero`` only where a size is 0: a
    Reshape with ``allowzero=1`` is an impl's :func:`_protective_reshape`, and ONNX forbids
    ``allowzero=1`` with a ``-1``, so a shape holding both is left as it is."""

    def check(self, context, data, shape):  # type: ignore[no-untyped-def]
        result = super().check(context, data, shape)
        if result and 0 in self._new_dims and -1 in self._new_dims:
            return result.fail("a 0 size and a size known only at run time: allowzero cannot be set")
        return result

    def rewrite(self, op, data, shape):  # type: ignore[no-untyped-def]
        if 0 in self._new_dims:
            return super().rewrite(op, data, shape)
        return op.Reshape(data, op.Constant(value=ir.tensor(self._new_dims, dtype=ir.DataType.INT64)))


RULES = (
    rules.no_op_cast_rule,
    rules.no_op_expand_rule,
    rules.no_op_transpose_rule,
    *_NEUTRAL_SCALARS,
    rules.cast_cast_rule,
    _RESHAPE_ROUND_TRIP,
    rules.reshape_reshape_rule,
    rules.transpose_transpose_rule,
    rules.unsqueeze_unsqueeze_rule,
    _SQUEEZE_UNSQUEEZE,
    _NO_OP_RESHAPE,
    _MaterializeShape.rule(),  # after the rules that remove a Reshape: each node gets the first that fires
    *GATHER_OF_OWN_POSITIONS,
)
"""The exact rewrites of the clean-up sweeps, in the order a node tries them."""

_DRAW = "_opreg_draw"


@contextlib.contextmanager
def _distinct_draws(graph: ir.Graph) -> Iterator[None]:
    """Give each random node of ``graph`` an attribute of its own while the block runs, so passes that
    merge equal nodes (CSE) see them as different, as they are."""
    marked = [node for node in graph if is_random(node)]
    for index, node in enumerate(marked):
        node.attributes[_DRAW] = ir.AttrInt64(_DRAW, index)
    try:
        yield
    finally:
        for node in marked:
            node.attributes.pop(_DRAW, None)


_SIZE_PRESERVING = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Identity", "Slice", "Gather", "Flatten"})
_SIZE_COMBINING = frozenset({"Concat", "Add", "Mul", "Max"})


def _non_negative(value: ir.Value, depth: int = 0) -> bool:
    """``value`` (an integer tensor) holds no negative number, as far as its producers show."""
    if value.const_value is not None:
        return bool((value.const_value.numpy() >= 0).all())
    producer = value.producer()
    if producer is None or depth > 16:
        return False
    if producer.op_type in ("Shape", "Size") and not producer.domain:
        return True
    if producer.op_type in _SIZE_PRESERVING and not producer.domain:
        return _non_negative(producer.inputs[0], depth + 1)
    if producer.op_type in _SIZE_COMBINING and not producer.domain:
        return all(v is not None and _non_negative(v, depth + 1) for v in producer.inputs)
    return False


def _without_abs(node: ir.Node) -> ir.Value | None:
    """What ``node`` (an ``Abs`` of sizes) can be replaced by, or ``None``: its input if no size
    can be negative; for a ``Concat`` whose only possibly negative parts are constants, a new
    ``Concat`` (inserted before ``node``) with those constants made non-negative."""
    sizes = node.inputs[0]
    if sizes is None:
        return None
    if _non_negative(sizes):
        return sizes
    concat = sizes.producer()
    if concat is None or concat.op_type != "Concat" or concat.domain:
        return None
    if not all(p is not None and (p.const_value is not None or _non_negative(p)) for p in concat.inputs):
        return None
    owner = node.graph
    assert owner is not None
    parts = []
    for part in concat.inputs:
        assert part is not None
        if part.const_value is None or _non_negative(part):
            parts.append(part)
            continue
        constant = ir.node("Constant", [], attributes={"value": ir.tensor(np.abs(part.const_value.numpy()))})
        constant.metadata_props.update(node.metadata_props)
        owner.insert_before(node, constant)
        parts.append(constant.outputs[0])
    rebuilt = ir.node("Concat", parts, attributes={"axis": 0})
    rebuilt.metadata_props.update(node.metadata_props)
    owner.insert_before(node, rebuilt)
    rebuilt.outputs[0].type, rebuilt.outputs[0].shape = sizes.type, sizes.shape
    return rebuilt.outputs[0]


class DropAbsOfSizes(InPlacePass):
    """Replace each ``Abs`` of sizes that :func:`_without_abs` can do without (see the module docstring)."""

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        for owner in all_graphs(model):
            for node in list(ir.traversal.RecursiveGraphIterator(owner)):
                if node.op_type != "Abs" or node.domain or node.outputs[0].is_graph_output():
                    continue
                replacement = _without_abs(node)
                if replacement is not None:
                    ir.convenience.replace_all_uses_with(node.outputs[0], replacement)
                    modified = True
        return PassResult(model, modified)


FOLDED_WEIGHTS_KEY = "opreg.folded_weights"
"""Model metadata: JSON ``{initializer: how it was computed from the state_dict}`` for every
weight the lean pass folded (batch norm into the convolution or Gemm before it)."""


class _LazyFold:
    """A batch-norm fold whose folded weight is computed as the model is written
    (:func:`opreg.weights.scaled`): onnxscript's pattern and checks, this rewrite. The batch norm's
    parameters and the bias are per channel (small) and computed now, as onnxscript's rule does:
    ``W * s`` and ``(beta_gemm * b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)``, in float32."""

    def rewrite(self, op, x, inbound_out, batchnorm_out):  # type: ignore[no-untyped-def]
        from opreg import weights as lazy_weights

        norm, layer = batchnorm_out.producer(), inbound_out.producer()
        gamma, beta, mean, var = (v.const_value.numpy() for v in norm.inputs[1:5])
        scale = gamma / np.sqrt(var + norm.attributes.get_float("epsilon", 1e-5))
        attributes = dict(layer.attributes)
        gemm_beta = attributes.pop("beta").as_float() if "beta" in attributes else 1.0
        weight = layer.inputs[1]
        groups = attributes["group"].as_int() if self.op_type == "ConvTranspose" and "group" in attributes else 1
        fused = lazy_weights.scaled(
            weight.const_value, scale, self.get_filters_axis(layer.attributes), groups, name=weight.name
        )
        bias = layer.inputs[2] if len(layer.inputs) > 2 else None
        before = bias.const_value.numpy() if bias is not None else np.zeros_like(mean)
        bias_name = bias.name if bias is not None else f"{weight.name}_bias"
        folded_bias = ir.tensor((gemm_beta * before - mean) * scale + beta)
        return op.op(
            self.op_type, x, op.initializer(fused, name=weight.name), op.initializer(folded_bias, name=bias_name),
            **attributes,
        )  # fmt: skip


def _unless_bfloat16(result, inbound_out):  # type: ignore[no-untyped-def]
    """A bfloat16 layer keeps its batch norm: numpy computes the fold's factors in float32 (ml_dtypes
    promotes), and a bfloat16 weight times them is no bfloat16 weight."""
    if result and inbound_out.dtype == ir.DataType.BFLOAT16:
        return result.fail("a bfloat16 layer keeps its batch norm (the fold computes in float32)")
    return result


class _LazyConv(_LazyFold, FuseBatchNormIntoConv):
    def check(self, context, x, inbound_out, batchnorm_out):  # type: ignore[no-untyped-def]
        return _unless_bfloat16(super().check(context, x, inbound_out, batchnorm_out), inbound_out)


class _LazyGemm(_LazyFold, FuseBatchNormIntoGemm):
    def check(self, context, x, inbound_out, batchnorm_out):  # type: ignore[no-untyped-def]
        return _unless_bfloat16(super().check(context, x, inbound_out, batchnorm_out), inbound_out)


class _LazyConvTranspose(_LazyFold, FuseBatchNormIntoConvTranspose):
    def get_filters_axis(self, attributes) -> int:  # type: ignore[no-untyped-def]
        return 1  # weight (in, out / group, ...): per group, as :func:`opreg.weights.scaled` takes it

    def check(self, context, x, inbound_out, batchnorm_out):  # type: ignore[no-untyped-def]
        """The base check, and ``in_channels`` divisible by ``group``, read from the weight's shape."""
        result = _unless_bfloat16(
            FuseBatchNormIntoConv.check(self, context, x, inbound_out, batchnorm_out), inbound_out
        )
        if not result:
            return result
        layer = inbound_out.producer()
        group = layer.attributes.get_int("group", 1)
        if layer.inputs[1].const_value.shape[0] % group:
            return result.fail(f"ConvTranspose's in_channels is not divisible by its group ({group})")
        return result


_FOLD_BATCH_NORM = pattern.RewriteRuleSet([_LazyConv().rule(), _LazyConvTranspose().rule(), _LazyGemm().rule()])


def fold_batch_norm(model: ir.Model) -> dict[str, str]:
    """Fold each BatchNormalization into the Conv, ConvTranspose or Gemm before it (onnxscript's
    patterns, as ONNX Runtime does when it loads the model; the folded weight lazy, :class:`_LazyFold`).
    The folded weight keeps the name of the
    weight it replaces, which no node reads any more; a bias the layer did not have is named
    ``<weight>_bias``. Returns how each folded tensor was computed, by name."""
    planned: dict[str, dict[str, str]] = {}  # batch-norm node -> {folded tensor: how it is computed}
    for node in model.graph:
        if node.op_type != "BatchNormalization" or node.domain != "" or node.inputs[0] is None:
            continue
        layer = node.inputs[0].producer()
        if layer is None or layer.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(layer.inputs) < 2:
            continue
        gamma, beta, mean, var = (v.name if v is not None else "?" for v in node.inputs[1:5])
        scale = f"{gamma} / sqrt({var} + eps)"
        weight = layer.inputs[1].name or "?"
        bias = layer.inputs[2].name if len(layer.inputs) > 2 and layer.inputs[2] is not None else None
        planned[node.name or ""] = {
            weight: f"{weight} * {scale}",
            bias or f"{weight}_bias": f"({bias or '0'} - {mean}) * {scale} + {beta}",
        }
    if not planned:
        return {}
    _FOLD_BATCH_NORM.apply_to_model(model)
    remaining = {node.name for node in model.graph if node.op_type == "BatchNormalization"}
    return {
        tensor: how for name, tensors in planned.items() if name not in remaining for tensor, how in tensors.items()
    }


TRANSPOSE_FOLD_MAX_BYTES = 16 * 2**20
"""Weights held in memory up to this size are stored transposed (:func:`fold_weight_transposes`); a
larger one keeps its Transpose, which ONNX Runtime folds at load: transposing it when the model is
saved would hold another copy of it, and a big model's peak memory is the weights plus that copy.
A weight streamed from a checkpoint (``weights=``, ``opreg llm export``) is stored transposed at any
size: it is the only weight in memory while it is written."""


def fold_weight_transposes(model: ir.Model, weights: frozenset[str]) -> dict[str, str]:
    """Store each weight (held in memory: up to :data:`TRANSPOSE_FOLD_MAX_BYTES`) that is read only through one
    ``Transpose`` already transposed, under its own name, and drop the node: a Linear on a 3-D
    input reads ``Transpose(W)``, which torch.onnx folds into a new anonymous tensor and ONNX
    Runtime otherwise folds at every session creation. The transposed data is made when the model
    is serialized (:func:`opreg.weights.transpose`), one weight at a time. Returns how each folded tensor was
    computed."""
    from opreg import weights as lazy_weights

    folded: dict[str, str] = {}
    for node in list(model.graph):
        if node.op_type != "Transpose" or node.domain or node.outputs[0].is_graph_output():
            continue
        weight = node.inputs[0]
        if weight is None or weight.name not in weights or weight.const_value is None:
            continue
        if len(weight.uses()) != 1 or weight.is_graph_output() or weight.is_graph_input():
            continue
        source = weight.const_value
        if source.nbytes > TRANSPOSE_FOLD_MAX_BYTES and lazy_weights.lazy(source).held:
            continue
        rank = len(source.shape)
        perm = list(node.attributes.get_ints("perm", list(reversed(range(rank)))))
        weight.const_value = lazy_weights.transpose(source, perm, name=weight.name)
        weight.shape = ir.Shape(list(weight.const_value.shape))
        node.outputs[0].replace_all_uses_with(weight)
        model.graph.remove(node, safe=True)
        folded[weight.name] = f"transpose({weight.name}, perm={perm})"
    return folded


def _record_folded(model: ir.Model, folded: dict[str, str]) -> None:
    """Add ``folded`` to the model's :data:`FOLDED_WEIGHTS_KEY` metadata."""
    before = json.loads(model.metadata_props.get(FOLDED_WEIGHTS_KEY, "{}"))
    model.metadata_props[FOLDED_WEIGHTS_KEY] = json.dumps({**before, **folded}, sort_keys=True)


class FoldBatchNorm(InPlacePass):
    """:func:`fold_batch_norm`, recording how each folded weight was computed in the model's metadata."""

    def call(self, model: ir.Model) -> PassResult:
        folded = fold_batch_norm(model)
        if folded:
            _record_folded(model, folded)
        return PassResult(model, bool(folded))


class FoldWeightTransposes(InPlacePass):
    """:func:`fold_weight_transposes` of ``weights``, recording each in the model's metadata."""

    def __init__(self, weights: frozenset[str]) -> None:
        self.weights = weights

    def call(self, model: ir.Model) -> PassResult:
        folded = fold_weight_transposes(model, self.weights)
        if folded:
            _record_folded(model, folded)
        return PassResult(model, bool(folded))


def _residual(a: ir.Value | None, b: ir.Value | None) -> bool:
    """Whether ``a + b`` adds two tensors of one shape, neither a weight (a residual), not a bias: ONNX
    Runtime folds a bias ``Add`` into the MatMul before it, which a ``Sum`` would stop."""
    if a is None or b is None or a.shape is None or a.shape != b.shape or len(a.shape) < 2:
        return False
    return all(v.const_value is None and not v.is_initializer() for v in (a, b))


class ResidualSums(InPlacePass):
    """A residual ``Add`` read only by a LayerNormalization, as its input, becomes ``Sum``: the same
    addition, standard since ai.onnx 8. ONNX Runtime fuses ``Add`` + ``LayerNormalization`` into its
    SkipLayerNormalization when it loads a model, and on its CPU build that kernel is slower than the
    two it replaces (a BERT-base-width encoder ran 8% slower fused); it leaves a ``Sum`` be. Run after
    the packs' rewrites, so a pack's own fusion of the pair still sees the ``Add``."""

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        for owner in all_graphs(model):
            for node in ir.traversal.RecursiveGraphIterator(owner):
                if node.op_type != "Add" or node.domain or node.outputs[0].is_graph_output():
                    continue
                uses = list(node.outputs[0].uses())
                if len(uses) != 1 or uses[0].idx != 0:
                    continue
                user = uses[0].node
                if user.op_type == "LayerNormalization" and not user.domain and _residual(*node.inputs):
                    node.op_type = "Sum"
                    modified = True
        return PassResult(model, modified)


class DistinctDrawsCSE(InPlacePass):
    """onnx_ir's common subexpression elimination, random nodes kept apart (:func:`_distinct_draws`)."""

    def call(self, model: ir.Model) -> PassResult:
        with _distinct_draws(model.graph):  # the pass works on the main graph only
            return common_passes.CommonSubexpressionEliminationPass()(model)


MAX_SWEEPS = 4
"""How often the exact rewrites sweep the graph at most: one rewrite can expose another
(a Transpose pair cancelled leaves a Reshape pair), until none fires."""


def fold_constants(weights: frozenset[str]) -> PassBase:
    """onnxscript's constant folding, never of a node reading one of ``weights`` (or a random
    node, or a :func:`_protective_reshape`)."""

    def should_fold(node: ir.Node) -> bool | None:
        if is_random(node) or any(value is not None and value.name in weights for value in node.inputs):
            return False
        if _protective_reshape(node):
            return False
        return None

    return _constant_folding.FoldConstantsPass(
        shape_inference=False,
        input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
        should_fold=should_fold,
    )


def lean_passes(weights: frozenset[str], *, fold_weights: bool = True) -> list[PassBase]:
    """The lean pass's steps, in order (see the module docstring).

    ``weights``: names of the initializers that are the model's weights, never folded.
    ``fold_weights``: fold batch norm into the layer before it, recording in the model's
    metadata (:data:`FOLDED_WEIGHTS_KEY`) how each folded weight was computed; ``False``
    keeps every weight exactly as the ``state_dict`` has it. Two outputs that turn out to
    compute the same value may end up as one value; the output binding gives each output
    its own afterwards."""
    passes: list[PassBase] = [fold_constants(weights)]
    if fold_weights:
        passes.append(FoldBatchNorm())
    sweeps = Pipeline(
        "exact rewrites", [Rules("exact rewrites", RULES), common_passes.IdentityEliminationPass()], steps=MAX_SWEEPS
    )
    passes += [
        sweeps,
        DropNoOpMasks(weights),
        common_passes.RemoveUnusedNodesPass(),
        DropAbsOfSizes(),
        DistinctDrawsCSE(),
        common_passes.IdentityEliminationPass(),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
    ]
    return passes


def lean(model: ir.Model, weights: frozenset[str] | None = None, *, fold_weights: bool = True) -> None:
    """Run :func:`lean_passes` on ``model`` in place (``weights``: default every initializer)."""
    weights = frozenset(model.graph.initializers) if weights is None else weights
    Pipeline("lean", lean_passes(weights, fold_weights=fold_weights))(model)
