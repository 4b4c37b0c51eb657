"""Weight-only quantization to com.microsoft::MatMulNBits: float weights quantized at export
(MatMulNBitsQuantization), and weights quantized in PyTorch with torchao (TorchaoWeights)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from nbits_models import MLP
from nbits_models import dequantized as _dequantized
from nbits_models import nodes as _nodes

import opreg
from opreg_ort_contrib import MatMulNBitsQuantization, TorchaoWeights


@pytest.mark.parametrize(
    ("bits", "block_size", "symmetric"), [(4, 32, True), (4, 16, False), (8, 32, True), (8, 64, False)]
)
def test_float_weights_quantized_are_the_weights_the_model_computes_with(bits, block_size, symmetric):
    torch.manual_seed(0)
    model, ids = MLP().eval(), torch.randint(0, 50, (2, 5))
    program = opreg.export(
        model, (ids,), target="onnxruntime",
        passes=[MatMulNBitsQuantization(bits=bits, block_size=block_size, symmetric=symmetric, accuracy_level=None)],
    )  # fmt: skip
    nodes = _nodes(program, "MatMulNBits")
    assert len(nodes) == 3 and not _nodes(program, "FusedMatMul") and not _nodes(program, "MatMul")
    assert {(a.name, a.value) for a in nodes[0].attributes.values()} >= {("bits", bits), ("block_size", block_size)}
    assert all((len(n.inputs) > 3) != symmetric for n in nodes)  # zero points only when asymmetric
    assert "export:MatMulNBitsQuantization=3" in program.model.metadata_props["opreg.rewrites"]
    # the model computes with the dequantized weights: eager PyTorch with them agrees to float32 rounding
    originals = [model.up.weight, model.down.weight, model.head.weight]
    for original, weight in zip(originals, _dequantized(program).values(), strict=True):
        step = np.abs(original.detach().numpy().T).max() / (7 if bits == 4 else 127)
        assert np.abs(weight - original.detach().numpy().T).max() <= step  # within a quantization step
        with torch.no_grad():
            original.copy_(torch.from_numpy(weight.T))
    program.verify(ids, rtol=1e-4, atol=1e-4)


def test_excluded_weights_stay_float_and_so_does_a_tied_embedding_whose_head_is_excluded():
    torch.manual_seed(0)
    model, ids = MLP(tied=True).eval(), torch.randint(0, 50, (2, 5))
    program = opreg.export(
        model, (ids,), target="onnxruntime",
        passes=[MatMulNBitsQuantization(exclude=["down.*", "head.*"], accuracy_level=None)],
    )  # fmt: skip
    assert [n.inputs[1].name for n in _nodes(program, "MatMulNBits")] == ["up.weight_Q4"]
    (gather,) = _nodes(program, "Gather")  # the embedding still reads the tied weight in float
    assert gather.inputs[0].is_initializer() and gather.inputs[0].dtype == ir.DataType.FLOAT
    (up,) = _dequantized(program).values()  # what it computes: the float weights, the dequantized up projection
    expected = MLP(tied=True).eval()
    expected.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected.up.weight.copy_(torch.from_numpy(up.T))
        np.testing.assert_allclose(program.run(ids).numpy(), expected(ids).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("bits", "block_size", "symmetric"), [(4, 32, True), (4, 128, False), (8, 32, False), (8, 128, True)]
)
def test_a_tied_embedding_reads_the_quantized_weight_it_shares_with_the_head(bits, block_size, symmetric):
    """The table is stored once: its Gather becomes a GatherBlockQuantized of the rows of the head's
    MatMulNBits weight (a block of 128 pads the rows of 64 values: a Slice drops the padding). The
    table is over 8192 bytes even in 4 bits: the export's constant folding copies a smaller one
    (onnxscript's limit), which then costs nothing."""
    torch.manual_seed(0)
    model, ids = MLP(tied=True, vocab=300).eval(), torch.randint(0, 300, (2, 5))
    quantize = MatMulNBitsQuantization(bits=bits, block_size=block_size, symmetric=symmetric, accuracy_level=None)
    program = opreg.export(model, (ids,), target="onnxruntime", passes=[quantize])
    head = next(n for n in _nodes(program, "MatMulNBits") if n.inputs[1].name == f"head.weight_Q{bits}")
    (gather,) = [n for n in program.model.graph if n.op_type == "GatherBlockQuantized"]
    assert gather.domain == "com.microsoft" and not _nodes(program, "Gather")
    rows = gather.inputs[0].producer()
    assert rows.op_type == "Reshape" and rows.inputs[0] is head.inputs[1]  # the head's packed bytes
    assert list(gather.inputs[2:]) == list(head.inputs[2:4] if not symmetric else head.inputs[2:3])
    assert {(a.name, a.value) for a in gather.attributes.values()} == {
        ("bits", bits), ("block_size", block_size), ("gather_axis", 0), ("quantize_axis", 1)
    }  # fmt: skip
    assert [n.op_type for n in program.model.graph].count("Slice") == (block_size > 64)
    initializers = program.model.graph.initializers.values()
    assert not [
        v for v in initializers if v.dtype == ir.DataType.FLOAT and v.const_value.size >= 300 * 64
    ]  # no float table
    # it computes with the dequantized table, in the embedding and in the head
    table = _dequantized(program)[head.name].T
    expected = MLP(tied=True, vocab=300).eval()
    expected.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected.embed.weight.copy_(torch.from_numpy(table))
        for name, weight in _dequantized(program).items():
            if name != head.name:
                layer = expected.up if weight.shape == (64, 96) else expected.down
                layer.weight.copy_(torch.from_numpy(weight.T))
        np.testing.assert_allclose(program.run(ids).numpy(), expected(ids).numpy(), rtol=1e-4, atol=1e-4)


def test_the_defaults_are_the_fastest_measured_blocks_of_128_symmetric_int8_compute():
    model, ids = MLP().eval(), torch.randint(0, 50, (2, 5))
    program = opreg.export(model, (ids,), target="onnxruntime", passes=[MatMulNBitsQuantization()])
    for node in _nodes(program, "MatMulNBits"):
        attributes = {a.name: a.value for a in node.attributes.values()}
        assert (attributes["bits"], attributes["block_size"], attributes["accuracy_level"]) == (4, 128, 4)
        assert len(node.inputs) == 3  # symmetric: no zero points


@pytest.mark.parametrize(
    ("options", "message"),
    [({"bits": 3}, r"bits= takes 4 or 8, got int 3$"),
     ({"bits": 4.0}, r"bits= takes 4 or 8, got float 4\.0$"),
     ({"bits": True}, r"bits= takes 4 or 8, got bool True$"),
     ({"block_size": 24}, r"block_size= takes a power of two, at least 16 \(16, 32, 64, 128, 256\), got int 24$"),
     ({"block_size": 32.0}, r"block_size= takes a power of two, .*got float 32\.0$"),
     ({"symmetric": "no"}, r"symmetric= takes True or False, got str 'no'$"),
     ({"symmetric": 1}, r"symmetric= takes True or False, got int 1$"),
     ({"accuracy_level": 7}, r"accuracy_level= takes None or 0, 1, 2, 3, 4 .*got int 7$"),
     ({"accuracy_level": True}, r"accuracy_level= takes None or 0, 1, 2, 3, 4 .*got bool True$"),
     ({"exclude": "lm_head"}, r"exclude= takes a list of weight names or fnmatch patterns.*got str 'lm_head'$"),
     ({"exclude": [3]}, r"exclude= takes a list of weight names .*got list \[3\]$"),
     ({"embeddings": "yes"}, r"embeddings= takes True or False, got str 'yes'$")],
)  # fmt: skip
def test_bad_options_say_what_to_write(options, message):
    """Round 4: every option is checked when the pass is made, before any capture: an
    InvalidArgumentError naming the option and the values it takes."""
    with pytest.raises(opreg.InvalidArgumentError, match=rf"^MatMulNBitsQuantization: {message}"):
        MatMulNBitsQuantization(**options)
    with pytest.raises(opreg.InvalidArgumentError, match=r"^TorchaoWeights: accuracy_level= takes None or 0"):
        TorchaoWeights(accuracy_level="4")


class Addmm(torch.nn.Module):
    """2-D linear layers as torch.export leaves them (``addmm``), exported as Gemm: a vector bias, a
    bias of the output's shape, no bias, and two a Gemm computes with alpha or beta."""

    def __init__(self) -> None:
        super().__init__()
        self.vector, self.matrix, self.plain = (torch.nn.Parameter(torch.randn(32, 8)) for _ in range(3))
        self.scaled, self.halved = torch.nn.Parameter(torch.randn(32, 8)), torch.nn.Parameter(torch.randn(32, 8))
        self.bias, self.full = torch.nn.Parameter(torch.randn(8)), torch.nn.Parameter(torch.randn(3, 8))

    def forward(self, x):
        return (
            torch.addmm(self.bias, x, self.vector), torch.addmm(self.full, x, self.matrix), x @ self.plain,
            torch.addmm(self.bias, x, self.scaled, alpha=2.0), torch.addmm(self.bias, x, self.halved, beta=0.5),
        )  # fmt: skip


def test_a_2d_linear_exported_as_gemm_is_quantized_or_reported():
    """Round 4: a 2-D Linear is a Gemm, which the pass left float without a word. Now its weight is
    quantized (the bias MatMulNBits' own input, or an Add when it is not a vector of N), and a Gemm
    that scales (alpha, beta) is named in a warning and kept."""
    torch.manual_seed(0)
    model, x = Addmm().eval(), torch.randn(3, 32)
    with pytest.warns(UserWarning, match="MatMulNBitsQuantization: weight") as warned:
        program = opreg.export(
            model, (x,), target="onnxruntime", passes=[MatMulNBitsQuantization(bits=8, accuracy_level=None)]
        )  # computed in float: compared with the dequantized weights below
    assert [str(w.message) for w in warned if "MatMulNBits" in str(w.message)] == [
        f"MatMulNBitsQuantization: weight '{name}' stays float32: its Gemm ({shown}) is not a plain x @ W + bias, "
        "which MatMulNBits computes"
        for name, shown in (("scaled", "alpha=2.0, beta=1.0, transA=0"), ("halved", "alpha=1.0, beta=0.5, transA=0"))
    ]
    assert all(w.filename == __file__ for w in warned if "MatMulNBits" in str(w.message))  # the user's line
    nodes = _nodes(program, "MatMulNBits")
    assert [n.inputs[1].name for n in nodes] == ["vector_Q8", "matrix_Q8", "plain_Q8"]
    assert [len(n.inputs) for n in nodes] == [6, 3, 3] and nodes[0].inputs[5].name == "bias"
    assert len(_nodes(program, "Gemm")) == 2 and len(_nodes(program, "Add")) == 1
    dequantized = list(_dequantized(program).values())
    with torch.no_grad():
        for parameter, weight in zip((model.vector, model.matrix, model.plain), dequantized, strict=True):
            assert np.abs(weight - parameter.numpy()).max() <= np.abs(parameter.numpy()).max() / 127
            parameter.copy_(torch.from_numpy(weight))
    program.verify(x, rtol=1e-4, atol=1e-4)  # eager with the dequantized weights


@pytest.mark.parametrize(
    ("bits", "symmetric", "shape"), [(4, True, (100, 24)), (4, False, (64, 8)), (8, False, (70, 5))]
)
def test_the_weights_are_packed_byte_for_byte_as_onnx_runtimes_quantizer_packs_them(bits, symmetric, shape):
    """The pass calls ONNX Runtime's block-quantization kernels itself (its quantizer module's import
    reconfigures logging and sys.path); they must give what DefaultWeightOnlyQuantizer gives."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer

    weight = np.random.default_rng(0).standard_normal(shape).astype(np.float32)  # (K, N), K not a block multiple
    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=symmetric, bits=bits)
    theirs = DefaultWeightOnlyQuantizer(config).qbits_block_quant(weight)
    ours = MatMulNBitsQuantization(bits=bits, block_size=32, symmetric=symmetric)._quantizer().qbits_block_quant(weight)
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.dtype == reference.dtype and np.array_equal(mine, reference)


def test_the_pass_leaves_logging_and_sys_path_alone(tmp_path):
    """Round 4: ONNX Runtime's matmul_nbits_quantizer calls logging.basicConfig(level=INFO) when
    first imported, which switched a whole application to INFO records on stderr, and its
    onnxruntime.transformers appends a folder to sys.path. In a fresh process: the root logger
    and sys.path are the same after an export with the pass as before, and ONNX Runtime's
    quantizer module was never imported."""
    import subprocess
    import sys

    script = (
        "import logging, sys, torch, opreg\n"
        "from opreg_ort_contrib import MatMulNBitsQuantization\n"
        "before = (logging.getLogger().level, list(logging.getLogger().handlers), list(sys.path))\n"
        "model = torch.nn.Sequential(torch.nn.Linear(32, 8)).eval()\n"
        "opreg.export(model, (torch.randn(2, 4, 32),), target='onnxruntime', passes=[MatMulNBitsQuantization()])\n"
        "after = (logging.getLogger().level, list(logging.getLogger().handlers), list(sys.path))\n"
        "assert before == after, (before, after)\n"
        "assert 'onnxruntime.quantization' not in sys.modules\n"
        "logging.getLogger('anything').info('not shown')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "not shown" not in done.stderr and "[INFO]" not in done.stderr


def test_passes_run_without_the_packs_rewrites_and_need_the_target_to_have_their_domain():
    model, ids = MLP().eval(), torch.randint(0, 50, (2, 5))
    program = opreg.export(model, (ids,), target="onnxruntime", rewrite=False, passes=[MatMulNBitsQuantization()])
    assert len(_nodes(program, "MatMulNBits")) == 3
    with pytest.raises(opreg.OpsetConflictError, match="MatMulNBitsQuantization"):
        opreg.export(model, (ids,), target=18, passes=[MatMulNBitsQuantization()])


TORCHAO = [
    ("IntxWeightOnlyConfig int4 per group of 32", {"weight_dtype": "int4", "granularity": 32}, 4, 32),
    ("IntxWeightOnlyConfig int4 per channel", {"weight_dtype": "int4", "granularity": None}, 4, 64),
    ("IntxWeightOnlyConfig int8 asymmetric, groups of 16",
     {"weight_dtype": "int8", "granularity": 16, "asymmetric": True}, 8, 16),
    ("Int8WeightOnlyConfig", None, 8, 64),
]  # fmt: skip


def _torchao_config(spec):
    import torchao.quantization as q

    if spec is None:
        return q.Int8WeightOnlyConfig()
    granularity = q.PerAxis(0) if spec["granularity"] is None else q.PerGroup(spec["granularity"])
    mapping = q.MappingType.ASYMMETRIC if spec.get("asymmetric") else q.MappingType.SYMMETRIC
    return q.IntxWeightOnlyConfig(weight_dtype=getattr(torch, spec["weight_dtype"]), granularity=granularity,
                                  mapping_type=mapping)  # fmt: skip


@pytest.mark.parametrize(("name", "spec", "bits", "block_size"), TORCHAO, ids=[c[0] for c in TORCHAO])
def test_torchao_weight_only_models_export_to_matmul_nbits_on_their_own_integers(name, spec, bits, block_size):
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16, bias=False)).eval()
    quantize_(model, _torchao_config(spec))
    x = torch.randn(2, 5, 64)
    program = opreg.export(model, (x,), target="onnxruntime")  # the pack's rewrite, no option needed
    nodes = _nodes(program, "MatMulNBits")
    assert len(nodes) == 2 and not _nodes(program, "MatMul") and not _nodes(program, "Cast")
    assert nodes[0].attributes["bits"].as_int() == bits and nodes[0].attributes["block_size"].as_int() == block_size
    program.verify(x, rtol=1e-4, atol=1e-5)  # the same integers: no new rounding


def test_torchao_weights_take_an_accuracy_level_as_an_export_pass():
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32)).eval()
    quantize_(model, _torchao_config(TORCHAO[0][1]))
    x = torch.randn(2, 5, 64)
    program = opreg.export(model, (x,), target="onnxruntime", rewrite=False, passes=[TorchaoWeights(accuracy_level=4)])
    (node,) = _nodes(program, "MatMulNBits")
    assert node.attributes["accuracy_level"].as_int() == 4
    program.verify(x, rtol=0.05, atol=0.05)  # the input quantized to int8 per block


def test_the_pass_on_a_saved_model_keeps_its_output_names(tmp_path):
    """Run on a model loaded from a file (no export renames outputs after it): a quantized layer
    that makes a graph output keeps that output's name, type and shape."""
    model, ids = MLP().eval(), torch.randint(0, 50, (2, 5))
    program = opreg.export(model, (ids,), target="onnxruntime")
    program.save(tmp_path / "mlp.onnx")
    loaded = ir.load(tmp_path / "mlp.onnx")
    before = [(v.name, v.dtype, v.shape) for v in loaded.graph.outputs]
    MatMulNBitsQuantization(bits=8)(loaded)
    assert [(v.name, v.dtype, v.shape) for v in loaded.graph.outputs] == before
    assert loaded.graph.outputs[0].producer().op_type == "MatMulNBits"


class Embedding(torch.nn.Module):
    """An embedding model alone, as a vision-language model's: rows of a table no linear layer reads."""

    def __init__(self, vocab: int = 300, width: int = 80) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)

    def forward(self, ids):
        return self.embed(ids) * 2.0


@pytest.mark.parametrize(("bits", "block_size", "symmetric"), [(4, 32, True), (4, 64, False), (8, 32, True)])
def test_an_untied_embedding_table_is_quantized_only_when_asked(bits, block_size, symmetric):
    """``embeddings=True``: a table only Gathers of rows read becomes GatherBlockQuantized of its
    quantized rows (80 values a row: blocks of 64 pad them, a Slice drops the padding), which
    computes with the dequantized table; by default the table stays float."""
    torch.manual_seed(0)
    model, ids = Embedding().eval(), torch.randint(0, 300, (2, 7))
    quantize = MatMulNBitsQuantization(bits=bits, block_size=block_size, symmetric=symmetric)
    kept = opreg.export(model, (ids,), target="onnxruntime", passes=[quantize])
    assert _nodes(kept, "Gather") and not _nodes(kept, "GatherBlockQuantized")
    quantize = MatMulNBitsQuantization(bits=bits, block_size=block_size, symmetric=symmetric, embeddings=True)
    program = opreg.export(model, (ids,), target="onnxruntime", passes=[quantize])
    (gather,) = _nodes(program, "GatherBlockQuantized")
    assert gather.domain == "com.microsoft" and not _nodes(program, "Gather")
    assert len(_nodes(program, "Slice")) == (80 % block_size != 0)
    assert not [
        v
        for v in program.model.graph.initializers.values()
        if v.const_value.size >= 300 * 80 and v.dtype == ir.DataType.FLOAT
    ]
    # the rows computed with are the table's, dequantized block by block
    packed, scales = (v.const_value.numpy() for v in (gather.inputs[0].producer().inputs[0], gather.inputs[2]))
    values = packed if bits == 8 else np.stack([packed & 15, packed >> 4], -1).reshape(300, -1)
    values = values.reshape(300, -1, block_size).astype(np.float32)
    zero = np.full(values.shape[:2], 1 << (bits - 1), np.float32)
    if not symmetric:
        raw = gather.inputs[3].const_value.numpy()
        zero = (raw if bits == 8 else np.stack([raw & 15, raw >> 4], -1).reshape(300, -1))[:, : values.shape[1]]
    table = ((values - zero[..., None]) * scales.reshape(300, -1, 1)).reshape(300, -1)[:, :80]
    np.testing.assert_allclose(program.run(ids).numpy(), table[ids.numpy()] * 2.0, rtol=1e-6, atol=1e-6)
    error = np.abs(table - model.embed.weight.detach().numpy()).max()
    step = np.abs(model.embed.weight.detach().numpy()).max() / (2 ** (bits - 1) - 1)
    assert 0 < error < step  # quantized: within a step of the table, not equal to it
