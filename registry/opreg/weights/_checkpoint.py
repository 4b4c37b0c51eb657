"""Checkpoints as lazy weights, and a ``meta`` module bound to one (see :mod:`opreg.weights`)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from opreg.errors import InvalidArgumentError, WeightsError
from opreg.weights._lazy import LazyWeight, cast, lazy
from opreg.weights._safetensors import read_tensors

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

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
    """``source`` as :class:`Weights`: a ``.safetensors`` file, a folder holding them (the files
    transformers reads there, :func:`checkpoint_files`; a folder transformers reads none of: its
    ``*.safetensors``), a list of such files, a :class:`Weights`, or a mapping of names to tensors
    (torch, ``onnx_ir`` or lazy). Only the files' headers are read here (and checked, each file
    pinned: :mod:`opreg.weights._safetensors`)."""
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
        files = _files(Path(source))
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
        for name, tensor in read_tensors(file).items():
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


def _files(path: Path) -> list[Path]:
    """The safetensors files of ``path``: itself, or those of a folder (:func:`checkpoint_files`,
    else all its ``*.safetensors``)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise WeightsError(f"weights={str(path)!r}: no such file or folder")
    files = checkpoint_files(path)
    if files == [path / SINGLE_FILE] and (path / INDEX_FILE).is_file():
        logger.warning(
            "%s holds both %s and %s: reading %s, as transformers does (the index and its shards are not read)",
            path, SINGLE_FILE, INDEX_FILE, SINGLE_FILE,
        )  # fmt: skip
    if files is None:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{path} holds no .safetensors files: save the checkpoint with safetensors")
    return files


SINGLE_FILE = "model.safetensors"
"""The one file of a checkpoint saved unsharded (transformers' ``SAFE_WEIGHTS_NAME``)."""
INDEX_FILE = "model.safetensors.index.json"
"""The index of a sharded checkpoint (transformers' ``SAFE_WEIGHTS_INDEX_NAME``): its ``weight_map``
names each tensor's shard."""


def checkpoint_files(folder: Path) -> list[Path] | None:
    """The safetensors files transformers' ``from_pretrained`` reads from the local checkpoint ``folder``,
    chosen as it chooses them (transformers 5's ``modeling_utils._get_resolved_checkpoint_files``): the
    file its ``config.json`` names as ``transformers_weights`` (a safetensors file or index), else
    :data:`SINGLE_FILE` (an index beside it is not read), else the shards :data:`INDEX_FILE` lists;
    ``None`` where it reads none of them (``.bin`` files, safetensors of other names). A file named
    outside the folder (``../``, an absolute path) is refused."""
    explicit = _explicit_file(folder)
    if explicit is None and (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    if explicit is None and not (folder / INDEX_FILE).is_file():
        return None
    name = explicit or INDEX_FILE
    if not name.endswith(".safetensors.index.json"):
        return [inside(folder, name, f"{folder / 'config.json'}'s transformers_weights")]
    index = inside(folder, name, f"{folder / 'config.json'}'s transformers_weights")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
        if not all(isinstance(shard, str) for shard in shards):
            raise TypeError("a shard name is not a string")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise WeightsError(f"cannot read the checkpoint index {index}: {type(e).__name__}: {e}") from e
    return [inside(folder, shard, f"the checkpoint index {index}") for shard in shards]


def _explicit_file(folder: Path) -> str | None:
    """The weights file ``folder``'s ``config.json`` names (``transformers_weights``), if any."""
    try:
        name = json.loads((folder / "config.json").read_text()).get("transformers_weights")
    except (OSError, ValueError, AttributeError):
        return None  # no config (not a transformers folder), or one transformers refuses itself
    if name is None:
        return None
    if not isinstance(name, str) or not name.endswith((".safetensors", ".safetensors.index.json")):
        raise WeightsError(
            f"{folder / 'config.json'} names {name!r} as its transformers_weights: transformers reads a "
            "*.safetensors file or a *.safetensors.index.json index there"
        )
    return name


def inside(folder: Path, name: str, what: str) -> Path:
    """``folder / name``, or a :class:`WeightsError` if ``name`` (which ``what`` names) leads out of
    ``folder``: an absolute path, or one whose ``..`` climbs above it (symbolic links are not
    followed: a Hugging Face cache's files are links into its blobs)."""
    base = os.path.abspath(folder)
    path = os.path.abspath(os.path.join(base, name))
    if os.path.isabs(name) or os.path.commonpath([base, path]) != base:
        raise WeightsError(
            f"{what} names {name!r}, outside the checkpoint folder {folder}: a checkpoint's files are read from its "
            "own folder only; fix the name, or copy the file into the folder"
        )
    return folder / name


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
