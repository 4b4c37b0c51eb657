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
    ("ForQuestionAnsweringSimple", "question-answering"),  # XLM's and FlauBERT's
    ("WithLMHeadModel", "fill-mask"),  # XLM's and FlauBERT's
    ("ForMultipleChoice", MULTIPLE_CHOICE),
)
"""An ``architectures`` entry's suffix and the task it says; a bare ``...Model`` is feature extraction."""

ABSOLUTE = "absolute"
OFFSET = "offset"
SHIFTED = "shifted"
_FOUR_TASKS = (FEATURE_EXTRACTION, "fill-mask", "text-classification", "token-classification")
_LAYOUT_TASKS = (FEATURE_EXTRACTION, "text-classification", "token-classification", "question-answering")


@dataclasses.dataclass(frozen=True)
class Family:
    """One encoder family (a config's ``model_type``).

    Fields:
        token_type_ids: ``True`` when optimum gives the model a ``token_type_ids`` input,
            ``"config"`` when only if the config's ``type_vocab_size`` is above 0 (DeBERTa).
        positions: how long a sequence may be: ``absolute`` (``max_position_embeddings``),
            ``offset`` (RoBERTa's positions start after ``pad_token_id``:
            ``max_position_embeddings - pad_token_id - 1``), ``shifted`` (Nystromformer's start
            at 2: ``max_position_embeddings - 2``).
        tasks: the tasks optimum exports it for (and transformers 5.17 has a head for).
        shortest: the shortest sequence torch.export can take it at (MobileBERT's trigram
            embedding guards ``sequence_length != 2``, which a range says only as ``>= 3``).
        bbox: LayoutLM's and LiLT's ``bbox`` input after ``input_ids``: a box per token,
            coordinates below ``max_2d_position_embeddings``.
        xpaths: MarkupLM's ``xpath_tags_seq`` and ``xpath_subs_seq`` inputs after ``input_ids``, a
            node's tags and subscripts per token, ``[batch_size, sequence_length, max_depth]``: the
            depth fixed at the config's (its embeddings are one per level).
    """

    token_type_ids: bool | str
    positions: str = ABSOLUTE
    tasks: tuple[str, ...] = tuple(TASKS)
    shortest: int = 1
    bbox: bool = False
    xpaths: bool = False


FAMILIES: dict[str, Family] = {
    "albert": Family(True),
    "bert": Family(True),
    "big_bird": Family(False),
    "camembert": Family(False, OFFSET),
    "convbert": Family(True),
    "data2vec-text": Family(False, OFFSET),
    "deberta": Family("config"),
    "deberta-v2": Family("config"),
    "distilbert": Family(False),
    "electra": Family(True),
    "esm": Family(False, OFFSET, tasks=_FOUR_TASKS),
    "flaubert": Family(True),
    "ibert": Family(False, OFFSET),
    "layoutlm": Family(True, bbox=True, tasks=_FOUR_TASKS),
    "lilt": Family(False, OFFSET, bbox=True, tasks=_LAYOUT_TASKS),
    "markuplm": Family(True, OFFSET, xpaths=True, tasks=_LAYOUT_TASKS),
    "megatron-bert": Family(True),
    "mobilebert": Family(True, shortest=3),
    "modernbert": Family(False, tasks=_FOUR_TASKS),
    "mpnet": Family(False, OFFSET),
    "nystromformer": Family(True, SHIFTED),
    "rembert": Family(True),
    "roberta": Family(False, OFFSET),
    "roformer": Family(True),
    "splinter": Family(True, tasks=(FEATURE_EXTRACTION, "question-answering")),
    "squeezebert": Family(True),
    "xlm": Family(True),
    "xlm-roberta": Family(False, OFFSET),
}
"""``{model_type: Family}``: the families exported, each verified by tests/test_checkpoint_encoders.py
(``bench/checkpoint_tasks.py`` exports every pair of family and task). BigBird's block-sparse attention
is full up to ``(5 + 2 * num_random_blocks) * block_size`` tokens (the model switches itself): that
is what is captured, the sequence bounded there (:func:`max_sequence`; left to torch.export's guard,
the bound cost a second capture).
Nystromformer exports when it has as many landmarks as segment means (its defaults: full attention);
otherwise its landmarks fix the sequence length to ``segment_means_seq_len`` and torch.export
refuses a dynamic one. Left out, with
the reason: Longformer (its sliding-window chunks view on a
data-dependent size: torch.export's ``GuardOnDataDependentSymNode: Eq(u1, 1)``), LayoutLMv3 (it takes
``pixel_values`` too: not tried), Perceiver (its text tasks take ``inputs``, not ``input_ids``: not tried)."""


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
    """The longest sequence the config's position embeddings hold; a block-sparse BigBird's, the
    longest its attention is full at (what is captured)."""
    positions = int(config.get("max_position_embeddings", 512))
    if family.positions == OFFSET:
        positions -= int(config.get("pad_token_id") or 0) + 1
    elif family.positions == SHIFTED:
        positions -= 2
    if config.get("attention_type") == "block_sparse":
        positions = min(
            positions, (5 + 2 * int(config.get("num_random_blocks", 3))) * int(config.get("block_size", 64))
        )
    return positions
