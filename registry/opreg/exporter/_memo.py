"""Translating a repeated call once: a model's layers call the same impls on values of the same
types again and again, and each call would run the impl's Python and ONNX's per-node check anew.

The first call of an impl on arguments of some description (each value's dtype, shape, small
constant data and complex mark; every other argument as it is; which arguments are the same
value) is recorded as a :class:`Template`: the nodes it made, where each of their inputs comes
from (an argument, an earlier node of the call, a shared constant or a graph input), the types
ONNX inferred for their outputs, and what it returned. A later call with the same description
gets the same nodes again, on its own arguments, named and stamped with provenance as the
recorder would, without running the impl.

That is exact only for an impl whose nodes are a function of that description: one that does
not read a weight's contents, the producer or name of a value, or state of its own. opreg's core
pack is written so (``tests/test_architecture.py`` holds it to it); other packs' impls always
run. A call that draws random numbers, builds a subgraph, calls a script function or reads a
value the description does not cover is not recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir

from opreg.exporter._recorder import SMALL_CONSTANT, GraphRecorder, is_random
from opreg.node_types import shape_dims
from opreg.registry.registry import Impl
from opreg.values import COMPLEX_KEY

MEMO_PACKS = frozenset({"core"})
"""The packs whose impls are recorded and replayed (see the module docstring)."""

_ARG, _NODE, _FIXED, _PLAIN = "arg", "node", "fixed", "plain"


class _Unrecordable(Exception):
    """The call cannot be described or replayed exactly."""


@dataclasses.dataclass(frozen=True)
class _NodeTemplate:
    domain: str
    op_type: str
    version: int | None
    attributes: tuple[ir.Attr, ...]
    inputs: tuple[tuple[Any, ...] | None, ...]  # (kind, ...) per input, None for a missing one
    outputs: tuple[tuple[ir.DataType | None, tuple[Any, ...] | None], ...]  # (dtype, dims) per output


@dataclasses.dataclass(frozen=True)
class Template:
    """What one call made and returned, in terms of its arguments (see the module docstring)."""

    nodes: tuple[_NodeTemplate, ...]
    result: Any


def _shape(dims: tuple[int | str | None, ...] | None) -> ir.Shape | None:
    return None if dims is None else ir.Shape(list(dims))


class Memo:
    """The templates of one export's main graph, by impl and argument description."""

    def __init__(self) -> None:
        self._templates: dict[tuple[Any, ...], Template | None] = {}

    @staticmethod
    def describe(
        impl: Impl, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], list[ir.Value]] | None:
        """The call's description (a key) and its argument values in order of first appearance,
        or ``None`` where an argument cannot be described."""
        values: list[ir.Value] = []
        seen: dict[int, int] = {}

        def leaf(value: Any) -> Any:
            if isinstance(value, ir.Value):
                index = seen.get(id(value))
                if index is not None:
                    return ("same", index)
                if value.type is not None and not isinstance(value.type, ir.TensorType):
                    raise _Unrecordable  # a sequence or optional: its element type is not described
                seen[id(value)] = len(values)
                values.append(value)
                const = value.const_value
                data = None
                if const is not None:
                    data = const.tobytes() if const.size <= SMALL_CONSTANT else "weight"
                return ("value", value.dtype, shape_dims(value.shape), data, bool(value.meta.get(COMPLEX_KEY)))
            if isinstance(value, (list, tuple)):
                return (type(value).__name__, tuple(leaf(v) for v in value))
            if value is None or isinstance(value, (bool, int, str)):
                return (type(value).__name__, value)
            if isinstance(value, float):
                return ("float", repr(value))
            raise _Unrecordable

        try:
            key = (
                impl.label,
                id(impl.function),
                tuple(leaf(a) for a in args),
                tuple((k, leaf(v)) for k, v in kwargs.items()),
            )
        except _Unrecordable:
            return None
        return key, values

    def replay(self, recorder: GraphRecorder, key: tuple[Any, ...], values: Sequence[ir.Value]) -> tuple[bool, Any]:
        """``(True, result)`` of the call ``key`` describes, its nodes added to ``recorder``'s graph,
        if a template of it was recorded; else ``(False, None)``."""
        template = self._templates.get(key)
        if template is None:
            return False, None
        made: list[ir.Node] = []

        def value_of(source: tuple[Any, ...]) -> ir.Value:
            kind = source[0]
            if kind == _ARG:
                return values[source[1]]
            if kind == _NODE:
                return made[source[1]].outputs[source[2]]
            return source[1]  # _FIXED

        for spec in template.nodes:
            inputs = [None if s is None else value_of(s) for s in spec.inputs]
            node = recorder.add_node(
                spec.domain, spec.op_type, inputs, spec.attributes, len(spec.outputs), spec.version, infer=False
            )
            for output, (dtype, dims) in zip(node.outputs, spec.outputs, strict=True):
                output.dtype, output.shape = dtype, _shape(dims)
            made.append(node)
        return True, _rebuild(template.result, value_of)

    def record(
        self,
        recorder: GraphRecorder,
        key: tuple[Any, ...],
        values: Sequence[ir.Value],
        nodes: Sequence[ir.Node],
        result: Any,
    ) -> None:
        """Keep the template of the call ``key`` describes, which made ``nodes`` and returned
        ``result`` (read before the translator types the result from torch's metadata)."""
        if key in self._templates:
            return
        try:
            self._templates[key] = _template(recorder, values, nodes, result)
        except _Unrecordable:
            self._templates[key] = None  # not again: every call of this description runs the impl


def _template(recorder: GraphRecorder, values: Sequence[ir.Value], nodes: Sequence[ir.Node], result: Any) -> Template:
    shared = recorder.shared_constants()
    arguments = {id(v): i for i, v in enumerate(values)}
    produced: dict[int, tuple[str, int, int]] = {}
    specs: list[_NodeTemplate] = []
    for node in nodes:
        output = node.outputs[0] if node.outputs else None
        if node.op_type == "Constant" and not node.domain and output is not None and id(output) in shared:
            continue  # the recorder's shared constant: a later call reads the same one
        if node.version is None or is_random(node):
            raise _Unrecordable  # a script function's call node, or a draw of random numbers
        if dict(node.metadata_props) != recorder.metadata:
            raise _Unrecordable  # the impl stamped its nodes itself
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            raise _Unrecordable
        inputs = tuple(None if v is None else _source(v, arguments, produced, shared) for v in node.inputs)
        for index, out in enumerate(node.outputs):
            produced[id(out)] = (_NODE, len(specs), index)
        specs.append(
            _NodeTemplate(
                node.domain,
                node.op_type,
                node.version,
                tuple(node.attributes.values()),
                inputs,
                tuple((out.dtype, shape_dims(out.shape)) for out in node.outputs),
            )
        )

    def leaf(value: Any) -> Any:
        if isinstance(value, ir.Value):
            return _source(value, arguments, produced, shared)
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(leaf(v) for v in value))
        return (_PLAIN, value)

    return Template(tuple(specs), leaf(result))


def _source(
    value: ir.Value, arguments: dict[int, int], produced: dict[int, tuple[str, int, int]], shared: set[int]
) -> tuple[Any, ...]:
    """Where a value a call's node reads (or the call returns) comes from."""
    index = arguments.get(id(value))
    if index is not None:
        return (_ARG, index)
    made = produced.get(id(value))
    if made is not None:
        return made
    if id(value) in shared or value.is_graph_input() or value.is_initializer():
        return (_FIXED, value)
    raise _Unrecordable  # a value the description does not cover


def _rebuild(result: Any, value_of: Callable[[tuple[Any, ...]], ir.Value]) -> Any:
    """A call's result from its template's description of it."""
    kind = result[0]
    if kind in (_ARG, _NODE, _FIXED):
        return value_of(result)
    if kind == _PLAIN:
        return result[1]
    items = [_rebuild(item, value_of) for item in result[1]]
    return tuple(items) if kind == "tuple" else items
