"""Which export serves a transformers checkpoint, and loading it.

Each :class:`Family` is one kind of folder ONNX Runtime GenAI runs: a text decoder
(:func:`opreg.llm.export_decoder`), Whisper (:func:`opreg.llm.export_whisper`), a vision-language
model (:func:`opreg.llm.export_vision`). A checkpoint is
matched to its family from its config before anything is loaded; one a family cannot serve is
refused with the reason. transformers' ``AutoModelForCausalLM`` loads a decoder-only part of
some models the text decoder cannot serve whole (Whisper's config maps to ``WhisperForCausalLM``,
the decoder without the encoder its cross-attention reads): the folder written from that part
would run and transcribe or describe nothing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opreg.errors import ExportError, InvalidArgumentError

MODALITIES = {
    "vision_config": "vision-language",
    "audio_config": "audio-language",
    "speech_config": "speech",
    "video_config": "video-language",
    "vq_config": "image-token",
}
"""A config's sub-config of another modality, and the kind of model it makes."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One kind of model folder opreg.llm writes.

    Fields:
        name: what the family exports, in messages ("causal LM").
        function: the ``opreg.llm`` function that exports it.
        module: the module holding the function that exports it without writing a folder
            (``function(model_or_folder, **options)``, returning an object with ``save``).
        auto_class: the transformers ``Auto*`` class that loads its checkpoints.
        serves: whether a config is of this family.
    """

    name: str
    function: str
    module: str
    auto_class: str
    serves: Callable[[Any], bool]


def _is_text_decoder(config: Any) -> bool:
    return reason_not_text_decoder(config, "") is None


def _is_whisper(config: Any) -> bool:
    return getattr(config, "model_type", None) == "whisper" and bool(getattr(config, "is_encoder_decoder", False))


def _is_vision_language(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


TEXT = Family("causal LM", "export_decoder", "opreg.llm._decoder", "AutoModelForCausalLM", _is_text_decoder)
WHISPER = Family("Whisper model", "export_whisper", "opreg.llm._whisper", "AutoModelForSpeechSeq2Seq", _is_whisper)
VISION = Family(
    "vision-language model", "export_vision", "opreg.llm._vision", "AutoModelForImageTextToText", _is_vision_language
)
FAMILIES = (WHISPER, VISION, TEXT)
"""Every family, the first that serves a config wins."""


def family_of(config: Any) -> Family | None:
    """The family that exports a checkpoint of ``config``, or ``None``."""
    return next((family for family in FAMILIES if family.serves(config)), None)


def export_checkpoint(folder: Path, **options: Any) -> Any:
    """Export the checkpoint in ``folder`` with its family's export (a checkpoint no family serves
    goes to the text decoder's, which refuses it with the reason)."""
    import importlib

    family = family_of(read_config(folder)) or TEXT
    return getattr(importlib.import_module(family.module), family.function)(folder, **options)


def reason_not_text_decoder(config: Any, what: str) -> str | None:
    """Why a model of ``config`` (``what``: "FOLDER holds a CLASS: it", or "the CLASS given") is
    not a decoder-only text model the text decoder serves whole, or ``None``."""
    if getattr(config, "is_encoder_decoder", False):
        return (
            f"{what} is an encoder-decoder model: export_decoder exports decoder-only causal LMs, and transformers "
            "would load its decoder alone, without the encoder whose output its cross-attention reads (the folder "
            "would run and transcribe or translate nothing)"
        )
    kinds = [kind for attribute, kind in MODALITIES.items() if getattr(config, attribute, None) is not None]
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if kinds or text is not config:
        return (
            f"{what} is a {kinds[0] if kinds else 'multimodal'} model: export_decoder would export its text decoder "
            "alone and the folder would take no images or audio"
        )
    return None


def check(config: Any, family: Family, what: str) -> None:
    """Raise :class:`opreg.ExportError` with the reason when ``family`` cannot export a model of
    ``config``, naming the family that can."""
    if family.serves(config):
        return
    reason = reason_not_text_decoder(config, what) if family is TEXT else f"{what} is not a {family.name}"
    other = family_of(config)
    hint = f": export it with opreg.llm.{other.function} (`opreg llm export` picks it)" if other else ""
    raise ExportError(f"{reason}{hint}")


def architecture(config: Any) -> str:
    """The checkpoint's model class as its config names it (else its config class's name)."""
    names = getattr(config, "architectures", None) or []
    return names[0] if names else type(config).__name__


def read_config(folder: Path) -> Any:
    """The transformers config of the checkpoint folder ``folder`` (:func:`opreg.llm._checkpoint.read_config`)."""
    from opreg.llm._checkpoint import read_config as read

    return read(folder)


def load(model: Any, family: Family) -> tuple[Any, Path | None]:
    """The transformers model ``model`` names (a model, or a local checkpoint folder, loaded in
    float32) and the folder it came from; refused with the reason when ``family`` cannot export it."""
    import torch

    if isinstance(model, (str, os.PathLike)):
        folder = Path(model)
        config = read_config(folder)
        check(config, family, f"{folder} holds a {architecture(config)}: it")
        import transformers

        try:
            loaded = getattr(transformers, family.auto_class).from_pretrained(folder, dtype=torch.float32)
        except Exception as e:
            raise ExportError(
                f"transformers could not load a {family.name} from {folder}: {type(e).__name__}: {e}"
            ) from e
        return loaded.eval(), folder
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(
            f"{family.function} takes a transformers {family.name} or a checkpoint folder, got {type(model).__name__}"
        )
    if getattr(model, "config", None) is not None:
        check(model.config, family, f"the {type(model).__name__} given")
    return model, None
