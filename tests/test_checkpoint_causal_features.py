"""A causal-LM family's base model as optimum-onnx 0.1.0's ``feature-extraction-with-past`` in
``opreg export FOLDER`` (opreg-transformers' :mod:`opreg_transformers.causal`, exported by
:mod:`opreg.llm` with ``features=True``): one ``model.onnx``, the base model's prefill with its
cache out, as optimum's ``TextDecoderOnnxConfig`` with ``use_past_in_inputs`` false lays it out:

- in: ``input_ids``, ``attention_mask`` ``[batch_size, sequence_length]`` and, where optimum's config
  class is a ``TextDecoderWithPositionIdsOnnxConfig`` (Llama, GPT-2, Phi-3; not Gemma),
  ``position_ids``; no ``past_key_values``;
- out: ``last_hidden_state`` and every layer's ``present.N.key``/``.value``, ``[batch_size,
  kv_heads, past_sequence_length + sequence_length, head_size]``.

Each tiny random checkpoint (a ``...Model``: no LM head) is written here, exported and verified by
opreg.llm (four sizes after no past, and a left-padded batch), then run from the file alone by ONNX
Runtime on a left-padded batch at another size against transformers' eager model with its cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg
from tests import language_models
from tests.test_checkpoint_causal_heads import left_padded

TASK = "feature-extraction-with-past"
TOTAL = "past_sequence_length + sequence_length"
CASES = [("llama", True), ("gpt2", True), ("gemma", False), ("phi3", True)]
"""``(model_type, whether optimum gives it position_ids)``."""


def save(folder: Path, family: str) -> Path:
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(language_models.config(family), dtype=torch.float32).eval()
    return language_models.checkpoint(model, folder)


def dims(values) -> dict[str, list]:
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


@pytest.mark.parametrize(("family", "position_ids"), CASES)
def test_the_base_model_and_its_cache_are_exported_as_optimum_lays_them_out_and_match_transformers(
    family, position_ids, tmp_path
):
    import transformers

    folder = save(tmp_path / family, family)
    result = opreg.export_checkpoint(folder, tmp_path / "out", task=TASK)
    assert (result.task, result.inferred, result.verified) == (TASK, False, True)
    assert "generation_config.json" not in result.files and "config.json" in result.files
    eager = transformers.AutoModel.from_pretrained(folder).eval()
    text = eager.config
    model = onnx.load(tmp_path / "out" / "model.onnx")
    names = ["input_ids", "attention_mask", *(["position_ids"] if position_ids else [])]
    assert dims(model.graph.input) == {name: ["batch_size", "sequence_length"] for name in names}
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_size = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    cache = {
        f"present.{i}.{kind}": ["batch_size", heads, TOTAL, head_size] for i in range(2) for kind in ("key", "value")
    }
    assert dims(model.graph.output) == {
        "last_hidden_state": ["batch_size", "sequence_length", text.hidden_size],
        **cache,
    }

    session = onnxruntime.InferenceSession(tmp_path / "out" / "model.onnx", providers=["CPUExecutionProvider"])
    feeds = left_padded(3, 9, seed=9)  # a size the export did not verify at
    got = dict(zip(dims(model.graph.output), session.run(None, {n: feeds[n].numpy() for n in names}), strict=True))
    with torch.no_grad():
        want = eager(**{name: feeds[name] for name in names}, use_cache=True)
    mask = feeds["attention_mask"].bool().numpy()  # the padding's own states are not compared
    np.testing.assert_allclose(
        got["last_hidden_state"][mask], want.last_hidden_state.numpy()[mask], rtol=1e-4, atol=1e-4
    )
    for index, layer in enumerate(want.past_key_values.layers):
        for kind in ("key", "value"):
            expected = getattr(layer, f"{kind}s").numpy()
            np.testing.assert_allclose(got[f"present.{index}.{kind}"], expected, rtol=1e-4, atol=1e-4, err_msg=kind)


def test_a_causal_lm_folder_exports_its_base_model_with_its_cache(tmp_path):
    """A ``...ForCausalLM`` checkpoint: its weights named under the base model's prefix, its LM head left out."""
    folder = language_models.checkpoint(language_models.causal_lm("qwen2"), tmp_path / "qwen2")
    result = opreg.export_checkpoint(folder, tmp_path / "out", task=TASK)
    assert (result.task, result.verified) == (TASK, True)
    assert "generation_config.json" not in result.files  # the folder's, a causal LM's: not the base model's
    model = onnx.load(tmp_path / "out" / "model.onnx", load_external_data=False)
    assert [v.name for v in model.graph.input] == ["input_ids", "attention_mask", "position_ids"]
    assert [v.name for v in model.graph.output][:2] == ["last_hidden_state", "present.0.key"]


def test_a_base_model_folder_still_infers_feature_extraction_and_offers_the_one_with_past(tmp_path):
    folder = save(tmp_path / "llama", "llama")
    with pytest.raises(opreg.CheckpointError, match=r"tasks it can do are feature-extraction, .*, " + TASK):
        opreg.export_checkpoint(folder, tmp_path / "out", task="token-classification")
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, result.inferred) == ("feature-extraction", True)


def test_features_are_refused_in_genai_s_layout_before_any_export(tmp_path):
    folder = save(tmp_path / "llama", "llama")
    with pytest.raises(opreg.OpregError, match=r"features=True .* give layout='optimum'"):
        opreg.export_checkpoint(folder, tmp_path / "out", task=TASK, layout="genai")
    assert not (tmp_path / "out").exists()


def test_a_causal_lm_given_for_its_features_is_refused_naming_the_base_model(tmp_path):
    import opreg.llm

    with pytest.raises(opreg.ExportError, match="returns no last_hidden_state .*features=True: their base models"):
        opreg.llm.export_decoder(language_models.causal_lm("llama"), layout="optimum", features=True)


def test_the_base_model_loaded_with_its_weights_first_exports_the_same_model(tmp_path):
    """``streaming=False`` (what opreg-transformers falls back to when a streamed model does not run):
    the base model loaded by ``AutoModel``, verified as the streamed one is."""
    import opreg.llm

    folder = save(tmp_path / "gpt2", "gpt2")
    decoder = opreg.llm.export_checkpoint(
        folder, tmp_path / "out", layout="optimum", features=True, streaming=False, target="onnx"
    )
    assert type(decoder.model).__name__ == "GPT2Model"
    assert decoder.layout.output_names[0] == "last_hidden_state"
    checks = decoder.verify()  # each output of each row: four sizes after no past (1 + 1 + 3 + 3), left padding's 2
    assert len(checks) == (1 + 1 + 3 + 3 + 2) * 5 and "past 0" in checks[-11].name
