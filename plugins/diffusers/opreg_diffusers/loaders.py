"""The checkpoint loader of diffusers pipelines (``opreg_checkpoint_loaders``): a folder whose
``model_index.json`` names a pipeline of :data:`opreg_diffusers.pipelines.PIPELINES`, exported as
optimum-onnx lays it out: one folder per model (``text_encoder/model.onnx``, ``text_encoder_2/``,
``text_encoder_3/``, ``unet/`` or ``transformer/``, ``vae_encoder/``, ``vae_decoder/``, each with its
``config.json``), ``model_index.json``, ``scheduler/`` and the tokenizers copied.

Recognising reads ``model_index.json`` only. ``plan`` reads the components' ``config.json`` and
refuses, before any export, a pipeline whose component is missing (named ``[null, null]`` where the
family needs it, or named without its folder, config or weights), naming it; it imports the
component's library only to check that its class exists there. Each component's ``build`` loads
its weights; the loop check (:mod:`opreg_diffusers.loop`) runs the written folder.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import opreg
from opreg_diffusers import components, pipelines, weights
from opreg_diffusers.parts import Parts

LIBRARY = "diffusers"
INDEX = "model_index.json"
SCHEDULER_CONFIG = "scheduler/scheduler_config.json"


def recognise(checkpoint: opreg.Checkpoint) -> opreg.Recognition | None:
    """A diffusers folder: ``model_index.json`` with a ``_class_name``; its tasks if the pipeline is known."""
    index = checkpoint.json(INDEX)
    if index is None or "_class_name" not in index:
        return None
    class_name = index["_class_name"]
    evidence = f"{INDEX}: _class_name {class_name!r}"
    known = pipelines.PIPELINES.get(class_name)
    if known is None:
        families = sorted({family.name for family, _ in pipelines.PIPELINES.values()})
        return opreg.Recognition(
            LIBRARY, (), None, evidence,
            refusal=f"pipeline {class_name!r} ({evidence}) is not one opreg-diffusers exports yet (it exports the "
            f"{', '.join(families)} pipelines: {', '.join(pipelines.PIPELINES)})",
        )  # fmt: skip
    family, task = known
    return opreg.Recognition(LIBRARY, pipelines.TASKS, task, f"{evidence}, a {family.name} pipeline")


def plan(checkpoint: opreg.Checkpoint, task: str) -> opreg.ExportPlan:
    """The export of the pipeline's models, the files its runtime reads, and the denoising loop check."""
    index = checkpoint.json(INDEX)
    assert index is not None  # recognised
    family, _ = pipelines.PIPELINES[index["_class_name"]]
    entries = _entries(checkpoint, index, family)
    models = {name: entry for name, entry in entries.items() if name in pipelines.MODELS}
    for name, (library, class_name) in models.items():
        _check_model(checkpoint, name, library, class_name)
    parts = Parts(checkpoint, models)
    planned = tuple(c for name in models for c in _components(checkpoint, name, models[name], family, index, parts))
    check = opreg.LoopCheck("denoising", lambda context: _loop(context, parts, family))
    skipped = sorted(n for n, v in index.items() if _named(v) and n not in entries)
    notes = (f"not exported (optimum-onnx neither): {', '.join(skipped)}",) if skipped else ()
    return opreg.ExportPlan(LIBRARY, task, planned, _files(checkpoint, entries), checks=(check,), notes=notes)


def _named(value: Any) -> bool:
    """Whether a ``model_index.json`` entry names a component (``[library, class]``, not ``[null, null]``)."""
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _entries(
    checkpoint: opreg.Checkpoint, index: dict[str, Any], family: pipelines.Family
) -> dict[str, tuple[str, str]]:
    """The components exported or copied, ``{name: (library, class)}``; a missing one refused."""
    where = checkpoint.file(INDEX)
    for name in family.required:
        if not _named(index.get(name)):
            raise opreg.CheckpointError(
                f"{where} names no {name} (it has {index.get(name)!r}), which a {family.name} pipeline needs: the "
                f"pipeline's component {name} is missing; export the complete pipeline"
            )
    entries = {n: (v[0], v[1]) for n, v in index.items() if n in (*pipelines.MODELS, *pipelines.COPIED) and _named(v)}
    for name, entry in entries.items():
        _require_folder(checkpoint, name, entry)
    return entries


def _require_folder(checkpoint: opreg.Checkpoint, name: str, entry: tuple[str, str]) -> None:
    """Refuse a component ``model_index.json`` names whose folder lacks what loading it needs."""
    needs = {"scheduler": SCHEDULER_CONFIG}.get(name, f"{name}/config.json" if name in pipelines.MODELS else None)
    missing = None
    if not checkpoint.file(name).is_dir():
        missing = f"{name}/"
    elif needs is not None and not checkpoint.has(needs):
        missing = needs
    elif name in pipelines.MODELS and not weights.files(checkpoint, name):
        missing = f"{name}/ weights ({', '.join(f'{s}.safetensors' for s in weights.STEMS)}, or .bin)"
    if missing is not None:
        raise opreg.CheckpointError(
            f"{checkpoint.path} has no {missing}: the pipeline's component {name} ({entry[0]}.{entry[1]}, named in "
            f"{INDEX}) is missing; download the complete pipeline (every folder {INDEX} names)"
        )


def _check_model(checkpoint: opreg.Checkpoint, name: str, library: str, class_name: str) -> None:
    """Refuse a model whose class opreg-diffusers does not export, or the installed library lacks."""
    if (library, class_name) not in pipelines.MODEL_CLASSES:
        known = ", ".join(f"{lib}.{cls}" for lib, cls in pipelines.MODEL_CLASSES)
        raise opreg.CheckpointError(
            f"{checkpoint.file(INDEX)}: {name} is a {library}.{class_name}, which opreg-diffusers does not export "
            f"(it exports {known})"
        )
    if importlib.util.find_spec(library) is None:
        raise opreg.CheckpointError(
            f"{name} is a {library}.{class_name}, and {library} is not installed: pip install {library}"
        )
    module = importlib.import_module(library)
    if not hasattr(module, class_name):
        raise opreg.CheckpointError(
            f"{name} is a {library}.{class_name}, which {library} {module.__version__} does not have: install the "
            f"{library} release the pipeline was written with"
        )
    if library == "transformers":  # diffusers' configs are read as they are; transformers builds its own
        try:
            module.AutoConfig.from_pretrained(checkpoint.file(name))
        except Exception as e:
            raise opreg.CheckpointError(
                f"{checkpoint.file(name + '/config.json')} cannot be built by transformers {module.__version__}: "
                f"{type(e).__name__}: {e}; fix the config, or install the transformers release it was written for"
            ) from e


def _components(
    checkpoint: opreg.Checkpoint,
    name: str,
    entry: tuple[str, str],
    family: pipelines.Family,
    index: dict[str, Any],
    parts: Parts,
) -> tuple[opreg.Component, ...]:
    config = checkpoint.json(f"{name}/config.json")
    assert config is not None  # required by _entries
    kind = pipelines.MODEL_CLASSES[entry]
    if kind == "vae":
        return components.vae(config, parts.model)
    if kind == "unet-2d-condition":
        _check_unet(checkpoint, config)
        return (components.unet(config, parts.model, 5 if index.get("requires_aesthetics_score") else 6),)
    if kind == "sd3-transformer-2d":
        return (components.sd3_transformer(config, parts.model),)
    if kind == "flux-transformer-2d":
        return (components.flux_transformer(config, parts.model),)
    return (components.text_encoder(name, kind, config, parts.model, family.hidden_states),)


def _check_unet(checkpoint: opreg.Checkpoint, config: dict[str, Any]) -> None:
    extra = config.get("addition_embed_type")
    if extra not in (None, "text_time") or config.get("class_embed_type") is not None:
        raise opreg.CheckpointError(
            f"{checkpoint.file('unet/config.json')}: a UNet conditioned on {extra or config.get('class_embed_type')!r} "
            "takes inputs optimum's UNet layout has no name for (it exports text_time, SDXL's, or none)"
        )


def _files(checkpoint: opreg.Checkpoint, entries: dict[str, tuple[str, str]]) -> tuple[opreg.FileCopy, ...]:
    """``model_index.json``, the scheduler's, tokenizers' and feature extractor's folders, and each
    model's ``config.json`` beside its ONNX file (the VAE's twice: its encoder's and decoder's)."""
    copies = [opreg.FileCopy(INDEX, required=True)]
    listed = checkpoint.files()
    for name in pipelines.COPIED:
        if name in entries:
            copies += [opreg.FileCopy(f) for f in listed if f.startswith(f"{name}/")]
    for name in pipelines.MODELS:
        if name in entries:
            config = f"{name}/config.json"
            dests = ("vae_encoder/config.json", "vae_decoder/config.json") if name == "vae" else (config,)
            copies += [opreg.FileCopy(config, dest, required=True) for dest in dests]
    return tuple(copies)


def _loop(context: opreg.CheckContext, parts: Parts, family: pipelines.Family) -> str:
    from opreg_diffusers import loop  # imports onnxruntime and diffusers: only when checking

    return loop.check(context, parts, family)


LOADERS = (
    opreg.CheckpointLoader(
        name="diffusers",
        library=LIBRARY,
        looks_for=f"{INDEX} with a _class_name",
        recognise=recognise,
        plan=plan,
    ),
)
