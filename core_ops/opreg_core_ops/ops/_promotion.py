"""torch's type promotion, for the impls of every family (Python-side, run while tracing).

One implementation: torch's own (``torch._prims_common.elementwise_dtypes``), asked
with meta tensors shaped like the operands, so the rules (categories, 0-d tensors
and Python scalars ranking below dimensioned tensors, uint8 + int8 -> int16,
float16 + bfloat16 -> float32) are torch's by construction, not a copy of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

from opreg.values import is_complex

FLOAT_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE})
"""The floating types ONNX and torch share (the types that can hold NaN)."""

HALF_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
"""16-bit floats, which torch accumulates (reductions, norms) in float32."""

DEFAULT_FLOAT = ir.DataType.FLOAT
"""torch's default dtype: what integer inputs of float ops become."""


def is_integral(dtype: ir.DataType | None) -> bool:
    """Whether ``dtype`` is an integer type or bool (``None``, unknown, is not)."""
    return dtype is not None and not dtype.is_floating_point()


def result_dtype(*operands) -> ir.DataType:
    """The dtype torch computes an elementwise op of ``operands`` in (its type promotion:
    dimensioned tensors, then 0-d tensors, then Python scalars). ``None`` operands are skipped;
    complex values (:func:`opreg.values.is_complex`) and numbers count as complex."""
    import torch
    from onnx_ir import tensor_adapters
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    examples = []
    for value in operands:
        if value is None:
            continue
        if isinstance(value, ir.Value):
            pair = is_complex(value)  # a complex tensor travels as a real one with a trailing 2
            rank = 1 if value.shape is None or len(value.shape) > int(pair) else 0
            dtype = tensor_adapters.to_torch_dtype(value.dtype)
            examples.append(torch.empty((1,) * rank, dtype=dtype.to_complex() if pair else dtype, device="meta"))
        else:
            examples.append(value)
    _, dtype = elementwise_dtypes(*examples, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return tensor_adapters.from_torch_dtype(dtype)


def cast_to(value, dtype: ir.DataType):
    """``value`` (a traced value or a Python number) as ``dtype``; numbers become constants."""
    if isinstance(value, ir.Value) and value.dtype == dtype:
        return value
    return op18.Cast(value, to=int(dtype))


def promote(*operands):
    """``(dtype, operands cast to it)`` as torch promotes them (``None`` operands stay ``None``)."""
    dtype = result_dtype(*operands)
    return dtype, [None if v is None else cast_to(v, dtype) for v in operands]


def same_type(tensors: Sequence[ir.Value]) -> list[ir.Value]:
    """The tensors cast to torch's promoted dtype when their dtypes differ (cat, stack)."""
    dtypes = {t.dtype for t in tensors}
    if None in dtypes or len(dtypes) == 1:
        return list(tensors)
    _, promoted = promote(*tensors)
    return promoted


def as_float(self):
    """``self``, cast to torch's default float dtype unless it is a float already (float ops on
    integer or bool tensors compute in float32)."""
    if self.dtype in FLOAT_TYPES:
        return self
    return op18.Cast(self, to=int(DEFAULT_FLOAT))
