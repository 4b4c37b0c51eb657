"""One safetensors file, read as its format defines (see :mod:`opreg.weights`).

The header is checked by the rules safetensors' own reader applies (its Rust crate's
``SafeTensors::read_metadata`` and ``Metadata::validate``), so a file ``safe_open`` and
``from_pretrained`` refuse is refused here too, naming the file and the tensor:

- the header's length is at most :data:`MAX_HEADER_BYTES` and within the file;
- the header is a JSON object; each tensor has a known dtype, a shape of non-negative ints and
  ``data_offsets``, two non-negative ints, relative to the end of the header;
- taken in the order of their offsets, the tensors follow one another from byte 0 of the data,
  each starting where the one before ends (no overlap, no gap), each exactly as many bytes as its
  shape and dtype make, and the last one ends at the end of the file.

The file is pinned when its header is read: its device, inode, size and modification time are
kept, and every later read of its tensors checks them, so a checkpoint changed, replaced or
removed between the capture (which reads small tensors) and the save (which reads the rest) is
refused naming the file, never read as a mix of two versions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opreg.errors import WeightsError
from opreg.weights._lazy import LazyWeight, Rows

if TYPE_CHECKING:
    import torch

MAX_HEADER_BYTES = 100_000_000
"""The longest header safetensors reads (its ``MAX_HEADER_SIZE``; a longer one is ``HeaderTooLarge``)."""
LENGTH_BYTES = 8
"""A safetensors file starts with its header's length: a little-endian unsigned 64-bit int."""

ITEM_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}  # fmt: skip
"""The bytes of one element of each dtype safetensors writes (its ``Dtype::size``)."""
TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip
"""The dtypes opreg reads, as ``torch`` names them."""


@dataclasses.dataclass(frozen=True)
class Pin:
    """Which file a checkpoint's header was read from, as it was then.

    Fields:
        path: the file.
        device: its device (``st_dev``).
        inode: its inode (``st_ino``): another file renamed over it has another.
        size: its size in bytes.
        mtime_ns: its modification time in nanoseconds: a file rewritten in place changes it.
    """

    path: Path
    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, fd: int) -> Pin:
        """The pin of the file open at ``fd`` (opened from ``path``)."""
        info = os.fstat(fd)
        return cls(path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def check(self, fd: int) -> None:
        """Refuse, naming the file, if the file open at ``fd`` is not the pinned one as it was."""
        now = Pin.of(self.path, fd)
        if now == self:
            return
        changes = [
            ((now.device, now.inode) != (self.device, self.inode), "another file took its name"),
            (now.size != self.size, f"its size went from {self.size} to {now.size} bytes"),
            (True, "it was written to"),  # the same file and size, another modification time
        ]
        what = next(text for changed, text in changes if changed)
        raise WeightsError(
            f"the checkpoint file {self.path} changed since the export read its header ({what}): the weights are "
            "read from it when the model is written, and its tensors are no longer where the header said; export "
            "again, and leave the checkpoint unchanged until the model is saved"
        )

    def open(self) -> int:
        """A new descriptor of the file for reading, or a :class:`WeightsError` naming it."""
        try:
            return os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as e:
            raise WeightsError(
                f"the checkpoint file {self.path} is gone (removed or renamed since the export read its header): the "
                "weights are read from it when the model is written; put it back, or export again"
            ) from e
        except OSError as e:
            raise WeightsError(f"cannot read the checkpoint file {self.path}: {e.strerror or e}") from e


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors header.

    Fields:
        name: its name.
        dtype: its safetensors dtype (``"F32"``, ...).
        shape: its shape.
        begin: where its bytes start, from the end of the header.
        end: where they end.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_tensors(file: Path) -> dict[str, LazyWeight]:
    """Every tensor of the safetensors ``file`` (its header read and checked now, the file pinned),
    each read when asked by ``os.pread`` of the bytes of the rows asked for. Not memory-mapped: a
    mapping's pages count in the process's resident memory while it lasts, and its size in the
    address space, which a memory cap (``ulimit -v``) on a large checkpoint would refuse."""
    pin, start, entries = read_header(file)
    tensors = {}
    for entry in entries:
        dtype = torch_dtype(entry.dtype, file, entry.name)
        read = _reader(pin, start + entry.begin, dtype, list(entry.shape))
        tensors[entry.name] = LazyWeight(read, dtype, list(entry.shape), name=entry.name, how=file.name)
    return tensors


def read_header(file: Path) -> tuple[Pin, int, list[Entry]]:
    """The pin of ``file``, where its data starts, and its tensors in the order of their bytes,
    checked by safetensors' rules (the module docstring), or a :class:`WeightsError` naming the file
    and what is wrong."""
    try:
        with open(file, "rb") as f:
            pin = Pin.of(file, f.fileno())
            length = _header_length(file, f.read(LENGTH_BYTES), pin.size)
            text = f.read(length)
    except OSError as e:
        raise WeightsError(f"cannot read the safetensors file {file}: {e.strerror or e}") from e
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise WeightsError(f"the header of {file} is not JSON ({e}): not a safetensors file, or a damaged one") from e
    if not isinstance(header, dict):
        kind = type(header).__name__
        raise WeightsError(f"the header of {file} is a JSON {kind}, not an object: not a safetensors file")
    entries = sorted(
        (_entry(file, name, value) for name, value in header.items() if name != "__metadata__"),
        key=lambda e: (e.begin, e.end),
    )
    data = pin.size - LENGTH_BYTES - length
    _check_places(file, entries, data)
    return pin, LENGTH_BYTES + length, entries


def _header_length(file: Path, first: bytes, size: int) -> int:
    if len(first) < LENGTH_BYTES:
        raise WeightsError(
            f"{file} holds {size} bytes, fewer than the {LENGTH_BYTES} of a safetensors header's length: not a "
            "safetensors file"
        )
    (length,) = struct.unpack("<Q", first)
    if length > MAX_HEADER_BYTES:
        raise WeightsError(
            f"{file} says its header is {length} bytes, more than the {MAX_HEADER_BYTES} safetensors reads: not a "
            "safetensors file, or a damaged one"
        )
    if LENGTH_BYTES + length > size:
        raise WeightsError(
            f"{file} says its header is {length} bytes, but the file holds {size}: a truncated or damaged "
            "safetensors file"
        )
    return length


def _entry(file: Path, name: str, value: Any) -> Entry:
    """One tensor's entry of ``file``'s header, its fields checked for their kinds."""

    def count(v: Any) -> bool:
        return type(v) is int and v >= 0

    try:
        dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    except (KeyError, TypeError):
        dtype = shape = offsets = None
    good = isinstance(shape, list) and all(count(d) for d in shape)
    if not (good and isinstance(offsets, list) and len(offsets) == 2 and all(count(o) for o in offsets)):
        raise WeightsError(
            f"the safetensors file {file} describes {name!r} as {value!r}: a tensor needs a dtype, a shape of "
            "non-negative ints and data_offsets, two non-negative ints; the file is damaged"
        )
    if dtype not in ITEM_BYTES:
        raise WeightsError(f"tensor {name!r} in {file} has the dtype {dtype!r}, which safetensors does not define")
    return Entry(name, dtype, tuple(shape), offsets[0], offsets[1])


def _check_places(file: Path, entries: list[Entry], data: int) -> None:
    """safetensors' ``Metadata::validate`` and the file's length: ``entries`` (in the order of their
    offsets) follow one another from byte 0 of the ``data`` bytes to its end, each of its own size."""
    at, before = 0, None
    for entry in entries:
        if entry.begin != at or entry.end < entry.begin:
            raise WeightsError(
                f"tensor {entry.name!r} in {file} {_misplaced(entry, before, at)}: safetensors tensors follow one "
                "another without overlap or gap (its reader refuses this file as an invalid offset); the file is "
                "damaged, save it again"
            )
        numel = 1
        for d in entry.shape:
            numel *= d
        if entry.end - entry.begin != numel * ITEM_BYTES[entry.dtype]:
            raise WeightsError(
                f"tensor {entry.name!r} in {file} is given {entry.end - entry.begin} bytes for {entry.dtype} "
                f"{list(entry.shape)}, which takes {numel * ITEM_BYTES[entry.dtype]}; the file is damaged"
            )
        at, before = entry.end, entry
    if at != data:
        raise WeightsError(
            f"the tensors of {file} take {at} bytes after its header, but the file holds {data} there: "
            f"{'a truncated' if data < at else 'a padded or damaged'} safetensors file (its reader refuses it)"
        )


def _misplaced(entry: Entry, before: Entry | None, at: int) -> str:
    """How ``entry``'s bytes break the order, where the tensor ``before`` it ends at ``at``."""
    if entry.end < entry.begin:
        return f"ends at byte {entry.end}, before it starts ({entry.begin})"
    if before is None:
        return f"starts at byte {entry.begin} of the data, not at 0"
    if entry.begin < at:
        return f"starts at byte {entry.begin}, inside {before.name!r} (bytes {before.begin} to {before.end})"
    return f"starts at byte {entry.begin}, leaving {entry.begin - at} bytes after {before.name!r} unused"


def torch_dtype(name: str, file: Path, tensor: str) -> torch.dtype:
    """The torch dtype of the safetensors dtype ``name`` (of ``tensor`` in ``file``, for messages)."""
    import torch

    if name not in TORCH_DTYPES:
        raise WeightsError(f"tensor {tensor!r} in {file} has the dtype {name}, which opreg cannot read")
    return getattr(torch, TORCH_DTYPES[name])


def _reader(pin: Pin, offset: int, dtype: torch.dtype, shape: list[int]) -> Rows:
    """Rows of the tensor at ``offset`` in the pinned file, read with ``os.pread``: the file is
    checked against its pin after each read (a change during the read is seen too)."""

    def read(start: int, stop: int) -> torch.Tensor:
        import torch

        row = dtype.itemsize
        for d in shape[1:]:
            row *= d
        count = (stop - start) * row if shape else row
        data = torch.empty(count, dtype=torch.uint8)  # not zeroed first, as a bytearray is: pread fills it
        fd = pin.open()
        try:
            done = _pread_into(fd, memoryview(data.numpy()), offset + start * row)
            pin.check(fd)
        except OSError as e:
            raise WeightsError(f"cannot read the checkpoint file {pin.path}: {e.strerror or e}") from e
        finally:
            os.close(fd)
        if done != count:
            at = offset + start * row
            raise WeightsError(f"{pin.path} ends before the tensor's bytes at {at}: a truncated checkpoint")
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
