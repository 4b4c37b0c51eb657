"""In-place updates of a view, made functional where the graph is captured (no retrace).

transformers' ``shift_tokens_right`` (BART's and mBART's classification and question-answering
heads) writes into slices of a tensor it has just made::

    shifted = input_ids.new_zeros(input_ids.shape)
    shifted[:, 1:] = input_ids[:, :-1].clone()       # copy_ into slice(slice(shifted))
    shifted[:, 0] = decoder_start_token_id            # fill_ into select(shifted)

torch.export keeps the ``copy_`` and ``fill_`` on the views. torch's decomposition makes such a
graph functional by retracing the whole of it (2 s of a 7 s export); :func:`functionalize` does
the same for these updates alone: the update's functional op on the view, then the view written
back into its base with ``slice_scatter`` / ``select_scatter``, and the reads of the base after the
update rebound to the result. An update it cannot prove safe is left for the decomposition.
"""

from __future__ import annotations

import operator

import torch

from opreg.exporter import _nodes

_ATEN = torch.ops.aten
SCATTERS = {_ATEN.slice.Tensor: _ATEN.slice_scatter.default, _ATEN.select.int: _ATEN.select_scatter.default}
"""The views whose writes are made functional, and the op that writes a view back into its base."""
_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node")
"""What a new node copies from the update it replaces: where it came from in the model."""


def functionalize(graph: torch.fx.Graph) -> bool:
    """Make each safe in-place update of a slice or select chain of a tensor the graph made
    functional (see the module docstring); whether any was."""
    changed = False
    for node in list(graph.nodes):
        chain = _view_chain(node)
        if chain is not None:
            _rewrite(graph, node, chain)
            changed = True
    if changed:
        graph.lint()
    return changed


def _view_chain(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The views (innermost first) an in-place ``node`` updates, down to a base tensor the graph
    made, when the update can be made functional; else ``None``."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    if not node.target._schema.is_mutable or _functional(node.target) is None:
        return None
    chain, value = [], node.args[0] if node.args else None
    while isinstance(value, torch.fx.Node) and value.target in SCATTERS:
        chain.append(value)
        value = value.args[0]
    if not chain or not isinstance(value, torch.fx.Node) or value.op != "call_function":
        return None
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    if value.target is operator.getitem or (_nodes.aliases(value) and not _made_anew(value, order)):
        return None  # the base is itself a view, an output of a multi-output op, or not the graph's own
    for view in chain:  # each view read only by the chain or the update, or before it
        if any(user is not node and user not in chain and order[user] > order[node] for user in view.users):
            return None
    for user in value.users:
        if user.op == "output":  # the graph's signature names the base as an output: it must stay
            return None
        taken_before = user not in chain and order[user] < order[node] and _nodes.views(user, value)
        if taken_before and any(order[u] > order[node] for u in user.users):
            return None  # another view of the base, taken before the update and read after it
    return chain


def _made_anew(value: torch.fx.Node, order: dict[torch.fx.Node, int]) -> bool:
    """Whether ``value`` is an in-place op's result that is translated as a new tensor
    (:func:`opreg.exporter._nodes.functional_form`) and that its other name, the op's first
    argument, is not read after: mBART masks a clone of the ids in place before shifting it."""
    if _nodes.functional_form(value) is None:
        return False
    return all(order[user] <= order[value] for user in value.args[0].users)


def _functional(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional op of ``target`` (:func:`opreg.exporter._nodes.functional_op`), as torch's op."""
    name = _nodes.functional_op(target)
    return None if name is None else getattr(getattr(getattr(torch.ops, name.namespace), name.name), name.overload)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, chain: list[torch.fx.Node]) -> None:
    functional = _functional(node.target)
    base = chain[-1].args[0]
    order = {n: i for i, n in enumerate(graph.nodes)}
    later = [user for user in base.users if order[user] > order[node]]
    with graph.inserting_after(node):
        updated = graph.call_function(functional, (chain[0], *node.args[1:]), dict(node.kwargs))
    _copy_meta(node, updated, chain[0])
    value, last = updated, updated
    for view in chain:
        with graph.inserting_after(last):
            value = graph.call_function(SCATTERS[view.target], (view.args[0], value, *view.args[1:]), {})
        _copy_meta(node, value, view.args[0])
        last = value
    node.replace_all_uses_with(updated)
    for user in later:
        user.replace_input_with(base, value)
    graph.erase_node(node)


def _copy_meta(update: torch.fx.Node, new: torch.fx.Node, like: torch.fx.Node) -> None:
    """``new`` gets ``like``'s value (the same shape and dtype) and ``update``'s provenance."""
    new.meta["val"] = like.meta.get("val")
    for key in _META:
        if key in update.meta:
            new.meta[key] = update.meta[key]
