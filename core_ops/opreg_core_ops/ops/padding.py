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
