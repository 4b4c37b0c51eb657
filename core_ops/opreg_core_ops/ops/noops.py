"""Ops that compute nothing in an exported graph: they only mark autograd or aliasing.

``torch.export`` leaves them in the captured graph (``x.detach()``, ``x.contiguous()``, ``detach_`` on a
tensor a cache made with ``torch.tensor``). Without an
impl, each would send the whole graph through torch's decomposition, which retraces it;
as Identity they translate as captured. Each serves real and complex (pair) values alike.
"""

from __future__ import annotations

from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor


@opreg.impl("aten::detach", complex=True)
@opreg.impl("aten::detach")
def aten_detach(self: Tensor):
    """detach(Tensor(a) self) -> Tensor(a): Identity (``detach_`` too, as its functional form)."""
    return op18.Identity(self)


@opreg.impl("aten::contiguous", complex=True)
@opreg.impl("aten::contiguous")
def aten_contiguous(self: Tensor):
    """contiguous(Tensor(a) self, *, MemoryFormat memory_format=contiguous_format) -> Tensor(a): Identity
    (ONNX values have no strides)."""
    return op18.Identity(self)
