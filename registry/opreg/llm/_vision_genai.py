"""The vision-language folder ONNX Runtime GenAI loads: ``vision.onnx``, ``embedding.onnx``,
``model.onnx``, ``genai_config.json``, ``processor_config.json``, the tokenizer's and the image
processor's files.

``genai_config.json`` has the three sections GenAI's multimodal pipeline reads (as its test
folders for ``gemma3`` and ``qwen2_5_vl`` have them): ``vision`` (``pixel_values`` in,
``image_features`` out, and its image recipe, ``processor_config.json``), ``embedding``
(``input_ids`` and ``image_features`` in, ``inputs_embeds`` out) and ``decoder`` (the text
decoder's section, on ``inputs_embeds``). ``processor_config.json`` is the recipe ONNX Runtime
Extensions follows to turn an image file into ``pixel_values``, with the transformers image
processor's size, resampling, scale, mean and standard deviation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from opreg.errors import ExportError
from opreg.llm import _genai

VisionLanguage = Any
"""An :class:`opreg.llm.VisionLanguage` (not imported: ``_vision`` imports this module)."""
PROCESSOR_CONFIG = "processor_config.json"
VISION_FILE, EMBEDDING_FILE, DECODER_FILE = "vision.onnx", "embedding.onnx", "model.onnx"


def config(vl: VisionLanguage) -> dict[str, Any]:
    """``genai_config.json`` for ``vl``: the text decoder's (:func:`opreg.llm._genai.config`) on
    embeddings, with the vision and embedding sections."""
    architecture = vl.architecture
    made = _genai.config(vl)
    model = made["model"]
    model["type"] = architecture.genai_type or vl.model.config.model_type
    decoder = model["decoder"]
    decoder["filename"] = DECODER_FILE
    decoder["hidden_size"] = architecture.embeds_width(vl.model, decoder["hidden_size"])  # GenAI's embeddings' width
    inputs = {"inputs_embeds": "inputs_embeds", **{k: v for k, v in decoder["inputs"].items() if k != "input_ids"}}
    if architecture.reads_input_ids:
        inputs["input_ids"] = "input_ids"
    decoder["inputs"] = inputs
    extra = architecture.genai(vl.model)
    recipe = {"config_filename": PROCESSOR_CONFIG} if architecture.genai_type is not None else {}
    vision = {
        "session_options": _genai.session_options(), "filename": VISION_FILE, **recipe,
        "inputs": {name: name for name in vl.vision.input_names}, "outputs": {"image_features": "image_features"},
        **extra.pop("vision", {}),  # last: an architecture may map GenAI's input names to its own
    }  # fmt: skip
    embedding = {
        "session_options": _genai.session_options(), "filename": EMBEDDING_FILE,
        "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
        "outputs": {"inputs_embeds": "inputs_embeds"},
    }  # fmt: skip
    model.update(extra, embedding=embedding, vision=vision)
    return made


def image_processor(vl: VisionLanguage) -> Any:
    """The transformers image processor of ``vl``: the one given, the one in the folder given, else
    the architecture's default for the model's image size."""
    return image_processor_of(vl.image_processor, vl.architecture, vl.model)


def image_processor_of(given: Any, architecture: Any, model: Any) -> Any:
    """:func:`image_processor` of a processor or folder ``given`` (or ``None``), before the export."""
    if isinstance(given, (str, os.PathLike)):
        saved = Path(given) / "preprocessor_config.json"
        given = None
        if saved.is_file():
            from transformers import AutoImageProcessor

            given = AutoImageProcessor.from_pretrained(saved.parent, trust_remote_code=False)
    if given is None:
        return architecture.default_image_processor(model)
    if not hasattr(given, "image_mean") or not hasattr(given, "save_pretrained"):
        raise ExportError(
            f"image_processor= takes a transformers image processor or a folder holding one, got {type(given).__name__}"
        )
    return given


def save(vl: VisionLanguage, folder: str | os.PathLike[str], external_data: bool) -> tuple[Path, list[str]]:
    """Write the folder (:func:`opreg.llm._genai.write_model_folder`); the folder and the names written."""
    processor = image_processor(vl)
    recipe = vl.architecture.processor_config(processor)
    files = {PROCESSOR_CONFIG: recipe} if recipe is not None else {}  # none where GenAI has no pipeline
    return _genai.write_model_folder(folder, vl, processor, files, external_data)
