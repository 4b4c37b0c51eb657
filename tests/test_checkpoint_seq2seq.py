"""``opreg export FOLDER`` on encoder-decoder checkpoints (T5, BART, Marian, M2M100 and the families
laid out as they are: mT5, mBART, Pegasus, Blenderbot, Blenderbot-small): optimum-onnx
0.1.0's layout (encoder, decoder, decoder with past, the merged decoder), each model verified against
PyTorch at two sizes, and the folder's greedy generation in ONNX Runtime against ``generate``; the
merged decoder's shape; the loop check failing on a decoder with past that goes wrong after the first
step; transformers.js's text2text-generation pipeline on the folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg
from opreg import cli
from tests import seq2seq_models

FILES = [
    "config.json", "decoder_model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx",
    "encoder_model.onnx", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
]  # fmt: skip
CROSS = ["present.0.encoder.key", "present.0.encoder.value", "present.1.encoder.key", "present.1.encoder.value"]
OPTIMUM = {
    "encoder_model": (["input_ids", "attention_mask"], ["last_hidden_state"]),
    "decoder_model": (
        ["encoder_attention_mask", "input_ids", "encoder_hidden_states"],
        ["logits", "present.0.decoder.key", "present.0.decoder.value", "present.0.encoder.key",
         "present.0.encoder.value", "present.1.decoder.key", "present.1.decoder.value", "present.1.encoder.key",
         "present.1.encoder.value"],
    ),
    "decoder_with_past_model": (
        ["encoder_attention_mask", "input_ids", "past_key_values.0.decoder.key", "past_key_values.0.decoder.value",
         "past_key_values.0.encoder.key", "past_key_values.0.encoder.value", "past_key_values.1.decoder.key",
         "past_key_values.1.decoder.value", "past_key_values.1.encoder.key", "past_key_values.1.encoder.value"],
        ["logits", "present.0.decoder.key", "present.0.decoder.value", "present.1.decoder.key",
         "present.1.decoder.value"],
    ),
    "decoder_model_merged": (
        ["encoder_attention_mask", "input_ids", "encoder_hidden_states", "past_key_values.0.decoder.key",
         "past_key_values.0.decoder.value", "past_key_values.0.encoder.key", "past_key_values.0.encoder.value",
         "past_key_values.1.decoder.key", "past_key_values.1.decoder.value", "past_key_values.1.encoder.key",
         "past_key_values.1.encoder.value", "use_cache_branch"],
        ["logits", "present.0.decoder.key", "present.0.decoder.value", "present.0.encoder.key",
         "present.0.encoder.value", "present.1.decoder.key", "present.1.decoder.value", "present.1.encoder.key",
         "present.1.encoder.value"],
    ),
}  # fmt: skip
"""Each model's inputs and outputs as optimum-cli 0.1.0 (transformers 4.57.3) wrote them, in order,
for each of these families exported with ``--task text2text-generation-with-past``."""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seq2seq")
    return {family: seq2seq_models.checkpoint(family, root / family) for family in seq2seq_models.FAMILIES}


@pytest.fixture(scope="module", params=seq2seq_models.FAMILIES)
def exported(request, checkpoints, tmp_path_factory) -> opreg.CheckpointExport:
    """Each family exported with no task asked: text2text-generation-with-past, as optimum infers."""
    return opreg.export_checkpoint(checkpoints[request.param], tmp_path_factory.mktemp("out") / request.param)


def shape(value: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_each_family_is_exported_with_past_as_optimum_lays_it_out(exported):
    assert (exported.task, exported.inferred) == ("text2text-generation-with-past", True)
    assert list(exported.files) == FILES
    for name, (inputs, outputs) in OPTIMUM.items():
        model = onnx.load(exported.folder / f"{name}.onnx")
        onnx.checker.check_model(model, full_check=True)
        assert ([i.name for i in model.graph.input], [o.name for o in model.graph.output]) == (inputs, outputs), name
    merged = onnx.load(exported.folder / "decoder_model_merged.onnx")
    shapes = {v.name: shape(v) for v in merged.graph.input}
    assert shapes["past_key_values.1.decoder.value"] == ["batch_size", 2, "past_decoder_sequence_length", 16]
    assert shapes["past_key_values.1.encoder.key"] == ["batch_size", 2, "encoder_sequence_length", 16]
    assert (
        shapes["use_cache_branch"] == [1] and merged.graph.input[-1].type.tensor_type.elem_type == onnx.TensorProto.BOOL
    )
    verified = {m.name: len(m.verified) for m in exported.models}
    assert verified == {"encoder_model": 2, "decoder_model": 2, "decoder_with_past_model": 2, "decoder_model_merged": 0}
    (check,) = exported.checks
    assert check.startswith("greedy: 24 greedy tokens of 2 prompts equal generate's (merged decoder, decoder then")


def weights(initializers) -> set[tuple]:
    """The weights (over 256 bytes) by content."""
    return {(i.data_type, tuple(i.dims), i.raw_data) for i in initializers if len(i.raw_data) > 256}


def test_the_merged_decoder_is_one_if_on_use_cache_branch_its_weights_stored_once(exported):
    merged = onnx.load(exported.folder / "decoder_model_merged.onnx")
    (branch,) = merged.graph.node
    assert (branch.op_type, list(branch.input)) == ("If", ["use_cache_branch"])
    graphs = {a.name: a.g for a in branch.attribute}
    assert set(graphs) == {"then_branch", "else_branch"}
    assert [len(g.initializer) for g in graphs.values()] == [0, 0]  # every weight in the main graph
    decoders = [onnx.load(exported.folder / f"{n}.onnx") for n in ("decoder_model", "decoder_with_past_model")]
    big = [weights(d.graph.initializer) for d in decoders]
    stored = [i for i in merged.graph.initializer if len(i.raw_data) > 256]
    assert len(stored) == len(weights(stored)) == len(big[0] | big[1]) < len(big[0]) + len(big[1])  # shared once
    constants = {n.output[0]: n.attribute[0].t for n in graphs["then_branch"].node if n.op_type == "Constant"}
    outputs = [o.name for o in graphs["then_branch"].output]
    empty = [list(constants[outputs[i]].dims) for i, o in enumerate(merged.graph.output) if o.name in CROSS]
    assert empty == [[0, 2, 1, 16]] * 4  # optimum's empty cross-attention presents in the with-past branch
    assert [o.name for o in graphs["then_branch"].output] != [o.name for o in merged.graph.output]  # no shadowing


def test_the_merged_decoder_runs_both_branches_as_the_two_decoders(exported):
    """What the loop check relies on, at a shape neither component was verified at."""
    folder = exported.folder
    sessions = {
        n: onnxruntime.InferenceSession(folder / f"{n}.onnx")
        for n in ("decoder_model", "decoder_with_past_model", "decoder_model_merged")
    }
    rng = np.random.default_rng(1)
    mask = np.ones((4, 11), np.int64)
    mask[2, 8:] = 0
    ids = rng.integers(0, 64, (4, 1), dtype=np.int64)
    hidden = rng.standard_normal((4, 11, 32), dtype=np.float32)
    past = {n: rng.standard_normal((4, 2, 11 if "encoder" in n else 13, 16), dtype=np.float32)
            for n in OPTIMUM["decoder_with_past_model"][0][2:]}  # fmt: skip
    empty = {n: np.zeros((4, 2, 0, 16), np.float32) for n in past}
    first = {"encoder_attention_mask": mask, "input_ids": ids, "encoder_hidden_states": hidden}
    want = sessions["decoder_model"].run(None, first)
    got = sessions["decoder_model_merged"].run(None, {**first, **empty, "use_cache_branch": np.array([False])})
    for mine, theirs in zip(got, want, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    want = sessions["decoder_with_past_model"].run(None, {"encoder_attention_mask": mask, "input_ids": ids, **past})
    got = sessions["decoder_model_merged"].run(None, {**first, **past, "use_cache_branch": np.array([True])})
    names = [o.name for o in sessions["decoder_model_merged"].get_outputs()]
    assert [n for n, v in zip(names, got, strict=True) if v.size == 0] == CROSS
    for mine, theirs in zip([v for v in got if v.size], want, strict=True):
        np.testing.assert_array_equal(mine, theirs)


def buckets_from_zero(monkeypatch) -> None:
    """Break T5's export as an exporter that specialises the past to 0 would: captured, the relative
    position buckets are counted from the new token (eager keeps counting from the past's length)."""
    from transformers.models.t5 import modeling_t5

    compute_bias = modeling_t5.T5Attention.compute_bias

    def broken(self, query_length, key_length, device=None, past_seen_tokens=0):
        if torch.compiler.is_exporting():
            past_seen_tokens = 0
        return compute_bias(self, query_length, key_length, device=device, past_seen_tokens=past_seen_tokens)

    monkeypatch.setattr(modeling_t5.T5Attention, "compute_bias", broken)


def test_a_decoder_that_goes_wrong_after_the_first_step_is_caught(checkpoints, tmp_path, monkeypatch):
    """By the with-past decoder's verification, and by the loop check on its own (run here on the
    broken folder against the unbroken model): step 1 (no past) agrees, step 2 does not."""
    import transformers
    from opreg_transformers import generation, seq2seq

    buckets_from_zero(monkeypatch)
    with pytest.raises(opreg.VerificationError, match=r"decoder_with_past_model\.onnx \(at batch_size=2"):
        opreg.export_checkpoint(checkpoints["t5"], tmp_path / "verified")
    folder = opreg.export_checkpoint(checkpoints["t5"], tmp_path / "broken", verify=False).folder
    monkeypatch.undo()
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(checkpoints["t5"]).eval()
    layout = seq2seq.layout_of(seq2seq.FAMILIES["t5"], model.config)
    with pytest.raises(opreg.VerificationError, match="with the merged decoder.*step 2"):
        generation.check(folder, layout, model, past=True)
    (folder / "decoder_model_merged.onnx").write_bytes(b"")
    with pytest.raises(opreg.VerificationError, match=r"decoder_model_merged\.onnx fails in ONNX Runtime .* on "):
        generation.check(folder, layout, model, past=True)


def test_without_past_and_as_optimums_synonyms_the_decoder_runs_on_the_whole_sequence(checkpoints, tmp_path):
    result = opreg.export_checkpoint(checkpoints["marian"], tmp_path / "out", task="translation")
    assert (result.task, result.inferred) == ("translation", False)  # optimum's synonym of text2text-generation
    assert [m.name for m in result.models] == ["encoder_model", "decoder_model"]
    assert "decoder_model_merged.onnx" not in result.files
    assert result.checks == (
        "greedy: 24 greedy tokens of 2 prompts equal generate's (decoder without past); logits within "
        + result.checks[0].rsplit(" ", 1)[1],
    )
    assert "at most 64 tokens (max_position_embeddings)" in result.notes[0]
    bounds = onnx.load(result.folder / "decoder_model.onnx").metadata_props
    assert '"decoder_sequence_length": [1, 64]' in {p.key: p.value for p in bounds}["opreg.dim_bounds"]


def test_bad_input_is_refused_before_any_export(checkpoints, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(opreg.CheckpointError, match="cannot be exported for task 'fill-mask'.*text2text-generation"):
        opreg.export_checkpoint(checkpoints["bart"], out, task="fill-mask")
    startless = tmp_path / "startless"
    startless.mkdir()
    for name in ("config.json", "model.safetensors"):
        (startless / name).write_bytes((checkpoints["m2m_100"] / name).read_bytes())
    config = (
        (startless / "config.json").read_text().replace('"decoder_start_token_id": 2', '"decoder_start_token_id": null')
    )
    (startless / "config.json").write_text(config)
    with pytest.raises(opreg.CheckpointError, match="sets an integer decoder_start_token_id.*got None"):
        opreg.export_checkpoint(startless, out)
    assert not out.exists()
    (startless / "generation_config.json").write_text('{"decoder_start_token_id": 2}')  # generate's, then
    assert "decoder_model_merged.onnx" in opreg.export_checkpoint(startless, out, verify=False).files


TEXTS = ["the cat sat on the mat", "a dog ran"]
GENERATE = {"max_new_tokens": 20, "min_new_tokens": 20}
"""20 new tokens each (no early end token): the steps past the first."""


TJS_KNOWN = {"pegasus": "Unsupported model type: pegasus"}
"""The families transformers.js 4.3.1 has no model for, and its error."""


def test_transformersjs_text2text_pipeline_loads_the_folder_unchanged_and_gives_eagers_tokens(exported, transformersjs):
    """transformers.js 4.3.1 (onnxruntime-node 1.30): encoder_model.onnx and decoder_model_merged.onnx
    of the flat folder (``subfolder: ''``), its generate against transformers' with the folder's
    generation config (BART's forced end token included)."""
    family = Path(exported.source).name
    if family in TJS_KNOWN:
        with pytest.raises(RuntimeError, match=TJS_KNOWN[family]):
            seq2seq_models.transformersjs(exported.folder, TEXTS, GENERATE, transformersjs)
        return
    got = seq2seq_models.transformersjs(exported.folder, TEXTS, GENERATE, transformersjs)
    want = seq2seq_models.eager(Path(exported.source), TEXTS, GENERATE)
    assert got["tokens"] == want and len(want[0]) == 21
    assert len(got["texts"]) == 2


def test_a_bare_model_is_exported_for_feature_extraction_its_decoder_checked_step_by_step(tmp_path):
    """``T5Model``: optimum infers feature-extraction-with-past; the decoder's first output is its
    ``last_hidden_state``, checked along 24 fixed tokens through both ways against the model."""
    folder = seq2seq_models.checkpoint("t5", tmp_path / "t5", auto="AutoModel")
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, result.inferred) == ("feature-extraction-with-past", True)
    merged = onnx.load(result.folder / "decoder_model_merged.onnx")
    assert [o.name for o in merged.graph.output] == ["last_hidden_state", *OPTIMUM["decoder_model"][1][1:]]
    (check,) = result.checks
    assert check.startswith(
        "decoding: 24 decoder steps of 2 prompts equal eager's (merged decoder, decoder then decoder with past)"
    )


def test_the_command_reports_each_model_written_the_merged_decoder_too(checkpoints, tmp_path, capsys):
    """The merged decoder is a post-step's ``onnx_ir.Model``, not an ``OnnxProgram``: the command's
    report reads both (it failed with an internal error after writing the folder)."""
    out = tmp_path / "out"
    assert cli.main(["export", str(checkpoints["bart"]), "-o", str(out), "--no-verify"]) == 0
    printed = capsys.readouterr().out
    for name in ("encoder_model", "decoder_model", "decoder_with_past_model", "decoder_model_merged"):
        assert f"wrote {name}.onnx (" in printed
    assert (out / "decoder_model_merged.onnx").is_file()
