"""Real architectures end to end: CNNs written in tests/real_models.py and tiny random-init
transformers (BERT, DistilBERT, GPT-2, ViT, Llama), exported with dynamic batch (and
sequence) dims at the lowest and newest opsets, run in ONNX Runtime against eager PyTorch
at the example shape and at another one, and checked for the graph they should make."""

from __future__ import annotations

import collections

import onnx
import pytest
import torch

import opreg
from tests.real_models import FACTORIES, Case

NEWEST = opreg.newest_supported_opset()
OPSETS = [18, NEWEST]
ATOL = 1e-4  # float32, every model: differences are rounding only (observed <= 1e-6)


@pytest.fixture(scope="module", params=list(FACTORIES))
def case(request) -> Case:
    return FACTORIES[request.param]()


def _dims(value: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def _attention(ops: collections.Counter, opset: int) -> int:
    """Attention blocks in the graph: ONNX Attention from opset 23, else the Softmax of each."""
    if opset >= 23:
        assert ops["Softmax"] == 0
        return ops["Attention"]
    assert ops["Attention"] == 0
    return ops["Softmax"]


def _check_graph(name: str, proto: onnx.ModelProto, opset: int) -> None:
    """What each architecture must look like in ONNX, beyond matching numerically."""
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    if name == "tutorial_cnn":
        assert (ops["Conv"], ops["MaxPool"], ops["Gemm"]) == (2, 2, 3)
    elif name == "resnet18":
        # stem + 8 blocks x 2 convs + 3 downsample projections, each batch norm folded into its conv
        assert (ops["Conv"], ops["BatchNormalization"]) == (20, 0)
        assert (ops["MaxPool"], ops["GlobalAveragePool"], ops["Add"], ops["Gemm"]) == (1, 1, 8, 1)
    elif name == "mobilenet":
        groups = [a.i for n in proto.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "group"]
        depthwise = sorted(g for g in groups if g > 1)
        assert depthwise == [16, 48, 64, 96, 160, 160]  # groups == channels, one per inverted residual
        assert (ops["HardSigmoid"], ops["HardSwish"], ops["Clip"]) == (4, 9, 5)  # SE, hardswish, ReLU6
        assert ops["Dropout"] == 0
    elif name in ("bert", "distilbert", "vit"):
        assert _attention(ops, opset) == 2
        assert ops["LayerNormalization"] == 5
        assert ops["Gelu" if opset >= 20 else "Erf"] == 2
    elif name == "gpt2":
        assert _attention(ops, opset) == 2
        assert ops["LayerNormalization"] == 5 and ops["Tanh"] == 2  # gelu_new is the tanh approximation
    elif name == "llama":
        assert _attention(ops, opset) == 2
        assert ops["LayerNormalization"] == 0 and ops["ReduceMean"] == 5  # RMSNorm as written
        assert ops["Sin"] == ops["Cos"] == 1  # rotary tables computed once, shared by both layers
    elif name == "greedy_decoder":
        (loop,) = [n for n in proto.graph.node if n.op_type == "Loop"]
        body = onnx.helper.get_attribute_value(loop.attribute[0])
        body_ops = collections.Counter(n.op_type for n in body.node)
        assert body_ops["If"] == 1 and body_ops["ArgMax"] == 1 and body_ops["ScatterND"] == 1, body_ops
    elif name == "early_exit":
        (branch,) = [n for n in proto.graph.node if n.op_type == "If"]
        then_ops, else_ops = (
            collections.Counter(n.op_type for n in onnx.helper.get_attribute_value(a).node) for a in branch.attribute
        )
        assert sum(then_ops.values()) == 1 and else_ops["Gemm"] == 2, (then_ops, else_ops)
    else:
        raise AssertionError(f"no graph expectations for {name}")


@pytest.mark.parametrize("opset", OPSETS)
def test_real_model(case, opset):
    program = opreg.export(case.model, case.args, case.kwargs, target=opset, dynamic_shapes=case.dynamic_shapes)
    proto = program.model_proto

    # standard ONNX only, at exactly the target's version: no custom domain, no functions
    assert {o.domain: o.version for o in proto.opset_import} == {"": opset}
    assert {n.domain for n in proto.graph.node} == {""}
    assert not proto.functions
    _check_graph(case.name, proto, opset)
    # the export ran ONNX's full checker only where it had not confirmed every node; it agrees
    onnx.checker.check_model(proto, full_check=True)

    # the dynamic dims are named dims of the inputs and outputs, not the example's sizes
    for value in proto.graph.input:
        expected = {index: dim.__name__ for index, dim in case.dynamic_shapes[value.name].items()}
        assert {i: d for i, d in enumerate(_dims(value)) if isinstance(d, str)} == expected, value.name
    for value in proto.graph.output:
        assert not _dims(value) or _dims(value)[0] == "batch", value.name  # a scalar output (a step count) has none

    assert program.verify(*case.args, rtol=0, atol=ATOL, **case.kwargs).max_abs <= ATOL
    # and at other sizes of every dynamic dim (verify compares output shapes too)
    args, kwargs = case.other_inputs
    names = program.input_names
    example = dict(zip(names, program.adapt_torch_inputs_to_onnx(*case.args, **case.kwargs), strict=True))
    other = dict(zip(names, program.adapt_torch_inputs_to_onnx(*args, **kwargs), strict=True))
    for name, dims in case.dynamic_shapes.items():
        assert all(other[name].shape[i] != example[name].shape[i] for i in dims), name
    assert program.verify(*args, rtol=0, atol=ATOL, **kwargs).max_abs <= ATOL


def test_linear_weights_on_3d_inputs_are_stored_transposed_under_their_names():
    """MatMul(x, Transpose(W)) becomes MatMul(x, W') with W' named as W (nothing else reads W), the
    metadata saying how; fold_weights=False keeps the Transpose and the state_dict's layout. At the
    onnxruntime target too (the fold runs before the pack's FusedMatMul rule: MatMul on the stored
    (in, out) weight); there fold_weights=False leaves FusedMatMul(transB=1) on the weight as it is."""
    import json

    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(2, 5, 8)
    program = opreg.export(model, (x,), target=18)
    assert "Transpose" not in [n.op_type for n in program.model.graph]
    folded = json.loads(program.model.metadata_props["opreg.folded_weights"])
    assert folded == {"0.weight": "transpose(0.weight, perm=[1, 0])", "2.weight": "transpose(2.weight, perm=[1, 0])"}
    stored = program.model.graph.initializers["0.weight"].const_value.numpy()
    assert torch.equal(torch.from_numpy(stored), model.state_dict()["0.weight"].T)
    assert program.verify(x, rtol=0, atol=ATOL).max_abs <= ATOL

    kept = opreg.export(model, (x,), target=18, fold_weights=False)
    assert [n.op_type for n in kept.model.graph].count("Transpose") == 2
    assert "opreg.folded_weights" not in kept.model.metadata_props
    at_ort = opreg.export(model, (x,), target="onnxruntime")
    assert [n.op_type for n in at_ort.model.graph if n.op_type.endswith("MatMul")] == ["MatMul", "MatMul"]
    assert json.loads(at_ort.model.metadata_props["opreg.folded_weights"]) == folded
    assert at_ort.verify(x, rtol=0, atol=ATOL).max_abs <= ATOL
    fused = opreg.export(model, (x,), target="onnxruntime", fold_weights=False)
    assert [n.op_type for n in fused.model.graph].count("FusedMatMul") == 2
    assert "opreg.folded_weights" not in fused.model.metadata_props


class PostNorm(torch.nn.Module):
    """BERT's residual: LayerNorm(dense(x) + x), after a LayerNorm of a biased Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.dense, self.norm = torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)
        self.first = torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.norm(self.dense(x) + x), self.first(self.dense(x))


@pytest.mark.parametrize("target", [None, "onnxruntime"], ids=["default", "onnxruntime"])
def test_a_residual_sum_before_a_layer_norm_stays_two_kernels_in_onnx_runtime(target, tmp_path):
    """The residual Add read by a LayerNormalization is written as Sum, at every target: ONNX Runtime
    fuses Add + LayerNormalization into SkipLayerNormalization at load, slower on its CPU build. A
    bias Add (the Linear's) stays Add, for ONNX Runtime to fold into its MatMul."""
    import onnxruntime as ort

    model, x = PostNorm().eval(), torch.randn(2, 5, 32)
    program = opreg.export(model, (x,), **({"target": target} if target else {}))
    ops = [n.op_type for n in program.model.graph]
    assert ops.count("Sum") == 1 and ops.count("LayerNormalization") == 2
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    loaded = [n.op_type for n in onnx.load(tmp_path / "loaded.onnx").graph.node]
    assert "SkipLayerNormalization" not in loaded and loaded.count("LayerNormalization") == 2
    assert program.verify(x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("out_features", "folded"), [(2048, True), (2049, False)], ids=["16MiB", "16MiB+8KiB"])
def test_weights_over_16_mib_keep_their_transpose(out_features, folded):
    """A weight stored transposed is a second copy of it while the model is saved: one of 16 MiB
    (2048 x 2048 float32) is still stored transposed, one 8 KiB larger keeps its Transpose, which
    ONNX Runtime folds when it loads the model (README, "Exporting"; BENCHMARKS.md, big model)."""
    import torch

    from opreg.exporter.passes import lean

    model = torch.nn.Linear(2048, out_features, bias=False).eval()
    assert model.weight.numel() * 4 - lean.TRANSPOSE_FOLD_MAX_BYTES == (0 if folded else 2048 * 4)
    x = torch.randn(1, 2, 2048)
    program = opreg.export(model, (x,), target=18)
    assert [n.op_type for n in program.model.graph] == (["MatMul"] if folded else ["Transpose", "MatMul"])
    assert ("opreg.folded_weights" in program.model.metadata_props) is folded
    assert program.verify(x, rtol=1e-4, atol=1e-4).max_abs <= 1e-4


def test_batch_norm_is_folded_into_the_convolution_keeping_the_weights_names():
    """The folded weight keeps the state_dict name of the weight it replaces (no node reads the
    original any more); the metadata says how each folded tensor was computed; fold_weights=False
    keeps every initializer as the state_dict has it."""
    import json

    import torch

    case = FACTORIES["resnet18"]()
    program = opreg.export(case.model, case.args, target=18)
    folded = json.loads(program.model.metadata_props["opreg.folded_weights"])
    assert folded["conv1.weight"] == "conv1.weight * bn1.weight / sqrt(bn1.running_var + eps)"
    assert folded["conv1.weight_bias"] == "(0 - bn1.running_mean) * bn1.weight / sqrt(bn1.running_var + eps) + bn1.bias"
    assert len(folded) == 40  # 20 convolutions: a weight and a new bias each
    names = set(program.model.graph.initializers)
    assert "conv1.weight" in names and "bn1.running_mean" not in names
    assert program.verify(*case.args, rtol=0, atol=ATOL).max_abs <= ATOL

    kept = opreg.export(case.model, case.args, target=18, fold_weights=False)
    assert "opreg.folded_weights" not in kept.model.metadata_props
    state = case.model.state_dict()
    for name, value in kept.model.graph.initializers.items():
        if name in state:
            assert torch.equal(torch.from_numpy(value.const_value.numpy()), state[name]), name
    assert sum(n.op_type == "BatchNormalization" for n in kept.model.graph) == 20
