"""A causal-LM family's other tasks in ``opreg export FOLDER``: optimum-onnx 0.1.0's
``feature-extraction`` (``XModel``: ``last_hidden_state``), ``text-classification``
(``XForSequenceClassification``: ``logits``, pooled at each row's last token that is not
``pad_token_id``), ``token-classification`` (``logits``) and ``question-answering``
(``start_logits``, ``end_logits``), each as its ``TextDecoderOnnxConfig`` without past lays it out:

- ``model.onnx`` taking ``input_ids`` and ``attention_mask`` ``[batch_size, sequence_length]``
  and, for ``feature-extraction`` of the families whose config class is a
  ``TextDecoderWithPositionIdsOnnxConfig`` (Llama, GPT-2, Phi...; not Gemma, BLOOM, MPT, nor
  Falcon with ALiBi), ``position_ids``; no ``past_key_values`` in, no ``present`` out.

The families and their tasks are the pairs optimum lists (``register_tasks_manager_onnx``), each
verified by tests/test_checkpoint_causal_heads.py; every family's base model also as optimum's
``feature-extraction-with-past`` (:data:`opreg_transformers.causal.FEATURES`: exported by
:mod:`opreg.llm`, :func:`opreg_transformers.causal.plan`, its ``position_ids`` as here:
:func:`takes_positions`). Data and plans only: importing this module
imports neither torch nor transformers (``plan`` imports transformers, the build step torch).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import opreg
from opreg_transformers import causal, decoders, encoders

FEATURE_EXTRACTION = encoders.FEATURE_EXTRACTION
CLASSIFICATION = "text-classification"
ALIBI = "alibi"
_CLASSIFY = (FEATURE_EXTRACTION, CLASSIFICATION)
_LABEL = (*_CLASSIFY, "token-classification")
_ANSWER = (*_CLASSIFY, "question-answering")


@dataclasses.dataclass(frozen=True)
class Family:
    """One causal-LM family's tasks besides text generation.

    Fields:
        position_ids: whether optimum gives ``feature-extraction`` a ``position_ids`` input
            (its config class is a ``TextDecoderWithPositionIdsOnnxConfig``); ``"alibi"``: unless
            the config's ``alibi`` is set (Falcon).
        tasks: the tasks optimum lists for it besides ``text-generation(-with-past)``.
    """

    position_ids: bool | str
    tasks: tuple[str, ...] = (FEATURE_EXTRACTION,)


FAMILIES: dict[str, Family] = {
    "arcee": Family(True),
    "bloom": Family(False, _LABEL),
    "codegen": Family(True),
    "cohere": Family(True),
    "falcon": Family(ALIBI, (FEATURE_EXTRACTION, "token-classification", "question-answering")),
    "gemma": Family(False, _CLASSIFY),
    "gemma2": Family(False, _CLASSIFY),
    "gemma3_text": Family(False),
    "glm": Family(True),
    "gpt2": Family(True, _LABEL),
    "gpt_bigcode": Family(True, _LABEL),
    "gpt_neo": Family(True, _CLASSIFY),
    "gpt_neox": Family(True, _CLASSIFY),
    "gpt_oss": Family(False),
    "gptj": Family(True, _ANSWER),
    "granite": Family(True),
    "helium": Family(True),
    "llama": Family(True, _CLASSIFY),
    "mistral": Family(True, _CLASSIFY),
    "mpt": Family(False, _LABEL),
    "nemotron": Family(False),
    "olmo": Family(True),
    "olmo2": Family(True),
    "opt": Family(True, _ANSWER),
    "phi": Family(True, _CLASSIFY),
    "phi3": Family(True, _CLASSIFY),
    "qwen2": Family(True, _LABEL),
    "qwen3": Family(True, _CLASSIFY),
    "qwen3_moe": Family(True, _LABEL),
    "smollm3": Family(True, _CLASSIFY),
    "stablelm": Family(True),
}
"""``{model_type: Family}``: optimum's pairs of these causal-LM families and a task other than
text generation, each exported and verified (tests/test_checkpoint_causal_heads.py exports a few).
Left out, with the reason: DeepSeek-V3 (``feature-extraction``; opreg.llm does not export its text
generation either): its multi-head latent attention is not captured at a tiny config that runs
eagerly (torch.export: ``Attempting to broadcast a dimension of length 8 at -1``, in its attention
call), and a config transformers 4.57 wrote does not run eagerly in transformers 5 (``The size of
tensor a (32) must match the size of tensor b (8)``, its rotary head size read anew); Gemma 3
(``gemma3``: a vision-language config, ``text_config`` inside; ``gemma3_text`` is here). Falcon
with ``alibi`` builds its bias in bfloat16, which ONNX Runtime's CPU cannot multiply: it is exported
with ``--keep-float32`` (the verification's error says so)."""


def recognition(library: str, family: Family, config: dict[str, Any], evidence: str) -> opreg.Recognition:
    """The family's tasks, text generation's first when ``architectures`` names a causal LM; the
    one inferred is the head ``architectures`` names (``LlamaForSequenceClassification``:
    ``text-classification``, ``LlamaModel``: ``feature-extraction``), else text generation with past."""
    task = encoders.task_of(list(config.get("architectures") or []))
    generates = causal.is_causal(config)
    tasks = (*(causal.TASKS if generates else ()), *family.tasks, causal.FEATURES)
    if task not in family.tasks:
        task = causal.TASK if generates else FEATURE_EXTRACTION
    return opreg.Recognition(library, tasks, task, evidence)


def is_text(config: dict[str, Any]) -> bool:
    """Whether ``config`` (``config.json``) is a text decoder's, not a vision-language or encoder-decoder model's."""
    return not config.get("is_encoder_decoder") and not any(key in config for key in causal.NOT_TEXT)


def plan(
    checkpoint: opreg.Checkpoint,
    family: Family,
    config: Any,
    task: str,
    files: tuple[opreg.FileCopy, ...],
    notes: tuple[str, ...] = (),
) -> opreg.ExportPlan:
    """``model.onnx`` of ``task``'s head of ``checkpoint`` (its transformers ``config``), its
    cache off; ``files`` copied. A classification head pools each row's last token that is not
    ``pad_token_id``: a config without one takes the tokenizer's (:func:`pad_token`)."""
    auto, outputs = encoders.TASKS[task]
    text = config.get_text_config(decoder=True)
    if task == CLASSIFICATION and getattr(text, "pad_token_id", None) is None:
        text.pad_token_id = pad_token(checkpoint, type(config).__name__)
        notes = (*notes, f"pad_token_id {text.pad_token_id} (the tokenizer's; config.json has none) is where the "
                 "classification head stops reading each row, as optimum takes it")  # fmt: skip
    sequence = decoders.sequence_dim(text)
    shape = (decoders.BATCH.name, sequence.name)
    inputs = [
        opreg.ModelInput("input_ids", shape, fill="ids", high=int(text.vocab_size)),
        opreg.ModelInput("attention_mask", shape, fill="mask"),
    ]
    if task == FEATURE_EXTRACTION and takes_positions(family, text):
        inputs.append(opreg.ModelInput("position_ids", shape, fill="ids", high=decoders.positions(sequence)))
    build = functools.partial(_build, checkpoint, config, auto)
    component = opreg.Component("model", "model.onnx", build, tuple(inputs), outputs, (decoders.BATCH, sequence))
    return opreg.ExportPlan("transformers", task, (component,), files, notes=notes)


def takes_positions(family: Family, text: Any) -> bool:
    """Whether optimum's feature extraction of ``family`` takes ``position_ids``, for the text
    decoder's config ``text`` (Falcon: unless its ``alibi`` is set)."""
    return not getattr(text, "alibi", False) if family.position_ids == ALIBI else bool(family.position_ids)


def pad_token(checkpoint: opreg.Checkpoint, config_class: str) -> int:
    """The pad token id of the folder's tokenizer, as optimum takes it for a config without one;
    refused when the tokenizer has none either: transformers' head then reads the last position and
    refuses a batch of more than one row."""
    import transformers

    try:
        pad = transformers.AutoTokenizer.from_pretrained(checkpoint.path).pad_token_id
    except Exception as e:  # no tokenizer, or one transformers cannot build
        why = f"its tokenizer does not load ({type(e).__name__}: {str(e).splitlines()[0]})"
        raise opreg.CheckpointError(_no_pad(checkpoint, config_class, why)) from e
    if pad is None:
        raise opreg.CheckpointError(_no_pad(checkpoint, config_class, "its tokenizer has no pad token"))
    return int(pad)


def _no_pad(checkpoint: opreg.Checkpoint, config_class: str, why: str) -> str:
    return (
        f"{checkpoint.file('config.json')} has no pad_token_id and {why}: {config_class}'s classification head "
        "pools each row's last token that is not padding and cannot tell padding without it; set pad_token_id "
        "in config.json (the tokenizer's pad token)"
    )


def _build(checkpoint: opreg.Checkpoint, config: Any, auto: str) -> Any:
    from opreg_transformers import loading

    model = loading.load(checkpoint.path, auto, config)
    model.config.use_cache = False  # no past out: optimum's model without past
    return model
