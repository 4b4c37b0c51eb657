"""Pre-quantized checkpoints exported as they are (issue 51): GPTQ, AWQ and compressed-tensors'
pack-quantized, written here from the tiny Llama (tests/quantized_checkpoints.py), become
MatMulNBits on their stored integers; the logits match the checkpoint's own model (transformers
with compressed-tensors; for GPTQ and AWQ the float model of the same integers, as their loaders
need CUDA to install); odd formats are refused before the export, naming the tensor or key.

Tolerances: with MatMulNBits' float path (``accuracy_level=0``) the decoder computes what the
dequantized model does, to float32 rounding (measured: at most 2.4e-7 on logits of about 0.5):
``verify``'s 1e-4. At the default accuracy level 4 (the input quantized to int8 per block, the
fastest on CPU) the logits differ by up to 0.005 (measured 0.0042 on compressed-tensors): 2e-2.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
import torch

import opreg
import opreg.llm
from opreg.weights import LazyWeight
from tests import language_models as lm
from tests import quantized_checkpoints as qc

LAYERS = 2
PRODUCTS = 5
"""Products per layer at the onnxruntime target: q, k and v packed in one, o, gate, up, down."""


def _of_weight(node: ir.Node) -> bool:
    """Whether ``node`` is a product of a stored weight (not the rotary's angles, positions times
    frequencies, which the default target computes before GroupQueryAttention)."""
    return node.op_type != "MatMul" or node.inputs[1].is_initializer()


def products(graph: ir.Graph) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in graph:
        if node.op_type in ("MatMulNBits", "MatMul", "Gemm", "Gather", "Concat") and _of_weight(node):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def stored_only(graph: ir.Graph) -> None:
    """Every layer's product is a MatMulNBits on 4/8-bit blocks read from the checkpoint as it
    is written (lazy, nothing held in memory); the only float product left is the head, and no
    float weight of a quantized layer is in the model."""
    nbits = [node for node in graph if node.op_type == "MatMulNBits"]
    assert nbits and all(node.domain == "com.microsoft" for node in nbits)
    weights = [node for node in graph if node.op_type == "MatMul" and _of_weight(node)]
    assert ["lm_head" in (node.inputs[1].name or "") for node in weights] == [True]
    for node in nbits:
        b = node.inputs[1].const_value
        assert isinstance(b, LazyWeight) and not b.held and b.torch_dtype == torch.uint8
    floats = [
        v.name for v in graph.initializers.values() if v.name.endswith("_proj.weight") and v.dtype == ir.DataType.FLOAT
    ]
    assert floats == []


GPTQ_CASES = {
    "4 bits, asymmetric, groups of 32": {},
    "8 bits, symmetric": {"bits": 8, "symmetric": True},
    "gptq_v2, groups of 64": {"version": "gptq_v2", "group": 64},
    "act-order": {"act_order": True},
}


@pytest.mark.parametrize("options", GPTQ_CASES.values(), ids=GPTQ_CASES.keys())
def test_gptq_is_matmulnbits_on_its_integers_and_matches_its_dequantized_model(tmp_path, options):
    reference = qc.gptq(tmp_path / "gptq", **options)
    decoder = opreg.llm.export_decoder(tmp_path / "gptq", accuracy_level=0, tokenizer=False)
    counts = products(decoder.program.model.graph)
    assert counts["MatMulNBits"] == PRODUCTS * LAYERS and counts["MatMul"] == 1
    # act-order: each input reordered once, shared by the layers reading it (q, k, v packed)
    assert counts["Gather"] == 1 + (4 * LAYERS if options.get("act_order") else 0)  # q/k/v and gate/up share one
    bits = options.get("bits", 4)
    assert (decoder.precision, decoder.stored_format) == (f"int{bits}", "GPTQ")  # what was written, not fp32
    assert {
        node.attributes["bits"].as_int() for node in decoder.program.model.graph if node.op_type == "MatMulNBits"
    } == {bits}
    stored_only(decoder.program.model.graph)
    decoder.verify()  # against the model of the checkpoint's own (q - z) * s
    ids = torch.tensor([lm.EOS, 5, 17, 42, 99, 7]).reshape(1, -1)
    with torch.no_grad():
        expected = reference(ids).logits  # the writer's float model: its integers, never read back
    got = torch.as_tensor(decoder.run(decoder.inputs(ids))["logits"])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_act_order_layers_packed_in_unlike_orders_are_one_matmulnbits_each(tmp_path):
    """q, k and v read one input: GPTQ orders them alike. Unlike orders (written so here) cannot
    be one MatMulNBits: each layer is its own, on its own Gather, and a Concat joins them."""
    reference = qc.gptq(tmp_path / "gptq", act_order=True, shared=False)
    decoder = opreg.llm.export_decoder(tmp_path / "gptq", accuracy_level=0, tokenizer=False)
    counts = products(decoder.program.model.graph)
    assert counts["MatMulNBits"] == (PRODUCTS + 2) * LAYERS and counts["Concat"] >= LAYERS
    decoder.verify()
    ids = torch.tensor([[3, 8, 13, 21]])
    with torch.no_grad():
        expected = reference(ids).logits
    torch.testing.assert_close(
        torch.as_tensor(decoder.run(decoder.inputs(ids))["logits"]), expected, rtol=1e-4, atol=1e-5
    )


def test_awq_is_matmulnbits_on_its_integers_and_matches_its_dequantized_model(tmp_path):
    reference = qc.awq(tmp_path / "awq")
    decoder = opreg.llm.export_decoder(tmp_path / "awq", accuracy_level=0, tokenizer=False)
    assert (decoder.precision, decoder.stored_format) == ("int4", "AWQ")
    assert products(decoder.program.model.graph)["MatMulNBits"] == PRODUCTS * LAYERS
    stored_only(decoder.program.model.graph)
    decoder.verify()
    ids = torch.tensor([[3, 8, 13, 21, 34]])
    with torch.no_grad():
        expected = reference(ids).logits
    torch.testing.assert_close(
        torch.as_tensor(decoder.run(decoder.inputs(ids))["logits"]), expected, rtol=1e-4, atol=1e-5
    )


COMPRESSED_CASES = {
    "4 bits, symmetric, groups of 32": {},
    "4 bits, asymmetric, per channel": {"group": None, "symmetric": False},
    "8 bits, symmetric": {"bits": 8},
}


@pytest.mark.parametrize("options", COMPRESSED_CASES.values(), ids=COMPRESSED_CASES.keys())
def test_compressed_tensors_matches_transformers_loading_it(tmp_path, options):
    """The reference is transformers' own model of the checkpoint (the compressed-tensors package
    dequantizes it on the CPU): ``verify`` loads it so."""
    qc.compressed(tmp_path / "ct", **options)
    decoder = opreg.llm.export_decoder(tmp_path / "ct", accuracy_level=0, tokenizer=False)
    assert (decoder.precision, decoder.stored_format) == (f"int{options.get('bits', 4)}", "compressed-tensors")
    assert products(decoder.program.model.graph)["MatMulNBits"] == PRODUCTS * LAYERS
    stored_only(decoder.program.model.graph)
    zero_points = {len(node.inputs) for node in decoder.program.model.graph if node.op_type == "MatMulNBits"}
    assert zero_points == ({3} if options.get("symmetric", True) else {4})  # symmetric: the midpoint, no input
    decoder.verify()


def test_at_the_default_accuracy_level_the_logits_are_within_its_stated_tolerance(tmp_path):
    qc.compressed(tmp_path / "ct")
    decoder = opreg.llm.export_decoder(tmp_path / "ct", tokenizer=False)
    levels = {
        n.attributes["accuracy_level"].as_int() for n in decoder.program.model.graph if n.op_type == "MatMulNBits"
    }
    assert levels == {4}
    decoder.verify(rtol=2e-2, atol=2e-2)
    with pytest.raises(opreg.VerificationError):
        decoder.verify(rtol=1e-5, atol=1e-5)  # int8 inputs: not the float path's exactness


def test_the_command_line_writes_a_folder_genai_runs_with_the_checkpoints_greedy_tokens(tmp_path, capsys):
    from tests.test_cli import run

    reference = qc.gptq(tmp_path / "gptq", act_order=True)
    lm.tokenizer().save_pretrained(tmp_path / "gptq")
    out = tmp_path / "out"
    code, said, err = run(capsys, "llm", "export", str(tmp_path / "gptq"), "-o", str(out), "--accuracy-level", "0")
    assert code == 0, err
    assert "int4 (GPTQ checkpoint's integers)" in said
    model = ir.load(out / "model.onnx")
    assert sum(node.op_type == "MatMulNBits" for node in model.graph) == PRODUCTS * LAYERS
    assert dict(model.opset_imports).get("com.microsoft") == 1
    prompt = list(lm.tokenizer()("hello world, the quick fox")["input_ids"])
    assert lm.genai_greedy(out, prompt, 20) == lm.greedy(reference, prompt, 20)


def _edit(folder, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config["quantization_config"])
    (folder / "config.json").write_text(json.dumps(config))


def _retensor(folder, change) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")


def _unequal_groups(tensors) -> None:
    g_idx = tensors["model.layers.1.mlp.up_proj.g_idx"]
    g_idx[int((g_idx == 0).nonzero()[0])] = 1  # group 1 gets 33 channels, group 0 31
    tensors["model.layers.1.mlp.up_proj.g_idx"] = g_idx


def _config(**values):
    return lambda folder: _edit(folder, lambda config: config.update(values))


def _swapped_zeros(tensors) -> None:
    name = "model.layers.0.mlp.down_proj.qzeros"
    tensors[name] = tensors[name].T.contiguous()


def _quantized_inputs(config) -> None:
    config["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8}


REFUSED = {
    "3 bits": ("gptq", _config(bits=3), "quantized with bits 3: MatMulNBits is written for 4 and 8 bits"),
    "a Marlin checkpoint": ("gptq", _config(checkpoint_format="marlin"), "checkpoint_format 'marlin'"),
    "AWQ's GEMV layout": ("awq", _config(version="gemv"), "AWQ version 'gemv'"),
    "another method": ("gptq", _config(quant_method="bitsandbytes"), "quant_method 'bitsandbytes'"),
    "a missing tensor": (
        "gptq", lambda f: _retensor(f, lambda t: t.pop("model.layers.1.self_attn.k_proj.qzeros")),
        "model.layers.1.self_attn.k_proj.qzeros is missing",
    ),
    "zero points of another axis": (
        "awq", lambda f: _retensor(f, _swapped_zeros),
        r"model.layers.0.mlp.down_proj.qzeros is int32 \[8, 4\] where its layer's other tensors make it int32 \[4, 8\]",
    ),
    "act-order groups of unequal sizes": (
        "act", lambda f: _retensor(f, _unequal_groups), "model.layers.1.mlp.up_proj.g_idx: act-order groups of unequal",
    ),
    "activations quantized too": (
        "ct", lambda f: _edit(f, _quantized_inputs), "config_groups.group_0.input_activations",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("kind", "change", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_an_odd_format_is_refused_before_the_export_naming_the_tensor_or_key(tmp_path, kind, change, message):
    folder = tmp_path / kind
    {"gptq": qc.gptq, "awq": qc.awq, "ct": qc.compressed, "act": lambda f: qc.gptq(f, act_order=True)}[kind](folder)
    change(folder)
    out = tmp_path / "out"
    with pytest.raises(opreg.ExportError, match=message):
        opreg.llm.export_checkpoint(folder, out, tokenizer=False)
    assert not out.exists()


def test_a_group_that_is_not_whole_blocks_is_refused_naming_the_tensor(tmp_path):
    """Groups of 8: MatMulNBits' smallest block is 16 (a group of 48 would be three blocks of 16)."""
    qc.gptq(tmp_path / "gptq", group=8)
    with pytest.raises(opreg.ExportError, match=r"model.layers.0.mlp.down_proj.scales: groups of 8 input channels"):
        opreg.llm.export_decoder(tmp_path / "gptq", tokenizer=False)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"target": "onnx"}, opreg.InvalidArgumentError, r"\(GPTQ\) stores its weights as integers.*target 'onnx'"),
        (
            {"streaming": False},
            opreg.ExportError,
            "streaming=False would load it through transformers",
        ),
    ],
)
def test_options_that_would_dequantize_are_refused(tmp_path, options, error, message):
    qc.gptq(tmp_path / "gptq")
    with pytest.raises(error, match=message):
        opreg.llm.export_decoder(tmp_path / "gptq", tokenizer=False, **options)


def test_words_packed_along_k_are_matmulnbits_bytes_as_they_are():
    """What the reader relies on: int32 words of 4-bit values packed along K, lowest bits first
    (compressed-tensors', GPTQ's transposed), are, on a little-endian host, MatMulNBits' bytes:
    two values a byte, the even one in the low nibble."""
    q = torch.randint(0, 16, (6, 64), generator=torch.Generator().manual_seed(0))
    words = qc.pack(q, 4, 1)  # (N, K / 8), along K
    expected = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8).numpy()
    np.testing.assert_array_equal(words.view(torch.uint8).numpy(), expected)


WIDER = {
    "hidden_size": 384,
    "intermediate_size": 768,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
"""A Llama whose K (384, 768) cut into groups of 96 and whole rows gives groups of several blocks."""


@pytest.mark.parametrize(
    ("write", "blocks"),
    [
        (lambda folder: qc.gptq(folder, group=96, act_order=True, **WIDER), {32}),  # 96: three blocks of 32
        (lambda folder: qc.compressed(folder, group=None, symmetric=False, **WIDER), {128}),  # a row: 3 or 6 of 128
    ],
    ids=["GPTQ groups of 96, act-order", "compressed-tensors per channel, asymmetric"],
)
def test_a_group_of_several_blocks_repeats_its_scale_and_zero_point(tmp_path, write, blocks):
    reference = write(tmp_path / "checkpoint")
    decoder = opreg.llm.export_decoder(tmp_path / "checkpoint", accuracy_level=0, tokenizer=False)
    graph = decoder.program.model.graph
    assert {n.attributes["block_size"].as_int() for n in graph if n.op_type == "MatMulNBits"} == blocks
    decoder.verify()  # GPTQ: against the model of opreg's own reading of the tensors; so also the writer's
    if reference is not None:
        ids = torch.tensor([[3, 8, 13, 21]])
        with torch.no_grad():
            expected = reference(ids).logits
        got = torch.as_tensor(decoder.run(decoder.inputs(ids))["logits"])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
