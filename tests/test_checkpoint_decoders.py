"""Causal LMs without their cache and the ``...ForCausalLM`` decoders of BART-like families in
``opreg export FOLDER`` (opreg-transformers' :mod:`opreg_transformers.decoders`), laid out as
optimum-onnx 0.1.0 lays out ``text-generation`` and ``text-generation-with-past``:

- ``text-generation``: ``model.onnx`` taking ``input_ids``, ``attention_mask`` and, where the
  architecture takes them, ``position_ids`` (Llama's, not BART's), giving ``logits``; no past;
- a BART-like ``...ForCausalLM``: ``text-generation-with-past`` inferred, exported by opreg.llm
  (past keys and values in, presents out, no ``position_ids``), its greedy generation from the
  folder in ONNX Runtime checked against ``generate``.

Tiny random checkpoints built here; the input names are optimum-cli 0.1.0's for these families
(transformers 4.57.3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg
from tests import language_models, seq2seq_models, vision_models

SEQUENCE = ["batch_size", "sequence_length"]
TOTAL = "past_sequence_length + sequence_length"


def dims(value: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def folder_of(family: str, root: Path) -> Path:
    if family == "gemma3":  # a vision-language config: its language model alone
        return language_models.checkpoint(vision_models.gemma3(), root / family)
    if family not in seq2seq_models.FAMILIES:
        return language_models.checkpoint(language_models.causal_lm(family), root / family)
    return seq2seq_models.checkpoint(family, root / family, auto="AutoModelForCausalLM")


# MPT: its ALiBi slice special-cases a sequence as long as its positions, which the range stops short of
@pytest.mark.parametrize(
    ("family", "position_ids"),
    [("llama", True), ("mpt", False), ("bart", False), ("marian", False), ("gemma3", True)],
)
def test_text_generation_is_the_model_without_its_past_as_optimum_writes_it(family, position_ids, tmp_path):
    import transformers

    folder = folder_of(family, tmp_path)
    result = opreg.export_checkpoint(folder, tmp_path / "out", task="text-generation")
    assert (result.task, [len(m.verified) for m in result.models]) == ("text-generation", [2])
    model = onnx.load(tmp_path / "out" / "model.onnx")
    names = ["input_ids", "attention_mask", *(["position_ids"] if position_ids else [])]
    assert {v.name: dims(v) for v in model.graph.input} == dict.fromkeys(names, SEQUENCE)
    assert [v.name for v in model.graph.output] == ["logits"]
    # a size the export did not verify, the left-padded batch a generation loop feeds, from the file alone
    ids = torch.randint(3, 60, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if position_ids:
        feeds["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    session = onnxruntime.InferenceSession(tmp_path / "out" / "model.onnx", providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    eager = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        want = eager(**feeds, use_cache=False).logits
    np.testing.assert_allclose(got[mask.bool()], want[mask.bool()].numpy(), rtol=1e-4, atol=1e-4)


def test_a_bart_like_causal_decoder_is_exported_with_its_past_as_optimum_lays_it_out(tmp_path):
    folder = folder_of("bart", tmp_path)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, result.inferred) == ("text-generation-with-past", True)
    assert any("greedy tokens" in check and "equal generate's" in check for check in result.checks)
    model = onnx.load(tmp_path / "out" / "model.onnx")
    layers = seq2seq_models.config("bart").decoder_layers
    past = {f"past_key_values.{i}.{kind}": ["batch_size", 2, "past_sequence_length", 16] for i in range(layers)
            for kind in ("key", "value")}  # fmt: skip
    assert {v.name: dims(v) for v in model.graph.input} == {
        "input_ids": SEQUENCE, "attention_mask": ["batch_size", TOTAL], **past,
    }  # fmt: skip
    assert [v.name for v in model.graph.output] == ["logits", *(n.replace("past_key_values", "present") for n in past)]


def test_a_task_the_seq2seq_family_has_no_decoder_for_is_refused_before_any_export(tmp_path):
    folder = seq2seq_models.checkpoint("t5", tmp_path / "t5")
    with pytest.raises(opreg.CheckpointError, match="cannot be exported for task 'text-generation'"):
        opreg.export_checkpoint(folder, tmp_path / "out", task="text-generation")
    assert not (tmp_path / "out").exists()


def test_a_causal_lm_whose_streamed_export_cannot_run_is_exported_with_its_weights_loaded_first(tmp_path, caplog):
    """OPT's causal mask reads a value, which the streamed (weightless) model cannot give: the
    export is done again as ``--no-streaming`` does, and verified."""
    import opreg.llm

    folder = folder_of("opt", tmp_path)
    with pytest.raises(opreg.StreamingError, match="cannot be called on meta tensors"):  # streamed, as opreg.llm does
        opreg.llm.export_checkpoint(folder, tmp_path / "streamed", layout="optimum", streaming=True)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, [len(m.verified) for m in result.models]) == ("text-generation-with-past", [1])
    assert any("equal generate's" in check for check in result.checks)
    assert "with its weights loaded first (--no-streaming)" in caplog.text
