"""Quantized models: ``quantized_decomposed`` ops, fake quantization, and models quantized with
PyTorch's pt2e flow (torchao's ``prepare_pt2e``/``convert_pt2e``), exported as QuantizeLinear/
DequantizeLinear pairs and run in ONNX Runtime against eager PyTorch."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.ao.quantization.fx._decomposed

import opreg
from opreg.exporter.diagnosis import _intkernels
from tests.optest import NEWEST, OPSETS, check, onnx_ops

qd = torch.ops.quantized_decomposed
torch.manual_seed(0)
X = torch.randn(6, 4) * 3
X4 = torch.randn(2, 3, 5, 5)
SCALE = torch.tensor([0.04], dtype=torch.float64)  # what choose_qparams returns: float64 scale, int64 zero point
ZERO = torch.tensor([5])
SCALES = torch.tensor([0.02, 0.05, 0.1, 0.03])
ZEROS = torch.tensor([0, 1, -2, 3])


def case(name, fn, *inputs, newest_only=False):
    return pytest.param(fn, inputs, newest_only, id=name)


QUANTIZE = [
    case("per_tensor_uint8", lambda x: qd.quantize_per_tensor(x, 0.05, 3, 0, 255, torch.uint8), X),
    case("per_tensor_int8", lambda x: qd.quantize_per_tensor(x, 0.05, -3, -128, 127, torch.int8), X),
    case("per_tensor_reduced_range", lambda x: qd.quantize_per_tensor(x, 0.05, 3, 0, 127, torch.uint8), X),
    case("per_tensor_int4_range", lambda x: qd.quantize_per_tensor(x, 0.5, 0, -8, 7, torch.int8), X),
    case("per_tensor_uint4_range", lambda x: qd.quantize_per_tensor(x, 0.5, 7, 0, 15, torch.uint8), X),
    case("per_tensor_int16", lambda x: qd.quantize_per_tensor(x, 0.0005, 10, -(2**15), 2**15 - 1, torch.int16), X),
    case("per_tensor_int16_narrow", lambda x: qd.quantize_per_tensor(x, 0.0005, 10, -1000, 1000, torch.int16), X),
    case("per_tensor_uint16", lambda x: qd.quantize_per_tensor(x, 0.0005, 2**15, 0, 2**16 - 1, torch.uint16), X),
    case("per_tensor_int32", lambda x: qd.quantize_per_tensor(x, 0.001, 0, -(2**31), 2**31 - 1, torch.int32), X),
    case("per_tensor_float16_input", lambda x: qd.quantize_per_tensor(x, 0.05, 3, 0, 255, torch.uint8), X.half()),
    case("tensor", lambda x, s, z: qd.quantize_per_tensor.tensor(x, s, z, 0, 255, torch.uint8), X, SCALE, ZERO),
    case(
        "tensor2",
        lambda x, s, z, lo, hi: qd.quantize_per_tensor.tensor2(x, s, z, lo, hi, torch.uint8),
        X,
        SCALE,
        ZERO,
        torch.tensor(2),
        torch.tensor(100),
    ),
    case("per_channel", lambda x, s, z: qd.quantize_per_channel(x, s, z, 1, -128, 127, torch.int8), X, SCALES, ZEROS),
    case(
        "per_channel_axis0_uint8",
        lambda x, s, z: qd.quantize_per_channel(x, s, z, 0, 0, 255, torch.uint8),
        X.T,
        SCALES,
        ZEROS + 10,
    ),
    case(
        "per_channel_int16_narrow",
        lambda x, s, z: qd.quantize_per_channel(x, s, z, 1, -300, 300, torch.int16),
        X,
        SCALES,
        ZEROS,
    ),
    case(
        "per_channel_int4_range",
        lambda x, s, z: qd.quantize_per_channel(x, s, z, 1, -8, 7, torch.int8),
        X,
        SCALES * 10,
        ZEROS,
    ),
]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize(("fn", "inputs", "newest_only"), QUANTIZE)
def test_quantize(fn, inputs, newest_only, opset):
    program = check(fn, *inputs, opset=opset)
    assert "QuantizeLinear" in onnx_ops(program) or fn(*inputs).dtype in (torch.int16, torch.uint16, torch.int32)


def test_quantize_types_follow_the_target():
    """int16 and 4-bit ranges are QuantizeLinear from opset 21 (ONNX added the types there), arithmetic before."""
    int16 = lambda x: qd.quantize_per_tensor(x, 0.0005, 10, -(2**15), 2**15 - 1, torch.int16)  # noqa: E731
    int4 = lambda x: qd.quantize_per_tensor(x, 0.5, 0, -8, 7, torch.int8)  # noqa: E731
    assert "QuantizeLinear" not in onnx_ops(check(int16, X, opset=18))
    assert "QuantizeLinear" in onnx_ops(check(int16, X, opset=21))
    assert "Clip" in onnx_ops(check(int4, X, opset=18))  # int8 clamped to [-8, 7]
    proto = check(int4, X, opset=21).model_proto
    (quantize,) = [n for n in proto.graph.node if n.op_type == "QuantizeLinear"]
    zero = next(i for i in proto.graph.initializer if i.name == quantize.input[2])
    assert zero.data_type == 22  # INT4: its saturation is the clamp
    assert "Clip" not in onnx_ops(check(int4, X, opset=21))


Q = qd.quantize_per_tensor(X, 0.05, 3, 0, 255, torch.uint8)
QC = qd.quantize_per_channel(X, SCALES, ZEROS, 1, -128, 127, torch.int8)

DEQUANTIZE = [
    case("per_tensor", lambda q: qd.dequantize_per_tensor(q, 0.05, 3, 0, 255, torch.uint8), Q),
    case(
        "per_tensor_out_float16",
        lambda q: qd.dequantize_per_tensor(q, 0.05, 3, 0, 255, torch.uint8, out_dtype=torch.float16),
        Q,
    ),
    case("tensor", lambda q, s, z: qd.dequantize_per_tensor.tensor(q, s, z, 0, 255, torch.uint8), Q, SCALE, ZERO),
    case(
        "tensor2",
        lambda q, s, z: qd.dequantize_per_tensor.tensor2(q, s, z, torch.tensor(0), torch.tensor(255), torch.uint8),
        Q,
        SCALE,
        ZERO,
    ),
    case(
        "per_tensor_int16",
        lambda q: qd.dequantize_per_tensor(q, 0.001, -7, -(2**15), 2**15 - 1, torch.int16),
        torch.randint(-3000, 3000, (4, 5), dtype=torch.int16),
    ),
    case(
        "per_channel", lambda q, s, z: qd.dequantize_per_channel(q, s, z, 1, -128, 127, torch.int8), QC, SCALES, ZEROS
    ),
    case(
        "per_channel_no_zero", lambda q, s: qd.dequantize_per_channel(q, s, None, 1, -128, 127, torch.int8), QC, SCALES
    ),
]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize(("fn", "inputs", "newest_only"), DEQUANTIZE)
def test_dequantize(fn, inputs, newest_only, opset):
    program = check(fn, *inputs, opset=opset)
    assert "DequantizeLinear" in onnx_ops(program) or (opset < 21 and inputs[0].dtype == torch.int16)


def _asymmetric(x):
    scales, zeros = qd.choose_qparams_per_token_asymmetric(x, torch.int8)
    quantized = qd.quantize_per_token(x, scales, zeros, -128, 127, torch.int8)
    return (
        scales,
        zeros,
        quantized,
        qd.dequantize_per_token(quantized, scales, zeros, -128, 127, torch.int8, torch.float32),
    )


def _grouped(w):
    scales, zeros = torch.tensor([0.02, 0.05, 0.1, 0.03, 0.2, 0.01]), torch.tensor([0, 1, -2, 3, 0, 0])
    quantized = qd.quantize_per_channel_group(w, scales, zeros, -8, 7, torch.int8, 2)
    return quantized, qd.dequantize_per_channel_group(quantized, scales, zeros, -8, 7, torch.int8, 2, torch.float32)


def _fake_quantize(x):
    return (
        torch.fake_quantize_per_tensor_affine(x, 0.05, 3, 0, 255),
        torch.fake_quantize_per_tensor_affine(x, 0.05, 0, -128, 127),
        torch.fake_quantize_per_tensor_affine(x, 0.5, 0, -8, 7),
        torch.fake_quantize_per_tensor_affine(x, 0.5, 0, -7, 7),
        torch.fake_quantize_per_tensor_affine(x, 0.0005, 0, -1000, 1000),
        torch.fake_quantize_per_tensor_affine(x, 0.0005, 0, -100000, 100000),
        torch.fake_quantize_per_tensor_affine(x, torch.tensor([0.04]), torch.tensor([5], dtype=torch.int32), 0, 255),
        torch.fake_quantize_per_channel_affine(x, SCALES, ZEROS.int(), 1, -128, 127),
        torch.fake_quantize_per_channel_affine(x, SCALES * 10, ZEROS.int(), 1, -8, 7),
        qd.fake_quant_per_channel(x, SCALES, ZEROS, 1, -128, 127),
    )


OTHERS = [
    case("choose_qparams", lambda x: qd.choose_qparams.tensor(x, 0, 255, 1e-5, torch.uint8), X),
    case(
        "choose_qparams_symmetric_int8", lambda x: qd.choose_qparams_symmetric.tensor(x, -128, 127, 1e-5, torch.int8), X
    ),
    case(
        "choose_qparams_symmetric_uint8", lambda x: qd.choose_qparams_symmetric.tensor(x, 0, 255, 1e-5, torch.uint8), X
    ),
    case("per_token_asymmetric", _asymmetric, X4),
    case("per_channel_group", _grouped, torch.randn(3, 4)),
    case("fake_quantize", _fake_quantize, X),
    case(
        "fake_quantize_4d",
        lambda x: torch.fake_quantize_per_channel_affine(x, SCALES[:3], ZEROS[:3].int() + 5, 1, 0, 255),
        X4,
    ),
]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize(("fn", "inputs", "newest_only"), OTHERS)
def test_qparams_per_token_and_fake_quantize(fn, inputs, newest_only, opset):
    check(fn, *inputs, opset=opset)


def test_fake_quantize_is_a_qdq_pair():
    ops = onnx_ops(check(lambda x: torch.fake_quantize_per_tensor_affine(x, 0.05, 3, 0, 255), X, opset=18))
    assert ops == ["QuantizeLinear", "DequantizeLinear"]


@pytest.mark.parametrize("opset", OPSETS)
def test_fake_quantize_cachemask(opset):
    """The cachemask forms (what torch's decomposition makes of fake_quantize) and their masks."""
    aten = torch.ops.aten
    fn = lambda x, s, z: (  # noqa: E731
        *aten.fake_quantize_per_tensor_affine_cachemask(x, 0.05, 3, 0, 255),
        *aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(x, s, z, torch.tensor([1]), -128, 127),
        *aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(x, s, z, torch.tensor([0]), -128, 127),
        *aten.fake_quantize_per_channel_affine_cachemask(x, SCALES, ZEROS.int(), 1, -128, 127),
    )
    check(fn, X, torch.tensor([0.03]), torch.tensor([2], dtype=torch.int32), opset=opset)


def test_choose_qparams_per_token_is_typed_as_the_graph_says():
    """torch's meta kernel types it float64/int64, its eager kernel float32/float32 (same values):
    the exported graph follows torch.export's types."""
    fn = lambda x: qd.choose_qparams_per_token(x, torch.int8)  # noqa: E731
    program = opreg.export(check_module(fn), (X,), target=18)
    scales, zeros = program.run(X)
    expected_scales, expected_zeros = fn(X)
    assert (scales.dtype, zeros.dtype) == (torch.float64, torch.int64)
    torch.testing.assert_close(scales.float(), expected_scales)
    torch.testing.assert_close(zeros.float(), expected_zeros)


def check_module(fn):
    from tests.optest import Lambda

    return Lambda(fn).eval()


# -- models quantized with pt2e ------------------------------------------------------------------


def _pt2e():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    return prepare_pt2e, convert_pt2e, x86


def quantize_pt2e(
    model: torch.nn.Module,
    example: torch.Tensor,
    batch: torch.export.Dim,
    calibration: int = 8,
    reduce_range: bool = False,
):
    """prepare (observers), calibrate on random batches, convert: the model as pt2e leaves it
    (``reduce_range``: 7-bit activations)."""
    prepare_pt2e, convert_pt2e, x86 = _pt2e()
    captured = torch.export.export(model.eval(), (example,), dynamic_shapes={"x": {0: batch}}, strict=False)
    config = x86.get_default_x86_inductor_quantization_config(reduce_range=reduce_range)
    quantizer = x86.X86InductorQuantizer().set_global(config)
    prepared = prepare_pt2e(captured.module(), quantizer)
    generator = torch.Generator().manual_seed(1)
    for _ in range(calibration):
        prepared(torch.randn(example.shape, generator=generator))
    return convert_pt2e(prepared)


class QuantCNN(torch.nn.Module):
    """Conv-BN-ReLU, pooling, a residual add, global pooling and a classifier."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.conv2(x)) + x
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class QuantMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


SATURATES = _intkernels.integer_products_saturate()
"""Whether ONNX Runtime's u8s8 kernels saturate on this CPU (AVX2 or AVX-512 without VNNI)."""


def _step(model: torch.nn.Module) -> float:
    """The largest activation quantization step (scale) in a converted model."""
    scales = [
        float(n.args[1])
        for n in model.graph.nodes
        if n.target == qd.quantize_per_tensor.default and isinstance(n.args[1], float)
    ]
    assert scales, "no activation quantization in the model"
    return max(scales)


def _unfused(program: opreg.OnnxProgram, x: torch.Tensor) -> torch.Tensor:
    """The model's output in ONNX Runtime with its graph optimizations off: no integer kernel, each
    DequantizeLinear and float op as the graph says (the reference evaluator has no DequantizeLinear
    for opset 18)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (got,) = session.run(None, {program.input_names[0]: x.numpy()})
    return torch.from_numpy(got)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize(("make", "shape"), [(QuantMLP, (3, 16)), (QuantCNN, (2, 3, 16, 16))], ids=["linear", "cnn"])
def test_pt2e_quantized_model(make, shape, opset):
    """A pt2e-quantized model exports to a QDQ model (weights int8 per channel, activations uint8
    per tensor) that matches eager within one quantization step, at any batch, in ONNX Runtime. On a
    CPU whose ONNX Runtime int8 kernels saturate (x86 without VNNI, docs/quantization.md) that holds
    with ONNX Runtime's fusions off, and where the fused model differs, verify says why
    (``test_on_an_avx2_cpu_*`` runs ONNX Runtime on such a CPU from any machine)."""
    torch.manual_seed(0)
    batch = torch.export.Dim("batch")
    example = torch.randn(shape)
    converted = quantize_pt2e(make(), example, batch)
    program = opreg.export(converted, (example,), target=opset, dynamic_shapes={"x": {0: batch}})
    ops = collections.Counter(n.op_type for n in program.model_proto.graph.node)
    quantized = collections.Counter(n.target for n in converted.graph.nodes if n.op == "call_function")
    assert ops["QuantizeLinear"] == quantized[qd.quantize_per_tensor.default] > 0, ops
    dequantize = quantized[qd.dequantize_per_tensor.default] + quantized[qd.dequantize_per_channel.default]
    assert ops["DequantizeLinear"] == dequantize, ops
    layers = sum(isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) for m in make().modules())
    weights = [i for i in program.model_proto.graph.initializer if i.data_type == 3 and len(i.dims) > 1]  # INT8
    assert len(weights) == layers == quantized[qd.dequantize_per_channel.default]
    step = _step(converted)
    for x in (example, torch.randn(5, *shape[1:])):
        if not SATURATES:
            assert program.verify(x, rtol=0, atol=step).max_abs <= step
            continue
        assert (_unfused(program, x) - converted(x)).abs().max() <= step  # the graph itself is right
        try:  # ONNX Runtime may be many steps away here; if it is, verify says why and what to do
            program.verify(x, rtol=0, atol=step, runtime="onnxruntime")
        except opreg.VerificationError as e:
            assert "no VNNI" in str(e) and "reduce_range=True" in str(e), e


def test_7_bit_activations_match_in_onnxruntime_on_every_cpu():
    """With activations in 0..127 (X86InductorQuantizer's ``reduce_range=True``) no pair of uint8 x
    int8 products leaves int16: ONNX Runtime's int8 kernels are exact on every CPU, VNNI or not."""
    torch.manual_seed(0)
    batch, example = torch.export.Dim("batch"), torch.randn(3, 16)
    converted = quantize_pt2e(QuantMLP(), example, batch, reduce_range=True)
    program = opreg.export(converted, (example,), target=18, dynamic_shapes={"x": {0: batch}})
    step = _step(converted)
    for x in (example, torch.randn(5, 16) * 3):
        assert program.verify(x, rtol=0, atol=step, runtime="onnxruntime").max_abs <= step


def test_the_saturation_hint_names_the_cause_only_for_int8_weights():
    torch.manual_seed(0)
    example = torch.randn(3, 16)
    quantized = opreg.export(quantize_pt2e(QuantMLP(), example, torch.export.Dim("batch")), (example,), target=18)
    hint = _intkernels.saturation_hint(quantized.model, saturates=True)
    assert "AVX2 or AVX-512 but no VNNI" in hint and "reduce_range=True" in hint and "docs/quantization.md" in hint
    assert _intkernels.saturation_hint(quantized.model, saturates=False) == ""
    plain = opreg.export(QuantMLP().eval(), (example,), target=18)
    assert _intkernels.saturation_hint(plain.model, saturates=True) == ""


_ON_THE_CPU = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnxruntime
    from opreg import _intkernels

    folder = sys.argv[1]
    found = {"saturates": _intkernels.integer_products_saturate()}
    for name in ("full", "seven_bit"):
        session = onnxruntime.InferenceSession(f"{folder}/{name}.onnx", providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {"x": np.load(f"{folder}/x.npy")})
        found[name] = float(np.abs(got - np.load(f"{folder}/{name}.npy")).max())
    print(json.dumps(found))
    """
)


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="emulates an x86-64 CPU")
def test_on_an_avx2_cpu_int8_kernels_saturate_and_7_bit_activations_do_not(tmp_path):
    """ONNX Runtime run on an emulated AVX2-only CPU (qemu-user's Haswell: no VNNI, no AVX-512): the
    documented saturation is there (8-bit activations: many steps away) and 7-bit activations are
    exact. The models are made natively; only ONNX Runtime runs emulated (a few seconds)."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        if os.environ.get("OPREG_REQUIRE_QEMU"):
            pytest.fail("qemu-x86_64 is missing: install the Debian package qemu-user")
        pytest.skip("qemu-x86_64 (Debian package qemu-user) is not installed")
    import numpy as np

    torch.manual_seed(0)
    batch, example = torch.export.Dim("batch"), torch.randn(3, 16)
    steps = {}
    for name, reduce_range in (("full", False), ("seven_bit", True)):
        converted = quantize_pt2e(QuantMLP(), example, batch, reduce_range=reduce_range)
        program = opreg.export(converted, (example,), target=NEWEST, dynamic_shapes={"x": {0: batch}})
        program.save(tmp_path / f"{name}.onnx")
        np.save(tmp_path / f"{name}.npy", converted(example).detach().numpy())
        steps[name] = _step(converted)
        assert (_unfused(program, example) - converted(example)).abs().max() <= steps[name]
    np.save(tmp_path / "x.npy", example.numpy())
    script = tmp_path / "on_the_cpu.py"
    script.write_text(_ON_THE_CPU)
    done = subprocess.run(
        [qemu, "-cpu", "Haswell", sys.executable, str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["saturates"] is True  # the probe sees it on the CPU that has it
    assert found["full"] > 3 * steps["full"], found  # what docs/quantization.md says: many steps away
    assert found["seven_bit"] <= steps["seven_bit"], found
