"""Activations on com.microsoft kernels."""

from __future__ import annotations

from onnxscript.values import Opset

import opreg
from opreg.ops import node_value
from opreg_ort_contrib import CONTRIB_DOMAIN, CONTRIB_PRIORITY

msft = Opset("com.microsoft", 1)


def _float32(node) -> bool:
    """ONNX Runtime's CPU build has Gelu and FastGelu for float32 only; other dtypes go to the core pack."""
    import torch

    value = node_value(node, 0, "self")
    return value is not None and value.dtype == torch.float32


@opreg.impl("aten::gelu", domains={CONTRIB_DOMAIN: 1}, priority=CONTRIB_PRIORITY, predicate=_float32)
def aten_gelu_contrib(self, approximate: str = "none"):
    """gelu(Tensor self, *, str approximate='none') -> Tensor: com.microsoft::Gelu or FastGelu."""
    if approximate == "tanh":
        return msft.FastGelu(self)
    return msft.Gelu(self)
