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

from opreg.errors import OpregError
from opreg.exporter import _nodes
from opreg.exporter._nodes import Trace, read_provenance
from opreg.exporter._rewrite import JOIN
from opreg.exporter.diagnosis.compare import REPLAY_TOLERANCES, Error, as_pair, compare, worst
from opreg.exporter.diagnosis.eager import eager_values
from opreg.exporter.diagnosis.report import Divergence, Location, Step
from opreg.exporter.diagnosis.run import Program, check_runtime, to_numpy
from opreg.exporter.diagnosis.verify import check_tolerances

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


def locate(
    *,
    program: torch.export.ExportedProgram,
    traces: Mapping[str, Trace],
    model: ir.Model,
    user_leaves: Sequence[Any],
    feeds: Mapping[str, np.ndarray],
    run: Callable[[ir.Model, list[str], Mapping[str, np.ndarray]], list[Any]],
    runtime: str,
    rtol: float | None,
    atol: float | None,
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

    tainted = _tainted(nodes, notes)
    wanted = _wanted(nodes, traces, live, tainted, outputs or {})
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
            compared[node] = _Compared(node, traces[node.name], values, worst(errors))
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


def _tainted(nodes: Sequence[torch.fx.Node], notes: list[str]) -> set[torch.fx.Node]:
    """Random ops, and every value computed from them: they match eager only in distribution (a note says so)."""
    tainted: set[torch.fx.Node] = set()
    for node in nodes:
        if _nodes.draws_random(node) or any(a in tainted for a in node.all_input_nodes):
            tainted.add(node)
    drawn = sorted({str(_nodes.op_name(n.target)) for n in tainted if _nodes.draws_random(n)})
    if drawn:
        notes.append(
            f"not compared: {len(tainted)} value(s) drawn by or computed from random ops ({', '.join(drawn)}); "
            "they match eager only in distribution (opreg.testing.Distribution)"
        )
    return tainted


def _wanted(
    nodes: Sequence[torch.fx.Node],
    traces: Mapping[str, Trace],
    live: Mapping[str, ir.Value],
    tainted: set[torch.fx.Node],
    outputs: Mapping[str, str],
) -> dict[torch.fx.Node, list[ir.Value | None]]:
    """The ONNX values to compare, by the FX node they stand for (a returned node by its output's name)."""
    wanted: dict[torch.fx.Node, list[ir.Value | None]] = {}
    for node in nodes:
        trace = traces.get(node.name)
        if trace is None or node in tainted or _nodes.classify(node) is _nodes.Kind.GETITEM:
            continue
        values = resolve(trace, live)
        returned = outputs.get(node.name)
        if all(v is None for v in values) and len(values) == 1 and returned in live:
            values = [live[returned]]
        if any(v is not None for v in values):
            wanted[node] = values
    return wanted


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
    rtol: float | None,
    atol: float | None,
) -> Error | None:
    """``node``'s ONNX value against its torch op run on the ONNX model's values of the nearest
    compared nodes it reads (the FX nodes in between, e.g. fused by a rewrite, run in eager too).

    A half-precision node out of tolerance is replayed once more in float32 (every half-precision
    value read as float32), its result rounded once to its type: what ONNX Runtime computes for one.
    Within tolerance of either, the node is not wrong: torch's own half kernel can be the less exact
    of the two (its float16 grid_sampler rounds each step)."""

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

    def replayed(wide: bool) -> Error | None:
        memo: dict[torch.fx.Node, Any] = {}

        def evaluate(current: torch.fx.Node, top: bool = False) -> Any:
            if current in memo:
                return memo[current]
            if not top and current in compared:
                result = _widened(onnx_value(current), wide)
            elif current.op != "call_function":
                result = _widened(env[current], wide)
            else:
                args = torch.fx.node.map_arg(current.args, evaluate)
                kwargs = torch.fx.node.map_arg(current.kwargs, evaluate)
                result = current.target(*args, **kwargs)
            memo[current] = result
            return result

        try:
            with torch.no_grad():
                expected = _items(evaluate(node, top=True))
        except Exception:  # an op that refuses the ONNX side's values: no replay, no verdict on the node
            return None
        expected = tuple(_like(e, like) if wide else e for e, like in zip(expected, _items(env[node]), strict=False))
        errors = [
            compare(as_pair(g) if isinstance(g, torch.Tensor) else g, e, rtol, atol, REPLAY_TOLERANCES)
            for g, e, v in zip(_items(onnx_value(node)), expected, compared[node].values, strict=False)
            if v is not None and v.name in onnx_values and e is not None
        ]
        return worst(errors) if errors else None

    error = replayed(wide=False)
    if error is None or error.ok or not any(_half(v) for v in _items(env[node])):
        return error
    wide = replayed(wide=True)
    return error if wide is None else min(error, wide, key=lambda e: e.ratio)


def _items(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _half(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16)


def _widened(value: Any, wide: bool) -> Any:
    """``value`` (a tensor, or a tuple of them) with its half-precision tensors as float32, when ``wide``."""
    if not wide:
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_widened(v, wide) for v in value)
    return value.float() if _half(value) else value


def _like(value: Any, like: Any) -> Any:
    """A float32 replay's result rounded to the half type eager's result has."""
    return value.to(like.dtype) if _half(like) and isinstance(value, torch.Tensor) else value


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
        for label in read_provenance(onnx_node).get("rewrite", "").split(JOIN):
            if label and label not in rules:
                rules.append(label)
        for inner in _subgraph_nodes(onnx_node):
            props = read_provenance(inner)
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


def export_alone(program: Program, module: torch.fx.GraphModule, inputs: tuple) -> Any:
    """A graph module (a control-flow body :func:`locate_program` looks inside) exported on its own,
    with ``program``'s exporter (bound to its registry) and target."""
    if program.exporter is None:
        raise OpregError("this program does not know the exporter that made it")
    return program.exporter(module, inputs, target=program.target)


def locate_program(
    program: Program, args: tuple, kwargs: dict[str, Any], *, rtol: float | None, atol: float | None, runtime: str
) -> Location:
    """:meth:`opreg.exporter.OnnxProgram.locate`: :func:`locate` on the program's inputs, runtime and traces,
    a control-flow body at fault exported alone (:func:`export_alone`) and located."""
    check_tolerances(rtol, atol)
    check_runtime(runtime, "auto")
    program.calls.eager("locate", program.streamed)
    leaves = program.calls.leaves(args, kwargs)
    inputs = [to_numpy(t) for t in program.adapt_torch_inputs_to_onnx(*args, **kwargs)]
    feeds = dict(zip(program.input_names, inputs, strict=True))
    if runtime == "auto":
        runtime = program.runtime_for()
    if not program.traces:
        raise OpregError("this program has no record of what each node became: export it again with opreg.export")

    def inside(module: torch.fx.GraphModule, inputs: tuple) -> Location:
        return export_alone(program, module, inputs).locate(*inputs, rtol=rtol, atol=atol, runtime=runtime)

    return locate(
        program=program.exported_program, traces=program.traces, model=program.model, user_leaves=leaves,
        feeds=feeds, runtime=runtime, rtol=rtol, atol=atol, outputs=_output_nodes(program), inside=inside,
        run=lambda model, names, feeds: program.runner.run_copy(model, runtime, names, feeds),
    )  # fmt: skip


def _output_nodes(program: Program) -> dict[str, str]:
    """The FX nodes the model returns (by name) -> the ONNX outputs they became."""
    from torch.export.graph_signature import OutputKind

    output = next(n for n in program.exported_program.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    specs = program.exported_program.graph_signature.output_specs
    user = [r for r, s in zip(results, specs, strict=True) if s.kind == OutputKind.USER_OUTPUT]
    return {
        r.name: slot.name
        for r, slot in zip(user, program.output_slots, strict=True)
        if isinstance(r, torch.fx.Node) and slot.name is not None
    }


__all__ = ["locate", "locate_program"]
