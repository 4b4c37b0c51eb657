"""ai.onnx 16 and 17 (issue 50): impls written against opset 18 are used where every op they emit
keeps its schema there; the reductions whose axes became an input are spelled in their older
schema; anything else is refused naming the op and the version it needs."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.registry import reach
from tests import real_models


class Block(torch.nn.Module):
    """Linear, LayerNorm (LayerNormalization-17), a mean over the last dim (ReduceMean-18)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.norm = torch.nn.Linear(6, 6), torch.nn.LayerNorm(6)

    def forward(self, x):
        h = self.norm(torch.relu(self.linear(x)))
        return h - h.mean(-1, keepdim=True), h.amax(-1)


def _checked(program) -> onnx.ModelProto:
    proto = program.model_proto
    onnx.checker.check_model(proto, full_check=True)  # every node valid in the schema its opset reads
    return proto


def _reduce_mean(proto: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in proto.graph.node if n.op_type == "ReduceMean"]
    return node


@pytest.mark.parametrize("version", [17, 18])
def test_a_block_exports_at_17_and_18_and_matches_eager(version):
    x = torch.randn(3, 6)
    program = opreg.export(Block().eval(), (x,), target=version, dynamic_shapes={"x": {0: "batch"}})
    proto = _checked(program)
    assert {o.domain: o.version for o in proto.opset_import} == {"": version}
    assert "LayerNormalization" in {n.op_type for n in proto.graph.node}
    node = _reduce_mean(proto)
    if version == 17:  # axes as an attribute, as ReduceMean-13 takes them
        assert len(node.input) == 1 and [a.ints for a in node.attribute if a.name == "axes"] == [[-1]]
    else:  # ReduceMean-18: axes as an input
        assert len(node.input) == 2 and not [a for a in node.attribute if a.name == "axes"]
    program.verify(torch.randn(5, 6), rtol=1e-5, atol=1e-5)


def test_opset_version_17_is_target_17():
    program = opreg.export(Block().eval(), (torch.randn(2, 6),), opset_version=17)
    assert program.model.opset_imports[""] == 17


def test_at_16_a_layer_norm_is_its_decomposition_and_matches_eager():
    """ai.onnx 16 has no LayerNormalization (17's): the layer norm is ReduceMean-13 (axes an
    attribute), Sub, Pow, Sqrt, Div, Mul and Add there, and LayerNormalization from 17 on."""
    x = torch.randn(3, 6)
    program = opreg.export(Block().eval(), (x,), target=16, dynamic_shapes={"x": {0: "batch"}})
    proto = _checked(program)
    assert {o.domain: o.version for o in proto.opset_import} == {"": 16}
    ops = {n.op_type for n in proto.graph.node}
    assert "LayerNormalization" not in ops and {"ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Mul", "Add"} <= ops
    assert {"norm.weight", "norm.bias"} <= {i.name for i in proto.graph.initializer}  # the weights keep their names
    assert all(len(n.input) == 1 for n in proto.graph.node if n.op_type == "ReduceMean")  # axes: an attribute
    registry = opreg.default_registry()
    assert registry.resolve("aten::layer_norm", 16).name == "aten_layer_norm_16"
    assert registry.resolve("aten::layer_norm", 17).name == registry.resolve("aten::layer_norm", 18).name
    program.verify(torch.randn(5, 6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_at_16_native_layer_norm_gives_its_statistics_as_eager(dtype):
    class Native(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.bias = torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(4, 6))

        def forward(self, x):
            return torch.native_layer_norm(x, [4, 6], self.weight, self.bias, 1e-5)

    model, x = Native().to(dtype), torch.randn(2, 3, 4, 6).to(dtype)
    program = opreg.export(model, (x,), target=16)
    assert "LayerNormalization" not in {n.op_type for n in _checked(program).graph.node}
    program.verify(torch.randn(2, 3, 4, 6).to(dtype))  # output, mean and 1/std; float16 at its tolerances


def test_an_op_that_did_not_exist_before_18_is_refused_and_its_older_spelling_is_not():
    """bitwise_and on ints is BitwiseAnd-18 (no older schema): refused at 17; on bools it is And-7."""

    class And(torch.nn.Module):
        def forward(self, a, b):
            return a & b

    ints = (torch.tensor([3, 5]), torch.tensor([1, 4]))
    with pytest.raises(opreg.OpsetConflictError, match=r"BitwiseAnd needs ai.onnx 18 .*core:aten_bitwise_and"):
        opreg.export(And(), ints, target=17)
    assert opreg.export(And(), ints, target=18).run(*ints).tolist() == [1, 4]
    bools = (torch.tensor([True, False]), torch.tensor([True, True]))
    program = opreg.export(And(), bools, target=17)
    assert [n.op_type for n in program.model.graph] == ["And"]
    assert program.run(*bools).tolist() == [True, False]


def test_an_impl_reaches_below_its_opset_only_where_its_ops_keep_their_schema():
    def relu_18(self):
        return op18.Relu(self)  # Relu-14 at 18: the same schema at 16 and 17

    def pooled_18(self):
        return op18.LpPool(self, kernel_shape=[1])  # LpPool-18 added ceil_mode to LpPool-11

    registry = opreg.default_registry().copy()
    same = registry.register("aten::relu", relu_18, opset=18)
    changed = registry.register("aten::relu", pooled_18, opset=18, priority=1)
    assert reach.reach(same) == reach.Reach(14, ("Relu-14",))
    assert reach.reach(changed) == reach.Reach(18, ("LpPool-18",))
    assert registry.unmet(same, 17) is None
    assert registry.unmet(changed, 17) == "needs ai.onnx>=18 (its LpPool-18), target has 17"
    assert registry.unmet(changed, 18) is None
    assert registry.resolve("aten::relu", 17) is same and registry.resolve("aten::relu", 18) is changed


def test_targets_below_16_are_refused():
    with pytest.raises(opreg.InvalidTargetError, match="use a version from 16 to"):
        opreg.export(Block().eval(), (torch.randn(2, 6),), target=15)


@pytest.mark.parametrize(("name", "version"), [("bert", 17), ("llama", 17), ("bert", 16)])
def test_zoo_transformers_export_below_18_and_match_eager(name, version):
    case = getattr(real_models, name)()
    program = opreg.export(
        case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes, opset_version=version
    )
    proto = _checked(program)
    assert {o.domain: o.version for o in proto.opset_import}[""] == version
    args, kwargs = case.other_inputs
    program.verify(*args, atol=1e-4, **kwargs)
