"""Knowing a value by what it computes: run the nodes that make it, on their own, in ONNX Runtime.

A rewrite that replaces a model's attention mask or rotary angles by a kernel's own inputs
must not change what the model computes, and every architecture and transformers version
spells those values differently. Instead of matching their spelling, the decoder rewrites
(:mod:`opreg_ort_contrib.kv_cache`, :mod:`opreg_ort_contrib.fusions.gqa`) cut out the nodes
that compute a value from the graph's inputs (a :class:`Slice`), run them for chosen inputs
and sizes, and rewrite only if the results are what the kernel computes.

A slice reads one runtime value (a graph input, or a value the caller names as the cut)
and other graph inputs only through ``Shape``; the probe feeds those shapes directly, so a
past of 2**17 positions costs its mask, not its keys. Constants it reads are copied into
the probe up to :data:`MAX_CONSTANT_ELEMENTS` elements each (a weight is not a mask's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

MAX_NODES = 400
"""A value computed by more nodes than this is not probed."""
MAX_CONSTANT_ELEMENTS = 1 << 16


def dims(value: ir.Value | None) -> list | None:
    return None if value is None or value.shape is None else list(value.shape)


def dim_name(dim) -> int | str | None:
    """A dim as an int or its symbol's name; ``None`` for an unnamed one."""
    return dim if isinstance(dim, int) else getattr(dim, "value", None)


@dataclasses.dataclass
class Slice:
    """The nodes computing ``output`` from one runtime value, ``source``.

    Fields:
        output: the value probed.
        source: the one value the slice reads as values (a graph input, or the cut); ``None``
            for a value computed from constants alone (:meth:`constant`).
        nodes: the nodes between them, in graph order.
        shapes: ``Shape`` nodes of other graph inputs, whose outputs the probe feeds.
        constants: the initializers and constants the nodes read.
    """

    output: ir.Value
    source: ir.Value | None
    nodes: list[ir.Node]
    shapes: list[ir.Node]
    constants: list[ir.Value]

    @staticmethod
    def constant(output: ir.Value) -> Slice | None:
        """The slice of a value computed from initializers and constants alone, of any size (a
        weight dequantized in the graph), or ``None``."""
        return Slice.of(output, sources=0, max_constant=None)

    @staticmethod
    def of(
        output: ir.Value,
        cut: ir.Value | None = None,
        *,
        sources: int = 1,
        max_constant: int | None = MAX_CONSTANT_ELEMENTS,
    ) -> Slice | None:
        """The slice of ``output``: from ``cut`` if given (which must be the only runtime value it
        reads), else from the one graph input it reads as values (``sources=0``: from none);
        ``None`` if there is no such slice (other runtime values, custom ops, subgraphs,
        constants over ``max_constant`` elements, too many nodes)."""
        sources_wanted = sources
        nodes: dict[int, ir.Node] = {}
        constants: dict[int, ir.Value] = {}
        sources: dict[int, ir.Value] = {}
        shapes: list[ir.Node] = []
        stack = [output]
        while stack:
            current = stack.pop()
            producer = current.producer()
            if current is cut:
                sources[id(current)] = current
                continue
            if producer is None:
                if current.is_initializer() or current.const_value is not None:
                    tensor = current.const_value
                    if tensor is None or (max_constant is not None and tensor.size > max_constant):
                        return None
                    constants[id(current)] = current
                elif current.is_graph_input() and cut is None and sources_wanted:
                    sources[id(current)] = current
                else:
                    return None
                continue
            if id(producer) in nodes:
                continue
            if producer.domain not in ("", "ai.onnx") or any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in producer.attributes.values()
            ):
                return None
            nodes[id(producer)] = producer
            if len(nodes) > MAX_NODES:
                return None
            if producer.op_type == "Shape" and producer.inputs[0] is not None and producer.inputs[0].is_graph_input():
                shapes.append(producer)
                continue
            stack.extend(v for v in producer.inputs if v is not None)
        if len(sources) != sources_wanted or (sources_wanted == 0 and shapes):
            return None
        order = {id(node): index for index, node in enumerate(output.graph or [])}
        ordered = sorted((n for n in nodes.values() if n not in shapes), key=lambda n: order.get(id(n), -1))
        return Slice(output, next(iter(sources.values()), None), ordered, shapes, list(constants.values()))

    def key(self) -> tuple:
        """What the slice computes, hashable: each node's op, attributes and where each input comes
        from (a node before it, the source, a ``Shape`` of a graph input, a constant's values). Two
        slices of one key compute the same values from the same inputs."""
        where: dict[int, Any] = {}
        if self.source is not None:
            where[id(self.source)] = ("source", id(self.source))
        for shape in self.shapes:
            where[id(shape.outputs[0])] = ("shape", id(shape.inputs[0]), _attributes(shape))
        for constant in self.constants:
            where[id(constant)] = ("constant", _value_key(constant.const_value))
        nodes = []
        for position, node in enumerate(self.nodes):
            inputs = tuple(None if v is None else where.get(id(v), ("unknown", id(v))) for v in node.inputs)
            nodes.append((node.domain, node.op_type, _attributes(node), inputs))
            for index, out in enumerate(node.outputs):
                where[id(out)] = ("node", position, index)
        return tuple(nodes), where.get(id(self.output), ("unknown", id(self.output)))

    def model(self, opsets: Mapping[str, int]):
        """The slice as an ``onnx.ModelProto``: inputs the source and each ``Shape``'s output."""
        import onnx

        names: dict[int, str] = {}

        def name(value: ir.Value) -> str:
            return names.setdefault(id(value), f"v{len(names)}")

        inputs = []
        if self.source is not None:
            inputs.append(onnx.helper.make_tensor_value_info(name(self.source), int(self.source.dtype), None))
        for shape in self.shapes:
            inputs.append(onnx.helper.make_tensor_value_info(name(shape.outputs[0]), onnx.TensorProto.INT64, [None]))
        initializers = []
        for constant in self.constants:
            proto = ir.serde.serialize_tensor(constant.const_value)
            proto.name = name(constant)
            initializers.append(proto)
        nodes = []
        for node in self.nodes:
            proto = ir.serde.serialize_node(node)
            del proto.input[:]
            proto.input.extend(name(v) if v is not None else "" for v in node.inputs)
            del proto.output[:]
            proto.output.extend(name(v) for v in node.outputs)
            del proto.metadata_props[:]
            nodes.append(proto)
        output = onnx.ValueInfoProto(name=name(self.output))  # its type as ONNX Runtime infers it
        graph = onnx.helper.make_graph(nodes, "probe", inputs, [output], initializer=initializers)
        imports = [onnx.helper.make_opsetid(d, v) for d, v in opsets.items() if d in ("", "ai.onnx")]
        return onnx.helper.make_model(graph, opset_imports=imports, ir_version=10)

    def prober(self) -> Prober | None:
        """An ONNX Runtime session of the slice; ``None`` if ONNX Runtime cannot run it on its own."""
        import onnxruntime

        if self.output.graph is None:
            return None
        try:
            model = self.model(dict(self.output.graph.opset_imports))
            session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:
            return None
        return Prober(self, session)


@dataclasses.dataclass
class Prober:
    """Runs a :class:`Slice`."""

    slice: Slice
    session: object

    def __call__(self, source: np.ndarray | None = None, sizes: Mapping[str, int] | None = None) -> np.ndarray | None:
        """The output for ``source``, the graph inputs' symbolic dims sized by ``sizes``
        (name -> value); ``None`` if a dim is not in ``sizes`` or the slice fails there."""
        names = [i.name for i in self.session.get_inputs()]
        feeds = {}
        if self.slice.source is not None:
            feeds[names.pop(0)] = source.astype(self.slice.source.dtype.numpy())
        for name, shape in zip(names, self.slice.shapes, strict=True):
            found = _shape_of(shape, sizes or {})
            if found is None:
                return None
            feeds[name] = found
        try:
            (result,) = self.session.run(None, feeds)
        except Exception:
            return None
        return result


def _shape_of(node: ir.Node, sizes: Mapping[str, int]) -> np.ndarray | None:
    """What ``node`` (a ``Shape`` of a graph input) gives where the symbolic dims are ``sizes``:
    only the dims it reads (``start``, ``end``) need a size."""
    shape = dims(node.inputs[0]) or []
    start = node.attributes["start"].as_int() if "start" in node.attributes else 0
    end = node.attributes["end"].as_int() if "end" in node.attributes else len(shape)
    found = []
    for dim in shape[start:end]:
        if isinstance(dim, int):
            found.append(dim)
        elif dim_name(dim) in sizes:
            found.append(sizes[dim_name(dim)])
        else:
            return None  # a dim the probe does not know how to size
    return np.array(found, dtype=np.int64)


def provenance(nodes: Sequence[ir.Node]) -> dict[str, str]:
    """The nodes' ``metadata_props`` merged: each key's distinct values joined with ``+``
    (how opreg records what a rewrite replaced)."""
    merged: dict[str, list[str]] = {}
    for node in nodes:
        for key, value in node.metadata_props.items():
            for part in value.split("+"):
                if part and part not in merged.setdefault(key, []):
                    merged[key].append(part)
    return {key: "+".join(values) for key, values in merged.items()}


def _value_key(value: Any) -> Any:
    """A tensor as its type, shape and bytes; anything else as its ``repr``."""
    if hasattr(value, "tobytes") and hasattr(value, "dtype"):
        return (str(value.dtype), tuple(value.shape), value.tobytes())
    return repr(value)


def _attributes(node: ir.Node) -> tuple:
    return tuple(sorted((name, _value_key(a.value)) for name, a in node.attributes.items()))
