"""A checkpoint's missing weights in ``opreg export FOLDER`` (:mod:`opreg_transformers.loading`,
:func:`opreg.weights.restore_ties`): never made random behind the user's back.

- A weight the checkpoint keeps under another name, because the two were one tensor when it was
  saved, is tied again: transformers 4.57 saved a BART with ``tie_word_embeddings: false`` with its
  ``embed_tokens`` under ``shared`` alone, and a ``BigBirdPegasusForCausalLM`` without its LM head
  (tied to the embeddings); transformers 5.17 loads both with those weights random. The exports are
  compared with the model as it was before it was saved.
- Any other weight missing from a checkpoint of the class loaded is refused, naming it, before
  anything is written.
- A head the task adds to a checkpoint of another class is new: exported, with a warning naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import opreg
from tests import seq2seq_models

IDS = torch.tensor([[0, 5, 9, 17, 2], [0, 4, 8, 2, 1]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])


def _drop(folder: Path, *names: str) -> None:
    """Rewrite ``folder``'s safetensors without the tensors ``names``, as a checkpoint that holds a
    shared tensor under one name is written."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    assert set(names) <= tensors.keys()
    save_file({k: v for k, v in tensors.items() if k not in names}, path, metadata={"format": "pt"})


def _run(path: Path, **feeds: torch.Tensor) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


def _bart_saved_by_transformers_4(folder: Path) -> torch.nn.Module:
    """A BART classifier with ``tie_word_embeddings: false`` whose embeddings are its ``shared`` table,
    saved as transformers 4.57 saved it: ``model.shared.weight`` alone. Returns the model as saved."""
    import transformers

    seq2seq_models.checkpoint("bart", folder, auto="AutoModelForSequenceClassification")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    for stack in (model.model.encoder, model.model.decoder):
        stack.embed_tokens.weight = model.model.shared.weight
    _drop(folder, "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
    return model


def test_embeddings_a_checkpoint_keeps_under_the_table_they_shared_are_tied_again(tmp_path):
    saved = _bart_saved_by_transformers_4(tmp_path / "bart")
    with pytest.warns(opreg.WeightsWarning) as caught:
        opreg.export_checkpoint(tmp_path / "bart", tmp_path / "out")
    (message,) = [str(w.message) for w in caught if w.category is opreg.WeightsWarning]
    assert "model.decoder.embed_tokens.weight, model.encoder.embed_tokens.weight" in message
    assert "shares with model.shared.weight" in message
    (got,) = _run(tmp_path / "out" / "model.onnx", input_ids=IDS[:1], attention_mask=MASK[:1])
    with torch.no_grad():
        want = saved(input_ids=IDS[:1], attention_mask=MASK[:1]).logits
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_an_lm_head_transformers_4_tied_to_the_embeddings_is_tied_again_in_the_export_with_past(tmp_path):
    import transformers

    config = transformers.AutoConfig.for_model(
        "bigbird_pegasus", **seq2seq_models.SIZES, attention_type="original_full", is_encoder_decoder=False
    )
    torch.manual_seed(0)
    model = transformers.BigBirdPegasusForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.copy_(model.get_input_embeddings().weight)  # tied when saved, as transformers 4 ties it
    model.save_pretrained(tmp_path / "bb")
    seq2seq_models.tokenizer().save_pretrained(tmp_path / "bb")
    _drop(tmp_path / "bb", "lm_head.weight")
    result = opreg.export_checkpoint(tmp_path / "bb", tmp_path / "out")
    assert result.task == "text-generation-with-past"
    assert any("equal generate's" in check for check in result.checks)
    layers = config.decoder_layers
    past = {f"past_key_values.{i}.{kind}": torch.zeros(2, 2, 0, 16) for i in range(layers) for kind in ("key", "value")}
    got = _run(tmp_path / "out" / "model.onnx", input_ids=IDS, attention_mask=MASK, **past)[0]
    with torch.no_grad():
        want = model(input_ids=IDS, attention_mask=MASK, use_cache=False).logits
    np.testing.assert_allclose(got[MASK.bool()], want[MASK.bool()].numpy(), rtol=1e-4, atol=1e-4)


def test_a_weight_missing_from_a_checkpoint_of_the_class_loaded_is_refused_before_anything_is_written(tmp_path):
    seq2seq_models.checkpoint("bart", tmp_path / "bart", auto="AutoModelForSequenceClassification")
    _drop(tmp_path / "bart", "model.encoder.layers.0.fc1.weight")
    with pytest.raises(
        opreg.CheckpointError, match=r"lacks 1 of BartForSequenceClassification's weights \(model.encoder.layers.0.fc1"
    ):
        opreg.export_checkpoint(tmp_path / "bart", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_head_new_to_the_task_is_exported_with_a_warning_naming_it(tmp_path):
    seq2seq_models.checkpoint("bart", tmp_path / "bart", auto="AutoModelForSeq2SeqLM")
    with pytest.warns(opreg.WeightsWarning) as caught:
        result = opreg.export_checkpoint(tmp_path / "bart", tmp_path / "out", task="text-classification")
    assert result.task == "text-classification"
    (message,) = [str(w.message) for w in caught if w.category is opreg.WeightsWarning]
    assert "has no model.classification_head" not in message  # the head is not the base model's
    assert "has no classification_head.dense.bias" in message
    assert "saved as BartForConditionalGeneration" in message
