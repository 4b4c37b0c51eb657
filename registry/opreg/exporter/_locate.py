"""Where an export goes wrong: every intermediate value compared with eager PyTorch.

Translation records, for each FX node of the main graph, the ONNX values it became
(:class:`Trace`). :func:`locate` runs the decomposed ``ExportedProgram`` once in eager
PyTorch (an ``fx.Interpreter`` keeping every value) and the model once with those
values exposed as extra outputs, and compares each pair in the tolerance's terms
(``|onnx - eager| / (atol + rtol * |eager|)``: above 1 is out of tolerance).

Each out-of-tolerance node is then *replayed*: its torch op (and the FX nodes between
it and the nearest compared values, e.g. what a rewrite fused away) runs in eager on
the ONNX model's own inputs to it. A node whose ONNX output differs from that replay
computes another function than torch: its impl (or the rewrite rule that made its
nodes) is at fault. A node that agrees with its replay only carries error it was
given: float drift. The report also names the first divergences (nodes whose inputs
agree and outputs do not) and the path along which the error grew.

What is compared: the main graph's values. The bodies of ``If``, ``Loop`` and ``Scan``
are compared at the control-flow node's outputs (ONNX Runtime cannot expose a value of
a subgraph); a control-flow node at fault is looked inside: its body, exported alone with
the same registry and target, is located on the inputs of its first call.
Random ops and every value computed from them are left out, with a note: they match
eager only in distribution. Complex values are compared as the real pairs the model
carries (``torch.view_as_real``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from torch.export.graph_signature import InputKind

from opreg.exporter import _nodes
from opreg.exporter._capture import TRACING_LOCK
from opreg.exporter._rewrite import JOIN

GROWTH_SHARE = 0.5
"""A step of the error's path that adds at least this share of the final error is where it 'grew most'
as a single jump; drift spreads its growth over many steps."""
DTYPE_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
"""The least ``(rtol, atol)`` a half-precision value is held to (``torch.testing``'s defaults)."""
REPLAY_TOLERANCES = {**DTYPE_TOLERANCES, torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}
"""The least ``(rtol, atol)`` a node's value is held to against its replay (``torch.testing``'s
defaults): two correct kernels of one op round differently, so below these a node is not called
wrong, whatever tolerance the values themselves are compared with (``rtol=atol=0`` included)."""


@dataclasses.dataclass
class Trace:
    """What translation made of one FX node of the main graph.

    Fields:
        values: the ONNX value of each of the node's outputs (``None`` where it has none).
        names: their names when translation ended (a pass may replace a value by another
            of the same name).
        impl: the impl that translated it (``None`` for control flow, made by the exporter).
    """

    values: tuple[ir.Value | None, ...]
    names: tuple[str | None, ...] = ()
    impl: Any = None

    def snapshot(self) -> None:
        self.names = tuple(v.name if v is not None else None for v in self.values)


def trace_of(result: Any, impl: Any) -> Trace:
    """The :class:`Trace` of an FX node whose translated value is ``result`` (a value or a tuple)."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return Trace(tuple(v if isinstance(v, ir.Value) else None for v in items), impl=impl)


# -- reading provenance -------------------------------------------------------------------


def provenance(node: ir.Node) -> dict[str, str]:
    """The provenance of an ONNX node (torch op, pack, impl, module, source, rewrite), whatever
    form the model stores it in: the one accessor the locator reads it through."""
    props = node.metadata_props
    keys = (*_nodes.PROVENANCE_KEYS, _nodes.REWRITE_KEY)
    return {key.removeprefix("opreg."): props[key] for key in keys if props.get(key)}


# -- the report ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Error:
    """How one value differs from eager PyTorch.

    Fields:
        ratio: the largest ``|onnx - eager| / (atol + rtol * |eager|)``; above 1 is out
            of tolerance (``inf`` for a wrong shape or dtype, or a NaN eager lacks).
        max_abs / max_rel: the largest absolute and relative differences.
        bad: how many elements are out of tolerance, of ``count``.
        detail: a wrong shape or dtype, in words ("" otherwise).
    """

    ratio: float
    max_abs: float = 0.0
    max_rel: float = 0.0
    bad: int = 0
    count: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def __str__(self) -> str:
        if self.detail:
            return self.detail
        return (
            f"{_times(self.ratio)} the tolerance ({self.bad} of {self.count} elements out; "
            f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g})"
        )


def _times(ratio: float) -> str:
    return "inf x" if math.isinf(ratio) else f"{ratio:.3g} x"


@dataclasses.dataclass(frozen=True)
class Divergence:
    """One FX node whose ONNX value is out of tolerance, and what made it.

    Fields:
        node: the FX node's name (also the ONNX value's, unless a pass renamed it).
        value: the ONNX value compared.
        torch_op: the torch op (``cond``, ``scan``, ... for control flow).
        pack / impl: the pack and the impl's label (``pack:function``) that translated it.
        impl_source: ``file:line`` of the impl's function.
        rules: the rewrite rules (``pack:rule``) that made ONNX nodes between the node's
            compared inputs and its value.
        onnx_ops: the ONNX ops between them (control flow: with its body's ops).
        body_impls: for control flow, the impls its body used.
        inner: for control flow at fault, the :class:`Location` inside its body: the body
            exported on its own (with the same registry and target) and located on the
            inputs of its first call (the branch taken, the first iteration).
        module / source: the model's module path and source line that made the node.
        error: its value against eager.
        local: its value against its torch op replayed on the ONNX model's own inputs to it
            (``None`` when it could not be replayed); out of tolerance: the node is at fault.
        first: its compared inputs agree with eager (the earliest divergences).
    """

    node: str
    value: str
    torch_op: str
    pack: str
    impl: str
    impl_source: str
    rules: tuple[str, ...]
    onnx_ops: tuple[str, ...]
    body_impls: tuple[str, ...]
    module: str
    source: str
    error: Error
    local: Error | None
    first: bool
    inner: Location | None = None

    @property
    def faulty(self) -> bool:
        """The node computes another function than its torch op on the same inputs."""
        return self.local is not None and not self.local.ok

    @property
    def suspect(self) -> str:
        """What to fix: the rewrite rules that made its nodes, else (control flow) what is wrong
        inside its body, else its impl."""
        if self.rules:
            return JOIN.join(self.rules)
        if self.inner is not None and self.inner.suspects:
            return JOIN.join(self.inner.suspects)
        return self.impl

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["error"] = dataclasses.asdict(self.error)
        data["local"] = dataclasses.asdict(self.local) if self.local is not None else None
        data["inner"] = self.inner.to_dict() if self.inner is not None else None
        data["faulty"], data["suspect"] = self.faulty, self.suspect
        return _finite(data)


@dataclasses.dataclass(frozen=True)
class Step:
    """One compared node on the error's path to an output: its error, and how much it added."""

    node: str
    torch_op: str
    impl: str
    ratio: float
    added: float


@dataclasses.dataclass(frozen=True)
class Location:
    """The result of :meth:`OnnxProgram.locate`.

    Fields:
        runtime / rtol / atol: what the values were compared with.
        compared: how many FX nodes' values were compared.
        divergences: every node out of tolerance, in graph order.
        path: from the input to the output with the largest error, the compared nodes
            the error travelled through (each with what it added, in tolerance units).
        notes: what was not compared, and why.
    """

    runtime: str
    rtol: float
    atol: float
    compared: int
    divergences: tuple[Divergence, ...]
    path: tuple[Step, ...]
    notes: tuple[str, ...] = ()

    @property
    def first(self) -> tuple[Divergence, ...]:
        """The earliest divergences: nodes whose compared inputs agree and whose outputs do not."""
        return tuple(d for d in self.divergences if d.first)

    @property
    def culprits(self) -> tuple[Divergence, ...]:
        """The nodes that compute another function than torch on the same inputs."""
        return tuple(d for d in self.divergences if d.faulty)

    @property
    def suspects(self) -> tuple[str, ...]:
        """The impls (``pack:function``) and rewrite rules (``pack:rule``) at fault, in graph order."""
        seen: list[str] = []
        for d in self.culprits:
            if d.suspect not in seen:
                seen.append(d.suspect)
        return tuple(seen)

    @property
    def verdict(self) -> str:
        """``fault`` (a node is wrong), ``drift`` (values drift out of tolerance, no node is wrong) or ``ok``."""
        if self.culprits:
            return "fault"
        return "drift" if self.divergences else "ok"

    @property
    def grew_most(self) -> Step | None:
        """The step of :attr:`path` that added the most error."""
        return max(self.path, key=lambda s: s.added, default=None)

    def summary(self) -> str:
        """What the report says, in a few lines."""
        tol = f"rtol={self.rtol:g}, atol={self.atol:g}"
        if self.compared == 0:
            return "\n".join(["no intermediate value could be compared with eager PyTorch", *self.notes])
        if self.verdict == "ok":
            return "\n".join(
                [f"every one of {self.compared} intermediate values matches eager PyTorch ({self.runtime}, {tol})",
                 *self.notes]
            )  # fmt: skip
        lines = []
        if self.culprits:
            for d in self.culprits:
                if d.inner is not None and d.inner.culprits:
                    inner = "\n  ".join(d.inner.summary().splitlines())
                    lines.append(f"{d.torch_op} at node {d.node} ({_where(d)}) differs from eager; inside its body:")
                    lines.append(f"  {inner}")
                    continue
                lines.append(
                    f"{d.suspect} is wrong at node {d.node} ({d.torch_op}, {_where(d)}): {d.error}; "
                    f"given the model's own inputs to it, still {d.local}"
                    + (f" [impl {d.impl} at {d.impl_source}]" if d.rules and d.impl_source else "")
                    + (f" [impl at {d.impl_source}]" if not d.rules and d.impl_source else "")
                )
        else:
            first = self.first[0] if self.first else self.divergences[0]
            lines.append(
                f"no node computes another function than torch: the values drift out of tolerance ({tol}), "
                f"first at node {first.node} ({first.torch_op}, {_where(first)}): {first.error}"
            )
        grew = self.grew_most
        largest = max((s.ratio for s in self.path), default=0.0)
        if grew is not None and math.isfinite(largest):
            share = min(grew.added / max(largest, 1e-30), 1.0)
            spread = "in one step" if share >= GROWTH_SHARE else f"spread along {len(self.path)} nodes"
            lines.append(
                f"the error grew most at node {grew.node} ({grew.torch_op}, +{grew.added:.3g} x the tolerance, "
                f"{share:.0%} of the largest error on the path), {spread}"
            )
        elif grew is not None:  # a zero tolerance (or a wrong shape): any difference is infinitely many
            lines.append(
                f"the error is beyond any multiple of the tolerance from node {grew.node} ({grew.torch_op}) on, "
                f"along {len(self.path)} nodes of the path"
            )
        lines.extend(self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json`` prints)."""
        grew = self.grew_most
        return _finite({
            "verdict": self.verdict,
            "runtime": self.runtime,
            "rtol": self.rtol,
            "atol": self.atol,
            "compared": self.compared,
            "suspects": list(self.suspects),
            "divergences": [d.to_dict() for d in self.divergences],
            "path": [dataclasses.asdict(s) for s in self.path],
            "grew_most": dataclasses.asdict(grew) if grew is not None else None,
            "notes": list(self.notes),
        })  # fmt: skip


def _where(d: Divergence) -> str:
    return " at ".join(p for p in (d.module or "<root>", d.source) if p)


def _finite(data: Any) -> Any:
    """JSON has no infinity: ``inf`` becomes the string ``"inf"``."""
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


# -- comparing values ---------------------------------------------------------------------


def tolerances(
    dtype: torch.dtype, rtol: float, atol: float, floors: Mapping[torch.dtype, tuple[float, float]] = DTYPE_TOLERANCES
) -> tuple[float, float]:
    low_rtol, low_atol = floors.get(dtype, (0.0, 0.0))
    return max(rtol, low_rtol), max(atol, low_atol)


def compare(
    got: Any,
    expected: Any,
    rtol: float,
    atol: float,
    floors: Mapping[torch.dtype, tuple[float, float]] = DTYPE_TOLERANCES,
) -> Error:
    """How ``got`` (the ONNX value, as torch) differs from ``expected`` (eager's), in tolerance units
    (a float dtype's tolerances at least its ``floors``)."""
    if not isinstance(expected, torch.Tensor):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        same = got == expected or (isinstance(expected, float) and abs(got - expected) <= atol + rtol * abs(expected))
        detail = "" if same else f"{got} != {expected}"
        return Error(0.0 if same else math.inf, count=1, bad=0 if same else 1, detail=detail)
    expected = _pair(expected.detach())
    if not isinstance(got, torch.Tensor):
        return Error(math.inf, detail=f"got {type(got).__name__}, expected a tensor")
    if tuple(got.shape) != tuple(expected.shape):
        return Error(math.inf, detail=f"shape {tuple(got.shape)} where eager has {tuple(expected.shape)}")
    if got.dtype != expected.dtype:
        return Error(math.inf, detail=f"dtype {got.dtype} where eager has {expected.dtype}")
    count = expected.numel()
    if count == 0:
        return Error(0.0)
    if not expected.dtype.is_floating_point:
        wrong = got != expected
        bad = int(wrong.sum())
        diff = float(bad > 0)
        if expected.dtype != torch.bool:
            diff = float((got.to(torch.float64) - expected.to(torch.float64)).abs().max())
        return Error(math.inf if bad else 0.0, diff, 0.0, bad, count)
    rtol, atol = tolerances(expected.dtype, rtol, atol, floors)
    g, e = got.to(torch.float64), expected.to(torch.float64)
    nan_g, nan_e = torch.isnan(g), torch.isnan(e)
    diff = (g - e).abs()
    diff = torch.where(nan_g & nan_e, torch.zeros_like(diff), diff)
    same_inf = torch.isinf(g) & torch.isinf(e) & (g == e)
    diff = torch.where(same_inf, torch.zeros_like(diff), diff)
    allowed = atol + rtol * e.abs().nan_to_num(posinf=0.0)
    ratios = torch.where(diff == 0, torch.zeros_like(diff), diff / allowed).nan_to_num(nan=math.inf, posinf=math.inf)
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if finite.any() else math.inf
    rel = diff[finite] / e.abs()[finite].clamp_min(1e-12)
    max_rel = float(rel.max()) if rel.numel() else math.inf
    return Error(float(ratios.max()), max_abs, max_rel, int((ratios > 1).sum()), count)


def _pair(value: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(value.resolve_conj()) if value.is_complex() else value


def _worst(errors: Sequence[Error]) -> Error:
    return max(errors, key=lambda e: e.ratio, default=Error(0.0))


# -- eager -------------------------------------------------------------------------------


def lifted_inputs(program: torch.export.ExportedProgram, user_leaves: Sequence[Any]) -> list[Any]:
    """The flat arguments of ``program.graph_module``: weights, buffers and constants by their
    specs, the user's leaves in order."""
    users = iter(user_leaves)
    state, constants = program.state_dict, program.constants
    flat = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(users))
        elif spec.kind == InputKind.TOKEN:
            flat.append(torch.empty(0))
        else:
            flat.append(state[spec.target] if spec.target in state else constants[spec.target])
    return flat


class _Keeper(torch.fx.Interpreter):
    """Runs a graph and keeps every node's value as it was made (an in-place op's result is
    copied: a later in-place op would change it under the report)."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=False)

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
            return torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, result)
        return result


def eager_values(program: torch.export.ExportedProgram, user_leaves: Sequence[Any]) -> dict[torch.fx.Node, Any]:
    """Every node's value when ``program``'s graph runs in eager PyTorch on ``user_leaves``."""
    recorder = _Keeper(program.graph_module)
    with TRACING_LOCK, torch.no_grad():  # as verify's eager run: no other thread is capturing
        recorder.run(*lifted_inputs(program, user_leaves), enable_io_processing=False)
    return recorder.env


# -- the ONNX side ------------------------------------------------------------------------


def live_values(graph: ir.Graph) -> dict[str, ir.Value]:
    """The main graph's values a node makes, and its inputs, by name."""
    found = {v.name: v for v in graph.inputs if v.name}
    for node in graph:
        for value in node.outputs:
            if value.name:
                found[value.name] = value
    return found


def resolve(trace: Trace, live: Mapping[str, ir.Value]) -> list[ir.Value | None]:
    """The live value each of the node's outputs is now: the same object, else one with its name."""
    known = {id(v) for v in live.values()}
    found: list[ir.Value | None] = []
    for value, name in zip(trace.values, trace.names or (None,) * len(trace.values), strict=True):
        if value is not None and id(value) in known and value.name:
            found.append(value)
        elif name is not None and name in live:
            found.append(live[name])
        else:
            found.append(None)
    return found


def with_outputs(model: ir.Model, names: Sequence[str]) -> ir.Model:
    """A copy of ``model`` whose graph also outputs the values ``names`` (initializers and inputs left out)."""
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    graph = copy.graph
    live = live_values(graph)
    outputs = {v.name for v in graph.outputs}
    for name in names:
        value = live.get(name)
        if name in outputs or value is None or value.producer() is None:
            continue
        graph.outputs.append(value)
        outputs.add(name)
    return copy


# -- locating --------------------------------------------------------------------------


@dataclasses.dataclass
class _Compared:
    node: torch.fx.Node
    trace: Trace
    values: list[ir.Value | None]
    error: Error


def _is_random(node: torch.fx.Node) -> bool:
    """Whether ``node`` draws random numbers: a seeded op whose dropout, if it has one, is on."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    schema = target._schema
    bound = {a.name: a.default_value if a.has_default_value() else None for a in schema.arguments}
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args):
            bound[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            bound[argument.name] = node.kwargs[argument.name]
    if "dropout_p" in bound:  # attention: random only while dropping
        return bound["dropout_p"] not in (0, 0.0, None)
    if "train" in bound:  # native_dropout(input, p, train)
        return bool(bound["train"]) and bound.get("p") not in (0, 0.0)
    return True


def locate(
    *,
    program: torch.export.ExportedProgram,
    traces: Mapping[str, Trace],
    model: ir.Model,
    user_leaves: Sequence[Any],
    feeds: Mapping[str, np.ndarray],
    run: Callable[[ir.Model, list[str], Mapping[str, np.ndarray]], list[Any]],
    runtime: str,
    rtol: float,
    atol: float,
    outputs: Mapping[str, str] | None = None,
    inside: Callable[[torch.fx.GraphModule, tuple], Location] | None = None,
) -> Location:
    """Compare every value of ``model``'s main graph ``traces`` names with eager PyTorch.

    ``run(model, names, feeds)`` runs a model and returns the named values (as torch tensors);
    ``outputs`` maps the FX nodes the model returns to its output names (a rewrite may have
    replaced an output's value by one of another name); ``inside(module, args)`` exports a
    control-flow body on its own and locates it (what :attr:`Divergence.inner` holds).
    """
    env = eager_values(program, user_leaves)
    live = live_values(model.graph)
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    notes: list[str] = []

    # random ops, and every value computed from them, match eager only in distribution
    tainted: set[torch.fx.Node] = set()
    for node in nodes:
        if _is_random(node) or any(a in tainted for a in node.all_input_nodes):
            tainted.add(node)
    drawn = sorted({str(_nodes.op_name(n.target)) for n in tainted if _is_random(n)})
    if drawn:
        notes.append(
            f"not compared: {len(tainted)} value(s) drawn by or computed from random ops ({', '.join(drawn)}); "
            "they match eager only in distribution (opreg.testing.Distribution)"
        )

    wanted: dict[torch.fx.Node, list[ir.Value | None]] = {}
    for node in nodes:
        trace = traces.get(node.name)
        if trace is None or node in tainted or _nodes.classify(node) is _nodes.Kind.GETITEM:
            continue
        values = resolve(trace, live)
        returned = (outputs or {}).get(node.name)
        if all(v is None for v in values) and len(values) == 1 and returned in live:
            values = [live[returned]]
        if any(v is not None for v in values):
            wanted[node] = values
    names = sorted({v.name for vs in wanted.values() for v in vs if v is not None and v.name})
    exposed = with_outputs(model, names)
    out_names = [v.name for v in exposed.graph.outputs]
    got = dict(zip(out_names, run(exposed, out_names, feeds), strict=True))

    compared: dict[torch.fx.Node, _Compared] = {}
    onnx_torch: dict[str, torch.Tensor] = {}
    for node, values in wanted.items():
        eager = env[node]
        eager_items = eager if isinstance(eager, (tuple, list)) else (eager,)
        errors = []
        for value, expected in zip(values, eager_items, strict=False):
            if value is None or value.name not in got or expected is None:
                continue
            tensor = _torch(got[value.name])
            onnx_torch[value.name] = tensor
            errors.append(compare(tensor, expected, rtol, atol))
        if errors:
            compared[node] = _Compared(node, traces[node.name], values, _worst(errors))
    bodies = [n for n in compared if _nodes.classify(n) is _nodes.Kind.HOP]
    if bodies:
        notes.append(
            f"control flow ({', '.join(sorted({_nodes.HOPS[n.target].name for n in bodies}))}) is compared at "
            "its outputs: ONNX Runtime cannot expose a value inside an If, Loop or Scan body"
        )

    ancestors = {node: _compared_ancestors(node, compared) for node in compared}
    divergences = []
    for node, item in compared.items():
        if item.error.ok:
            continue
        first = all(compared[a].error.ok for a in ancestors[node])
        local = _replay(node, compared, onnx_torch, env, rtol, atol)
        divergence = _divergence(item, model, ancestors[node], compared, local, first)
        if divergence.faulty and inside is not None and _nodes.classify(node) is _nodes.Kind.HOP:
            inner, why = _look_inside(node, env, inside)
            divergence = dataclasses.replace(divergence, inner=inner)
            if why:
                notes.append(f"inside {node.name} ({divergence.torch_op}): {why}")
        divergences.append(divergence)
    path = _path(program, compared, ancestors)
    return Location(runtime, rtol, atol, len(compared), tuple(divergences), path, tuple(notes))


def _first_call(node: torch.fx.Node, env: Mapping[torch.fx.Node, Any]) -> tuple[torch.fx.GraphModule, tuple] | None:
    """The body a control-flow node runs first, and its eager arguments: the branch ``cond``
    takes, the first iteration of ``scan``, ``map`` and ``while_loop``."""
    value = lambda a: env[a] if isinstance(a, torch.fx.Node) else a  # noqa: E731
    name = _nodes.HOPS[node.target].name
    if name == "cond":  # cond(pred, true_fn, false_fn, operands)
        index = 1 if bool(value(node.args[0])) else 2
        return _nodes.subgraph_module(node, index), tuple(value(a) for a in node.args[3])
    if name == "scan":  # scan(combine_fn, init, xs, additional_inputs)
        _, init, xs, extra = node.args
        operands = [*map(value, init), *(value(x)[0] for x in xs), *map(value, extra)]
        return _nodes.subgraph_module(node, 0), tuple(operands)
    if name == "map":  # map_impl(f, xs, pos_args)
        _, xs, extra = node.args
        return _nodes.subgraph_module(node, 0), tuple([*(value(x)[0] for x in xs), *map(value, extra)])
    if name == "while_loop":  # while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)
        _, _, carried, extra = node.args
        return _nodes.subgraph_module(node, 1), tuple([*map(value, carried), *map(value, extra)])
    return None


def _look_inside(
    node: torch.fx.Node, env: Mapping[torch.fx.Node, Any], inside: Callable[[torch.fx.GraphModule, tuple], Location]
) -> tuple[Location | None, str]:
    """The location inside ``node``'s body on its first call, and a note when it could not be made."""
    call = _first_call(node, env)
    if call is None:
        return None, "opreg does not look inside this body"
    module, args = call
    try:
        inner = inside(module, args)
    except Exception as e:  # the body alone may not export (a size only the loop knows): say so
        return None, f"its body could not be exported alone to look inside ({type(e).__name__}: {e})"
    if inner.verdict != "fault":
        return inner, "its body matches eager on its first call: the fault shows in a later one"
    return inner, ""


def _torch(array: Any) -> torch.Tensor:
    return array if isinstance(array, torch.Tensor) else torch.as_tensor(np.asarray(array))


def _compared_ancestors(node: torch.fx.Node, compared: Mapping[torch.fx.Node, _Compared]) -> list[torch.fx.Node]:
    """The nearest compared nodes ``node`` reads, through nodes that were not compared."""
    found: list[torch.fx.Node] = []
    seen: set[torch.fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in compared:
            found.append(current)
        elif current.op == "call_function":
            stack.extend(current.all_input_nodes)
    return found


def _replay(
    node: torch.fx.Node,
    compared: Mapping[torch.fx.Node, _Compared],
    onnx_values: Mapping[str, torch.Tensor],
    env: Mapping[torch.fx.Node, Any],
    rtol: float,
    atol: float,
) -> Error | None:
    """``node``'s ONNX value against its torch op run on the ONNX model's values of the nearest
    compared nodes it reads (the FX nodes in between, e.g. fused by a rewrite, run in eager too)."""
    memo: dict[torch.fx.Node, Any] = {}

    def onnx_value(current: torch.fx.Node) -> Any:
        item = compared[current]
        eager = env[current]
        if isinstance(eager, (tuple, list)):
            return type(eager)(
                _restore(onnx_values.get(v.name), e) if v is not None and v.name in onnx_values else e
                for v, e in zip(item.values, eager, strict=False)
            )
        (value, *_) = item.values
        if value is None or value.name not in onnx_values:
            return eager
        return _restore(onnx_values[value.name], eager)

    def evaluate(current: torch.fx.Node, top: bool = False) -> Any:
        if current in memo:
            return memo[current]
        if not top and current in compared:
            result = onnx_value(current)
        elif current.op != "call_function":
            result = env[current]
        else:
            args = torch.fx.node.map_arg(current.args, evaluate)
            kwargs = torch.fx.node.map_arg(current.kwargs, evaluate)
            result = current.target(*args, **kwargs)
        memo[current] = result
        return result

    try:
        with torch.no_grad():
            expected = evaluate(node, top=True)
    except Exception:  # an op that refuses the ONNX side's values: no replay, no verdict on the node
        return None
    got = onnx_value(node)
    got_items = got if isinstance(got, (tuple, list)) else (got,)
    exp_items = expected if isinstance(expected, (tuple, list)) else (expected,)
    errors = [
        compare(_pair(g) if isinstance(g, torch.Tensor) else g, e, rtol, atol, REPLAY_TOLERANCES)
        for g, e, v in zip(got_items, exp_items, compared[node].values, strict=False)
        if v is not None and v.name in onnx_values and e is not None
    ]
    return _worst(errors) if errors else None


def _restore(tensor: torch.Tensor | None, like: Any) -> Any:
    """An ONNX value as the eager value it stands for (a real pair back to complex)."""
    if tensor is None or not isinstance(like, torch.Tensor):
        return like
    if like.is_complex() and tensor.shape[-1:] == (2,) and tensor.dim() == like.dim() + 1:
        return torch.view_as_complex(tensor.contiguous())
    return tensor


def _region(value: ir.Value, stop: set[str]) -> list[ir.Node]:
    """The ONNX nodes between ``value`` and the values named in ``stop`` (inputs, weights and constants end it too)."""
    found: list[ir.Node] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        producer = current.producer()
        if producer is None or id(producer) in seen or (current.name in stop and current is not value):
            continue
        seen.add(id(producer))
        found.append(producer)
        stack.extend(v for v in producer.inputs if v is not None)
    return found


def _subgraph_nodes(node: ir.Node) -> list[ir.Node]:
    inner: list[ir.Node] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            inner.extend(ir.traversal.RecursiveGraphIterator(attr.value))
        elif attr.type == ir.AttributeType.GRAPHS:
            for graph in attr.value:
                inner.extend(ir.traversal.RecursiveGraphIterator(graph))
    return inner


def _divergence(
    item: _Compared,
    model: ir.Model,
    ancestors: Sequence[torch.fx.Node],
    compared: Mapping[torch.fx.Node, _Compared],
    local: Error | None,
    first: bool,
) -> Divergence:
    node = item.node
    stop = {v.name for a in ancestors for v in compared[a].values if v is not None}
    region: list[ir.Node] = []
    for value in item.values:
        if value is not None:
            region.extend(n for n in _region(value, stop) if n not in region)
    rules: list[str] = []
    body: list[str] = []
    for onnx_node in region:
        for label in provenance(onnx_node).get("rewrite", "").split(JOIN):
            if label and label not in rules:
                rules.append(label)
        for inner in _subgraph_nodes(onnx_node):
            props = provenance(inner)
            if props.get("pack") and props.get("impl") and props["pack"] != _nodes.EXPORTER:
                for pack, impl in zip(props["pack"].split(JOIN), props["impl"].split(JOIN), strict=False):
                    if f"{pack}:{impl}" not in body:
                        body.append(f"{pack}:{impl}")
    impl = item.trace.impl
    is_hop = _nodes.classify(node) is _nodes.Kind.HOP
    torch_op = _nodes.HOPS[node.target].name if is_hop else str(_nodes.torch_op(node))
    ops = [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in reversed(region)]
    value = next((v.name for v in item.values if v is not None), "")
    return Divergence(
        node=node.name,
        value=value or "",
        torch_op=torch_op,
        pack=impl.pack if impl is not None else _nodes.EXPORTER,
        impl=impl.label if impl is not None else f"{_nodes.EXPORTER}:{torch_op}",
        impl_source=impl.source if impl is not None else "",
        rules=tuple(rules),
        onnx_ops=tuple(ops),
        body_impls=tuple(body),
        module=_nodes.module_path(node),
        source=_nodes.source_line(node),
        error=item.error,
        local=local,
        first=first,
    )


def _path(
    program: torch.export.ExportedProgram,
    compared: Mapping[torch.fx.Node, _Compared],
    ancestors: Mapping[torch.fx.Node, list[torch.fx.Node]],
) -> tuple[Step, ...]:
    """From the worst output back to the inputs, always through the worst compared input."""
    output = next(n for n in program.graph.nodes if n.op == "output")
    ends = [a for a in _compared_ancestors(output, compared)]
    if not ends:
        return ()
    current: torch.fx.Node | None = max(ends, key=lambda n: compared[n].error.ratio)
    chain = []
    while current is not None:
        chain.append(current)
        before = ancestors[current]
        current = max(before, key=lambda n: compared[n].error.ratio) if before else None
    steps = []
    previous = 0.0
    for node in reversed(chain):
        ratio = compared[node].error.ratio
        impl = compared[node].trace.impl
        name = _nodes.HOPS[node.target].name if _nodes.classify(node) is _nodes.Kind.HOP else str(_nodes.torch_op(node))
        added = ratio - previous if math.isfinite(ratio) else math.inf
        steps.append(Step(node.name, name, impl.label if impl is not None else _nodes.EXPORTER, ratio, max(added, 0.0)))
        previous = ratio if math.isfinite(ratio) else previous
    return tuple(steps)


__all__ = ["Divergence", "Error", "Location", "Step", "Trace", "compare", "locate"]
