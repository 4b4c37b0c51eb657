"""Making the translated graph lean: what impls emit one node at a time leaves
work a whole-graph view removes.

- Constant folding (onnxscript's), except of nodes that read the model's
  weights: folding ``Transpose(weight)`` would replace a ``state_dict``
  tensor by an anonymous copy, and users look weights up by name.
- A few exact rewrites: no-op Cast/Expand/Transpose, Cast of Cast,
  Reshape of Reshape, Unsqueeze of Unsqueeze, and ``Unsqueeze(Squeeze(x))``
  on a one-element 1-D ``x``, which symbolic sizes produce (``sym_size``
  gives a scalar; ``view``'s shape list wants it back as ``[n]``).
- Common subexpressions computed once (``Shape`` of the same input, ...).
- Constants become initializers, as torch.onnx's graphs have them.

Random nodes (``_recorder.RANDOM_OPS``) are never folded nor merged: two draws are
two draws, even when they have the same inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import onnx_ir as ir
from onnx_ir.passes import common as common_passes
from onnxscript import optimizer, rewriter
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules import common as rules

from opreg.exporter._recorder import is_random


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

RULES = (
    rules.no_op_cast_rule,
    rules.no_op_expand_rule,
    rules.no_op_transpose_rule,
    rules.cast_cast_rule,
    rules.reshape_reshape_rule,
    rules.unsqueeze_unsqueeze_rule,
    _SQUEEZE_UNSQUEEZE,
)


_RULE_SET = pattern.RewriteRuleSet(list(RULES))

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


def lean(model: ir.Model) -> None:
    """Fold, rewrite and deduplicate ``model`` in place (see the module docstring).

    Two outputs that turn out to compute the same value may end up as one value;
    :func:`opreg.exporter._finish.bind_outputs` gives each output its own afterwards."""
    weights = frozenset(model.graph.initializers)

    def should_fold(node: ir.Node) -> bool | None:
        if is_random(node) or any(value is not None and value.name in weights for value in node.inputs):
            return False
        return None

    optimizer.fold_constants(model, onnx_shape_inference=False, should_fold=should_fold)
    rewriter.RewritePass(_RULE_SET)(model)  # without rewrite()'s own clean-up passes: the ones below do it once
    with _distinct_draws(model.graph):  # the pass works on the main graph only
        common_passes.CommonSubexpressionEliminationPass()(model)
    common_passes.IdentityEliminationPass()(model)
    common_passes.RemoveUnusedNodesPass()(model)
    common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
