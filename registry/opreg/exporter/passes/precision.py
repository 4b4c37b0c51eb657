"""``keep_float32``: the bfloat16 nodes ONNX Runtime's CPU provider has no kernel for compute in
float32, each bfloat16 input cast to float32 before the node and each output cast back after it.

ONNX Runtime's CPU provider has bfloat16 kernels for data movement (Cast, Concat, Gather, Reshape,
Transpose, ...) and LayerNormalization, not for arithmetic (MatMul, Gemm, Add, Mul, Softmax...):
a bfloat16 model fails to load there. For float16 the provider inserts these casts itself (its
InsertCastTransformer); this pass does it for bfloat16 at export, where the kernel table
(:mod:`opreg.exporter._kernels`) says a node needs it. Each result is rounded to bfloat16 as
eager PyTorch rounds each op's, so the model computes what eager does, op by op.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.exporter import _kernels

BFLOAT16, FLOAT = ir.DataType.BFLOAT16, ir.DataType.FLOAT
TYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_dtype"})
"""Attributes that set a node's output type: such a node is left as it is (its type is its own)."""


class ComputeInFloat32(InPlacePass):
    """The bfloat16 nodes with no CPU kernel (:attr:`opreg.exporter._kernels.MissingKernel.half`)
    computed in float32 between Casts (one Cast to float32 per bfloat16 value, shared by its readers).

    ``boundaries``: the names of the values that are a torch op's results (the translation's
    traces). A value inside one torch op's nodes (a 3-D linear's MatMul before its Add) that only
    such nodes read stays float32, so the op's result is rounded once, as eager PyTorch rounds it;
    ``None`` (or a node in a subgraph): every node's result is rounded.
    """

    def __init__(self, boundaries: frozenset[str] | None = None) -> None:
        self.boundaries = boundaries

    def call(self, model: ir.Model) -> PassResult:
        widened: dict[tuple[int, int], ir.Value] = {}  # (value, graph): a subgraph's Cast stays its own
        taken = _names(model)
        chosen = [
            node
            for node, found in _kernels.missing_nodes(model)
            if found.half and not TYPE_ATTRIBUTES & set(node.attributes)
        ]
        cast = {id(node) for node in chosen}
        for node in chosen:
            _widen_inputs(node, widened, taken)
            for value in node.outputs:
                if value.dtype == BFLOAT16 and self._inside(value, model.graph, cast):
                    value.dtype = FLOAT  # read only by nodes computed in float32 here: no rounding
                elif value.dtype == BFLOAT16:
                    _round(value, node, taken)
        return PassResult(model, bool(chosen))

    def _inside(self, value: ir.Value, graph: ir.Graph, cast: set[int]) -> bool:
        """Whether ``value`` is inside one torch op's nodes, all of its readers computed in float32."""
        if self.boundaries is None or value.graph is not graph or value.name in self.boundaries:
            return False
        return not value.is_graph_output() and all(id(reader) in cast for reader, _ in value.uses())


def _names(model: ir.Model) -> set[str]:
    """Every value name of the model, subgraphs included (a new one must differ from all)."""
    graph = model.graph
    names = {v.name for v in [*graph.inputs, *graph.initializers.values()] if v.name}
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names.update(v.name for v in node.outputs if v.name)
    return names


def _fresh(stem: str, taken: set[str]) -> str:
    name, index = stem, 0
    while name in taken:
        index += 1
        name = f"{stem}_{index}"
    taken.add(name)
    return name


def _widen_inputs(node: ir.Node, widened: dict[tuple[int, int], ir.Value], taken: set[str]) -> None:
    """``node``'s bfloat16 inputs cast to float32 (one Cast per value and graph, before its first reader)."""
    for index, value in enumerate(node.inputs):
        if value is not None and value.dtype == BFLOAT16:
            key = (id(value), id(node.graph))
            if key not in widened:
                widened[key] = _cast(value, FLOAT, node, _fresh(f"{value.name}_float32", taken), before=True)
            node.replace_input_with(index, widened[key])


def _round(value: ir.Value, node: ir.Node, taken: set[str]) -> None:
    """``node`` makes ``value`` in float32 now; its readers (and the graph's outputs) get it cast back
    to bfloat16, under its name."""
    graph = node.graph
    readers = list(value.uses())
    returned = [i for i, output in enumerate(graph.outputs) if output is value]
    name = value.name
    value.name, value.dtype = _fresh(f"{name}_float32", taken), FLOAT
    rounded = _cast(value, BFLOAT16, node, name, before=False)
    for reader, index in readers:
        reader.replace_input_with(index, rounded)
    for index in returned:
        graph.outputs[index] = rounded


def _cast(value: ir.Value, dtype: ir.DataType, node: ir.Node, name: str, *, before: bool) -> ir.Value:
    """``Cast(value, to=dtype)``, named ``name``, inserted beside ``node`` with its provenance."""
    cast = ir.Node("", "Cast", [value], [ir.AttrInt64("to", int(dtype))], num_outputs=1)
    cast.metadata_props.update(node.metadata_props)
    out = cast.outputs[0]
    out.name, out.dtype, out.shape = name, dtype, value.shape
    if before:
        node.graph.insert_before(node, cast)
    else:
        node.graph.insert_after(node, cast)
    return out
