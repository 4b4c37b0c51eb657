"""What an impl returns, held against what torch computes: a result whose dtype, rank or size
contradicts the op's meta value in the FX graph is the impl's error, named with its pack and node."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch
from onnx_ir import tensor_adapters

from opreg.errors import ExportError
from opreg.exporter import _nodes
from opreg.registry.registry import Impl


def call_site(node: torch.fx.Node, impl: Impl) -> str:
    return f"impl {impl.label} for {impl.op} (node {node.name}, {_nodes.where(node)})"


def _expected(meta: torch.Tensor) -> tuple[ir.DataType, int]:
    """The dtype and rank an impl's result must have for the tensor ``meta`` (a complex tensor
    travels as real pairs: its real dtype, one more dimension)."""
    real = meta.dtype.to_real() if meta.dtype.is_complex else meta.dtype
    return tensor_adapters.from_torch_dtype(real), meta.dim() + (1 if meta.dtype.is_complex else 0)


def _describe_meta(meta: Any) -> str:
    if isinstance(meta, torch.Tensor):
        dtype, rank = _expected(meta)
        return f"{dtype.name} rank-{rank} tensor"
    return type(meta).__name__


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'AEIOUaeiou' else 'a'} {noun}"


def check_returned(value: Any, meta: Any, name: str, site: str) -> None:
    """Refuse a result that is no single value for the op output ``meta`` describes: several
    values, or none where torch computes one."""
    if isinstance(value, (list, tuple)) and any(isinstance(v, ir.Value) for v in value):
        raise ExportError(
            f"{site} returned {len(value)} values where the op has a single tensor ({name}): "
            "unpack multi-output ONNX ops (`y, _ = op.X(...)`) and return one value per op output"
        )
    if value is None and meta is not None:
        raise ExportError(
            f"{site} returned None where the op has {_a(_describe_meta(meta))} output: "
            "return the ONNX value the impl computed"
        )


def check_result(value: ir.Value, meta: Any, site: str) -> None:
    """Refuse a result whose known dtype or rank contradicts torch's meta result."""
    if not isinstance(meta, torch.Tensor):
        return
    dtype, rank = _expected(meta)
    if value.dtype is not None and value.dtype != dtype:
        raise ExportError(
            f"{site} returned {_a(value.dtype.name)} tensor where torch computes {dtype.name}: "
            f"cast the result (op.Cast(y, to={dtype.name})) or fix the impl's arithmetic"
        )
    if value.shape is None:
        return
    if len(value.shape) != rank:
        raise ExportError(
            f"{site} returned a rank-{len(value.shape)} tensor where torch computes rank {rank} "
            f"(shape {tuple(meta.shape)}): fix the impl's reshapes or reductions"
        )
    sizes = [*meta.shape, *((2,) if meta.dtype.is_complex else ())]
    for index, (got, want) in enumerate(zip(value.shape, sizes, strict=True)):
        if isinstance(got, int) and isinstance(want, int) and got != want:
            raise ExportError(
                f"{site} returned a tensor of shape {list(value.shape)} where torch computes "
                f"{[s if isinstance(s, int) else str(s) for s in sizes]} (dim {index}): fix the impl's reshapes "
                "or broadcasting"
            )


def dtype_of(meta: Any) -> ir.DataType | None:
    if isinstance(meta, torch.Tensor):
        return tensor_adapters.from_torch_dtype(meta.dtype.to_real() if meta.dtype.is_complex else meta.dtype)
    return scalar_dtype(meta)


def scalar_dtype(value: Any) -> ir.DataType | None:
    if isinstance(value, bool | torch.SymBool):
        return ir.DataType.BOOL
    if isinstance(value, int | torch.SymInt):
        return ir.DataType.INT64
    if isinstance(value, float | torch.SymFloat):
        return ir.DataType.FLOAT
    return None
