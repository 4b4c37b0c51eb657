"""Low-precision models end to end: float16 and bfloat16 CNNs and transformer blocks exported,
verified at their dtype's tolerances where ONNX Runtime's CPU provider has kernels for them, and
explained (the op, the remedy) where it has none; ``keep_float32`` running a bfloat16 model there;
the four float8 types exported and run as torch's dtypes; float4 refused with what to do."""

from __future__ import annotations

import onnx_ir as ir
import pytest
import torch
from torch import nn

import opreg
from opreg.exporter import _kernels
from opreg.exporter.diagnosis.compare import DEFAULT_TOLERANCES


class CNN(nn.Module):
    """Convolutions, batch norm, ReLU, max pooling and a mean: a CNN's feature extractor."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.norm, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv1(x)))
        return nn.functional.max_pool2d(self.conv2(x), 2).mean((2, 3))


class MLPBlock(nn.Module):
    """A transformer block's feed-forward half: LayerNorm, Linear, GELU, Linear, and the residual."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def encoder_layer(width: int = 32) -> nn.Module:
    return nn.TransformerEncoderLayer(width, 2, 4 * width, dropout=0.0, batch_first=True, norm_first=True)


def _model(make, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return make().eval().to(dtype), torch.randn(*shape).to(dtype)


CNN_INPUT, BLOCK_INPUT = (4, 3, 16, 16), (2, 4, 32)


# -- float16: ONNX Runtime's CPU provider casts what it has no float16 kernel for -------------------


class LinearNormGelu(nn.Module):
    """issue 50's float16 model: a Linear, a LayerNorm, a GELU."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.linear, self.norm = nn.Linear(width, width), nn.LayerNorm(width)

    def forward(self, x):
        return nn.functional.gelu(self.norm(self.linear(x)))


@pytest.mark.parametrize(
    ("make", "shape"), [(CNN, CNN_INPUT), (LinearNormGelu, (2, 8, 64))], ids=["cnn", "linear_norm_gelu"]
)
def test_float16_models_verify_at_float16s_tolerances(make, shape):
    """torch.testing's float16 defaults (rtol 1e-3, atol 1e-5), said in the result; the CNN differs from
    eager by float16's rounding (max abs 2.4e-4 at values below 0.5), which rtol=atol=1e-4 (verify's
    former default for every dtype) calls a mismatch."""
    model, x = _model(make, torch.float16, shape)
    program = opreg.export(model, (x,))
    result = program.verify(x)
    assert [(o.rtol, o.atol, o.tolerance) for o in result] == [(1e-3, 1e-5, "float16's default")]
    assert "rtol=0.001, atol=1e-05 (float16's default)" in str(result)
    if make is CNN:
        with pytest.raises(opreg.VerificationError, match=r"rtol=0.0001, atol=0.0001 \(given\)"):
            program.verify(x, rtol=1e-4, atol=1e-4)


def test_a_float16_transformer_block_verifies_at_the_tolerance_its_rounding_needs():
    """An encoder layer in float16 rounds apart from torch's CPU kernels by about a unit in the last
    place at its output's scale (2 to 4: 2**-9), which the residual sum carries to small values:
    torch.testing's float16 default says so, and an ``atol`` of a few such units passes, reported as given."""
    model, x = _model(encoder_layer, torch.float16, BLOCK_INPUT)
    program = opreg.export(model, (x,))
    with pytest.raises(opreg.VerificationError, match=r"rtol=0.001, atol=1e-05 \(float16's default\)"):
        program.verify(x)
    result = program.verify(x, atol=4 * 2.0**-9)
    assert result[0].tolerance == "float16's default, atol given" and result.max_abs <= 2 * 2.0**-9


# -- bfloat16: no kernels for arithmetic, explained; keep_float32 runs it --------------------------


@pytest.mark.parametrize(
    ("make", "shape", "ops"),
    [(CNN, CNN_INPUT, {"Conv(22)", "Max(13)"}), (MLPBlock, BLOCK_INPUT, {"MatMul(13)", "Add(14)", "Gelu(20)"})],
    ids=["cnn", "mlp_block"],
)
def test_a_bfloat16_model_onnx_runtime_cannot_run_is_explained(make, shape, ops):
    """The nodes without a CPU kernel, from ONNX Runtime's own kernel table, and the remedy."""
    model, x = _model(make, torch.bfloat16, shape)
    program = opreg.export(model, (x,))
    found = {f"{m.op}({m.version})" for m in _kernels.missing(program.model)}
    assert ops <= found and all(m.half for m in _kernels.missing(program.model))
    with pytest.raises(opreg.RuntimeUnavailableError) as caught:
        program.run(x)
    message = str(caught.value)
    assert "on T=bfloat16" in message and "keep_float32=True (opreg export --keep-float32)" in message
    assert all(op in message for op in ops), message


@pytest.mark.parametrize(("make", "shape"), [(CNN, CNN_INPUT), (MLPBlock, BLOCK_INPUT)], ids=["cnn", "mlp_block"])
def test_keep_float32_runs_a_bfloat16_model_and_rounds_each_op_as_eager(make, shape):
    """Each torch op's result is rounded to bfloat16 once, as eager's: these models match exactly."""
    model, x = _model(make, torch.bfloat16, shape)
    program = opreg.export(model, (x,), keep_float32=True)
    assert not [m for m in _kernels.missing(program.model) if m.half]
    result = program.verify(x)
    assert result.max_abs == 0.0 and result[0].tolerance == "bfloat16's default"
    casts = [n for n in program.model.graph if n.op_type == "Cast"]
    assert casts and all(n.metadata_props.get("opreg.torch_op") for n in casts)  # each with its node's provenance


def test_keep_float32_keeps_one_torch_ops_nodes_in_float32():
    """A 3-D Linear is MatMul then Add: its MatMul's result stays float32 (eager rounds the Linear once),
    while the Linear's result is rounded; a LayerNormalization, which has a bfloat16 kernel, stays as it is."""
    model, x = _model(MLPBlock, torch.bfloat16, BLOCK_INPUT)
    graph = opreg.export(model, (x,), keep_float32=True).model.graph
    by_output = {n.outputs[0].name: n for n in graph}
    matmul = next(n for n in graph if n.op_type == "MatMul")
    add = next(use for use, _ in matmul.outputs[0].uses())
    assert matmul.outputs[0].dtype == ir.DataType.FLOAT and add.op_type == "Add"
    assert [use.op_type for use, _ in add.outputs[0].uses()] == ["Cast"]
    norm = next(n for n in graph if n.op_type == "LayerNormalization")
    assert norm.inputs[0].dtype == ir.DataType.BFLOAT16 and norm.outputs[0].name in by_output
    names = [v.name for n in graph for v in n.outputs]
    assert len(names) == len(set(names))


def test_keep_float32_leaves_a_float32_model_as_it_is():
    model, x = _model(MLPBlock, torch.float32, BLOCK_INPUT)
    plain = opreg.export(model, (x,)).model.graph
    kept = opreg.export(model, (x,), keep_float32=True).model.graph
    assert [n.op_type for n in kept] == [n.op_type for n in plain]


def test_the_kernel_table_reads_as_onnx_runtime_runs():
    """Versions: a kernel open-ended from its start serves that version only (RandomNormalLike-22 has
    none); types: Gemm takes float and double, not bfloat16; float16 nodes ONNX Runtime casts itself."""
    assert _kernels.runs("Gemm", 13, {"T": {"tensor(float)"}})
    assert not _kernels.runs("Gemm", 13, {"T": {"tensor(bfloat16)"}})
    assert _kernels.runs("RandomNormalLike", 1, {}) and not _kernels.runs("RandomNormalLike", 22, {})
    model, x = _model(MLPBlock, torch.float16, BLOCK_INPUT)
    assert _kernels.missing(opreg.export(model, (x,)).model) == []


# -- float8 and float4 ------------------------------------------------------------------------------


FLOAT8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz]


class ToFloat8(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        wide = x * 2
        return wide.to(self.dtype), wide.to(self.dtype).to(torch.float32) + 1


@pytest.mark.parametrize("runtime", ["onnxruntime", "reference"])
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_outputs_come_back_as_torchs_dtypes_converted_as_torch_converts(dtype, runtime):
    """Values past a type's largest saturate only in float8_e4m3fn, as torch's conversions do (the
    others give inf or NaN); float8 outputs are compared exactly."""
    x = torch.tensor([1.0, -3.3, 1000.0, -70000.0, 1e-9, float("nan"), float("inf")])
    program = opreg.export(ToFloat8(dtype), (x,))
    narrow, widened = program.run(x, runtime=runtime)
    expected = ToFloat8(dtype)(x)
    assert narrow.dtype == dtype
    torch.testing.assert_close(narrow.float(), expected[0].float(), equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(widened, expected[1], equal_nan=True, rtol=0, atol=0)
    result = program.verify(x, runtime=runtime)
    assert [o.tolerance for o in result] == ["exact", "float32's default"]
    assert dtype not in DEFAULT_TOLERANCES


def test_float8_inputs_go_in_as_their_bits():
    class Widen(nn.Module):
        def forward(self, x):
            return x.to(torch.float32) * 2

    x = torch.tensor([0.5, -448.0, 3.0]).to(torch.float8_e4m3fn)
    program = opreg.export(Widen(), (x,))
    torch.testing.assert_close(program.run(x), Widen()(x))


class Float4Input(nn.Module):
    def forward(self, x):
        return x.view(torch.uint8) + 1


class Float4Weight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("packed", torch.zeros(2, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))

    def forward(self, x):
        return x + self.packed.view(torch.uint8)


@pytest.mark.parametrize(
    ("model", "x", "what"),
    [
        (Float4Input(), torch.zeros(3, 4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2), "input 'x'"),
        (Float4Weight(), torch.zeros(2, 2, dtype=torch.uint8), "weight 'packed'"),
    ],
    ids=["input", "weight"],
)
def test_float4_is_refused_naming_the_value_and_what_to_do(model, x, what):
    with pytest.raises(opreg.ExportError) as caught:
        opreg.export(model, (x,))
    message = str(caught.value)
    assert message.startswith(f"{what} is torch.float4_e2m1fn_x2: ")
    assert "FLOAT4E2M1" in message and "x.view(torch.uint8)" in message


def test_float4_facts_the_refusal_rests_on():
    """What the float4 refusal says, held against the installed libraries: onnx and onnx_ir write
    FLOAT4E2M1 (..., 2n) with the first value in the low four bits, the packing the refusal states
    for float4_e2m1fn_x2 (torch computes nothing on that dtype: no cast, no arithmetic, only views);
    ONNX Runtime's CPU provider has no kernel for FLOAT4E2M1, not even Identity, where
    onnx.reference runs it; BitCast (ai.onnx 26) keeps the bit width, so it cannot stand for
    ``x.view(torch.uint8)``. When this fails, revisit :data:`opreg.exporter._plan.UNCARRIED`."""
    import ml_dtypes
    import numpy as np
    import onnx
    import onnxruntime
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    packed = torch.tensor([[0x21, 0xC7]], dtype=torch.uint8)  # (0.5, 1.0), (6.0, -2.0)
    values = np.array([[0.5, 1.0, 6.0, -2.0]], dtype=ml_dtypes.float4_e2m1fn)
    assert ir.Tensor(values).tobytes() == packed.view(torch.float4_e2m1fn_x2).view(torch.uint8).numpy().tobytes()
    proto = helper.make_tensor("t", onnx.TensorProto.FLOAT4E2M1, [2], [0.5, 1.0])
    assert list(proto.int32_data) == [0x21]
    assert "same bit-width" in onnx.defs.get_schema("BitCast").doc

    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT4E2M1, [1, 4]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", io[:1], io[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=11)
    (same,) = ReferenceEvaluator(model).run(None, {"x": values})
    assert np.asarray(same).view(np.uint8).tolist() == values.view(np.uint8).tolist()
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented, match="Identity"):
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
