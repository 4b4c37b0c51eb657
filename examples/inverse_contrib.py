"""ONNX Runtime's custom-op guide (seeds/003): torch.inverse to com.microsoft::Inverse.

The guide registers a TorchScript symbolic for ``::inverse``; with opreg the
``opreg-ort-contrib`` pack provides it, used when the target has
com.microsoft (the ``onnxruntime`` profile). The rest is the guide's script.
"""

import io

import numpy
import onnxruntime
import torch

import opreg


class CustomInverse(torch.nn.Module):
    def forward(self, x):
        return torch.inverse(x) + x


x = torch.randn(3, 3)

# Export model to ONNX
f = io.BytesIO()
onnx_program = opreg.export(CustomInverse(), (x,), target="onnxruntime")
f.write(onnx_program.model_proto.SerializeToString())
assert [n.op_type for n in onnx_program.model_proto.graph.node if n.domain == "com.microsoft"] == ["Inverse"]

model = CustomInverse()
pt_outputs = model(x)

# Run the exported model with ONNX Runtime
ort_sess = onnxruntime.InferenceSession(f.getvalue())
ort_inputs = dict((ort_sess.get_inputs()[i].name, input.cpu().numpy()) for i, input in enumerate((x,)))
ort_outputs = ort_sess.run(None, ort_inputs)

# Validate PyTorch and ONNX Runtime results
numpy.testing.assert_allclose(pt_outputs.cpu().numpy(), ort_outputs[0], rtol=1e-03, atol=1e-05)
print("inverse: com.microsoft::Inverse, numerics as in the guide")
