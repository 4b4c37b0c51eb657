"""``opreg.export_checkpoint``: a checkpoint folder (or hub id) exported as its loader plans it, into
a folder written whole.

The order is the promise: everything that can be refused is refused before anything is built
(the output folder, the source, the loader and the task, the files the plan requires; the loader's
own refusals: no weights, a config its library cannot build); then each component is built and
exported, the post-steps combine exported models, the folder is written whole (staged beside the
target and swapped in: :func:`opreg.llm._folder.write_folder`), and with ``verify`` each model is
compared with eager PyTorch at its dims' example and second sizes and the plan's loop checks run on
the written folder.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opreg.checkpoint.choice import Choice, choose
from opreg.checkpoint.source import checkpoint_of
from opreg.errors import CheckpointError, InvalidArgumentError, VerificationError
from opreg.loaderapi import CheckContext, Checkpoint, Component, ExportPlan, Handover, HandoverResult
from opreg.packs.plugins import of_settings
from opreg.settings import ExportSettings, takes_settings

logger = logging.getLogger(__name__)

__all__ = ["CheckpointExport", "ExportedModel", "export_checkpoint"]

_INLINE_LIMIT = 2**31 - 2**24
"""A post-step's model with more weights than this keeps them in a file beside it (protobuf holds 2 GB)."""
_PLANNED = ("dynamic_shapes", "weights")
"""ExportSettings fields a checkpoint's loader decides: not options of :func:`export_checkpoint`."""


@dataclasses.dataclass(frozen=True)
class ExportedModel:
    """One model of the folder written.

    Fields:
        name: the component's (or post-step's) name.
        file: its path in the folder.
        program: its :class:`opreg.OnnxProgram` (an ``onnx_ir.Model`` for a post-step's).
        verified: the :class:`opreg.Verification` at each size verified (``()`` without ``verify``).
    """

    name: str
    file: str
    program: Any
    verified: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class CheckpointExport:
    """What :func:`opreg.export_checkpoint` did.

    Fields:
        folder: the folder written.
        source: the source as given (a path or a hub id).
        loader: the loader used (``pack:name``), and ``others``: the other loaders that recognised it.
        library, task: what was exported; ``inferred``: the task was inferred, not asked.
        evidence: what in the folder said so.
        models: the :class:`ExportedModel` s written.
        files: every file the folder holds, relative to it, sorted.
        verified: whether every component was verified against eager PyTorch (``verify=True``).
        checks: each loop check's one-line summary.
        notes: the plan's notes.
    """

    folder: Path
    source: str
    loader: str
    library: str
    task: str
    inferred: bool
    evidence: str
    models: tuple[ExportedModel, ...]
    files: tuple[str, ...]
    verified: bool = False
    checks: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    others: tuple[str, ...] = ()


@takes_settings(leave_out=_PLANNED)
def export_checkpoint(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    task: str | None = None,
    library: str | None = None,
    layout: str | None = None,
    verify: bool = True,
    settings: ExportSettings | None = None,
    **options: Any,
) -> CheckpointExport:
    """Export the checkpoint ``source`` (a folder, or a hub id resolved by huggingface_hub) into the
    folder ``output``, as the installed packs' loaders plan it (docs/exporting-checkpoints.md).

    ``task`` overrides the task inferred from the folder; ``library`` picks a loader (its library,
    name or ``pack:name``) when several recognise the folder; ``layout`` picks the folder's layout
    where the export writes several (a causal LM: ``"optimum"``, the default, or ``"genai"``;
    refused for the others); ``verify`` (default on) compares
    each model with eager PyTorch at two sizes of its dynamic dims and runs the plan's loop checks.
    The other keyword options are :class:`opreg.ExportSettings`' (but ``dynamic_shapes`` and
    ``weights``, which the loader decides). Bad input is refused before anything is built
    (:class:`opreg.CheckpointError`); a model that does not match raises
    :class:`opreg.VerificationError` after the folder is written.
    """
    planned = [name for name in _PLANNED if name in options]
    if planned:
        raise InvalidArgumentError(f"export_checkpoint: {planned[0]}= is decided by the checkpoint's loader")
    settings = ExportSettings.of(settings, options, "opreg.export_checkpoint")
    if not isinstance(verify, bool):
        raise InvalidArgumentError(f"verify= takes True or False, got {verify!r}")
    if layout is not None and not isinstance(layout, str):
        raise InvalidArgumentError(f"layout= takes a layout's name, got {layout!r}")
    from opreg.llm._folder import check_folder, write_folder  # imports the exporter's save (and torch)

    target = check_folder(output)  # refused now, not after the export
    checkpoint = checkpoint_of(source)
    packs = of_settings(settings)
    choice = choose(checkpoint, packs.host, task=task, library=library)
    _require_files(checkpoint, choice.plan)
    settings = dataclasses.replace(settings, registry=packs.registry, host=packs.host, plugins=None, exclude=None)
    if choice.plan.export is not None:
        return _handed_over(choice, checkpoint, Handover(checkpoint, target, settings, verify, layout))
    if layout is not None:
        raise InvalidArgumentError(
            f"the {choice.plan.library} {choice.task} export writes one layout, optimum's: leave layout (--layout) out"
        )
    programs, modules = _export_components(choice.plan, settings)
    context = CheckContext(checkpoint, choice.plan, programs, modules)
    for step in choice.plan.post_steps:
        _stage(settings, f"combine {step.name}")
        programs[step.name] = step.combine(context)
    folder, _ = write_folder(output, lambda staged: _fill(staged, checkpoint, choice.plan, programs, settings))
    verified = _verify(choice.plan, programs, settings) if verify else {}
    checks = _loop_checks(dataclasses.replace(context, folder=folder), settings) if verify else ()
    return _result(folder, checkpoint, choice, programs, verified, checks)


def _handed_over(choice: Choice, checkpoint: Checkpoint, handover: Handover) -> CheckpointExport:
    """The plan's export done whole by the loader (:attr:`opreg.ExportPlan.export`), reported as a plan's."""
    _stage(handover.settings, "export")
    done = choice.plan.export(handover)
    if not isinstance(done, HandoverResult):
        raise CheckpointError(
            f"loader {choice.candidate.label}'s export returned a {type(done).__name__}, not an opreg.HandoverResult"
        )
    models = tuple(
        ExportedModel(Path(file).stem, file, program, tuple(done.verified.get(file, ())))
        for file, program in done.models.items()
    )
    result = _result(handover.output, checkpoint, choice, {}, {}, done.checks)
    return dataclasses.replace(result, models=models, verified=handover.verify and bool(done.verified))


def _stage(settings: ExportSettings, name: str) -> None:
    if settings.progress is not None:
        settings.progress(name)


def _require_files(checkpoint: Checkpoint, plan: ExportPlan) -> None:
    missing = [copy.source for copy in plan.files if copy.required and not checkpoint.has(copy.source)]
    if missing:
        raise CheckpointError(
            f"{checkpoint.path} has no {missing[0]}, which the {plan.library} {plan.task} export needs: "
            "add it from the original checkpoint"
        )


def _export_components(plan: ExportPlan, settings: ExportSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({component: OnnxProgram}, {component: eager module})``."""
    from opreg import exporter
    from opreg.checkpoint import inputs

    programs, modules = {}, {}
    for component in plan.components:
        _stage(settings, f"build {component.name}")
        module = inputs.named_module(component, _built(component))
        own = ExportSettings.of(settings, _component_options(component), f"component {component.name!r}")
        program = exporter.export(module, inputs.example_inputs(component), settings=own)
        program.rename(inputs.onnx_names(component, program))  # optimum's names, identifiers or not
        inputs.name_dims(component, program)
        programs[component.name], modules[component.name] = program, module
    return programs, modules


def _built(component: Component) -> Any:
    import torch

    module = component.build()
    if not isinstance(module, torch.nn.Module):
        raise CheckpointError(
            f"component {component.name!r}: its build step returned a {type(module).__name__}, not a torch.nn.Module"
        )
    return module


def _component_options(component: Component) -> dict[str, Any]:
    from opreg.checkpoint import inputs

    options = {"dynamic_shapes": inputs.dynamic_shapes(component), **component.options}
    if component.target is not None:
        options["target"] = component.target
    return options


def _fill(
    staged: Path, checkpoint: Checkpoint, plan: ExportPlan, programs: Mapping[str, Any], settings: Any
) -> list[str]:
    """Write the plan's models and copy its files into the staging folder; the names written
    (top-level entries, as :func:`write_folder` keeps the old folder's others)."""
    import onnx_ir

    _stage(settings, "save")
    dropped = {name for step in plan.post_steps for name in step.drop}
    written = []
    for component in plan.components:
        if component.name not in dropped:
            path = staged / component.file
            path.parent.mkdir(parents=True, exist_ok=True)
            programs[component.name].save(path)
            written.append(component.file)
    for step in plan.post_steps:
        path = staged / step.file
        path.parent.mkdir(parents=True, exist_ok=True)
        model = programs[step.name]
        weights = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
        beside = f"{path.name}.data" if weights > _INLINE_LIMIT else None  # protobuf's 2 GB: weights beside it
        onnx_ir.save(model, path, external_data=beside)
        written.append(step.file)
    for copy in plan.files:
        if checkpoint.has(copy.source):
            (staged / copy.target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(checkpoint.file(copy.source), staged / copy.target)
            written.append(copy.target)
    return sorted({Path(name).parts[0] for name in written})


def _verify(plan: ExportPlan, programs: Mapping[str, Any], settings: ExportSettings) -> dict[str, tuple[Any, ...]]:
    """Each component's :class:`opreg.Verification` at its dims' example and second sizes."""
    from opreg.checkpoint import inputs

    _stage(settings, "verify")
    verified = {}
    for component in plan.components:
        results = []
        for which in (inputs.EXAMPLE, inputs.OTHER):
            args = inputs.example_inputs(component, which)
            try:
                results.append(programs[component.name].verify(*args, rtol=component.rtol, atol=component.atol))
            except VerificationError as e:
                sizes = ", ".join(f"{d.name}={getattr(d, which)}" for d in component.dims)
                raise VerificationError(f"{component.file} (at {sizes or 'its fixed shapes'}): {e}", e.results) from e
        verified[component.name] = tuple(results)
    return verified


def _loop_checks(context: CheckContext, settings: ExportSettings) -> tuple[str, ...]:
    summaries = []
    for check in context.plan.checks:
        _stage(settings, f"check {check.name}")
        summaries.append(f"{check.name}: {check.run(context)}")
    return tuple(summaries)


def _result(
    folder: Path,
    checkpoint: Checkpoint,
    choice: Choice,
    programs: Mapping[str, Any],
    verified: Mapping[str, tuple[Any, ...]],
    checks: tuple[str, ...],
) -> CheckpointExport:
    plan = choice.plan
    dropped = {name for step in plan.post_steps for name in step.drop}
    models = tuple(
        ExportedModel(c.name, c.file, programs[c.name], verified.get(c.name, ()))
        for c in plan.components
        if c.name not in dropped
    ) + tuple(ExportedModel(s.name, s.file, programs[s.name]) for s in plan.post_steps)
    files = tuple(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()))
    return CheckpointExport(
        folder=folder, source=checkpoint.source, loader=choice.candidate.label, library=plan.library,
        task=choice.task, inferred=choice.inferred, evidence=choice.candidate.recognition.evidence, models=models,
        files=files, verified=bool(verified), checks=checks, notes=plan.notes,
        others=tuple(c.label for c in choice.others),
    )  # fmt: skip
