"""opreg's exporter (DESIGN.md §5), a pipeline of stages whose imports run one way:
capture -> decompose -> plan -> translate -> finish -> program.

``opreg.export`` is the entry point; this package imports torch, so
``import opreg`` reaches it only when ``opreg.export`` is first called.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from opreg.errors import InvalidArgumentError, UnsupportedOpsError
from opreg.exporter import _capture, _decompose, _finish, _plan, _translate
from opreg.exporter._nodes import PROVENANCE_KEYS, SKIPPED_OPS
from opreg.exporter._plan import MissingOp
from opreg.exporter._program import OnnxProgram, OutputCheck, Verification
from opreg.plugins import default_registry
from opreg.registry import Registry
from opreg.targets import Target, TargetLike

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
        if not isinstance(registry, Registry):
            raise InvalidArgumentError(
                f"registry= takes an opreg.Registry (e.g. opreg.default_registry().copy()), got "
                f"{type(registry).__name__} {registry!r}; to choose packs by name use plugins=[...]"
            )
        if plugins is not None or exclude is not None:
            raise InvalidArgumentError("pass either registry= or plugins=/exclude=, not both")
        return registry
    return default_registry(plugins=plugins, exclude=exclude)


def _prepare(
    model: Any, args: Any, kwargs: Any, target: TargetLike, dynamic_shapes: Any, registry: Registry
) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram, Target]:
    """Capture and decompose: the captured and the decomposed programs, and the target."""
    resolved = registry.target(target)
    captured = _capture.capture(model, args, kwargs, dynamic_shapes)
    return captured, _decompose.decompose(captured, registry, resolved), resolved


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
    """Capture and decompose ``model`` and return every op no impl covers at ``target``,
    in the main graph and in every subgraph (``[]`` when the model can be exported).
    What ``opreg check`` prints."""
    reg = _registry(registry, plugins, exclude)
    _, program, resolved = _prepare(model, _as_tuple(args), kwargs, target, dynamic_shapes, reg)
    try:
        _plan.plan(program.graph, reg, resolved)
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
    fold_weights: bool = True,
    rewrite: bool = True,
    seed: int | None = None,
    passes: Iterable[Any] = (),
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
        optimize: fold constants (weights only as ``fold_weights`` says), remove no-op and
            duplicate nodes, and turn constants into initializers (default);
            ``False`` keeps every node the impls emitted.
        fold_weights: with ``optimize``, fold batch norm into the convolution
            (or Gemm) before it, and store a weight read only through a
            Transpose transposed; the folded weight keeps the replaced weight's
            name and the model's ``opreg.folded_weights`` metadata says how each
            folded tensor was computed (default). ``False`` keeps every
            initializer exactly as the ``state_dict`` has it.
        rewrite: apply the graph-level rewrites the packs contribute for
            ``target`` (``opreg_rewrite_rules``: fused kernels for patterns that
            span several ops) after the lean pass (default); ``False`` leaves
            them out.
        seed: give every random node (RandomNormal, RandomUniform and their
            ``Like`` forms, Bernoulli, Multinomial, Dropout) a ``seed``
            attribute: ``seed``, ``seed + 1``, ... in graph order. Each
            session of the model then draws the same numbers, run after run;
            ``None`` (default) leaves them unseeded: ONNX Runtime seeds them
            from its process-wide seed (``onnxruntime.set_seed``).
        passes: more graph rewrites to apply after the packs' (``onnx_ir`` passes that
            change the model in place, onnxscript rewrite rules or rule sets), each
            recorded as ``export:<name>`` like a pack's rewrite and gated by the target
            the same way (e.g. ``opreg_ort_contrib.MatMulNBitsQuantization(bits=4)``,
            which quantizes the float weights of linear layers). They run even with
            ``rewrite=False``.
        progress: called with each stage's name (:data:`STAGES`) as it starts.

    Raises:
        UnsupportedOpsError: some ops have no impl for the target; lists all.
        OpsetConflictError: impls need incompatible versions of one domain.
        ExportError: capture, translation or validation failed.
    """
    reg = _registry(registry, plugins, exclude)
    extra = _finish.export_passes(passes)
    tick = _Ticker(progress)
    args = _as_tuple(args)
    tick("capture")
    resolved = reg.target(target)
    captured = _capture.capture(model, args, kwargs, dynamic_shapes)
    tick("decompose")
    program = _decompose.decompose(captured, reg, resolved)
    tick("coverage")
    plan = _plan.plan(program.graph, reg, resolved)
    tick("translate")
    symbols: dict[str, str] = {}
    eager = captured  # what verify() compares with: an ExportedProgram's module is made when first needed
    if isinstance(model, torch.nn.Module):
        symbols = _capture.dim_names(model, args, kwargs, program, dynamic_shapes)
        eager = model
    translation = _translate.Translator(program, plan, resolved, symbols).run()
    tick("finish")
    result = _finish.finish(
        translation, exported_program=program, module=eager, target=resolved, registry=reg,
        input_leaves=_capture.input_leaves(program), inline=inline, embed_functions=embed_functions,
        optimize=optimize, fold_weights=fold_weights, rewrite=rewrite, seed=seed, passes=extra,
        dim_bounds=_capture.dim_bounds(program, symbols),
    )  # fmt: skip
    tick.done()
    return result


def _as_tuple(args: Any) -> tuple:
    return args if isinstance(args, tuple) else (args,)


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
