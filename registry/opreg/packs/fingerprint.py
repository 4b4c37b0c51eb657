"""The state an entry of the packs' cache was written in, and whether it still holds
(:mod:`opreg.packs.packcache`, "When an entry is used"): the distributions and ``.pth`` files of
every ``sys.path`` entry (:func:`path_state`), and the files of opreg, of the packs and of every
other imported module that pip did not install (:func:`package_files`, :func:`module_files`), by
modification time and size (:func:`file_state`); :func:`changed` names the first that differs.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable
from typing import Any

from opreg.packs import discovery

DIST_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".pth")


def path_state() -> list[list[Any]]:
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
        state.append([path, file_state(os.path.join(path, n) for n in names)])
    return state


def file_state(paths: Iterable[str]) -> list[list[Any]]:
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


def changed(old: list[list[Any]], new: list[list[Any]]) -> str | None:
    """The first path whose state differs between two sorted lists of ``[path, state...]`` (a
    distribution inside a ``sys.path`` entry, for :func:`path_state`), or ``None``."""
    if old == new:
        return None
    for before, now in zip(old, new, strict=False):
        if before == now:
            continue
        if before[0] == now[0] and isinstance(now[1], list) and isinstance(before[1], list):
            return changed(before[1], now[1]) or str(now[0])
        return str(min(before[0], now[0]))
    longer = old if len(old) > len(new) else new
    return str(longer[min(len(old), len(new))][0])


def installed_roots() -> tuple[str, ...]:
    """Folders whose files change only through pip (or never): the standard library, the site
    directories, and every ``sys.path`` entry that holds a ``*.dist-info`` folder (one pip, or a
    tool like it, installs into; their distributions are watched by :func:`path_state`)."""
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


def package_files(roots: tuple[str, ...]) -> set[str]:
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


def module_files(roots: tuple[str, ...]) -> set[str]:
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


def before() -> list[list[Any]]:
    """The state of the packs' own files (opreg's, and every discovered pack's that is not an installed
    copy), taken before they load: what :func:`write` is given, so that an entry is written only if
    none of them changed while the packs loaded."""
    return file_state(package_files(installed_roots()))
