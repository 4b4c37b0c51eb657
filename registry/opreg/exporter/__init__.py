"""opreg's exporter (DESIGN.md §5): capture, decompose, check coverage,
translate through the registry, finish.

``opreg.export`` is the entry point; this package imports torch, so
``import opreg`` reaches it only when ``opreg.export`` is first called.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import onnx
import torch

from opreg.exporter import _capture, _finish, _translate
from opreg.exporter._program import OnnxProgram, OutputCheck, Verification
from opreg.exporter._translate import PROVENANCE_KEYS, SKIPPED_OPS, MissingOp
from opreg.plugins import default_registry
from opreg.registry import Registry
from opreg.targets import TargetLike

logger = logging.getLogger(__name__)

STAGES = ("capture", "decompose", "coverage", "translate", "finish")
"""The export stages, in order, as reported to a ``progress`` callback."""

__all__ = [
    "PROVENANCE_KEYS",
    "SKIPPED_OPS",
    "STAGES",
    "MissingOp",
    "OnnxProgram",
    "OutputCheck",
    "Verification",
    "export",
    "plan_export",
]


def _registry(registry: Registry | None, plugins: Iterable[str] | None, exclude: Iterable[str] | None) -> Registry:
    if registry is not None:
        if plugins is not None or exclude is not None:
            raise ValueError("pass either registry= or plugins=/exclude=, not both")
        return registry
    return default_registry(plugins=plugins, exclude=exclude)


def plan_export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    target: TargetLike = "onnx",
    dynamic_shapes: Any = None,
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    registry: Registry | None = None,
) -> list[MissingOp]:
    """Capture and decompose ``model`` and return every op no impl covers at ``target``
    (``[]`` when the model can be exported). What ``opreg check`` prints."""
    from opreg.errors import UnsupportedOpsError

    reg = _registry(registry, plugins, exclude)
    resolved = reg.target(target)
    program = _capture.decompose(_capture.capture(model, args, kwargs, dynamic_shapes), reg, resolved)
    try:
        _translate.plan(program.graph, reg, resolved)
    except UnsupportedOpsError as e:
        return list(e.missing)
    return []


def export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    target: TargetLike = "onnx",
    dynamic_shapes: Any = None,
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    registry: Registry | None = None,
    inline: bool | int = True,
    embed_functions: bool = False,
    optimize: bool = True,
    progress: Callable[[str], None] | None = None,
) -> OnnxProgram:
    """Export ``model`` to ONNX through the registry.

    Args:
        model: the ``torch.nn.Module`` (put it in ``eval()`` mode first if it
            has dropout or batch norm), or a ``torch.export.ExportedProgram``
            already captured (then ``args``, ``kwargs`` and ``dynamic_shapes``
            are not needed, and its symbolic dims keep torch's names).
        args, kwargs: example inputs, as ``model(*args, **kwargs)`` takes them.
        target: what the model must run on: a profile name (``"onnx"``,
            ``"onnxruntime"``), an ai.onnx version, a ``{domain: version}``
            dict, or a :class:`opreg.Target`.
        dynamic_shapes: as ``torch.export.export`` takes them; the names of
            ``torch.export.Dim``s become the ONNX dim names.
        plugins, exclude: which installed packs to use (see
            :func:`opreg.default_registry`).
        registry: a registry to use instead (e.g. a ``default_registry().copy()``
            with your own impls registered); excludes ``plugins``/``exclude``.
        inline: inline impls written as script functions (default); ``False``
            keeps them as model-local ONNX functions; an int N inlines those of
            at most N nodes and keeps the rest.
        embed_functions: add the packs' ONNX function definitions
            (``opreg_functions``) of the custom-domain ops the model uses, so
            runtimes without the packs' kernels can run it.
        optimize: fold constants (never the weights), remove no-op and
            duplicate nodes, and turn constants into initializers (default);
            ``False`` keeps every node the impls emitted.
        progress: called with each stage's name (:data:`STAGES`) as it starts.

    Raises:
        UnsupportedOpsError: some ops have no impl for the target; lists all.
        OpsetConflictError: impls need incompatible versions of one domain.
        ExportError: capture, translation or validation failed.
    """
    reg = _registry(registry, plugins, exclude)
    resolved = reg.target(target)
    tick = _Ticker(progress)
    args = args if isinstance(args, tuple) else (args,)

    tick("capture")
    captured = _capture.capture(model, args, kwargs, dynamic_shapes)
    tick("decompose")
    program = _capture.decompose(captured, reg, resolved)
    tick("coverage")
    calls = _translate.plan(program.graph, reg, resolved)
    tick("translate")
    symbols = {}
    if isinstance(model, torch.nn.Module):
        symbols = _capture.dim_names(model, args, kwargs, program, dynamic_shapes)
    else:
        model = captured.module()
    translator = _translate.Translator(program, calls, resolved, symbols)
    translator.run()
    tick("finish")
    graph = translator.graph
    names = _finish.output_names(program.call_spec.out_spec, len(translator.user_outputs))
    slots = _finish.bind_outputs(graph, translator.user_outputs, names, translator.recorder)
    versions = _finish.settle_versions(translator.recorder.uses, translator.used_impls, resolved)
    packs = sorted({impl.pack for impl in translator.used_impls.values()})
    definitions = {}
    if embed_functions:
        definitions = _finish.custom_op_definitions(
            graph, translator.recorder.functions, reg.call_hook("opreg_functions")
        )
    onnx_model = _finish.build_model(
        graph,
        translator.recorder.functions,
        versions,
        inline=inline,
        optimize=optimize,
        metadata={"opreg.target": str(resolved), "opreg.packs": ",".join(packs)},
        definitions=definitions,
    )
    result = OnnxProgram(
        onnx_model,
        target=resolved,
        registry=reg,
        exported_program=program,
        module=model,
        input_names=translator.input_names,
        input_leaves=_input_leaves(program),
        outputs=slots,
        in_spec=program.call_spec.in_spec,
        out_spec=program.call_spec.out_spec,
        checked=False,
    )
    proto = result.model_proto
    _finish.check(proto)
    result._checked = proto.ByteSize() <= onnx.checker.MAXIMUM_PROTOBUF
    tick.done()
    return result


def _input_leaves(program: torch.export.ExportedProgram) -> list[int]:
    """Which leaves of the flattened ``(args, kwargs)`` are the ONNX inputs, in order."""
    from torch.export.graph_signature import InputKind, TensorArgument

    user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return [i for i, spec in enumerate(user) if isinstance(spec.arg, TensorArgument)]


class _Ticker:
    """Reports stages to ``progress`` and logs their durations."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.progress = progress
        self.stage: str | None = None
        self.started = time.perf_counter()

    def __call__(self, stage: str) -> None:
        self.done()
        self.stage = stage
        self.started = time.perf_counter()
        if self.progress is not None:
            self.progress(stage)

    def done(self) -> None:
        if self.stage is not None:
            logger.info("%s took %.3f s", self.stage, time.perf_counter() - self.started)
        self.stage = None
