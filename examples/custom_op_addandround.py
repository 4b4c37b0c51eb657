"""The registry tutorial's third scenario (seeds/001): a custom torch op to test.customop.

Written as the tutorial writes it; only ``torch.onnx.`` became ``opreg.``.
The tutorial then links onnxruntime's test custom-op library, which is not
shipped; instead the model is verified with the reference kernels of the
``opreg-test-customop`` pack, and run in ONNX Runtime with the pack's
function definitions embedded.
"""

import onnxscript
import torch
from onnxscript import opset18

# NOTE: This is a beta feature in PyTorch, and is subject to change.
from torch._custom_op import impl as custom_op

import opreg


@custom_op.custom_op("mylibrary::addandround_op")
def addandround_op(tensor_x: torch.Tensor) -> torch.Tensor: ...


@addandround_op.impl_abstract()
def addandround_op_impl_abstract(tensor_x):
    return torch.empty_like(tensor_x)


@addandround_op.impl("cpu")
def addandround_op_impl(tensor_x):
    return torch.round(tensor_x + tensor_x)  # add x to itself, and round the result


torch._dynamo.allow_in_graph(addandround_op)


class CustomFoo(torch.nn.Module):
    def forward(self, tensor_x):
        return addandround_op(tensor_x)


input_addandround_x = torch.randn(3)
custom_addandround_model = CustomFoo()

custom_opset = onnxscript.values.Opset(domain="test.customop", version=1)


# NOTE: The function signature must match the signature of the unsupported ATen operator.
# https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/native_functions.yaml
# NOTE: All attributes must be annotated with type hints.
@onnxscript.script(custom_opset)
def custom_addandround(input_x):
    # The same as opset18.Add(x, x)
    add_x = custom_opset.CustomOpOne(input_x, input_x)
    # The same as opset18.Round(x, x)
    round_x = custom_opset.CustomOpTwo(add_x)
    # Cast to FLOAT to match the ONNX type
    return opset18.Cast(round_x, to=1)


onnx_registry = opreg.OnnxRegistry()
onnx_registry.register_op(
    namespace="mylibrary", op_name="addandround_op", overload="default", function=custom_addandround
)

export_options = opreg.ExportOptions(onnx_registry=onnx_registry)
onnx_program = opreg.dynamo_export(custom_addandround_model, input_addandround_x, export_options=export_options)
onnx_program.save("./custom_addandround_model.onnx")

assert onnx_program.model_proto.graph.node[0].domain == "test.customop"
assert onnx_program.model_proto.graph.node[0].op_type == "CustomOpOne"
assert onnx_program.model_proto.graph.node[1].domain == "test.customop"
assert onnx_program.model_proto.graph.node[1].op_type == "CustomOpTwo"

# Numerics without the native library: the pack's reference kernels ...
result = onnx_program.verify(input_addandround_x, atol=0, rtol=0)
assert result.runtime == "reference"
# ... and ONNX Runtime with the pack's ONNX definitions of the two ops embedded.
embedded = opreg.export(
    custom_addandround_model,
    (input_addandround_x,),
    target=onnx_registry.target(),
    registry=onnx_registry.registry,
    embed_functions=True,
)
assert embedded.verify(input_addandround_x, atol=0, rtol=0).runtime == "onnxruntime"
print("custom_addandround: graph and numerics as in the tutorial")
