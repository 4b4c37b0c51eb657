"""Finishing a translated graph into a model: outputs, one version per domain,
functions (kept or inlined), IR version, validation."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import torch

from opreg.errors import ExportError, OpsetConflictError
from opreg.exporter._recorder import OUTPUTS_KWARG, Use, _schema
from opreg.registry import Impl
from opreg.targets import ONNX_DOMAIN, Target, domain_label

MIN_IR_VERSION = 10
"""Node ``metadata_props`` (provenance) need IR 10; newer opsets need more."""

EXPORTER_EMITTER = "<exporter>"


@dataclasses.dataclass(frozen=True)
class OutputSlot:
    """Where one leaf of the model's returned structure comes from: an ONNX output
    (``name``) or a constant torch baked in (``value``)."""

    name: str | None
    value: Any = None


# -- outputs --------------------------------------------------------------------------


def _key_text(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _clean(text: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    return text or "output"


def output_names(out_spec: Any, count: int) -> list[str]:
    """Readable names for the flattened outputs: ``output`` for a lone tensor,
    ``output_0``... for a tuple, the keys (``logits``, ``pair_1``) for dicts."""
    pytree = torch.utils._pytree
    skeleton = pytree.tree_unflatten(list(range(count)), out_spec)
    paths = [path for path, _ in pytree.tree_flatten_with_path(skeleton)[0]]
    names = []
    for path in paths:
        parts = [_key_text(k) for k in path]
        if not parts:
            names.append("output")
        elif parts[0].isdigit():
            names.append(_clean("output_" + "_".join(parts)))
        else:
            names.append(_clean("_".join(parts)))
    return names


def bind_outputs(graph: ir.Graph, values: Sequence[Any], names: Sequence[str], recorder: Any) -> list[OutputSlot]:
    """Make the graph's outputs, named ``names``; an output that is an input, an
    initializer, a constant or another output gets an ``Identity`` of its own."""
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    intermediates = {out.name: out for node in graph for out in node.outputs if out.name}
    slots: list[OutputSlot] = []
    for value, wanted in zip(values, names, strict=True):
        if not isinstance(value, ir.Value):
            slots.append(OutputSlot(None, value))
            continue
        name = wanted
        while name in taken:
            name += "_out"
        taken.add(name)
        out = value
        producer = value.producer()
        reuse = (
            value.is_graph_input()
            or value.is_initializer()
            or value.is_graph_output()
            or producer is None
            or producer.op_type == "Constant"
        )
        if reuse:
            recorder.metadata = {}
            out = recorder.add_node("", "Identity", [value], [], 1, None).outputs[0]
            out.dtype, out.shape = value.dtype, value.shape
        clash = intermediates.get(name)
        if clash is not None and clash is not out:  # the output gets the name; the intermediate another
            clash.name = _fresh(f"{name}_", intermediates)
            intermediates[clash.name] = clash
        if intermediates.get(out.name) is out:
            del intermediates[out.name]  # its old name is free again
        intermediates[name] = out
        out.name = name
        graph.outputs.append(out)
        slots.append(OutputSlot(name))
    return slots


def _fresh(stem: str, taken: Mapping[str, Any]) -> str:
    index = 0
    while f"{stem}{index}" in taken:
        index += 1
    return f"{stem}{index}"


# -- one version per domain --------------------------------------------------------------


def settle_versions(uses: Sequence[Use], impls: Mapping[str, Impl], target: Target) -> dict[str, int]:
    """The version of every domain the model uses, checked against every emitter.

    ai.onnx is the target's version; nothing may come from a newer opset.
    A custom domain in the target takes the target's version, and an impl
    that emitted another version must declare a range that includes it. A
    domain the target does not name takes the one version its emitters used;
    two different versions are a conflict, reported with both emitters.
    """
    versions = {ONNX_DOMAIN: target.onnx}
    free: dict[str, dict[int, Use]] = {}
    for use in uses:
        if use.version is None:
            continue
        if use.domain == ONNX_DOMAIN:
            if use.version > target.onnx:
                raise OpsetConflictError(
                    f"{use.emitter} emitted {use.what} from ai.onnx opset {use.version}, but the target is "
                    f"ai.onnx {target.onnx}: the impl must declare opset={use.version} so the registry "
                    "skips it at older targets"
                )
            continue
        wanted = target.get(use.domain)
        if wanted is None:
            free.setdefault(use.domain, {}).setdefault(use.version, use)
            continue
        versions[use.domain] = wanted
        if use.version != wanted:
            impl = impls.get(use.emitter)
            declared = impl.requirement.domain_map.get(use.domain) if impl is not None else None
            if declared is None or wanted not in declared:
                raise OpsetConflictError(
                    f"{use.emitter} emitted {use.what} at {use.domain} version {use.version}, but the target "
                    f"has {use.domain}={wanted}: declare domains={{{use.domain!r}: {use.version}}} on the impl "
                    "so the registry matches it to targets with that version"
                )
    for domain, by_version in sorted(free.items()):
        if len(by_version) > 1:
            (v1, a), (v2, b) = sorted(by_version.items())[:2]
            raise OpsetConflictError(
                f"domain {domain} is needed at version {v1} by {a.emitter} ({a.what}) and at version {v2} "
                f"by {b.emitter} ({b.what}); a model has one version per domain. Name the version in the "
                f"target (e.g. target='onnx,{domain}={v2}') and declare it on the impls, or use impls that agree."
            )
        versions[domain] = next(iter(by_version))
    return versions


# -- the model -------------------------------------------------------------------------------


def build_model(
    graph: ir.Graph,
    functions: Mapping[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]],
    versions: Mapping[str, int],
    *,
    inline: bool | int,
    optimize: bool = True,
    metadata: Mapping[str, str],
    definitions: Mapping[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]] | None = None,
) -> ir.Model:
    from opreg import __version__

    model = ir.Model(graph, ir_version=MIN_IR_VERSION, producer_name="opreg", producer_version=__version__)
    definitions = dict(definitions or {})
    for key, (proto, _) in {**functions, **definitions}.items():
        function = ir.serde.deserialize_function(proto)
        function.opset_imports.clear()
        for opset in proto.opset_import:
            function.opset_imports[opset.domain] = versions.get(opset.domain, opset.version)
        for node in function:
            _strip_authoring_attributes(node)
        model.functions[key] = function
    for node in graph:
        _strip_authoring_attributes(node)

    if inline is not False and model.functions:
        # impls' script functions are inlined (all, or those of at most `inline` nodes);
        # embedded definitions of custom ops stay functions
        limit = None if inline is True else int(inline)

        def wanted(function: ir.Function) -> bool:
            return function.identifier() not in definitions and (limit is None or len(function) <= limit)

        common_passes.InlinePass(criteria=wanted)(model)
    common_passes.RemoveUnusedNodesPass()(model)
    common_passes.RemoveUnusedFunctionsPass()(model)
    _trim_optional_outputs(model.graph, versions)
    if optimize:
        from opreg.exporter._lean import lean

        lean(model)

    used = _used_domains(model)
    graph.opset_imports.clear()
    for domain in sorted(used | {ONNX_DOMAIN}):
        graph.opset_imports[domain] = versions.get(domain, 1)
    model.ir_version = max(
        MIN_IR_VERSION,
        onnx.helper.find_min_ir_version_for(
            [onnx.helper.make_opsetid(d, v) for d, v in graph.opset_imports.items()], ignore_unknown=True
        ),
    )
    model.metadata_props.update(metadata)
    return model


def custom_op_definitions(
    graph: ir.Graph,
    functions: Mapping[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]],
    provided: Sequence[tuple[str, Any]],
) -> dict[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]]:
    """The packs' function definitions (``opreg_functions``) of the custom ops used by
    ``graph`` or by the impls' functions it calls."""
    available: dict[tuple[str, str], tuple[onnx.FunctionProto, str]] = {}
    for pack, result in provided:
        for item in result or ():
            proto = item if isinstance(item, onnx.FunctionProto) else item.to_function_proto()
            available.setdefault((proto.domain, proto.name), (proto, pack))
    used = {(node.domain, node.op_type) for node in graph}
    for proto, _ in functions.values():
        used.update((node.domain, node.op_type) for node in proto.node)
    chosen: dict[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]] = {}
    for domain, op_type in sorted(used):
        if domain and (domain, op_type) in available:
            proto, pack = available[(domain, op_type)]
            chosen[(proto.domain, proto.name, proto.overload)] = (proto, pack)
    return chosen


def _trim_optional_outputs(graph: ir.Graph, versions: Mapping[str, int]) -> None:
    """Drop unused trailing optional outputs (MaxPool's Indices, LayerNormalization's
    Mean), so the runtime need not compute them."""
    for node in graph:
        if len(node.outputs) < 2 or node.domain not in versions:
            continue
        schema = _schema(node.op_type, versions[node.domain], node.domain)
        if schema is None or len(schema.outputs) != len(node.outputs):
            continue
        keep = len(node.outputs)
        while keep > 1:
            output, formal = node.outputs[keep - 1], schema.outputs[keep - 1]
            if (
                output.uses()
                or output.is_graph_output()
                or formal.option != onnx.defs.OpSchema.FormalParameterOption.Optional
            ):
                break
            keep -= 1
        if keep < len(node.outputs):
            node.resize_outputs(keep)


def _strip_authoring_attributes(node: ir.Node) -> None:
    for name in [n for n in node.attributes if n == OUTPUTS_KWARG or n.startswith("_")]:
        del node.attributes[name]


def _used_domains(model: ir.Model) -> set[str]:
    domains = set()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        domains.add(node.domain)
    for function in model.functions.values():
        domains.add(function.domain)
        for node in ir.traversal.RecursiveGraphIterator(function):
            domains.add(node.domain)
    return domains


def check(proto: onnx.ModelProto) -> None:
    """``onnx.checker.check_model(full_check=True)``; a failure is opreg's bug or a pack's."""
    if proto.ByteSize() > onnx.checker.MAXIMUM_PROTOBUF:
        return  # too large to check in memory; `save` checks the file instead
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ExportError(
            f"the exported model is not valid ONNX: {e}\nThis is a bug in opreg or in the pack whose impl "
            "made the node named in the message (see the node's opreg.pack metadata); please report it."
        ) from e


def describe_versions(versions: Mapping[str, int]) -> str:
    return ", ".join(f"{domain_label(d)}={v}" for d, v in sorted(versions.items()))
