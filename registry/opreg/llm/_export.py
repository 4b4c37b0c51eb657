"""A language-model export, whichever the family: every check before it, done once, the export's
settings built once, then the family's export and the folder written.

Before anything is loaded or captured, in this order (each refusal naming the problem and the
remedy; the options' own values are checked when :class:`opreg.llm.LLMSettings` is made):

1. the output folder can be written (:func:`opreg.llm._folder.check_folder`);
2. the export's :class:`opreg.ExportSettings`, without the options the layouts set;
3. the model (a transformers model, with its config) or the checkpoint folder (its ``config.json``);
4. the family: the one the function exports, refused naming the one that serves the model, or
   (:func:`opreg.llm.export_checkpoint`) the one that serves it;
5. an option the family does not take, given, refused (:attr:`opreg.llm._settings.Option.families`), and
   a layout it does not write (:attr:`opreg.llm._family.Family.layouts`);
6. the registry built, the target resolved (the fastest installed unless given), the precision's
   pass made (refused at a target without ONNX Runtime's kernels);
7. the context length, against the model's position limit, for every family;
8. the tokenizer: a checkpoint folder without one is exported with a warning (logged:
   ``opreg llm export`` shows it).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opreg.errors import ExportError, InvalidArgumentError
from opreg.llm._settings import DECODER_OPTIONS, LLMSettings, float_weights, refuse_others
from opreg.settings import ExportSettings

if TYPE_CHECKING:
    from opreg.llm._family import Request
    from opreg.llm._result import ExportedModel
    from opreg.registry.registry import Registry

logger = logging.getLogger(__name__)

FASTEST_TARGETS = ("onnxruntime", "onnx")
"""Target profiles from the fastest decoder on CPU to the slowest (bench/llm.py); the first one
installed is the default. ``onnxruntime`` (with opreg-ort-contrib: GroupQueryAttention on the
cache in place, rotary inside it, packed q/k/v) decodes 1.13-1.26x faster than the plain ``onnx``
target's decoder on the 55M Llama; ``onnx`` is the portable standard-ONNX decoder, and what is
left without the pack."""


def export(
    family: str | None,
    source: Any,
    output_folder: str | os.PathLike[str] | None,
    settings: LLMSettings,
    given: ExportSettings | None,
    export_options: dict[str, Any],
    function: str,
) -> ExportedModel:
    """Export ``source`` (a transformers model or a checkpoint folder) as the family ``family``
    (a key; ``None``: the one that serves it) with ``settings`` and the export's ``given``
    settings and ``export_options`` (``function``: the caller, named in messages); write it as
    ``output_folder`` when given."""
    from opreg import _heap
    from opreg.llm import _folder

    if output_folder is not None:
        _folder.check_folder(output_folder)
    export_settings = settings_of(function, given, export_options)
    with _heap.quiet():  # the collector off torch's and transformers' objects, from their import to the save
        request = prepare(family, source, settings, given, export_settings, function)
        exported = request.family.export(request)
        if output_folder is not None:
            exported.save(output_folder, external_data=settings.external_data)
        return exported


def settings_of(function: str, settings: ExportSettings | None, options: dict[str, Any]) -> ExportSettings:
    """The :class:`opreg.ExportSettings` of a language-model export's call (``function``: its name,
    in messages), refusing the options its layout sets itself (:data:`opreg.llm.DECODER_OPTIONS`)."""
    taken = [name for name in ("args", "kwargs", *DECODER_OPTIONS) if name in options]
    if settings is not None:
        defaults = ExportSettings()
        taken += [n for n in DECODER_OPTIONS if n not in taken and getattr(settings, n) != getattr(defaults, n)]
    if taken:
        raise InvalidArgumentError(
            f"{function} sets {', '.join(taken)} itself (the models' inputs and dynamic lengths); leave "
            f"{'it' if len(taken) == 1 else 'them'} out"
        )
    return ExportSettings.of(settings, options, function)


def prepare(
    key: str | None,
    source: Any,
    settings: LLMSettings,
    given: ExportSettings | None,
    export: ExportSettings,
    function: str,
) -> Request:
    """Steps 3 to 8 of the module's docstring: the :class:`~opreg.llm._family.Request` the family's
    export is handed."""
    from opreg.llm import _checkpoint, _families, _quantized
    from opreg.llm._family import Request
    from opreg.llm._precision import quantization, stored_quantization

    model, folder, config, what = _source(source, key, function)
    family = _families.by_key(key) if key is not None else (_families.family_of(config) or _families.CAUSAL)
    _families.check(config, family, what)
    refuse_others(family.key, settings.given())
    if settings.layout not in family.layouts:
        raise InvalidArgumentError(
            f"a {family.name} is written in the {' or '.join(repr(n) for n in family.layouts)} layout, not "
            f"{settings.layout!r}: leave layout (--layout) out"
        )
    export = _resolved(export, settings.target if settings.target is not None else getattr(given, "target", None))
    quantization(settings, export.target, family.quantization)  # refused now, not after the capture
    scheme = _quantized.check_request(config, family.key, folder, settings.streaming, what.removesuffix(": it"))
    if scheme is not None:
        stored_quantization(settings, export.target, f"{folder} ({scheme.name})")
    elif settings.precision == "fp32" and settings.quantization():  # a float checkpoint's weights stay float
        raise float_weights(list(settings.quantization()))
    length = _checkpoint.context_length(config, settings.context_length, settings.allow_longer_context)
    tokenizer = settings.tokenizer
    if tokenizer is None and folder is not None:
        tokenizer = folder
        if not _checkpoint.has_tokenizer(folder):
            logger.warning("%s", _checkpoint.no_tokenizer_warning(folder))
            tokenizer = False  # said once, here
    settings = dataclasses.replace(settings, context_length=length, tokenizer=tokenizer)
    return Request(family, model, folder, config, settings, export)


def _source(source: Any, key: str | None, function: str) -> tuple[Any, Path | None, Any, str]:
    """The model given (or ``None``), the checkpoint folder (or ``None``), the config, and how
    messages name what was given."""
    import torch

    from opreg.llm import _checkpoint, _families

    if isinstance(source, (str, os.PathLike)):
        folder = Path(source)
        config = _checkpoint.read_config(folder)
        return None, folder, config, f"{folder} holds a {_families.architecture(config)}: it"
    if not isinstance(source, torch.nn.Module):
        wanted = _families.by_key(key).name if key is not None else "language model"
        raise InvalidArgumentError(
            f"{function} takes a transformers {wanted} or a checkpoint folder, got {type(source).__name__}"
        )
    if getattr(source, "config", None) is None:
        raise ExportError(f"{type(source).__name__} is not a transformers model (it has no config)")
    return source, None, source.config, f"the {type(source).__name__} given"


def _resolved(export: ExportSettings, target: Any) -> ExportSettings:
    """``export`` with its registry built and ``target`` resolved by it (``None``: the fastest
    installed, :data:`FASTEST_TARGETS`)."""
    from opreg.packs.plugins import default_registry

    registry = export.registry or default_registry(plugins=export.plugins, exclude=export.exclude)
    resolved = registry.target(default_target(registry) if target is None else target)
    return dataclasses.replace(export, target=resolved, registry=registry, plugins=None, exclude=None)


def default_target(registry: Registry) -> str:
    """The fastest target profile ``registry``'s packs offer (:data:`FASTEST_TARGETS`)."""
    profiles = registry.profiles
    return next((name for name in FASTEST_TARGETS if name in profiles or name == "onnx"), "onnx")
