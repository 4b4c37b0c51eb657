"""opreg's exporter (docs/design.md, "An export"), a pipeline of stages whose imports run one way:
capture -> decompose -> plan -> translate -> finish -> program.

``opreg.export`` is the entry point; this package imports torch, so
``import opreg`` reaches it only when ``opreg.export`` is first called.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from opreg import _heap
from opreg.errors import InvalidArgumentError, UnsupportedOpsError, WeightsError
from opreg.exporter import _capture, _dynamic, _finish, _plan, _state, _torch_args, _translate
from opreg.exporter._grown import GrownDim
from opreg.exporter._narrowing import FixedDim, ShapeGuard
from opreg.exporter._nodes import PROVENANCE_KEYS, SKIPPED_OPS
from opreg.exporter._plan import JoinedDomain, MissingOp
from opreg.exporter._program import OnnxProgram
from opreg.exporter._state import StateSlot
from opreg.exporter.diagnosis.compare import OutputCheck, Verification
from opreg.exporter.diagnosis.report import Divergence, Location, Step
from opreg.packs import packfaults
from opreg.packs.patching import PatchedCapture
from opreg.packs.plugins import Loaded, of_settings
from opreg.settings import ExportSettings, describe, takes_settings

logger = logging.getLogger(__name__)

STAGES = ("capture", "plan", "translate", "finish")
"""The export stages, in order, as reported to a ``progress`` callback."""

__all__ = [
    "PROVENANCE_KEYS",
    "SKIPPED_OPS",
    "STAGES",
    "Divergence",
    "FixedDim",
    "GrownDim",
    "ShapeGuard",
    "JoinedDomain",
    "Location",
    "MissingOp",
    "OnnxProgram",
    "OutputCheck",
    "StateSlot",
    "Step",
    "Verification",
    "export",
    "plan_export",
    "run_export",
]


def _patches(model: Any, packs: Loaded, settings: ExportSettings) -> PatchedCapture | None:
    """The capture patches for ``model``: the registry's own and those the host's packs offer (``None``
    for an ``ExportedProgram``: it is already captured)."""
    if isinstance(model, torch.export.ExportedProgram):
        return None
    return PatchedCapture.of(
        packs.host, packs.registry.capture_patches(), enabled=settings.patches, exclude=settings.exclude_patches
    )


def faults_reported(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (an export) with the packs' faults it met (:mod:`opreg.packs.packfaults`) reported: a
    :class:`opreg.PackWarning` each (also when it raises), and on an :class:`OnnxProgram` result
    its ``pack_faults`` and the model's ``opreg.pack_faults`` metadata."""

    @functools.wraps(function)
    def reporting(*args: Any, **kwargs: Any) -> Any:
        with packfaults.collecting() as faults:
            try:
                result = function(*args, **kwargs)
            finally:
                packfaults.warn(faults)
        if isinstance(result, OnnxProgram) and faults:
            result.pack_faults = tuple(faults)
            result.model.metadata_props[packfaults.METADATA_KEY] = packfaults.metadata(faults) or ""
        return result

    return reporting


@_heap.quiet()
@faults_reported
@takes_settings()
def plan_export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    settings: ExportSettings | None = None,
    **options: Any,
) -> list[MissingOp]:
    """Capture (with the packs' capture patches, as :func:`export` does) and plan ``model``
    (decomposing it where needed) and return every op no impl covers at the target, in the main
    graph and in every subgraph (``[]`` when the model can be exported). What ``opreg check`` prints.

    It takes :func:`export`'s keyword options (:class:`opreg.ExportSettings`); those that act after
    the plan (``inline``, ``optimize``, ``passes``, ``progress``, ...) are checked and not used."""
    args = _check_inputs(model, args, kwargs)
    settings = ExportSettings.of(settings, options, "plan_export")
    packs = of_settings(settings)
    reg = packs.registry
    resolved = reg.target(settings.target)
    patched = _patches(model, packs, settings)
    shapes = _torch_args.dynamic_shapes(model, args, kwargs, settings)
    with _capture.fake_weights(model) if isinstance(model, torch.nn.Module) else contextlib.nullcontext():
        captured = _dynamic.capture(model, args, kwargs, shapes, patched).program  # a meta model needs no weights
    try:
        _plan.prepare(captured, reg, resolved)
    except UnsupportedOpsError as e:
        return list(e.missing)
    return []


@_heap.quiet()
@faults_reported
@takes_settings()
def export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    settings: ExportSettings | None = None,
    **options: Any,
) -> OnnxProgram:
    """Export ``model`` (a ``torch.nn.Module``, or a ``torch.export.ExportedProgram`` already
    captured) called with the example inputs ``args`` and ``kwargs`` to ONNX through the registry:
    capture, plan, translate, finish (docs/exporting.md).

    The keyword options are the fields of :class:`opreg.ExportSettings`; ``settings=`` takes them
    prebuilt (keywords given beside it replace its fields). docs/exporting.md's "Keyword options"
    says what each does, its "Errors" what is raised, and its "Threads" and "Garbage collection"
    what an export does to the process.
    """
    args = _check_inputs(model, args, kwargs)
    return run_export(model, args, kwargs, ExportSettings.of(settings, options, "opreg.export"))


Rework = Callable[[_translate.Translation, torch.export.ExportedProgram], _translate.Translation]
"""A step between translation and finishing: takes the translation and the captured program,
returns the translation to finish (see :func:`run_export`)."""


@_heap.quiet()
def run_export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    settings: ExportSettings,
    *,
    rework: Rework | None = None,
) -> OnnxProgram:
    """:func:`export`'s stages for inputs and settings already checked; ``rework``, if given,
    changes the translation before it is finished (``opreg.llm`` repeats a decoder's layers
    there). Its name is not in :data:`STAGES`: it runs inside "translate"."""
    lazy = _lazy_weights(model, settings.weights)
    shapes = _torch_args.dynamic_shapes(model, args, kwargs, settings)
    packs = of_settings(settings)
    reg = packs.registry
    extra = _finish.export_passes(settings.passes)
    tick = _Ticker(settings.progress)
    tick("capture")
    resolved = reg.target(settings.target)
    patched = _patches(model, packs, settings)
    _heap.settle()  # the modules imported and the registry outlive the export
    with _capture.fake_weights(model) if lazy else contextlib.nullcontext():
        capture = _dynamic.capture(model, args, kwargs, shapes, patched)
    captured = capture.program
    _heap.settle()  # so does the captured program
    tick("plan")
    program, plan = _plan.prepare(captured, reg, resolved)  # decomposed where needed
    _state.check(program, settings.state, _model_name(model))
    tick("translate")
    symbols: dict[str, str] = {}
    eager = captured  # what verify() compares with: an ExportedProgram's module is made when first needed
    if isinstance(model, torch.nn.Module):
        symbols = _capture.dim_names(model, args, kwargs, program, capture.dynamic_shapes)
        eager = model
    resolved = plan.target or resolved  # with the custom domains the plan added (plan.joined)
    translation = _translate.Translator(
        program, plan, resolved, symbols, state_io=settings.state == "io", lazy_weights=lazy
    ).run()
    if rework is not None:
        translation = rework(translation, program)
    tick("finish")
    result = _finish.finish(
        translation, settings, exported_program=program, module=eager, target=resolved, host=packs.host,
        joined=plan.joined, input_leaves=_capture.input_leaves(program), passes=extra,
        dim_bounds=_capture.dim_bounds(program, symbols),
        capture_patches=patched.outcomes if patched is not None else (),
    )  # fmt: skip
    tick.done()
    result.exporter = functools.partial(export, registry=reg, host=packs.host)  # locate() exports bodies with it
    result.streamed = bool(lazy)
    _dynamic.record(result, capture)
    _torch_args.rename(result, settings.input_names, settings.output_names)
    return result


def _lazy_weights(model: Any, weights: Any) -> dict[str, Any]:
    """The lazy value of each of ``model``'s ``meta``-device tensors from ``weights``
    (:func:`opreg.weights.bind`); ``{}`` for a model without any."""
    on_meta = isinstance(model, torch.nn.Module) and any(
        t.device.type == "meta" for t in (*model.parameters(), *model.buffers())
    )
    if weights is None:
        if on_meta:
            raise WeightsError(
                f"{type(model).__name__} has parameters or buffers on the meta device, which hold no values: pass "
                "weights= (a safetensors file or folder, or a mapping of names to tensors) to read them from"
            )
        return {}
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError("weights= takes the values of a torch.nn.Module's meta-device tensors")
    from opreg import weights as lazy_weights

    return lazy_weights.bind(model, lazy_weights.open_weights(weights)) if on_meta else {}


def _model_name(model: Any) -> str:
    if isinstance(model, torch.export.ExportedProgram):
        return "the exported program"
    return type(model).__name__


def _check_inputs(model: Any, args: Any, kwargs: Any) -> tuple:
    """Refuse a model, ``args`` or ``kwargs`` torch.export would refuse later in its own words;
    returns ``args`` as a tuple (a lone tensor is one positional input)."""
    if not isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        hint = (
            ": wrap it in a torch.nn.Module whose forward calls it"
            if callable(model) and not isinstance(model, type)
            else (": pass an instance, e.g. Model()" if isinstance(model, type) else "")
        )
        raise InvalidArgumentError(
            f"the model to export is a torch.nn.Module or a torch.export.ExportedProgram, got {describe(model)}{hint}"
        )
    if isinstance(args, torch.Tensor):
        args = (args,)
    elif args is None:
        args = ()
    elif isinstance(args, list):
        raise InvalidArgumentError(
            f"args= takes a tuple of the model's positional inputs, got a list of {len(args)}: write tuple(args) "
            "for that many inputs, or (args,) if the model takes one list"
        )
    elif isinstance(args, Mapping):
        raise InvalidArgumentError(
            "args= takes a tuple of the model's positional inputs, got a dict: pass keyword inputs as kwargs="
        )
    elif not isinstance(args, tuple):
        raise InvalidArgumentError(
            f"args= takes a tuple of the model's positional inputs, got {describe(args)}: write (value,) for one"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidArgumentError(
            f"kwargs= takes a dict of the model's keyword inputs ({{'name': tensor}}), got {describe(kwargs)}"
        )
    if kwargs is not None and any(not isinstance(k, str) for k in kwargs):
        raise InvalidArgumentError(f"kwargs= keys are forward's parameter names (strings), got {list(kwargs)!r}")
    return args


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
