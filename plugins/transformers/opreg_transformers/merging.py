"""The merged decoder optimum writes (``decoder_model_merged.onnx``), built with onnx_ir from the
decoder without past and the decoder with past.

The layout is optimum-onnx 0.1.0's (``merge_decoders`` in ``optimum/onnx/graph_transformations.py``):
one ``If`` node on a ``use_cache_branch`` input (``bool[1]``), its ``then_branch`` the decoder with
past, its ``else_branch`` the decoder without; the graph's inputs every input of either (the
decoder's first, then the with-past decoder's others, then ``use_cache_branch``), its outputs the
decoder's, in its order. An output the decoder with past does not give (the cross-attention's
``present.{i}.encoder.*``, which do not change after the first step) is an empty constant in its
branch, as optimum makes it: the first symbolic dim 0, the others 1. The weights both decoders
hold are stored once, in the main graph, where both branches read them
(``LiftSubgraphInitializersToMainGraphPass`` then ``DeduplicateHashedInitializersPass``);
``NameFixPass`` keeps every name unique across the graph and its branches.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import common

import opreg

USE_CACHE_BRANCH = "use_cache_branch"


def merge_decoders(decoder: ir.Model, with_past: ir.Model, *, name: str = "merged") -> ir.Model:
    """The two decoders in one model behind an ``If`` on ``use_cache_branch``; both are left as
    they are (their clones are merged). :class:`opreg.ExportError` when they cannot be merged
    (an input of two types, an output only the decoder with past gives)."""
    first, then = decoder.clone(), with_past.clone()
    inputs = _inputs(first.graph, then.graph)
    for graph in (first.graph, then.graph):
        for value in list(graph.inputs):
            value.replace_all_uses_with(inputs[value.name], replace_graph_outputs=True)
        graph.inputs.clear()
    _empty_outputs(first.graph, then.graph)
    flag = ir.Value(name=USE_CACHE_BRANCH, type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([1]))
    outputs = [_like(mine, theirs) for mine, theirs in zip(first.graph.outputs, then.graph.outputs, strict=True)]
    first.graph.name, then.graph.name = "no_past", "with_past"
    branch = ir.Node(
        "", "If", [flag], [ir.AttrGraph("then_branch", then.graph), ir.AttrGraph("else_branch", first.graph)],
        outputs=outputs, name="optimum::if",
    )  # fmt: skip
    graph = ir.Graph([*inputs.values(), flag], outputs, nodes=[branch], opset_imports=_opsets(first, then), name=name)
    model = ir.Model(
        graph, ir_version=max(first.ir_version, then.ir_version), producer_name=decoder.producer_name,
        producer_version=decoder.producer_version, functions=[*first.functions.values(), *then.functions.values()],
    )  # fmt: skip
    model.metadata_props.update(_metadata(first.metadata_props, then.metadata_props))
    passes = ir.passes.Sequential(
        common.LiftSubgraphInitializersToMainGraphPass(), common.DeduplicateHashedInitializersPass(),
        common.NameFixPass(), common.RemoveUnusedFunctionsPass(),
    )  # fmt: skip
    return passes(model).model


def _inputs(decoder: ir.Graph, with_past: ir.Graph) -> dict[str, ir.Value]:
    """The merged graph's inputs by name: the decoder's, then the decoder with past's others."""
    inputs: dict[str, ir.Value] = {}
    for value in [*decoder.inputs, *with_past.inputs]:
        known = inputs.get(value.name)
        if known is None:
            inputs[value.name] = ir.Value(name=value.name, type=value.type, shape=value.shape)
        elif known.type != value.type:
            raise opreg.ExportError(
                f"the decoders cannot be merged: input {value.name!r} is {known.type} in the decoder and "
                f"{value.type} in the decoder with past"
            )
    return inputs


def _empty_outputs(decoder: ir.Graph, with_past: ir.Graph) -> None:
    """Give the decoder with past the decoder's outputs, in its order: one it lacks is an empty
    constant (optimum's ``_unify_onnx_outputs`` with ``strict=False``)."""
    theirs = {value.name: value for value in with_past.outputs}
    extra = sorted(set(theirs) - {value.name for value in decoder.outputs})
    if extra:
        raise opreg.ExportError(f"the decoders cannot be merged: only the decoder with past gives {extra}")
    outputs = []
    for value in decoder.outputs:
        if value.name in theirs:
            outputs.append(theirs[value.name])
            continue
        empty = _empty(value)
        constant = ir.Value(name=value.name, type=value.type, shape=ir.Shape(empty.shape))
        with_past.append(ir.node("Constant", [], {"value": ir.tensor(empty)}, outputs=[constant]))
        outputs.append(constant)
    with_past.outputs.clear()
    with_past.outputs.extend(outputs)


def _empty(value: ir.Value) -> np.ndarray:
    """An empty array of ``value``'s type: its first symbolic dim 0, its other symbolic dims 1."""
    assert value.shape is not None and value.dtype is not None
    dims, zeroed = [], False
    for dim in value.shape:
        if isinstance(dim, int):
            dims.append(dim)
        else:
            dims.append(1 if zeroed else 0)
            zeroed = True
    if not zeroed:
        raise opreg.ExportError(f"the decoders cannot be merged: {value.name!r} has no dynamic dim to leave empty")
    return np.zeros(dims, dtype=value.dtype.numpy())


def _like(decoder: ir.Value, with_past: ir.Value) -> ir.Value:
    """The merged output: the decoder with past's shape where it computes the output (past and new
    tokens), the decoder's where its branch gives a constant."""
    computed = with_past.producer() is not None and with_past.producer().op_type != "Constant"
    return ir.Value(name=decoder.name, type=decoder.type, shape=with_past.shape if computed else decoder.shape)


def _opsets(first: ir.Model, then: ir.Model) -> dict[str, int]:
    """Each domain at the newer of the two versions: opreg declares the lowest version every
    chosen impl holds at, and every impl holds up to the target, so the newer serves both."""
    versions = dict(first.opset_imports)
    for domain, version in then.opset_imports.items():
        versions[domain] = max(version, versions.get(domain, version))
    return versions


def _metadata(first: Any, then: Any) -> dict[str, str]:
    """Both models' metadata: a JSON object both hold (``opreg.dim_bounds``) merged, else the decoder's."""
    merged = dict(then)
    for key, value in first.items():
        try:
            mine, theirs = json.loads(value), json.loads(then.get(key, "null"))
        except json.JSONDecodeError:
            mine = theirs = None
        merged[key] = json.dumps({**theirs, **mine}) if isinstance(mine, dict) and isinstance(theirs, dict) else value
    return merged
