"""The ONNX side: test.customop::CustomOpOne then CustomOpTwo, as in the tutorial.

Each impl carries its registration on its ``def`` (``@opreg.impl``: the torch op, the
ai.onnx and custom-domain versions it needs); the pack's ``opreg_register_ops`` hook
registers every marked function of this module.
"""

from __future__ import annotations

import onnxscript
import opreg
from onnxscript import opset18

from opreg_test_customop import DOMAIN, DOMAIN_VERSION

custom_opset = onnxscript.values.Opset(domain=DOMAIN, version=DOMAIN_VERSION)


@opreg.impl("mylibrary::addandround_op", opset=18, domains={DOMAIN: DOMAIN_VERSION})
@onnxscript.script(custom_opset)
def custom_addandround(input_x):
    """mylibrary::addandround_op(Tensor tensor_x) -> Tensor: CustomOpOne(x, x), CustomOpTwo, Cast."""
    add_x = custom_opset.CustomOpOne(input_x, input_x)
    round_x = custom_opset.CustomOpTwo(add_x)
    return opset18.Cast(round_x, to=1)
