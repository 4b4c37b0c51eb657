"""The model's outputs: named after what the model returns (:func:`output_names`), bound to
those names (:class:`BindOutputs`), and every subgraph's outputs made inside it
(:class:`OwnSubgraphOutputs`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.errors import ExportError
from opreg.exporter import _pytrees
from opreg.exporter.passes.pipeline import subgraphs_of


class BindOutputs(InPlacePass):
    """:func:`bind_outputs`: the graph's outputs get ``names``, an output that is not a node's
    own result an Identity with the provenance ``origins`` gives."""

    def __init__(self, names: Sequence[str], origins: Sequence[Mapping[str, str]]) -> None:
        self.names = list(names)
        self.origins = list(origins)

    def call(self, model: ir.Model) -> PassResult:
        bind_outputs(model.graph, self.names, self.origins)
        return PassResult(model, True)


class OwnSubgraphOutputs(InPlacePass):
    """:func:`own_subgraph_outputs` of the main graph."""

    def call(self, model: ir.Model) -> PassResult:
        return PassResult(model, own_subgraph_outputs(model.graph))


def output_names(out_spec: Any, count: int, taken: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Readable, distinct names for the flattened outputs, from each one's path in the returned
    structure (:func:`_pytrees.leaf_paths`), its parts joined with ``.``: ``output`` for a lone
    tensor, ``output_0``, ``output_1.0`` for tuples, the keys and fields of dicts, dataclasses and
    ``ModelOutput`` s (``logits``, ``pair.1``, ``past_key_values.0.key``); a name an input, a
    weight or an earlier output has gets ``_out``."""
    paths = _pytrees.leaf_paths(out_spec)
    if len(paths) != count:
        raise ExportError(f"the output structure has {len(paths)} leaves, the graph {count} outputs")
    root_is_sequence = out_spec.type in (tuple, list)
    names = []
    used = set(taken)
    for path in paths:
        parts = [_pytrees.clean(part) or "_" for part in path]
        if not parts:
            name = "output"
        else:
            if root_is_sequence:
                parts[0] = f"output_{parts[0]}"
            name = ".".join(parts)
        while name in used:
            name += "_out"
        used.add(name)
        names.append(name)
    return names


def bind_outputs(graph: ir.Graph, names: Sequence[str], origins: Sequence[Mapping[str, str]] = ()) -> None:
    """Give the graph's outputs their ``names``. An output that is also an input, an
    initializer, a constant or an earlier output gets an ``Identity`` of its own,
    stamped with ``origins[i]`` (the provenance of the node that made it before
    folding); an intermediate value that holds one of the names is renamed."""
    intermediates = {out.name: out for node in graph for out in node.outputs if out.name}
    seen: set[int] = set()
    for index, (value, name) in enumerate(zip(list(graph.outputs), names, strict=True)):
        producer = value.producer()
        shared = (
            id(value) in seen
            or value.is_graph_input()
            or value.is_initializer()
            or producer is None
            or producer.op_type == "Constant"
        )
        seen.add(id(value))
        out = value
        if shared:
            node = ir.node("Identity", [value], name=f"{name}_Identity")
            origin = producer.metadata_props if producer is not None else {}
            node.metadata_props.update(origin or (origins[index] if index < len(origins) else {}))
            graph.append(node)
            out = node.outputs[0]
            out.type, out.shape = value.type, value.shape
            graph.outputs[index] = out
        clash = intermediates.get(name)
        if clash is not None and clash is not out:  # the output gets the name; the intermediate another
            clash.name = _fresh(f"{name}_", intermediates)
            intermediates[clash.name] = clash
        if intermediates.get(out.name) is out:
            del intermediates[out.name]  # its old name is free again
        intermediates[name] = out
        out.name = name


def _fresh(stem: str, taken: Mapping[str, Any]) -> str:
    index = 0
    while f"{stem}{index}" in taken:
        index += 1
    return f"{stem}{index}"


def own_subgraph_outputs(graph: ir.Graph) -> bool:
    """Every output of a subgraph (If branch, Loop or Scan body) made by a node of that
    subgraph: the clean-up passes may have replaced one by a value of an enclosing
    graph, an input of the subgraph or a constant, which ONNX does not allow there.
    Returns whether an Identity was added."""
    added = False
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for sub in subgraphs_of(node):
            made = {id(out) for n in sub for out in n.outputs}
            seen: set[int] = set()
            for index, value in enumerate(list(sub.outputs)):
                if id(value) in made and id(value) not in seen and value.const_value is None:
                    seen.add(id(value))
                    continue
                copy = ir.node("Identity", [value], name=f"{sub.name}_output_{index}")
                copy.metadata_props.update(node.metadata_props)
                out = copy.outputs[0]
                out.name = f"{sub.name}_output_{index}"
                out.type, out.shape = value.type, value.shape
                sub.append(copy)
                sub.outputs[index] = out
                seen.add(id(out))
                added = True
    return added
