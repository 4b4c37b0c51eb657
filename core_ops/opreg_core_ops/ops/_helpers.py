"""Helpers shared by the core impls (Python-side, run while tracing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

Tensor: TypeAlias = ir.Value
"""The annotation of an impl's tensor parameters: the exporter hands a trace-only impl each
tensor input as the ``onnx_ir.Value`` it records ops on (``Tensor | None`` for ``Tensor?``,
``Sequence[Tensor]`` for ``Tensor[]``). Registration reads it as a tensor, not an attribute."""


def expand_param(value: int | Sequence[int], rank: int) -> list[int]:
    """A conv/pool parameter as one int per spatial dim (``[2]`` -> ``[2, 2]``)."""
    if isinstance(value, int):
        return [value] * rank
    values = list(value)
    return values * rank if len(values) == 1 else values


def symmetric_pads(padding: int | Sequence[int], rank: int) -> list[int]:
    """torch's per-dim padding as ONNX ``pads`` (all begins, then all ends)."""
    pads = expand_param(padding, rank)
    return pads + pads


def rank_of(value) -> int | None:
    """The rank of a traced value, if known."""
    shape = getattr(value, "shape", None)
    return None if shape is None else len(shape)


def node_arg(node, index: int, name: str, default=None):
    """An FX node's argument by schema position or keyword (for predicates)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def node_rank(node, index: int = 0) -> int | None:
    """The rank of an FX node's tensor argument, from its fake-tensor metadata (for predicates)."""
    arg = node.args[index] if len(node.args) > index else None
    return rank_of(getattr(arg, "meta", {}).get("val"))


def where(condition, a, b):
    """``Where(condition, a, b)``; for BOOL a and b, And/Or/Not (ONNX Runtime has no BOOL Where kernel)."""
    if a.dtype == ir.DataType.BOOL and getattr(b, "dtype", None) == ir.DataType.BOOL:
        return op18.Or(op18.And(condition, a), op18.And(op18.Not(condition), b))
    return op18.Where(condition, a, b)
