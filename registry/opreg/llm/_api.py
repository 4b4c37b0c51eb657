"""opreg.llm's export functions: one per family (:func:`export_decoder`, :func:`export_whisper`,
:func:`export_vision`) and :func:`export_checkpoint`, which picks the family; their keyword
parameters are built from :class:`opreg.llm.LLMSettings`' fields and :class:`opreg.ExportSettings`'
(:func:`opreg.llm._settings.takes_llm_settings`). Each sorts its options out and hands them to
:func:`opreg.llm._export.export`, which checks them once.

Imported by :mod:`opreg.llm` on first use of a function: building the signatures reads
:mod:`opreg.settings`, which the command line's parser does not import.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from opreg.errors import InvalidArgumentError
from opreg.llm._settings import LLMSettings, refuse_others, takes_llm_settings
from opreg.settings import ExportSettings

if TYPE_CHECKING:
    from opreg.llm._decoder import Decoder
    from opreg.llm._result import ExportedModel
    from opreg.llm._vision import VisionLanguage
    from opreg.llm._whisper import Whisper


@takes_llm_settings("causal")
def export_decoder(
    model: Any, output_folder: str | os.PathLike[str] | None = None, *, settings: ExportSettings | None = None,
    **options: Any,
) -> Decoder:  # fmt: skip
    """Export a transformers causal LM as one decoder for prefill and decode (the layout of
    :mod:`opreg.llm`), and write a folder ONNX Runtime GenAI loads when ``output_folder`` is given.

    Args:
        model: a ``transformers`` causal LM (``*ForCausalLM``, weights as they are), or the path of
            a local checkpoint folder (``config.json`` and weights; loaded in float32).
        output_folder: the folder to write ``model.onnx``, ``genai_config.json`` and the
            tokenizer's files as (checked before the export starts). It is written whole: at every
            instant it is the complete old folder or the complete new one (see
            :meth:`opreg.llm.ExportedModel.save`); entries of an old folder the export does not write are kept.
        options: the causal LM's options, :class:`LLMSettings`' fields (``target``, ``precision``,
            ``block_size``, ``symmetric``, ``accuracy_level``, ``tokenizer``, ``context_length``,
            ...: docs/language-models.md, "Options"), and :func:`opreg.export`'s keyword options
            (:class:`opreg.ExportSettings`: ``plugins``, ``registry``, ``fold_weights``, ...) passed
            on as they are, but those the decoder's layout sets (:data:`DECODER_OPTIONS`).
        settings: :func:`opreg.export`'s options prebuilt (its ``target`` is the decoder's unless
            ``target`` is given).

    Returns:
        a :class:`Decoder`: its :class:`opreg.OnnxProgram`, :class:`DecoderLayout`, ``verify``, ``save``.

    Raises:
        opreg.ExportError: the model is not a causal LM with a key/value cache opreg can lay out
            (a state-space or hybrid cache), a checkpoint lacks weights, or torch.export cannot
            capture it; the export's own errors as :func:`opreg.export`. Each is raised before
            the capture where the model's config or checkpoint shows it.
        opreg.SaveError: ``output_folder`` cannot be written (a file, a missing parent), at once.
        opreg.InvalidArgumentError: an option out of range (``context_length``, ``precision``, a quantization
            setting without a quantized precision, int4 at a target without ``com.microsoft``).
    """
    return _exported("causal", model, output_folder, settings, options, "export_decoder")


@takes_llm_settings("whisper")
def export_whisper(
    model: Any, output_folder: str | os.PathLike[str] | None = None, *, settings: ExportSettings | None = None,
    **options: Any,
) -> Whisper:  # fmt: skip
    """Export a transformers ``WhisperForConditionalGeneration`` as the encoder and decoder ONNX
    Runtime GenAI runs (the layout of :data:`opreg.llm.WHISPER_LAYOUT`), and write the folder GenAI loads
    when ``output_folder`` is given.

    Args:
        model: the model, or the path of a local checkpoint folder (loaded in float32).
        output_folder: where to write ``encoder.onnx``, ``decoder.onnx``, ``genai_config.json``,
            ``audio_processor_config.json`` (GenAI's log-mel features) and the tokenizer's and
            feature extractor's files.
        options, settings: Whisper's options (:class:`LLMSettings`' fields: ``feature_extractor``,
            ``precision``, ``context_length``, ..., default ``target`` ``settings``' target, else
            ``"onnx"``), and :func:`opreg.export`'s, as :func:`export_decoder` takes them.

    Returns:
        a :class:`Whisper`: the encoder's and decoder's :class:`opreg.OnnxProgram`, the
        :class:`WhisperLayout`, and ``verify``/``save``.

    Raises:
        opreg.ExportError: the model is not a Whisper, or torch.export cannot capture it.
    """
    return _exported("whisper", model, output_folder, settings or ExportSettings(), options, "export_whisper")


@takes_llm_settings("vision")
def export_vision(
    model: Any, output_folder: str | os.PathLike[str] | None = None, *, settings: ExportSettings | None = None,
    **options: Any,
) -> VisionLanguage:  # fmt: skip
    """Export a transformers vision-language model as the three models ONNX Runtime GenAI's
    multimodal pipeline runs (a vision encoder, an embedding model, a decoder on embeddings), and
    write the folder GenAI loads when ``output_folder`` is given.

    Args:
        model: a ``Gemma3ForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``,
            ``LlavaForConditionalGeneration``, ``Lfm2VlForConditionalGeneration``,
            ``Mistral3ForConditionalGeneration``, ``Qwen3VLForConditionalGeneration`` or
            ``Phi4MultimodalForCausalLM`` (its vision part), or the path of a local checkpoint folder
            (loaded in float32).
        output_folder: where to write ``vision.onnx``, ``embedding.onnx``, ``model.onnx``,
            ``genai_config.json``, ``processor_config.json`` (GenAI's image recipe) and the
            tokenizer's and image processor's files.
        options, settings: the vision-language models' options (:class:`LLMSettings`' fields:
            ``image_processor``, ``precision``, ``context_length``, ..., default ``target``
            ``settings``' target, else ``"onnx"``), and :func:`opreg.export`'s, as
            :func:`export_decoder` takes them.

    Returns:
        a :class:`VisionLanguage`: the three :class:`opreg.OnnxProgram`, the language model's
        :class:`DecoderLayout`, and ``verify``/``generate``/``save``.

    Raises:
        opreg.ExportError: the model is not of an architecture opreg lays out for GenAI, or
            torch.export cannot capture it.
    """
    return _exported("vision", model, output_folder, settings or ExportSettings(), options, "export_vision")


@takes_llm_settings(None)
def export_checkpoint(
    source: Any, output_folder: str | os.PathLike[str] | None = None, settings: LLMSettings | None = None,
    **options: Any,
) -> ExportedModel:  # fmt: skip
    """Export a transformers checkpoint folder (or model) with its family's export, picked from its
    config (a causal LM, Whisper, a vision-language model: ``opreg llm export`` calls this), and
    write the folder ONNX Runtime GenAI loads when ``output_folder`` is given.

    Args:
        source: a checkpoint folder (``config.json``, weights, tokenizer), or a transformers model.
        output_folder: the folder to write, as the family's function writes it.
        settings: the options (:class:`LLMSettings`); an option the family does not take, given, is
            refused (:class:`opreg.InvalidArgumentError`), naming the families that take it.
        options: :class:`LLMSettings`' fields, replacing ``settings``' , and :func:`opreg.export`'s
            keyword options, as :func:`export_decoder` takes them.

    Returns:
        the family's :class:`ExportedModel` (a :class:`Decoder`, :class:`Whisper` or
        :class:`VisionLanguage`).

    Raises:
        as the family's function; a config no family serves is refused as :func:`export_decoder`
        refuses it, with the reason.
    """
    from opreg.llm import _export as exporting

    if settings is not None and not isinstance(settings, LLMSettings):
        raise InvalidArgumentError(f"settings= takes an opreg.llm.LLMSettings, got {type(settings).__name__}")
    export_options = {name: value for name, value in options.items() if name not in LLMSettings.names()}
    given = {name: value for name, value in options.items() if name not in export_options}
    llm = dataclasses.replace(settings or LLMSettings(), **given)
    return exporting.export(None, source, output_folder, llm, None, export_options, "export_checkpoint")


def _exported(
    family: str, source: Any, output_folder: Any, given: ExportSettings | None, options: dict[str, Any], function: str
) -> Any:
    """The family's function's call: its options sorted into :class:`LLMSettings` (those of
    another family refused first) and :func:`opreg.export`'s."""
    from opreg.llm import _export as exporting

    llm = {name: value for name, value in options.items() if name in LLMSettings.names()}
    refuse_others(family, llm)
    export_options = {name: value for name, value in options.items() if name not in llm}
    return exporting.export(family, source, output_folder, LLMSettings(**llm), given, export_options, function)
