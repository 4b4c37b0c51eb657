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
    ("gpt2", "feature-extraction", True),  # absolute positions: left padding shifts them
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


def head_at_last_token(folder: Path, feeds: dict[str, torch.Tensor]) -> np.ndarray:
    """The eager classification head of ``folder`` read at each row's last position (the
    batch is left-padded): the score of the base model's last hidden state."""
    import transformers

    eager = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        states = eager.base_model(
            input_ids=feeds["input_ids"], attention_mask=feeds["attention_mask"]
        ).last_hidden_state
        return eager.score(states[:, -1]).numpy()


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


def test_falcon_with_alibi_takes_no_position_ids_and_runs_its_bfloat16_alibi_in_float32(tmp_path):
    """optimum drops Falcon's ``position_ids`` when ``alibi`` is set; transformers builds the ALiBi
    bias in bfloat16, for which ONNX Runtime's CPU has no ``Mul``: ``--keep-float32`` computes it in
    float32 (without it, the verification refuses the model, naming that option)."""
    folder = save(tmp_path / "falcon", "falcon", "feature-extraction", alibi=True)
    result = opreg.export_checkpoint(folder, tmp_path / "out", keep_float32=True)
    assert (result.task, [len(m.verified) for m in result.models]) == ("feature-extraction", [2])
    model = onnx.load(tmp_path / "out" / "model.onnx")
    assert [v.name for v in model.graph.input] == ["input_ids", "attention_mask"]


def test_a_classification_head_without_pad_token_id_takes_the_tokenizers_as_optimum_does(tmp_path):
    folder = save(tmp_path / "gpt2", "gpt2", "text-classification", pad_token_id=None)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, [len(m.verified) for m in result.models]) == ("text-classification", [2])
    assert any(f"pad_token_id {language_models.PAD} (the tokenizer's" in note for note in result.notes)
    feeds = left_padded(3, 9, seed=0)
    session = onnxruntime.InferenceSession(tmp_path / "out" / "model.onnx", providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {name: feeds[name].numpy() for name in ("input_ids", "attention_mask")})
    np.testing.assert_allclose(got, head_at_last_token(folder, feeds), rtol=1e-4, atol=1e-4)


def test_a_classification_head_without_any_pad_token_is_refused_before_any_export(tmp_path):
    import transformers

    config = language_models.config("llama", pad_token_id=None)
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "llama")
    with pytest.raises(opreg.CheckpointError, match="has no pad_token_id and its tokenizer does not load.*set pad"):
        opreg.export_checkpoint(tmp_path / "llama", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_task_optimum_does_not_list_for_the_family_is_refused(tmp_path):
    folder = save(tmp_path / "llama", "llama", "feature-extraction")
    with pytest.raises(opreg.CheckpointError, match="token-classification"):
        opreg.export_checkpoint(folder, tmp_path / "out", task="token-classification")
    assert not (tmp_path / "out").exists()


def test_a_causal_family_without_heads_here_is_refused_naming_those_that_have_them(tmp_path):
    language_models.config("mixtral", architectures=["MixtralForSequenceClassification"]).save_pretrained(tmp_path)
    with pytest.raises(opreg.OpregError, match=r"'mixtral'.*the other heads of arcee, bloom, .*, stablelm\)"):
        opreg.export_checkpoint(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
