"""Checkpoints as lazy weights, and a ``meta`` module bound to one (see :mod:`opreg.weights`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from opreg.errors import InvalidArgumentError, WeightsError
from opreg.weights._lazy import LazyWeight, Rows, cast, lazy

if TYPE_CHECKING:
    import torch

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
        data = torch.empty(count, dtype=torch.uint8)  # not zeroed first, as a bytearray is: pread fills it
        with open(file, "rb", buffering=0) as f:
            done = _pread_into(f.fileno(), memoryview(data.numpy()), offset + start * row)
        if done != count:
            raise WeightsError(
                f"{file} ends before the tensor's bytes at {offset + start * row}: a truncated checkpoint"
            )
        return data.view(dtype).reshape([stop - start, *shape[1:]] if shape else [])

    return read


def _pread_into(fd: int, buffer: bytearray | memoryview, offset: int) -> int:
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
