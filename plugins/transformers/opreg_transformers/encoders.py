"""What the transformers loader knows of encoder families: the tasks each exports, the inputs it
takes and how long its sequences may be, as optimum-onnx 0.1.0 lays them out (its ``*OnnxConfig``
classes in ``optimum/exporters/onnx/model_configs.py``: inputs, task outputs, dim names).

Data only: importing it imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses

FEATURE_EXTRACTION = "feature-extraction"
MULTIPLE_CHOICE = "multiple-choice"

TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    FEATURE_EXTRACTION: ("AutoModel", ("last_hidden_state",)),
    "fill-mask": ("AutoModelForMaskedLM", ("logits",)),
    "text-classification": ("AutoModelForSequenceClassification", ("logits",)),
    "token-classification": ("AutoModelForTokenClassification", ("logits",)),
    "question-answering": ("AutoModelForQuestionAnswering", ("start_logits", "end_logits")),
    MULTIPLE_CHOICE: ("AutoModelForMultipleChoice", ("logits",)),
}
"""``{task: (transformers auto class, output names)}``, tasks and outputs as optimum names them."""

HEADS: tuple[tuple[str, str], ...] = (
    ("ForMaskedLM", "fill-mask"),
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMultipleChoice", MULTIPLE_CHOICE),
)
"""An ``architectures`` entry's suffix and the task it says; a bare ``...Model`` is feature extraction."""

ABSOLUTE = "absolute"
OFFSET = "offset"


@dataclasses.dataclass(frozen=True)
class Family:
    """One encoder family (a config's ``model_type``).

    Fields:
        token_type_ids: ``True`` when optimum gives the model a ``token_type_ids`` input,
            ``"config"`` when only if the config's ``type_vocab_size`` is above 0 (DeBERTa).
        positions: how long a sequence may be: ``absolute`` (``max_position_embeddings``),
            ``offset`` (RoBERTa's positions start after ``pad_token_id``:
            ``max_position_embeddings - pad_token_id - 1``).
        tasks: the tasks optimum exports it for (and transformers 5.17 has a head for).
    """

    token_type_ids: bool | str
    positions: str = ABSOLUTE
    tasks: tuple[str, ...] = tuple(TASKS)


FAMILIES: dict[str, Family] = {
    "albert": Family(True),
    "bert": Family(True),
    "camembert": Family(False, OFFSET),
    "convbert": Family(True),
    "data2vec-text": Family(False, OFFSET),
    "deberta-v2": Family("config"),
    "distilbert": Family(False),
    "electra": Family(True),
    "modernbert": Family(False, tasks=(FEATURE_EXTRACTION, "fill-mask", "text-classification", "token-classification")),
    "mpnet": Family(False, OFFSET),
    "rembert": Family(True),
    "roberta": Family(False, OFFSET),
    "roformer": Family(True),
    "squeezebert": Family(True),
    "xlm-roberta": Family(False, OFFSET),
}
"""``{model_type: Family}``: the families exported, each verified by tests/test_checkpoint_encoders.py
(``bench/checkpoint_tasks.py`` exports every pair of family and task). Left out, with the reason:
DeBERTa (v1: its attention leaves a ``sym_not`` torch.export does not trace away, which opreg cannot
translate), MobileBERT (its trigram embedding guards ``sequence_length != 2``, which a range cannot
say), Nystromformer (its landmarks fix the sequence length to ``segment_means_seq_len``)."""


def task_of(architectures: list[str]) -> str | None:
    """The task an ``architectures`` entry says (its head), or ``None``."""
    for name in architectures:
        for suffix, task in HEADS:
            if name.endswith(suffix):
                return task
        if name.endswith("Model") and not name.endswith("LMHeadModel"):
            return FEATURE_EXTRACTION
    return None


def max_sequence(family: Family, config: dict) -> int:
    """The longest sequence the config's position embeddings hold."""
    positions = int(config.get("max_position_embeddings", 512))
    if family.positions == OFFSET:
        return positions - int(config.get("pad_token_id") or 0) - 1
    return positions
