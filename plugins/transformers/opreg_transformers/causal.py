"""Causal LMs in ``opreg export FOLDER``: a ``config.json`` whose architectures name a text-only
``...ForCausalLM`` (or ``...LMHeadModel``) is exported whole by :func:`opreg.llm.export_checkpoint`
(the plan's :attr:`opreg.ExportPlan.export`): the decoder captured once, its weights streamed from
the safetensors, in optimum-onnx's ``text-generation-with-past`` layout (``model.onnx``,
``config.json``, ``generation_config.json``, the tokenizer) unless ``layout="genai"`` (``--layout
genai``) asks for ONNX Runtime GenAI's folder.

Verified as ``opreg llm export --verify`` verifies (the decoder against transformers at four
(batch, sequence, past) sizes and a left-padded batch), then greedy generation from the written
``model.onnx`` in ONNX Runtime, as optimum's ``ORTModelForCausalLM`` and transformers.js run it
(an empty past first, the presents fed back), against ``generate`` (:mod:`opreg_transformers.causal_loop`).

The same export writes optimum's ``feature-extraction-with-past`` (:data:`FEATURES`) of a causal-LM
family's base model (``LlamaModel``: no LM head; :attr:`opreg.llm.LLMSettings.features`): the
model's prefill, ``last_hidden_state`` and every layer's ``present.%d.key``/``.value`` out, no past
in, verified at the same four (batch, sequence) sizes after no past and a left-padded batch; no
generation (it has no head).

Whisper and the vision-language models are not routed here: their folders stay ``opreg llm
export``'s (their ``config.json`` names a ``...ForConditionalGeneration``, or holds a
``vision_config``/``audio_config``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import opreg

log = logging.getLogger(__name__)

TASK = "text-generation-with-past"
"""optimum's task of a causal LM with its cache, the one inferred (optimum's ``text-generation``,
the model without past inputs, is :mod:`opreg_transformers.decoders`', when asked)."""
TASKS = (TASK, "text-generation")
FEATURES = "feature-extraction-with-past"
"""optimum's task of a causal LM's base model with its cache out (:mod:`opreg_transformers.causal_heads`
lists it for every family there)."""
LAYOUT = "optimum"
"""The layout ``opreg export`` writes a causal LM in unless ``--layout`` asks another."""
HEADS = ("ForCausalLM", "LMHeadModel")
"""How a causal LM's class name ends in ``config.json``'s ``architectures``."""
NOT_TEXT = ("vision_config", "audio_config", "speech_config", "text_config", "encoder", "decoder")
"""A config's keys that make it more than a text decoder: its folder stays ``opreg llm export``'s."""
STREAMING_FAILED = (opreg.StreamingError, opreg.WeightsError)
"""What opreg.llm's streamed export raises when the weightless model cannot run (OPT's mask reads a
value; GPT-OSS's experts want bfloat16 on the meta device) or the safetensors' names are an older
transformers' (GPT-NeoX's ``embed_out``, which transformers' own loader renames): the export is then
done again with the weights loaded first."""
_DECIDED = ("target", "dynamic_shapes", "state", "weights", "host")
"""ExportSettings fields opreg.llm decides or takes another way (the target by name)."""


def is_causal(config: dict[str, Any]) -> bool:
    """Whether ``config`` (``config.json``) is a text-only causal LM's."""
    architectures = config.get("architectures") or []
    if config.get("is_encoder_decoder") or any(key in config for key in NOT_TEXT):
        return False
    return any(str(name).endswith(HEADS) for name in architectures)


def recognition(library: str, evidence: str) -> opreg.Recognition:
    return opreg.Recognition(library, TASKS, TASK, evidence)


def plan(library: str, checkpoint: opreg.Checkpoint, **options: Any) -> opreg.ExportPlan:
    """The whole export handed to :mod:`opreg.llm` (:func:`_export`) with ``options``
    (:class:`opreg.llm.LLMSettings`' fields): ``streaming=False``, the model loaded with its weights
    first (``--no-streaming``), for a decoder that does not run on the meta device (the
    ``...ForCausalLM`` of BART-like families: their causal mask reads a value); ``features=True``,
    the base model's :data:`FEATURES` (``position_ids=False``: without them, as optimum's config of
    the family takes none)."""
    task = FEATURES if options.get("features") else TASK
    notes = (
        f"a causal LM is exported by opreg.llm (as `opreg llm export` exports it): optimum's {task} layout"
        + ("" if task == FEATURES else " unless --layout genai"),
    )
    export = functools.partial(_export, **options) if options else _export
    return opreg.ExportPlan(library, task, (), notes=notes, export=export)


def _export(handover: opreg.Handover, **more: Any) -> opreg.HandoverResult:
    import opreg.llm
    from opreg_transformers import causal_loop

    settings = handover.settings
    defaults = opreg.ExportSettings()
    options = {
        field.name: getattr(settings, field.name)
        for field in dataclasses.fields(settings)
        if field.name not in _DECIDED and getattr(settings, field.name) != getattr(defaults, field.name)
    } | more
    export = functools.partial(
        opreg.llm.export_checkpoint, handover.checkpoint.path, handover.output,
        layout=handover.layout or LAYOUT, target=settings.target,
    )  # fmt: skip
    try:
        exported = export(**options)
    except STREAMING_FAILED as e:
        if "streaming" in options:
            raise
        log.warning("exporting it again with its weights loaded first (--no-streaming): streamed, %s", e)
        exported = export(**options, streaming=False)
    if not handover.verify:
        return opreg.HandoverResult(dict(exported.programs))
    verification = opreg.Verification("onnxruntime", tuple(exported.verify()))
    verified = {file: (verification,) for file in exported.programs}
    if options.get("features"):  # a base model: no head to generate with
        return opreg.HandoverResult(dict(exported.programs), verified)
    summary = causal_loop.check(handover.output, handover.checkpoint.path)
    return opreg.HandoverResult(dict(exported.programs), verified, (f"generation: {summary}",))
