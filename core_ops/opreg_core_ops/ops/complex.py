"""Complex numbers: view_as_real/view_as_complex, complex/polar, the elementwise ops on complex
values (add, sub, mul, div, abs, angle, conj, exp; angle of real tensors too), and the copies
and views that move them around (clone, _to_copy, view/reshape, permute/transpose,
(un)squeeze, select/slice, index_select, expand, flip, constant_pad_nd, reflection_pad1d, cat/stack, sym_size/sym_numel).

A complex tensor travels as a real one with a trailing dimension of 2, real then imaginary
(docs/design.md, "An export"; :mod:`opreg.values`): view_as_real and view_as_complex are the identity, the
arithmetic is written out on the two parts, and a view is the real impl's view of the pair
with the dims made non-negative (so they never reach the trailing 2) and sizes given a
trailing 2. These impls are registered with ``complex=True``: the registry hands them
exactly the nodes with complex values, and the real impls of the same ops never see one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import DEFAULT_FLOAT, FLOAT_TYPES, Tensor, as_float, cast_to, rank_of, result_dtype
from opreg.values import is_complex
from opreg_core_ops.ops import indexing, joining
from opreg_core_ops.ops import padding as padding_ops
from opreg_core_ops.ops import shape as views
from opreg_core_ops.ops.elementwise import aten_atan2

_PART_OF = {
    ir.DataType.COMPLEX64: ir.DataType.FLOAT,
    ir.DataType.COMPLEX128: ir.DataType.DOUBLE,
}
"""The type of a complex dtype's parts (complex32's parts, float16, come as FLOAT16 pairs)."""


def _part_type(*operands) -> ir.DataType:
    """The type of the result's parts, by torch's promotion of ``operands`` (complex ones count as complex)."""
    dtype = result_dtype(*operands)
    if dtype in _PART_OF:
        return _PART_OF[dtype]
    if any(isinstance(v, ir.Value) and is_complex(v) and v.dtype == ir.DataType.FLOAT16 for v in operands):
        return ir.DataType.FLOAT16  # complex32: torch's promotion above saw complex32 as complex64
    return dtype if dtype in FLOAT_TYPES else DEFAULT_FLOAT


def parts(value, dtype: ir.DataType):
    """``(real, imaginary)`` of ``value`` as ``dtype`` tensors: the halves of a complex pair, a
    real tensor and 0, a Python number's parts (as torch promotes a real operand to complex)."""
    if not isinstance(value, ir.Value):
        number = complex(value)
        return _constant(number.real, dtype), _constant(number.imag, dtype)
    if not is_complex(value):
        return cast_to(value, dtype), _constant(0.0, dtype)
    real = op18.Gather(value, op18.Constant(value_int=0), axis=-1)
    imaginary = op18.Gather(value, op18.Constant(value_int=1), axis=-1)
    return cast_to(real, dtype), cast_to(imaginary, dtype)


def _constant(number: float, dtype: ir.DataType):
    return op18.Constant(value=ir.tensor(number, dtype=dtype))


def pair(real, imaginary):
    """The complex value with these parts: the two stacked on a new last axis."""
    last = op18.Constant(value_ints=[-1])
    return op18.Concat(op18.Unsqueeze(real, last), op18.Unsqueeze(imaginary, last), axis=-1)


def _multiply(a_re, a_im, b_re, b_im):
    """(a_re + i a_im)(b_re + i b_im), parts in, parts out."""
    real = op18.Sub(op18.Mul(a_re, b_re), op18.Mul(a_im, b_im))
    imaginary = op18.Add(op18.Mul(a_re, b_im), op18.Mul(a_im, b_re))
    return real, imaginary


@opreg.impl("aten::view_as_real", complex=True)
@opreg.impl("aten::view_as_complex", complex=True)
@opreg.impl("aten::clone", complex=True)
@opreg.impl("aten::alias", complex=True)
@opreg.impl("aten::lift_fresh_copy", complex=True)
def aten_pair_identity(self: Tensor):
    """view_as_real(Tensor(a) self) -> Tensor(a): Identity (the pair is the real view).

    view_as_complex(Tensor(a) self) -> Tensor(a): Identity (a trailing 2 is how complex values travel).

    clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor: Identity of the pair.

    alias(Tensor(a) self) -> Tensor(a): Identity of the pair.

    lift_fresh_copy(Tensor self) -> Tensor: Identity of the pair."""
    return op18.Identity(self)


@opreg.impl("aten::complex", complex=True)
def aten_complex(real: Tensor, imag: Tensor):
    """complex(Tensor real, Tensor imag) -> Tensor: the parts stacked (broadcast)."""
    dtype = _part_type(real, imag)
    real, imag = cast_to(real, dtype), cast_to(imag, dtype)
    shape = op18.Shape(op18.Add(real, imag))
    return pair(op18.Expand(real, shape), op18.Expand(imag, shape))


@opreg.impl("aten::polar", complex=True)
def aten_polar(abs: Tensor, angle: Tensor):
    """polar(Tensor abs, Tensor angle) -> Tensor: (abs cos angle, abs sin angle)."""
    return pair(op18.Mul(abs, op18.Cos(angle)), op18.Mul(abs, op18.Sin(angle)))


@opreg.impl("aten::add.Tensor", complex=True)
def aten_add_complex(self: Tensor, other: Tensor, alpha: float = 1):
    """add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: the parts added (alpha may be complex)."""
    return _add_scaled(self, other, alpha)


@opreg.impl("aten::sub.Tensor", complex=True)
def aten_sub_complex(self: Tensor, other: Tensor, alpha: float = 1):
    """sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: the parts subtracted (alpha may be complex)."""
    return _add_scaled(self, other, -alpha)


def _add_scaled(self, other, alpha):
    dtype = _part_type(self, other, alpha)
    a_re, a_im = parts(self, dtype)
    b_re, b_im = parts(other, dtype)
    if alpha != 1:
        b_re, b_im = _multiply(b_re, b_im, *parts(alpha, dtype))
    return pair(op18.Add(a_re, b_re), op18.Add(a_im, b_im))


@opreg.impl("aten::mul.Tensor", complex=True)
def aten_mul_complex(self: Tensor, other: Tensor):
    """mul.Tensor(Tensor self, Tensor other) -> Tensor: (ac - bd) + (ad + bc)i."""
    dtype = _part_type(self, other)
    return pair(*_multiply(*parts(self, dtype), *parts(other, dtype)))


@opreg.impl("aten::div.Tensor", complex=True)
def aten_div_complex(self: Tensor, other: Tensor):
    """div.Tensor(Tensor self, Tensor other) -> Tensor: ((ac + bd) + (bc - ad)i) / (c^2 + d^2)."""
    dtype = _part_type(self, other)
    a_re, a_im = parts(self, dtype)
    b_re, b_im = parts(other, dtype)
    norm = op18.Add(op18.Mul(b_re, b_re), op18.Mul(b_im, b_im))
    real = op18.Add(op18.Mul(a_re, b_re), op18.Mul(a_im, b_im))
    imaginary = op18.Sub(op18.Mul(a_im, b_re), op18.Mul(a_re, b_im))
    return pair(op18.Div(real, norm), op18.Div(imaginary, norm))


@opreg.impl("aten::abs", complex=True)
def aten_abs_complex(self: Tensor):
    """abs(Tensor self) -> Tensor: |z| as hypot(re, im) = m sqrt(1 + (n/m)^2), m and n the larger and smaller
    part magnitudes, so squares of tiny or huge parts neither underflow nor overflow; a real tensor."""
    real, imaginary = (op18.Abs(p) for p in parts(self, self.dtype))
    larger, smaller = op18.Max(real, imaginary), op18.Min(real, imaginary)
    ratio = op18.Div(smaller, larger)
    scaled = op18.Mul(larger, op18.Sqrt(op18.Add(op18.CastLike(1.0, ratio), op18.Mul(ratio, ratio))))
    # 0/0 and inf/inf: |z| is 0 and inf (an infinite part wins over NaN, as in C's hypot)
    trivial = op18.Or(op18.Equal(larger, op18.CastLike(0.0, larger)), op18.IsInf(larger))
    infinite = op18.Or(op18.IsInf(real), op18.IsInf(imaginary))
    return op18.Where(infinite, op18.CastLike(float("inf"), larger), op18.Where(trivial, larger, scaled))


@opreg.impl("aten::angle", complex=True)
def aten_angle_complex(self: Tensor):
    """angle(Tensor self) -> Tensor: atan2(im, re), a real tensor."""
    real, imaginary = parts(self, self.dtype)
    return aten_atan2(imaginary, real)


@opreg.impl("aten::angle")
def aten_angle(self: Tensor):
    """angle(Tensor self) -> Tensor: of a real tensor, pi where negative, else 0 (NaN stays NaN), in float."""
    x = as_float(self)
    zero = op18.CastLike(0.0, x)
    turned = op18.Where(op18.Less(x, zero), op18.CastLike(math.pi, x), zero)
    return op18.Where(op18.IsNaN(x), x, turned)


@opreg.impl("aten::_conj", complex=True)
def aten_conj_complex(self: Tensor):
    """_conj(Tensor(a) self) -> Tensor(a): the imaginary part negated."""
    real, imaginary = parts(self, self.dtype)
    return pair(real, op18.Neg(imaginary))


@opreg.impl("aten::conj_physical", complex=True)
def aten_conj_physical_complex(self: Tensor):
    """conj_physical(Tensor self) -> Tensor: the imaginary part negated."""
    return aten_conj_complex(self)


@opreg.impl("aten::_conj_physical", complex=True)
def aten__conj_physical_complex(self: Tensor):
    """_conj_physical(Tensor self) -> Tensor: the imaginary part negated."""
    return aten_conj_complex(self)


@opreg.impl("aten::exp", complex=True)
def aten_exp_complex(self: Tensor):
    """exp(Tensor self) -> Tensor: e^re (cos im + i sin im)."""
    real, imaginary = parts(self, self.dtype)
    magnitude = op18.Exp(real)
    return pair(op18.Mul(magnitude, op18.Cos(imaginary)), op18.Mul(magnitude, op18.Sin(imaginary)))


# -- copies and views of pairs ------------------------------------------------------------------


def _rank(self) -> int:
    """The complex tensor's own rank (its pair has one dim more)."""
    return rank_of(self) - 1


def _dim(dim: int, rank: int) -> int:
    """``dim`` of a rank-``rank`` complex tensor, non-negative: the same axis of its pair."""
    return dim % rank if rank else 0


def _with_pair_dim(size):
    """A size of the complex tensor as a size of its pair (a trailing 2)."""
    if isinstance(size, ir.Value):
        return op18.Concat(size, op18.Constant(value_ints=[2]), axis=0)
    return [*size, 2]


def _as_pair(value, dtype: ir.DataType):
    """``value`` as a complex pair of ``dtype`` parts (a real tensor gets imaginary part 0)."""
    if isinstance(value, ir.Value) and is_complex(value):
        return cast_to(value, dtype)
    real, imaginary = parts(value, dtype)
    return pair(real, op18.Expand(imaginary, op18.Shape(real)))


@opreg.impl("aten::_to_copy", complex=True)
def aten_to_copy_complex(
    self: Tensor,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    non_blocking: bool = False,
):
    """_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor: parts cast; to a real dtype, the real part (as torch, which warns); from one, imaginary part 0."""
    if dtype is None:
        return op18.Identity(self)
    target = ir.DataType(dtype)
    if target in _PART_OF:
        return _as_pair(self, _PART_OF[target])
    real, _ = parts(self, self.dtype)
    return op18.Cast(real, to=int(target))


@opreg.impl("aten::view", complex=True)
@opreg.impl("aten::_unsafe_view", complex=True)
def aten_view_complex(self: Tensor, size: Sequence[int]):
    """view(Tensor(a) self, SymInt[] size) -> Tensor(a): the pair reshaped to size + [2].

    _unsafe_view(Tensor self, SymInt[] size) -> Tensor: the same."""
    return views.aten_view(self, _with_pair_dim(size))


@opreg.impl("aten::reshape", complex=True)
def aten_reshape_complex(self: Tensor, shape: Sequence[int]):
    """reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a): the pair reshaped to shape + [2]."""
    return views.aten_reshape(self, _with_pair_dim(shape))


@opreg.impl("aten::expand", complex=True)
def aten_expand_complex(self: Tensor, size: Sequence[int], implicit: bool = False):
    """expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a): the pair expanded to size + [2]."""
    return views.aten_expand(self, _with_pair_dim(size))


@opreg.impl("aten::permute", complex=True)
def aten_permute_complex(self: Tensor, dims: Sequence[int]):
    """permute(Tensor(a) self, int[] dims) -> Tensor(a): the pair transposed, its last dim kept last."""
    rank = _rank(self)
    return views.aten_permute(self, [*(_dim(d, rank) for d in dims), rank])


@opreg.impl("aten::transpose.int", complex=True)
def aten_transpose_complex(self: Tensor, dim0: int, dim1: int):
    """transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a): the pair's two dims swapped."""
    rank = _rank(self)
    return views.aten_transpose(self, _dim(dim0, rank), _dim(dim1, rank))


@opreg.impl("aten::unsqueeze", complex=True)
def aten_unsqueeze_complex(self: Tensor, dim: int):
    """unsqueeze(Tensor(a) self, int dim) -> Tensor(a): a dim of 1 inserted before the pair's last."""
    return views.aten_unsqueeze(self, _dim(dim, _rank(self) + 1))


@opreg.impl("aten::squeeze.dims", complex=True)
def aten_squeeze_dims_complex(self: Tensor, dim: Sequence[int]):
    """squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a): the pair's dims of size 1 among them squeezed."""
    rank = _rank(self)
    return views.aten_squeeze_dims(self, [_dim(d, rank) for d in dim])


@opreg.impl("aten::squeeze.dim", complex=True)
def aten_squeeze_dim_complex(self: Tensor, dim: int):
    """squeeze.dim(Tensor(a) self, int dim) -> Tensor(a): the pair's dim squeezed if of size 1."""
    return aten_squeeze_dims_complex(self, [dim])


@opreg.impl("aten::select.int", complex=True)
def aten_select_complex(self: Tensor, dim: int, index: int):
    """select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a): Gather on the pair."""
    return indexing.aten_select(self, _dim(dim, _rank(self)), index)


@opreg.impl("aten::slice.Tensor", complex=True)
def aten_slice_complex(self: Tensor, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1):
    """slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a): Slice of the pair."""
    return indexing.aten_slice(self, _dim(dim, _rank(self)), start, end, step)


@opreg.impl("aten::flip", complex=True)
def aten_flip_complex(self: Tensor, dims: Sequence[int]):
    """flip(Tensor self, int[] dims) -> Tensor: the pair reversed along dims."""
    rank = _rank(self)
    return indexing.aten_flip(self, [_dim(d, rank) for d in dims])


@opreg.impl("aten::index_select", complex=True)
def aten_index_select_complex(self: Tensor, dim: int, index: Tensor):
    """index_select(Tensor self, int dim, Tensor index) -> Tensor: Gather on the pair."""
    return indexing.aten_index_select(self, _dim(dim, _rank(self)), index)


@opreg.impl("aten::constant_pad_nd", complex=True)
def aten_constant_pad_nd_complex(self: Tensor, pad: Sequence[int], value: float = 0):
    """constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor: the pair padded (none on its last dim) with 0, or with a real value's real part and 0."""
    if isinstance(pad, ir.Value):
        raise ValueError("constant_pad_nd needs static pads")
    number = complex(value)
    if number.imag:
        raise ValueError("constant_pad_nd of a complex tensor with a complex value is not exported")
    return padding_ops.aten_constant_pad_nd(self, [0, 0, *pad], number.real)


@opreg.impl("aten::reflection_pad1d", complex=True)
def aten_reflection_pad1d_complex(self: Tensor, padding: Sequence[int]):
    """reflection_pad1d(Tensor self, SymInt[2] padding) -> Tensor: the pair reflected (none on its last dim)."""
    return padding_ops.aten_reflection_pad(self, [0, 0, *padding])


@opreg.impl("aten::sym_size.int", complex=True)
def aten_sym_size_complex(self: Tensor, dim: int):
    """sym_size.int(Tensor self, int dim) -> SymInt: the pair's dim (never its trailing 2)."""
    return views.aten_sym_size(self, _dim(dim, _rank(self)))


@opreg.impl("aten::sym_numel", complex=True)
def aten_sym_numel_complex(self: Tensor):
    """sym_numel(Tensor self) -> SymInt: the pair's size over 2."""
    return op18.Div(op18.Size(self), op18.Constant(value=ir.tensor(2, dtype=ir.DataType.INT64)))


@opreg.impl("aten::cat", complex=True)
def aten_cat_complex(tensors: Sequence[Tensor], dim: int = 0):
    """cat(Tensor[] tensors, int dim=0) -> Tensor: the pairs (real tensors with imaginary part 0) concatenated."""
    dtype = _part_type(*tensors)
    pairs = [_as_pair(t, dtype) for t in tensors]
    return joining.aten_cat(pairs, _dim(dim, _rank(pairs[0])))


@opreg.impl("aten::stack", complex=True)
def aten_stack_complex(tensors: Sequence[Tensor], dim: int = 0):
    """stack(Tensor[] tensors, int dim=0) -> Tensor: the pairs (real tensors with imaginary part 0) stacked."""
    dtype = _part_type(*tensors)
    pairs = [_as_pair(t, dtype) for t in tensors]
    return joining.aten_stack(pairs, _dim(dim, _rank(pairs[0]) + 1))
