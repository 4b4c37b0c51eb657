"""A cache of what the installed packs declare, so that listing them does not import them.

``opreg plugins``, ``opreg ops`` and ``opreg explain`` need only what the packs
*declare*: each pack's report, its impls' metadata (op, requirement, priority,
whether it has a predicate, the profiles it is for, ``file:line``), its target profiles and the ops it
declines. Building that means importing every pack, and so torch (about two
seconds); reading it back from this cache takes a few milliseconds, and no pack,
torch, onnx or onnxscript is imported. :func:`opreg.packs.plugins.declared_registry` gives a frozen
:class:`~opreg.Registry` of that data (its impls' functions and predicates are
:class:`Declaration` stand-ins that cannot be called; no host is built beside it),
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
import dataclasses
import importlib.metadata
import json
import logging
import os
import stat
import sys
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from opreg.errors import OpregError
from opreg.packs import discovery
from opreg.packs.discovery import Selection
from opreg.pluginapi import PackReport, Rejection
from opreg.registry import targets
from opreg.registry._inspect import Params
from opreg.registry.impls import Impl
from opreg.registry.opname import OpName
from opreg.registry.targets import OpsetRequirement, VersionRange, assume_onnx_opset_range, onnx_opset_range

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
DIST_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".pth")


@dataclasses.dataclass(frozen=True)
class Declared:
    """What the selected packs declare, as data: what a registry is built from besides the packs' hooks
    (:func:`opreg.packs.plugins.load_packs` gives it, and this cache stores it).

    Fields:
        reports: every discovered pack's :class:`~opreg.pluginapi.PackReport`, in load order.
        impls: the loaded packs' impls, in registration order.
        profiles: ``(name, {domain: version}, pack)`` for each target profile a loaded pack adds.
        unsupported: ``(op, pack, reason)`` for each op a loaded pack declares unsupported.
    """

    reports: tuple[PackReport, ...]
    impls: tuple[Impl, ...]
    profiles: tuple[tuple[str, Mapping[str, int], str], ...] = ()
    unsupported: tuple[tuple[OpName, str, str], ...] = ()


class Declaration:
    """Stands for an impl's function or predicate in a registry read from the cache: it has the
    name, and calling it is an :class:`~opreg.OpregError` (build the registry to run impls)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise OpregError(
            f"{self.name} was read from opreg's cache of what packs declare and cannot run: "
            "use opreg.build_registry() or opreg.default_registry() to export"
        )

    def __repr__(self) -> str:
        return f"<declared {self.name}>"

    def __eq__(self, other: object) -> bool:  # impls read from two entries alike compare equal
        return isinstance(other, Declaration) and other.name == self.name

    def __hash__(self) -> int:
        return hash((Declaration, self.name))


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


# -- the key and the state it was written in ------------------------------------------------------


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


def _path_state() -> list[list[Any]]:
    """For each ``sys.path`` entry, the distributions (``*.dist-info``, ``*.egg-info``) and ``.pth``
    files in it, each with its modification time: pip writes a distribution's folder anew whenever
    it installs one (a reinstall of the same version too) and removes it when it uninstalls one."""
    state: list[list[Any]] = []
    for entry in sys.path:
        path = os.path.abspath(entry)
        try:
            names = sorted(n for n in os.listdir(path) if n.endswith(DIST_SUFFIXES))
        except OSError:  # not a folder (a zip file, a missing entry)
            names = []
        state.append([path, _file_state(os.path.join(path, n) for n in names)])
    return state


def _file_state(paths: Iterable[str]) -> list[list[Any]]:
    """``[path, mtime_ns, size]`` of each file or folder, sorted (``None`` for one that is gone)."""
    state: list[list[Any]] = []
    for path in sorted(set(paths)):
        try:
            info = os.stat(path)
        except OSError:
            state.append([path, None, None])
            continue
        state.append([path, info.st_mtime_ns, info.st_size])
    return state


def _changed(old: list[list[Any]], new: list[list[Any]]) -> str | None:
    """The first path whose state differs between two sorted lists of ``[path, state...]`` (a
    distribution inside a ``sys.path`` entry, for :func:`_path_state`), or ``None``."""
    if old == new:
        return None
    for before, now in zip(old, new, strict=False):
        if before == now:
            continue
        if before[0] == now[0] and isinstance(now[1], list) and isinstance(before[1], list):
            return _changed(before[1], now[1]) or str(now[0])
        return str(min(before[0], now[0]))
    longer = old if len(old) > len(new) else new
    return str(longer[min(len(old), len(new))][0])


def _installed_roots() -> tuple[str, ...]:
    """Folders whose files change only through pip (or never): the standard library, the site
    directories, and every ``sys.path`` entry that holds a ``*.dist-info`` folder (one pip, or a
    tool like it, installs into; their distributions are watched by :func:`_path_state`)."""
    import site
    import sysconfig

    roots = {sysconfig.get_paths().get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    roots.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else None)
    for entry in sys.path:
        try:
            if any(name.endswith(".dist-info") for name in os.listdir(entry or ".")):
                roots.add(entry or ".")
        except OSError:
            continue
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)


def _outside(path: str, roots: tuple[str, ...]) -> bool:
    return not os.path.realpath(path).startswith(roots)


def _package_files(roots: tuple[str, ...]) -> set[str]:
    """The source files of opreg's package and of every discovered pack's top-level package,
    where they are not installed copies (an editable install, a source tree on ``sys.path``):
    known before any pack is imported, so a file edited while the packs load is seen."""
    import importlib.util

    tops = {"opreg"} | {found.entry_point.value.split(":")[0].split(".")[0].strip() for found in discovery.discovered()}
    files: set[str] = set()
    for top in sorted(tops):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:
            for folder in spec.submodule_search_locations:
                if not _outside(folder, roots):
                    continue
                for parent, dirs, names in os.walk(folder):
                    dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
                    files.update(os.path.join(parent, n) for n in names if n.endswith(".py"))
        elif spec.origin and os.path.isfile(spec.origin) and _outside(spec.origin, roots):
            files.add(spec.origin)
    return files


def _module_files(roots: tuple[str, ...]) -> set[str]:
    """Files of the imported modules that are neither standard library nor installed copies. A process
    that exported has thousands of modules in a few hundred folders: each folder's real path is found
    once, from its parent's (a real path of its own looks at every part of the path)."""
    files = set()
    folders: dict[str, str] = {}
    for module in list(sys.modules.values()):
        # from the module's namespace: a lazy module's __getattr__ may import for a name it lacks
        path = getattr(module, "__dict__", {}).get("__file__")
        if isinstance(path, str):
            real = _real_file(path, folders)
            if real is not None and not real.startswith(roots):
                files.add(path)
    return files


def _real_file(path: str, folders: dict[str, str]) -> str | None:
    """``os.path.realpath(path)`` if ``path`` is a file (or a link to one), else ``None``; ``folders``
    keeps the real paths of the folders seen."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISLNK(mode):
        return os.path.realpath(path) if os.path.isfile(path) else None
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(_real_folder(folder, folders), name) if stat.S_ISREG(mode) else None


def _real_folder(folder: str, folders: dict[str, str]) -> str:
    """``os.path.realpath`` of an absolute, normalized ``folder``: its parent's real path and its name,
    unless it is a link (then followed in full)."""
    if folder not in folders:
        parent, name = os.path.split(folder)
        whole = not name or os.path.islink(folder)  # the root, or a link
        folders[folder] = os.path.realpath(folder) if whole else os.path.join(_real_folder(parent, folders), name)
    return folders[folder]


# -- entries -----------------------------------------------------------------------------------


def _impl_data(impl: Impl) -> dict[str, Any]:
    requirement = impl.requirement
    return {
        "op": str(impl.op),
        "name": impl.name,
        "pack": impl.pack,
        "onnx": [requirement.onnx.min, requirement.onnx.max],
        "domains": [[d, r.min, r.max] for d, r in requirement.domains],
        "priority": impl.priority,
        "predicate": impl.predicate is not None,
        "override": impl.override,
        "complex": impl.complex,
        "kind": impl.kind,
        "schema_checked": impl.schema_checked,
        "convention": impl.convention,
        "source": impl.source,
        "profiles": list(impl.profiles),
        "params": None if impl.params is None else impl.params.as_data(),
    }


def _impl_of(data: Mapping[str, Any]) -> Impl:
    domains = tuple((d, VersionRange(low, high)) for d, low, high in data["domains"])
    name = data["name"]
    return Impl(
        op=OpName.of(data["op"]),
        function=Declaration(name),
        requirement=OpsetRequirement(VersionRange(*data["onnx"]), domains),
        priority=data["priority"],
        predicate=Declaration(f"the predicate of {name}") if data["predicate"] else None,
        pack=data["pack"],
        override=data["override"],
        complex=data["complex"],
        kind=data["kind"],
        name=name,
        schema_checked=data["schema_checked"],
        convention=data["convention"],
        source=data["source"],
        profiles=tuple(data["profiles"]),
        params=None if data["params"] is None else Params.of_data(data["params"]),
    )


def _report_of(data: Mapping[str, Any]) -> PackReport:
    fields = dict(data)
    fields["rejected"] = tuple(Rejection(**r) for r in data["rejected"])
    for name in ("domains", "profiles", "hooks", "schemas"):
        fields[name] = tuple(data[name])
    return PackReport(**fields)


def _declared_data(declared: Declared) -> dict[str, Any]:
    return {
        "reports": [dataclasses.asdict(r) for r in declared.reports],
        "impls": [_impl_data(i) for i in declared.impls],
        "profiles": [[name, dict(versions), pack] for name, versions, pack in declared.profiles],
        "unsupported": [[str(op), pack, reason] for op, pack, reason in declared.unsupported],
    }


@dataclasses.dataclass(frozen=True)
class _Row:
    """A JSON list of fixed length, one shape per position."""

    shapes: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class _Map:
    """A JSON object of any keys (strings) whose values all have ``values``' shape."""

    values: Any


_OPTIONAL_VERSION = (int, None)
"""A type (JSON's: ``type(value) is`` it; ``float`` takes an int too), or a tuple of them (``None`` for null;
a tuple may hold one nested shape beside ``None``, for a value of that shape or null)."""
_REPORT = {
    "name": str, "distribution": str, "version": str, "value": str, "status": str, "reason": str,
    "hook": (str, None), "impls": int, "domains": [str], "profiles": [str], "schemas": [str],
    "rejected": [{"op": str, "function": str, "error": str}], "seconds": (float, int), "hooks": [str],
}  # fmt: skip
_IMPL = {
    "op": str, "name": str, "pack": str, "onnx": _Row((int, _OPTIONAL_VERSION)),
    "domains": [_Row((str, int, _OPTIONAL_VERSION))], "priority": int, "predicate": bool, "override": bool,
    "complex": bool, "kind": str, "schema_checked": bool, "convention": str, "source": str, "profiles": [str],
    "params": (_Row((bool, bool, [_Row((str, bool, bool, bool, bool, str))])), None),
}  # fmt: skip
_DECLARED = {
    "reports": [_REPORT],
    "impls": [_IMPL],
    "profiles": [_Row((str, _Map(int), str))],
    "unsupported": [_Row((str, str, str))],
}
"""The shape :func:`_declared_data` writes: a type (or a tuple of them, ``None`` for null), ``[shape]``
for a list of items of that shape, ``{key: shape}`` for an object with exactly those keys."""


def _shape_problem(value: Any, shape: Any, where: str) -> str | None:
    """Where ``value`` (read from JSON) is not of ``shape`` (see :data:`_DECLARED`), or ``None``."""
    found = _mismatch(value, shape)
    if found is None:
        return None
    path, problem = found
    return f"{where}{''.join(f'[{p}]' if isinstance(p, int) else f'.{p}' for p in reversed(path))} {problem}"


def _mismatch(value: Any, shape: Any) -> tuple[list[int | str], str] | None:
    """``(path to the first value not of shape, reversed; what is wrong)``, or ``None`` (no string is
    made while everything fits: an entry of a few hundred impls is read on every cached command)."""
    if isinstance(shape, type):  # the most common shape first
        if type(value) is shape or (shape is float and type(value) is int):
            return None
        return [], f"is {type(value).__name__} {value!r:.40}, not {shape.__name__}"
    if isinstance(shape, tuple):
        if (value is None and None in shape) or any(type(value) is t for t in shape):
            return None
        nested = [t for t in shape if t is not None and not isinstance(t, type)]
        if nested and value is not None:  # a shape or null: one nested shape beside None
            return _mismatch(value, nested[0])
        names = " or ".join("null" if t is None else t.__name__ for t in shape)
        return [], f"is {type(value).__name__} {value!r:.40}, not {names}"
    pairs: list[tuple[int | str, Any, Any]]
    if isinstance(shape, list):
        if type(value) is not list:
            return [], "is not a list"
        pairs = [(i, v, shape[0]) for i, v in enumerate(value)]
    elif isinstance(shape, dict):
        if type(value) is not dict or value.keys() != shape.keys():
            return [], f"is not an object with the keys {sorted(shape)}"
        pairs = [(k, value[k], s) for k, s in shape.items()]
    elif isinstance(shape, _Row):
        if type(value) is not list or len(value) != len(shape.shapes):
            return [], f"is not a list of {len(shape.shapes)}"
        pairs = [(i, v, s) for i, (v, s) in enumerate(zip(value, shape.shapes, strict=True))]
    else:
        if type(value) is not dict:
            return [], "is not an object"
        pairs = [(k, v, shape.values) for k, v in value.items()]
    for key, item, item_shape in pairs:
        found = _mismatch(item, item_shape)
        if found is not None:
            found[0].append(key)
            return found
    return None


def _declared_of(data: Mapping[str, Any]) -> Declared:
    """What :func:`_declared_data` wrote, read back; ``ValueError`` naming the first value of another
    shape (an entry edited, or written by another version, is rebuilt, never an internal error)."""
    problem = _shape_problem(data, _DECLARED, "declared")
    if problem is not None:
        raise ValueError(problem)
    return Declared(
        reports=tuple(_report_of(r) for r in data["reports"]),
        impls=tuple(_impl_of(i) for i in data["impls"]),
        profiles=tuple((name, versions, pack) for name, versions, pack in data["profiles"]),
        unsupported=tuple((OpName.of(op), pack, reason) for op, pack, reason in data["unsupported"]),
    )


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
        changed = _changed(entry["path_state"], _path_state())
        if changed is None:
            changed = _changed(entry["file_state"], _file_state(f for f, _, _ in entry["file_state"]))
        if changed is not None:
            logger.debug("cache entry %s not used: %s changed since it was written", path, changed)
            return None
        low, high = entry["onnx_opset_range"]
        assume_onnx_opset_range((low, high))  # a fact of the installed onnx and onnxscript, as the key is
        declared = _declared_of(entry["declared"])
    except (KeyError, TypeError, ValueError, OpregError) as e:
        logger.debug("cache entry %s unusable (%s); loading the packs", path, e)
        return None
    logger.debug("what the packs declare read from %s", path)
    return declared


def write(selection: Selection, declared: Declared, before: list[list[Any]], directory: Path | None = None) -> None:
    """Store what the packs of ``selection`` declared. ``before``: :func:`_file_state` of the
    :func:`_package_files` taken before they loaded; if any changed since, nothing is stored.
    A cache that cannot be written is left alone (logged at DEBUG)."""
    directory = directory or cache_dir()
    if directory is None:
        return
    roots = _installed_roots()
    known = {f for f, _, _ in before}
    after = _file_state(known | _module_files(roots))
    if [s for s in after if s[0] in known] != before:
        logger.debug("a pack's file changed while the packs loaded; not caching what they declared")
        return
    key = _key(selection)
    entry = {
        "key": key,
        "path_state": _path_state(),
        "file_state": after,
        "declared": _declared_data(declared),
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


def before() -> list[list[Any]]:
    """The state of the packs' own files (opreg's, and every discovered pack's that is not an installed
    copy), taken before they load: what :func:`write` is given, so that an entry is written only if
    none of them changed while the packs loaded."""
    return _file_state(_package_files(_installed_roots()))


__all__ = [
    "CACHE_ENV",
    "MAX_ENTRIES",
    "NO_CACHE_ENV",
    "Declaration",
    "Declared",
    "before",
    "cache_dir",
    "cache_root",
    "disabled",
    "off",
    "read",
    "user_cache_dir",
    "write",
]
