"""opreg.llm: a transformers causal LM as one ONNX decoder for prefill and decode, its KV cache
as inputs and outputs, in a folder ONNX Runtime GenAI runs.

Tiny random-init models (tests/language_models.py) and a tokenizer trained here: nothing is
downloaded. Numerics are compared with transformers' own forward (rtol=atol=1e-4, float32);
generation with transformers' greedy ``generate``, token for token.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import torch

import opreg
from opreg.llm import LAYOUT
from tests import language_models as lm
from tests.test_cli import run

PROMPT_TEXT = "hello world, the quick fox"
LENGTH = 24


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A Llama (4 query heads, 2 key/value heads) exported to a GenAI folder with its tokenizer,
    without opreg-ort-contrib: at the standard target, the fastest left."""
    model = lm.causal_lm("llama")
    folder = tmp_path_factory.mktemp("llama") / "genai"
    decoder = opreg.llm.export_decoder(model, folder, tokenizer=lm.tokenizer(), exclude=["ort_contrib"])
    assert decoder.program.target.name == "onnx"
    return model, decoder, folder


def named(files) -> list[str]:
    """File names, sorted, the data file's token spelled ``<token>``."""
    return sorted(re.sub(r"\.[0-9a-f]{8}\.data$", ".<token>.data", getattr(f, "name", f)) for f in files)


def prompt() -> list[int]:
    return list(lm.tokenizer()(PROMPT_TEXT)["input_ids"])


def test_the_decoder_has_genai_names_and_every_length_dynamic(llama):
    _, decoder, _ = llama
    graph = decoder.program.model.graph
    layers = range(2)
    assert [v.name for v in graph.inputs] == [
        "input_ids", "attention_mask", "position_ids",
        *[f"past_key_values.{i}.{kind}" for i in layers for kind in ("key", "value")],
    ]  # fmt: skip
    assert [v.name for v in graph.outputs] == [
        "logits",
        *[f"present.{i}.{kind}" for i in layers for kind in ("key", "value")],
    ]

    def dims(value):
        return [d if isinstance(d, int) else d.value for d in value.shape]

    by_name = {v.name: v for v in [*graph.inputs, *graph.outputs]}
    assert dims(by_name["input_ids"]) == ["batch_size", "sequence_length"]
    assert dims(by_name["attention_mask"]) == ["batch_size", "total_sequence_length"]
    assert dims(by_name["position_ids"]) == ["batch_size", "sequence_length"]
    assert dims(by_name["past_key_values.1.value"]) == ["batch_size", 2, "past_sequence_length", 16]  # BNSH
    assert dims(by_name["logits"]) == ["batch_size", "sequence_length", lm.VOCAB]
    assert dims(by_name["present.0.key"]) == ["batch_size", 2, "total_sequence_length", 16]
    assert by_name["input_ids"].dtype == by_name["attention_mask"].dtype == ir.DataType.INT64
    layout = decoder.layout
    assert (layout.num_layers, layout.num_attention_heads, layout.num_key_value_heads, layout.head_size) == (
        2,
        4,
        2,
        16,
    )


def test_at_the_standard_target_the_cache_is_a_concat_of_past_and_new(llama):
    """Plain ONNX: each present is a Concat whose first input is the past, attention is Attention."""
    _, decoder, _ = llama
    graph = decoder.program.model.graph
    assert set(decoder.program.model.opset_imports) == {""}
    for layer in range(2):
        for kind in ("key", "value"):
            producer = next(v for v in graph.outputs if v.name == f"present.{layer}.{kind}").producer()
            assert producer.op_type == "Concat"
            assert producer.inputs[0].name == f"past_key_values.{layer}.{kind}"
    assert sum(node.op_type == "Attention" for node in graph) == 2


def test_the_decoder_matches_transformers_at_batch_1_and_3_sequence_1_and_7_past_0_and_5_and_left_padded(llama):
    _, decoder, _ = llama
    checks = decoder.verify()  # the default shapes: every combination the issue names, and left padding
    labels = {c.name.split(" (", 1)[1] for c in checks}
    assert {
        "batch 1, sequence 1, past 0)",
        "batch 3, sequence 7, past 5, row 2)",
        "left padding, row 1's tokens)",
    } <= labels
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4


def test_verify_fails_when_the_decoder_does_not_match(llama):
    _, decoder, _ = llama
    original = decoder.model
    other = lm.causal_lm("llama", seed=1)  # other weights: the same graph, other numbers
    decoder.model = other
    try:
        with pytest.raises(opreg.VerificationError, match="decoder outputs differ from transformers'") as caught:
            decoder.verify([(1, 3, 2)], left_padding=False)
        # the one comparison verify uses (opreg.exporter.diagnosis.compare): "<bad> of <all> ...", every check kept
        results = caught.value.results
        bad = [c for c in results if not c.ok]
        assert bad and str(caught.value).startswith(f"{len(bad)} of {len(results)} decoder outputs differ")
        assert all(f"  {c}" in str(caught.value) for c in bad)
    finally:
        decoder.model = original


def test_prefill_and_decode_in_a_plain_session_generate_eager_greedy_tokens(llama):
    """One model for both: a prefill with an empty past, then one token at a time, each call's
    present fed back as the next call's past."""
    model, _, folder = llama
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"))
    tokens = prompt()
    past = {f"past_key_values.{i}.{k}": np.zeros((1, 2, 0, 16), np.float32) for i in range(2) for k in ("key", "value")}
    step = np.array([tokens], dtype=np.int64)
    while len(tokens) < LENGTH:
        total = past["past_key_values.0.key"].shape[2] + step.shape[1]
        feeds = {
            "input_ids": step,
            "attention_mask": np.ones((1, total), np.int64),
            "position_ids": np.arange(total - step.shape[1], total, dtype=np.int64)[None],
            **past,
        }
        logits, *present = session.run(None, feeds)
        tokens.append(int(logits[0, -1].argmax()))
        past = dict(zip(past, present, strict=True))
        step = np.array([[tokens[-1]]], dtype=np.int64)
    assert tokens == lm.greedy(model, prompt(), LENGTH)


def test_onnxruntime_genai_runs_the_folder_and_generates_eager_greedy_tokens(llama):
    import onnxruntime_genai as og

    model, _, folder = llama
    assert named(folder.iterdir()) == [
        "genai_config.json", "model.onnx", "model.onnx.<token>.data", "tokenizer.json", "tokenizer_config.json"
    ]  # fmt: skip
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "decoder" and decoder["filename"] == "model.onnx"
    assert decoder["inputs"]["past_key_names"] == LAYOUT["past_key"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert (decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]) == (2, 2, 16)
    assert config["model"]["eos_token_id"] == lm.EOS and config["model"]["context_length"] == 256
    assert config["search"]["past_present_share_buffer"] is False  # past and present are apart: a Concat
    # the tokenizer beside the model reads text as transformers' does
    tokenizer = og.Tokenizer(og.Model(str(folder)))
    assert list(tokenizer.encode(PROMPT_TEXT)) == prompt()
    assert tokenizer.decode(tokenizer.encode(PROMPT_TEXT)) == PROMPT_TEXT
    assert lm.genai_greedy(folder, prompt(), LENGTH) == lm.greedy(model, prompt(), LENGTH)


def test_by_default_at_target_onnxruntime_the_folder_shares_past_and_present_when_group_query_attention_reads_them(
    tmp_path,
):
    """ONNX Runtime's kernels (the ort_contrib pack, installed: the default target): the decoder still
    matches transformers when run plainly (past in, present out), and GenAI, given one buffer for past
    and present only where GroupQueryAttention writes the cache in place, generates eager's greedy tokens."""
    model = lm.causal_lm("llama")
    decoder = opreg.llm.export_decoder(model, tmp_path, tokenizer=lm.tokenizer())
    assert decoder.program.target.name == "onnxruntime"
    decoder.verify([(1, 1, 0), (3, 7, 5)])
    graph = decoder.program.model.graph
    attention = {(n.domain, n.op_type) for n in graph} & {("com.microsoft", "GroupQueryAttention")}
    config = json.loads((tmp_path / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is bool(attention)
    assert lm.genai_greedy(tmp_path, prompt(), LENGTH) == lm.greedy(model, prompt(), LENGTH)


# one architecture per family the sample names; Llama-likes (Qwen2/3, OLMo, Granite, SmolLM3, ...)
# and the rest run in bench/llm_models.py
FAMILIES = {
    "mistral": "sliding-window attention (window 4, shorter than the sequences compared)",
    "gemma2": "alternating sliding and full layers, logit soft-capping, scaled embeddings",
    "gpt_neox": "partial rotary, parallel attention and MLP, fused QKV",
    "falcon": "multi-query attention (one key/value head), fused QKV",
    "phi3": "fused QKV and gate/up projections",
}


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_architectures_export_verify_and_generate_in_genai(model_type, tmp_path):
    model = lm.causal_lm(model_type)
    decoder = opreg.llm.export_decoder(model, tmp_path, tokenizer=lm.tokenizer())
    decoder.verify([(1, 1, 0), (3, 7, 5)])
    assert lm.genai_greedy(tmp_path, prompt(), LENGTH) == lm.greedy(model, prompt(), LENGTH)


def test_a_mixture_of_experts_exports_with_transformers_batched_experts(tmp_path):
    """Mixtral's experts as transformers' ``batched_mm`` implementation (plain gathers and matmuls)."""
    model = lm.causal_lm("mixtral")
    model.set_experts_implementation("batched_mm")
    decoder = opreg.llm.export_decoder(model, tmp_path, tokenizer=lm.tokenizer())
    decoder.verify([(1, 1, 0), (3, 7, 5)], left_padding=False)
    assert lm.genai_greedy(tmp_path, prompt(), LENGTH) == lm.greedy(model, prompt(), LENGTH)


def test_a_mixture_of_experts_with_transformers_default_experts(tmp_path):
    """Mixtral's default CPU experts call the custom op ``transformers::grouped_mm_fallback``: the
    opreg-transformers pack translates it; without that pack installed the export names the op."""
    from importlib.metadata import entry_points

    model = lm.causal_lm("mixtral")
    if "transformers" not in {ep.name for ep in entry_points(group="opreg.plugins")}:
        with pytest.raises(opreg.UnsupportedOpsError, match="transformers::grouped_mm_fallback"):
            opreg.llm.export_decoder(model)
        return
    opreg.llm.export_decoder(model, tmp_path, tokenizer=lm.tokenizer()).verify([(1, 1, 0), (3, 7, 5)])
    assert lm.genai_greedy(tmp_path, prompt(), LENGTH) == lm.greedy(model, prompt(), LENGTH)


@pytest.mark.parametrize("target", ["onnx", "onnxruntime"])
def test_short_convolutions_beside_attention_cache_their_state_as_genai_lays_it_out(target, tmp_path):
    """LFM2: a convolution layer caches the last inputs of its short convolution (``past.%d.conv``,
    ``(batch, hidden, kernel - 1)``), an attention layer its keys and values, each named by its
    own layer, and ``genai_config.json`` lists the layers' kinds, as GenAI's builder writes it; the
    decoder matches transformers (its prefill path, and its decode path after a random state) and
    GenAI generates eager's tokens."""
    model = lm.causal_lm("lfm2")
    decoder = opreg.llm.export_decoder(model, tmp_path, target=target, tokenizer=lm.tokenizer())
    graph = decoder.program.model.graph
    cache = ["past.0.conv", "past_key_values.1.key", "past_key_values.1.value"]
    assert [v.name for v in graph.inputs] == ["input_ids", "attention_mask", "position_ids", *cache]
    assert [v.name for v in graph.outputs] == ["logits", "present.0.conv", "present.1.key", "present.1.value"]
    shapes = {v.name: [d if isinstance(d, int) else d.value for d in v.shape] for v in [*graph.inputs, *graph.outputs]}
    assert shapes["past.0.conv"] == shapes["present.0.conv"] == ["batch_size", 64, 2]  # the kernel is 3
    assert shapes["present.1.key"] == ["batch_size", 2, "total_sequence_length", 16]
    config = json.loads((tmp_path / "genai_config.json").read_text())["model"]
    assert config["type"] == "decoder"
    assert config["decoder"]["layer_types"] == ["conv", "full_attention"] and config["decoder"]["conv_cache_size"] == 2
    assert config["decoder"]["inputs"]["past_conv_names"] == "past.%d.conv"
    assert config["decoder"]["outputs"]["present_conv_names"] == "present.%d.conv"
    if target == "onnxruntime":
        (attention,) = [n for n in graph if (n.domain, n.op_type) == ("com.microsoft", "GroupQueryAttention")]
        assert attention.inputs[3].name == "past_key_values.1.key"
    checks = decoder.verify()  # batch 1 and 3, sequence 1 and 7, past 0 (a prefill) and 5, left padding
    # prompts after a cache: one row where GroupQueryAttention takes no query_seqlens (what ONNX Runtime 1.30 loads)
    after = "batch 1, sequence 7, past 5" if target == "onnxruntime" else "batch 3, sequence 7, past 5, row 2"
    assert {f"present.0.conv ({after})", "present.0.conv (left padding, row 1's tokens)"} <= {c.name for c in checks}
    assert lm.genai_greedy(tmp_path, prompt(), LENGTH) == lm.greedy(model, prompt(), LENGTH)


# Falcon-H1's default state-space sizes (128 heads, state 256, chunks of 256) make its eager call
# allocate 8.6 GB; these are a tiny model's
FALCON_H1 = {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_ssm": 64, "mamba_d_state": 8, "mamba_chunk_size": 8}


@pytest.mark.parametrize(
    ("model_type", "message"),
    [
        ("mamba", "MambaForCausalLM has a state-space cache: convolution and recurrent state, not keys and values "
                  r"\(LinearAttentionLayer in 2 of 2 layers\)"),
        ("jamba", r"JambaForCausalLM has a state-space cache: .* \(LinearAttentionLayer in 2 of 2 layers\)"),
        ("falcon_h1", "FalconH1ForCausalLM has a hybrid cache: state-space .* beside keys and values "
                      r"\(LinearAttentionAndFullAttentionLayer in 2 of 2 layers\)"),
    ],
)  # fmt: skip
def test_a_state_space_or_hybrid_cache_is_refused_with_the_reason_before_the_capture(model_type, message):
    stages = []
    with pytest.raises(opreg.ExportError, match=message):
        opreg.llm.export_decoder(lm.causal_lm(model_type, **FALCON_H1 if model_type == "falcon_h1" else {}),
                                 progress=stages.append)  # fmt: skip
    assert stages == []  # refused from the config, before torch.export ran


@pytest.mark.parametrize(
    ("streaming", "message"),
    [
        (True, r"does not fit LlamaForCausalLM: model.layers.1.mlp.up_proj.weight: missing from the checkpoint"),
        (False, r"lacks 1 of LlamaForCausalLM's weights \(model.layers.1.mlp.up_proj"),
    ],
)
def test_a_checkpoint_missing_weights_is_refused_before_the_export(tmp_path, streaming, message):
    from safetensors.torch import load_file, save_file

    folder = lm.checkpoint(lm.causal_lm("llama", num_hidden_layers=3), tmp_path / "checkpoint")
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    stages = []
    with pytest.raises(opreg.ExportError, match=message):
        opreg.llm.export_decoder(folder, streaming=streaming, progress=stages.append)
    assert stages == []


@pytest.mark.parametrize(
    ("length", "message"),
    [
        (0, "context_length must be at least 1, got 0"),
        (-4, "context_length must be at least 1, got -4"),
        (2**31, "context_length 2147483648 is above 2147483647"),
        (257, r"context_length 257 is above the model's position limit \(max_position_embeddings 256\)"),
        ("512", "context_length= takes a positive int"),
    ],
)
def test_a_context_length_out_of_range_is_refused_before_the_export(length, message):
    stages = []
    with pytest.raises(opreg.InvalidArgumentError, match=message):
        opreg.llm.export_decoder(lm.causal_lm("llama"), context_length=length, progress=stages.append)
    assert stages == []


def test_an_output_folder_that_cannot_be_written_is_refused_before_the_export(tmp_path):
    (tmp_path / "model.onnx").write_text("a file")
    cases = [(tmp_path / "model.onnx", "it is a file; give a folder"), (tmp_path / "no" / "out", "does not exist")]
    for where, message in cases:
        stages = []
        with pytest.raises(opreg.SaveError, match=message):
            opreg.llm.export_decoder(lm.causal_lm("llama"), where, progress=stages.append)
        assert stages == []


def test_a_checkpoint_without_a_tokenizer_exports_with_a_warning_and_a_longer_context_when_allowed(tmp_path, caplog):
    folder = tmp_path / "checkpoint"
    lm.causal_lm("llama").save_pretrained(folder)
    with caplog.at_level("WARNING", logger="opreg.llm"):
        opreg.llm.export_decoder(folder, tmp_path / "out", context_length=300, allow_longer_context=True)
    (warning,) = [r.getMessage() for r in caplog.records if r.name.startswith("opreg.llm")]
    assert warning.startswith(f"{folder} has no tokenizer") and "ONNX Runtime GenAI needs one" in warning
    assert named((tmp_path / "out").iterdir()) == ["genai_config.json", "model.onnx", "model.onnx.<token>.data"]
    assert json.loads((tmp_path / "out" / "genai_config.json").read_text())["model"]["context_length"] == 300


def test_a_model_without_a_cache_is_refused():
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)).eval()
    with pytest.raises(opreg.ExportError, match="BertModel returns no logits and key/value cache"):
        opreg.llm.export_decoder(model)


def test_a_folder_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(opreg.ExportError, match="is not a transformers checkpoint folder"):
        opreg.llm.export_decoder(tmp_path)
    with pytest.raises(opreg.InvalidArgumentError, match="takes a transformers causal LM"):
        opreg.llm.export_decoder(42)


def test_more_export_options_pass_on_to_opreg_export_except_the_decoders_own():
    stages = []
    opreg.llm.export_decoder(lm.causal_lm("llama"), progress=stages.append)
    assert stages == list(opreg.exporter.STAGES)
    with pytest.raises(opreg.InvalidArgumentError, match="export_decoder sets dynamic_shapes, state itself"):
        opreg.llm.export_decoder(lm.causal_lm("llama"), dynamic_shapes={}, state="io")
    with pytest.raises(opreg.InvalidArgumentError, match="got fold_weight, which opreg.export does not take"):
        opreg.llm.export_decoder(lm.causal_lm("llama"), fold_weight=False)


def test_cli_llm_export_writes_a_folder_genai_runs(tmp_path, capsys):
    """At the defaults: the fastest installed target, fp32; the summary lists only the files opreg
    wrote (not a file of the user's already in the folder) and names the target."""
    model = lm.causal_lm("qwen2")
    checkpoint = lm.checkpoint(model, tmp_path / "checkpoint")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    code, stdout, _ = run(capsys, "llm", "export", str(checkpoint), "-o", str(out), "--verify", "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert named(summary["files"]) == [
        "genai_config.json", "model.onnx", "model.onnx.<token>.data", "tokenizer.json", "tokenizer_config.json"
    ]  # fmt: skip
    assert (out / "notes.txt").read_text() == "the user's"
    assert (summary["target"], summary["precision"]) == ("onnxruntime", "fp32")
    assert summary["inputs"][:3] == ["input_ids", "attention_mask", "position_ids"] and summary["verified"] > 0
    assert lm.genai_greedy(out, prompt(), LENGTH) == lm.greedy(model, prompt(), LENGTH)
    _assert_linear_weights_stored_in_out(ir.load(out / "model.onnx").graph, model)
    code, stdout, _ = run(capsys, "llm", "export", str(checkpoint), "-o", str(out), "-t", "onnx")
    assert code == 0 and re.match(
        rf"wrote {out} \(genai_config.json, model.onnx, model.onnx.[0-9a-f]{{8}}.data, tok", stdout
    )
    assert re.search(r"target onnx \(opsets ai\.onnx=\d+[^)]*\)+, fp32, exported in", " ".join(stdout.split()))
    code, _, err = run(capsys, "llm", "export", str(tmp_path / "nothing"), "-o", str(out))
    assert code == 2 and "is not a transformers checkpoint folder" in err


def _assert_linear_weights_stored_in_out(graph: ir.Graph, model, tied: str | None = None) -> None:
    """Every linear layer of the default target's decoder is ``MatMul`` on its weight stored (in, out),
    no ``FusedMatMul(transB=1)`` (measured slower in a decode step: docs/language-models.md), except
    a head tied to the embedding table (``tied``: its name), which reads the table as it is."""
    linear = [n for n in graph if n.op_type.endswith("MatMul") and n.inputs[1].is_initializer()]
    transposed = [n.inputs[1].name for n in linear if (n.domain, n.op_type) != ("", "MatMul")]
    assert linear and transposed == ([tied] if tied else [])
    state = model.state_dict()
    for node in linear:
        name = node.inputs[1].name.removeprefix("model.")
        if name in state and node.op_type == "MatMul":
            stored = node.inputs[1].const_value.numpy()
            np.testing.assert_array_equal(stored, state[name].T.numpy(), err_msg=name)


def test_a_tied_head_at_fp32_reads_the_embedding_table_stored_once():
    """The head tied to the embedding table keeps ``FusedMatMul(transB=1)`` on the table the Gather
    reads (as fast as MatMul on a transposed copy, measured: docs/language-models.md), so the table
    is stored once; the other linear layers are MatMul on (in, out) weights."""
    model = lm.causal_lm("qwen2", tie_word_embeddings=True)
    decoder = opreg.llm.export_decoder(model, target="onnxruntime")
    graph = decoder.program.model.graph
    (gather,) = [n for n in graph if n.op_type == "Gather" and n.inputs[0].is_initializer()]
    table = gather.inputs[0]
    _assert_linear_weights_stored_in_out(graph, model, tied=table.name)
    shape = list(table.shape)
    assert [v.name for v in graph.initializers.values() if sorted(v.shape) == sorted(shape)] == [table.name]
    decoder.verify([(1, 1, 0), (2, 5, 3)])


def test_cli_int4_in_one_flag_and_a_checkpoint_without_a_tokenizer(tmp_path, capsys):
    checkpoint = tmp_path / "checkpoint"
    lm.causal_lm("llama").save_pretrained(checkpoint)
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "llm", "export", str(checkpoint), "-o", str(out), "--precision", "int4", "--json")
    assert code == 0 and f"warning: {checkpoint} has no tokenizer" in " ".join(err.split())
    summary = json.loads(stdout)
    assert summary["precision"] == "int4"
    assert named(summary["files"]) == ["genai_config.json", "model.onnx", "model.onnx.<token>.data"]
    graph = ir.load(out / "model.onnx").graph
    assert {n.op_type for n in graph} >= {"MatMulNBits"}
    assert not [n for n in graph if n.op_type in ("MatMul", "FusedMatMul") and n.inputs[1].is_initializer()]
    code, _, err = run(capsys, "llm", "export", str(checkpoint), "-o", str(out), "--no-tokenizer", "--json")
    assert code == 0 and "warning" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-o", "{tmp}/file"], "cannot write the model folder {tmp}/file: it is a file; give a folder"),
        (["-o", "{tmp}/no/out"], "{tmp}/no does not exist; create it first"),
        (["--context-length", "0"], "context_length must be at least 1, got 0"),
        (["--context-length", "300"], "context_length 300 is above the model's position limit"),
        (["--block-size", "64"], "block_size sets how weights are quantized: give precision='int4' or 'int8'"),
        (["--precision", "int4", "-t", "onnx"], "which target 'onnx' does not allow"),
        (["--int4-algo", "hqq"], "int4_algo='hqq' chooses int4 weights: give precision='int4' (--precision int4)"),
        (["--precision", "int8", "--int4-algo", "k_quant"], "int4_algo='k_quant' chooses int4 weights"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_options_at_once_in_one_line(tmp_path, capsys, argv, message):
    """Before the weights are read: they are garbage here, and reading them would be another error."""
    checkpoint = lm.checkpoint(lm.causal_lm("llama"), tmp_path / "checkpoint")
    (checkpoint / "model.safetensors").write_bytes(b"not weights")
    (tmp_path / "file").write_text("a file")
    argv = [a.format(tmp=tmp_path) for a in argv]
    out = [] if "-o" in argv else ["-o", str(tmp_path / "out")]
    capsys.readouterr()  # save_pretrained's progress
    code, stdout, err = run(capsys, "llm", "export", str(checkpoint), *out, *argv)
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert err.startswith("opreg: error: ") and message.format(tmp=tmp_path) in err
    assert not (tmp_path / "out").exists()


def test_import_opreg_llm_is_cheap():
    import subprocess
    import sys

    code = "import sys, opreg.llm; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert opreg.llm.LAYOUT is LAYOUT and Path(opreg.llm.__file__).parent.name == "llm"


def test_a_forward_with_use_cache_exports_and_its_cache_is_the_decoders_present():
    """The issue's failing case (Qwen2 with ``use_cache=True``: ``aten::detach`` and the ``DynamicCache``
    it returns) exports with dynamic batch and sequence, and the cache it returns is what the
    decoder's prefill returns as ``present``."""
    model = lm.causal_lm("qwen2")
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    dims = {"input_ids": {0: batch, 1: sequence}, "use_cache": None}
    example = torch.randint(2, lm.VOCAB, (2, 5))
    program = opreg.export(model, (), {"input_ids": example, "use_cache": True}, dynamic_shapes=dims)
    assert program.output_names[:3] == ("logits", "past_key_values.0.key", "past_key_values.0.value")
    ids = torch.randint(2, lm.VOCAB, (3, 7))
    program.verify(input_ids=ids, use_cache=True)
    cache = program.run(input_ids=ids, use_cache=True).past_key_values
    decoder = opreg.llm.export_decoder(model)
    present = decoder.run(decoder.inputs(ids))["present"]
    for layer in range(2):
        torch.testing.assert_close(cache.layers[layer].keys, present[2 * layer], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.layers[layer].values, present[2 * layer + 1], rtol=1e-5, atol=1e-5)


def test_int4_weights_and_a_tied_embedding_stored_once_in_a_folder_genai_runs(tmp_path):
    """``precision="int4"``: every linear layer a MatMulNBits with the pass's defaults, the tied
    embedding table read from the head's quantized weight (no float copy), and GenAI runs the folder."""
    from opreg_ort_contrib import MatMulNBitsQuantization

    model = lm.causal_lm("qwen2", tie_word_embeddings=True)
    decoder = opreg.llm.export_decoder(model, tmp_path, precision="int4", tokenizer=lm.tokenizer())
    graph = decoder.program.model.graph
    defaults = MatMulNBitsQuantization()
    expected = {"bits": 4, "block_size": defaults.block_size}
    if defaults.accuracy_level is not None:
        expected["accuracy_level"] = defaults.accuracy_level
    nbits = [n for n in graph if n.op_type == "MatMulNBits"]
    assert nbits and all({a.name: a.value for a in n.attributes.values()}.items() >= expected.items() for n in nbits)
    assert [n.op_type for n in graph if n.op_type in ("Gather", "GatherBlockQuantized")] == ["GatherBlockQuantized"]
    assert not [n for n in graph if n.op_type in ("MatMul", "FusedMatMul") and n.inputs[1].is_initializer()]
    floats = [v for v in graph.initializers.values() if v.dtype == ir.DataType.FLOAT and v.const_value.size >= 64 * 64
              and not v.name.startswith("rotary_")]  # fmt: skip
    assert floats == []  # every weight matrix is quantized, the table stored once
    assert decoder.precision == "int4" and decoder.program.target.name == "onnxruntime"
    assert len(lm.genai_greedy(tmp_path, prompt(), LENGTH)) == LENGTH


def test_int8_weights_compute_close_to_transformers():
    """int8 weights, computed in float (``accuracy_level=None``): the tiny model's logits (standard
    deviation 0.16) move by a few thousandths."""
    model = lm.causal_lm("llama")
    decoder = opreg.llm.export_decoder(model, precision="int8", accuracy_level=None)
    assert {n.op_type for n in decoder.program.model.graph} >= {"MatMulNBits"}
    decoder.verify([(1, 1, 0), (3, 7, 5)], rtol=0, atol=1e-2)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"precision": "int3"}, opreg.InvalidArgumentError, "precision= takes one of fp32, int8, int4, got 'int3'"),
        ({"block_size": 64}, opreg.InvalidArgumentError, "block_size sets how weights are quantized: give precision"),
        ({"precision": "int4", "block_size": 24}, opreg.InvalidArgumentError, "block_size= takes a power of two"),
        ({"precision": "int4", "target": "onnx"}, opreg.InvalidArgumentError,
         "stores weights for ONNX Runtime's com.microsoft::MatMulNBits, which target 'onnx' does not allow"),
    ],
)  # fmt: skip
def test_bad_precision_options_are_refused_before_the_export(options, error, message):
    stages = []
    with pytest.raises(error, match=message):
        opreg.llm.export_decoder(lm.causal_lm("llama"), progress=stages.append, **options)
    assert stages == []


@pytest.mark.parametrize(
    ("model_type", "layers", "captured"),
    [("llama", 4, 1), ("gemma2", 5, 2)],  # gemma2: sliding and full layers alternate, a kind each
)
def test_repeated_layers_are_captured_once_and_copied_each_with_its_own_weights_and_cache(
    model_type, layers, captured, tmp_path, caplog, monkeypatch
):
    """The capture traces one layer of each kind, and sees the cache of those layers only; the
    later ones are copies of the captured layer of their kind, their cache inputs and outputs
    added. The decoder is the graph a whole capture makes (every node, what it reads, every
    weight, every input and output, how a call is flattened), matches transformers (each layer's
    own weights and cache: random, so a mix-up shows) and GenAI generates eager's tokens."""
    from opreg.llm import _layers

    model = lm.causal_lm(model_type, num_hidden_layers=layers)
    with caplog.at_level("INFO", logger="opreg.llm"):
        decoder = opreg.llm.export_decoder(model, tmp_path, tokenizer=lm.tokenizer())
    assert f"captured the first {captured} of {layers} layers; the others are copies" in caplog.text
    assert len(decoder.program.exported_program.graph_signature.user_inputs) == 3 + 2 * captured
    decoder.verify([(1, 1, 0), (3, 7, 5)])
    assert lm.genai_greedy(tmp_path, prompt(), LENGTH) == lm.greedy(model, prompt(), LENGTH)
    monkeypatch.setattr(_layers, "plan_layers", lambda *args, **kwargs: None)
    whole = opreg.llm.export_decoder(model)
    assert graph_digest(decoder.program.model.graph) == graph_digest(whole.program.model.graph)
    mine, theirs = decoder.program, whole.program
    for values in ("inputs", "outputs"):
        described = [[(v.name, v.dtype, str(v.shape)) for v in getattr(p.model.graph, values)] for p in (mine, theirs)]
        assert described[0] == described[1]
    assert (mine.calls.in_spec, mine.calls.out_spec, mine.calls.input_leaves) == (
        theirs.calls.in_spec,
        theirs.calls.out_spec,
        theirs.calls.input_leaves,
    )


def graph_digest(graph: ir.Graph) -> tuple[list, list]:
    """A graph as what each node computes, names aside: every node's op, attributes and inputs, an
    input given by what computes it (recursively down to the graph's inputs by name, the weights
    by name and value, other constants by value; the sizes a Shape reads of an input, by their
    dim names: torch picks which of the inputs holding a dim its size is read from); the nodes as
    a sorted list, then the outputs."""
    import hashlib

    memo: dict[ir.Value, str] = {}

    def value(v: ir.Value | None) -> str:
        if v is None:
            return "-"
        if v not in memo:
            if v.is_graph_input():
                memo[v] = f"input {v.name}"
            elif v.const_value is not None and v.producer() is None:
                data = hashlib.sha256(v.const_value.numpy().tobytes()).hexdigest()[:16]
                name = v.name if v.name.startswith("model.") else "constant"
                memo[v] = f"{name} {v.dtype} {v.shape} {data}"
            else:
                memo[v] = f"{node(v.producer())}[{v.index()}]"
        return memo[v]

    def node(n: ir.Node) -> str:
        attributes = sorted((a.name, repr(a.value)) for a in n.attributes.values())
        inputs = [value(v) for v in n.inputs]
        if (n.domain, n.op_type) == ("", "Shape") and n.inputs[0].is_graph_input():
            start, end = (n.attributes[k].value if k in n.attributes else None for k in ("start", "end"))
            attributes, inputs = [], [f"dims {[str(d) for d in n.inputs[0].shape[start:end]]}"]
        text = repr((n.domain, n.op_type, attributes, inputs))
        return hashlib.sha256(text.encode()).hexdigest()

    return sorted(node(n) for n in graph), [value(v) for v in graph.outputs]
