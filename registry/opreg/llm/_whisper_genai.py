"""The Whisper folder ONNX Runtime GenAI loads: ``encoder.onnx``, ``decoder.onnx``,
``genai_config.json`` (``"type": "whisper"``), ``audio_processor_config.json``, the tokenizer's
and the feature extractor's files.

``genai_config.json`` has the sections GenAI's builder writes for Whisper
(``onnxruntime_genai/models/builders/whisper.py``, ``make_genai_config``): ``encoder`` (its
``audio_features`` in; hidden states and each decoder layer's cross-attention keys and values
out) and ``decoder`` (tokens and both caches in; logits and the self-attention cache out).
``audio_processor_config.json`` is the recipe GenAI's audio processor (ONNX Runtime Extensions)
follows to turn a sound file into the encoder's log-mel features: decode, short-time Fourier
transform, log-mel spectrum, with the feature extractor's FFT size, hop, mel bins and chunk
length.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from opreg.errors import ExportError
from opreg.llm import _genai

Whisper = Any
"""An :class:`opreg.llm.Whisper` (not imported: ``_whisper`` imports this module)."""

WHISPER_LAYOUT = dict(
    audio_features="audio_features",
    encoder_hidden_states="hidden_states",
    cross_present_key="present_key_cross_%d",
    cross_present_value="present_value_cross_%d",
    input_ids="input_ids",
    past_key="past_key_self_%d",
    past_value="past_value_self_%d",
    cross_past_key="past_key_cross_%d",
    cross_past_value="past_value_cross_%d",
    logits="logits",
    present_key="present_key_self_%d",
    present_value="present_value_self_%d",
)
"""Whisper's encoder and decoder input and output names (``%d``: the decoder layer), as ONNX
Runtime GenAI's builder writes them and its ``whisper`` model reads them."""

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
AUDIO_PROCESSOR_CONFIG = "audio_processor_config.json"
SAMPLING_RATE = 16000
"""The rate GenAI's audio decoder delivers samples at (Whisper's own)."""


def config(whisper: Whisper) -> dict[str, Any]:
    """``genai_config.json`` for ``whisper``."""
    layout = whisper.layout
    bos, eos, pad = _genai.special_tokens(whisper.model)
    names = WHISPER_LAYOUT
    decoder = {
        "session_options": _genai.session_options(),
        "filename": DECODER_FILE,
        "head_size": layout.head_size,
        "hidden_size": layout.hidden_size,
        "inputs": {
            "input_ids": names["input_ids"],
            "past_key_names": names["past_key"],
            "past_value_names": names["past_value"],
            "cross_past_key_names": names["cross_past_key"],
            "cross_past_value_names": names["cross_past_value"],
        },
        "outputs": {
            "logits": names["logits"],
            "present_key_names": names["present_key"],
            "present_value_names": names["present_value"],
        },
        "num_attention_heads": layout.num_heads,
        "num_hidden_layers": layout.num_layers,
        "num_key_value_heads": layout.num_heads,
    }
    encoder = {
        "session_options": _genai.session_options(),
        "filename": ENCODER_FILE,
        "head_size": layout.hidden_size // layout.encoder_heads,
        "hidden_size": layout.hidden_size,
        "inputs": {"audio_features": names["audio_features"]},
        "outputs": {
            "encoder_hidden_states": names["encoder_hidden_states"],
            "cross_present_key_names": names["cross_present_key"],
            "cross_present_value_names": names["cross_present_value"],
        },
        "num_attention_heads": layout.encoder_heads,
        "num_hidden_layers": layout.encoder_layers,
        "num_key_value_heads": layout.encoder_heads,
    }
    model: dict[str, Any] = {
        "bos_token_id": bos,
        "context_length": whisper.context_length,
        "decoder": decoder,
        "encoder": encoder,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "type": "whisper",
        "vocab_size": layout.vocab_size,
    }
    if bos is None:
        del model["bos_token_id"]
    return {"model": model, "search": _genai.search(whisper.context_length, False)}


def feature_extractor(whisper: Whisper) -> Any:
    """The transformers ``WhisperFeatureExtractor`` of ``whisper``: the one given, the one in the
    folder given, else Whisper's defaults for the model's mel bins."""
    from transformers import WhisperFeatureExtractor

    given = whisper.feature_extractor
    if isinstance(given, (str, os.PathLike)):
        saved = Path(given) / "preprocessor_config.json"
        given = WhisperFeatureExtractor.from_pretrained(saved.parent) if saved.is_file() else None
    if given is None:
        return WhisperFeatureExtractor(feature_size=whisper.layout.num_mel_bins)
    if not hasattr(given, "n_fft") or not hasattr(given, "hop_length"):
        raise ExportError(
            f"feature_extractor= takes a transformers WhisperFeatureExtractor or a folder holding one, got "
            f"{type(given).__name__}"
        )
    return given


def audio_processor_config(extractor: Any, layout: Any) -> dict[str, Any]:
    """GenAI's recipe for the encoder's features, from the feature extractor's settings."""
    if int(extractor.sampling_rate) != SAMPLING_RATE:
        raise ExportError(
            f"the feature extractor reads audio at {extractor.sampling_rate} Hz: ONNX Runtime GenAI's audio processor "
            f"delivers {SAMPLING_RATE} Hz, Whisper's rate"
        )
    if int(extractor.feature_size) != layout.num_mel_bins:
        raise ExportError(
            f"the feature extractor makes {extractor.feature_size} mel bins, the encoder takes {layout.num_mel_bins}: "
            "give the model's own feature extractor"
        )
    if int(extractor.nb_max_frames) != layout.num_frames:
        raise ExportError(
            f"the feature extractor makes {extractor.nb_max_frames} frames, the encoder takes {layout.num_frames}"
        )
    n_fft, hop = int(extractor.n_fft), int(extractor.hop_length)
    steps = [
        {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
        {"operation": {"name": "STFT", "type": "STFTNorm",
                       "attrs": {"n_fft": n_fft, "frame_length": n_fft, "hop_length": hop}}},
        {"operation": {"name": "log_mel_spectrogram", "type": "LogMelSpectrum",
                       "attrs": {"chunk_size": int(extractor.chunk_length), "hop_length": hop, "n_fft": n_fft,
                                 "n_mel": int(extractor.feature_size)}}},
    ]  # fmt: skip
    return {"feature_extraction": {"sequence": steps}}


def save(whisper: Whisper, folder: str | os.PathLike[str], external_data: bool) -> tuple[Path, list[str]]:
    """Write the folder (:func:`opreg.llm._genai.write_model_folder`); the folder and the names written."""
    extractor = feature_extractor(whisper)
    recipe = audio_processor_config(extractor, whisper.layout)
    return _genai.write_model_folder(folder, whisper, extractor, {AUDIO_PROCESSOR_CONFIG: recipe}, external_data)
