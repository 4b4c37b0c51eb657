"""The ONNX side: test.customop::CustomOpOne then CustomOpTwo, as in the tutorial."""

from __future__ import annotations

import onnxscript
from onnxscript import opset18

custom_opset = onnxscript.values.Opset(domain="test.customop", version=1)


@onnxscript.script(custom_opset)
def custom_addandround(input_x):
    """mylibrary::addandround_op(Tensor tensor_x) -> Tensor: CustomOpOne(x, x), CustomOpTwo, Cast."""
    add_x = custom_opset.CustomOpOne(input_x, input_x)
    round_x = custom_opset.CustomOpTwo(add_x)
    return opset18.Cast(round_x, to=1)
