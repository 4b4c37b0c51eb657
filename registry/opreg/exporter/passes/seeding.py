"""Random nodes seeded: each one its own ``seed``, so a new session draws the same numbers again."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.exporter._recorder import is_random
from opreg.exporter.passes.pipeline import all_nodes

MIN_OPSET_WITH_SEEDS = 18
"""What :func:`seed_random_nodes` reads the ``seed`` attribute's type from when the graph names no ai.onnx version."""


class SeedRandomNodes(InPlacePass):
    """:func:`seed_random_nodes` with ``seed``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def call(self, model: ir.Model) -> PassResult:
        return PassResult(model, bool(seed_random_nodes(model, self.seed)))


def seed_random_nodes(model: ir.Model, seed: int) -> int:
    """Give every random node (``_recorder.RANDOM_OPS``), in the graphs and the kept functions, a
    ``seed`` attribute: ``seed``, ``seed + 1``, ... in order, so each node draws its own stream and
    a new session draws the same numbers again. Returns how many nodes were seeded."""
    count = 0
    for node in list(all_nodes(model)):
        if not is_random(node):
            continue
        version = model.graph.opset_imports.get("", MIN_OPSET_WITH_SEEDS)
        kind = onnx.defs.get_schema(node.op_type, version).attributes["seed"].type
        value = seed + count
        if kind == onnx.defs.OpSchema.AttrType.INT:
            node.attributes["seed"] = ir.AttrInt64("seed", value)
        else:
            node.attributes["seed"] = ir.AttrFloat32("seed", float(value))
        count += 1
    return count
