"""A causal-LM family's other tasks in ``opreg export FOLDER`` (opreg-transformers'
:mod:`opreg_transformers.causal_heads`), laid out as optimum-onnx 0.1.0 lays them out: one
``model.onnx``, no past, ``input_ids`` and ``attention_mask`` ``[batch_size, sequence_length]`` (and
``position_ids`` for ``feature-extraction`` where optimum's config class gives it one: Llama's, not
Gemma's) -> ``last_hidden_state``, ``logits``, or ``start_logits`` and ``end_logits``.

Each tiny random checkpoint is written here, its task inferred from ``architectures``, verified by
the export at two sizes, then run from the file alone by ONNX Runtime on left-padded batches at two
other sizes (where a classification head reads each row's last token) against transformers' eager
head."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg
from tests import language_models

SEQUENCE = ["batch_size", "sequence_length"]
HEADS = {
    "feature-extraction": ("AutoModel", ["last_hidden_state"]),
    "text-classification": ("AutoModelForSequenceClassification", ["logits"]),
    "token-classification": ("AutoModelForTokenClassification", ["logits"]),
    "question-answering": ("AutoModelForQuestionAnswering", ["start_logits", "end_logits"]),
}
CASES = [
    ("llama", "feature-extraction", True),
    ("llama", "text-classification", False),
    ("gpt2", "token-classification", False),
    ("qwen2", "token-classification", False),
    ("phi3", "text-classification", False),
    ("gemma", "feature-extraction", False),
    ("opt", "question-answering", False),
]
"""``(model_type, task, whether optimum gives it position_ids)``."""


def save(folder: Path, family: str, task: str, **overrides) -> Path:
    import transformers

    torch.manual_seed(0)
    config = language_models.config(family, **overrides)
    model = getattr(transformers, HEADS[task][0]).from_config(config, dtype=torch.float32).eval()
    return language_models.checkpoint(model, folder)


def left_padded(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """A batch whose rows after the first are padded on the left (``PAD`` ids, mask 0), as a
    decoder's tokenizer pads; positions count from each row's first token."""
    ids = torch.randint(3, language_models.VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        mask[row, : min(2 * row + 1, length - 2)] = 0
    ids = ids.masked_fill(mask == 0, language_models.PAD)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


@pytest.mark.parametrize(("family", "task", "position_ids"), CASES)
def test_the_head_is_exported_as_optimum_lays_it_out_and_matches_transformers_left_padded(
    family, task, position_ids, tmp_path
):
    import transformers

    auto, outputs = HEADS[task]
    folder = save(tmp_path / family, family, task)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, result.inferred, [len(m.verified) for m in result.models]) == (task, True, [2])
    model = onnx.load(tmp_path / "out" / "model.onnx")
    names = ["input_ids", "attention_mask", *(["position_ids"] if position_ids else [])]
    assert {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim] for v in model.graph.input} == dict.fromkeys(
        names, SEQUENCE
    )
    assert [v.name for v in model.graph.output] == outputs
    session = onnxruntime.InferenceSession(tmp_path / "out" / "model.onnx", providers=["CPUExecutionProvider"])
    eager = getattr(transformers, auto).from_pretrained(folder).eval()
    for batch, length in ((3, 11), (4, 6)):  # neither size the export verified at
        feeds = left_padded(batch, length, seed=length)
        mask = feeds["attention_mask"].bool()
        got = session.run(None, {name: feeds[name].numpy() for name in names})
        with torch.no_grad():
            want = eager(**{name: feeds[name] for name in names}, use_cache=False)
        for name, value in zip(outputs, got, strict=True):
            actual, expected = value, want[name].numpy()
            if task != "text-classification":  # per token: the padding's own states are not compared
                actual, expected = value[mask.numpy()], expected[mask.numpy()]
            np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4, err_msg=f"{name} {batch}x{length}")


def test_a_causal_lm_folder_exports_its_base_model_for_feature_extraction(tmp_path):
    folder = language_models.checkpoint(language_models.causal_lm("qwen2"), tmp_path / "qwen2")
    result = opreg.export_checkpoint(folder, tmp_path / "out", task="feature-extraction")
    assert (result.task, result.inferred, [len(m.verified) for m in result.models]) == (
        "feature-extraction", False, [2],
    )  # fmt: skip
    model = onnx.load(tmp_path / "out" / "model.onnx")
    assert [v.name for v in model.graph.input] == ["input_ids", "attention_mask", "position_ids"]
    assert [v.name for v in model.graph.output] == ["last_hidden_state"]


def test_a_classification_head_without_a_pad_token_is_refused_before_any_export(tmp_path):
    folder = save(tmp_path / "llama", "llama", "text-classification", pad_token_id=None)
    with pytest.raises(opreg.CheckpointError, match="has no pad_token_id.*set pad_token_id in config.json"):
        opreg.export_checkpoint(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_task_optimum_does_not_list_for_the_family_is_refused(tmp_path):
    folder = save(tmp_path / "llama", "llama", "feature-extraction")
    with pytest.raises(opreg.CheckpointError, match="token-classification"):
        opreg.export_checkpoint(folder, tmp_path / "out", task="token-classification")
    assert not (tmp_path / "out").exists()
