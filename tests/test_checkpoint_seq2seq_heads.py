"""BART's and mBART's classification heads in ``opreg export FOLDER``
(:mod:`opreg_transformers.seq2seq_heads`): ``text-classification`` and ``question-answering``
inferred from ``architectures``, one ``model.onnx`` as optimum-onnx 0.1.0 lays it out (``input_ids``,
``attention_mask`` -> ``logits``, or ``start_logits`` and ``end_logits``), verified by the export,
and run by ONNX Runtime against transformers' own head on rows ending with the end-of-sequence
token, as the tokenizer writes them (transformers refuses rows without one)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg
from tests import seq2seq_models

SEQUENCE = ["batch_size", "sequence_length"]
CASES = {
    "text-classification": ("AutoModelForSequenceClassification", ["logits"]),
    "question-answering": ("AutoModelForQuestionAnswering", ["start_logits", "end_logits"]),
}


@pytest.mark.parametrize("family", ["bart", "mbart"])
@pytest.mark.parametrize("task", sorted(CASES))
def test_the_head_is_exported_as_optimum_lays_it_out_and_matches_transformers(family, task, tmp_path):
    import transformers

    auto, outputs = CASES[task]
    folder = seq2seq_models.checkpoint(family, tmp_path / family, auto=auto)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, result.inferred, [len(m.verified) for m in result.models]) == (task, True, [2])
    model = onnx.load(tmp_path / "out" / "model.onnx")
    assert {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim] for v in model.graph.input} == {
        "input_ids": SEQUENCE, "attention_mask": SEQUENCE,
    }  # fmt: skip
    assert [v.name for v in model.graph.output] == outputs
    tokenizer = seq2seq_models.tokenizer()
    batch = tokenizer(["the quick brown fox", "a dog", "the fox jumps over the lazy dog"], padding=True)
    feeds = {name: torch.tensor(batch[name]) for name in ("input_ids", "attention_mask")}
    assert (feeds["input_ids"] == seq2seq_models.EOS).sum(-1).tolist() == [1, 1, 1]  # as transformers asks
    session = onnxruntime.InferenceSession(tmp_path / "out" / "model.onnx", providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    eager = getattr(transformers, auto).from_pretrained(folder).eval()
    with torch.no_grad():
        want = eager(**feeds)
    for name, value in zip(outputs, got, strict=True):
        np.testing.assert_allclose(value, want[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
