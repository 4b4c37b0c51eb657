"""The tutorials' API (OnnxRegistry, ExportOptions, dynamo_export) over the one registry."""

from __future__ import annotations

import onnxscript
import pytest
import torch
from onnxscript import opset18

import opreg
from opreg.registry.targets import DEFAULT_ONNX_OPSET

msft1 = onnxscript.values.Opset("com.microsoft", 1)
msft2 = onnxscript.values.Opset("com.microsoft", 2)


@onnxscript.script(msft1)
def gelu_v1(input_x, approximate: str = "none"):
    return msft1.Gelu(input_x)


@onnxscript.script(msft2)
def sigmoid_v2(input_x):
    return msft2.Sigmoid(input_x)


def test_is_registered_op_sees_packs_and_registrations():
    registry = opreg.OnnxRegistry()
    assert registry.is_registered_op(namespace="aten", op_name="gelu", overload="default")
    assert not registry.is_registered_op(namespace="mylibrary", op_name="not_there", overload="default")
    registry.register_op(namespace="aten", op_name="gelu", overload="default", function=gelu_v1)
    assert registry.registry.resolve("aten::gelu", registry.target()).function is gelu_v1


def test_target_takes_the_domain_version_from_the_function():
    registry = opreg.OnnxRegistry()
    registry.register_op(namespace="aten", op_name="gelu", overload="default", function=gelu_v1)
    assert registry.target().as_dict() == {"": DEFAULT_ONNX_OPSET, "com.microsoft": 1}


def test_functions_needing_two_versions_of_a_domain_fail_naming_both():
    registry = opreg.OnnxRegistry()
    registry.register_op(namespace="aten", op_name="gelu", overload="default", function=gelu_v1)
    registry.register_op(namespace="aten", op_name="sigmoid", overload="default", function=sigmoid_v2)
    with pytest.raises(opreg.OpsetConflictError, match="sigmoid_v2.*gelu_v1"):
        registry.target()


def test_dynamo_export_returns_a_program_with_the_adapters():
    class Model(torch.nn.Module):
        def forward(self, x, y):
            return {"sum": x + y, "both": (x, y * 2)}

    x, y = torch.randn(2), torch.randn(2)
    program = opreg.dynamo_export(Model(), x, y)
    assert isinstance(program, opreg.OnnxProgram)
    assert [t.data_ptr() for t in program.adapt_torch_inputs_to_onnx(x, y)] == [x.data_ptr(), y.data_ptr()]
    outputs = program.adapt_torch_outputs_to_onnx(Model()(x, y))
    assert len(outputs) == len(program.output_names) == 3
    program.verify(x, y)


def test_dynamo_export_inlines_small_functions_and_keeps_larger_ones():
    custom = onnxscript.values.Opset("custom.aten", 1)

    @onnxscript.script(custom)
    def big_add(input_x, input_y, alpha: float = 1.0):
        scaled = opset18.Mul(input_y, alpha)
        total = opset18.Add(input_x, scaled)
        return opset18.Identity(opset18.Identity(total))

    registry = opreg.OnnxRegistry()
    registry.register_op(namespace="aten", op_name="add", overload="Tensor", function=big_add)

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.add(x, x)

    program = opreg.dynamo_export(Model(), torch.randn(3), export_options=opreg.ExportOptions(onnx_registry=registry))
    assert [n.op_type for n in program.model_proto.graph.node] == ["big_add"]
