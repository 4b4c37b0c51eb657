"""Random numbers: rand/randn/randint (and their ``_like`` forms), normal, uniform, bernoulli,
multinomial, randperm, exponential/geometric/log_normal/cauchy, random_(to), rrelu's slopes,
and dropout in training.

Each becomes ONNX's random ops (RandomNormal, RandomUniform, their ``Like`` forms,
Multinomial): the exported model draws fresh numbers at every run from the runtime's
generator, not torch's, so only the distribution can match eager PyTorch, never the
values (``opreg.testing.Distribution`` checks it). A node gets a ``seed`` attribute
only when the export is asked for one (``opreg.export(..., seed=N)``).

Bernoulli draws and dropout masks are ``U < p`` for a uniform U, not ONNX's Bernoulli
and Dropout ops, which ONNX Runtime (1.32, CPU) gets wrong: its Bernoulli draws 1 with
probability 1 - p, and its Dropout in training mode keeps (or, seeded, drops) the first
element in every run of a session (``bench/distributions.py`` measures both).

Numbers are drawn in float32 (float64 for float64 results) and cast. Where torch's
distribution depends on the draw's precision, the impl follows torch: float16 and
bfloat16 uniforms lie on torch's grid of 2^-11 and 2^-8 (so never round up to 1),
and integers (randint, randperm) come from float64 uniforms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import DEFAULT_FLOAT, Tensor, cast_to, rank_of
from opreg.values import is_complex

_GRID_BITS = {ir.DataType.FLOAT16: 11, ir.DataType.BFLOAT16: 8}
"""torch draws float16/bfloat16 uniforms as k * 2^-bits (the type's significand bits), k < 2^bits."""

_COMPONENT = {ir.DataType.COMPLEX64: ir.DataType.FLOAT, ir.DataType.COMPLEX128: ir.DataType.DOUBLE}
"""A complex dtype's real and imaginary part (complex values travel as real pairs, see opreg.values)."""

_HALF_VARIANCE = math.sqrt(0.5)
"""torch's complex randn draws real and imaginary parts with variance 1/2 each (so |z|^2 has mean 1)."""


# -- drawing -------------------------------------------------------------------------------


def _compute(dtype: ir.DataType) -> ir.DataType:
    """The type numbers are drawn in: float64 for float64 results, else float32."""
    return ir.DataType.DOUBLE if dtype == ir.DataType.DOUBLE else ir.DataType.FLOAT


def _draw(fixed, like_op, dtype: ir.DataType, like, size: Sequence[int], **attributes):
    """One draw of ``dtype`` numbers: ``like_op`` (a ``RandomXLike``) shaped like ``like`` or, for a
    symbolic ``size``, like a tensor of that size; else ``fixed`` (a ``RandomX``) with ``size`` as its
    ``shape``. A 0-d draw is made 1-d and reshaped: onnx.reference (1.23) fails on 0-d ones."""
    attributes["dtype"] = int(dtype)
    scalar = op18.Constant(value_ints=[])
    if like is None and isinstance(size, ir.Value):
        like = op18.ConstantOfShape(size)
    if like is None:
        if len(size) == 0:
            return op18.Reshape(fixed(shape=[1], **attributes), scalar)
        return fixed(shape=list(size), **attributes)
    if rank_of(like) == 0:
        return op18.Reshape(like_op(op18.Reshape(like, op18.Constant(value_ints=[1])), **attributes), scalar)
    return like_op(like, **attributes)


def _uniform(dtype: ir.DataType, like=None, size: Sequence[int] = (), low: float = 0.0, high: float = 1.0):
    """U[low, high) in ``dtype`` (FLOAT or DOUBLE), shaped like ``like`` or of ``size``."""
    return _draw(op18.RandomUniform, op18.RandomUniformLike, dtype, like, size, low=low, high=high)


def _normal(dtype: ir.DataType, like=None, size: Sequence[int] = (), mean: float = 0.0, scale: float = 1.0):
    """N(mean, scale^2) in ``dtype`` (FLOAT or DOUBLE), shaped like ``like`` or of ``size``."""
    return _draw(op18.RandomNormal, op18.RandomNormalLike, dtype, like, size, mean=mean, scale=scale)


def _unit(dtype: ir.DataType, like=None, size: Sequence[int] = ()):
    """U[0, 1) as torch draws it in ``dtype``, in ``_compute(dtype)``."""
    u = _uniform(_compute(dtype), like, size)
    bits = _GRID_BITS.get(dtype)
    if bits is None:
        return u
    return op18.Div(op18.Floor(op18.Mul(u, float(2**bits))), float(2**bits))


def _pair_size(size: Sequence[int]):
    """``size`` and a trailing 2: the shape a complex tensor of ``size`` travels as."""
    if isinstance(size, ir.Value):
        return op18.Concat(size, op18.Constant(value_ints=[2]), axis=0)
    return [*size, 2]


def _result_dtype(dtype: int | None, default: ir.DataType) -> ir.DataType:
    return default if dtype is None else ir.DataType(dtype)


def _like_dtype(self, dtype: int | None) -> ir.DataType:
    """A ``_like`` op's dtype: the one asked for, else ``self``'s (a complex one for a complex ``self``)."""
    if dtype is not None:
        return ir.DataType(dtype)
    if is_complex(self):
        return ir.DataType.COMPLEX128 if self.dtype == ir.DataType.DOUBLE else ir.DataType.COMPLEX64
    return self.dtype


def _like_template(self, dtype: ir.DataType):
    """What a ``_like`` op draws the shape of: ``self``, with a trailing 2 when a real ``self``
    asks for complex numbers, or without its trailing 2 when a complex one asks for real ones."""
    if dtype in _COMPONENT and not is_complex(self):
        return op18.ConstantOfShape(_pair_size(op18.Shape(self)))
    if dtype not in _COMPONENT and is_complex(self):
        return op18.Gather(self, op18.Constant(value_int=0), axis=-1)
    return self


def _standard(kind: str, dtype: ir.DataType, like=None, size: Sequence[int] = ()):
    """``rand`` (``kind`` "uniform") or ``randn`` ("normal") numbers of ``dtype``; a complex dtype
    draws the real and imaginary parts (as torch: U[0, 1) each, or N(0, 1/2) each)."""
    component = _COMPONENT.get(dtype)
    if component is not None:
        if like is None:
            size = _pair_size(size)
        if kind == "normal":
            return cast_to(_normal(_compute(component), like, size, scale=_HALF_VARIANCE), component)
        return cast_to(_unit(component, like, size), component)
    if kind == "normal":
        return cast_to(_normal(_compute(dtype), like, size), dtype)
    return cast_to(_unit(dtype, like, size), dtype)


def _double(value):
    """A Python number or a symbolic scalar as a float64 scalar (a Python float for a number)."""
    if isinstance(value, ir.Value):
        if value.shape is not None and len(value.shape) != 0:
            value = op18.Reshape(value, op18.Constant(value_ints=[]))
        return op18.Cast(value, to=int(ir.DataType.DOUBLE))
    return float(value)


def _randint(low, high, dtype: ir.DataType, like=None, size: Sequence[int] = ()):
    """Integers uniform in [low, high): floor(low + U * (high - low)) from a float64 U, kept below
    ``high`` (so as exact as torch's for ranges below 2^53)."""
    u = _uniform(ir.DataType.DOUBLE, like, size)
    low, high = _double(low), _double(high)
    span = high - low if isinstance(low, float) and isinstance(high, float) else op18.Sub(high, low)
    top = high - 1.0 if isinstance(high, float) else op18.Sub(high, 1.0)
    drawn = op18.Min(op18.Floor(op18.Add(op18.Mul(u, span), low)), top)
    return op18.Cast(drawn, to=int(dtype))


# -- creation ------------------------------------------------------------------------------


@opreg.impl("aten::rand")
@opreg.impl("aten::rand", complex=True)
def aten_rand(size: Sequence[int], dtype: int | None = None):
    """rand(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: RandomUniform."""
    return _standard("uniform", _result_dtype(dtype, DEFAULT_FLOAT), size=size)


@opreg.impl("aten::randn")
@opreg.impl("aten::randn", complex=True)
def aten_randn(size: Sequence[int], dtype: int | None = None):
    """randn(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: RandomNormal."""
    return _standard("normal", _result_dtype(dtype, DEFAULT_FLOAT), size=size)


@opreg.impl("aten::rand_like")
@opreg.impl("aten::rand_like", complex=True)
def aten_rand_like(self: Tensor, dtype: int | None = None):
    """rand_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: RandomUniformLike."""
    result = _like_dtype(self, dtype)
    return _standard("uniform", result, like=_like_template(self, result))


@opreg.impl("aten::randn_like")
@opreg.impl("aten::randn_like", complex=True)
def aten_randn_like(self: Tensor, dtype: int | None = None):
    """randn_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: RandomNormalLike."""
    result = _like_dtype(self, dtype)
    return _standard("normal", result, like=_like_template(self, result))


@opreg.impl("aten::randint")
def aten_randint(high: int, size: Sequence[int], dtype: int | None = ir.DataType.INT64):
    """randint(SymInt high, SymInt[] size, *, ScalarType? dtype=long, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: floor of a float64 RandomUniform."""
    return _randint(0, high, _result_dtype(dtype, ir.DataType.INT64), size=size)


@opreg.impl("aten::randint.low")
def aten_randint_low(low: int, high: int, size: Sequence[int], dtype: int | None = ir.DataType.INT64):
    """randint.low(SymInt low, SymInt high, SymInt[] size, *, ScalarType? dtype=long, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: floor of a float64 RandomUniform."""
    return _randint(low, high, _result_dtype(dtype, ir.DataType.INT64), size=size)


@opreg.impl("aten::randint_like")
def aten_randint_like(self: Tensor, high: int, dtype: int | None = None):
    """randint_like(Tensor self, SymInt high, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: floor of a float64 RandomUniformLike."""
    return _randint(0, high, _result_dtype(dtype, self.dtype), like=self)


@opreg.impl("aten::randint_like.low_dtype")
def aten_randint_like_low_dtype(self: Tensor, low: int, high: int, dtype: int | None = None):
    """randint_like.low_dtype(Tensor self, SymInt low, SymInt high, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor: floor of a float64 RandomUniformLike."""
    return _randint(low, high, _result_dtype(dtype, self.dtype), like=self)


@opreg.impl("aten::randperm")
def aten_randperm(n: int, dtype: int | None = ir.DataType.INT64):
    """randperm(SymInt n, *, ScalarType? dtype=long, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: the order of n float64 RandomUniform keys (TopK).

    Sorting i.i.d. continuous keys gives every permutation the same probability; float64 keys
    tie with probability about n^2 / 2^54, the only departure from exactness."""
    size = [n] if isinstance(n, int) else op18.Reshape(n, op18.Constant(value_ints=[1]))
    keys = _uniform(ir.DataType.DOUBLE, size=size)
    count = op18.Shape(keys)
    _, order = op18.TopK(keys, count, axis=0, largest=0, sorted=1)
    return op18.Cast(order, to=int(_result_dtype(dtype, ir.DataType.INT64)))


@opreg.impl("aten::random.to")
def aten_random_to(self: Tensor, to: int, generator: str | None = None):
    """random.to(Tensor self, int to, *, Generator? generator=None) -> Tensor: integers uniform in [0, to), as self's dtype (floor of a float64 RandomUniformLike)."""
    return _randint(0, to, self.dtype, like=self)


# -- distributions of a tensor's shape -------------------------------------------------------


@opreg.impl("aten::normal.Tensor_float")
def aten_normal_tensor_float(mean: Tensor, std: float = 1.0, generator: str | None = None):
    """normal.Tensor_float(Tensor mean, float std=1., *, Generator? generator=None) -> Tensor: mean + std * RandomNormalLike."""
    compute = _compute(mean.dtype)
    noise = _normal(compute, like=mean, scale=float(std))
    return cast_to(op18.Add(cast_to(mean, compute), noise), mean.dtype)


@opreg.impl("aten::normal.float_Tensor")
def aten_normal_float_tensor(mean: float, std: Tensor, generator: str | None = None):
    """normal.float_Tensor(float mean, Tensor std, *, Generator? generator=None) -> Tensor: mean + std * RandomNormalLike."""
    compute = _compute(std.dtype)
    noise = _normal(compute, like=std)
    return cast_to(op18.Add(op18.Mul(cast_to(std, compute), noise), float(mean)), std.dtype)


@opreg.impl("aten::normal.Tensor_Tensor")
def aten_normal_tensor_tensor(mean: Tensor, std: Tensor, generator: str | None = None):
    """normal.Tensor_Tensor(Tensor mean, Tensor std, *, Generator? generator=None) -> Tensor: mean + std * RandomNormalLike (broadcast)."""
    compute = _compute(mean.dtype)
    mean_c, std_c = cast_to(mean, compute), cast_to(std, compute)
    noise = _normal(compute, like=op18.Add(mean_c, std_c))  # the broadcast shape
    return cast_to(op18.Add(op18.Mul(std_c, noise), mean_c), mean.dtype)


@opreg.impl("aten::normal.float_float")
def aten_normal_float_float(
    mean: float, std: float, size: Sequence[int], generator: str | None = None, dtype: int | None = None
):
    """normal.float_float(float mean, float std, SymInt[] size, *, Generator? generator=None, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor: RandomNormal."""
    result = _result_dtype(dtype, DEFAULT_FLOAT)
    return cast_to(_normal(_compute(result), size=size, mean=float(mean), scale=float(std)), result)


@opreg.impl("aten::normal_functional")
@opreg.impl("aten::normal_functional", complex=True)
def aten_normal_functional(self: Tensor, mean: float = 0.0, std: float = 1.0, generator: str | None = None):
    """normal_functional(Tensor self, float mean=0., float std=1., *, Generator? generator=None) -> Tensor: RandomNormalLike (a complex self: each part with std / sqrt(2), as torch)."""
    scale = float(std) * (_HALF_VARIANCE if is_complex(self) else 1.0)
    return cast_to(_normal(_compute(self.dtype), like=self, mean=float(mean), scale=scale), self.dtype)


@opreg.impl("aten::uniform")
@opreg.impl("aten::uniform", complex=True)
def aten_uniform(self: Tensor, from_: float = 0.0, to: float = 1.0, generator: str | None = None):
    """uniform(Tensor self, float from=0., float to=1., *, Generator? generator=None) -> Tensor: from + (to - from) * RandomUniformLike."""
    u = _unit(self.dtype, like=self)
    return cast_to(op18.Add(op18.Mul(u, float(to) - float(from_)), float(from_)), self.dtype)


@opreg.impl("aten::exponential")
def aten_exponential(self: Tensor, lambd: float = 1.0, generator: str | None = None):
    """exponential(Tensor self, float lambd=1., *, Generator? generator=None) -> Tensor: -log(1 - U) / lambd."""
    compute = _compute(self.dtype)
    u = _uniform(compute, like=self)
    return cast_to(op18.Div(op18.Neg(op18.Log(op18.Sub(1.0, u))), float(lambd)), self.dtype)


@opreg.impl("aten::geometric")
def aten_geometric(self: Tensor, p: float, generator: str | None = None):
    """geometric(Tensor self, float p, *, Generator? generator=None) -> Tensor: trials to the first success, ceil(log(1 - U) / log(1 - p)) >= 1."""
    u = _uniform(ir.DataType.DOUBLE, like=self)
    trials = op18.Ceil(op18.Div(op18.Log(op18.Sub(1.0, u)), math.log1p(-float(p))))
    return op18.Cast(op18.Max(trials, 1.0), to=int(self.dtype))


@opreg.impl("aten::log_normal")
def aten_log_normal(self: Tensor, mean: float = 1.0, std: float = 2.0, generator: str | None = None):
    """log_normal(Tensor self, float mean=1., float std=2., *, Generator? generator=None) -> Tensor: exp of RandomNormalLike."""
    return cast_to(op18.Exp(_normal(_compute(self.dtype), like=self, mean=float(mean), scale=float(std))), self.dtype)


@opreg.impl("aten::cauchy")
def aten_cauchy(self: Tensor, median: float = 0.0, sigma: float = 1.0, generator: str | None = None):
    """cauchy(Tensor self, float median=0., float sigma=1., *, Generator? generator=None) -> Tensor: median + sigma * tan(pi * (U - 1/2))."""
    u = _uniform(_compute(self.dtype), like=self)
    spread = op18.Mul(op18.Tan(op18.Mul(op18.Sub(u, 0.5), math.pi)), float(sigma))
    return cast_to(op18.Add(spread, float(median)), self.dtype)


# -- sampling --------------------------------------------------------------------------------


def _draw_ones(probabilities, like):
    """A BOOL tensor shaped like ``like``, true with the given probabilities (broadcast): U < p for a
    float64 RandomUniformLike U. Not ONNX's Bernoulli: ONNX Runtime's kernel (1.32) draws 1 with
    probability 1 - p, and its graph optimiser would fold a Bernoulli of a constant (RandomUniformLike
    it leaves alone)."""
    u = _uniform(ir.DataType.DOUBLE, like=like)
    return op18.Less(u, probabilities if isinstance(probabilities, float) else cast_to(probabilities, u.dtype))


@opreg.impl("aten::bernoulli")
def aten_bernoulli(self: Tensor, generator: str | None = None):
    """bernoulli(Tensor self, *, Generator? generator=None) -> Tensor: U < self for a RandomUniformLike U."""
    return op18.Cast(_draw_ones(self, self), to=int(self.dtype))


@opreg.impl("aten::bernoulli.p")
def aten_bernoulli_p(self: Tensor, p: float, generator: str | None = None):
    """bernoulli.p(Tensor self, float p, *, Generator? generator=None) -> Tensor: U < p for a RandomUniformLike U."""
    return op18.Cast(_draw_ones(float(p), self), to=int(self.dtype))


@opreg.impl("aten::bernoulli.Tensor")
def aten_bernoulli_tensor(self: Tensor, p: Tensor, generator: str | None = None):
    """bernoulli.Tensor(Tensor self, Tensor p, *, Generator? generator=None) -> Tensor: U < p (broadcast) for a RandomUniformLike U."""
    return op18.Cast(_draw_ones(p, self), to=int(self.dtype))


@opreg.impl("aten::multinomial")
def aten_multinomial(self: Tensor, num_samples: int, replacement: bool = False, generator: str | None = None):
    """multinomial(Tensor self, SymInt num_samples, bool replacement=False, *, Generator? generator=None) -> Tensor: Multinomial of log(self), or without replacement the top num_samples of log(self) + Gumbel noise.

    Without replacement torch picks the top num_samples of self / E with E ~ Exponential(1) (the
    exponential trick); log(self) - log(E) orders the same keys, which ONNX's TopK ranks."""
    weights = cast_to(self, ir.DataType.FLOAT)  # ONNX Runtime's Multinomial takes float32 only
    rank = len(self.shape) if self.shape is not None else 2
    if rank == 1:
        weights = op18.Unsqueeze(weights, op18.Constant(value_ints=[0]))
    logits = op18.Log(weights)
    if replacement or num_samples == 1:
        if not isinstance(num_samples, int):
            raise ValueError("multinomial with replacement needs a static num_samples (ONNX's sample_size)")
        picked = op18.Multinomial(logits, sample_size=num_samples, dtype=int(ir.DataType.INT64))
    else:
        exponential = op18.Neg(op18.Log(op18.Sub(1.0, _uniform(ir.DataType.DOUBLE, like=logits))))
        keys = op18.Sub(logits, op18.Cast(op18.Log(exponential), to=int(ir.DataType.FLOAT)))
        if isinstance(num_samples, int):
            count = op18.Constant(value_ints=[num_samples])
        else:
            count = op18.Reshape(num_samples, op18.Constant(value_ints=[1]))
        _, picked = op18.TopK(keys, count, axis=-1)
    if rank == 1:
        picked = op18.Squeeze(picked, op18.Constant(value_ints=[0]))
    return picked


# -- dropout in training ------------------------------------------------------------------------


def training_dropout(input, p: float):
    """torch's dropout in training: ``(input * mask / (1 - p), mask)`` with a fresh mask, true
    with probability ``1 - p`` (U < 1 - p for a RandomUniformLike U). Not ONNX's Dropout: ONNX
    Runtime's kernel (1.32) keeps or drops the first element in every run of a session alike.
    ``p = 1`` keeps nothing: ``input * 0`` (NaN stays NaN, as in torch) and an all-false mask."""
    if p >= 1.0:
        return op18.Mul(input, op18.CastLike(0.0, input)), op18.Expand(False, op18.Shape(input))
    mask = _draw_ones(1.0 - float(p), input)
    kept = op18.Mul(input, op18.CastLike(mask, input))
    return op18.Mul(kept, op18.CastLike(1.0 / (1.0 - float(p)), input)), mask


@opreg.impl("aten::dropout")
def aten_dropout_training(input: Tensor, p: float, train: bool):
    """dropout(Tensor input, float p, bool train) -> Tensor: Dropout in training mode (a fresh mask at every run)."""
    output, _ = training_dropout(input, p)
    return output


@opreg.impl("aten::native_dropout")
def aten_native_dropout_training(input: Tensor, p: float, train: bool | None):
    """native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor): Dropout in training mode, and its mask."""
    return training_dropout(input, p)


@opreg.impl("aten::rrelu_with_noise_functional")
def aten_rrelu_with_noise_functional(
    self: Tensor,
    noise: Tensor,
    lower: float = 0.125,
    upper: float = 1.0 / 3.0,
    training: bool = False,
    generator: str | None = None,
):
    """rrelu_with_noise_functional(Tensor self, Tensor noise, Scalar lower=0.125, Scalar upper=0.33333333333333331, bool training=False, Generator? generator=None) -> (Tensor, Tensor noise_out): in training, slopes U(lower, upper) drawn for the elements <= 0 (RandomUniformLike); else the mean slope."""
    zero = op18.CastLike(0.0, self)
    if not training:
        slope = op18.CastLike((float(lower) + float(upper)) / 2, self)
        return op18.Where(op18.GreaterOrEqual(self, zero), self, op18.Mul(self, slope)), op18.Identity(noise)
    slopes = cast_to(_uniform(_compute(self.dtype), like=self, low=float(lower), high=float(upper)), self.dtype)
    drawn = op18.Where(op18.LessOrEqual(self, zero), slopes, op18.CastLike(1.0, self))
    return op18.Mul(self, drawn), op18.CastLike(drawn, noise)
