"""Linear algebra on com.microsoft kernels."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.values import Opset

import opreg
from opreg_ort_contrib import CONTRIB_DOMAIN, CONTRIB_PRIORITY

msft = Opset("com.microsoft", 1)


@opreg.impl("aten::linalg_inv_ex", opset=18, domains={CONTRIB_DOMAIN: 1}, priority=CONTRIB_PRIORITY)
def aten_linalg_inv_ex(A, check_errors: bool = False):
    """linalg_inv_ex(Tensor A, *, bool check_errors=False) -> (Tensor inverse, Tensor info): com.microsoft::Inverse; info is zeros."""
    inverse = msft.Inverse(A)
    info = op18.ConstantOfShape(op18.Shape(A, end=-2), value=ir.tensor(np.zeros((1,), dtype=np.int32)))
    return inverse, info
