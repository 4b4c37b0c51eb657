"""What every finished model gets: onnxscript's authoring attributes stripped from its nodes
(:class:`StripAuthoringAttributes`), and the lowest IR version its opsets allow (:class:`LowestIrVersion`)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.exporter._recorder import OUTPUTS_KWARG
from opreg.exporter.passes.pipeline import all_nodes

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


class LowestIrVersion(InPlacePass):
    """The lowest IR version (at least :data:`MIN_IR_VERSION`) the model's opsets allow."""

    def call(self, model: ir.Model) -> PassResult:
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in model.graph.opset_imports.items()]
        version = max(MIN_IR_VERSION, onnx.helper.find_min_ir_version_for(opsets, ignore_unknown=True))
        modified, model.ir_version = model.ir_version != version, version
        return PassResult(model, modified)
