"""int4 more accurate than round to nearest: MatMulNBitsQuantization's ``int4_algo`` (k_quant, hqq),
against ONNX Runtime's own quantizer on the same weights."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from nbits_models import MLP, dequantized, nodes
from onnx import TensorProto, helper, numpy_helper

import opreg
from opreg_ort_contrib import MatMulNBitsQuantization, int4_algos


def _matmul_model(weight: np.ndarray) -> onnx.ModelProto:
    k, n = weight.shape
    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="linear")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [numpy_helper.from_array(weight, "W")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _theirs(weight: np.ndarray, config: str, bits: int = 4, block_size: int = 32) -> list[np.ndarray]:
    """MatMulNBits' B, scales and zero points as ONNX Runtime's MatMulNBitsQuantizer writes them."""
    quantizer = int4_algos.ort_quantization("onnxruntime.quantization.matmul_nbits_quantizer")
    if config == "k_quant":  # bits by node, as the builder gives them (the quantizer's own bits are 4 for k_quant)
        algo = quantizer.KQuantWeightOnlyQuantConfig(customized_weight_config={"linear": {"bits": bits}})
    else:
        algo = quantizer.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits)
    made = quantizer.MatMulNBitsQuantizer(_matmul_model(weight), bits=bits, block_size=block_size, algo_config=algo)
    made.process()
    graph = made.model.model.graph
    (node,) = [n for n in graph.node if n.op_type == "MatMulNBits"]
    arrays = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    return [arrays[name] for name in node.input[1:4]]


WEIGHT = np.random.default_rng(0).standard_normal((256, 48)).astype(np.float32)  # (K, N): 8 blocks of 32


@pytest.mark.parametrize("bits", [4, 8])
def test_k_quant_blocks_are_onnx_runtimes_k_quant_byte_for_byte(bits):
    packed, scales, zero_points = _theirs(WEIGHT, "k_quant", bits)
    ours = int4_algos.KQuantBlocks(bits, 32).qbits_block_quant(WEIGHT)
    assert np.array_equal(ours[0], packed.reshape(ours[0].shape))
    assert np.array_equal(ours[1], scales.reshape(ours[1].shape))
    assert np.array_equal(ours[2], zero_points.reshape(ours[2].shape))


def test_hqq_blocks_are_onnx_runtimes_hqq_with_its_zero_points_rounded():
    """The scales are ONNX Runtime's; its float zero points rounded to MatMulNBits' uint8 (which the
    fast int8 path takes), and the values rounded again with them."""
    _, scales, zero_points = _theirs(WEIGHT, "hqq")
    packed, our_scales, our_zero_points = int4_algos.HQQBlocks(4, 32).qbits_block_quant(WEIGHT)
    assert zero_points.dtype == np.float32 and not np.array_equal(zero_points, np.round(zero_points))
    assert np.array_equal(our_scales, scales.reshape(our_scales.shape))
    rounded = np.clip(np.round(zero_points.reshape(48, 8)), 0, 15).astype(np.uint8)
    assert np.array_equal(our_zero_points, rounded[:, 0::2] | (rounded[:, 1::2] << 4))
    values = np.stack([packed & 15, packed >> 4], -1).reshape(48, 8, 32).astype(np.float32)
    dequantized = (values - rounded[..., None]) * our_scales[..., None]
    assert np.abs(dequantized.reshape(48, 256) - WEIGHT.T).max() <= our_scales.max() / 2 + 1e-6


def test_the_searched_blocks_are_closer_to_the_weights_than_round_to_nearest():
    """Mean absolute error of the dequantized weights, blocks of 128 (the default), a weight with
    outliers as trained ones have: k_quant and hqq below symmetric round to nearest."""
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((512, 96)) * rng.choice([1, 1, 1, 6], (512, 96))).astype(np.float32)
    errors = {}
    for algo in ("rtn", "k_quant", "hqq"):
        model = torch.nn.Sequential(torch.nn.Linear(512, 96, bias=False)).eval()
        with torch.no_grad():
            model[0].weight.copy_(torch.from_numpy(weight.T))
        program = opreg.export(model, (torch.randn(2, 512),), target="onnxruntime",
                               passes=[MatMulNBitsQuantization(int4_algo=algo, accuracy_level=None)])  # fmt: skip
        (made,) = dequantized(program).values()
        errors[algo] = float(np.abs(made - weight).mean())
    assert errors["k_quant"] < errors["rtn"] and errors["hqq"] < errors["rtn"], errors


@pytest.mark.parametrize("algo", ["k_quant", "hqq"])
def test_each_algorithm_computes_with_the_weights_it_stores(algo):
    """Zero points always (both fit one per block), the tied head's table read by GatherBlockQuantized,
    and ONNX Runtime computing what eager PyTorch computes with the dequantized weights."""
    torch.manual_seed(0)
    model, ids = MLP(tied=True, vocab=300).eval(), torch.randint(0, 300, (2, 5))
    quantize = MatMulNBitsQuantization(int4_algo=algo, block_size=32, accuracy_level=None)
    program = opreg.export(model, (ids,), target="onnxruntime", passes=[quantize])
    linears = nodes(program, "MatMulNBits")
    assert len(linears) == 3 and all(len(n.inputs) == 4 for n in linears)  # zero points
    bits = [n.attributes["bits"].as_int() for n in linears]  # up, down, the head: k_quant's head in 8 bits
    assert bits == [4, 4, 8 if algo == "k_quant" else 4]
    (gather,) = nodes(program, "GatherBlockQuantized")
    assert len(gather.inputs) == 4  # the head's zero points too
    expected = MLP(tied=True, vocab=300).eval()
    expected.load_state_dict(model.state_dict())
    with torch.no_grad():
        for node, weight in zip(linears, dequantized(program).values(), strict=True):
            layer = {"up": expected.up, "down": expected.down}.get(node.inputs[1].name.split(".")[0], expected.head)
            layer.weight.copy_(torch.from_numpy(weight.T))
        np.testing.assert_allclose(program.run(ids).numpy(), expected(ids).numpy(), rtol=1e-4, atol=1e-4)


def test_k_quant_keeps_the_head_and_the_sensitive_projections_of_the_builders_layers_in_8_bits():
    """The builder's mixed_layers at 8 layers: 0, 3, 6 and 7 (the first and last eighth, every third
    between), their qkv (packed or v alone) and down projections, and the head (the last)."""
    names = [f"model.layers.{i}.{p}.weight" for i in range(8) for p in ("self_attn.qkv_packed", "self_attn.o_proj",
                                                                           "mlp.down_proj", "mlp.up_proj")]  # fmt: skip
    chosen = int4_algos.sensitive([*names, "lm_head.weight"])
    expected = {f"model.layers.{i}.{p}.weight" for i in (0, 3, 6, 7) for p in ("self_attn.qkv_packed", "mlp.down_proj")}
    assert chosen == expected | {"lm_head.weight"}
    assert int4_algos.sensitive(["model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.q_proj.weight",
                                 "head"]) == {"model.layers.0.self_attn.v_proj.weight", "head"}  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [({"int4_algo": "gptq"}, r"int4_algo= takes rtn or k_quant or hqq, got str 'gptq'$"),
     ({"int4_algo": "hqq", "bits": 8}, r"int4_algo= takes 'rtn' at bits=8 \(the others choose int4\), got str 'hqq'$"),
     ({"int4_algo": "k_quant", "symmetric": True},
      r"symmetric= takes False or None with k_quant, which fits a zero point to each block, got bool True$")],
)  # fmt: skip
def test_bad_algorithm_options_say_what_to_write(options, message):
    with pytest.raises(opreg.InvalidArgumentError, match=rf"^MatMulNBitsQuantization: {message}"):
        MatMulNBitsQuantization(**options)


def test_the_algorithms_leave_logging_and_sys_path_alone(tmp_path):
    """ONNX Runtime's quantization package, imported for k_quant and hqq, calls
    logging.basicConfig(level=INFO) and puts onnxruntime.transformers on sys.path: undone."""
    import subprocess
    import sys

    script = (
        "import logging, sys, torch, opreg\n"
        "from opreg_ort_contrib import MatMulNBitsQuantization\n"
        "before = (logging.getLogger().level, list(logging.getLogger().handlers), list(sys.path))\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 8)).eval()\n"
        "for algo in ('k_quant', 'hqq'):\n"
        "    quantize = MatMulNBitsQuantization(int4_algo=algo)\n"
        "    opreg.export(model, (torch.randn(2, 64),), target='onnxruntime', passes=[quantize]).save('m.onnx')\n"
        "after = (logging.getLogger().level, list(logging.getLogger().handlers), list(sys.path))\n"
        "assert before == after, (before, after)\n"
        "assert 'onnxruntime.quantization' in sys.modules\n"
        "logging.getLogger('anything').info('not shown')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "not shown" not in done.stderr and "[INFO]" not in done.stderr
