"""The families opreg.llm exports, one :class:`~opreg.llm._family.Family` value each, and which
one serves a transformers checkpoint.

A checkpoint is matched to its family from its config before anything is loaded; one a family
cannot serve is refused with the reason, naming the family that can. transformers'
``AutoModelForCausalLM`` loads a decoder-only part of some models the causal LM's export cannot
serve whole (Whisper's config maps to ``WhisperForCausalLM``, the decoder without the encoder its
cross-attention reads): the folder written from that part would run and transcribe or describe
nothing.

A new family: its module (an ``export(request)`` returning an :class:`opreg.llm.ExportedModel`
subclass), its value in :data:`FAMILIES`, its key and name in :data:`opreg.llm._settings.FAMILIES` and its
key on the options it takes, and its public function in :mod:`opreg.llm` (CONTRIBUTING.md, "a new family").
"""

from __future__ import annotations

from typing import Any

from opreg.errors import ExportError
from opreg.llm import _decoder, _vision, _whisper
from opreg.llm._family import Family

MODALITIES = {
    "vision_config": "vision-language",
    "audio_config": "audio-language",
    "speech_config": "speech",
    "video_config": "video-language",
    "vq_config": "image-token",
}
"""A config's sub-config of another modality, and the kind of model it makes."""
BUILDER_CPU = {"block_size": 32, "symmetric": True, "accuracy_level": 4}
"""How ONNX Runtime GenAI's builder quantizes for CPU (``-p int4 -e cpu``): Whisper's and the
vision-language models' quantization, which takes no options."""


def reason_not_text_decoder(config: Any, what: str) -> str | None:
    """Why a model of ``config`` (``what``: "FOLDER holds a CLASS: it", or "the CLASS given") is
    not a decoder-only text model the causal LM's export serves whole, or ``None``."""
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


def _is_text_decoder(config: Any) -> bool:
    return reason_not_text_decoder(config, "") is None


def _is_whisper(config: Any) -> bool:
    return getattr(config, "model_type", None) == "whisper" and bool(getattr(config, "is_encoder_decoder", False))


def _is_vision_language(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


CAUSAL = Family(
    "causal", "export_decoder", "AutoModelForCausalLM", _is_text_decoder, _decoder.export,
    layouts=("genai", "optimum"),
)  # fmt: skip
WHISPER = Family("whisper", "export_whisper", "AutoModelForSpeechSeq2Seq", _is_whisper, _whisper.export, BUILDER_CPU)
VISION = Family(
    "vision", "export_vision", "AutoModelForImageTextToText", _is_vision_language, _vision.export, BUILDER_CPU
)
FAMILIES = (WHISPER, VISION, CAUSAL)
"""Every family, the first that serves a config wins."""


def by_key(key: str) -> Family:
    (family,) = [family for family in FAMILIES if family.key == key]
    return family


def family_of(config: Any) -> Family | None:
    """The family that exports a checkpoint of ``config``, or ``None``."""
    return next((family for family in FAMILIES if family.serves(config)), None)


def check(config: Any, family: Family, what: str) -> None:
    """Raise :class:`opreg.ExportError` with the reason when ``family`` cannot export a model of
    ``config``, naming the family that can."""
    if family.serves(config):
        return
    reason = reason_not_text_decoder(config, what) if family is CAUSAL else f"{what} is not a {family.name}"
    other = family_of(config)
    hint = f": export it with opreg.llm.{other.function} (`opreg llm export` picks it)" if other else ""
    raise ExportError(f"{reason}{hint}")


def architecture(config: Any) -> str:
    """The checkpoint's model class as its config names it (else its config class's name)."""
    names = getattr(config, "architectures", None) or []
    return names[0] if names else type(config).__name__
