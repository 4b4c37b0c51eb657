"""Dropout outside training: the identity (random masks are not exported)."""

from __future__ import annotations

from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, node_arg


def _not_training(node) -> bool:
    return node_arg(node, 2, "train") is False or node_arg(node, 1, "p") == 0


@opreg.impl("aten::dropout", predicate=_not_training)
def aten_dropout(input: Tensor, p: float, train: bool):
    """dropout(Tensor input, float p, bool train) -> Tensor: Identity (eval only)."""
    return op18.Identity(input)


@opreg.impl("aten::native_dropout", predicate=_not_training)
def aten_native_dropout(input: Tensor, p: float, train: bool | None):
    """native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor): Identity and an all-true mask (eval only)."""
    return op18.Identity(input), op18.Expand(True, op18.Shape(input))
