"""What ``opreg export SOURCE`` names: a factory (``path/to/file.py:make``, ``package.module:make``),
a checkpoint folder, or a hub id resolved by huggingface_hub.

The three are told apart by their form alone: a factory has ``:`` followed by an identifier (a
hub id has no ``:``, and a folder of that name is rare enough to be named ``./NAME``); an existing
folder is a checkpoint; anything else that reads as ``name`` or ``owner/name`` is a hub id,
downloaded (or found in the cache) by ``huggingface_hub.snapshot_download``, which honours
``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from opreg.errors import CheckpointError
from opreg.loaderapi import Checkpoint

logger = logging.getLogger(__name__)

__all__ = ["checkpoint_of", "is_factory"]

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$")


def is_factory(source: str) -> bool:
    """Whether ``source`` names a factory: ``path/to/file.py:make`` or ``package.module:make``
    (and is not an existing folder)."""
    module, sep, attr = source.rpartition(":")
    if not sep or not module or not attr.isidentifier() or os.path.isdir(source):
        return False
    return module.endswith(".py") or "/" in module or "\\" in module or bool(_MODULE.match(module))


def checkpoint_of(source: str | os.PathLike[str]) -> Checkpoint:
    """The :class:`opreg.Checkpoint` ``source`` names: a folder, or a hub id's snapshot;
    :class:`opreg.CheckpointError` saying what to do when it is neither."""
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.is_dir():
        return Checkpoint(path.resolve(), text)
    if path.exists():
        raise CheckpointError(f"{text} is a file, not a checkpoint folder: name the folder that holds it")
    if not _HUB_ID.match(text) or ".." in text:
        raise CheckpointError(f"{text}: no such folder (a checkpoint folder, or a hub id such as owner/name)")
    return Checkpoint(_snapshot(text), text)


def _snapshot(repo_id: str) -> Path:
    download = _downloader(repo_id)
    logger.info("resolving %s with huggingface_hub.snapshot_download", repo_id)
    try:
        return Path(download(repo_id=repo_id))
    except Exception as e:
        offline = " (HF_HUB_OFFLINE is set: only ids already in the cache resolve)" if _offline() else ""
        raise CheckpointError(
            f"{repo_id} is no folder here, and the hub did not give it{offline}: {type(e).__name__}: {e}; "
            "give the checkpoint's folder, or check the id and the network"
        ) from e


def _downloader(repo_id: str) -> Callable[..., str]:
    """``huggingface_hub.snapshot_download``, or why a hub id cannot be resolved without it."""
    if importlib.util.find_spec("huggingface_hub") is None:
        raise CheckpointError(
            f"{repo_id} is no folder here, and huggingface_hub, which downloads a hub id, is not installed: "
            "pip install huggingface_hub, or give the checkpoint's folder"
        )
    from huggingface_hub import snapshot_download

    return snapshot_download


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
