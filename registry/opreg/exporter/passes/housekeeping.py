"""What every finished model gets: onnxscript's authoring attributes stripped from its nodes
(:class:`StripAuthoringAttributes`), and the lowest IR version its opsets allow (:class:`LowestIrVersion`)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.exporter._recorder import OUTPUTS_KWARG
from opreg.exporter.passes.pipeline import all_graphs, all_nodes

MIN_IR_VERSION = 10
"""Node ``metadata_props`` (provenance) need IR 10; newer opsets need more."""


class StripAuthoringAttributes(InPlacePass):
    """Drop what onnxscript's authoring leaves on nodes (``_outputs``, private ``_``-attributes)."""

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        for node in all_nodes(model):
            names = [n for n in node.attributes if n == OUTPUTS_KWARG or n.startswith("_")]
            for name in names:
                del node.attributes[name]
            modified = modified or bool(names)
        return PassResult(model, modified)


TYPE_IR_VERSIONS = {ir.DataType.FLOAT4E2M1: 11, ir.DataType.FLOAT8E8M0: 12, ir.DataType.INT2: 13, ir.DataType.UINT2: 13}
"""The IR version each element type newer than :data:`MIN_IR_VERSION` needs (onnx.proto's IR history)."""


def _dtypes(model: ir.Model) -> set[ir.DataType]:
    """The element types of every value of the model's graphs and functions."""
    found: set[ir.DataType] = set()
    for owner in all_graphs(model):
        values = [
            *owner.inputs,
            *owner.outputs,
            *(o for n in ir.traversal.RecursiveGraphIterator(owner) for o in n.outputs),
        ]
        if isinstance(owner, ir.Graph):
            values += owner.initializers.values()
        found.update(v.dtype for v in values if v.dtype is not None)
    return found


class LowestIrVersion(InPlacePass):
    """The lowest IR version (at least :data:`MIN_IR_VERSION`) the model's opsets and types allow."""

    def call(self, model: ir.Model) -> PassResult:
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in model.graph.opset_imports.items()]
        by_opsets = onnx.helper.find_min_ir_version_for(opsets, ignore_unknown=True)
        version = max(MIN_IR_VERSION, by_opsets, *(TYPE_IR_VERSIONS.get(t, 0) for t in _dtypes(model)))
        modified, model.ir_version = model.ir_version != version, version
        return PassResult(model, modified)
