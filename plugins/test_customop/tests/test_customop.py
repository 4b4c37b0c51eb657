"""opreg-test-customop: the tutorial's custom op, exported, checked and run three ways."""

from __future__ import annotations

import onnx
import onnxscript
import opreg
import pytest
import torch
from opreg.registry.targets import MIN_ONNX_OPSET

from opreg_test_customop import addandround_op


class CustomFoo(torch.nn.Module):
    def forward(self, tensor_x):
        return addandround_op(tensor_x)


@pytest.fixture
def x():
    # includes exact halves, where round-half-to-even matters
    return torch.tensor([0.25, 0.75, -1.25, 1.3, -0.4, 2.6])


def test_torch_op_is_kept_whole_by_torch_export(x):
    program = torch.export.export(CustomFoo(), (x,), strict=False)
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets == ["mylibrary.addandround_op.default"]
    torch.testing.assert_close(CustomFoo()(x), torch.round(x + x))


def test_graph_is_the_tutorials(x):
    program = opreg.export(CustomFoo(), (x,), target="test_customop")
    nodes = program.model_proto.graph.node
    # the tutorial's own assertions
    assert nodes[0].domain == "test.customop"
    assert nodes[0].op_type == "CustomOpOne"
    assert nodes[1].domain == "test.customop"
    assert nodes[1].op_type == "CustomOpTwo"
    assert [n.op_type for n in nodes] == ["CustomOpOne", "CustomOpTwo", "Cast"]
    assert list(nodes[0].input) == ["tensor_x", "tensor_x"]
    assert {o.domain: o.version for o in program.model_proto.opset_import} == {
        "": MIN_ONNX_OPSET,  # the profile is a ceiling: Cast-13 needs no more than opreg's oldest target
        "test.customop": 1,
    }
    onnx.checker.check_model(program.model_proto, full_check=True)


def test_schemas_carry_types_through_the_custom_ops(x):
    proto = opreg.export(CustomFoo(), (x,), target="test_customop").model_proto
    del proto.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in inferred.graph.value_info}
    one, two = inferred.graph.node[0].output[0], inferred.graph.node[1].output[0]
    assert types[one].elem_type == onnx.TensorProto.FLOAT and types[two].elem_type == onnx.TensorProto.INT32
    assert [d.dim_value for d in types[two].shape.dim] == [6]


def test_verify_uses_the_reference_kernels_when_onnxruntime_cannot(x):
    program = opreg.export(CustomFoo(), (x,), target="test_customop")
    result = program.verify(x, atol=0, rtol=0)
    assert result.runtime == "reference"
    with pytest.raises(opreg.RuntimeUnavailableError, match=r"test\.customop::CustomOpOne"):
        program.run(x)  # plain onnxruntime: no kernel library for test.customop


def test_embedded_functions_run_in_onnxruntime(x):
    program = opreg.export(CustomFoo(), (x,), target="test_customop", embed_functions=True)
    proto = program.model_proto
    assert [(f.domain, f.name) for f in proto.functions] == [
        ("test.customop", "CustomOpOne"),
        ("test.customop", "CustomOpTwo"),
    ]
    assert all({o.domain: o.version for o in f.opset_import} == {"": MIN_ONNX_OPSET} for f in proto.functions)
    assert [n.op_type for n in proto.graph.node] == ["CustomOpOne", "CustomOpTwo", "Cast"]
    onnx.checker.check_model(proto, full_check=True)
    result = program.verify(x, atol=0, rtol=0)
    assert result.runtime == "onnxruntime"
    torch.testing.assert_close(program.run(x), torch.round(x + x))


def test_a_target_without_the_domain_gets_it(x):
    program = opreg.export(CustomFoo(), (x,), target="onnx")
    assert program.target.get("test.customop") == 1 and program.target.spec == "onnx,test.customop=1"
    (joined,) = program.joined_domains
    assert str(joined) == "test.customop=1 (pack test_customop: mylibrary::addandround_op.default)"


def test_custom_ops_no_pack_can_run_fail_naming_them():
    registry = opreg.Registry()

    def relu_elsewhere(self):
        """relu on a kernel nobody ships."""
        return onnxscript.values.Op(onnxscript.values.Opset("my.kernels", 1), "FastRelu")(self)

    registry.register("aten::relu", relu_elsewhere, domains={"my.kernels": 1})
    model = torch.nn.ReLU()
    x = torch.randn(3)
    program = opreg.export(model, (x,), target="onnx,my.kernels=1", registry=registry)
    with pytest.raises(opreg.RuntimeUnavailableError, match=r"my\.kernels::FastRelu"):
        program.verify(x)


def test_conformance_kit(opreg_pack_check):
    opreg_pack_check("test_customop").assert_ok()
