"""BART's and mBART's classification heads: optimum-onnx 0.1.0's ``text-classification`` and
``question-answering`` of these encoder-decoder families (``M2M100OnnxConfig.inputs_for_other_tasks``):
one ``model.onnx`` taking ``input_ids`` and ``attention_mask`` ``[batch_size, sequence_length]``
(the decoder reads the same tokens shifted right, inside the model) -> ``logits``, or
``start_logits`` and ``end_logits``.

``...ForSequenceClassification`` classifies each row's last end-of-sequence token's state; transformers
finds it with a boolean mask whose size depends on the values (refusing rows with unequal counts),
which torch.export cannot capture over a range. The exported module picks the last
``eos_token_id`` of each row by its position instead (:class:`~opreg_transformers.seq2seq_steps.EosClassification`):
the same state wherever transformers accepts the input. Importing this module imports neither
torch nor transformers.
"""

from __future__ import annotations

import functools
from typing import Any

import opreg

CLASSIFICATION = "text-classification"
HEADS: dict[str, tuple[str, tuple[str, ...]]] = {
    CLASSIFICATION: ("AutoModelForSequenceClassification", ("logits",)),
    "question-answering": ("AutoModelForQuestionAnswering", ("start_logits", "end_logits")),
}
"""``{task: (transformers auto class, output names)}``."""
BATCH = opreg.DynamicDim("batch_size", example=2, other=3)


def plan(checkpoint: opreg.Checkpoint, config: Any, task: str, files: tuple[opreg.FileCopy, ...]) -> opreg.ExportPlan:
    """``model.onnx`` of ``task``'s head of ``checkpoint`` (its transformers ``config``); ``files`` copied."""
    auto, outputs = HEADS[task]
    longest = int(config.max_position_embeddings)
    # at least 3 tokens: torch.export's guard (shift_tokens_right's slices); left to it, a second capture
    sequence = opreg.DynamicDim("sequence_length", example=min(16, longest), other=min(7, longest), min=3, max=longest)
    shape = (BATCH.name, sequence.name)
    inputs = (
        opreg.ModelInput("input_ids", shape, fill="ids", high=int(config.vocab_size)),
        opreg.ModelInput("attention_mask", shape, fill="mask"),
    )
    build = functools.partial(_build, checkpoint, config, auto, task)
    component = opreg.Component("model", "model.onnx", build, inputs, outputs, (BATCH, sequence))
    return opreg.ExportPlan("transformers", task, (component,), files)


def _build(checkpoint: opreg.Checkpoint, config: Any, auto: str, task: str) -> Any:
    from opreg_transformers import loading

    model = loading.load(checkpoint.path, auto, config)
    if task != CLASSIFICATION:
        return model
    from opreg_transformers.seq2seq_steps import EosClassification

    return EosClassification(model)
