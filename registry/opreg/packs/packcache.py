"""A cache of what the installed packs declare, so that listing them does not import them.

``opreg plugins``, ``opreg ops`` and ``opreg explain`` need only what the packs
*declare*: each pack's report, its impls' metadata (op, requirement, priority,
whether it has a predicate, the profiles it is for, ``file:line``), its target profiles and the ops it
declines. Building that means importing every pack, and so torch (about two
seconds); reading it back from this cache takes a few milliseconds, and no pack,
torch, onnx or onnxscript is imported. :func:`opreg.packs.plugins.declared_registry` gives a frozen
:class:`~opreg.Registry` of that data (its impls' functions and predicates are
:class:`~opreg.packs.declaration.Declaration` stand-ins that cannot be called; no host is built beside it),
which resolves, explains and lists exactly as the real one does.

A registry build that loads the packs (:func:`opreg.packs.plugins.load_packs`, so :func:`opreg.build_registry`
and every export) uses an entry too: each impl its packs register again is taken as the entry
knows it (requirement, kind, parameters, schema check, source: :class:`opreg.registry.registrar.Known`)
instead of its function being read again, and a build with no usable entry writes one.

When an entry is used
---------------------
An entry is written for one selection of packs (``-p``, ``-p no:``, autoload)
in one interpreter (its executable, version and ``sys.path``) and is used only
while nothing it came from has changed:

- the distributions (``*.dist-info``, ``*.egg-info``) and ``.pth`` files in
  every ``sys.path`` entry, by name and modification time: pip writes a
  distribution's folder anew on every install, so a ``pip install``, upgrade,
  reinstall or uninstall of any distribution (a pack, opreg, torch, onnx, ...)
  invalidates it;
- the source files of opreg and of every discovered pack's package that are
  not installed copies (editable installs, source trees on ``PYTHONPATH``),
  and of every other module imported when the entry was written that is
  neither in the standard library nor in a folder pip installs into (a site
  directory, a ``sys.path`` entry holding ``*.dist-info`` folders): their
  modification times and sizes, so an edit of an editable pack invalidates it;
- the environment variables that change what loads (``OPREG_DISABLE_PLUGIN_AUTOLOAD``,
  ``OPREG_SLOW_IMPORT_SECONDS``).

Not watched: a file edited by hand inside ``site-packages`` (pip never does
that), data files a pack reads while it registers, and other environment
variables a pack may read; turn the cache off (below) where that matters.
Preferences (``--prefer``) and ``--strict`` are applied to the cached data on
every run, as :func:`opreg.packs.plugins.assemble` does after loading.

Where it lives
--------------
The ``declared`` folder of opreg's cache folder: ``$OPREG_CACHE_DIR`` if set,
else ``opreg`` in the user cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``
on Linux, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%\\opreg\\Cache`` on
Windows). One JSON file per selection and interpreter; the oldest are removed
beyond :data:`MAX_ENTRIES`. Deleting the folder is always safe. ``OPREG_NO_CACHE=1`` (or the commands' ``--no-cache``)
turns it off: every run then loads the packs.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import json
import logging
import os
import sys
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from opreg.errors import OpregError
from opreg.packs import declaration, discovery, fingerprint
from opreg.packs.declaration import Declared
from opreg.packs.discovery import Selection
from opreg.registry import targets
from opreg.registry.targets import assume_onnx_opset_range, onnx_opset_range

logger = logging.getLogger(__name__)

CACHE_ENV = targets.CACHE_ENV
"""opreg's cache folder, if set (created when first written); the entries are in its ``declared`` folder."""
SUBDIR = "declared"
NO_CACHE_ENV = "OPREG_NO_CACHE"
"""Set to ``1`` to turn the cache off."""
FORMAT = 3
"""The entries' format; an entry of another format is not read (2: impls' ``profiles``, packs' ``schemas``;
3: impls' ``params``, the analysis a registry build takes instead of reading the function again)."""
MAX_ENTRIES = 32
"""Entries kept in the cache directory (one per selection and interpreter); older ones are removed."""
WATCHED_ENV = (discovery.AUTOLOAD_ENV, discovery.SLOW_IMPORT_ENV)


# -- where -------------------------------------------------------------------------------------


_OFF: contextvars.ContextVar[bool] = contextvars.ContextVar("opreg_packcache_off", default=False)


def disabled() -> bool:
    """Whether ``OPREG_NO_CACHE`` (or :func:`off`) turns the cache off."""
    return _OFF.get() or os.environ.get(NO_CACHE_ENV, "").strip().lower() not in ("", "0", "false", "no")


@contextlib.contextmanager
def off() -> Iterator[None]:
    """The cache off while in the block (the commands' ``--no-cache``), as ``OPREG_NO_CACHE=1`` turns it
    off for a whole process."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


cache_root = targets.cache_dir
"""opreg's cache folder, shared with what :mod:`opreg.registry.targets` caches: ``$OPREG_CACHE_DIR`` if
set, else :func:`opreg.registry.targets.user_cache_dir`."""
user_cache_dir = targets.user_cache_dir


def cache_dir() -> Path | None:
    """Where the entries live: ``declared`` in :func:`cache_root`; ``None`` when
    ``OPREG_NO_CACHE`` turns the cache off."""
    return None if disabled() else cache_root() / SUBDIR


# -- the key (the state an entry was written in: opreg.packs.fingerprint) ---------------------------


def _key(selection: Selection) -> dict[str, Any]:
    """What an entry is for: the format, opreg's version, the interpreter, the pack selection."""
    return {
        "format": FORMAT,
        "opreg": importlib.metadata.version("opreg"),
        "python": sys.version,
        "executable": sys.executable,
        "path": [os.path.abspath(p) for p in sys.path],
        "plugins": None if selection.plugins is None else sorted(selection.plugins),
        "exclude": sorted(selection.exclude),
        "env": {name: os.environ.get(name) for name in WATCHED_ENV},
    }


def _entry_path(directory: Path, key: Mapping[str, Any]) -> Path:
    """The entry's file, named by a checksum of ``key`` (the entry holds the key itself, so two keys
    that share a checksum only take turns; zlib's, as hashlib's import costs a command's start-up)."""
    text = json.dumps(key, sort_keys=True).encode()
    return directory / f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}.json"


# -- entries -----------------------------------------------------------------------------------


def read(selection: Selection, directory: Path | None = None) -> Declared | None:
    """What the packs of ``selection`` declare, from the cache, if an entry for it exists and
    nothing it came from has changed; else ``None``."""
    directory = directory or cache_dir()
    if directory is None:
        return None
    key = _key(selection)
    path = _entry_path(directory, key)
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.debug("cache entry %s unreadable (%s); loading the packs", path, e)
        return None
    try:
        if entry["key"] != key:
            return None
        changed = fingerprint.changed(entry["path_state"], fingerprint.path_state())
        if changed is None:
            changed = fingerprint.changed(
                entry["file_state"], fingerprint.file_state(f for f, _, _ in entry["file_state"])
            )
        if changed is not None:
            logger.debug("cache entry %s not used: %s changed since it was written", path, changed)
            return None
        low, high = entry["onnx_opset_range"]
        assume_onnx_opset_range((low, high))  # a fact of the installed onnx and onnxscript, as the key is
        declared = declaration.from_data(entry["declared"])
    except (KeyError, TypeError, ValueError, OpregError) as e:
        logger.debug("cache entry %s unusable (%s); loading the packs", path, e)
        return None
    logger.debug("what the packs declare read from %s", path)
    return declared


def write(selection: Selection, declared: Declared, before: list[list[Any]], directory: Path | None = None) -> None:
    """Store what the packs of ``selection`` declared. ``before``: :func:`fingerprint.file_state` of the
    :func:`fingerprint.package_files` taken before they loaded; if any changed since, nothing is stored.
    A cache that cannot be written is left alone (logged at DEBUG)."""
    directory = directory or cache_dir()
    if directory is None:
        return
    roots = fingerprint.installed_roots()
    known = {f for f, _, _ in before}
    after = fingerprint.file_state(known | fingerprint.module_files(roots))
    if [s for s in after if s[0] in known] != before:
        logger.debug("a pack's file changed while the packs loaded; not caching what they declared")
        return
    key = _key(selection)
    entry = {
        "key": key,
        "path_state": fingerprint.path_state(),
        "file_state": after,
        "declared": declaration.as_data(declared),
        "onnx_opset_range": list(onnx_opset_range()),
    }
    path = _entry_path(directory, key)
    import tempfile

    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(entry))  # one string: json.dump encodes piece by piece, in Python
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        _prune(directory)
    except OSError as e:
        logger.debug("cannot write the cache entry %s: %s", path, e)


def _prune(directory: Path) -> None:
    """Remove all but the :data:`MAX_ENTRIES` newest entries."""
    entries = []
    for path in directory.glob("*.json"):
        try:
            entries.append((path.stat().st_mtime_ns, path))
        except OSError:
            continue
    for _, path in sorted(entries, reverse=True)[MAX_ENTRIES:]:
        path.unlink(missing_ok=True)


__all__ = [
    "CACHE_ENV",
    "MAX_ENTRIES",
    "NO_CACHE_ENV",
    "cache_dir",
    "cache_root",
    "disabled",
    "off",
    "read",
    "user_cache_dir",
    "write",
]
