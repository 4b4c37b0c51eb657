"""``--int4-algo``: a causal LM's int4 weights chosen by k-quant search (mixed with int8), HQQ or GPTQ, in
a folder GenAI runs (accuracy against round to nearest: bench/llm.py part 7, BENCHMARKS.md).

GPTQ's tolerance: with an identity Gram matrix it is round to nearest, ONNX Runtime's symmetric
blocks (GPTQ's damping only scales the matrix): the same values exactly."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
import torch

import opreg
from tests import language_models as lm
from tests.test_cli import run

LENGTH = 12


def _bits(folder) -> dict[str, int]:
    """Each MatMulNBits' weight (its float name) and bits."""
    graph = ir.load(folder / "model.onnx").graph
    return {
        n.inputs[1].name.rsplit("_Q", 1)[0]: n.attributes["bits"].as_int() for n in graph if n.op_type == "MatMulNBits"
    }


def test_cli_k_quant_keeps_the_builders_sensitive_matrices_in_int8_and_genai_runs_it(tmp_path, capsys):
    """8 layers: the head and layers 0, 3, 6 and 7's packed qkv and down projections in int8 (the
    builder's k_quant_mixed), the rest int4 with zero points; GenAI generates from the folder."""
    checkpoint = lm.checkpoint(lm.causal_lm("llama", num_hidden_layers=8), tmp_path / "checkpoint")
    out = tmp_path / "out"
    argv = ["llm", "export", str(checkpoint), "-o", str(out), "--precision", "int4", "--int4-algo", "k_quant"]
    code, stdout, _ = run(capsys, *argv, "--json")
    assert code == 0 and json.loads(stdout)["precision"] == "int4"
    bits = _bits(out)
    wide = {
        f"model.model.layers.{i}.{p}" for i in (0, 3, 6, 7) for p in ("self_attn.qkv_packed", "mlp.down_proj.weight")
    }
    assert {name for name, b in bits.items() if b == 8} == wide | {"model.lm_head.weight"}
    assert len(bits) == 8 * 5 + 1 and set(bits.values()) == {4, 8}
    graph = ir.load(out / "model.onnx").graph
    assert all(len(n.inputs) == 4 for n in graph if n.op_type == "MatMulNBits")  # zero points
    assert len(lm.genai_greedy(out, [1, 5, 9, 4], LENGTH)) == LENGTH


def test_hqq_with_a_tied_embedding_reads_its_table_from_the_head_and_genai_runs_it(tmp_path):
    model = lm.causal_lm("qwen2", tie_word_embeddings=True)
    decoder = opreg.llm.export_decoder(model, tmp_path, precision="int4", int4_algo="hqq", tokenizer=lm.tokenizer())
    graph = decoder.program.model.graph
    assert {n.op_type for n in graph} >= {"MatMulNBits", "GatherBlockQuantized"}
    assert set(_bits(tmp_path).values()) == {4}
    assert len(lm.genai_greedy(tmp_path, [1, 5, 9, 4], LENGTH)) == LENGTH


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"int4_algo": "awq", "precision": "int4"}, "int4_algo= takes one of rtn, k_quant, hqq, gptq, got 'awq'"),
        ({"int4_algo": "gptq", "precision": "int4", "symmetric": False}, "int4_algo='gptq' writes symmetric blocks"),
        ({"int4_algo": "gptq", "precision": "int4", "streaming": False}, "leave streaming=False out"),
        ({"int4_algo": "hqq"}, r"int4_algo='hqq' chooses int4 weights: give precision='int4' \(--precision int4\)"),
        ({"int4_algo": "k_quant", "precision": "int8"}, "int4_algo='k_quant' chooses int4 weights"),
    ],
)  # fmt: skip
def test_bad_int4_algos_are_refused_when_the_settings_are_made(options, message):
    with pytest.raises(opreg.InvalidArgumentError, match=message):
        opreg.llm.LLMSettings(**options)
    assert opreg.llm.LLMSettings(precision="int8", int4_algo="rtn").quantization() == {"int4_algo": "rtn"}


def _logit_error(folder, model, ids: torch.Tensor) -> float:
    """The int4 folder's largest logit difference from the float ``model`` on ``ids`` (ONNX Runtime)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    if "position_ids" in names:
        feeds["position_ids"] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            heads, size = i.shape[1], i.shape[3]
            feeds[i.name] = np.zeros((ids.shape[0], heads, 0, size), np.float32)
    logits = session.run(["logits"], feeds)[0]
    with torch.no_grad():
        expected = model(ids).logits.numpy()
    return float(np.abs(logits - expected).mean())


def test_gptq_writes_rtns_symmetric_blocks_closer_to_the_float_model_and_genai_runs_it(tmp_path, capsys):
    """GPTQ calibrated on random tokens: every linear layer (the head too) int4, symmetric (no zero
    points), K kept where it is not whole blocks (64 in blocks of 128); on other random tokens its
    logits are nearer the float model's than round to nearest's (mean abs difference)."""
    model = lm.causal_lm("llama")
    checkpoint = lm.checkpoint(model, tmp_path / "checkpoint")
    folders = {algo: tmp_path / algo for algo in ("rtn", "gptq")}
    for algo, out in folders.items():
        argv = ["llm", "export", str(checkpoint), "-o", str(out), "--precision", "int4", "--int4-algo", algo]
        code, stdout, err = run(capsys, *argv, "--accuracy-level", "0", "--json")
        assert code == 0, err
        assert (json.loads(stdout)["precision"], json.loads(stdout)["stored_format"]) == ("int4", None)
    graph = ir.load(folders["gptq"] / "model.onnx").graph
    nbits = [n for n in graph if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 * 5 + 1 and all(len(n.inputs) == 3 for n in nbits)  # q/k/v packed; no zero points
    assert {n.attributes["K"].as_int() for n in nbits} == {64, 128}
    assert set(_bits(folders["gptq"]).values()) == {4}
    ids = torch.randint(0, lm.VOCAB, (4, 24), generator=torch.Generator().manual_seed(1))
    errors = {algo: _logit_error(out, model, ids) for algo, out in folders.items()}
    assert errors["gptq"] < 0.9 * errors["rtn"], errors
    assert len(lm.genai_greedy(folders["gptq"], [1, 5, 9, 4], LENGTH)) == LENGTH


def test_gptq_on_an_identity_gram_matrix_is_onnx_runtimes_round_to_nearest():
    from onnxruntime.capi import _pybind_state as kernels

    from opreg.llm import _gptq

    weight = torch.randn(24, 96, generator=torch.Generator().manual_seed(0))  # (N, K): K not whole blocks of 64
    q, scales = _gptq.gptq(weight, torch.eye(96), 64)
    kn = np.ascontiguousarray(np.pad(weight.numpy().T, ((0, 32), (0, 0))))  # (K, N) row-major, as the kernel reads
    packed = np.zeros((24, 2, 32), np.uint8)
    expected_scales, zeros = np.zeros((24, 2), np.float32), np.zeros((24, 1), np.uint8)
    kernels.quantize_matmul_4bits(packed, kn, expected_scales, zeros, 64, 24, 128, True)
    np.testing.assert_array_equal(scales.numpy(), expected_scales)
    expected = np.stack([packed & 15, packed >> 4], -1).reshape(24, 128)[:, :96]
    np.testing.assert_array_equal(q.numpy(), expected)


def test_gptq_of_a_model_given_is_refused_naming_the_checkpoint_folder():
    with pytest.raises(opreg.InvalidArgumentError, match="give the checkpoint folder"):
        opreg.llm.export_decoder(lm.causal_lm("llama"), precision="int4", int4_algo="gptq", tokenizer=False)
