"""Which export serves a transformers checkpoint: the text decoder, or none (yet).

A checkpoint the text decoder cannot serve is refused before anything is loaded or exported:
transformers' ``AutoModelForCausalLM`` loads a decoder-only part of some models it cannot
serve whole (Whisper's config maps to ``WhisperForCausalLM``, the decoder without the encoder
its cross-attention reads), and the folder written from that part would run and transcribe
or describe nothing.
"""

from __future__ import annotations

from typing import Any

from opreg.errors import ExportError

MODALITIES = {
    "vision_config": "vision-language",
    "audio_config": "audio-language",
    "speech_config": "speech",
    "video_config": "video-language",
    "vq_config": "image-token",
}
"""A config's sub-config of another modality, and the kind of model it makes."""


def refuse_unless_text_decoder(config: Any, what: str) -> None:
    """Raise :class:`opreg.ExportError` naming the reason when a model of ``config`` (``what``:
    "FOLDER holds a CLASS" or "the CLASS given") is not a decoder-only text model the text
    decoder export serves whole."""
    if getattr(config, "is_encoder_decoder", False):
        raise ExportError(
            f"{what} is an encoder-decoder model: export_decoder exports decoder-only causal LMs, and "
            "transformers would load its decoder alone, without the encoder whose output its cross-attention reads "
            "(the folder would run and transcribe or translate nothing)"
        )
    kinds = [kind for attribute, kind in MODALITIES.items() if getattr(config, attribute, None) is not None]
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if kinds or text is not config:
        kind = kinds[0] if kinds else "multimodal"
        raise ExportError(
            f"{what} is a {kind} model: export_decoder would export its text decoder alone and the "
            "folder would take no images or audio; export a text-only checkpoint (its language model saved alone)"
        )


def architecture(config: Any) -> str:
    """The checkpoint's model class as its config names it (else its config class's name)."""
    names = getattr(config, "architectures", None) or []
    return names[0] if names else type(config).__name__
