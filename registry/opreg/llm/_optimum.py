"""The folder optimum-onnx 0.1.0 writes for a causal LM's ``text-generation-with-past``, which
optimum's ``ORTModelForCausalLM`` and transformers.js' text-generation pipeline load (the
``optimum`` layout of :attr:`opreg.llm.LLMSettings.layout`).

The model is the causal LM's decoder, as the ``genai`` layout has it: the inputs and outputs
optimum's ``TextDecoderOnnxConfig`` names (``input_ids``, ``attention_mask``, ``position_ids``
where the architecture takes them, ``past_key_values.%d.key``/``.value`` in, ``logits`` and
``present.%d.key``/``.value`` out: the names of :data:`opreg.llm.LAYOUT`), its dims named as
optimum names them (``batch_size``, ``sequence_length``, ``past_sequence_length`` and
``past_sequence_length + sequence_length``, :data:`TOTAL`). Beside ``model.onnx``: the checkpoint's
``config.json`` and ``generation_config.json`` (a model's own, saved, when no folder was given)
and the tokenizer's files; no ``genai_config.json``. Flat, as optimum writes it: transformers.js
loads it with ``subfolder: ''``.

``feature-extraction-with-past`` (:attr:`opreg.llm.LLMSettings.features`) is the base model's
(transformers' ``AutoModel``) prefill with its cache out: ``input_ids``, ``attention_mask``
(``batch_size``, ``sequence_length``) and ``position_ids`` where the architecture takes them in,
``last_hidden_state`` (:data:`FEATURES_OUTPUT`) and ``present.%d.key``/``.value`` out, no
``past_key_values`` in, as optimum-onnx 0.1.0 exports it (its config's ``use_past_in_inputs``
false); beside it ``config.json`` and the tokenizer, no ``generation_config.json``.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from opreg.errors import ExportError

logger = logging.getLogger(__name__)

TOTAL = "past_sequence_length + sequence_length"
"""optimum's name of the dim of past and new tokens together (the mask's, the presents')."""
FEATURES_OUTPUT = "last_hidden_state"
"""The output of optimum's ``feature-extraction-with-past`` (the base model's, transformers' name),
where ``text-generation-with-past`` has ``logits``."""
MODEL_FILE = "model.onnx"
CONFIG_FILES = ("config.json", "generation_config.json")
"""The checkpoint's files optimum copies beside the model, copied as they are."""


def check_layers(layout: Any, name: str) -> None:
    """Refuse a decoder whose cache is not keys and values in every layer (``name``: the model's
    class, in the message): optimum's layout has no other cache."""
    others = sorted({kind.layer_type for kind in layout.layers} - {"full_attention"})
    if others:
        raise ExportError(
            f"{name} caches {', '.join(others)} states besides keys and values: the optimum layout holds keys and "
            "values only (past_key_values.N.key/value); export it with layout='genai' (--layout genai)"
        )


def save(decoder: Any, folder: str | os.PathLike[str], external_data: bool = True) -> tuple[Path, list[str]]:
    """Write ``model.onnx``, ``config.json``, ``generation_config.json`` and the tokenizer's files
    as a new ``folder``, which replaces the old one whole (:mod:`opreg.llm._folder`); the folder
    and the names written. ``external_data``: the weights in ``model.onnx.<token>.data`` beside
    the model (which ONNX Runtime, optimum and transformers.js in Node read from the model's path),
    else inside it (up to 2 GB)."""
    from opreg.llm._checkpoint import no_tokenizer_warning
    from opreg.llm._folder import write_folder
    from opreg.llm._genai import save_tokenizer

    if decoder.tokenizer is None:
        logger.warning("%s", no_tokenizer_warning())

    def fill(staged: Path) -> list[str]:
        save_tokenizer(decoder.tokenizer, staged)
        _write_configs(decoder.model, decoder.folder, staged, generates=not decoder.layout.features)
        decoder.program.save(staged / MODEL_FILE, external_data=external_data)
        return sorted(path.name for path in staged.iterdir())  # a new folder: all of it written here

    return write_folder(folder, fill)


def _write_configs(model: Any, checkpoint: Path | None, staged: Path, generates: bool = True) -> None:
    """The checkpoint's ``config.json`` and ``generation_config.json`` (unless the model does not
    ``generates``: a base model's features) as they are, else the model's (a generation config
    where the model has one)."""
    for name in CONFIG_FILES[: 2 if generates else 1]:
        if checkpoint is not None and (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, staged / name)
    if not (staged / CONFIG_FILES[0]).exists():
        model.config.to_json_file(staged / CONFIG_FILES[0])
    generation = getattr(model, "generation_config", None)
    if generates and not (staged / CONFIG_FILES[1]).exists() and generation is not None:
        generation.to_json_file(staged / CONFIG_FILES[1])
