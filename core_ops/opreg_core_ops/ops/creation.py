"""Creation and copies: arange, full/zeros/ones(_like), empty, scalar_tensor, fill, _to_copy/to, clone, alias, copy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset19 as op19

import opreg
from opreg.ops import DEFAULT_FLOAT, Tensor, is_integral, node_value


def _scalar_type(value) -> ir.DataType:
    """The dtype torch infers for a Python scalar (or a symbolic one)."""
    if isinstance(value, ir.Value):
        return value.dtype
    if isinstance(value, bool):
        return ir.DataType.BOOL
    if isinstance(value, int):
        return ir.DataType.INT64
    return DEFAULT_FLOAT


def _constant(value, dtype: int):
    """A 0-d tensor of ``dtype`` holding ``value`` (a Python number or a scalar value)."""
    if isinstance(value, ir.Value):
        return op18.Cast(_as_scalar(value), to=dtype)
    return op18.Cast(value, to=dtype)


def _as_scalar(value):
    """A symbolic scalar as a 0-d value."""
    if value.shape is not None and len(value.shape) == 0:
        return value
    return op18.Reshape(value, [])


def _int64_scalar(value):
    """A symbolic integer as a 0-d INT64 value."""
    value = _as_scalar(value)
    return value if value.dtype == ir.DataType.INT64 else op18.Cast(value, to=ir.DataType.INT64)


def _full(size, fill_value, dtype: int):
    return op18.Expand(_constant(fill_value, dtype), size)


@opreg.impl("aten::full")
def aten_full(size: Sequence[int], fill_value: float, dtype: int | None = None):
    """full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Expand of a constant."""
    return _full(size, fill_value, _scalar_type(fill_value) if dtype is None else dtype)


@opreg.impl("aten::zeros")
@opreg.impl("aten::empty.memory_format")
def aten_zeros(size: Sequence[int], dtype: int | None = None):
    """zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Expand of a 0.

    empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: zeros (ONNX has no uninitialized memory)."""
    return _full(size, 0, DEFAULT_FLOAT if dtype is None else dtype)


@opreg.impl("aten::ones")
def aten_ones(size: Sequence[int], dtype: int | None = None):
    """ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Expand of a 1."""
    return _full(size, 1, DEFAULT_FLOAT if dtype is None else dtype)


@opreg.impl("aten::empty_strided")
def aten_empty_strided(size: Sequence[int], stride: Sequence[int], dtype: int | None = None):
    """empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Expand of a 0 (zeros; strides ignored)."""
    return _full(size, 0, DEFAULT_FLOAT if dtype is None else dtype)


@opreg.impl("aten::full_like")
def aten_full_like(self: Tensor, fill_value: float, dtype: int | None = None):
    """full_like(Tensor self, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: Expand of a constant to Shape(self)."""
    return _full(op18.Shape(self), fill_value, self.dtype if dtype is None else dtype)


@opreg.impl("aten::zeros_like")
@opreg.impl("aten::empty_like")
def aten_zeros_like(self: Tensor, dtype: int | None = None):
    """zeros_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: Expand of a 0 to Shape(self).

    empty_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: zeros_like."""
    return _full(op18.Shape(self), 0, self.dtype if dtype is None else dtype)


@opreg.impl("aten::ones_like")
def aten_ones_like(self: Tensor, dtype: int | None = None):
    """ones_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: Expand of a 1 to Shape(self)."""
    return _full(op18.Shape(self), 1, self.dtype if dtype is None else dtype)


@opreg.impl("aten::new_full")
def aten_new_full(self: Tensor, size: Sequence[int], fill_value: float, dtype: int | None = None):
    """new_full(Tensor self, SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Expand of a constant."""
    return _full(size, fill_value, self.dtype if dtype is None else dtype)


@opreg.impl("aten::new_zeros")
@opreg.impl("aten::new_empty")
def aten_new_zeros(self: Tensor, size: Sequence[int], dtype: int | None = None):
    """new_zeros(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Expand of a 0.

    new_empty(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: new_zeros."""
    return _full(size, 0, self.dtype if dtype is None else dtype)


@opreg.impl("aten::new_ones")
def aten_new_ones(self: Tensor, size: Sequence[int], dtype: int | None = None):
    """new_ones(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Expand of a 1."""
    return _full(size, 1, self.dtype if dtype is None else dtype)


@opreg.impl("aten::new_empty_strided")
def aten_new_empty_strided(self: Tensor, size: Sequence[int], stride: Sequence[int], dtype: int | None = None):
    """new_empty_strided(Tensor self, SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Expand of a 0 (zeros; ONNX tensors have no strides)."""
    return _full(size, 0, self.dtype if dtype is None else dtype)


@opreg.impl("aten::scalar_tensor")
def aten_scalar_tensor(s: float, dtype: int | None = None):
    """scalar_tensor(Scalar s, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: a 0-d constant (FLOAT unless dtype)."""
    return _constant(s, DEFAULT_FLOAT if dtype is None else dtype)


@opreg.impl("aten::fill.Scalar")
def aten_fill_scalar(self: Tensor, value: float):
    """fill.Scalar(Tensor self, Scalar value) -> Tensor: Expand of a constant to Shape(self)."""
    return _full(op18.Shape(self), value, self.dtype)


@opreg.impl("aten::fill.Tensor")
def aten_fill_tensor(self: Tensor, value: Tensor):
    """fill.Tensor(Tensor self, Tensor value) -> Tensor: Expand of CastLike(value, self) to Shape(self)."""
    return op18.Expand(op18.CastLike(value, self), op18.Shape(self))


def _arange(start, end, step, dtype: int | None):
    numbers = (start, end, step)
    if dtype is None:
        if any(isinstance(v, float) or (isinstance(v, ir.Value) and not is_integral(v.dtype)) for v in numbers):
            dtype = DEFAULT_FLOAT
        else:
            dtype = ir.DataType.INT64
    dtype = ir.DataType(dtype)
    if not dtype.is_floating_point():
        if all(isinstance(v, int) or (isinstance(v, ir.Value) and is_integral(v.dtype)) for v in numbers):
            values = [_int64_scalar(v) if isinstance(v, ir.Value) else v for v in numbers]
            if all(isinstance(v, int) for v in values):
                values = [op18.Cast(v, to=ir.DataType.INT64) for v in values]
            result = op18.Range(*values)
        elif dtype == ir.DataType.INT64:
            # torch truncates start, end and step to int64 first, then counts
            values = [_int64_scalar(v) if isinstance(v, ir.Value) else int(v) for v in numbers]
            values = [op18.Cast(v, to=ir.DataType.INT64) if isinstance(v, int) else v for v in values]
            result = op18.Range(*values)
        else:
            # other integer types: the count from the given values, the elements from int(start) + i * int(step)
            values = [_as_scalar(v) if isinstance(v, ir.Value) else float(v) for v in numbers]
            values = [op18.Cast(v, to=ir.DataType.DOUBLE) for v in values]
            count = op18.Cast(op18.Ceil(op18.Div(op18.Sub(values[1], values[0]), values[2])), to=ir.DataType.INT64)
            index = op18.Range(op18.CastLike(0, count), count, op18.CastLike(1, count))
            start_i, step_i = (op18.Cast(v, to=ir.DataType.INT64) for v in (values[0], values[2]))
            result = op18.Add(start_i, op18.Mul(index, step_i))
        return result if result.dtype == dtype else op18.Cast(result, to=dtype)
    # Floating: start + i * step computed in DOUBLE, as torch does, then cast.
    if all(isinstance(v, (int, float)) for v in numbers):
        count = max(0, math.ceil((end - start) / step))
        index = op18.Cast(op18.Range(0, count, 1), to=ir.DataType.DOUBLE)
        start_d = op18.Cast(float(start), to=ir.DataType.DOUBLE)
        step_d = op18.Cast(float(step), to=ir.DataType.DOUBLE)
    else:
        start_d, end_d, step_d = (
            op18.Cast(_as_scalar(v) if isinstance(v, ir.Value) else float(v), to=ir.DataType.DOUBLE) for v in numbers
        )
        count = op18.Ceil(op18.Div(op18.Sub(end_d, start_d), step_d))
        index = op18.Range(op18.CastLike(0.0, start_d), count, op18.CastLike(1.0, start_d))
    return op18.Cast(op18.Add(start_d, op18.Mul(index, step_d)), to=dtype)


@opreg.impl("aten::arange.start_step")
def aten_arange_start_step(start: float, end: float, step: float = 1, dtype: int | None = None):
    """arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Range (floats as start + i * step in DOUBLE)."""
    return _arange(start, end, step, dtype)


@opreg.impl("aten::arange.start")
def aten_arange_start(start: float, end: float, dtype: int | None = None):
    """arange.start(Scalar start, Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Range."""
    return _arange(start, end, 1, dtype)


@opreg.impl("aten::arange.default")
def aten_arange(end: float, dtype: int | None = None):
    """arange(Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: Range."""
    return _arange(0, end, 1, dtype)


@opreg.impl("aten::_to_copy", opset=18)
@opreg.impl("aten::_to_copy", opset=19)
def aten_to_copy(
    self: Tensor,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    non_blocking: bool = False,
    *,
    opset: int,
):
    """_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor: Cast (Identity when the dtype stays)."""
    return _cast(self, dtype, opset)


_UNSATURATED = frozenset({ir.DataType.FLOAT8E4M3FNUZ, ir.DataType.FLOAT8E5M2, ir.DataType.FLOAT8E5M2FNUZ})
"""float8 types torch converts to without saturating: a value past the largest becomes inf (e5m2) or NaN
(the fnuz types), as Cast-19 with ``saturate=0`` makes it; Cast's default saturates, as torch's
float8_e4m3fn does. Before ai.onnx 19 Cast has no float8 type at all."""


def _cast(self, dtype: int | None, opset: int):
    if dtype is None or ir.DataType(dtype) == self.dtype:
        return op18.Identity(self)
    if opset >= 19 and ir.DataType(dtype) in _UNSATURATED:
        return op19.Cast(self, to=dtype, saturate=0)
    return op18.Cast(self, to=dtype)


@opreg.impl("aten::type_as", opset=18)
@opreg.impl("aten::type_as", opset=19)
def aten_type_as(self: Tensor, other: Tensor, *, opset: int):
    """type_as(Tensor self, Tensor other) -> Tensor: Cast to other's dtype (Identity when it is self's)."""
    return _cast(self, other.dtype, opset)


@opreg.impl("aten::to.dtype", opset=18)
@opreg.impl("aten::to.dtype", opset=19)
def aten_to_dtype(self: Tensor, dtype: int, non_blocking: bool = False, copy: bool = False, *, opset: int):
    """to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a): Cast (Identity when the dtype stays)."""
    return _cast(self, dtype, opset)


@opreg.impl("aten::to.device", opset=18)
@opreg.impl("aten::to.device", opset=19)
def aten_to_device(
    self: Tensor, device: str | None, dtype: int, non_blocking: bool = False, copy: bool = False, *, opset: int
):
    """to.device(Tensor(a) self, Device device, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a): Cast (Identity when the dtype stays)."""
    return _cast(self, dtype, opset)


@opreg.impl("aten::to.dtype_layout", opset=18)
@opreg.impl("aten::to.dtype_layout", opset=19)
def aten_to_dtype_layout(
    self: Tensor,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    non_blocking: bool = False,
    copy: bool = False,
    *,
    opset: int,
):
    """to.dtype_layout(Tensor(a) self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a): Cast (Identity when the dtype stays)."""
    return _cast(self, dtype, opset)


@opreg.impl("aten::to.other", opset=18)
@opreg.impl("aten::to.other", opset=19)
def aten_to_other(self: Tensor, other: Tensor, non_blocking: bool = False, copy: bool = False, *, opset: int):
    """to.other(Tensor(a) self, Tensor other, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a): Cast to other's dtype (Identity when it stays)."""
    return _cast(self, other.dtype, opset)


@opreg.impl("aten::clone")
def aten_clone(self: Tensor):
    """clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor: Identity."""
    return op18.Identity(self)


@opreg.impl("aten::alias")
def aten_alias(self: Tensor):
    """alias(Tensor(a) self) -> Tensor(a): Identity."""
    return op18.Identity(self)


@opreg.impl("aten::lift_fresh_copy")
def aten_lift_fresh_copy(self: Tensor):
    """lift_fresh_copy(Tensor self) -> Tensor: Identity."""
    return op18.Identity(self)


def _complex_source(node: Any) -> bool:
    """The copied value is complex too (a real one into a complex tensor needs a zero imaginary part)."""
    src = node_value(node, 1, "src")
    return src is not None and src.is_complex()


@opreg.impl("aten::copy")
@opreg.impl(
    "aten::copy", complex=True, predicate=_complex_source
)  # pairs expand alike (an in-place op on a complex input copies back)
def aten_copy(self: Tensor, src: Tensor, non_blocking: bool = False):
    """copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor: CastLike(src, self) expanded to Shape(self)."""
    return op18.Expand(op18.CastLike(src, self), op18.Shape(self))


@opreg.impl("aten::_local_scalar_dense")
@opreg.impl("aten::item")
def aten_local_scalar_dense(self: Tensor):
    """_local_scalar_dense(Tensor self) -> Scalar: Reshape to 0-d and Cast to INT64, FLOAT or BOOL (the scalar's type).

    item(Tensor self) -> Scalar: the same (a 0-d or one-element tensor)."""
    if self.dtype == ir.DataType.BOOL:
        to = ir.DataType.BOOL
    elif self.dtype.is_floating_point():
        to = ir.DataType.FLOAT
    else:
        to = ir.DataType.INT64
    scalar = op18.Reshape(self, [])
    return scalar if self.dtype == to else op18.Cast(scalar, to=to)
