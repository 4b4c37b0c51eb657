"""Planning: every node's impl, and how its arguments map onto the impl's parameters.

Planning sees every node, in the main graph and in every subgraph of a
higher-order op, before anything is translated: what fails is collected, so
one :class:`UnsupportedOpsError` lists every missing op with where it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from opreg._inspect import TORCH_ONNX, ArgumentsNotCovered, map_arguments, torch_convention
from opreg.errors import UnsupportedOpsError
from opreg.exporter import _nodes
from opreg.opname import OpName
from opreg.registry import Impl, Registry
from opreg.targets import Target
from opreg.values import has_complex


@dataclasses.dataclass(frozen=True)
class MissingOp:
    """One op an export cannot translate.

    Fields:
        op: the torch op (``aten::foo.default``) or the FX target's name.
        count: how many nodes use it.
        locations: where (module path, source line, subgraph), first few.
        reason: why it is not covered.
        elsewhere: ``pack:function (requirement)`` of installed impls that
            would cover it under another target.
    """

    op: str
    count: int
    locations: tuple[str, ...]
    reason: str
    elsewhere: tuple[str, ...] = ()

    def __str__(self) -> str:
        plural = "s" if self.count != 1 else ""
        text = f"{self.op}: {self.count} node{plural}, at {'; '.join(self.locations)}. {self.reason}"
        if self.elsewhere:
            text += f" Covered under another target by {', '.join(self.elsewhere)}."
        return text


@dataclasses.dataclass(frozen=True)
class Call:
    """How one node calls its impl: the arguments, still holding FX nodes.

    Fields:
        impl: the impl the registry resolved.
        args, kwargs: the node's arguments mapped onto the impl's parameters.
        int_lists: positions of ``args`` (and names of ``kwargs``) that are
            lists of ints, which become one INT64 tensor when a size in them
            is symbolic.
    """

    impl: Impl
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    int_lists: frozenset[int | str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every node's :class:`Call`, in the main graph and in every subgraph."""

    calls: dict[torch.fx.Node, Call]


class _NotCovered(Exception):
    pass


def plan(graph: torch.fx.Graph, registry: Registry, target: Target) -> Plan:
    """Resolve every node's impl and map its arguments; raise with every missing op."""
    calls: dict[torch.fx.Node, Call] = {}
    missing: dict[str, list[tuple[torch.fx.Node, str, str, torch.fx.Node | None]]] = {}
    _plan_graph(graph, registry, target, calls, missing, "", None)
    if missing:
        raise _unsupported(missing, registry, target)
    return Plan(calls)


def _plan_graph(
    graph: torch.fx.Graph,
    registry: Registry,
    target: Target,
    calls: dict[torch.fx.Node, Call],
    missing: dict[str, list[tuple[torch.fx.Node, str, str, torch.fx.Node | None]]],
    context: str,
    outer: torch.fx.Node | None,
) -> None:
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        kind = _nodes.classify(node)
        if kind is _nodes.Kind.UNSUPPORTED:
            name = getattr(node.target, "__name__", str(node.target))
            if node.target is _nodes.WITH_EFFECTS:
                name = f"with_effects({node.args[1]})"
            elif isinstance(node.target, torch._ops.OpOverload):
                name = str(OpName.of(node.target))
            missing.setdefault(name, []).append((node, _nodes.unsupported_reason(node), context, outer))
        elif kind is _nodes.Kind.HOP:
            hop = _nodes.HOPS[node.target]
            for role, module in _nodes.subgraphs(node):
                inner = f"in the {role} of {hop.name} ({node.name})"
                where = f"{inner}, {context}" if context else inner
                _plan_graph(module.graph, registry, target, calls, missing, where, outer or node)
        elif kind in (_nodes.Kind.OP, _nodes.Kind.INPLACE):
            op = _nodes.torch_op(node)
            impl = registry.resolve(op, target, node)
            if impl is None:
                reason = "No installed pack implements it for this target."
                candidates = registry.candidates(op, target)
                if candidates:
                    reason = "Its impls' predicates reject these nodes."
                if has_complex(node) and not any(i.complex for i in candidates):
                    reason = (
                        "The node has complex values, which travel as real tensors with a trailing dimension "
                        "of 2, and no installed impl is registered for them (complex=True)."
                    )
                for pack, why in registry.unsupported(op).values():
                    reason = f"Unsupported ({pack}): {why}"
                missing.setdefault(str(op), []).append((node, reason, context, outer))
                continue
            try:
                calls[node] = plan_call(node, impl)
            except _NotCovered as e:
                why = f"{impl.label} cannot take the call: {e}"
                missing.setdefault(str(op), []).append((node, why, context, outer))


def _unsupported(
    found: dict[str, list[tuple[torch.fx.Node, str, str, torch.fx.Node | None]]], registry: Registry, target: Target
) -> UnsupportedOpsError:
    entries = []
    for name, nodes in sorted(found.items()):
        locations = list(dict.fromkeys(_nodes.where(n, context, outer) for n, _, context, outer in nodes))
        shown = tuple(locations[:3]) + ((f"and {len(locations) - 3} more places",) if len(locations) > 3 else ())
        elsewhere: tuple[str, ...] = ()
        if "::" in name:
            elsewhere = tuple(
                f"{i.label} ({i.requirement})" for i in registry.impls(name) if target.unmet(i.requirement) is not None
            )
        entries.append(MissingOp(name, len(nodes), shown, nodes[0][1], elsewhere))
    lines = [f"{len(entries)} op(s) in the model have no impl for target {target}:"]
    lines += [f"  - {e}" for e in entries]
    lines.append(
        "Install a pack that implements them, choose a target one covers (see `opreg explain OP`), "
        "or register your own impl on a registry copy and pass it as registry=."
    )
    return UnsupportedOpsError("\n".join(lines), tuple(entries))


def plan_call(node: torch.fx.Node, impl: Impl) -> Call:
    """Map the node's arguments onto the impl's parameters (:func:`opreg._inspect.map_arguments`);
    an impl written for torch.onnx gets them as torch.onnx passes them
    (:func:`opreg._inspect.torch_convention`)."""
    try:
        args, kwargs, int_lists = map_arguments(node.target._schema, node.args, node.kwargs, impl.params)
    except ArgumentsNotCovered as e:
        raise _NotCovered(str(e)) from e
    if impl.convention == TORCH_ONNX:
        args, kwargs = torch_convention(args, kwargs)
    return Call(impl, tuple(args), {**kwargs, **impl.keywords}, frozenset(int_lists))
