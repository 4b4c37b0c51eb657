"""The exporter end to end: real torch.export, real ONNX Runtime, numerics against eager PyTorch."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import onnxruntime
import onnxscript
import pytest
import torch
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.exporter import PROVENANCE_KEYS
from opreg.registry.targets import DEFAULT_ONNX_OPSET, MIN_ONNX_OPSET
from tests.models import AddModel, Nested, Sequence, TutorialCNN, Uncovered
from tests.optest import Lambda

NEWEST = opreg.newest_supported_opset()
OPSETS = [18, NEWEST]
ATOL = 1e-5  # float32, small models: differences are rounding only


def _ops(program) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in program.model_proto.graph.node]


def _check_model(program) -> None:
    onnx.checker.check_model(program.model_proto, full_check=True)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return TutorialCNN().eval(), torch.randn(1, 1, 32, 32)


@pytest.mark.parametrize("opset", OPSETS)
def test_tutorial_cnn(cnn, opset):
    model, x = cnn
    program = opreg.export(model, (x,), target=opset)

    proto = program.model_proto
    assert {o.domain: o.version for o in proto.opset_import} == {"": opset}
    assert proto.ir_version <= 13  # what onnxruntime 1.31 loads
    _check_model(program)
    ops = [op for _, op in _ops(program)]
    assert ops.count("Conv") == 2 and ops.count("MaxPool") == 2 and ops.count("Gemm") == 3
    assert all(domain == "" for domain, _ in _ops(program))
    # parameters are initializers named by the state_dict
    assert set(program.model.graph.initializers) == set(model.state_dict())
    assert program.input_names == ("x",) and program.output_names == ("output",)

    result = program.verify(x, atol=ATOL)
    assert result.runtime == "onnxruntime" and result.max_abs <= ATOL
    other = torch.randn(1, 1, 32, 32)
    torch.testing.assert_close(program.run(other), model(other), atol=ATOL, rtol=1e-4)


def test_every_node_records_where_it_came_from(cnn):
    model, x = cnn
    program = opreg.export(model, (x,), target=18)
    for node in program.model_proto.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        assert set(PROVENANCE_KEYS) <= set(props), node.name
        assert props["opreg.pack"] == "core"
        assert props["opreg.torch_op"].startswith("aten::")
    modules = {p.value for n in program.model_proto.graph.node for p in n.metadata_props if p.key == "opreg.module"}
    assert {"conv1", "conv2", "fc1", "fc2", "fc3"} <= modules
    sources = {p.value for n in program.model_proto.graph.node for p in n.metadata_props if p.key == "opreg.source"}
    assert any(s.endswith("models.py:" + s.rsplit(":", 1)[-1]) and "tests" in s for s in sources)


def test_kwargs_and_nested_outputs():
    torch.manual_seed(0)
    model = Nested().eval()
    x = torch.randn(2, 4)
    extra = {"shift": torch.randn(3), "bias": torch.randn(5)}
    program = opreg.export(model, (x,), {"extra": extra})

    assert program.input_names == ("x", "extra_shift", "extra_bias")
    assert program.output_names == ("logits", "pair.0", "pair.1")  # parts of a path joined with dots
    weights = {"proj.weight", "proj.bias", "scale"}  # state_dict names, untouched by constant folding
    initializers = program.model.graph.initializers
    assert weights <= set(initializers)
    state = model.state_dict()
    for name in weights:
        assert torch.equal(torch.from_numpy(initializers[name].const_value.numpy()), state[name])
    assert all(name.startswith("const_") for name in set(initializers) - weights)  # lifted constants
    _check_model(program)
    result = program.run(x, extra=extra)
    expected = model(x, extra=extra)
    assert set(result) == {"logits", "pair"} and isinstance(result["pair"], tuple)
    torch.testing.assert_close(result, expected, atol=ATOL, rtol=1e-4)
    assert len(program.verify(x, extra=extra)) == 3


def test_dynamic_batch_and_sequence_run_at_other_sizes():
    torch.manual_seed(0)
    model = Sequence().eval()
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    program = opreg.export(model, (torch.randn(2, 5, 8),), dynamic_shapes={"x": {0: batch, 1: seq}})

    (x_in,) = program.model.graph.inputs
    (out,) = program.model.graph.outputs
    assert [str(d) for d in x_in.shape] == ["batch", "seq", "8"]
    assert [str(d) for d in out.shape] == ["batch", "seq", "4"]
    _check_model(program)
    for b, s in [(1, 1), (3, 7), (8, 2)]:
        x = torch.randn(b, s, 8)
        assert program.verify(x, atol=ATOL).max_abs <= ATOL
        assert program.run(x).shape == (b, s, 4)


def test_uncovered_ops_are_all_listed_before_translation():
    registry = opreg.default_registry().copy()

    def inverse_elsewhere(self):
        """Pretend impl that needs a domain the default target lacks."""
        return onnxscript.values.Op(onnxscript.values.Opset("com.example", 1), "Inverse")(self)

    registry.register("aten::linalg_inv_ex", inverse_elsewhere, domains={"com.example": 1})
    with pytest.raises(opreg.UnsupportedOpsError) as caught:
        opreg.export(Uncovered(), (torch.randn(3, 3),), registry=registry)

    missing = {m.op: m for m in caught.value.missing}
    assert set(missing) == {"opreg_tests::mystery.default", "aten::linalg_inv_ex.default"}
    inverse, mystery = missing["aten::linalg_inv_ex.default"], missing["opreg_tests::mystery.default"]
    assert inverse.count == 2 and mystery.count == 1
    assert all("models.py:" in where for where in inverse.locations + mystery.locations)
    assert "<user>:inverse_elsewhere (ai.onnx>=18, com.example>=1)" in inverse.elsewhere
    assert any(e.startswith("ort_contrib:") for e in inverse.elsewhere)
    text = str(caught.value)
    assert "opreg_tests::mystery.default: 1 node" in text and "aten::linalg_inv_ex.default: 2 nodes" in text
    found = opreg.exporter.plan_export(Uncovered(), (torch.randn(3, 3),), registry=registry)
    assert sorted(m.op for m in found) == ["aten::linalg_inv_ex.default", "opreg_tests::mystery.default"]


# -- the tutorial's first scenario: a pack replaces the core impl of aten::add.Tensor ----------

CUSTOM_ADD_PACK = """
import onnxscript
from onnxscript import opset18

custom_aten = onnxscript.values.Opset(domain="custom.aten", version=1)


@onnxscript.script(custom_aten)
def custom_aten_add(input_x, input_y, alpha: float = 1.0):
    input_y = opset18.Mul(input_y, alpha)
    return opset18.Add(input_x, input_y)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::add.Tensor", custom_aten_add, priority=5)
"""


@pytest.mark.parametrize("inline", [True, False], ids=["inlined", "kept-function"])
def test_pack_replaces_core_add(make_pack, inline):
    make_pack("customadd", CUSTOM_ADD_PACK)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    program = opreg.export(AddModel(), (x, y), inline=inline)

    proto = program.model_proto
    _check_model(program)
    packs = {p.value for n in proto.graph.node for p in n.metadata_props if p.key == "opreg.pack"}
    assert packs == {"customadd"}
    if inline:
        # the Constant and its CastLike are folded, and y * 1 (alpha's default) is y
        assert [n.op_type for n in proto.graph.node] == ["Add"]
        # the profile is a ceiling: Add-14 needs no more than opreg's oldest target
        assert {o.domain: o.version for o in proto.opset_import} == {"": MIN_ONNX_OPSET}
        assert not proto.functions
    else:
        assert _ops(program) == [("custom.aten", "custom_aten_add")]
        # the function was written for opset 18: the model needs no more, and the function agrees with it
        assert {o.domain: o.version for o in proto.opset_import} == {"": MIN_ONNX_OPSET, "custom.aten": 1}
        (function,) = proto.functions
        assert {o.domain: o.version for o in function.opset_import} == {"": MIN_ONNX_OPSET}
        pinned = opreg.export(AddModel(), (x, y), inline=inline, target=DEFAULT_ONNX_OPSET).model_proto
        assert {o.domain: o.version for o in pinned.functions[0].opset_import} == {"": DEFAULT_ONNX_OPSET}
    assert program.verify(x, y).max_abs == 0.0


def test_core_add_is_used_without_the_pack():
    program = opreg.export(AddModel(), (torch.randn(2), torch.randn(2)))
    assert _ops(program) == [("", "Add")]


def test_verify_raises_on_a_wrong_impl():
    registry = opreg.default_registry().copy()

    def wrong_add(self, other, alpha: float = 1.0):
        """add.Tensor, deliberately wrong."""
        return op18.Sub(self, other)

    registry.register("aten::add.Tensor", wrong_add)
    x, y = torch.randn(3), torch.ones(3)
    program = opreg.export(AddModel(), (x, y), registry=registry)
    with pytest.raises(opreg.VerificationError, match="output: MISMATCH") as caught:
        program.verify(x, y)
    (check,) = caught.value.results
    assert check.max_abs == pytest.approx(2.0)
    assert str(caught.value).startswith(
        "1 of 1 output(s) differ from eager PyTorch (onnxruntime, rtol=1.3e-06, atol=1e-05 (float32's default))"
    )


class NanWhereEagerHasZero(torch.nn.Module):
    """issue 53: 0 * log(0) is NaN in the model when an impl computes x * log(x) for xlogy."""

    def forward(self, x):
        return torch.xlogy(x, x)


def test_a_nan_where_eager_has_a_number_is_named_with_where():
    """issue 53: NaN against eager's 0 read "24 of 24 elements out of tolerance (max abs 0)"; it says NaN,
    how many and where. A mismatch of numbers says nothing of NaN."""
    registry = opreg.default_registry().copy()

    def xlogy_naive(self, other):
        """xlogy.Tensor(Tensor self, Tensor other) -> Tensor, without xlogy's 0 * log(0) = 0."""
        return op18.Mul(self, op18.Log(other))

    registry.register("aten::xlogy.Tensor", xlogy_naive, priority=10)
    x = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0]])
    program = opreg.export(NanWhereEagerHasZero(), (x,), registry=registry)
    with pytest.raises(opreg.VerificationError) as caught:
        program.verify(x)
    (check,) = caught.value.results
    assert check.detail == (
        "3 of 6 elements out of tolerance, 3 of them NaN where eager PyTorch has a number (at (0, 0), (0, 2), (1, 1))"
    )
    program.verify(x + 1)  # no zero: the naive impl is right there

    def xlogy_shifted(self, other):
        """xlogy.Tensor(Tensor self, Tensor other) -> Tensor, off by a half."""
        return op18.Add(op18.Mul(self, op18.Log(other)), op18.CastLike(0.5, self))

    registry.register("aten::xlogy.Tensor", xlogy_shifted, priority=20)
    program = opreg.export(NanWhereEagerHasZero(), (x + 1,), registry=registry)
    with pytest.raises(opreg.VerificationError) as caught:
        program.verify(x + 1)
    (check,) = caught.value.results
    assert check.detail == "6 of 6 elements out of tolerance" and "NaN" not in str(caught.value)


class AddAndMul(torch.nn.Module):
    def forward(self, x, y):
        return x + y, x * y


def test_verify_names_the_outputs_that_differ_among_all():
    """The message counts the mismatches among every output, lists only those, and keeps every check."""
    registry = opreg.default_registry().copy()

    def wrong_add(self, other, alpha: float = 1.0):
        """add.Tensor, deliberately wrong."""
        return op18.Sub(self, other)

    registry.register("aten::add.Tensor", wrong_add)
    x, y = torch.randn(3), torch.ones(3)
    program = opreg.export(AddAndMul(), (x, y), registry=registry)
    with pytest.raises(opreg.VerificationError, match=r"^1 of 2 output\(s\) differ from eager PyTorch") as caught:
        program.verify(x, y)
    assert [c.ok for c in caught.value.results] == [False, True]
    assert "MISMATCH" in str(caught.value) and ": ok" not in str(caught.value)


# -- one version per domain ---------------------------------------------------------------------


class TwoOps(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * torch.sigmoid(x)


def _registry_with(*impls):
    registry = opreg.default_registry().copy()
    for op, function in impls:
        registry.register(op, function)
    return registry


def test_impls_needing_two_versions_of_a_domain_fail_naming_both():
    def relu_v1(self):
        """relu via my.domain v1 (the Opset is built at call time, out of the lint's sight)."""
        return onnxscript.values.Op(onnxscript.values.Opset("my.domain", 1), "Relu")(self)

    def sigmoid_v2(self):
        """sigmoid via my.domain v2."""
        return onnxscript.values.Op(onnxscript.values.Opset("my.domain", 2), "Sigmoid")(self)

    registry = _registry_with(("aten::relu", relu_v1), ("aten::sigmoid", sigmoid_v2))
    with pytest.raises(opreg.OpsetConflictError) as caught:
        opreg.export(TwoOps(), (torch.randn(3),), registry=registry)
    text = str(caught.value)
    assert "my.domain" in text and "<user>:relu_v1" in text and "<user>:sigmoid_v2" in text
    assert "Opset mismatch" not in text


def test_an_impl_emitting_a_newer_onnx_op_than_the_target_fails():
    def sigmoid_from_20(self):
        """sigmoid, but emitting an opset-20 op while declaring 18 (hidden from the registration lint)."""
        newer = getattr(onnxscript.onnx_opset, "opset" + str(20))
        return newer.Sigmoid(self)

    registry = opreg.default_registry().copy()
    registry.register("aten::sigmoid", sigmoid_from_20, opset=18)
    with pytest.raises(opreg.OpsetConflictError, match="ai.onnx opset 20, but the target is ai.onnx 18"):
        opreg.export(TwoOps(), (torch.randn(3),), registry=registry, target=18)


def test_internal_authoring_attributes_never_reach_the_model():
    def split_sum(self):
        """sigmoid, written with onnxscript's _outputs to exercise it."""
        first, second = op18["Split"](self, [1, 2], axis=0, _outputs=2)
        return op18.Sigmoid(op18.Concat(first, second, axis=0))

    registry = _registry_with(("aten::sigmoid", split_sum))
    x = torch.randn(3)
    program = opreg.export(TwoOps(), (x,), registry=registry)
    names = {a.name for n in program.model_proto.graph.node for a in n.attribute}
    assert "_outputs" not in names
    split = next(n for n in program.model_proto.graph.node if n.op_type == "Split")
    assert len(split.output) == 2
    program.verify(x)


# -- saving ---------------------------------------------------------------------------------------------


def test_save_writes_atomically_and_reloads(tmp_path, cnn):
    model, x = cnn
    program = opreg.export(model, (x,), target=18)
    path = program.save(tmp_path / "cnn.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["cnn.onnx"]  # no temp files left
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), model(x), atol=ATOL, rtol=1e-4)


def test_forced_external_data_reloads(tmp_path, cnn):
    model, x = cnn
    program = opreg.export(model, (x,))
    path = program.save(tmp_path / "cnn.onnx", external_data=True)
    (data,) = tmp_path.glob("cnn.onnx.*.data")  # a new name at each save: see tests/test_save.py
    big = [t for t in model.state_dict().values() if t.numel() * 4 >= 1024]  # onnx_ir keeps tiny ones inline
    assert data.stat().st_size >= sum(t.numel() * 4 for t in big)
    assert path.stat().st_size < 10_000  # the weights are not in the model file
    loaded = onnx.load(str(path))  # reads the .data file
    onnx.checker.check_model(str(path), full_check=True)
    session = onnxruntime.InferenceSession(loaded.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), model(x), atol=ATOL, rtol=1e-4)


def test_save_refuses_a_missing_directory(tmp_path, cnn):
    model, x = cnn
    program = opreg.export(model, (x,))
    with pytest.raises(opreg.ExportError, match="does not exist"):
        program.save(tmp_path / "nowhere" / "m.onnx")


def test_model_is_an_onnx_ir_model(cnn):
    model, x = cnn
    program = opreg.export(model, (x,))
    assert isinstance(program.model, ir.Model)
    assert program.model.opset_imports == {"": MIN_ONNX_OPSET}  # what its nodes need, not the profile's 23
    assert "opreg.target" in program.model.metadata_props
    # the producer is the installed distribution (read from its metadata, not from the package root)
    assert (program.model.producer_name, program.model.producer_version) == ("opreg", opreg.__version__)


class DictOut(torch.nn.Module):
    def forward(self, x):
        return {"sin": torch.sin(x) * 2, "mul": torch.sin(x)}


def test_output_names_win_over_intermediate_names():
    x = torch.randn(3)
    program = opreg.export(DictOut(), (x,))  # the FX graph has values named sin and mul
    assert program.output_names == ("sin", "mul")
    _check_model(program)
    program.verify(x)


class Widen(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.float32) * 2


def test_bfloat16_inputs_and_outputs_run_in_onnxruntime_and_the_reference_evaluator():
    x = torch.randn(4).bfloat16()
    program = opreg.export(Widen(), (x,))
    assert program.verify(x, runtime="reference").max_abs == 0.0
    assert program.verify(x, runtime="onnxruntime").max_abs == 0.0  # bfloat16 in, through OrtValues
    narrow = opreg.export(Lambda(lambda t: (t * 2).bfloat16()), (torch.randn(2, 3),))
    out = narrow.run(torch.ones(2, 3))
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.full((2, 3), 2.0, dtype=torch.bfloat16))


class StarArgs(torch.nn.Module):
    def forward(self, *args):
        return args[0] + 1


def test_dim_names_for_a_star_args_forward():
    seq = torch.export.Dim("seq", min=2, max=64)
    program = opreg.export(StarArgs(), (torch.randn(2, 5),), dynamic_shapes=(({1: seq},),))
    (value,) = program.model.graph.inputs
    assert [str(d) for d in value.shape] == ["2", "seq"]


def _serialized(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()


def test_the_check_sees_weights_as_inputs_and_puts_the_graph_back(cnn):
    """The checker reads no copy of the weights: while it runs they are graph inputs of their own
    dtype and shape; small tables (biases, shapes) stay initializers. Afterwards the graph is as it was."""
    from opreg.exporter import _finish

    model = opreg.export(cnn[0], (cnn[1],), target=18).model
    graph = model.graph
    before, order = _serialized(model), list(graph.initializers)
    with _finish._weights_as_inputs(graph):
        moved = [v.name for v in graph.inputs[1:]]
        assert moved == ["conv2.weight", "fc1.weight", "fc2.weight"]  # more than 1024 elements each
        assert not set(moved) & set(graph.initializers) and "fc1.bias" in graph.initializers
        assert len(_serialized(model)) < len(before) / 20
    assert _serialized(model) == before and list(graph.initializers) == order
    assert all(v.is_initializer() and not v.is_graph_input() for v in graph.initializers.values())
    assert [v.name for v in graph.inputs] == ["x"]


def test_the_check_still_finds_a_weight_of_the_wrong_shape(cnn):
    from opreg.exporter import _finish

    model = opreg.export(cnn[0], (cnn[1],), target=18).model
    weight = model.graph.initializers["fc1.weight"]
    weight.const_value = ir.tensor(torch.zeros(120, 401).numpy(), name="fc1.weight")
    weight.shape = ir.Shape([120, 401])
    with pytest.raises(opreg.ExportError, match="not valid ONNX"):
        _finish.check(model)
    assert model.graph.initializers["fc1.weight"].const_value.shape == ir.Shape([120, 401])  # put back


@pytest.mark.parametrize(
    "case",
    ["cnn", "dynamic", "control flow"],
)
def test_the_full_check_runs_only_where_onnx_has_not_confirmed_every_node(cnn, case):
    """ONNX confirms each node as it is recorded; the export's check trusts those confirmations
    (known_valid) only where the checker agrees, and a graph with a subgraph gets the checker."""
    from opreg.exporter import _finish

    if case == "cnn":
        model, args, dynamic = cnn[0], (cnn[1],), None
    elif case == "dynamic":
        model, args = Sequence().eval(), (torch.randn(2, 5, 8),)
        dynamic = {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
    else:
        model = Lambda(lambda x: torch.cond(x.sum() > 0, lambda y: y + 1, lambda y: y - 1, (x,)))
        args, dynamic = (torch.randn(3),), None
    program = opreg.export(model, args, target=18, dynamic_shapes=dynamic)
    assert _finish.known_valid(program.model) is (case != "control flow")
    onnx.checker.check_model(program.model_proto, full_check=True)


def test_an_output_typed_otherwise_than_onnx_infers_sends_the_model_to_the_checker(cnn):
    from opreg.exporter import _finish

    model = opreg.export(cnn[0], (cnn[1],), target=18).model
    relu = next(node for node in model.graph if node.op_type == "Relu")
    relu.outputs[0].shape = ir.Shape([*relu.outputs[0].shape, 1])  # one dim more than Relu computes
    assert not _finish.known_valid(model)
    with pytest.raises(opreg.ExportError, match="not valid ONNX"):
        _finish.check(model)


class _Block(torch.nn.Module):
    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + torch.nn.functional.gelu(self.out(y.transpose(1, 2).reshape(batch, seq, width))) * 0.5


def test_repeated_calls_replayed_make_the_model_running_every_impl_makes(monkeypatch):
    """The translator replays a repeated core impl call (opreg/exporter/_memo.py): the model is the very
    one running each impl again makes, node names and every layer's own provenance included."""
    from opreg.exporter import _translate

    torch.manual_seed(0)
    model, x = torch.nn.Sequential(*(_Block() for _ in range(3))).eval(), torch.randn(2, 5, 16)
    dims = ({1: torch.export.Dim("seq", max=64)},)
    replayed = opreg.export(model, (x,), target=18, dynamic_shapes=dims)
    monkeypatch.setattr(_translate, "MEMO_PACKS", frozenset())
    run = opreg.export(model, (x,), target=18, dynamic_shapes=dims)
    assert replayed.model_proto.graph == run.model_proto.graph
    modules = {p.value for n in replayed.model_proto.graph.node for p in n.metadata_props if p.key == "opreg.module"}
    assert {"0.qkv", "1.qkv", "2.qkv"} <= modules, modules
    replayed.verify(torch.randn(2, 7, 16))


def test_nodes_made_by_the_exact_rewrites_carry_opregs_provenance_only():
    """onnxscript tags each node a rule made with the rule's name; opreg's nodes say where they came
    from in its own keys, so that tag is left off (it is parsed again at every session creation)."""
    model = Lambda(lambda x: (x.reshape(2, 6).reshape(3, 4) * 1.0).transpose(0, 1).transpose(0, 1))
    program = opreg.export(model, (torch.randn(4, 3),), target=18)
    assert 0 < len(program.model_proto.graph.node) <= 2  # the rules fired: Reshape pairs and Transpose pairs fused
    for node in program.model_proto.graph.node:
        assert {p.key for p in node.metadata_props} <= set(PROVENANCE_KEYS) | {"opreg.rewrite"}, node.name
    program.verify(torch.randn(4, 3))
