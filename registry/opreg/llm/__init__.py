"""Language models: a transformers causal LM as one ONNX decoder for prefill and decode,
in a folder ONNX Runtime GenAI runs.

``opreg.llm.export_decoder(model_or_folder, output_folder)`` (and ``opreg llm export FOLDER -o
OUT``) exports the model with its KV cache as inputs and outputs, in the names and layout ONNX
Runtime GenAI reads (:data:`LAYOUT`):

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

import os
from typing import TYPE_CHECKING, Any

from opreg.registry.targets import TargetLike
from opreg.settings import ExportSettings, takes_settings

if TYPE_CHECKING:
    from opreg.llm._decoder import Decoder, DecoderLayout
    from opreg.llm._vision import VisionLanguage
    from opreg.llm._whisper import Whisper, WhisperLayout

__all__ = ["DECODER_OPTIONS", "LAYOUT", "WHISPER_LAYOUT", "Decoder", "DecoderLayout", "VisionLanguage", "Whisper",
           "WhisperLayout", "export_decoder", "export_vision", "export_whisper"]  # fmt: skip

DECODER_OPTIONS = ("dynamic_shapes", "state")
"""The options of :class:`opreg.ExportSettings` the decoder's layout sets: :func:`export_decoder`
(and :func:`export_whisper`, :func:`export_vision`) do not take them."""

LAYOUT = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "position_ids": "position_ids",
    "past_key": "past_key_values.%d.key",
    "past_value": "past_key_values.%d.value",
    "logits": "logits",
    "present_key": "present.%d.key",
    "present_value": "present.%d.value",
    "past_conv": "past.%d.conv",
    "present_conv": "present.%d.conv",
}
"""The decoder's input and output names (``%d``: the layer), as ONNX Runtime GenAI's
``genai_config.json`` names them."""


@takes_settings(leave_out=(*DECODER_OPTIONS, "target"))
def export_decoder(
    model: Any,
    output_folder: str | os.PathLike[str] | None = None,
    *,
    target: TargetLike | None = None,
    precision: str = "fp32",
    block_size: int | None = None,
    symmetric: bool | None = None,
    accuracy_level: int | None = None,
    tokenizer: Any = None,
    external_data: bool = True,
    context_length: int | None = None,
    allow_longer_context: bool = False,
    streaming: bool | None = None,
    settings: ExportSettings | None = None,
    **options: Any,
) -> Decoder:
    """Export a transformers causal LM as one decoder for prefill and decode (the layout of
    :mod:`opreg.llm`), and write a folder ONNX Runtime GenAI loads when ``output_folder`` is given.

    Args:
        model: a ``transformers`` causal LM (``*ForCausalLM``, weights as they are), or the path of
            a local checkpoint folder (``config.json`` and weights; loaded in float32).
        output_folder: the folder to write ``model.onnx``, ``genai_config.json`` and the
            tokenizer's files as (checked before the export starts). It is written whole: at every
            instant it is the complete old folder or the complete new one (see
            :meth:`Decoder.save`); entries of an old folder the export does not write are kept.
        target: as :func:`opreg.export` takes it: ``"onnxruntime"`` (with ``opreg-ort-contrib``:
            ONNX Runtime's fused kernels, the cache written in place) or ``"onnx"`` (plain ONNX:
            attention as Attention or MatMul/Softmax, the cache a Concat of past and new keys and
            values); default the fastest installed (``"onnxruntime"`` when the pack is there,
            else ``"onnx"``).
        precision: the weights of the linear layers: ``"fp32"`` (as the model has them),
            ``"int8"`` or ``"int4"`` (block-wise, ONNX Runtime's ``MatMulNBits``; a tied
            embedding table is then stored once, quantized, and read by ``GatherBlockQuantized``;
            needs a target with ``com.microsoft``).
        block_size, symmetric, accuracy_level: how int8/int4 weights are quantized; default
            ``opreg_ort_contrib.MatMulNBitsQuantization``'s defaults, the fastest measured on CPU.
        tokenizer: what to save beside the model: a transformers tokenizer, or a folder holding
            one; by default the checkpoint folder's, when ``model`` is a folder (a warning if it
            has none: GenAI needs one to encode text); ``False``: none.
        options, settings: :func:`opreg.export`'s keyword options (:class:`opreg.ExportSettings`:
            ``plugins``, ``registry``, ``fold_weights``, ...) passed on as they are, or prebuilt
            (its ``target`` is the decoder's unless ``target`` is given); not those the decoder's
            layout sets (:data:`DECODER_OPTIONS`).
        external_data: the weights in a file beside ``model.onnx`` (default), else inside it.
        context_length: the longest sequence GenAI may generate (``genai_config.json``'s
            ``context_length`` and ``search.max_length``), from 1 to 2**31 - 1; default the
            model's position limit (``max_position_embeddings``), and above it only with
            ``allow_longer_context=True``.
        streaming: for a checkpoint folder: build the model on ``meta`` and read each weight from its
            safetensors only as ``model.onnx`` is written (cast, packed, quantized there), the same bytes
            as ``streaming=False`` (``from_pretrained`` first); default: when the folder holds safetensors.

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
    from opreg import _heap
    from opreg.llm import _folder

    if output_folder is not None:
        _folder.check_folder(output_folder)
    with _heap.quiet():  # the collector off torch's and transformers' objects, from their import to the save
        from opreg.llm import _decoder

        decoder = _decoder.export_decoder(
            model, target=target, precision=precision, block_size=block_size, symmetric=symmetric,
            accuracy_level=accuracy_level, tokenizer=tokenizer, context_length=context_length,
            allow_longer_context=allow_longer_context, streaming=streaming, settings=settings, **options,
        )  # fmt: skip
        return _saved(decoder, output_folder, external_data)


@takes_settings(leave_out=DECODER_OPTIONS)
def export_whisper(
    model: Any,
    output_folder: str | os.PathLike[str] | None = None,
    *,
    tokenizer: Any = None,
    feature_extractor: Any = None,
    external_data: bool | None = None,
    context_length: int | None = None,
    precision: str = "fp32",
    settings: ExportSettings | None = None,
    **options: Any,
) -> Whisper:
    """Export a transformers ``WhisperForConditionalGeneration`` as the encoder and decoder ONNX
    Runtime GenAI runs (the layout of :data:`opreg.llm.WHISPER_LAYOUT`), and write the folder GenAI loads
    when ``output_folder`` is given.

    Args:
        model: the model, or the path of a local checkpoint folder (loaded in float32).
        output_folder: where to write ``encoder.onnx``, ``decoder.onnx``, ``genai_config.json``,
            ``audio_processor_config.json`` (GenAI's log-mel features) and the tokenizer's and
            feature extractor's files.
        options, settings: :func:`opreg.export`'s keyword options, as :func:`export_decoder`
            takes them (``target``, ``plugins``, ``registry``, ...).
        external_data: as :meth:`Whisper.save` takes it (default: the weights in side files).
        tokenizer: a transformers tokenizer or a folder holding one; by default the checkpoint
            folder's, when ``model`` is a folder.
        feature_extractor: a transformers ``WhisperFeatureExtractor`` or a folder holding one; by
            default the checkpoint folder's, else Whisper's defaults for the model's mel bins.
        context_length: the longest sequence GenAI may generate; default (and at most) the
            decoder's ``max_target_positions``.
        precision: ``"fp32"`` (the weights as they are), ``"int8"`` or ``"int4"``: the linear
            layers' weights as ONNX Runtime's MatMulNBits (``target="onnxruntime"``), quantized as
            GenAI's builder does for CPU (blocks of 32, symmetric, accuracy level 4).

    Returns:
        a :class:`Whisper`: the encoder's and decoder's :class:`opreg.OnnxProgram`, the
        :class:`WhisperLayout`, and ``verify``/``save``.

    Raises:
        opreg.ExportError: the model is not a Whisper, or torch.export cannot capture it.
    """
    from opreg.llm import _whisper

    whisper = _whisper.export_whisper(
        model, tokenizer=tokenizer, feature_extractor=feature_extractor, context_length=context_length,
        precision=precision, settings=settings, **options,
    )  # fmt: skip
    return _saved(whisper, output_folder, external_data)


@takes_settings(leave_out=DECODER_OPTIONS)
def export_vision(
    model: Any,
    output_folder: str | os.PathLike[str] | None = None,
    *,
    tokenizer: Any = None,
    image_processor: Any = None,
    external_data: bool | None = None,
    context_length: int | None = None,
    precision: str = "fp32",
    settings: ExportSettings | None = None,
    **options: Any,
) -> VisionLanguage:
    """Export a transformers vision-language model as the three models ONNX Runtime GenAI's
    multimodal pipeline runs (a vision encoder, an embedding model, a decoder on embeddings), and
    write the folder GenAI loads when ``output_folder`` is given.

    Args:
        model: a ``Gemma3ForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration`` or
            ``LlavaForConditionalGeneration``, or the path of a local checkpoint folder (loaded in
            float32).
        output_folder: where to write ``vision.onnx``, ``embedding.onnx``, ``model.onnx``,
            ``genai_config.json``, ``processor_config.json`` (GenAI's image recipe) and the
            tokenizer's and image processor's files.
        options, settings: :func:`opreg.export`'s keyword options, as :func:`export_decoder`
            takes them.
        tokenizer: a transformers tokenizer or a folder holding one; by default the checkpoint
            folder's, when ``model`` is a folder.
        image_processor: a transformers image processor or a folder holding one; by default the
            checkpoint folder's, else the architecture's default for the model's image size.
        external_data: as :meth:`VisionLanguage.save` takes it (default: the weights in side files).
        context_length: the longest sequence GenAI may generate; default the language model's
            ``max_position_embeddings``.
        precision: as :func:`export_whisper` takes it, for the decoder's linear layers (the
            language model's weights; the vision encoder stays in float32).

    Returns:
        a :class:`VisionLanguage`: the three :class:`opreg.OnnxProgram`, the language model's
        :class:`DecoderLayout`, and ``verify``/``generate``/``save``.

    Raises:
        opreg.ExportError: the model is not of an architecture opreg lays out for GenAI, or
            torch.export cannot capture it.
    """
    from opreg.llm import _vision

    exported = _vision.export_vision(
        model, tokenizer=tokenizer, image_processor=image_processor, context_length=context_length,
        precision=precision, settings=settings, **options,
    )  # fmt: skip
    return _saved(exported, output_folder, external_data)


def _saved(exported: Any, output_folder: str | os.PathLike[str] | None, external_data: bool | None) -> Any:
    """``exported`` (a :class:`Decoder`, :class:`Whisper` or :class:`VisionLanguage`), after writing
    its folder when ``output_folder`` is given."""
    if output_folder is not None:
        exported.save(output_folder, external_data=external_data)
    return exported


def __getattr__(name: str) -> Any:
    if name == "WHISPER_LAYOUT":
        from opreg.llm import _whisper_genai

        return _whisper_genai.WHISPER_LAYOUT
    if name == "VisionLanguage":
        from opreg.llm import _vision

        return _vision.VisionLanguage
    if name in ("Decoder", "DecoderLayout"):
        from opreg.llm import _decoder

        return getattr(_decoder, name)
    if name in ("Whisper", "WhisperLayout"):
        from opreg.llm import _whisper

        return getattr(_whisper, name)
    raise AttributeError(f"module 'opreg.llm' has no attribute {name!r}")
