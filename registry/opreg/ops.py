"""What an impl's author needs besides onnxscript: the public helpers every pack may use.

The core pack is written with these and nothing private; a third-party pack
imports them the same way, inside the modules its ``opreg_register_ops`` hook
imports (this module imports onnx_ir and onnxscript, so a pack's entry-point
module should not import it at the top)::

    from opreg.ops import Tensor, node_arg, promote, rank_of

- Annotations: :data:`Tensor`, the type of an impl's tensor parameters
  (``Tensor | None`` for ``Tensor?``, ``Sequence[Tensor]`` for ``Tensor[]``);
  registration reads it as a tensor input, never an attribute.
- Values while tracing: :func:`rank_of`, :func:`opreg.values.is_complex` (re-exported).
- A node's arguments, for predicates (they run on the ``torch.fx.Node``, before
  anything is traced): :func:`node_arg`, :func:`node_value`, :func:`node_rank`.
- torch's type promotion: :func:`result_dtype`, :func:`promote`, :func:`cast_to`,
  :func:`same_type`, :func:`as_float`, :func:`is_integral` and the dtype sets
  :data:`FLOAT_TYPES`, :data:`HALF_TYPES`, :data:`DEFAULT_FLOAT`.
- torch arguments as ONNX attributes: :func:`expand_param`, :func:`symmetric_pads`;
  and :func:`where`, ``Where`` that ONNX Runtime runs on booleans too.
- Warnings about what the user asked: :func:`user_stacklevel`, the ``stacklevel`` that points a
  ``warnings.warn`` at the user's line, past opreg's and the packs' frames (re-exported).

Everything here emits ai.onnx 18 ops only, the lowest opset opreg supports, so
using a helper never raises an impl's opset requirement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

from opreg.errors import user_stacklevel
from opreg.values import is_complex

Tensor: TypeAlias = ir.Value
"""The annotation of an impl's tensor parameters: the exporter hands a trace-only impl each
tensor input as the ``onnx_ir.Value`` it records ops on (``Tensor | None`` for ``Tensor?``,
``Sequence[Tensor]`` for ``Tensor[]``). Registration reads it as a tensor, not an attribute."""

FLOAT_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE})
"""The floating types ONNX and torch share (the types that can hold NaN)."""

HALF_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
"""16-bit floats, which torch accumulates (reductions, norms) in float32."""

DEFAULT_FLOAT = ir.DataType.FLOAT
"""torch's default dtype: what integer inputs of float ops become."""


# -- values while tracing -------------------------------------------------------------------------


def rank_of(value: Any) -> int | None:
    """The rank of a traced value (or of a tensor, a fake tensor), if known."""
    shape = getattr(value, "shape", None)
    return None if shape is None else len(shape)


def where(condition: Tensor, a: Tensor, b: Any) -> Tensor:
    """``Where(condition, a, b)``; for BOOL a and b, And/Or/Not (ONNX Runtime has no BOOL Where kernel)."""
    if a.dtype == ir.DataType.BOOL and getattr(b, "dtype", None) == ir.DataType.BOOL:
        return op18.Or(op18.And(condition, a), op18.And(op18.Not(condition), b))
    return op18.Where(condition, a, b)


# -- a node's arguments, for predicates ------------------------------------------------------------


def node_arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    """An FX node's argument by schema position or keyword (``default`` if the node leaves it out)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def node_value(node: Any, index: int, name: str | None = None) -> Any:
    """The fake tensor (``meta["val"]``: shape, dtype) of an FX node's tensor argument, or ``None``
    (an argument left out, or not a tensor)."""
    arg = node_arg(node, index, name or "")
    return getattr(arg, "meta", {}).get("val") if arg is not None else None


def node_rank(node: Any, index: int = 0) -> int | None:
    """The rank of an FX node's tensor argument, from its fake-tensor metadata."""
    arg = node.args[index] if len(node.args) > index else None
    return rank_of(getattr(arg, "meta", {}).get("val"))


# -- torch arguments as ONNX attributes -----------------------------------------------------------


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


# -- torch's type promotion -------------------------------------------------------------------------


def is_integral(dtype: ir.DataType | None) -> bool:
    """Whether ``dtype`` is an integer type or bool (``None``, unknown, is not)."""
    return dtype is not None and not dtype.is_floating_point()


def result_dtype(*operands: Any) -> ir.DataType:
    """The dtype torch computes an elementwise op of ``operands`` in (its type promotion:
    dimensioned tensors, then 0-d tensors, then Python scalars). ``None`` operands are skipped;
    complex values (:func:`opreg.values.is_complex`) and numbers count as complex.

    torch's own rules (``torch._prims_common.elementwise_dtypes``), asked with meta tensors
    shaped like the operands: categories, 0-d tensors and Python scalars ranking below
    dimensioned tensors, uint8 + int8 -> int16, float16 + bfloat16 -> float32 are torch's by
    construction, not a copy of them."""
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


def cast_to(value: Any, dtype: ir.DataType) -> Tensor:
    """``value`` (a traced value or a Python number) as ``dtype``; numbers become constants."""
    if isinstance(value, ir.Value) and value.dtype == dtype:
        return value
    return op18.Cast(value, to=int(dtype))


def promote(*operands: Any) -> tuple[ir.DataType, list[Tensor | None]]:
    """``(dtype, operands cast to it)`` as torch promotes them (``None`` operands stay ``None``)."""
    dtype = result_dtype(*operands)
    return dtype, [None if v is None else cast_to(v, dtype) for v in operands]


def same_type(tensors: Sequence[Tensor]) -> list[Tensor]:
    """The tensors cast to torch's promoted dtype when their dtypes differ (cat, stack)."""
    dtypes = {t.dtype for t in tensors}
    if None in dtypes or len(dtypes) == 1:
        return list(tensors)
    _, promoted = promote(*tensors)
    return promoted  # type: ignore[return-value]


def as_float(self: Tensor) -> Tensor:
    """``self``, cast to torch's default float dtype unless it is a float already (float ops on
    integer or bool tensors compute in float32)."""
    if self.dtype in FLOAT_TYPES:
        return self
    return op18.Cast(self, to=int(DEFAULT_FLOAT))


__all__ = [
    "DEFAULT_FLOAT",
    "FLOAT_TYPES",
    "HALF_TYPES",
    "Tensor",
    "as_float",
    "cast_to",
    "expand_param",
    "is_complex",
    "is_integral",
    "node_arg",
    "node_rank",
    "node_value",
    "promote",
    "rank_of",
    "result_dtype",
    "same_type",
    "symmetric_pads",
    "user_stacklevel",
    "where",
]
