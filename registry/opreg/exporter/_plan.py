"""Planning: what each node is, its impl, and how its arguments map onto the impl's parameters.

Planning sees every node, in the main graph and in every subgraph of a
higher-order op, before anything is translated: what fails is collected, so
one :class:`UnsupportedOpsError` lists every missing op with where it is.
Each node is classified and resolved once, here; translation reads the
:class:`Plan`. When the captured graph translates as it is, torch's
decomposition is skipped (:func:`prepare`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from opreg.errors import ExportError, OpsetConflictError, UnsupportedOpsError
from opreg.exporter import _decompose, _nodes, _views
from opreg.registry._inspect import (
    TORCH_ONNX,
    ArgumentsNotCovered,
    check_signature,
    map_arguments,
    read_params,
    torch_convention,
    torch_schema,
)
from opreg.registry.explanation import Widening
from opreg.registry.impls import Impl
from opreg.registry.opname import OpName
from opreg.registry.registry import Registry
from opreg.registry.targets import Target, VersionRange
from opreg.values import has_complex

logger = logging.getLogger(__name__)


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
class Step:
    """What translation does with one ``call_function`` node, decided once, here.

    Fields:
        kind: what the node is (:class:`opreg.exporter._nodes.Kind`).
        call: for an ``OP`` or ``INPLACE`` node, how it calls its impl.
    """

    kind: _nodes.Kind
    call: Call | None = None


@dataclasses.dataclass(frozen=True)
class JoinedDomain:
    """A custom domain an export added to its target: a model used ops only a pack's impls in that
    domain cover, and the target did not name it (see :func:`prepare`).

    Fields:
        domain: the custom ONNX domain.
        version: the version added: the one its pack declares (:meth:`opreg.Registry.declared_version`).
        packs: the packs whose impls need it.
        ops: the torch ops that needed it.
        requested: the target the export was given, as :class:`opreg.Target` prints it.
        spec: the target with every domain added, as ``-t`` takes it (``onnxruntime,swishlib=1``).
    """

    domain: str
    version: int
    packs: tuple[str, ...]
    ops: tuple[str, ...]
    requested: str = ""
    spec: str = ""

    def __str__(self) -> str:
        return f"{self.domain}={self.version} (pack {', '.join(self.packs)}: {', '.join(self.ops)})"

    @property
    def note(self) -> str:
        """The one line that says so (logged by the export, printed by ``opreg export``)."""
        return (
            f"target {self.requested} names no {self.domain}, which only pack {', '.join(self.packs)} covers "
            f"{', '.join(self.ops)} in: added {self.domain}={self.version}, the version the pack declares "
            f"(-t {self.spec} says so)"
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every ``call_function`` node's :class:`Step`, in the main graph and in every subgraph.

    Fields:
        steps: each node's step.
        target: the target the plan is for: the export's, with any :class:`JoinedDomain` added.
        joined: the custom domains the plan added to the export's target.
    """

    steps: dict[torch.fx.Node, Step]
    target: Target | None = None
    joined: tuple[JoinedDomain, ...] = ()

    @property
    def calls(self) -> dict[torch.fx.Node, Call]:
        """The :class:`Call` of every op node."""
        return {node: step.call for node, step in self.steps.items() if step.call is not None}


class _NotCovered(Exception):
    pass


_Missing = dict[str, list[tuple[torch.fx.Node, str, str, "torch.fx.Node | None"]]]


@dataclasses.dataclass
class _Survey:
    """One pass over a graph: each node's step, what is missing, and whether torch's
    decomposition must run first."""

    steps: dict[torch.fx.Node, Step] = dataclasses.field(default_factory=dict)
    missing: _Missing = dataclasses.field(default_factory=dict)
    needs_decomposition: list[str] = dataclasses.field(default_factory=list)
    """Why torch's decomposition must run although every op may have an impl."""
    rejected: set[OpName] = dataclasses.field(default_factory=set)
    """Ops with impls at the target that refuse a node (predicates, or a call they cannot take):
    torch's table decomposes those where it can (a ``chunk`` of a dynamic size, an ``einsum`` of half floats)."""


def prepare(
    program: torch.export.ExportedProgram, registry: Registry, target: Target
) -> tuple[torch.export.ExportedProgram, Plan]:
    """The program to translate and its plan: ``program`` itself when every node translates as
    captured (each node classified and resolved once, here), else ``program`` decomposed for
    ``target`` (:func:`opreg.exporter._decompose.decompose`) and planned.

    An op no impl covers at ``target`` but one whose requirement names custom domains the target
    does not name (a pack's own domain) gets them: they join the target at the versions their packs
    declare (:meth:`opreg.Registry.widen`), before anything is decomposed, and the plan's ``target``
    and ``joined`` say so (logged, one line per domain). Raises :class:`UnsupportedOpsError` with
    every op that still has no impl, and :class:`OpsetConflictError` with the ``-t`` to use when a
    domain cannot join at its declared version."""
    _refuse_uncarried(program)
    if _views.functionalize(program.graph):  # in-place updates of views, made functional without a retrace
        program.graph_module.recompile()
    joined: tuple[JoinedDomain, ...] = ()
    survey = _survey(program, registry, target)
    if survey.missing:
        target, joined = _join(survey.missing, registry, target)
        if joined:
            survey = _survey(program, registry, target)
    if survey.needs_decomposition or survey.missing:
        reasons = [*survey.needs_decomposition, *survey.missing]
        program = _decompose.decompose(program, registry, target, reasons, rejected=survey.rejected)
        survey = _survey(program, registry, target)
    if survey.missing:
        raise _unsupported(survey.missing, registry, target)
    for domain in joined:
        logger.warning("%s", domain.note)
    return program, Plan(survey.steps, target, joined)


UNCARRIED: dict[torch.dtype, str] = {
    torch.float4_e2m1fn_x2: (
        "float4_e2m1fn_x2 packs two FP4 (E2M1) values in each byte, the first in the low four bits, so a "
        "(..., n) tensor of it is ONNX's FLOAT4E2M1 (..., 2n) with the same bytes; but ONNX Runtime's CPU "
        "provider has no kernel for FLOAT4E2M1 (not even Identity or Cast), so opreg does not export it. "
        "Pass and return the packed bytes as uint8 (x.view(torch.uint8)), unpacking them in the model, "
        "or quantize to a float8 type (float8_e4m3fn, float8_e5m2), which export and run"
    ),
}
"""dtypes opreg refuses before planning, with why and what to do instead."""


def _refuse_uncarried(program: torch.export.ExportedProgram) -> None:
    """An :class:`ExportError` naming the first value of a dtype in :data:`UNCARRIED` (an input, a
    weight or a node's result, in any graph of the program), before anything is planned."""
    signature = program.graph_signature
    weights = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            value = node.meta.get("val")
            for tensor in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(tensor, torch.Tensor) and tensor.dtype in UNCARRIED:
                    if node.op == "call_function":
                        what = f"node {node.name} ({_nodes.where(node)})"
                    else:
                        what = f"weight {weights[node.name]!r}" if node.name in weights else f"input {node.name!r}"
                    raise ExportError(f"{what} is {tensor.dtype}: {UNCARRIED[tensor.dtype]}")


def _join(missing: _Missing, registry: Registry, target: Target) -> tuple[Target, tuple[JoinedDomain, ...]]:
    """The target with the custom domains the ``missing`` ops' impls need (:meth:`opreg.Registry.widen`),
    and what was added; ``target`` as it is when no op is served that way. Raises
    :class:`OpsetConflictError` when a domain cannot join at the version its pack declares."""
    widenings = []
    for name, nodes in missing.items():
        if "::" not in name:
            continue
        widening = registry.widen(name, target, nodes[0][0])
        if widening is not None and all(widening.impl.accepts(node) for node, *_ in nodes):
            widenings.append(widening)
    if not widenings:
        return target, ()
    added: dict[str, int] = {}
    for widening in widenings:
        for domain, version in widening.declared:
            added[domain] = max(added.get(domain, version), version)
    joined = target.extended(added)
    refused = [w for w in widenings if not w.exact or registry.unmet(w.impl, joined) is not None]
    if refused:
        raise OpsetConflictError(_no_join(refused, widenings, registry, target))
    entries = []
    for domain, version in sorted(added.items()):
        users = [w for w in widenings if domain in dict(w.declared)]
        packs = tuple(dict.fromkeys(w.impl.pack for w in users))
        ops = tuple(str(w.op) for w in users)
        entries.append(JoinedDomain(domain, version, packs, ops, str(target), joined.spec))
    return joined, tuple(entries)


def _no_join(refused: list[Widening], widenings: list[Widening], registry: Registry, target: Target) -> str:
    """Why the domains cannot join, and the ``-t`` to use: each domain at a version every impl that
    needs it accepts, if there is one."""
    ranges: dict[str, list[VersionRange]] = {}
    for widening in widenings:
        for domain, wanted in widening.impl.requirement.domains:
            if target.get(domain) is None:
                ranges.setdefault(domain, []).append(wanted)
    fix: dict[str, int] = {}
    for domain, wanted in ranges.items():
        low = max(r.min for r in wanted)
        if all(low in r for r in wanted):
            fix[domain] = low
    problems = "; ".join(
        f"{w.op} needs {', '.join(f'{d}{r}' for d, r in w.impl.requirement.domains)} ({w.impl.label}), "
        f"and its pack declares {', '.join(f'{d}={v}' for d, v in w.declared)}"
        for w in refused
    )
    lead = (
        f"the target {target} does not name the custom domains these ops need, and they cannot join it at "
        f"the versions their packs declare: {problems}"
    )
    if len(fix) == len(ranges):
        fixed = target.extended(fix)
        if all(registry.unmet(w.impl, fixed) is None for w in widenings):
            return f"{lead}. Export with -t {fixed.spec}"
    each = ", ".join(f"-t {w.target.spec} for {w.op}" for w in widenings)
    return f"{lead}. No one version serves them all: export the models apart ({each})"


def plan(graph: torch.fx.Graph, registry: Registry, target: Target) -> Plan:
    """Resolve every node's impl and map its arguments; raise with every missing op."""
    survey = _Survey()
    _plan_graph(graph, registry, target, survey, "", None)
    if survey.missing:
        raise _unsupported(survey.missing, registry, target)
    return Plan(survey.steps)


def _survey(program: torch.export.ExportedProgram, registry: Registry, target: Target) -> _Survey:
    survey = _Survey()
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:  # the decomposition makes it functional
        survey.needs_decomposition.append("a mutated input or buffer")
    _plan_graph(program.graph, registry, target, survey, "", None)
    return survey


def _plan_graph(
    graph: torch.fx.Graph,
    registry: Registry,
    target: Target,
    survey: _Survey,
    context: str,
    outer: torch.fx.Node | None,
) -> None:
    missing = survey.missing
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        kind = _nodes.classify(node)
        survey.steps[node] = Step(kind)
        if kind is _nodes.Kind.UNSUPPORTED:
            name = getattr(node.target, "__name__", str(node.target))
            if node.target is _nodes.WITH_EFFECTS:
                name = f"with_effects({node.args[1]})"
            elif isinstance(node.target, torch._ops.OpOverload):
                name = str(OpName.of(node.target))
            missing.setdefault(name, []).append((node, _nodes.unsupported_reason(node), context, outer))
        elif kind is _nodes.Kind.HOP:
            hop = _nodes.HOPS[node.target]
            if hop.needs_decomposition is not None and hop.needs_decomposition(node):
                survey.needs_decomposition.append(hop.name)
            for role, module in _nodes.subgraphs(node):
                inner = f"in the {role} of {hop.name} ({node.name})"
                where = f"{inner}, {context}" if context else inner
                _plan_graph(module.graph, registry, target, survey, where, outer or node)
        elif kind in (_nodes.Kind.OP, _nodes.Kind.INPLACE):
            op = _nodes.torch_op(node, kind)
            impl = registry.resolve(op, target, node)
            if impl is None:
                reason = NO_PACK
                candidates = registry.candidates(op, target)
                if candidates:
                    reason = "Its impls' predicates reject these nodes."
                    survey.rejected.add(op)
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
                survey.steps[node] = Step(kind, plan_call(node, impl))
            except _NotCovered as e:
                why = f"{impl.label} cannot take the call: {e}"
                survey.rejected.add(op)
                missing.setdefault(str(op), []).append((node, why, context, outer))


def _unsupported(found: _Missing, registry: Registry, target: Target) -> UnsupportedOpsError:
    entries = []
    for name, nodes in sorted(found.items()):
        locations = list(dict.fromkeys(_nodes.where(n, context, outer) for n, _, context, outer in nodes))
        shown = tuple(locations[:3]) + ((f"and {len(locations) - 3} more places",) if len(locations) > 3 else ())
        elsewhere: tuple[str, ...] = ()
        if "::" in name:
            elsewhere = tuple(
                f"{i.label} ({i.requirement})" for i in registry.impls(name) if registry.unmet(i, target) is not None
            )
        reason = nodes[0][1]
        if reason == NO_PACK and "::" in name:
            reason = _left_out(registry, name) or reason
        entries.append(MissingOp(name, len(nodes), shown, reason, elsewhere))
    lines = [f"{len(entries)} op(s) in the model have no impl for target {target}:"]
    lines += [f"  - {e}" for e in entries]
    lines.append(
        "Install a pack that implements them, choose a target one covers (see `opreg explain OP`), "
        "or register your own impl on a registry copy and pass it as registry=."
    )
    return UnsupportedOpsError("\n".join(lines), tuple(entries))


NO_PACK = "No installed pack implements it for this target."
"""Why an op has no impl, when no other reason is known."""


def _left_out(registry: Registry, op: str) -> str | None:
    """What to say of ``op`` when an installed pack that implements it was left out of the export (``-p
    no:PACK``, ``exclude=``, autoload off), or ``None``. Asks what each left-out pack declares (the pack
    cache's, else loading it): on the error path only."""
    from opreg.errors import OpregError
    from opreg.packs import plugins

    for report in getattr(registry, "packs", ()):
        if report.status != plugins.DISABLED:
            continue
        try:
            theirs = plugins.declared_registry([report.name])
        except OpregError:
            continue
        if any(i.pack == report.name for i in theirs.impls(op)):
            return (
                f"Installed pack {report.name!r} implements it, but this export leaves it out: {report.reason}; "
                f"include it (drop -p no:{report.name} or exclude=, or request it with -p {report.name})."
            )
    return None


_LATE_CHECKED: set[tuple[Any, OpName]] = set()
"""The impls (function, op) checked against their op's schema when first planned (see :func:`check_late`)."""


def check_late(impl: Impl) -> None:
    """Check ``impl``'s signature against its op's schema if its registration could not: the op's
    library was not loaded yet (a pack need not import torch's ``quantized_decomposed`` or
    ``torch.onnx.ops`` just so its impls are checked; a model that uses the ops has loaded them).
    Raises :class:`~opreg.errors.SignatureMismatchError` naming the impl; once per impl."""
    key = (impl.function, impl.op)  # the function itself: an id may be reused once it is gone
    if impl.schema_checked or key in _LATE_CHECKED:
        return
    schema = torch_schema(impl.op)
    if schema is None:
        return
    params = impl.params if impl.params is not None else read_params(impl.function)
    check_signature(impl.op, impl.function, schema, params, torch_function=impl.convention == TORCH_ONNX)
    _LATE_CHECKED.add(key)


def plan_call(node: torch.fx.Node, impl: Impl) -> Call:
    """Map the node's arguments onto the impl's parameters (:func:`opreg.registry._inspect.map_arguments`);
    an impl written for torch.onnx gets them as torch.onnx passes them
    (:func:`opreg.registry._inspect.torch_convention`). An impl its registration could not check against
    the op's schema is checked first (:func:`check_late`)."""
    check_late(impl)
    try:
        args, kwargs, int_lists = map_arguments(node.target._schema, node.args, node.kwargs, impl.params)
    except ArgumentsNotCovered as e:
        raise _NotCovered(str(e)) from e
    if impl.convention == TORCH_ONNX:
        args, kwargs = torch_convention(args, kwargs)
    return Call(impl, tuple(args), {**kwargs, **impl.keywords}, frozenset(int_lists))
