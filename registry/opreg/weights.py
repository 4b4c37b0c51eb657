"""Weights read when the model is written: lazy initializers, and the checkpoints they come from.

A model too large for memory is exported from a ``meta``-device module (no weight data) and a
checkpoint (``opreg.export(model, args, weights=...)``). Each of its initializers is then a
:class:`LazyWeight`: a dtype, a shape and a way to compute any run of its rows (slices along its
first dim). Nothing is read until the model is written; then each initializer is computed a
chunk of rows at a time (:data:`CHUNK_BYTES`), written to the external-data file and dropped.

Every transform an export applies to a weight is one function here, on lazy values, so the
in-memory export and the streamed one run the same code and write the same bytes:

- :func:`cast`: another dtype (a bfloat16 checkpoint into a float32 model), as ``Tensor.to`` casts;
- :func:`transpose`: stored transposed (the weight-transpose folding of ``fold_weights``);
- :func:`concat`: several weights as one (ONNX Runtime's packed query, key and value projection);
- :func:`scaled`: scaled per output channel (batch norm folded into the convolution before it);
- :func:`rowwise`: any function of a run of rows giving rows of one or more new tensors (block
  quantization to MatMulNBits: each output row comes from one row of the ``(N, K)`` weight).

Checkpoints: :func:`open_weights` takes safetensors files (a file, a folder of them, or a list),
read tensor by tensor and run of rows by run of rows (their headers parsed, the bytes asked for read
with ``os.pread``: no mapping holds pages or address space), or a mapping of names to tensors (torch tensors,
``onnx_ir`` tensors, lazy ones).

Importing this module is cheap; torch is imported when a weight is read.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from opreg.errors import InvalidArgumentError, WeightsError

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHUNK_BYTES",
    "LazyWeight",
    "TensorSpec",
    "Weights",
    "cast",
    "concat",
    "lazy",
    "open_weights",
    "rowwise",
    "scaled",
    "transpose",
]

CHUNK_BYTES = 64 * 2**20
"""How many bytes of a weight are computed and written at a time (a run of whole rows: at least one)."""

CACHED_ELEMENTS = 64
"""A lazy weight of at most this many elements keeps its values once read: shape inference and the
translation memo take such small constants as data, each time they meet them."""

Rows = Callable[[int, int], "torch.Tensor"]
"""``rows(start, stop)``: rows ``start`` to ``stop`` of a tensor's first dim, as a CPU torch tensor."""


class LazyWeight(ir.LazyTensor):
    """An initializer computed when it is read: ``rows(start, stop)`` gives any run of its rows.

    ``numpy()`` and ``tobytes()`` compute the whole tensor (and hold it only for the call);
    ``tofile()``, what ``onnx_ir`` calls to write external data, computes and writes
    :data:`CHUNK_BYTES` at a time, so the largest weight is never whole in memory.

    Attributes:
        torch_dtype: its element type as a ``torch.dtype``.
        how: what it is computed from, for messages and the model's ``opreg.folded_weights``.
    """

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
    ) -> None:
        from onnx_ir.tensor_adapters import from_torch_dtype

        super().__init__(self._whole, dtype=from_torch_dtype(dtype), shape=ir.Shape(list(shape)), name=name)
        self.cache = self.size <= CACHED_ELEMENTS  # read again and again as data by shape inference
        self._rows = rows
        self._sources = tuple(sources)
        self._whole_source = whole
        self.torch_dtype = dtype
        self.how = how

    def __repr__(self) -> str:
        return f"LazyWeight({self.name!r}, {self.torch_dtype}, {list(self.shape)}, {self.how})"

    def named(self, name: str) -> LazyWeight:
        """The same values under another initializer name (a tied weight has one per name)."""
        if name == self.name:
            return self
        return LazyWeight(
            self._rows, self.torch_dtype, self.shape, name=name, how=self.how, sources=self._sources,
            whole=self._whole_source,
        )  # fmt: skip

    @property
    def length(self) -> int:
        """The rows: the size of the first dim (1 for a 0-d tensor)."""
        return int(self.shape[0]) if len(self.shape) else 1

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start`` to ``stop`` (a 0-d tensor has one row: itself), checked against the
        declared dtype and shape."""
        stop = min(stop, self.length)
        got = self._rows(start, stop)
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

    @property
    def row_bytes(self) -> int:
        """The bytes a row costs to compute: its own, or a source's row if larger (a bfloat16 row
        cast to float32 and quantized to 4 bits reads more than it makes); all of them where a run
        of rows reads a whole source (a transpose)."""
        if self._whole_source:
            return max(1, self.nbytes)
        own = self.nbytes // max(self.length, 1)
        return max(1, own, *(source.row_bytes for source in self._sources))

    def chunks(self) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` runs of rows costing about :data:`CHUNK_BYTES` each (:attr:`row_bytes`),
        covering the tensor."""
        step = max(1, CHUNK_BYTES // self.row_bytes)
        for start in range(0, self.length, step):
            yield start, min(start + step, self.length)

    def _whole(self) -> ir.TensorProtocol:
        from onnx_ir.tensor_adapters import TorchTensor

        return TorchTensor(self.torch().contiguous(), name=self.name)

    def tofile(self, file: Any) -> None:
        from onnx_ir.tensor_adapters import TorchTensor

        for start, stop in self.chunks():
            TorchTensor(self.rows(start, stop).contiguous()).tofile(file)
        release_freed_memory()


def release_freed_memory() -> None:
    """Hand memory freed by the process back to the system (glibc's ``malloc_trim``): glibc keeps
    large freed blocks for reuse, so a process that computes one weight after another would grow by
    its largest weights' working memory (measured: 0.5B int4, a peak of 1.58 GB without, 0.84 GB
    with). Nothing on another C library."""
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
        held = tensor.detach()
        return LazyWeight(lambda a, b: _slice(held, a, b), held.dtype, held.shape, name=name, how="in memory")
    source = tensor
    dtype = to_torch_dtype(source.dtype)

    def read(start: int, stop: int) -> torch.Tensor:
        return _slice(_as_torch(source), start, stop)

    return LazyWeight(read, dtype, list(source.shape), name=name or source.name, how="an onnx_ir tensor")


def _as_torch(tensor: ir.TensorProtocol) -> torch.Tensor:
    """An ``onnx_ir`` tensor's values as a torch tensor."""
    import numpy as np
    import torch
    from onnx_ir.tensor_adapters import to_torch_dtype

    dtype = to_torch_dtype(tensor.dtype)
    raw = np.frombuffer(tensor.tobytes(), dtype=np.uint8).copy()
    return torch.from_numpy(raw).view(dtype).reshape(list(tensor.shape))


def _slice(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return tensor if tensor.dim() == 0 else tensor[start:stop]


# -- transforms -------------------------------------------------------------------------------


def cast(weight: Any, dtype: torch.dtype, name: str | None = None) -> LazyWeight:
    """``weight`` in ``dtype`` (``Tensor.to``'s rounding); itself if it already has it."""
    source = lazy(weight)
    if source.torch_dtype == dtype:
        return source
    return LazyWeight(
        lambda a, b: source.rows(a, b).to(dtype),
        dtype,
        list(source.shape),
        name=name or source.name,
        how=f"{source.how}, cast to {dtype}",
        sources=[source],
    )


def transpose(weight: Any, perm: Sequence[int], name: str | None = None) -> LazyWeight:
    """``weight`` stored with its dims permuted by ``perm`` (the whole source is read for each run
    of rows that is not along its own first dim: for weights small enough to transpose)."""
    source = lazy(weight)
    perm = [int(p) for p in perm]
    shape = [source.shape[p] for p in perm]
    if perm and perm[0] == 0:

        def read(start: int, stop: int) -> torch.Tensor:
            return source.rows(start, stop).permute(perm)
    else:

        def read(start: int, stop: int) -> torch.Tensor:
            return _slice(source.torch().permute(perm), start, stop)

    return LazyWeight(
        read, source.torch_dtype, shape, name=name or source.name, how=f"transpose(perm={perm})",
        sources=[source], whole=not (perm and perm[0] == 0),
    )  # fmt: skip


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
            pieces = [p.rows(max(start, a) - a, min(stop, b) - a) for a, b, p in offsets if a < stop and start < b]
            return torch.cat(pieces, 0) if len(pieces) != 1 else pieces[0]
    else:

        def read(start: int, stop: int) -> torch.Tensor:
            return torch.cat([p.rows(start, stop) for p in parts], axis)

    names = ", ".join(str(p.name) for p in parts)
    return LazyWeight(read, first.torch_dtype, shape, name=name, how=f"concat([{names}], axis={axis})", sources=parts)


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


# -- checkpoints --------------------------------------------------------------------------------------


class Weights(Mapping[str, LazyWeight]):
    """A checkpoint's tensors by name, each a :class:`LazyWeight` read when it is written."""

    def __init__(self, tensors: Mapping[str, LazyWeight], origin: str) -> None:
        self._tensors = dict(tensors)
        self.origin = origin
        """What the weights were read from (a file or folder, or ``"a mapping"``), for messages."""

    def __getitem__(self, name: str) -> LazyWeight:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"<Weights: {len(self)} tensors from {self.origin}>"

    def with_tensors(self, tensors: Mapping[str, Any]) -> Weights:
        """These weights and ``tensors`` (torch or lazy tensors by name; they win on a clash)."""
        return Weights({**self._tensors, **{k: lazy(t, k) for k, t in tensors.items()}}, self.origin)

    def renamed(self, prefix: str) -> Weights:
        """The same tensors with ``prefix`` before each name (a module wrapping the checkpoint's)."""
        return Weights({prefix + name: tensor for name, tensor in self._tensors.items()}, self.origin)


def open_weights(source: Any) -> Weights:
    """``source`` as :class:`Weights`: a ``.safetensors`` file, a folder holding them (its
    ``*.safetensors``, as ``model.safetensors.index.json`` lists them when present), a list of
    such files, a :class:`Weights`, or a mapping of names to tensors (torch, ``onnx_ir`` or lazy).
    Only the files' headers are read here."""
    if isinstance(source, Weights):
        return source
    if isinstance(source, Mapping):
        tensors = {}
        for name, tensor in source.items():
            if not isinstance(name, str):
                raise InvalidArgumentError(f"weights= maps names (strings) to tensors, got the key {name!r}")
            tensors[name] = _checked_lazy(tensor, name)
        return Weights(tensors, "a mapping")
    if isinstance(source, (str, os.PathLike)):
        files = _safetensors_files(Path(source))
        origin = str(source)
    elif isinstance(source, Iterable) and not isinstance(source, (bytes, str)):
        files = [Path(p) for p in source]
        origin = ", ".join(str(p) for p in files)
        if not files:
            raise InvalidArgumentError("weights= got an empty list of files")
    else:
        raise InvalidArgumentError(
            f"weights= takes a safetensors file or folder, a list of files, or a mapping of names to tensors, "
            f"got {type(source).__name__}"
        )
    tensors = {}
    for file in files:
        for name, tensor in _safetensors_file(file).items():
            if name in tensors:
                raise WeightsError(f"tensor {name!r} is in two checkpoint files: {tensors[name].how} and {file}")
            tensors[name] = tensor
    return Weights(tensors, origin)


def _checked_lazy(tensor: Any, name: str) -> LazyWeight:
    import torch

    if not isinstance(tensor, (torch.Tensor, LazyWeight)) and not isinstance(tensor, ir.TensorProtocol):
        raise InvalidArgumentError(
            f"weights= maps names to tensors; {name!r} is a {type(tensor).__name__}: give a torch tensor, an "
            "onnx_ir tensor (ir.LazyTensor, ir.ExternalTensor, ...) or an opreg.weights.LazyWeight"
        )
    return lazy(tensor, name)


def _safetensors_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise WeightsError(f"weights={str(path)!r}: no such file or folder")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        import json

        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise WeightsError(f"cannot read the checkpoint index {index}: {e}") from e
        return [path / name for name in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{path} holds no .safetensors files: save the checkpoint with safetensors")
    return files


def _safetensors_file(file: Path) -> dict[str, LazyWeight]:
    """Every tensor of one safetensors ``file`` (its header read now), each read when asked by
    ``os.pread`` of the bytes of the rows asked for. Not memory-mapped: a mapping's pages count in
    the process's resident memory while it lasts, and its size in the address space, which a
    memory cap (``ulimit -v``) on a large checkpoint would refuse."""
    import json
    import struct

    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as e:
        raise WeightsError(f"cannot read the safetensors file {file}: {type(e).__name__}: {e}") from e
    start = 8 + size
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise WeightsError(f"the safetensors file {file} describes {name!r} as {entry!r}") from e
        dtype = _torch_dtype(dtype, file, name)
        numel = 1
        for d in shape:
            numel *= d
        if int(end) - int(begin) != numel * dtype.itemsize:
            raise WeightsError(f"the safetensors file {file} gives {name!r} {int(end) - int(begin)} bytes for {shape}")
        read = _reader(file, start + int(begin), dtype, shape)
        tensors[name] = LazyWeight(read, dtype, shape, name=name, how=file.name)
    return tensors


def _reader(file: Path, offset: int, dtype: torch.dtype, shape: list[int]) -> Rows:
    """Rows of the tensor at ``offset`` in ``file``, read with ``os.pread``."""

    def read(start: int, stop: int) -> torch.Tensor:
        import torch

        row = dtype.itemsize
        for d in shape[1:]:
            row *= d
        count = (stop - start) * row if shape else row
        data = bytearray(count)
        with open(file, "rb", buffering=0) as f:
            done = _pread_into(f.fileno(), data, offset + start * row)
        if done != count:
            raise WeightsError(
                f"{file} ends before the tensor's bytes at {offset + start * row}: a truncated checkpoint"
            )
        values = torch.frombuffer(data, dtype=dtype) if count else torch.empty(0, dtype=dtype)
        return values.reshape([stop - start, *shape[1:]] if shape else [])

    return read


def _pread_into(fd: int, buffer: bytearray, offset: int) -> int:
    """Fill ``buffer`` from ``fd`` at ``offset``; the bytes read (fewer at the end of the file)."""
    view = memoryview(buffer)
    done = 0
    while done < len(buffer):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _torch_dtype(name: str, file: Path, tensor: str) -> torch.dtype:
    import torch

    if name not in _SAFETENSORS_DTYPES:
        raise WeightsError(f"tensor {tensor!r} in {file} has the dtype {name}, which opreg cannot read")
    return getattr(torch, _SAFETENSORS_DTYPES[name])


# -- binding a meta module to a checkpoint ----------------------------------------------------------------


def bind(model: torch.nn.Module, weights: Weights) -> dict[str, LazyWeight]:
    """The lazy value of each of ``model``'s parameters and buffers on the ``meta`` device, by every
    name it has (a tied weight by each of its names), from ``weights``: the checkpoint's tensor of
    that name (or of another name of the same tensor), cast to the module's dtype where both are
    floating point. A tensor that is missing, or has another shape or kind of dtype, is a
    :class:`WeightsError` naming it (all of them at once), raised before anything is captured."""
    names: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for name, tensor in _named_tensors(model):
        if tensor is not None and tensor.device.type == "meta":
            names.setdefault(id(tensor), []).append(name)
            tensors[id(tensor)] = tensor
    bound: dict[str, LazyWeight] = {}
    problems = []
    for key, aliases in names.items():
        tensor = tensors[key]
        found = next((a for a in aliases if a in weights), None)
        if found is None:
            problems.append(f"{aliases[0]}: missing from the checkpoint ({_describe(tensor.dtype, tensor.shape)})")
            continue
        stored = weights[found]
        problem = _mismatch(stored, tensor)
        if problem:
            problems.append(f"{found}: {problem}")
            continue
        for alias in aliases:
            bound[alias] = cast(stored, tensor.dtype, name=alias) if stored.torch_dtype != tensor.dtype else stored
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise WeightsError(
            f"the checkpoint ({weights.origin}) does not fit {type(model).__name__}: "
            + "; ".join(shown)
            + ". Nothing was exported: give the checkpoint this model was saved to, or a model of its config.",
            tuple(problems),
        )
    return bound


def _named_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def _describe(dtype: torch.dtype, shape: Sequence[int]) -> str:
    return f"{str(dtype).removeprefix('torch.')} {list(shape)}"


def _mismatch(stored: LazyWeight, tensor: torch.Tensor) -> str | None:
    if list(stored.shape) != list(tensor.shape):
        return f"the checkpoint has shape {list(stored.shape)}, the model {list(tensor.shape)}"
    a, b = stored.torch_dtype, tensor.dtype
    if a != b and not (a.is_floating_point and b.is_floating_point):
        return f"the checkpoint has {_describe(a, stored.shape)}, the model {_describe(b, tensor.shape)}"
    return None
