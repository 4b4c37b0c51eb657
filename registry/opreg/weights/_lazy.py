"""Lazy weights and the transforms an export applies to them (see :mod:`opreg.weights`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from opreg.errors import WeightsError

if TYPE_CHECKING:
    import torch


CACHED_ELEMENTS = 64
"""A lazy weight of at most this many elements keeps its values once read: shape inference and the
translation memo take such small constants as data, each time they meet them."""

Rows = Callable[[int, int], "torch.Tensor"]
"""``rows(start, stop)``: rows ``start`` to ``stop`` of a tensor's first dim, as a CPU torch tensor."""


class LazyWeight(ir.LazyTensor):
    """An initializer computed when it is read: ``rows(start, stop)`` gives any run of its rows.

    ``numpy()`` and ``tobytes()`` compute the whole tensor (and hold it only for the call);
    ``tofile()``, what ``onnx_ir`` calls to write external data, computes and writes
    :attr:`chunk_bytes` at a time, so the largest weight is never whole in memory.

    Attributes:
        chunk_bytes: how many bytes of work (:attr:`row_bytes` per row) are computed and written
            at a time (64 MiB; a run of whole rows, at least one).
        torch_dtype: its element type as a ``torch.dtype``.
        how: what it is computed from, for messages and the model's ``opreg.folded_weights``.
    """

    chunk_bytes = 64 * 2**20

    def __init__(
        self,
        rows: Rows,
        dtype: torch.dtype,
        shape: Sequence[int],
        *,
        name: str | None,
        how: str,
        sources: Sequence[LazyWeight] = (),
        whole: bool = False,
        held: bool = False,
        views: bool = False,
    ) -> None:
        from onnx_ir.tensor_adapters import from_torch_dtype

        super().__init__(self._whole, dtype=from_torch_dtype(dtype), shape=ir.Shape(list(shape)), name=name)
        self.cache = self.size <= CACHED_ELEMENTS  # read again and again as data by shape inference
        self._rows = rows
        self._sources = tuple(sources)
        self._whole_source = whole
        self._held = held
        self._views = views  # rows() gives values to cast to torch_dtype, maybe strided: see view()
        self.torch_dtype = dtype
        self.how = how
        self.transposed: tuple[LazyWeight, tuple[int, ...]] | None = None
        """``(source, perm)`` when this is ``source`` stored with its dims permuted (:func:`transpose`)."""
        self.parts: tuple[tuple[LazyWeight, ...], int] | None = None
        """``(parts, axis)`` when this is ``parts`` concatenated along ``axis`` (:func:`concat`)."""
        self.stored: StoredBlocks | None = None
        """The integers, scales and zero points a quantized checkpoint stores this ``(N, K)`` weight
        as, when its values are their dequantization: a pass writing block-quantized weights reads
        them as they are (:class:`StoredBlocks`)."""

    def __repr__(self) -> str:
        return f"LazyWeight({self.name!r}, {self.torch_dtype}, {list(self.shape)}, {self.how})"

    def named(self, name: str) -> LazyWeight:
        """The same values under another initializer name (a tied weight has one per name)."""
        if name == self.name:
            return self
        renamed = LazyWeight(
            self._rows, self.torch_dtype, self.shape, name=name, how=self.how, sources=self._sources,
            whole=self._whole_source, held=self._held, views=self._views,
        )  # fmt: skip
        renamed.transposed, renamed.parts, renamed.stored = self.transposed, self.parts, self.stored
        return renamed

    @property
    def length(self) -> int:
        """The rows: the size of the first dim (1 for a 0-d tensor)."""
        return int(self.shape[0]) if len(self.shape) else 1

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start`` to ``stop`` (a 0-d tensor has one row: itself), checked against the
        declared dtype and shape."""
        stop = min(stop, self.length)
        got = _dense(self._rows(start, stop), self.torch_dtype) if self._views else self._rows(start, stop)
        return self._checked(got, start, stop)

    def _checked(self, got: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        want = [stop - start, *self.shape[1:]] if len(self.shape) else []
        if got.dtype != self.torch_dtype or list(got.shape) != want:
            raise WeightsError(
                f"weight {self.name!r} ({self.how}) gave {got.dtype} rows of shape {list(got.shape)} where "
                f"{self.torch_dtype} {want} was declared"
            )
        return got

    def torch(self) -> torch.Tensor:
        """The whole tensor (computed now)."""
        return self.rows(0, self.length)

    def view(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start`` to ``stop`` as values whose cast to :attr:`torch_dtype` they are, not yet
        cast nor made contiguous where the transforms leave that to the end (a bfloat16 checkpoint's
        weight transposed and cast: one copy that does both, the cost of the cast alone)."""
        return self._rows(start, min(stop, self.length)) if self._views else self.rows(start, stop)

    @property
    def row_bytes(self) -> int:
        """The bytes a row costs to compute: its own, or a source's row if larger (a bfloat16 row
        cast to float32 and quantized to 4 bits reads more than it makes)."""
        own = self.nbytes // max(self.length, 1)
        return max(1, own, *(source.row_bytes for source in self._sources))

    @property
    def held(self) -> bool:
        """Whether its values come from a tensor the process holds (a module's weight in memory), not
        from a checkpoint read as it is written: a whole copy of a held weight adds to the weights
        already in memory, while a streamed weight is the only one in memory as it is written."""
        return self._held or any(source.held for source in self._sources)

    @property
    def reads_whole(self) -> bool:
        """Whether any run of rows reads a whole source (a transpose, or what is made from one):
        then the tensor is computed in one run, not read again for each."""
        return self._whole_source or any(source.reads_whole for source in self._sources)

    def chunks(self) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` runs of rows costing about :attr:`chunk_bytes` each (:attr:`row_bytes`),
        covering the tensor (one run where it :attr:`reads_whole`)."""
        step = self.length if self.reads_whole else max(1, self.chunk_bytes // self.row_bytes)
        for start in range(0, self.length, step):
            yield start, min(start + step, self.length)

    def _whole(self) -> ir.TensorProtocol:
        from onnx_ir.tensor_adapters import TorchTensor

        return TorchTensor(self.torch().contiguous(), name=self.name)

    def tofile(self, file: Any) -> None:
        from onnx_ir.tensor_adapters import TorchTensor

        for start, stop in self.chunks():
            made = _into_scratch(self._rows(start, stop), self.torch_dtype) if self._views else None
            rows = self.rows(start, stop).contiguous() if made is None else self._checked(made, start, stop)
            TorchTensor(rows).tofile(file)
        _worked(self.row_bytes * self.length)


_scratch: list[torch.Tensor] = []  # the buffer rows are made in as they are written, once made


def _into_scratch(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``values`` cast to ``dtype`` and contiguous in a buffer reused from one run of rows (and one weight)
    to the next, which :meth:`LazyWeight.tofile` writes before it makes the next: a fresh buffer of
    64 MiB costs 4x its copy in page faults (measured). ``None`` where ``values`` need no copy, or
    are bigger than two chunks (the buffer is kept until :func:`release_freed_memory`)."""
    import torch

    nbytes = values.numel() * dtype.itemsize
    if (values.dtype == dtype and values.is_contiguous()) or nbytes > 2 * LazyWeight.chunk_bytes:
        return None
    if not _scratch or _scratch[0].numel() < nbytes:
        _scratch[:] = [torch.empty(nbytes, dtype=torch.uint8)]
    return _scratch[0][:nbytes].view(dtype).view(values.shape).copy_(values)


TRIM_EVERY = 512 * 2**20
"""The bytes of work (:attr:`LazyWeight.row_bytes` per row) written between two
:func:`release_freed_memory` calls of :meth:`LazyWeight.tofile`."""

_work = [0]  # the bytes of work written since the last call


def _worked(nbytes: int) -> None:
    """``nbytes`` of work written: the freed memory handed back once :data:`TRIM_EVERY` of it is.
    A trim after each weight cost a third of a 0.5B model's save (2 of 6 s of CPU: each trim walks
    the heap, and the next weight faults its pages in again) for no lower peak than this."""
    _work[0] += nbytes
    if _work[0] >= TRIM_EVERY:
        _work[0] = 0
        release_freed_memory()


def release_freed_memory() -> None:
    """Hand memory freed by the process back to the system (glibc's ``malloc_trim``): glibc keeps
    large freed blocks for reuse, so a process that computes one weight after another would grow by
    its largest weights' working memory (measured: 0.5B int4, a peak of 1.58 GB without, 0.84 GB
    with). Nothing on another C library."""
    _scratch.clear()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def lazy(tensor: Any, name: str | None = None) -> LazyWeight:
    """``tensor`` (a :class:`LazyWeight`, a torch tensor or any ``onnx_ir`` tensor) as a lazy
    weight; one already lazy is returned as it is."""
    import torch
    from onnx_ir.tensor_adapters import TorchTensor, to_torch_dtype

    if isinstance(tensor, LazyWeight):
        return tensor
    if isinstance(tensor, TorchTensor):
        tensor = tensor.raw
    if isinstance(tensor, torch.Tensor):
        if tensor.device.type == "meta":
            raise WeightsError(f"weight {name!r} is on the meta device: it has no values to write")
        kept = tensor.detach()
        return LazyWeight(
            lambda a, b: _slice(kept, a, b), kept.dtype, kept.shape, name=name, how="in memory", held=True
        )
    source = tensor
    dtype = to_torch_dtype(source.dtype)

    def read(start: int, stop: int) -> torch.Tensor:
        return _slice(_as_torch(source), start, stop)

    return LazyWeight(read, dtype, list(source.shape), name=name or source.name, how="an onnx_ir tensor", held=True)


def _as_torch(tensor: ir.TensorProtocol) -> torch.Tensor:
    """An ``onnx_ir`` tensor's values as a torch tensor."""
    import numpy as np
    import torch
    from onnx_ir.tensor_adapters import to_torch_dtype

    dtype = to_torch_dtype(tensor.dtype)
    raw = np.frombuffer(tensor.tobytes(), dtype=np.uint8).copy()
    return torch.from_numpy(raw).view(dtype).reshape(list(tensor.shape))


def _dense(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` cast to ``dtype`` and contiguous, in one copy (none if they already are)."""
    import torch

    if values.dtype == dtype and values.is_contiguous():
        return values
    return torch.empty(values.shape, dtype=dtype).copy_(values)


def _slice(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return tensor if tensor.dim() == 0 else tensor[start:stop]


# -- transforms -------------------------------------------------------------------------------


def cast(weight: Any, dtype: torch.dtype, name: str | None = None) -> LazyWeight:
    """``weight`` in ``dtype`` (``Tensor.to``'s rounding); itself if it already has it."""
    source = lazy(weight)
    if source.torch_dtype == dtype:
        return source

    def view(start: int, stop: int) -> torch.Tensor:  # the cast left to the copy that makes the rows
        values = source.view(start, stop)
        return values if values.dtype == source.torch_dtype else _dense(values, source.torch_dtype)

    return LazyWeight(
        view,
        dtype,
        list(source.shape),
        name=name or source.name,
        how=f"{source.how}, cast to {dtype}",
        sources=[source],
        views=True,
    )


def transpose(weight: Any, perm: Sequence[int], name: str | None = None) -> LazyWeight:
    """``weight`` stored with its dims permuted by ``perm`` (the whole source is read for each run
    of rows that is not along its own first dim: for weights small enough to transpose). A
    transpose of a transpose permutes the first source once (none: the source itself, renamed), and
    a 2-D transpose of a concatenation concatenates the parts transposed: MatMulNBits quantizes the
    ``(N, K)`` rows of a weight stored ``(K, N)`` for MatMul from the checkpoint's own rows."""
    source = outer = lazy(weight)
    perm = [int(p) for p in perm]
    if source.transposed is not None:  # a transpose of a transpose: one permutation of the first source
        source, first = source.transposed
        perm = [first[p] for p in perm]
        if perm == sorted(perm):
            return source.named(name or outer.name)
    elif source.parts is not None and len(perm) == 2 and perm == [1, 0]:  # (A | B)^T: A^T over B^T
        parts, axis = source.parts
        return concat([transpose(part, perm) for part in parts], 1 - axis, name=name or outer.name)
    shape = [source.shape[p] for p in perm]
    if perm and perm[0] == 0:

        def read(start: int, stop: int) -> torch.Tensor:
            return source.view(start, stop).permute(perm)
    else:

        def read(start: int, stop: int) -> torch.Tensor:
            return _slice(source.view(0, source.length).permute(perm), start, stop)

    made = LazyWeight(
        read, source.torch_dtype, shape, name=name or source.name, how=f"transpose(perm={perm})",
        sources=[source], whole=not (perm and perm[0] == 0), views=True,
    )  # fmt: skip
    made.transposed = (source, tuple(perm))
    return made


def finite(weight: Any, use: str) -> LazyWeight:
    """``weight``, refused as its rows are read if they hold a NaN or an infinity: a
    :class:`opreg.WeightsError` naming it, its source and ``use`` (why what reads them cannot take
    one: block quantization would make a NaN a number), raised before they reach it."""
    import torch

    source = lazy(weight)

    def read(start: int, stop: int) -> torch.Tensor:
        values = source.view(start, stop)
        bad = ~torch.isfinite(values)
        if bool(bad.any()):
            nan = int(torch.isnan(values).sum())
            raise WeightsError(
                f"weight {source.name!r} ({source.how}) holds {nan} NaN and {int(bad.sum()) - nan} infinite values "
                f"in rows {start} to {stop}: {use}; fix the checkpoint, or keep the weight out of what reads it so "
                f"(MatMulNBitsQuantization(exclude=[{source.name!r}]) keeps it float)"
            )
        return values

    return LazyWeight(
        read, source.torch_dtype, list(source.shape), name=source.name, how=source.how, sources=[source], views=True
    )


def concat(weights: Sequence[Any], axis: int, name: str | None = None) -> LazyWeight:
    """``weights`` concatenated along ``axis``; along the first dim each run of rows reads only
    the parts it spans, along another each part gives the same run of rows."""
    import torch

    parts = [lazy(w) for w in weights]
    first = parts[0]
    rank = len(first.shape)
    axis = axis % rank
    shape = list(first.shape)
    shape[axis] = sum(int(p.shape[axis]) for p in parts)
    if axis == 0:
        offsets = []
        at = 0
        for part in parts:
            offsets.append((at, at + part.length, part))
            at += part.length

        def read(start: int, stop: int) -> torch.Tensor:
            pieces = [(a, p.view(max(start, a) - a, min(stop, b) - a)) for a, b, p in offsets if a < stop and start < b]
            if len(pieces) == 1:
                return pieces[0][1]
            made = torch.empty([stop - start, *shape[1:]], dtype=first.torch_dtype)
            for a, piece in pieces:  # each part copied (and cast, transposed) once, into its place
                at = max(start, a) - start
                made[at : at + len(piece)].copy_(piece)
            return made
    else:

        def read(start: int, stop: int) -> torch.Tensor:
            made = torch.empty([stop - start, *shape[1:]], dtype=first.torch_dtype)
            at = 0
            for part in parts:  # each part copied (and cast, transposed) once, into its place
                width = int(part.shape[axis])
                made.narrow(axis, at, width).copy_(part.view(start, stop))
                at += width
            return made

    names = ", ".join(str(p.name) for p in parts)
    how = f"concat([{names}], axis={axis})"
    made = LazyWeight(read, first.torch_dtype, shape, name=name, how=how, sources=parts, views=True)
    made.parts = (tuple(parts), axis)
    return made


def scaled(weight: Any, factors: Any, axis: int, groups: int = 1, name: str | None = None) -> LazyWeight:
    """``weight`` times ``factors`` (a small 1-D array, one factor per index of ``axis``) broadcast
    along ``axis``: batch norm folded into the layer before it. ``groups`` > 1 (a grouped
    ConvTranspose, weight ``(in, out / groups, ...)``): ``factors`` holds ``groups * out / groups``
    values, group ``g``'s for the rows of group ``g``."""
    import torch

    source = lazy(weight)
    rank = len(source.shape)
    values = torch.as_tensor(factors)
    if groups > 1:
        per_group = source.length // groups
        table = values.reshape(groups, -1)

        def read(start: int, stop: int) -> torch.Tensor:
            rows = table[torch.arange(start, stop) // per_group]  # (rows, out / groups)
            return source.rows(start, stop) * rows.reshape(*rows.shape, *([1] * (rank - 2)))
    elif axis == 0:

        def read(start: int, stop: int) -> torch.Tensor:
            return source.rows(start, stop) * values[start:stop].reshape(-1, *([1] * (rank - 1)))
    else:
        broadcast = values.reshape([-1 if i == axis else 1 for i in range(rank)])

        def read(start: int, stop: int) -> torch.Tensor:
            return source.rows(start, stop) * broadcast

    return LazyWeight(
        read, source.torch_dtype, list(source.shape), name=name or source.name,
        how=f"{source.name} scaled along axis {axis}", sources=[source],
    )  # fmt: skip


def low_rank_added(weight: Any, up: Any, down: Any, scale: float, name: str | None = None) -> LazyWeight:
    """``weight + scale * up @ down``: a LoRA adapter's product folded into the ``(out, in)`` weight
    of a linear layer (``up``: its ``(out, rank)`` B, ``down``: its ``(rank, in)`` A), computed and
    kept in float32 (a bfloat16 checkpoint's sum is not rounded back to bfloat16: the float32 model
    PEFT merges into holds it whole), row by row of ``weight`` (``down`` read whole, once per run of
    rows: it is small)."""
    import torch

    source, b, a = lazy(weight), lazy(up), lazy(down)
    if b.shape[0] != source.shape[0] or a.shape[1] != source.shape[1] or b.shape[1] != a.shape[0]:
        raise WeightsError(
            f"a low-rank product of {list(b.shape)} by {list(a.shape)} does not add to {source.name!r}, "
            f"{list(source.shape)}: it is (out, rank) by (rank, in)"
        )

    def read(start: int, stop: int) -> torch.Tensor:
        rows = source.rows(start, stop).to(torch.float32, copy=True)  # not the source's own rows, added to
        delta = b.rows(start, stop).to(torch.float32) @ a.torch().to(torch.float32)
        return rows.add_(delta, alpha=scale)

    return LazyWeight(
        read, torch.float32, list(source.shape), name=name or source.name,
        how=f"{source.name} + {scale:g} * {b.name} @ {a.name}", sources=[source, b],
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """What a computed tensor will be.

    Fields:
        dtype: its element type.
        shape: its shape; its first dim is the source's rows.
        name: its initializer name.
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    name: str


@dataclasses.dataclass(frozen=True)
class StoredBlocks:
    """A linear layer's ``(N, K)`` weight as a quantized checkpoint stores it (GPTQ, AWQ,
    compressed-tensors' pack-quantized): unsigned integers of ``bits`` in blocks of ``block_size``
    along K, each block with a scale and a zero point, the value being ``(q - zero_point) *
    scale``; laid out as ONNX Runtime's ``MatMulNBits`` reads them.

    Fields:
        bits: 4 or 8.
        block_size: values per block (a power of two, at least 16).
        packed: ``uint8 (N, blocks, block_size * bits / 8)``: each row's values, the lowest bits first.
        scales: ``float32 (N, blocks)``.
        zero_points: ``uint8 (N, ceil(blocks * bits / 8))`` packed as ``packed`` is, or ``None``:
            every zero point is the midpoint ``2 ** (bits - 1)``.
        order: where the blocks run along the input channels in another order (GPTQ's act-order),
            ``int64 (K,)``: block position ``i`` holds input channel ``order[i]``; else ``None``.
        source: what they were read from, for messages (``"GPTQ tensors model.layers.0.mlp.up_proj.*"``).
        k: the input channels, where fewer than the blocks hold (the last block padded); ``None``:
            ``blocks * block_size``.
    """

    bits: int
    block_size: int
    packed: LazyWeight
    scales: LazyWeight
    zero_points: LazyWeight | None
    order: Any
    source: str
    k: int | None = None

    @property
    def input_channels(self) -> int:
        """K: :attr:`k`, else the blocks' values per row."""
        return self.k if self.k is not None else int(self.packed.shape[1]) * self.block_size


def rowwise(
    weight: Any, function: Callable[[torch.Tensor], Sequence[torch.Tensor]], outputs: Sequence[TensorSpec], how: str
) -> list[LazyWeight]:
    """The tensors ``function`` makes from ``weight``, one output row per source row: ``function``
    takes a run of ``weight``'s rows and returns the same run of rows of each output. The first
    output is computed run by run as it is written; the others (scales, zero points: small
    beside it) are kept from those runs until they are written, and computed whole if asked first."""
    source = lazy(weight)
    state: dict[str, Any] = {"next": 0, "kept": {i: [] for i in range(1, len(outputs))}}

    def run(index: int, start: int, stop: int) -> torch.Tensor:
        import torch

        kept = state["kept"]
        if index and state["next"] == source.length and kept[index]:  # every run of the first output made it
            whole = torch.cat(kept[index], 0) if len(kept[index]) != 1 else kept[index][0]
            kept[index] = [whole] if stop < source.length else []  # dropped once its last run is read
            return _slice(whole, start, stop)
        made = function(source.rows(start, stop))
        if index == 0:
            if start == 0:
                kept = {i: [] for i in kept}
                state["next"], state["kept"] = 0, kept
            if start == state["next"]:
                for i in kept:
                    kept[i].append(made[i])
                state["next"] = stop
        return made[index]

    return [
        LazyWeight(
            lambda a, b, i=i: run(i, a, b),
            spec.dtype,
            list(spec.shape),
            name=spec.name,
            how=f"{how} of {source.name}",
            sources=[source],
        )
        for i, spec in enumerate(outputs)
    ]
