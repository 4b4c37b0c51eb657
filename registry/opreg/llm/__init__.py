"""Language models in the folders ONNX Runtime GenAI runs: a causal LM as one ONNX decoder for
prefill and decode, Whisper as an encoder and a decoder, a vision-language model as three models.

Each family is exported by its function (:func:`export_decoder`, :func:`export_whisper`,
:func:`export_vision`), or by :func:`export_checkpoint`, which picks the family from the
checkpoint's config (``opreg llm export FOLDER -o OUT`` calls it); each returns an
:class:`ExportedModel`. Their options are :class:`LLMSettings`' fields, declared once
(docs/language-models.md, "Options").

``opreg.llm.export_decoder(model_or_folder, output_folder)`` exports a causal LM with its KV
cache as inputs and outputs, in the names and layout ONNX Runtime GenAI reads (:data:`LAYOUT`):

- inputs ``input_ids`` ``[batch_size, sequence_length]`` (int64), ``attention_mask``
  ``[batch_size, total_sequence_length]`` (int64, 1 for a token and 0 for padding; left padding
  works), ``position_ids`` ``[batch_size, sequence_length]`` (int64, where the architecture takes
  them), and per layer ``past_key_values.%d.key`` / ``.value``
  ``[batch_size, num_key_value_heads, past_sequence_length, head_size]`` (BNSH, unrepeated heads);
- outputs ``logits`` ``[batch_size, sequence_length, vocab_size]`` and per layer ``present.%d.key``
  / ``.value`` ``[batch_size, num_key_value_heads, total_sequence_length, head_size]``: the past
  with this call's keys and values appended.
- a layer of short convolutions (LFM2's) has instead ``past.%d.conv`` in and ``present.%d.conv``
  out, ``[batch_size, channels, kernel_size - 1]``: the last inputs of its causal convolution.

``total_sequence_length`` is ``past_sequence_length + sequence_length``; every length is dynamic,
0 and 1 included (a prefill has an empty past, a decode step one token).

Importing this module is cheap: torch and transformers are imported when a function runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opreg.llm._layout import LAYOUT
from opreg.llm._result import ExportedModel, SavedFolder
from opreg.llm._settings import DECODER_OPTIONS, PRECISIONS, LLMSettings

if TYPE_CHECKING:
    from opreg.llm._api import export_checkpoint, export_decoder, export_vision, export_whisper
    from opreg.llm._decoder import Decoder, DecoderLayout
    from opreg.llm._vision import VisionLanguage
    from opreg.llm._whisper import Whisper, WhisperLayout

__all__ = ["DECODER_OPTIONS", "LAYOUT", "PRECISIONS", "WHISPER_LAYOUT", "Decoder", "DecoderLayout", "ExportedModel",
           "LLMSettings", "SavedFolder", "VisionLanguage", "Whisper", "WhisperLayout", "export_checkpoint",
           "export_decoder", "export_vision", "export_whisper"]  # fmt: skip

_LAZY = {
    "export_checkpoint": "_api", "export_decoder": "_api", "export_vision": "_api", "export_whisper": "_api",
    "WHISPER_LAYOUT": "_whisper_genai", "VisionLanguage": "_vision", "Decoder": "_decoder",
    "DecoderLayout": "_decoder", "Whisper": "_whisper", "WhisperLayout": "_whisper",
}  # fmt: skip
"""What :mod:`opreg.llm` imports on first use, by the module that holds it: the functions (their
signatures read :mod:`opreg.settings`) and what imports torch."""


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'opreg.llm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"opreg.llm.{_LAZY[name]}"), name)
