"""transformers.js 4.3.1 (onnxruntime-node 1.30) runs the folders ``opreg export`` writes, unchanged
(optimum's flat layout, ``subfolder: ''``), and gets PyTorch's results: a BERT's feature extraction
(token embeddings and mean-pooled, normalised ones), a BERT classifier's labels and scores, a causal
LM's greedy tokens (text-generation). The seq2seq case (text2text-generation, every family) is
tests/test_checkpoint_seq2seq.py's, through the same fixture and helper
(tests/transformersjs_runtime.py). One tiny model per task; the folders are exported with the
defaults (verified against PyTorch by the export)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import opreg
from tests import language_models
from tests.test_checkpoint_export import save_bert
from tests.transformersjs_runtime import run

TEXTS = ["the cat sat", "a cat sat on the mat"]
TOLERANCE = 1e-5
"""Largest difference allowed from eager PyTorch (float32 on both sides; measured 2.4e-7)."""


def export(folder: Path, out: Path) -> Path:
    return opreg.export_checkpoint(folder, out).folder


def test_feature_extraction_gives_eagers_embeddings(tmp_path, transformersjs):
    import transformers

    source = save_bert(tmp_path / "bert")
    got = run(
        "pipeline.mjs", export(source, tmp_path / "out"), {"task": "feature-extraction", "texts": TEXTS}, transformersjs
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    assert got["input_ids"] == tokenizer(TEXTS, padding=True)["input_ids"]
    model = transformers.AutoModel.from_pretrained(source).eval()
    pooled = []
    for text, hidden in zip(TEXTS, got["hidden"], strict=True):
        with torch.no_grad():
            want = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        np.testing.assert_allclose(np.array(hidden), want.numpy(), atol=TOLERANCE, rtol=0)
        pooled.append(torch.nn.functional.normalize(want.mean(0), dim=0).numpy())
    np.testing.assert_allclose(np.array(got["pooled"]), np.stack(pooled), atol=TOLERANCE, rtol=0)


def test_text_classification_gives_eagers_labels_and_scores(tmp_path, transformersjs):
    import transformers

    source = save_bert(tmp_path / "bert", "BertForSequenceClassification", id2label={0: "neg", 1: "mid", 2: "pos"})
    got = run(
        "pipeline.mjs",
        export(source, tmp_path / "out"),
        {"task": "text-classification", "texts": TEXTS},
        transformersjs,
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(source).eval()
    for text, scores in zip(TEXTS, got["scores"], strict=True):
        with torch.no_grad():
            want = model(**tokenizer(text, return_tensors="pt")).logits[0].softmax(0)
        labels = {model.config.id2label[i]: float(p) for i, p in enumerate(want)}
        assert scores[0]["label"] == max(labels, key=labels.get)  # the top label first
        assert {s["label"]: pytest.approx(s["score"], abs=TOLERANCE) for s in scores} == labels


GENERATE = {"max_new_tokens": 16, "min_new_tokens": 16}
"""16 new tokens each, none of them the end token (a random model may pick it)."""
"""What ``opreg export`` says of a causal LM until it exports them in optimum's layout."""


def test_text_generation_gives_eagers_greedy_tokens(tmp_path, transformersjs):
    import transformers

    model = language_models.causal_lm("llama")
    source = language_models.checkpoint(model, tmp_path / "llama")
    folder = export(source, tmp_path / "out")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    got = run("pipeline.mjs", folder, {"task": "text-generation", "texts": TEXTS, "generate": GENERATE}, transformersjs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    for text, tokens in zip(TEXTS, got["tokens"], strict=True):
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            want = model.generate(**ids, do_sample=False, num_beams=1, **GENERATE)[0].tolist()
        assert tokens == want and len(want) == ids["input_ids"].shape[1] + 16


@pytest.mark.skipif("onnxruntime" not in opreg.default_registry().profiles, reason="opreg-ort-contrib is not installed")
def test_the_default_language_model_folder_generates_eagers_greedy_tokens(tmp_path, transformersjs):
    """``opreg llm export --layout optimum`` at its default target (ONNX Runtime's GroupQueryAttention on
    the cache, with the 16 inputs onnxruntime-node 1.30 loads): transformers.js generates eager's tokens."""
    import transformers

    model = language_models.causal_lm("llama")
    source = language_models.checkpoint(model, tmp_path / "llama")
    exported = opreg.llm.export_checkpoint(source, tmp_path / "out", opreg.llm.LLMSettings(layout="optimum"))
    graph = next(iter(exported.programs.values())).model.graph
    assert [len(n.inputs) for n in graph if n.op_type == "GroupQueryAttention"] == [12, 12]
    got = run("pipeline.mjs", exported.saved.folder, {"task": "text-generation", "texts": TEXTS, "generate": GENERATE},
              transformersjs)  # fmt: skip
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    for text, tokens in zip(TEXTS, got["tokens"], strict=True):
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            want = model.generate(**ids, do_sample=False, num_beams=1, **GENERATE)[0].tolist()
        assert tokens == want
