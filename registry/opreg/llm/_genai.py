"""The folder ONNX Runtime GenAI loads: ``model.onnx``, ``genai_config.json``, the tokenizer.

``genai_config.json`` follows what ONNX Runtime GenAI's model builder writes
(``onnxruntime_genai/models/builders/base.py``, ``make_genai_config``) for a decoder-only
model, with ``"type": "decoder"``: GenAI's generic decoder, which runs any architecture whose
graph has the layout of :mod:`opreg.llm` (the graph carries the architecture; a type such as
``gpt2`` would select another cache layout).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from opreg.errors import ExportError
from opreg.llm._layout import LAYOUT

logger = logging.getLogger(__name__)

Decoder = Any
"""An :class:`opreg.llm.Decoder` (not imported: ``_decoder`` imports this module)."""

GENAI_CONFIG = "genai_config.json"
MODEL_FILE = "model.onnx"
GENAI_TYPE = "decoder"
"""GenAI's model type for a decoder-only LLM it has no special handling for."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
"""A checkpoint's tokenizer files, copied as they are when transformers cannot load its tokenizer."""
CACHE_NAMES = {
    LAYOUT["past_key"]: "past_key_names",
    LAYOUT["past_value"]: "past_value_names",
    LAYOUT["past_conv"]: "past_conv_names",
    LAYOUT["present_key"]: "present_key_names",
    LAYOUT["present_value"]: "present_value_names",
    LAYOUT["present_conv"]: "present_conv_names",
}
"""The ``genai_config.json`` key of each cache input's and output's name."""


def config(decoder: Decoder) -> dict[str, Any]:
    """``genai_config.json`` for ``decoder``."""
    layout = decoder.layout
    bos, eos, pad = special_tokens(decoder.model)
    inputs = {"input_ids": LAYOUT["input_ids"], "attention_mask": LAYOUT["attention_mask"]}
    if layout.position_ids:
        inputs["position_ids"] = LAYOUT["position_ids"]
    outputs = {"logits": LAYOUT["logits"]}
    for _, tensor in layout.cache:
        inputs[CACHE_NAMES[tensor.past]] = tensor.past
        outputs[CACHE_NAMES[tensor.present]] = tensor.present
    model: dict[str, Any] = {
        "bos_token_id": bos,
        "context_length": decoder.context_length,
        "decoder": {
            "session_options": session_options(),
            "filename": MODEL_FILE,
            "head_size": layout.head_size,
            "hidden_size": layout.hidden_size,
            "inputs": inputs,
            "outputs": outputs,
            "num_attention_heads": layout.num_attention_heads,
            "num_hidden_layers": layout.num_layers,
            "num_key_value_heads": layout.num_key_value_heads,
        },
        "eos_token_id": eos,
        "pad_token_id": pad,
        "type": GENAI_TYPE,
        "vocab_size": layout.vocab_size,
    }
    if bos is None:
        del model["bos_token_id"]
    model["decoder"].update(_layer_types(layout))
    return {"model": model, "search": search(decoder.context_length, shares_buffer(decoder))}


def session_options() -> dict[str, Any]:
    """A model's ``session_options`` in ``genai_config.json``: ONNX Runtime's CPU defaults."""
    return {"log_id": "onnxruntime-genai", "provider_options": []}


def search(max_length: int, share_buffer: bool) -> dict[str, Any]:
    """``genai_config.json``'s ``search``: greedy up to ``max_length`` tokens, as the builder writes it;
    ``share_buffer``: whether each layer's past and present may be one buffer."""
    return {
        "diversity_penalty": 0.0,
        "do_sample": False,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": max_length,
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": share_buffer,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 1.0,
    }


def _layer_types(layout: Any) -> dict[str, Any]:
    """What GenAI needs to know of a cache other than keys and values in every layer: each
    layer's kind (``layer_types``) and the size of a convolution's state (``conv_cache_size``),
    as its builder writes them for LFM2; nothing for keys and values alone."""
    if set(layout.layer_types) == {"full_attention"}:
        return {}
    fields: dict[str, Any] = {"layer_types": layout.layer_types}
    widths = {kind.width for kind in layout.layers if kind.layer_type == "conv"}
    if len(widths) > 1:
        raise ExportError(f"the model's convolutions keep states of {sorted(widths)} positions: GenAI takes one size")
    if widths:
        fields["conv_cache_size"] = widths.pop()
    return fields


def special_tokens(model: Any) -> tuple[int | None, int | list[int], int]:
    """``(bos, eos, pad)`` token ids: the generation config's, else the model config's; padding
    is the (first) end-of-sequence token when the model names none, as ``generate`` pads."""
    sources = [getattr(model, "generation_config", None), model.config, text_config(model)]

    def first(name: str) -> Any:
        for source in sources:
            value = getattr(source, name, None) if source is not None else None
            if value is not None:
                return value
        return None

    eos = first("eos_token_id")
    if eos is None:
        raise ExportError(
            f"{type(model).__name__} names no end-of-sequence token (eos_token_id in its config or generation "
            "config): ONNX Runtime GenAI needs one to stop; set model.generation_config.eos_token_id"
        )
    eos = [int(t) for t in eos] if isinstance(eos, (list, tuple)) else int(eos)
    pad = first("pad_token_id")
    pad = int(pad) if pad is not None else (eos[0] if isinstance(eos, list) else eos)
    bos = first("bos_token_id")
    return (int(bos) if bos is not None else None), eos, pad


def text_config(model: Any) -> Any:
    """The config of the model's text decoder (the model's own, unless it is multimodal)."""
    from opreg.llm._checkpoint import text_config as of_config

    return of_config(model.config)


def shares_buffer(decoder: Decoder) -> bool:
    """Whether GenAI may give each layer one buffer as past and present: only when every past
    input goes straight into, and every present output comes straight out of, ONNX Runtime's
    GroupQueryAttention, which writes the new keys and values into the past in place. A graph
    that concatenates past and new (the standard target) needs them apart."""
    graph = decoder.program.model.graph
    inputs, outputs = {v.name: v for v in graph.inputs}, {v.name: v for v in graph.outputs}
    for layer, tensor in decoder.layout.cache:
        if not tensor.grows:  # a convolution's state: GenAI gives it its own buffers
            continue
        for node, _ in inputs[tensor.past % layer].uses():
            if (node.domain, node.op_type) != ("com.microsoft", "GroupQueryAttention"):
                return False
        node = outputs[tensor.present % layer].producer()
        if node is None or (node.domain, node.op_type) != ("com.microsoft", "GroupQueryAttention"):
            return False
    return True


def save(decoder: Decoder, folder: str | os.PathLike[str], external_data: bool = True) -> tuple[Path, list[str]]:
    """Write the model, the tokenizer's files and ``genai_config.json`` as a new ``folder``, which
    replaces the old one whole (:mod:`opreg.llm._folder`); the folder and the names written.
    ``external_data``: the weights in a file beside the model (as the builder writes them: saved
    faster, and without a serialized copy of them in memory), else inside it (up to 2 GB)."""
    from opreg.llm._folder import write_folder

    genai = json.dumps(config(decoder), indent=2) + "\n"  # errors in the config before anything is written
    if decoder.tokenizer is None:
        from opreg.llm._checkpoint import no_tokenizer_warning

        logger.warning("%s", no_tokenizer_warning())

    def fill(staged: Path) -> list[str]:
        save_tokenizer(decoder.tokenizer, staged)
        decoder.program.save(staged / MODEL_FILE, external_data=external_data)
        (staged / GENAI_CONFIG).write_text(genai)
        if decoder.adapters:
            from opreg.llm._lora_inputs import write_adapters

            write_adapters(decoder.adapters, staged)
        return sorted(path.name for path in staged.iterdir())  # a new folder: all of it written here

    return write_folder(folder, fill)


def write_model_folder(
    folder: str | os.PathLike[str], model: Any, processor: Any, files: dict[str, dict[str, Any]], external_data: bool
) -> tuple[Path, list[str]]:
    """Write a folder of several models whole, as :func:`save` writes a decoder's
    (:mod:`opreg.llm._folder`): ``model``'s programs, its tokenizer, ``processor`` (a transformers
    feature extractor or image processor), ``files`` (JSON by name) and ``genai_config.json``; the
    folder and the names written."""
    from opreg.llm._folder import write_folder

    texts = {name: json.dumps(value, indent=2) + "\n" for name, value in files.items()}
    texts[GENAI_CONFIG] = json.dumps(model.genai_config(), indent=2) + "\n"  # errors before anything is written

    def fill(staged: Path) -> list[str]:
        save_tokenizer(model.tokenizer, staged)
        processor.save_pretrained(staged)
        for name, program in model.programs.items():
            program.save(staged / name, external_data=external_data)
        for name, text in texts.items():
            (staged / name).write_text(text)
        return sorted(path.name for path in staged.iterdir())  # a new folder: all of it written here

    return write_folder(folder, fill)


def save_tokenizer(tokenizer: Any, folder: Path) -> list[str]:
    """Write ``tokenizer`` (a transformers tokenizer, or a folder holding one) into ``folder``;
    the names written."""
    if tokenizer is None or tokenizer is False:
        return []
    if isinstance(tokenizer, (str, os.PathLike)):
        source = Path(tokenizer)
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        except Exception:  # a tokenizer transformers cannot load here: its files, as they are
            names = [name for name in TOKENIZER_FILES if (source / name).is_file()]
            for name in names:
                shutil.copyfile(source / name, folder / name)
            return names
    if not hasattr(tokenizer, "save_pretrained"):
        raise ExportError(
            f"tokenizer= takes a transformers tokenizer or a folder holding one, got {type(tokenizer).__name__}"
        )
    tokenizer.save_pretrained(folder)
    return sorted(path.name for path in folder.iterdir() if path.is_file())
