"""``--int4-algo``: a causal LM's int4 weights chosen by k-quant search (mixed with int8) or HQQ, in a
folder GenAI runs (accuracy against round to nearest: bench/llm.py part 7, BENCHMARKS.md)."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest

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
        ({"int4_algo": "gptq", "precision": "int4"}, "int4_algo= takes one of rtn, k_quant, hqq, got 'gptq'"),
        ({"int4_algo": "hqq"}, r"int4_algo='hqq' chooses int4 weights: give precision='int4' \(--precision int4\)"),
        ({"int4_algo": "k_quant", "precision": "int8"}, "int4_algo='k_quant' chooses int4 weights"),
    ],
)  # fmt: skip
def test_bad_int4_algos_are_refused_when_the_settings_are_made(options, message):
    with pytest.raises(opreg.InvalidArgumentError, match=message):
        opreg.llm.LLMSettings(**options)
    assert opreg.llm.LLMSettings(precision="int8", int4_algo="rtn").quantization() == {"int4_algo": "rtn"}
