"""Finishing: from a translated graph to a checked :class:`OnnxProgram`: build the pipeline, run it, check.

One version per domain (checked against every emitter), then a declared
pipeline of ``onnx_ir`` passes (:func:`pipeline`: the impls' script functions
kept or inlined, random nodes seeded, the lean pass, the packs' rewrites,
weights folded, unused functions and opsets dropped, the IR version the model
really needs, named outputs), then the check: the graph's structure, and
``onnx.checker.check_model(full_check=True)``. opreg's own passes live in
:mod:`opreg.exporter.passes`; the packs' rewrites are run by :mod:`opreg.exporter._rewrite`.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib.metadata
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import torch
from onnx_ir.passes import PassBase

from opreg.errors import ExportError, InvalidArgumentError, OpsetConflictError
from opreg.exporter import _capture, _older, _rewrite
from opreg.exporter._calls import Calls
from opreg.exporter._plan import JoinedDomain
from opreg.exporter._program import OnnxProgram, OutputSlot
from opreg.exporter._recorder import SMALL_CONSTANT, Use
from opreg.exporter._rewrite import REWRITES_KEY, Rewrite
from opreg.exporter._state import StateSlot
from opreg.exporter._translate import Translation
from opreg.exporter.diagnosis.run import Runner
from opreg.exporter.passes import lean
from opreg.exporter.passes.housekeeping import MIN_IR_VERSION, LowestIrVersion, StripAuthoringAttributes
from opreg.exporter.passes.opsets import LowestOpsets, RuntimeKernels
from opreg.exporter.passes.outputs import BindOutputs, OwnSubgraphOutputs, output_names
from opreg.exporter.passes.pipeline import IfModified, Pipeline
from opreg.exporter.passes.precision import ComputeInFloat32
from opreg.exporter.passes.seeding import SeedRandomNodes
from opreg.node_types import confirms
from opreg.packs import hookchecks, patching
from opreg.packs.host import PackHost
from opreg.packs.patching import PatchOutcome
from opreg.registry import runtimes
from opreg.registry.impls import Impl
from opreg.registry.targets import MIN_ONNX_OPSET, ONNX_DOMAIN, Target, onnx_opset_range
from opreg.settings import ExportSettings
from opreg.values import is_complex

logger = logging.getLogger(__name__)

DIM_BOUNDS_KEY = "opreg.dim_bounds"
"""Model ``metadata_props``: ``{dim name: [min, max]}`` (JSON) of the symbolic dims given a finite ``max``
(``torch.export.Dim(name, max=N)``); set before the rewrites, which may read it (a table sized by a length's bound)."""
JOINED_KEY = "opreg.joined_domains"
"""The custom domains the export added to its target (``domain=version (pack P: ops)``, ``; `` between)."""
MAX_CHECKED_BYTES = onnx.checker.MAXIMUM_PROTOBUF
"""A model larger than one protobuf holds (2 GB) is checked from its saved file instead."""


@functools.cache
def producer_version() -> str:
    """The model's ``producer_version``: the installed opreg distribution's version, read from its
    metadata (not from the ``opreg`` package above this module, which the exporter does not import)."""
    return importlib.metadata.version("opreg")


def finish(
    translation: Translation,
    settings: ExportSettings,
    *,
    exported_program: torch.export.ExportedProgram,
    module: torch.nn.Module | torch.export.ExportedProgram,
    target: Target,
    host: PackHost,
    input_leaves: Sequence[int],
    passes: Sequence[Rewrite] = (),
    dim_bounds: Mapping[str, Sequence[int]] | None = None,
    capture_patches: Sequence[PatchOutcome] = (),
    joined: Sequence[JoinedDomain] = (),
) -> OnnxProgram:
    """The model of ``translation``, finished as the export's ``settings`` say (``inline``,
    ``embed_functions``, ``optimize``, ``fold_weights``, ``rewrite``, ``seed``, ``strict``) and checked,
    as an :class:`OnnxProgram` (the rewrite rules ``host``'s packs give for ``target`` applied unless
    ``settings.rewrite`` is false, then the export's own ``passes``: see :func:`export_passes`; the
    capture patches applied and the custom domains the plan ``joined`` to the target in its metadata)."""
    recorder = translation.recorder
    graph, spec = translation.graph, exported_program.call_spec
    in_spec, out_spec, input_leaves = translation.call or (spec.in_spec, spec.out_spec, input_leaves)  # widened?
    names = output_names(
        out_spec, len(translation.outputs), taken={v.name for v in graph.inputs} | set(graph.initializers)
    )
    values = [v for v in translation.outputs if isinstance(v, ir.Value)]
    state = state_slots(translation, taken={v.name for v in graph.inputs} | set(graph.initializers) | set(names))
    values += [value for *_, value in translation.state]
    graph.outputs.extend(values)
    # where each output came from, for the Identity an output folded into a constant gets
    origins = [dict(v.producer().metadata_props) if v.producer() is not None else {} for v in values]
    versions = settle_versions(recorder.uses, translation.used_impls, target)
    definitions = {}
    if settings.embed_functions:
        definitions = custom_op_definitions(graph, recorder.functions, host.functions())
    rewrites = [*(_rewrite.collect(host.rewrite_rules(target)) if settings.rewrite else []), *passes]
    bound = [name for name, value in zip(names, translation.outputs, strict=True) if isinstance(value, ir.Value)]
    finishing = pipeline(
        weights=translation.weights,
        inline=settings.inline,
        kept=frozenset(definitions),
        optimize=settings.optimize,
        fold_weights=settings.fold_weights,
        rewrites=rewrites,
        target=target,
        seed=settings.seed,
        outputs=(bound + [slot.output for slot in state], origins),
        strict=settings.strict,
        keep_float32=_boundaries(translation) if settings.keep_float32 else None,
    )
    metadata = model_metadata(target, exported_program, module, joined, dim_bounds)
    model = build_model(graph, recorder.functions, versions, metadata=metadata, definitions=definitions)
    finishing(model)
    record_packs(model, {impl.pack for impl in translation.used_impls.values()}, capture_patches)
    slots = [
        OutputSlot(name, complex=is_complex(value)) if isinstance(value, ir.Value) else OutputSlot(None, value)
        for name, value in zip(names, translation.outputs, strict=True)
    ]
    return OnnxProgram(
        model,
        target=target,
        runner=Runner(host),
        exported_program=exported_program,
        calls=Calls(module, exported_program, in_spec, out_spec, input_leaves),
        input_names=translation.input_names,
        outputs=slots,
        checked=check(model),
        state=state,
        traces=translation.traces,
        capture_patches=capture_patches,
        joined_domains=joined,
    )


def _boundaries(translation: Translation) -> frozenset[str]:
    """The names of the values that are the results of the main graph's torch ops."""
    return frozenset(
        name
        for trace in translation.traces.values()
        for name in (*trace.names, *(v.name for v in trace.values if v is not None))
        if name
    )


def model_metadata(
    target: Target,
    exported_program: torch.export.ExportedProgram,
    module: Any,
    joined: Sequence[JoinedDomain],
    dim_bounds: Mapping[str, Sequence[int]] | None,
) -> dict[str, str]:
    """The model's ``metadata_props`` before the pipeline (the rewrites may read them): its target,
    the custom domains joined to it (:data:`JOINED_KEY`), the arguments captured as constants
    (:data:`CONSTANT_INPUTS_KEY`) and the symbolic dims' bounds (:data:`DIM_BOUNDS_KEY`)."""
    return {
        "opreg.target": str(target),
        **({JOINED_KEY: "; ".join(map(str, joined))} if joined else {}),
        **constants_metadata(exported_program, module),
        **({DIM_BOUNDS_KEY: json.dumps(dim_bounds)} if dim_bounds else {}),
    }


def record_packs(model: ir.Model, packs: set[str], capture_patches: Sequence[PatchOutcome]) -> None:
    """The model's ``opreg.packs``: every pack that made it (``packs``, whose impls it uses, those
    whose rewrites fired, those whose capture patches applied), and the capture patches' metadata."""
    fired = model.metadata_props.get(REWRITES_KEY, "")
    packs.update(item.split(":", 1)[0] for item in fired.split(",") if item)
    applied = patching.metadata(capture_patches)
    if applied is not None:
        model.metadata_props[patching.METADATA_KEY] = applied
        packs.update(o.pack for o in capture_patches if o.status == patching.APPLIED)
    model.metadata_props["opreg.packs"] = ",".join(sorted(packs))


def state_slots(translation: Translation, taken: set[str]) -> list[StateSlot]:
    """A slot per piece of state exported as an input/output pair, its output named
    ``<input>_out`` (``_out`` repeated while the name is taken)."""
    slots = []
    for kind, key, input_name, _ in translation.state:
        output = f"{input_name}_out"
        while output in taken:
            output += "_out"
        taken.add(output)
        slots.append(StateSlot(kind, key, input_name, output))
    return slots


EXPORT_PASSES = "export"
"""What the rewrites given to ``opreg.export(passes=...)`` are recorded under (``export:<name>``)."""


def export_passes(passes: Any) -> list[Rewrite]:
    """``opreg.export``'s ``passes`` as rewrites applied after the packs'; an
    :class:`InvalidArgumentError` naming an item that is not a pass or rule."""
    if isinstance(passes, (str, bytes)) or not isinstance(passes, Iterable):
        raise InvalidArgumentError(f"passes must be a list of onnx_ir passes or rewrite rules, got {passes!r}")
    try:
        checked = hookchecks.rewrites_of(list(passes))  # what a pack's opreg_rewrite_rules is held to
    except ValueError as e:
        raise InvalidArgumentError(f"passes: {str(e).removeprefix('returned ')}") from None
    return [Rewrite(EXPORT_PASSES, item, names, asked=True) for item, names in checked]


CONSTANT_INPUTS_KEY = "opreg.constant_inputs"
"""Model ``metadata_props``: the arguments ``torch.export`` made constants of the capture, as a JSON
object ``{argument: value}``, the argument as Python spells it (``scale``, ``cfg['flag']``), an enum
member as ``Class.MEMBER``, another value JSON lacks as its ``repr``."""


def constants_metadata(program: torch.export.ExportedProgram, module: Any = None) -> dict[str, str]:
    """The model's :data:`CONSTANT_INPUTS_KEY` entry (none when every argument is a tensor)."""
    constants = {name: _jsonable(value) for name, value in _capture.constant_inputs(program, module).values()}
    return {CONSTANT_INPUTS_KEY: json.dumps(constants)} if constants else {}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


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
    below: dict[str, list[Use]] = {}  # ops read at an older ai.onnx than emitted, whose schema differs there
    for use in uses:
        if use.version is None:
            continue
        if use.domain == ONNX_DOMAIN:
            if use.version > max(target.onnx, MIN_ONNX_OPSET):  # newer than any impl may hide from its declaration
                raise OpsetConflictError(
                    f"{use.emitter} emitted {use.what} from ai.onnx opset {use.version}, but the target is "
                    f"ai.onnx {target.onnx}: the impl must declare opset={use.version} so the registry "
                    "skips it at older targets"
                )
            if use.version > target.onnx and not _older.reaches(use, target.onnx):  # 16, 17: by schema
                below.setdefault(use.what, []).append(use)
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
    if below:
        raise OpsetConflictError(_older.refusal(below, target.onnx))
    return versions


# -- the model -------------------------------------------------------------------------------


def build_model(
    graph: ir.Graph,
    functions: Mapping[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]],
    versions: Mapping[str, int],
    *,
    metadata: Mapping[str, str],
    definitions: Mapping[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]] | None = None,
) -> ir.Model:
    """The model of ``graph``, its functions and embedded ``definitions`` added, every domain
    imported at ``versions`` (the passes read them, then drop the unused), ``metadata`` set (the
    rewrites may read it), for the :func:`pipeline` of the export's options to finish."""
    model = ir.Model(graph, ir_version=MIN_IR_VERSION, producer_name="opreg", producer_version=producer_version())
    model.metadata_props.update(metadata)
    graph.opset_imports.clear()
    graph.opset_imports.update(versions)
    for key, (proto, _) in {**functions, **(definitions or {})}.items():
        function = ir.serde.deserialize_function(proto)
        authored = {opset.domain: opset.version for opset in proto.opset_import}
        for node in ir.traversal.RecursiveGraphIterator(function):  # the version it was written against,
            node.version = node.version or authored.get(node.domain)  # which inlining keeps: the floor reads it
        function.opset_imports.clear()
        for opset in proto.opset_import:
            function.opset_imports[opset.domain] = versions.get(opset.domain, opset.version)
        model.functions[key] = function
    return model


def pipeline(
    *,
    weights: frozenset[str],
    inline: bool | int = True,
    kept: frozenset[ir.OperatorIdentifier] = frozenset(),
    optimize: bool = True,
    fold_weights: bool = True,
    rewrites: Sequence[Rewrite] = (),
    target: Target | None = None,
    seed: int | None = None,
    outputs: tuple[Sequence[str], Sequence[Mapping[str, str]]] | None = None,
    strict: bool = False,
    keep_float32: frozenset[str] | None = None,
) -> Pipeline:
    """The finishing passes for these options, in order (``pipeline(...).describe()`` lists them).

    Script functions are inlined (all, or those of at most ``inline`` nodes; never the
    ``kept`` custom-op definitions), random nodes seeded (``seed``), the lean pass runs
    (``optimize``; else unused nodes go), weights read through a Transpose stored
    transposed (``optimize`` and ``fold_weights``; before the rewrites, so that ONNX Runtime's
    target multiplies by the stored-transposed weight with ``MatMul``, measured faster in a
    language model's decode step than ``FusedMatMul(transB=1)``, which a weight the fold leaves
    alone still gets), then the packs' ``rewrites`` (which ``target`` gates), the lean pass
    again if they fired, a residual ``Add`` read by a LayerNormalization written as ``Sum``
    (``optimize``: :class:`opreg.exporter.passes.lean.ResidualSums`), the bfloat16 nodes ONNX
    Runtime has no kernel for computed in float32 (``keep_float32``), unused functions, subgraph
    outputs owned by their subgraph, unused opsets dropped, each opset lowered to the version the
    nodes need (unless ``target`` pins its ai.onnx version: :mod:`opreg.exporter.passes.opsets`),
    the lowest IR version the opsets and types allow, and the outputs named (``outputs``).

    ``weights``: the initializers that are the model's ``state_dict`` entries, never folded.
    ``keep_float32``: the names of the values that are torch ops' results (each rounded to
    bfloat16 where the nodes around it compute in float32), ``None`` for no such pass.
    ``outputs``: the names of the graph's outputs and the provenance of the nodes that made them
    (see :class:`BindOutputs`). ``rewrites`` without a ``target`` is a ``ValueError``."""
    passes: list[PassBase] = [StripAuthoringAttributes()]
    if inline is not False:
        limit = None if inline is True else int(inline)

        def wanted(function: ir.Function) -> bool:
            return function.identifier() not in kept and (limit is None or len(function) <= limit)

        passes.append(common_passes.InlinePass(criteria=wanted))
    if seed is not None:
        passes.append(SeedRandomNodes(seed))
    if optimize:
        passes.append(Pipeline("lean", lean.lean_passes(weights, fold_weights=fold_weights)))
    else:  # unused nodes, and unused trailing optional outputs (MaxPool's Indices): the runtime need not compute them
        passes.append(common_passes.RemoveUnusedNodesPass())
    if optimize and fold_weights:  # before the rewrites: they see MatMul on the stored-transposed weight
        passes.append(lean.FoldWeightTransposes(weights))
    if rewrites:
        if target is None:
            raise ValueError("rewrites need the target that gates them")
        again: PassBase = (
            Pipeline("lean again", lean.lean_passes(weights, fold_weights=False))
            if optimize
            else common_passes.RemoveUnusedNodesPass()
        )
        passes.append(IfModified(_rewrite.passes(rewrites, target, strict), again, "packs' rewrites"))
    if optimize:  # after the packs' rewrites: a pack's fusion of Add + LayerNormalization still sees the Add
        passes.append(lean.ResidualSums())
    if keep_float32 is not None:  # last of the graph's changes: the nodes it casts are the ones the model keeps
        passes.append(ComputeInFloat32(keep_float32))
    passes += [
        common_passes.RemoveUnusedFunctionsPass(),
        OwnSubgraphOutputs(),
        common_passes.RemoveUnusedOpsetsPass(),
        *([LowestOpsets(onnx_opset_range()[0])] if target is not None and not target.pinned else []),
        *([RuntimeKernels(runtimes.release(target.runtime))] if target is not None and target.runtime else []),
        LowestIrVersion(),
    ]
    if outputs is not None:
        passes.append(BindOutputs(*outputs))
    finishing = Pipeline("finish", passes)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("finishing pipeline:\n  %s", "\n  ".join(finishing.describe()))
    return finishing


def custom_op_definitions(
    graph: ir.Graph,
    functions: Mapping[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]],
    provided: Sequence[tuple[str, Any]],
) -> dict[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]]:
    """The packs' function definitions (``opreg_functions``) of the custom ops used by
    ``graph`` or by the impls' functions it calls."""
    available: dict[tuple[str, str], tuple[onnx.FunctionProto, str]] = {}
    for pack, protos in provided:  # checked by the hook's contract: FunctionProtos with a domain
        for proto in protos:
            available.setdefault((proto.domain, proto.name), (proto, pack))
    used = {(node.domain, node.op_type) for node in ir.traversal.RecursiveGraphIterator(graph)}
    for proto, _ in functions.values():
        used.update((node.domain, node.op_type) for node in proto.node)
    chosen: dict[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]] = {}
    for domain, op_type in sorted(used):
        if domain and (domain, op_type) in available:
            proto, pack = available[(domain, op_type)]
            chosen[(proto.domain, proto.name, proto.overload)] = (proto, pack)
    return chosen


WEIGHT_ELEMENTS = 1024
"""An initializer of more elements than this is a weight, not a shape or index table that ONNX's
shape inference reads (those hold a few numbers): :func:`check` declares it as a graph input."""


def check(model: ir.Model, full: bool | None = None) -> bool:
    """Check the model: its structure always (every node reads only values defined before it,
    every output is defined), and ``onnx.checker.check_model(full_check=True)`` where the graph
    is not already known valid (``full=None``: :func:`known_valid`; ``True`` always, ``False``
    never). A failure is opreg's bug or a pack's.

    The checker sees the weights as graph inputs of their dtype and shape (:func:`_weights_as_inputs`):
    what it checks of a node is the same, and no copy of the weights is made for it, so the
    export's peak memory is not raised by it, nor is a model of more than 2 GB of weights left
    unchecked. Returns whether the model is known valid (a graph that alone does not fit one
    protobuf is checked from its file when saved)."""
    problem = _rewrite.graph_problem(model)
    if problem is not None:
        raise ExportError(f"the exported model is not valid ONNX: it {problem[1]}; opreg's bug, please report it")
    if full is None:
        full = not known_valid(model)
    if not full:
        return True
    with _weights_as_inputs(model.graph):
        data = ir.serde.serialize_model(model).SerializeToString()  # the checker takes bytes: serialise once
    if len(data) > MAX_CHECKED_BYTES:
        return False
    try:
        onnx.checker.check_model(data, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        made = _made_by(model, str(e))
        if made:
            raise ExportError(f"the exported model is not valid ONNX: {e}\n{made}") from e
        raise ExportError(
            f"the exported model is not valid ONNX: {e}\nThis is a bug in opreg or in the pack whose impl "
            "made the node named in the message (see the node's opreg.pack metadata); please report it."
        ) from e
    return True


def known_valid(model: ir.Model) -> bool:
    """Whether the whole-model check would find nothing, as ONNX confirms node by node: the model has
    no functions and no subgraphs, every node's domain is imported, every value name is given once,
    every graph input and output is typed, and ONNX confirms every node as it stands, its outputs
    typed as its inference computes (:func:`opreg.node_types.confirms`). Those confirmations were
    made as the nodes were recorded and are remembered by what determines them, so only a node the
    passes made or changed (an input folded into a constant, a rule's replacement) costs a check
    and an inference; where one is not confirmed, or disagrees with the type its output carries (an
    impl's rank wrong once its computed axes are folded), the full check runs and says what it finds."""
    if model.functions:
        return False
    graph = model.graph
    imports = graph.opset_imports
    if any(value.dtype is None for value in (*graph.inputs, *graph.outputs)):
        return False
    names = {value.name for value in graph.inputs}
    names.update(graph.initializers)
    if len(names) != len(graph.inputs) + len(graph.initializers):
        return False
    for node in graph:
        version = imports.get(node.domain)
        if version is None or any(
            attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values()
        ):
            return False
        if not confirms(node, version, SMALL_CONSTANT):
            return False
        for output in node.outputs:
            if output.name in names:
                return False
            names.add(output.name)
    return True


@contextlib.contextmanager
def _weights_as_inputs(graph: ir.Graph) -> Iterator[None]:
    """For the ``with`` block, declare ``graph``'s weights (initializers of more than
    :data:`WEIGHT_ELEMENTS` elements whose value has the tensor's dtype and shape) as graph inputs
    instead of initializers: each node reads a value of the same type and shape, and serializing
    the graph copies no weight. The graph is put back as it was, initializers in their order."""
    initializers = list(graph.initializers.values())
    weights = [
        v
        for v in initializers
        if v.const_value is not None
        and v.const_value.size > WEIGHT_ELEMENTS
        and v.dtype == v.const_value.dtype
        and v.shape == v.const_value.shape
        and not v.is_graph_input()
    ]
    if not weights:
        yield
        return
    for value in weights:
        graph.initializers.pop(value.name)
        graph.inputs.append(value)
    try:
        yield
    finally:
        for _ in weights:
            graph.inputs.pop()  # pop, not del: onnx_ir then unmarks the value as an input
        graph.initializers.clear()
        for value in initializers:
            graph.initializers.add(value)


_NODE_NAME = re.compile(r"node name: ([^)\s]+)\)")


def _made_by(model: ir.Model, message: str) -> str:
    """Who made the nodes the checker's ``message`` names: their impl (or rewrite rule), torch op and
    where in the model, from their provenance (``""`` when it names none)."""
    from opreg.exporter._nodes import read_provenance

    names = set(_NODE_NAME.findall(message))
    lines = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.name not in names:
            continue
        props = read_provenance(node)
        rule = props.get("rewrite")
        maker = f"rewrite rule {rule}" if rule else f"impl {props.get('pack', '?')}:{props.get('impl', '?')}"
        where = " at ".join(p for p in (props.get("module") or "<root>", props.get("source", "")) if p)
        lines.append(
            f"node {node.name} was made by {maker} for {props.get('torch_op', '?')} ({where}): fix it there, "
            "or report it to its pack"
        )
    return "\n".join(lines)
