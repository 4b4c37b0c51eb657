"""The registry tutorial's second scenario (seeds/001): aten::gelu to com.microsoft::Gelu.

Written as the tutorial writes it; only ``torch.onnx.`` became ``opreg.``.
"""

import onnxruntime
import onnxscript
import torch

import opreg

onnx_registry = opreg.OnnxRegistry()
print(
    f"aten::gelu.default is supported by ONNX registry: \
    {onnx_registry.is_registered_op(namespace='aten', op_name='gelu', overload='default')}"
)


class CustomGelu(torch.nn.Module):
    def forward(self, input_x):
        return torch.ops.aten.gelu(input_x)


# com.microsoft is an official ONNX Runtime namspace
custom_ort = onnxscript.values.Opset(domain="com.microsoft", version=1)


# NOTE: The function signature must match the signature of the unsupported ATen operator.
# https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/native_functions.yaml
# NOTE: All attributes must be annotated with type hints.
@onnxscript.script(custom_ort)
def custom_aten_gelu(input_x, approximate: str = "none"):
    # We know com.microsoft::Gelu is supported by ONNX Runtime
    # It's only not supported by ONNX
    return custom_ort.Gelu(input_x)


onnx_registry = opreg.OnnxRegistry()
onnx_registry.register_op(namespace="aten", op_name="gelu", overload="default", function=custom_aten_gelu)
export_options = opreg.ExportOptions(onnx_registry=onnx_registry)

aten_gelu_model = CustomGelu()
input_gelu_x = torch.randn(3, 3)

onnx_program = opreg.dynamo_export(aten_gelu_model, input_gelu_x, export_options=export_options)

# graph node domain is the custom domain we registered
assert onnx_program.model_proto.graph.node[0].domain == "com.microsoft"
# graph node name is the function name
assert onnx_program.model_proto.graph.node[0].op_type == "Gelu"

onnx_program.save("./custom_gelu_model.onnx")
ort_session = onnxruntime.InferenceSession("./custom_gelu_model.onnx", providers=["CPUExecutionProvider"])


def to_numpy(tensor):
    return tensor.detach().cpu().numpy() if tensor.requires_grad else tensor.cpu().numpy()


onnx_input = [input_gelu_x]
onnxruntime_input = {k.name: to_numpy(v) for k, v in zip(ort_session.get_inputs(), onnx_input)}
onnxruntime_outputs = ort_session.run(None, onnxruntime_input)[0]

torch_outputs = aten_gelu_model(input_gelu_x)

assert len(torch_outputs) == len(onnxruntime_outputs)
for torch_output, onnxruntime_output in zip(torch_outputs, onnxruntime_outputs):
    torch.testing.assert_close(torch_output, torch.tensor(onnxruntime_output))
print("custom_aten_gelu: graph and numerics as in the tutorial")
