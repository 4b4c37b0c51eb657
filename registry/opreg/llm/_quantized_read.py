"""Each quantized format's layer as :class:`opreg.weights.StoredBlocks` (see
:mod:`opreg.llm._quantized`), and a checkpoint's weights with each quantized layer's tensors read
so (:func:`stored_weights`): one function per format (:data:`READERS`), taking the
layer's name, its tensors (lazy, by their last name part) and the :class:`~opreg.llm._quantized.Scheme`,
returning the layer's float ``weight`` (the dequantization, read only by an eager comparison)
carrying the stored blocks. Every check is made here, from the tensors' shapes and dtypes and the
small ``g_idx`` and ``weight_shape`` tensors, before anything is captured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.llm._quantized import AWQ_ORDER, MAIN, MAX_BLOCK, Scheme
from opreg.weights import LazyWeight, StoredBlocks, TensorSpec, cast, rowwise, transpose

Parts = Mapping[str, LazyWeight]


def stored_weights(weights: Any, scheme: Scheme, what: str) -> Any:
    """``weights`` (:class:`opreg.weights.Weights` of the checkpoint) with each quantized layer's
    tensors replaced by its float ``weight``, whose :attr:`~opreg.weights.LazyWeight.stored` holds
    them as MatMulNBits reads them; every layer checked now (shapes, group sizes, act-order),
    each refusal naming its tensor."""
    if sys.byteorder != "little":
        raise ExportError(f"{what}: quantized checkpoints are read on little-endian hosts only")
    main = MAIN[scheme.method]
    layers = sorted(name[: -len(main) - 1] for name in weights if name.endswith("." + main))
    if not layers:
        raise ExportError(
            f"{what}'s config says {scheme.name} but it holds no '*.{main}' tensor: give the quantized checkpoint's "
            "safetensors files"
        )
    read: Callable[..., LazyWeight] = READERS[scheme.method]
    tensors = {name: tensor for name, tensor in weights.items()}
    for prefix in layers:
        parts = {name[len(prefix) + 1 :]: tensors.pop(name) for name in list(tensors) if _of(name, prefix)}
        tensors[f"{prefix}.weight"] = read(prefix, parts, scheme)
    return type(weights)(tensors, weights.origin)


def _of(name: str, prefix: str) -> bool:
    """Whether ``name`` is one of the quantized layer ``prefix``'s tensors (not its bias)."""
    return name.startswith(prefix + ".") and "." not in name[len(prefix) + 1 :] and not name.endswith(".bias")


def gptq(prefix: str, parts: Parts, scheme: Scheme) -> LazyWeight:
    """A GPTQ layer: ``qweight`` packed along K, ``qzeros`` along N (less ``zero_offset``), ``g_idx``."""
    bits, per = scheme.bits, 32 // scheme.bits
    qweight, scales, qzeros = (_need(parts, prefix, name, scheme) for name in ("qweight", "scales", "qzeros"))
    k, n = int(qweight.shape[0]) * per, int(qweight.shape[1])
    groups = _groups(scales, (None, n), prefix, "scales", k)
    _shape(qzeros, (groups, n // per), prefix, "qzeros", torch.int32)
    _shape(qweight, (k // per, n), prefix, "qweight", torch.int32)
    order = _act_order(parts.get("g_idx"), k, k // groups, f"{prefix}.g_idx")
    block = _block(k // groups, k, f"{prefix}.scales")
    by_row = transpose(qweight, [1, 0])  # (N, K * bits / 32): each row's words hold its K values in order
    packed = _packed(by_row, n, k, bits, block, order, f"{prefix}.qweight")
    mask = (1 << bits) - 1

    def zeros() -> torch.Tensor:
        values = (_unpack(qzeros.torch(), bits) + scheme.zero_offset) & mask  # (groups, N)
        return pack(values.T.repeat_interleave(k // groups // block, 1), bits)

    zero_points = _whole(zeros, _zero_shape(n, k // block, bits), f"{prefix}.qzeros", qzeros)
    stored_scales = _scales(cast(transpose(scales, [1, 0]), torch.float32), k // groups // block)
    source = f"GPTQ tensors {prefix}.*"
    return dequantized(StoredBlocks(bits, block, packed, stored_scales, zero_points, order, source), prefix)


def awq(prefix: str, parts: Parts, scheme: Scheme) -> LazyWeight:
    """An AWQ (GEMM) layer: ``qweight`` and ``qzeros`` packed along N in AWQ's order."""
    bits, per = scheme.bits, 32 // scheme.bits
    if bits != 4:
        raise ExportError(f"{prefix}.qweight: AWQ's GEMM layout is 4 bits; its config says {bits}")
    qweight, scales, qzeros = (_need(parts, prefix, name, scheme) for name in ("qweight", "scales", "qzeros"))
    k, n = int(qweight.shape[0]), int(qweight.shape[1]) * per
    groups = _groups(scales, (None, n), prefix, "scales", k)
    _shape(qzeros, (groups, n // per), prefix, "qzeros", torch.int32)
    _shape(qweight, (k, n // per), prefix, "qweight", torch.int32)
    block = _block(k // groups, k, f"{prefix}.scales")
    reverse = torch.tensor([AWQ_ORDER.index(i) for i in range(per)])

    def columns(words: torch.Tensor) -> torch.Tensor:  # (rows, N / 8) words -> (rows, N) in column order
        values = _unpack(words, bits).reshape(words.shape[0], -1, per)
        return values[..., reverse].reshape(words.shape[0], -1)

    def weight() -> torch.Tensor:
        return pack(columns(qweight.torch()).T, bits).reshape(n, k // block, block * bits // 8)

    def zeros() -> torch.Tensor:
        return pack(columns(qzeros.torch()).T.repeat_interleave(k // groups // block, 1), bits)

    packed = _whole(weight, (n, k // block, block * bits // 8), f"{prefix}.qweight", qweight)
    zero_points = _whole(zeros, _zero_shape(n, k // block, bits), f"{prefix}.qzeros", qzeros)
    stored_scales = _scales(cast(transpose(scales, [1, 0]), torch.float32), k // groups // block)
    source = f"AWQ tensors {prefix}.*"
    return dequantized(StoredBlocks(bits, block, packed, stored_scales, zero_points, None, source), prefix)


def compressed_tensors(prefix: str, parts: Parts, scheme: Scheme) -> LazyWeight:
    """A compressed-tensors ``pack-quantized`` layer: ``weight_packed`` packed along K (values offset
    by the midpoint), ``weight_zero_point`` along N, ``weight_shape``, ``weight_g_idx``."""
    bits, per = scheme.bits, 32 // scheme.bits
    packed_words, scale, shape = (
        _need(parts, prefix, name, scheme) for name in ("weight_packed", "weight_scale", "weight_shape")
    )
    n, k = (int(v) for v in shape.torch().reshape(-1).tolist())
    _shape(packed_words, (n, -(-k // per)), prefix, "weight_packed", torch.int32)
    groups = _groups(scale, (n, None), prefix, "weight_scale", k)
    order = _act_order(parts.get("weight_g_idx"), k, k // groups, f"{prefix}.weight_g_idx")
    block = _block(k // groups, k, f"{prefix}.weight_scale")
    packed = _packed(packed_words, n, k, bits, block, order, f"{prefix}.weight_packed")
    zero_points = None
    stored = parts.get("weight_zero_point")
    if stored is not None:
        _shape(stored, (-(-n // per), groups), prefix, "weight_zero_point", torch.int32)

        def zeros() -> torch.Tensor:  # unsigned: the signed zero point plus the midpoint, as the values are
            values = _unpack(stored.torch().T.contiguous(), bits)[:, :n]  # (groups, N)
            return pack(values.T.repeat_interleave(k // groups // block, 1), bits)

        zero_points = _whole(zeros, _zero_shape(n, k // block, bits), f"{prefix}.weight_zero_point", stored)
    stored_scales = _scales(cast(scale, torch.float32), k // groups // block)
    source = f"compressed-tensors tensors {prefix}.*"
    return dequantized(StoredBlocks(bits, block, packed, stored_scales, zero_points, order, source), prefix)


# -- checks ---------------------------------------------------------------------------------------------------


def _need(parts: Parts, prefix: str, name: str, scheme: Scheme) -> LazyWeight:
    if name not in parts:
        raise ExportError(
            f"{prefix}.{name} is missing: a {scheme.name} layer stores it beside {prefix}.{sorted(parts)[0]}; give the "
            "whole checkpoint (every shard its index names)"
        )
    return parts[name]


def _shape(tensor: LazyWeight, shape: tuple[int, ...], prefix: str, name: str, dtype: torch.dtype) -> None:
    if list(tensor.shape) != list(shape) or tensor.torch_dtype != dtype:
        raise ExportError(
            f"{prefix}.{name} is {str(tensor.torch_dtype).removeprefix('torch.')} {list(tensor.shape)} where its "
            f"layer's other tensors make it {str(dtype).removeprefix('torch.')} {list(shape)}: an unexpected layout "
            "(another packing, or zero points of another axis); it cannot be read as it is stored"
        )


def _groups(scales: LazyWeight, shape: tuple[int | None, int | None], prefix: str, name: str, k: int) -> int:
    """The groups along K that ``scales`` (of ``shape``, ``None`` the groups' dim) holds, refused
    where they do not cut K into equal groups."""
    axis = shape.index(None)
    want = [int(scales.shape[axis]) if d is None else d for d in shape]
    if len(scales.shape) != 2 or list(scales.shape) != want or not scales.torch_dtype.is_floating_point:
        raise ExportError(f"{prefix}.{name} is {list(scales.shape)}: the layer's other tensors make it {shape}")
    groups = int(scales.shape[axis])
    if groups == 0 or k % groups:
        raise ExportError(f"{prefix}.{name} holds {groups} groups for {k} input channels: not equal groups")
    return groups


def _block(group: int, k: int, name: str) -> int:
    """MatMulNBits' block for groups of ``group`` values: the largest power of two dividing it,
    at most :data:`MAX_BLOCK`, at least 16 (a group is then whole blocks sharing a scale)."""
    block = min(group & -group, MAX_BLOCK)
    if block < 16:
        raise ExportError(
            f"{name}: groups of {group} input channels (of {k}); MatMulNBits' blocks are powers of two from 16, so a "
            "group must be a multiple of 16 to be whole blocks"
        )
    return block


def _act_order(g_idx: LazyWeight | None, k: int, group: int, name: str) -> torch.Tensor | None:
    """``None`` where ``g_idx`` is absent or each input channel ``k`` is in group ``k // group``;
    else the input channels in group order (act-order), refused unless every group has ``group``."""
    if g_idx is None:
        return None
    values = g_idx.torch().reshape(-1).long()
    expected = torch.arange(k) // group
    if values.numel() != k:
        raise ExportError(f"{name} has {values.numel()} entries for {k} input channels")
    if torch.equal(values, expected):
        return None
    order = torch.sort(values, stable=True).indices
    if not torch.equal(values[order], expected):
        raise ExportError(
            f"{name}: act-order groups of unequal sizes (each of {k // group} groups must hold {group} input "
            "channels): MatMulNBits' blocks cannot hold them"
        )
    return order


# -- tensors -----------------------------------------------------------------------------------------------


def _unpack(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words ``(..., W)`` as their values ``(..., W * 32 / bits)``, the lowest bits first."""
    per = 32 // bits
    shifts = torch.arange(per, dtype=torch.int32) * bits
    values = (words.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(*words.shape[:-1], words.shape[-1] * per)


def pack(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Values ``(..., m)`` of ``bits`` as bytes ``(..., ceil(m * bits / 8))``, the lowest bits first."""
    per = 8 // bits
    padded = torch.nn.functional.pad(values.to(torch.int32), (0, -values.shape[-1] % per))
    shifts = torch.arange(per, dtype=torch.int32) * bits
    made = (padded.reshape(*padded.shape[:-1], -1, per) << shifts).sum(-1)
    return made.to(torch.uint8)


def _packed(
    words: LazyWeight, n: int, k: int, bits: int, block: int, order: torch.Tensor | None, name: str
) -> LazyWeight:
    """MatMulNBits' ``B`` from ``(N, K * bits / 32)`` int32 words packed along K, lowest bits first
    (their bytes, a run of rows at a time; in act-order, each row's values reordered)."""
    shape = (n, k // block, block * bits // 8)

    def rows(run: torch.Tensor) -> list[torch.Tensor]:
        if order is None:
            return [run.contiguous().view(torch.uint8).reshape(-1, *shape[1:])]
        return [pack(_unpack(run, bits)[:, :k][:, order], bits).reshape(-1, *shape[1:])]

    return rowwise(words, rows, [TensorSpec(torch.uint8, shape, name)], "MatMulNBits blocks")[0]


def _zero_shape(n: int, blocks: int, bits: int) -> tuple[int, int]:
    return (n, -(-blocks * bits // 8))


def _whole(make: Callable[[], torch.Tensor], shape: tuple[int, ...], name: str, source: LazyWeight) -> LazyWeight:
    """A tensor ``make()`` computes whole (a layer's zero points; AWQ's reordered weight)."""
    return LazyWeight(
        lambda start, stop: make()[start:stop], torch.uint8, shape, name=name, how=f"repacked from {source.name}",
        sources=[source], whole=True,
    )  # fmt: skip


def _scales(scales: LazyWeight, times: int) -> LazyWeight:
    """``(N, groups)`` scales, each repeated ``times`` (a group of several MatMulNBits blocks)."""
    if times == 1:
        return scales
    shape = (int(scales.shape[0]), int(scales.shape[1]) * times)

    def rows(run: torch.Tensor) -> list[torch.Tensor]:
        return [run.repeat_interleave(times, 1)]

    return rowwise(scales, rows, [TensorSpec(torch.float32, shape, str(scales.name))], "scales per block")[0]


def dequantized(blocks: StoredBlocks, prefix: str) -> LazyWeight:
    """The layer's ``(N, K)`` float32 weight, ``(q - zero_point) * scale`` of ``blocks`` (what a
    library's reader computes; read only by an eager comparison), carrying ``blocks``."""
    n, count, _ = (int(d) for d in blocks.packed.shape)
    bits, block = blocks.bits, blocks.block_size
    k = blocks.input_channels

    def read(start: int, stop: int) -> torch.Tensor:
        values = _unpack_bytes(blocks.packed.rows(start, stop).reshape(stop - start, -1), bits)
        if blocks.zero_points is None:
            zeros = torch.full((stop - start, count), 1 << (bits - 1), dtype=torch.int32)
        else:
            zeros = _unpack_bytes(blocks.zero_points.rows(start, stop), bits)[:, :count]
        scales = blocks.scales.rows(start, stop)
        weight = (values - zeros.repeat_interleave(block, 1)).float() * scales.repeat_interleave(block, 1)
        weight = weight[:, :k]  # the last block's padding
        if blocks.order is None:
            return weight
        made = torch.empty_like(weight)
        made[:, blocks.order] = weight
        return made

    weight = LazyWeight(read, torch.float32, (n, k), name=f"{prefix}.weight", how=f"{blocks.source}, dequantized",
                        sources=[blocks.packed], whole=True)  # fmt: skip
    weight.stored = blocks
    return weight


def _unpack_bytes(values: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32) * bits
    unpacked = (values.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return unpacked.reshape(*values.shape[:-1], -1)


READERS: dict[str, Callable[[str, Parts, Scheme], LazyWeight]] = {
    "gptq": gptq, "awq": awq, "compressed-tensors": compressed_tensors,
}  # fmt: skip
"""Each format's reader of a layer, by its ``quant_method``."""
