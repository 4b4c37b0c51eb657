"""What finishing is made of: ``onnx_ir`` passes, in a pipeline that can say what it runs.

Every step after translation is an ``onnx_ir.passes.PassBase``: onnx_ir's and
onnxscript's maintained passes where they do the job, opreg's own otherwise, and
each pack rewrite wrapped as one (:mod:`opreg.exporter._rewrite`). They are
assembled by :func:`opreg.exporter._finish.pipeline` into a :class:`Pipeline`,
whose :meth:`Pipeline.describe` lists them (``opreg export --debug`` logs it) and
which logs each pass's time at debug level.

:class:`Rules` runs onnxscript rewrite rules as one pass, trying only the rules
whose ops occur in the model and each rule only on nodes of its pattern's root op.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassBase, PassManager, PassResult
from onnxscript.rewriter import RewritePass, _pattern_ir, pattern

logger = logging.getLogger(__name__)


def name_of(item: PassBase) -> str:
    """How a pass is shown: its ``name`` attribute, else its class name."""
    return getattr(item, "name", None) or type(item).__name__


def all_graphs(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    """The main graph and every kept function (their subgraphs are reached through their nodes)."""
    yield model.graph
    yield from model.functions.values()


def subgraphs_of(node: ir.Node) -> list[ir.Graph]:
    """The graphs ``node`` holds in its attributes (an If's branches, a Loop's or Scan's body)."""
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.as_graph())
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.as_graphs())
    return graphs


def all_nodes(model: ir.Model) -> Iterator[ir.Node]:
    """Every node of the model: the main graph, its subgraphs, the functions and theirs."""
    for owner in all_graphs(model):
        yield from ir.traversal.RecursiveGraphIterator(owner)


class Pipeline(PassManager):
    """A ``PassManager`` with a name, that logs each pass it runs with its time (debug level)
    and describes itself (:meth:`describe`): ``steps > 1`` repeats the passes until none
    changes the model (a fixpoint), at most ``steps`` times."""

    def __init__(self, name: str, passes: Sequence[PassBase], steps: int = 1) -> None:
        super().__init__(list(passes), steps=steps, early_stop=True)
        self.name = name

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        for step in range(self.steps):
            changed = False
            for item in self.passes:
                started = time.perf_counter()
                result = item(model)
                logger.debug(
                    "%s: %s%s took %.3f s", self.name, name_of(item), " (changed)" if result.modified else "",
                    time.perf_counter() - started,
                )  # fmt: skip
                model, changed = result.model, changed or result.modified
            modified = modified or changed
            if not changed:
                break
            if step + 1 < self.steps:
                logger.debug("%s: sweep %d changed the model, again", self.name, step + 1)
        return PassResult(model, modified)

    def describe(self, indent: str = "") -> list[str]:
        """One line per pass, nested pipelines indented under their name."""
        lines = []
        for each in self.passes:
            item = each.describe() if isinstance(each, IfModified) else each
            if isinstance(item, Pipeline):
                repeat = f" (until nothing changes, at most {item.steps} times)" if item.steps > 1 else ""
                lines.append(f"{indent}{item.name}{repeat}:")
                lines.extend(item.describe(indent + "  "))
            else:
                lines.append(f"{indent}{name_of(item)}")
        return lines


class IfModified(InPlacePass):
    """Runs ``then`` only when ``first`` changed the model (e.g. clean up after rewrites that fired)."""

    def __init__(self, first: PassBase, then: PassBase, name: str) -> None:
        self.first = first
        self.then = then
        self.name = name

    def call(self, model: ir.Model) -> PassResult:
        result = self.first(model)
        if result.modified:
            self.then(result.model)
        return result

    def describe(self) -> Pipeline:
        return Pipeline(self.name, [self.first, Pipeline("then, if they changed the model", [self.then])])


# -- rewrite rules as a pass -----------------------------------------------------------------


ONNXSCRIPT_RULE_TAG = "pkg.onnxscript.rewriter.rule_name"
"""onnxscript's own record, on each node a rule made, of the rule's name: opreg's exact rewrites
leave it off (the node keeps the provenance of what it replaced), a pack's rewrite says it as
``opreg.rewrite`` with the pack."""


def _op_type(node_pattern: Any) -> str | None:
    """The op type a pattern node matches, when it names exactly one. A commuted rule's nodes
    (``rule.commute()``) carry no ``op_identifier``, so their op pattern is read too."""
    identifier = node_pattern.op_identifier()
    if identifier is not None:
        return identifier[1]
    op = getattr(node_pattern, "op", None)
    return op.value() if isinstance(op, _pattern_ir.StringConstantPattern) else None


def _root_op(rule: Any) -> str | None:
    """The op type of the node a rule's pattern is matched from (its single output node), when
    the pattern names one; ``None`` when the rule must be tried on every node."""
    graph_pattern = getattr(rule, "_target_pattern", None)
    if graph_pattern is None or not getattr(graph_pattern, "has_single_output_node", False):
        return None
    return _op_type(graph_pattern.output_node)


def pattern_ops(rule: Any) -> frozenset[str]:
    """The op types every match of ``rule`` contains: those of the pattern's nodes that name
    theirs and are reached from its outputs through node outputs only (a node under one
    alternative of an ``OrValue`` is not in every match)."""
    graph_pattern = getattr(rule, "_target_pattern", None)
    if graph_pattern is None:
        return frozenset()
    ops: set[str] = set()
    seen: set[int] = set()
    values = list(graph_pattern.outputs)
    while values:
        value = values.pop()
        if not isinstance(value, _pattern_ir.NodeOutputPattern) or id(node := value.producer()) in seen:
            continue
        seen.add(id(node))
        if (op := _op_type(node)) is not None:
            ops.add(op)
        values.extend(node.inputs)
    return frozenset(ops)


Gate = tuple[int, "str | tuple[int, ...]"]
"""An input a rule's root node must have: ``(position, op type)`` for the output of a node of
that op type, ``(position, shape)`` for a constant of that shape."""


def _input_gates(rule: Any) -> tuple[Gate, ...]:
    """The inputs of a rule's root node that its pattern makes a constant or an output of a node
    of a named op type (:data:`Gate`): what a node's inputs must be for the pattern to match at
    all, read from the pattern (empty when it has no single root)."""
    graph_pattern = getattr(rule, "_target_pattern", None)
    if graph_pattern is None or not getattr(graph_pattern, "has_single_output_node", False):
        return ()
    gates: list[Gate] = []
    for position, value in enumerate(graph_pattern.output_node.inputs):
        if isinstance(value, _pattern_ir.Constant):  # onnxscript matches a scalar, or a list as 1-D
            gates.append((position, (len(value.value),) if isinstance(value.value, list) else ()))
        elif isinstance(value, _pattern_ir.NodeOutputPattern) and (op := _op_type(value.producer())) is not None:
            gates.append((position, op))
    return tuple(gates)


def _admits(node: ir.Node, gates: tuple[Gate, ...]) -> bool:
    """Whether ``node``'s inputs are what :func:`_input_gates` says a match needs: onnxscript's
    matcher rejects, for a constant pattern, a value without ``const_value`` or of another shape,
    and for a node output, one whose producer has another op type. An input the node lacks is
    left to the matcher."""
    inputs = node.inputs
    for position, want in gates:
        if position >= len(inputs) or (value := inputs[position]) is None:
            continue
        if isinstance(want, str):
            if (producer := value.producer()) is None or producer.op_type != want:
                return False
        elif (constant := value.const_value) is None or constant.shape.dims != want:
            return False
    return True


class RootGate:
    """A rule tried only on nodes of its pattern's root op whose inputs are what the pattern
    needs (a constant, an output of a named op: :func:`_input_gates`). onnxscript's rule sets
    try every rule on every node, and most attempts fail after building a match (at 256 stacked
    blocks, where no rule fires, the input tests took the sweep from 0.15 to 0.12 s of CPU).
    Everything but ``try_rewrite`` is the wrapped rule's."""

    def __init__(self, rule: Any) -> None:
        self.rule = rule
        self.root = _root_op(rule)
        self.gates = _input_gates(rule)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rule, name)

    def try_rewrite(self, model: ir.Model, graph_or_function: Any, node: ir.Node, **kwargs: Any) -> Any:
        if self.root is not None and node.op_type != self.root:
            return None
        if self.gates and not _admits(node, self.gates):
            return None
        return self.rule.try_rewrite(model, graph_or_function, node, **kwargs)


class Rules(RewritePass):
    """onnxscript rewrite rules as one pass (onnxscript's ``RewritePass``), tried together in one
    sweep over every graph; only the rules whose ops all occur in the model are tried, each only
    on nodes of its root op (:class:`RootGate`)."""

    def __init__(self, name: str, rules: Sequence[Any]) -> None:
        super().__init__(pattern.RewriteRuleSet([RootGate(r) for r in rules]))  # type: ignore[list-item]
        self.name = name
        self._needs = [(gate, pattern_ops(gate.rule)) for gate in self.rules.rules]

    def call(self, model: ir.Model) -> PassResult:
        present = {node.op_type for node in all_nodes(model)}
        wanted = [gate for gate, ops in self._needs if ops <= present]
        if not wanted:
            return PassResult(model, False)
        count = pattern.RewriteRuleSet(wanted).apply_to_model(model)  # type: ignore[arg-type]
        if count:
            for node in all_nodes(model):
                node.metadata_props.pop(ONNXSCRIPT_RULE_TAG, None)
        return PassResult(model, bool(count))
