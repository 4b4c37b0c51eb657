"""Finding op packs and choosing among them: the entry points of group ``opreg.plugins``, read
once per ``sys.path`` (nothing imported), and which of them a selection (``plugins=``,
``exclude=``, ``OPREG_DISABLE_PLUGIN_AUTOLOAD``) loads. Loading them is :mod:`opreg.packs.isolation`'s.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opreg.errors import InvalidArgumentError, PluginNotFoundError
from opreg.registry.impls import CORE_PACK, USER_PACK
from opreg.registry.opname import OpName

if TYPE_CHECKING:  # imported where packs are found: a selection needs none of it
    import importlib.metadata

ENTRY_POINT_GROUP = "opreg.plugins"
AUTOLOAD_ENV = "OPREG_DISABLE_PLUGIN_AUTOLOAD"
"""Set to ``1`` to load only the core pack and the packs asked for by name."""
PLUGIN_API_VERSION = 1
"""The plugin API this opreg serves; packs declare it as ``OPREG_API_VERSION``."""
SUPPORTED_API_VERSIONS = frozenset({1})
SLOW_IMPORT_SECONDS = 1.0
"""A pack whose entry point takes longer to import is reported as slow: every process
that builds a registry pays it (defer heavy imports into the hooks). :data:`SLOW_IMPORT_ENV`
overrides it."""
SLOW_IMPORT_ENV = "OPREG_SLOW_IMPORT_SECONDS"
"""Seconds a pack's import may take before it is reported as slow, where the machine says
otherwise than :data:`SLOW_IMPORT_SECONDS` (a loaded CI machine; a test that sets its own)."""


def slow_import_seconds() -> float:
    """The slow-import threshold: :data:`SLOW_IMPORT_ENV` if set (a positive number of seconds),
    else :data:`SLOW_IMPORT_SECONDS`."""
    value = os.environ.get(SLOW_IMPORT_ENV, "").strip()
    if not value:
        return SLOW_IMPORT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise InvalidArgumentError(f"{SLOW_IMPORT_ENV}={value!r}: give a positive number of seconds, such as 2.5")
    return seconds


def hook_names() -> tuple[str, ...]:
    """The hooks a pack may implement: every spec in :mod:`opreg.packs.hookspecs`, in its order."""
    from opreg.packs import hookspecs

    marker = f"{hookspecs.PROJECT_NAME}_spec"
    return tuple(name for name, value in vars(hookspecs).items() if hasattr(value, marker))


# -- discovery ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class DiscoveredPack:
    """An installed pack's entry point, with its distribution's name and version (read once).

    Fields:
        entry_point: the ``importlib.metadata.EntryPoint`` in group ``opreg.plugins``.
        distribution: the name of the distribution that declares it (``"?"`` if unknown).
        version: that distribution's version.
    """

    entry_point: importlib.metadata.EntryPoint
    distribution: str
    version: str

    @property
    def name(self) -> str:
        """The pack's name: the entry point's name (what ``-p NAME`` takes)."""
        return self.entry_point.name

    @property
    def module(self) -> str:
        """The module the entry point names."""
        return self.entry_point.module

    @classmethod
    def of(cls, ep: importlib.metadata.EntryPoint) -> DiscoveredPack:
        if ep.dist is None:
            return cls(ep, "?", "?")
        metadata = ep.dist.metadata  # parsed once here; .name/.version would each re-read it
        return cls(ep, metadata["Name"] or "?", metadata["Version"] or "?")


_cache_lock = threading.RLock()
_ep_cache: dict[tuple[str, ...], tuple[DiscoveredPack, ...]] = {}


def clear_cache() -> None:
    """Forget discovered entry points (after installing a pack; :func:`opreg.packs.plugins.clear_cache` calls it)."""
    with _cache_lock:
        _ep_cache.clear()


def discovered() -> tuple[DiscoveredPack, ...]:
    """The installed packs in load order, cached per ``sys.path``: the core pack first,
    then by name and distribution. The load order decides which of two packs keeps
    a contested profile name (the later one is reported). Nothing is imported."""
    key = tuple(sys.path)
    with _cache_lock:
        found = _ep_cache.get(key)
        if found is None:
            import importlib.metadata

            eps = [DiscoveredPack.of(ep) for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
            found = tuple(sorted(eps, key=lambda f: (f.name != CORE_PACK, f.name, f.distribution)))
            _ep_cache[key] = found
    return found


def discover() -> tuple[importlib.metadata.EntryPoint, ...]:
    """Entry points of the group ``opreg.plugins``, in load order; nothing is imported."""
    return tuple(f.entry_point for f in discovered())


def autoload_disabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() not in ("", "0", "false", "no")


def selection_reason(name: str, plugins: frozenset[str] | None, exclude: frozenset[str]) -> str | None:
    """Why pack ``name`` is not selected, or ``None`` if it is."""
    if name in exclude:
        return "excluded (exclude= / -p no:NAME)"
    if name == CORE_PACK:
        return None
    if plugins is not None:
        return None if name in plugins else "not among the requested packs (plugins= / -p NAME)"
    if autoload_disabled():
        return f"autoload is off ({AUTOLOAD_ENV}); request it with plugins= or -p {name}"
    return None


def pack_names(value: Iterable[str] | None, what: str) -> frozenset[str] | None:
    """A selection argument as a set of pack names; a lone string is a mistake worth naming."""
    if value is None:
        return None
    if isinstance(value, str):
        raise InvalidArgumentError(
            f"{what}= takes a list of pack names, got the string {value!r}: write {what}=[{value!r}]"
        )
    names = frozenset(value)
    bad = sorted(repr(n) for n in names if not isinstance(n, str) or not n)
    if bad:
        raise InvalidArgumentError(f"{what}= takes pack names (non-empty strings), got {', '.join(bad)}")
    return names


def require_installed(names: Iterable[str], what: str = "pack", *, installed: Iterable[str] | None = None) -> None:
    """Raise :class:`PluginNotFoundError` naming every pack in ``names`` that is not installed
    (``installed``: the installed packs' names, if known; by default, the discovered ones)."""
    names = set(names)
    if not names:
        return
    installed = {f.name for f in discovered()} if installed is None else set(installed)
    missing = sorted(names - installed)
    if missing:
        raise PluginNotFoundError(
            f"no installed {what} named {', '.join(map(repr, missing))}; installed packs: "
            f"{', '.join(sorted(installed)) or 'none'} (pip install the pack, or check `opreg plugins`)"
        )


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which packs to load and how to settle their ties: :func:`build_registry`'s arguments, checked.

    Fields:
        plugins: pack names to load besides the core pack (``None``: every installed pack,
            unless ``OPREG_DISABLE_PLUGIN_AUTOLOAD`` is set).
        exclude: pack names to leave out.
        prefer: op -> the pack that wins that op's ties.
    """

    plugins: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    prefer: Mapping[OpName, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(
        cls,
        plugins: Iterable[str] | None = None,
        exclude: Iterable[str] | None = None,
        prefer: Mapping[Any, str] | None = None,
    ) -> Selection:
        return cls(
            pack_names(plugins, "plugins"),
            pack_names(exclude, "exclude") or frozenset(),
            {OpName.of(op): pack for op, pack in (prefer or {}).items()},
        )

    def require_installed(self, installed: Iterable[str] | None = None) -> None:
        """Raise :class:`PluginNotFoundError` for a pack this selection names that is not installed
        (``installed``: the installed packs' names; by default, the discovered ones)."""
        require_installed(self.plugins or (), installed=installed)
        require_installed(set(self.prefer.values()) - {USER_PACK}, "pack to prefer", installed=installed)


__all__ = [
    "AUTOLOAD_ENV", "ENTRY_POINT_GROUP", "PLUGIN_API_VERSION", "SLOW_IMPORT_ENV", "SLOW_IMPORT_SECONDS",
    "SUPPORTED_API_VERSIONS", "DiscoveredPack", "Selection", "autoload_disabled", "clear_cache", "discover",
    "discovered", "hook_names", "pack_names", "require_installed", "selection_reason", "slow_import_seconds",
]  # fmt: skip
