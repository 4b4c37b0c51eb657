"""Fourier transforms: the FFT primitives (_fft_r2c, _fft_c2c, _fft_c2r), stft and istft.

torch.fft.* reach ATen as the three primitives; each becomes ONNX's DFT, one per transformed
dim, with complex values as real tensors with a trailing dimension of 2 (docs/design.md, "An export"), the
form DFT takes and returns. DFT's axis was an attribute until opset 20 made it (and kept
dft_length) an input: each impl is registered at 18 and at 20 and calls the form of its
version (``_DFT``), the newest the target allows wins. ONNX's DFT is
unnormalised forward and divides by n inverse; torch's ``normalization`` (0 none, 1 by
1/sqrt(n), 2 by 1/n) is applied after. stft is ONNX's STFT, istft an inverse DFT per frame
and Col2Im's overlap-add divided by the window's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg
from opreg.ops import Tensor, rank_of
from opreg.values import is_complex

_BY_SQRT_N, _BY_N = 1, 2
"""torch's ``normalization`` codes (0: none)."""

_PAD_MODES = {"reflect": "reflect", "constant": "constant", "replicate": "edge"}
"""torch's stft pad_mode -> ONNX Pad's mode (circular needs Pad's ``wrap``, opset 19)."""


def _dft17(signal, axis: int, inverse: bool, onesided: bool, length=None):
    """DFT-17 (axis an attribute) of ``signal`` (a real ``[..., 1]`` or complex ``[..., 2]`` tensor)."""
    return op18.DFT(signal, length, axis=axis, inverse=int(inverse), onesided=int(onesided))


def _dft20(signal, axis: int, inverse: bool, onesided: bool, length=None):
    """DFT-20 (axis an input) of ``signal`` (a real ``[..., 1]`` or complex ``[..., 2]`` tensor)."""
    axis_input = op20.Constant(value=ir.tensor(axis, dtype=ir.DataType.INT64))
    return op20.DFT(signal, length, axis_input, inverse=int(inverse), onesided=int(onesided))


_DFT = {18: _dft17, 20: _dft20}
"""The DFT of each version of the impls below (opset 18 emits DFT-17)."""


def _scalar(value):
    """A size (int or symbolic) as a 0-d INT64 tensor, as DFT's dft_length takes it."""
    if isinstance(value, ir.Value):
        return op18.Reshape(op18.Cast(value, to=int(ir.DataType.INT64)), op18.Constant(value_ints=[]))
    return op18.Constant(value=ir.tensor(int(value), dtype=ir.DataType.INT64))


def _size(signal, dims: Sequence[int], extra=1):
    """The number of points transformed over ``dims`` of ``signal`` (times ``extra``): a Python
    number when the dims are static, else a 0-d value of the signal's type."""
    sizes = [signal.shape[d] for d in dims]
    if all(isinstance(s, int) for s in sizes) and not isinstance(extra, ir.Value):
        return float(math.prod(sizes) * extra)
    shape = op18.Shape(signal)
    picked = op18.Gather(shape, op18.Constant(value_ints=list(dims)), axis=0)
    total = op18.ReduceProd(picked, keepdims=0)
    if isinstance(extra, ir.Value):
        total = op18.Mul(total, op18.Reshape(op18.Cast(extra, to=int(ir.DataType.INT64)), []))
    elif extra != 1:
        total = op18.Mul(total, op18.Constant(value=ir.tensor(int(extra), dtype=ir.DataType.INT64)))
    return op18.CastLike(total, signal)


def _normalize(spectrum, normalization: int, points, inverse: bool):
    """Scale ONNX's DFT result as torch's ``normalization`` asks: forward DFTs are unscaled, inverse
    ones divided by ``points`` already."""
    if isinstance(points, float):
        scale = {0: 1.0, _BY_SQRT_N: 1.0 / math.sqrt(points), _BY_N: 1.0 / points}[normalization]
        scale *= points if inverse else 1.0
        return spectrum if scale == 1.0 else op18.Mul(spectrum, op18.CastLike(scale, spectrum))
    if normalization == _BY_N and inverse:
        return spectrum
    if normalization == _BY_SQRT_N:
        factor = op18.Sqrt(points) if inverse else op18.Reciprocal(op18.Sqrt(points))
    elif inverse:  # no normalization: undo DFT's 1/n
        factor = points
    elif normalization == _BY_N:
        factor = op18.Reciprocal(points)
    else:
        return spectrum
    return op18.Mul(spectrum, factor)


def _dims(dim: Sequence[int], rank: int) -> list[int]:
    return [d % rank for d in dim]


def _r2c(self, dim: Sequence[int], normalization: int, onesided: bool, dft):
    dims = _dims(dim, rank_of(self))
    points = _size(self, dims)
    spectrum = dft(op18.Unsqueeze(self, op18.Constant(value_ints=[-1])), dims[-1], False, onesided)
    for d in dims[:-1]:
        spectrum = dft(spectrum, d, False, False)
    return _normalize(spectrum, normalization, points, inverse=False)


def _c2c(self, dim: Sequence[int], normalization: int, forward: bool, dft):
    dims = _dims(dim, rank_of(self) - 1)
    points = _size(self, dims)
    spectrum = self
    for d in dims:
        spectrum = dft(spectrum, d, not forward, False)
    return _normalize(spectrum, normalization, points, inverse=not forward)


def _c2r(self, dim: Sequence[int], normalization: int, last_dim_size: int, dft):
    dims = _dims(dim, rank_of(self) - 1)
    points = _size(self, dims[:-1], last_dim_size)
    spectrum = self
    for d in dims[:-1]:
        spectrum = dft(spectrum, d, True, False)
    bins = last_dim_size // 2 + 1 if isinstance(last_dim_size, int) else None
    if bins is not None and isinstance(self.shape[dims[-1]], int) and self.shape[dims[-1]] > bins:
        spectrum = op18.Slice(spectrum, [0], [bins], [dims[-1]])  # the first n/2 + 1 bins, as torch reads them
    signal = dft(spectrum, dims[-1], True, True, _scalar(last_dim_size))  # IRFFT: a real [..., 1]
    signal = op18.Squeeze(signal, op18.Constant(value_ints=[-1]))
    return _normalize(signal, normalization, points, inverse=True)


# the primitives have complex values on one side at least


@opreg.impl("aten::_fft_r2c", opset=18, complex=True)
@opreg.impl("aten::_fft_r2c", opset=20, complex=True)
def aten__fft_r2c(self: Tensor, dim: Sequence[int], normalization: int, onesided: bool, *, opset: int):
    """_fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor: DFT of each dim (onesided on the last), as a complex pair."""
    return _r2c(self, dim, normalization, onesided, _DFT[opset])


@opreg.impl("aten::_fft_c2c", opset=18, complex=True)
@opreg.impl("aten::_fft_c2c", opset=20, complex=True)
def aten__fft_c2c(self: Tensor, dim: Sequence[int], normalization: int, forward: bool, *, opset: int):
    """_fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward) -> Tensor: DFT (inverse unless forward) of each dim."""
    return _c2c(self, dim, normalization, forward, _DFT[opset])


@opreg.impl("aten::_fft_c2r", opset=18, complex=True)
@opreg.impl("aten::_fft_c2r", opset=20, complex=True)
def aten__fft_c2r(self: Tensor, dim: Sequence[int], normalization: int, last_dim_size: int, *, opset: int):
    """_fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size) -> Tensor: inverse DFT of each dim, the last one-sided (IRFFT) to a real signal."""
    return _c2r(self, dim, normalization, last_dim_size, _DFT[opset])


# -- stft and istft ---------------------------------------------------------------------------


def _window(window, win_length: int, n_fft: int, like):
    """torch's stft/istft window: ones when none is given, centred in n_fft zeros when shorter,
    of ``like``'s type."""
    if window is None:
        window = op18.Expand(op18.CastLike(1.0, like), op18.Constant(value_ints=[win_length]))
    else:
        window = op18.CastLike(window, like)
    if win_length < n_fft:
        left = (n_fft - win_length) // 2
        window = op18.Pad(window, op18.Constant(value_ints=[left, n_fft - win_length - left]))
    return window


def _stft(
    self,
    n_fft: int,
    hop_length,
    win_length,
    window,
    normalized: bool,
    onesided,
    align_to_window,
    center=False,
    pad_mode="",
):
    if align_to_window:
        raise ValueError("stft with align_to_window=True is not exported (torch pads the input to the window)")
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    pair = is_complex(self)
    batched = rank_of(self) - int(pair) == 2
    signal = self if batched else op18.Unsqueeze(self, op18.Constant(value_ints=[0]))
    if center:
        if pad_mode not in _PAD_MODES:
            raise ValueError(f"stft's pad_mode {pad_mode!r} has no ONNX Pad mode at opset 18")
        amount = n_fft // 2
        pads = [0, amount, 0, 0, amount, 0] if pair else [0, amount, 0, amount]
        signal = op18.Pad(signal, op18.Constant(value_ints=pads), mode=_PAD_MODES[pad_mode])
    if not pair:
        signal = op18.Unsqueeze(signal, op18.Constant(value_ints=[-1]))
    if window is not None and is_complex(window):
        raise ValueError("ONNX's STFT takes a real window; a complex one is not exported")
    part = signal if not pair else op18.Gather(signal, op18.Constant(value_int=0), axis=-1)
    frames = op18.STFT(
        signal,
        _scalar(hop),
        _window(window, win, n_fft, part) if window is not None or win < n_fft else None,
        _scalar(n_fft),
        onesided=int(not pair if onesided is None else onesided),
    )  # [batch, frames, bins, 2]
    spectrum = op18.Transpose(frames, perm=[0, 2, 1, 3])
    if normalized:
        spectrum = op18.Mul(spectrum, op18.CastLike(1.0 / math.sqrt(n_fft), spectrum))
    return spectrum if batched else op18.Squeeze(spectrum, op18.Constant(value_ints=[0]))


@opreg.impl("aten::stft", complex=True)
@opreg.impl("aten::stft")  # return_complex=False returns the pair as a real tensor
def aten_stft(
    self: Tensor,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Tensor | None = None,
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool | None = None,
    align_to_window: bool | None = None,
):
    """stft(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None, bool normalized=False, bool? onesided=None, bool? return_complex=None, bool? align_to_window=None) -> Tensor: STFT, frames and bins transposed to torch's order."""
    return _stft(self, n_fft, hop_length, win_length, window, normalized, onesided, align_to_window)


@opreg.impl("aten::stft.center", complex=True)
@opreg.impl("aten::stft.center")  # return_complex=False: the pair as a real tensor
def aten_stft_center(
    self: Tensor,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Tensor | None = None,
    center: bool = True,
    pad_mode: str = "reflect",
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool | None = None,
    align_to_window: bool | None = None,
):
    """stft.center(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None, bool center=True, str pad_mode="reflect", bool normalized=False, bool? onesided=None, bool? return_complex=None, bool? align_to_window=None) -> Tensor: Pad by n_fft/2 (center), then STFT."""
    return _stft(self, n_fft, hop_length, win_length, window, normalized, onesided, align_to_window, center, pad_mode)


def _overlap_add(frames, n_fft: int, hop: int, total):
    """Col2Im's overlap-add of ``[batch, n_fft, frames]`` into ``[batch, total]``."""
    image = op18.Concat(op18.Constant(value_ints=[1]), op18.Reshape(total, [1]), axis=0)
    added = op18.Col2Im(frames, image, op18.Constant(value_ints=[1, n_fft]), strides=[1, hop])  # [batch, 1, 1, total]
    return op18.Squeeze(added, op18.Constant(value_ints=[1, 2]))


def _istft(self, n_fft: int, hop_length, win_length, window, center: bool, normalized: bool, onesided, length, dft):
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    batched = rank_of(self) == 4  # [batch, bins, frames, 2]
    spectrum = self if batched else op18.Unsqueeze(self, op18.Constant(value_ints=[0]))
    two_sided = self.shape[-3] == n_fft if onesided is None else not onesided
    spectrum = op18.Transpose(spectrum, perm=[0, 2, 1, 3])  # [batch, frames, bins, 2]
    if two_sided:  # torch reads the first n_fft/2 + 1 bins, as a one-sided spectrum
        spectrum = op18.Slice(spectrum, [0], [n_fft // 2 + 1], [2])
    frames = op18.Squeeze(dft(spectrum, 2, True, True, _scalar(n_fft)), op18.Constant(value_ints=[-1]))
    if normalized:  # norm="ortho": 1/sqrt(n) where DFT divided by n
        frames = op18.Mul(frames, op18.CastLike(math.sqrt(n_fft), frames))
    window = _window(window, win, n_fft, frames)
    frames = op18.Transpose(op18.Mul(frames, window), perm=[0, 2, 1])  # [batch, n_fft, frames]
    count = op18.Shape(frames, start=2, end=3)
    total = op18.Add(op18.Mul(op18.Sub(count, 1), hop), n_fft)
    signal = _overlap_add(frames, n_fft, hop, total)
    squares = op18.Expand(op18.Unsqueeze(op18.Mul(window, window), [0, 2]), op18.Concat([1, n_fft], count, axis=0))
    envelope = _overlap_add(squares, n_fft, hop, total)
    start = n_fft // 2 if center else 0
    if length is not None:
        end = op18.Constant(value_ints=[start + length])
    else:
        end = op18.Sub(total, n_fft // 2) if center else total
    signal = op18.Div(op18.Slice(signal, [start], end, [1]), op18.Slice(envelope, [start], end, [1]))
    if length is not None:  # torch pads with zeros when the frames end before length
        missing = op18.Max(op18.Sub(op18.Constant(value_ints=[length]), op18.Shape(signal, start=1)), [0])
        signal = op18.Pad(signal, op18.Concat([0, 0, 0], missing, axis=0))
    return signal if batched else op18.Squeeze(signal, op18.Constant(value_ints=[0]))


@opreg.impl("aten::istft", opset=18, complex=True)
@opreg.impl("aten::istft", opset=20, complex=True)
def aten_istft(
    self: Tensor,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Tensor | None = None,
    center: bool = True,
    normalized: bool = False,
    onesided: bool | None = None,
    length: int | None = None,
    return_complex: bool = False,
    *,
    opset: int,
):
    """istft(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None, bool center=True, bool normalized=False, bool? onesided=None, int? length=None, bool return_complex=False) -> Tensor: inverse DFT of each frame (IRFFT), windowed, overlap-added (Col2Im) and divided by the window's own overlap-add."""
    if return_complex:
        raise ValueError("istft with return_complex=True is not exported (only real signals)")
    return _istft(self, n_fft, hop_length, win_length, window, center, normalized, onesided, length, _DFT[opset])
