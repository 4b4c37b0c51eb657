"""Padding: constant (constant_pad_nd), reflection and replication."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, node_arg, rank_of


@opreg.impl("aten::constant_pad_nd")
def aten_constant_pad_nd(self: Tensor, pad: Sequence[int], value: float = 0):
    """constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor: Pad (constant mode; negative pads crop)."""
    if isinstance(pad, ir.Value):  # some pads symbolic: the list as a 1-D INT64 tensor
        return op18.Pad(self, _onnx_pads(pad, rank_of(self)), op18.CastLike(value, self), mode="constant")
    rank = rank_of(self)
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i] = pad[2 * i]
        ends[rank - 1 - i] = pad[2 * i + 1]
    return op18.Pad(self, begins + ends, op18.CastLike(value, self), mode="constant")


def _onnx_pads(pad: ir.Value, rank: int) -> ir.Value:
    """torch's pads (a 1-D INT64 tensor: (begin, end) pairs from the last dim back) as ONNX Pad's
    (every dim's begin, then every dim's end)."""
    if pad.shape is None or not isinstance(pad.shape[0], int) or pad.shape[0] % 2:
        raise ValueError(f"constant_pad_nd needs an even, known number of pads, got shape {pad.shape}")
    covered = pad.shape[0] // 2
    pad = op18.Cast(pad, to=ir.DataType.INT64)
    leading = [op18.Constant(value=ir.tensor(np.zeros(rank - covered, np.int64)))] if covered < rank else []
    sides = []
    for side in (0, 1):  # the begins, then the ends; torch lists the last dim first
        sides += [*leading, *(op18.Slice(pad, [2 * d + side], [2 * d + side + 1]) for d in reversed(range(covered)))]
    return op18.Concat(*sides, axis=0)


def _pad_covered(node) -> bool:
    """Static pads and a mode ONNX Pad has at every opset here (not circular: ``wrap`` is opset 19)."""
    pad = node_arg(node, 1, "pad")
    static = isinstance(pad, (list, tuple)) and all(isinstance(p, int) for p in pad)
    return static and node_arg(node, 2, "mode", "constant") in ("constant", "reflect", "replicate")


@opreg.impl("aten::pad", predicate=_pad_covered)
def aten_pad(self: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None):
    """pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor: Pad (constant, reflect or edge)."""
    if mode == "constant":
        return aten_constant_pad_nd(self, pad, 0 if value is None else value)
    return _pad(self, pad, "reflect" if mode == "reflect" else "edge")


def _pad(self, padding, mode: str):
    if not isinstance(padding, (list, tuple)) or not all(isinstance(p, int) for p in padding):
        raise ValueError(f"{mode} padding needs static pad sizes, got {padding}")
    count = len(padding) // 2
    rank = rank_of(self)
    # torch lists (begin, end) pairs from the last dim backwards; ONNX all begins, then all ends.
    begins = [padding[2 * (count - 1 - i)] for i in range(count)]
    ends = [padding[2 * (count - 1 - i) + 1] for i in range(count)]
    if mode == "edge" and any(p < 0 for p in begins + ends):
        dims = list(self.shape[rank - count :])
        if not all(isinstance(d, int) for d in dims):
            raise ValueError(f"negative replication padding needs static sizes, got {self.shape}")
        # torch reads x[clamp(i - begin, 0, size - 1)], even where a negative pad crops
        # everything Pad would replicate from: a Gather per padded dim.
        for axis, (size, begin, end) in enumerate(zip(dims, begins, ends, strict=True), start=rank - count):
            if begin or end:
                indices = np.clip(np.arange(size + begin + end) - begin, 0, size - 1).astype(np.int64)
                self = op18.Gather(self, indices, axis=axis)
        return self
    lead = [0] * (rank - count)
    return op18.Pad(self, lead + begins + lead + ends, mode=mode)


def _static_pads(node) -> bool:
    """Static pad sizes: all reflection padding needs."""
    padding = node_arg(node, 1, "padding")
    return isinstance(padding, (list, tuple)) and all(isinstance(p, int) for p in padding)


@opreg.impl("aten::reflection_pad1d", predicate=_static_pads)
@opreg.impl("aten::reflection_pad2d", predicate=_static_pads)
@opreg.impl("aten::reflection_pad3d", predicate=_static_pads)
def aten_reflection_pad(self: Tensor, padding: Sequence[int]):
    """reflection_pad1d(Tensor self, SymInt[2] padding) -> Tensor: Pad (reflect).

    reflection_pad2d(Tensor self, SymInt[4] padding) -> Tensor: Pad (reflect).

    reflection_pad3d(Tensor self, SymInt[6] padding) -> Tensor: Pad (reflect)."""
    return _pad(self, padding, "reflect")


def _static_replication_pads(node) -> bool:
    """Static pads; negative ones (crops) need static sizes too, for a Gather per padded dim."""
    if not _static_pads(node):
        return False
    if all(p >= 0 for p in node_arg(node, 1, "padding")):
        return True
    value = node.args[0].meta.get("val")
    return value is not None and all(isinstance(d, int) for d in value.shape)


@opreg.impl("aten::replication_pad1d", predicate=_static_replication_pads)
@opreg.impl("aten::replication_pad2d", predicate=_static_replication_pads)
@opreg.impl("aten::replication_pad3d", predicate=_static_replication_pads)
def aten_replication_pad(self: Tensor, padding: Sequence[int]):
    """replication_pad1d(Tensor self, SymInt[2] padding) -> Tensor: Pad (edge).

    replication_pad2d(Tensor self, SymInt[4] padding) -> Tensor: Pad (edge).

    replication_pad3d(Tensor self, SymInt[6] padding) -> Tensor: Pad (edge)."""
    return _pad(self, padding, "edge")


def _pad_elsewhere(node) -> bool:
    """What :func:`aten_pad` passes over: some pads symbolic (any mode), or circular padding."""
    return not _pad_covered(node)


@opreg.impl("aten::pad", predicate=_pad_elsewhere)
def aten_pad_indexed(self: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None):
    """pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor, with symbolic pads or
    circular: Pad (constant mode, the pads as a tensor), else a Gather per padded dim of the source index of every
    output position (reflect, clamped for replicate, modulo the size for circular; negative pads crop)."""
    if mode == "constant":
        return aten_constant_pad_nd(self, pad, 0 if value is None else value)
    if mode not in _SOURCES:
        raise ValueError(f"pad mode {mode!r} is not one of constant, {', '.join(_SOURCES)}")
    symbolic = isinstance(pad, ir.Value)
    if symbolic:
        pad = op18.Cast(pad, to=ir.DataType.INT64)
    count = (pad.shape[0] if symbolic else len(pad)) // 2
    rank = rank_of(self)
    for i in range(count):  # torch lists (begin, end) pairs from the last dim backwards
        begin, end = (_pad_entry(pad, 2 * i + side) for side in (0, 1))
        if isinstance(begin, int) and isinstance(end, int) and begin == end == 0:
            continue
        axis = rank - 1 - i
        size = op18.Reshape(op18.Shape(self, start=axis, end=axis + 1), [])
        positions = op18.Range(op18.Neg(_scalar(begin)), op18.Add(size, _scalar(end)), _scalar(1))
        begin, end = _scalar(begin), _scalar(end)
        self = op18.Gather(self, _SOURCES[mode](positions, size, begin, end), axis=axis)
    return self


def _pad_entry(pad, index: int):
    """Entry ``index`` of torch's pads: an int, or a 0-d INT64 value of the pads' tensor."""
    if isinstance(pad, ir.Value):
        return op18.Reshape(op18.Slice(pad, [index], [index + 1]), [])
    return pad[index]


def _scalar(entry):
    return op18.Constant(value_int=entry) if isinstance(entry, int) else entry


def _reflected(positions, size, begin, end):
    last = op18.Sub(size, _scalar(1))
    return op18.Sub(last, op18.Abs(op18.Sub(last, op18.Abs(positions))))


def _replicated(positions, size, begin, end):
    return op18.Max(op18.Min(positions, op18.Sub(size, _scalar(1))), _scalar(0))


def _wrapped(positions, size, begin, end):
    # torch crops first (negative pads), then wraps around what is left: ``kept`` from ``first`` on
    first, cut = op18.Max(op18.Neg(begin), _scalar(0)), op18.Max(op18.Neg(end), _scalar(0))
    kept = op18.Sub(op18.Sub(size, first), cut)
    return op18.Add(first, op18.Mod(op18.Sub(positions, first), kept))


_SOURCES = {"reflect": _reflected, "replicate": _replicated, "circular": _wrapped}
"""Per non-constant mode: the source index of every output position (``positions``: output index minus the
begin pad) along a dim of ``size`` padded by ``begin`` and ``end`` (0-d INT64 values)."""
