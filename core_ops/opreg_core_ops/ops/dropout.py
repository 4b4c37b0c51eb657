"""Dropout outside training: the identity (random masks are not exported)."""

from __future__ import annotations

from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg_core_ops.ops._helpers import Tensor, node_arg


def aten_dropout(input: Tensor, p: float, train: bool):
    """dropout(Tensor input, float p, bool train) -> Tensor: Identity (eval only)."""
    return op18.Identity(input)


def aten_native_dropout(input: Tensor, p: float, train: bool | None):
    """native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor): Identity and an all-true mask (eval only)."""
    return op18.Identity(input), op18.Expand(True, op18.Shape(input))


def _not_training(node) -> bool:
    return node_arg(node, 2, "train") is False or node_arg(node, 1, "p") == 0


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::dropout", aten_dropout, predicate=_not_training)
    registry.register("aten::native_dropout", aten_native_dropout, predicate=_not_training)
