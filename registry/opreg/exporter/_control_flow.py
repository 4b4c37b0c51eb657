"""Control flow: the higher-order ops' subgraphs, each translated in a scope of its own.

``torch.cond`` becomes ``If`` (the branches read the operands from the enclosing graph),
``while_loop`` becomes ``Loop``, ``scan`` and ``map`` become ``Scan``; context-only HOPs (no-grad,
autocast off) and ``invoke_subgraph`` are translated in place, through their bodies.
:class:`ControlFlow` is the translator's half that does this; the other half,
:class:`opreg.exporter._translate.Translator`, walks graphs and calls impls, and this half
calls back into it (``_walk``, ``_value``, ``_typed``, ``_describe``, ``_cast``, ``_stamp``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx_ir as ir
import onnxscript.evaluator
import torch

from opreg.errors import ExportError
from opreg.exporter import _nodes
from opreg.exporter._nodes import Trace, trace_of
from opreg.exporter._recorder import GraphRecorder
from opreg.exporter._results import dtype_of

if TYPE_CHECKING:
    from opreg.registry.targets import Target


@dataclasses.dataclass
class Scope:
    """One graph being translated: its FX values, the recorder of its ONNX graph, and the
    outermost higher-order op node it sits in (where its nodes came from, when they lack it)."""

    recorder: GraphRecorder
    values: dict[torch.fx.Node, Any] = dataclasses.field(default_factory=dict)
    outer: torch.fx.Node | None = None


class ControlFlow:
    """Translating higher-order ops: the base of :class:`opreg.exporter._translate.Translator`, which
    provides the graph walk and the value helpers these methods call."""

    target: Target
    main_graph: ir.Graph | None
    traces: dict[str, Trace]

    def _hop(self, scope: Scope, node: torch.fx.Node) -> None:
        hop = _nodes.HOPS[node.target]
        if hop.inline:
            (_, module), *_ = _nodes.subgraphs(node)
            operands = [self._value(scope, a) for a in node.args[hop.operands :]]
            scope.values[node] = tuple(self._inline(scope, node, module, operands))
        else:
            handler = getattr(self, f"_hop_{hop.name}")
            self._stamp(scope.recorder, node, hop.name, _nodes.EXPORTER, hop.name, "<exporter>", scope.outer)
            scope.values[node] = tuple(handler(scope, node))
        if scope.outer is None and scope.recorder.graph is self.main_graph:
            self.traces[node.name] = trace_of(scope.values[node], None)

    def _inline(
        self, scope: Scope, node: torch.fx.Node, module: torch.fx.GraphModule, operands: Sequence[Any]
    ) -> list[Any]:
        """Translate ``module``'s graph into ``scope`` itself, its placeholders bound to ``operands``."""
        inner = Scope(scope.recorder, outer=scope.outer or node)
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(operands):
            raise ExportError(f"a subgraph takes {len(placeholders)} operands, the call passes {len(operands)}")
        inner.values.update(zip(placeholders, operands, strict=True))
        return self._walk(inner, module.graph)

    def _subgraph(
        self,
        scope: Scope,
        node: torch.fx.Node,
        module: torch.fx.GraphModule,
        bound: Sequence[Any],
        inputs: Sequence[ir.Value],
        name: str,
        then: Any = None,
    ) -> tuple[ir.Graph, list[ir.Value]]:
        """An ONNX graph nested in ``scope``'s graph, translating ``module`` with its
        placeholders bound to ``bound`` (the new graph's ``inputs``, or values of the
        enclosing graphs). ``then(inner_scope, outputs) -> outputs`` may add nodes after
        the module's. Returns the graph (outputs not yet set) and the output values."""
        graph = ir.Graph(list(inputs), [], nodes=[], name=name)
        inner = Scope(scope.recorder.subgraph(graph), outer=scope.outer or node)
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        inner.values.update(zip(placeholders, bound, strict=True))
        outputs = self._walk(inner, module.graph)
        if then is not None:
            with onnxscript.evaluator.default_as(inner.recorder):
                outputs = then(inner, outputs)
        return graph, outputs

    def _seal(self, scope: Scope, graph: ir.Graph, outputs: Sequence[Any], metas: Sequence[Any]) -> None:
        """Set ``graph``'s outputs: each a value made in ``graph`` and used once (an outer
        value, an input, a constant or a repeat goes through an ``Identity``)."""
        recorder = scope.recorder
        made_here = {id(out) for node in graph for out in node.outputs}
        taken: set[int] = set()
        for result, meta in zip(outputs, metas, strict=True):
            value = result if isinstance(result, ir.Value) else recorder.constant(result, dtype_of(meta))
            if id(value) not in made_here or id(value) in taken or _is_constant(value):
                value = recorder.add_node("", "Identity", [value], [], 1, self.target.onnx).outputs[0]
            taken.add(id(value))
            self._describe(value, meta)
            graph.outputs.append(value)

    def _hop_cond(self, scope: Scope, node: torch.fx.Node) -> list[ir.Value]:
        # cond(pred, true_fn, false_fn, operands)
        pred, _, _, operands = node.args
        metas = list(node.meta["val"])
        operand_values = [self._value(scope, a) for a in operands]
        condition = self._value(scope, pred)
        if isinstance(condition, bool):  # torch knew the branch while capturing
            module = _nodes.subgraph_module(node, 1 if condition else 2)
            return self._inline(scope, node, module, operand_values)
        recorder = scope.recorder
        if condition.dtype != ir.DataType.BOOL:
            condition = self._cast(recorder, condition, ir.DataType.BOOL)
        branches = []
        for index, role in ((1, "then"), (2, "else")):
            module = _nodes.subgraph_module(node, index)
            name = recorder.fresh_name(f"{node.name}_{role}")
            graph, outputs = self._subgraph(scope, node, module, operand_values, [], name)
            self._seal(self._sub_scope_of(graph, scope), graph, outputs, metas)
            branches.append(graph)
        attributes = [ir.AttrGraph("then_branch", branches[0]), ir.AttrGraph("else_branch", branches[1])]
        if_node = recorder.add_node("", "If", [condition], attributes, len(metas), None)
        return self._name_outputs(scope, node, if_node.outputs, metas)

    def _hop_while_loop(self, scope: Scope, node: torch.fx.Node) -> list[ir.Value]:
        # while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)
        _, _, carried, additional = node.args
        metas = list(node.meta["val"])
        recorder = scope.recorder
        cond_module = _nodes.subgraph_module(node, 0)
        body_module = _nodes.subgraph_module(node, 1)
        initial = [self._value(scope, a) for a in carried]
        extra = [self._value(scope, a) for a in additional]
        (start,) = self._inline(scope, node, cond_module, [*initial, *extra])
        start = self._as_bool_scalar(recorder, start)

        iteration = self._typed(recorder.fresh_name(f"{node.name}_iter"), torch.empty((), dtype=torch.int64))
        cond_in = self._typed(recorder.fresh_name(f"{node.name}_cond_in"), torch.empty((), dtype=torch.bool))
        carried_in = [self._typed(recorder.fresh_name(f"{node.name}_carried"), m) for m in metas]

        def condition_after(inner: Scope, outputs: list[Any]) -> list[Any]:
            (again,) = self._inline(inner, node, cond_module, [*outputs, *extra])
            return [self._as_bool_scalar(inner.recorder, again), *outputs]

        body, outputs = self._subgraph(
            scope, node, body_module, [*carried_in, *extra], [iteration, cond_in, *carried_in],
            recorder.fresh_name(f"{node.name}_body"), then=condition_after,
        )  # fmt: skip
        self._seal(self._sub_scope_of(body, scope), body, outputs, [torch.empty((), dtype=torch.bool), *metas])
        loop = recorder.add_node("", "Loop", [None, start, *initial], [ir.AttrGraph("body", body)], len(metas), None)
        return self._name_outputs(scope, node, loop.outputs, metas)

    def _hop_scan(self, scope: Scope, node: torch.fx.Node) -> list[ir.Value]:
        # scan(combine_fn, init, xs, additional_inputs): combine_fn(*carry, *x_slices, *additional)
        _, init, xs, additional = node.args
        return self._scan(scope, node, _nodes.subgraph_module(node, 0), list(init), list(xs), list(additional))

    def _hop_map(self, scope: Scope, node: torch.fx.Node) -> list[ir.Value]:
        # map_impl(f, xs, pos_args): f(*x_slices, *pos_args), results stacked
        _, xs, pos_args = node.args
        return self._scan(scope, node, _nodes.subgraph_module(node, 0), [], list(xs), list(pos_args))

    def _scan(
        self, scope: Scope, node: torch.fx.Node, module: torch.fx.GraphModule, init: list, xs: list, extra: list
    ) -> list[ir.Value]:
        recorder = scope.recorder
        metas = list(node.meta["val"])
        states = [self._value(scope, a) for a in init]
        sequences = [self._value(scope, a) for a in xs]
        outer = [self._value(scope, a) for a in extra]
        state_in = [self._typed(recorder.fresh_name(f"{node.name}_state"), a.meta["val"]) for a in init]
        slices = [self._typed(recorder.fresh_name(f"{node.name}_slice"), a.meta["val"][0]) for a in xs]
        name = recorder.fresh_name(f"{node.name}_body")
        body, outputs = self._subgraph(scope, node, module, [*state_in, *slices, *outer], [*state_in, *slices], name)
        slice_metas = [m if i < len(init) else m[0] for i, m in enumerate(metas)]
        self._seal(self._sub_scope_of(body, scope), body, outputs, slice_metas)
        attributes = [ir.AttrGraph("body", body), ir.AttrInt64("num_scan_inputs", len(sequences))]
        scan = recorder.add_node("", "Scan", [*states, *sequences], attributes, len(metas), None)
        return self._name_outputs(scope, node, scan.outputs, metas)

    def _sub_scope_of(self, graph: ir.Graph, scope: Scope) -> Scope:
        """A scope that adds nodes to ``graph`` (nested in ``scope``'s graph)."""
        return Scope(scope.recorder.subgraph(graph))

    def _name_outputs(self, scope: Scope, node: torch.fx.Node, outputs: Sequence[ir.Value], metas: Sequence[Any]):
        for i, (value, meta) in enumerate(zip(outputs, metas, strict=True)):
            value.name = scope.recorder.fresh_name(f"{node.name}_{i}")
            self._describe(value, meta)
        return list(outputs)

    def _as_bool_scalar(self, recorder: GraphRecorder, value: Any) -> ir.Value:
        if isinstance(value, bool):
            return recorder.constant(value, ir.DataType.BOOL)
        if value.dtype != ir.DataType.BOOL:
            value = self._cast(recorder, value, ir.DataType.BOOL)
        if value.shape is None or len(value.shape) != 0:
            empty = recorder.constant([], ir.DataType.INT64)
            value = recorder.add_node("", "Reshape", [value, empty], [], 1, self.target.onnx).outputs[0]
        return value


def _is_constant(value: ir.Value) -> bool:
    producer = value.producer()
    return value.const_value is not None and (producer is None or producer.op_type == "Constant")
