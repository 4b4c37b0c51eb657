"""What the rules read of a value: a constant's numbers, a shape's dims, float32 or not; and a value a
rewrite made given its shape and type."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

FLOAT = ir.DataType.FLOAT


def const(value: ir.Value | None) -> np.ndarray | None:
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def scalar(value: ir.Value | None) -> float | None:
    array = const(value)
    return None if array is None or array.size != 1 else float(array.reshape(()))


def close_to(value: ir.Value | None, expected: float, rel: float = 1e-6) -> bool:
    found = scalar(value)
    return found is not None and math.isclose(found, expected, rel_tol=rel, abs_tol=rel)


def ints(value: ir.Value | None) -> list[int] | None:
    array = const(value)
    return None if array is None else [int(v) for v in array.reshape(-1)]


def dims_of(value: ir.Value) -> list | None:
    return None if value.shape is None else list(value.shape)


def float32(*values: ir.Value | None) -> bool:
    return all(v is not None and v.dtype == FLOAT for v in values)


def shaped(value: ir.Value, dims, like: ir.Value) -> ir.Value:
    """``value`` (made by a rewrite) given ``dims`` and ``like``'s type, so later rules and the
    lean pass's shape checks see it; returns it."""
    value.shape = None if dims is None else ir.Shape(dims)
    value.type = like.type
    return value


def size_source(context, value: ir.Value, axis: int) -> tuple[ir.Value, int]:
    """A value and axis holding ``value``'s size at ``axis``: a graph input with the same symbolic
    dim if there is one (every layer then reads the same ``Shape``, which the lean pass computes
    once), else ``value`` itself."""
    dim = value.shape[axis] if value.shape is not None else None
    if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
        for graph_input in context.graph_or_function.inputs:
            for index, other in enumerate(graph_input.shape or ()):
                if isinstance(other, ir.SymbolicDim) and other.value == dim.value:
                    return graph_input, index
    return value, axis % len(value.shape)


def size_of(op, source: tuple[ir.Value, int]) -> ir.Value:
    value, axis = source
    return op.Shape(value, start=axis, end=axis + 1)
