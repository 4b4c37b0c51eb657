"""A causal LM without its cache: optimum-onnx 0.1.0's ``text-generation`` (``TextDecoderOnnxConfig``
and ``TextDecoderWithPositionIdsOnnxConfig`` without past; ``M2M100OnnxConfig.inputs_for_causal_lm``
for the ``...ForCausalLM`` decoders of BART, mBART, Marian, Pegasus and Blenderbot):

- ``model.onnx``: ``input_ids``, ``attention_mask`` and, where the architecture's ``forward``
  takes them (Llama, GPT-2, OPT...; not BLOOM, MPT or the BART-like decoders), ``position_ids``,
  each ``[batch_size, sequence_length]`` -> ``logits``; no ``past_key_values`` in, no ``present``
  out: every step runs the whole sequence.

The with-past model (``text-generation-with-past``) is :mod:`opreg_transformers.causal`'s. Importing
this module imports neither torch nor transformers: ``plan`` imports transformers (for the
architecture's ``forward``), the build step torch.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import opreg

TASK = "text-generation"
LANGUAGE_MODEL_OF = ("gemma3",)
"""Vision-language model types whose language model alone optimum exports for ``text-generation``
(``input_ids`` and ``attention_mask`` to ``logits``, no image): their whole model, vision encoder
and cache included, is ``opreg llm export``'s."""
BATCH = opreg.DynamicDim("batch_size", example=2, other=3)


def plan(checkpoint: opreg.Checkpoint, config: Any, files: tuple[opreg.FileCopy, ...]) -> opreg.ExportPlan:
    """``model.onnx`` of the ``AutoModelForCausalLM`` of ``checkpoint`` (its transformers
    ``config``), its cache off; ``files`` copied."""
    import transformers

    model_class = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    text = config.get_text_config(decoder=True)
    sequence = sequence_dim(text)
    shape = (BATCH.name, sequence.name)
    inputs = [
        opreg.ModelInput("input_ids", shape, fill="ids", high=int(text.vocab_size)),
        opreg.ModelInput("attention_mask", shape, fill="mask"),
    ]
    if "position_ids" in inspect.signature(model_class.forward).parameters:
        inputs.append(opreg.ModelInput("position_ids", shape, fill="ids", high=positions(sequence)))
    component = opreg.Component(
        "model", "model.onnx", functools.partial(_build, checkpoint, config), tuple(inputs), ("logits",),
        (BATCH, sequence),
    )  # fmt: skip
    notes = (
        "the language model alone, without its cache and vision encoder (optimum's text-generation of a "
        "vision-language config): `opreg llm export` writes the whole model"
        if config.model_type in LANGUAGE_MODEL_OF
        else "the model without its cache (optimum's text-generation): text-generation-with-past decodes faster",
    )
    return opreg.ExportPlan("transformers", TASK, (component,), files, notes=notes)


def sequence_dim(text: Any) -> opreg.DynamicDim:
    """``sequence_length`` as the decoder's (``text``, its transformers config) positions allow:
    up to one token short of them (a model may special-case a sequence filling them, MPT's ALiBi
    slice: a guard on the range's top torch.export refuses)."""
    longest = int(getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None) or 2048)
    return opreg.DynamicDim("sequence_length", example=min(16, longest), other=min(7, longest), max=longest - 1)


def positions(sequence: opreg.DynamicDim) -> int:
    """How many positions the decoder has (``position_ids`` stay below it): one more than the longest sequence."""
    return int(sequence.max or 0) + 1


def _build(checkpoint: opreg.Checkpoint, config: Any) -> Any:
    from opreg_transformers import loading
    from opreg_transformers.decoder_steps import WithoutCache

    return WithoutCache(loading.load(checkpoint.path, "AutoModelForCausalLM", config))
