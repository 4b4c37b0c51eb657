"""Building the registry and its plugin host from the installed op packs.

Packs are entry points in the group ``opreg.plugins`` (the core pack too), found by
:mod:`opreg.packs.discovery`; nothing is imported until a registry is first asked for. Each pack is
loaded and hooked on its own (:mod:`opreg.packs.isolation`): a pack that fails to import, is written
for another plugin API or torch, implements an unknown hook, raises in a hook, or has every impl
rejected is reported and left out, and the others load as usual. ``strict=True`` turns any such
failure, and any tie between packs the user has not settled with ``prefer=``, into a
:class:`PluginError`.

What the packs declare becomes a frozen :class:`~opreg.Registry` (a value: no pack code behind
it); their hooks are called through the :class:`~opreg.packs.host.PackHost` built beside it.
:func:`load` gives both (:class:`Loaded`), cached per selection; :func:`default_registry` and
:func:`default_host` are its two halves, :func:`build` and :func:`build_registry` the uncached
forms.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opreg.errors import InvalidArgumentError, PluginError
from opreg.packs import discovery, fingerprint, packcache
from opreg.packs.declaration import Declared
from opreg.packs.discovery import (
    AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    PLUGIN_API_VERSION,
    SLOW_IMPORT_ENV,
    SLOW_IMPORT_SECONDS,
    SUPPORTED_API_VERSIONS,
    DiscoveredPack,
    Selection,
    autoload_disabled,
    discover,
    discovered,
    hook_names,
    pack_names,
    require_installed,
    selection_reason,
    slow_import_seconds,
)
from opreg.packs.host import PackHost
from opreg.packs.isolation import TABLE_ATTRIBUTE, load_one, settle, table_profile, warn_once
from opreg.packs.packset import PackSet
from opreg.pluginapi import DISABLED, FAILED, INCOMPATIBLE, LOADED, PackReport, PackReports, Rejection
from opreg.registry import _opsets
from opreg.registry.impls import CORE_PACK, USER_PACK, Impl
from opreg.registry.opname import OpName
from opreg.registry.registry import Registry
from opreg.registry.targets import BUILTIN_PROFILES

if TYPE_CHECKING:  # imported where packs are loaded: assembling cached data needs none of them
    import pluggy

logger = logging.getLogger(__name__)

_cache_lock = threading.RLock()
_loaded_cache: dict[tuple, Loaded] = {}
_beside: dict[int, tuple[PackReports, PackHost]] = {}
"""The hosts of the latest :func:`build` s, by their registries' reports (held, so that an id is not reused)."""
_BESIDE_KEPT = 8


def clear_cache() -> None:
    """Forget discovered entry points and built registries and hosts (after installing a pack)."""
    with _cache_lock:
        discovery.clear_cache()
        _loaded_cache.clear()
        _beside.clear()


def pack_conflicts(impls: Iterable[Impl], preferences: Mapping[OpName, str] | None = None) -> list[tuple[Impl, ...]]:
    """Groups of unconditional impls of one op from different packs that tie wherever a
    target admits them (same override, priority and requirement rank), and that no
    preference settles; each group in the order resolution uses."""
    preferences = preferences or {}
    groups: dict[tuple, list[Impl]] = {}
    for impl in impls:
        if impl.predicate is None and not impl.override:
            groups.setdefault((impl.op, impl.tie_key()), []).append(impl)
    found = []
    for (op, _), group in sorted(groups.items(), key=lambda kv: str(kv[0][0])):
        if len({i.pack for i in group}) > 1 and preferences.get(op) not in {i.pack for i in group}:
            found.append(tuple(sorted(group, key=lambda i: i.tie_break())))
    return found


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The selected packs, loaded: the value they declare and the object that calls their code.

    Fields:
        registry: the frozen :class:`~opreg.Registry` of their impls, profiles, unsupported ops and
            reports (a value: no pack code behind it).
        host: the :class:`~opreg.packs.host.PackHost` that calls the loaded packs' hooks (session
            configuration, reference kernels, capture patches, rewrite rules, functions): what an
            export takes as ``host=``.
    """

    registry: Registry
    host: PackHost


def build(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
    prefer: Mapping[Any, str] | None = None,
) -> Loaded:
    """Load the selected packs anew (uncached): their frozen registry and their host.

    ``plugins``: pack names to load besides the core pack (``None``: every
    installed pack, unless ``OPREG_DISABLE_PLUGIN_AUTOLOAD`` is set).
    ``exclude``: pack names to leave out (the core pack too). ``prefer``:
    op -> pack that wins that op's ties (by default the core pack does).
    ``strict``: raise :class:`PluginError` if any selected pack fails, or if
    packs tie on an op that ``prefer`` does not settle; the host raises a
    hook's failure too. The packs' load reports are ``registry.packs``.
    """
    selection = Selection.of(plugins, exclude, prefer)
    selection.require_installed()
    declared, packs = load_packs(selection, strict=strict)
    loaded = Loaded(assemble(declared, selection, strict=strict), PackHost(packs))
    with _cache_lock:  # host_of finds it by the reports, which the registry's copies share
        _beside[id(loaded.registry.packs)] = (loaded.registry.packs, loaded.host)
        while len(_beside) > _BESIDE_KEPT:
            del _beside[next(iter(_beside))]
    return loaded


def build_registry(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
    prefer: Mapping[Any, str] | None = None,
) -> Registry:
    """A new, frozen (uncached) registry of the selected packs: :func:`build`'s registry (arguments
    as there). Export with ``host=build(...).host`` to use the hooks of the packs loaded with it."""
    return build(plugins, exclude, strict, prefer).registry


def declared_registry(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
    prefer: Mapping[Any, str] | None = None,
    *,
    require: Iterable[str] = (),
) -> Registry:
    """The registry :func:`build_registry` would build (same arguments, same errors), for listing and
    explaining: read from :mod:`opreg.packs.packcache` when nothing changed, else built (the packs load) and
    stored. ``require``: more pack names that must be installed (``-p no:NAME``'s). A registry read
    from the cache has :class:`~opreg.packs.declaration.Declaration` s for functions and predicates (a
    registry calls no hook either way): use :func:`build_registry` to export."""
    selection = Selection.of(plugins, exclude, prefer)
    directory = packcache.cache_dir()
    declared = packcache.read(selection, directory) if directory is not None else None
    installed = None if declared is None else [r.name for r in declared.reports]
    require_installed(require, installed=installed)
    selection.require_installed(installed)
    if declared is None:
        declared, _ = load_packs(selection, strict=strict)
    return assemble(declared, selection, strict=strict)


def load_packs(selection: Selection, *, strict: bool = False) -> tuple[Declared, PackSet]:
    """Import and hook the selected packs (their code runs): what they declare, and the
    :class:`PackSet` that calls their hooks (``strict``: a failing hook raises). Isolation is
    :func:`opreg.packs.isolation.load_one`'s, one pack at a time. What their impls were found to be is
    taken from :mod:`opreg.packs.packcache` while none of their code changed (:class:`opreg.registry.registrar.Known`),
    and stored there when it did."""
    directory = packcache.cache_dir()
    cached = packcache.read(selection, directory) if directory is not None else None
    before = fingerprint.before() if directory is not None and cached is None else None
    declared, packs = _load_packs(selection, strict, cached)
    if before is not None:
        packcache.write(selection, declared, before, directory)
    return declared, packs


def _known(cached: Declared | None) -> dict[str, Any]:
    """Each pack's :class:`~opreg.registry.registrar.Known` impls from a cache entry: those of the packs that
    loaded with no impl rejected (a rejection leaves no impl to line the calls up by)."""
    from opreg.registry.registrar import Known

    if cached is None:
        return {}
    clean = {r.name for r in cached.reports if r.status == LOADED and not r.rejected}
    return {name: Known(i for i in cached.impls if i.pack == name) for name in clean}


def _load_packs(selection: Selection, strict: bool, cached: Declared | None) -> tuple[Declared, PackSet]:
    import pluggy

    from opreg.packs import hookspecs

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    reports: list[PackReport] = []
    impls: list[Impl] = []
    profiles: list[tuple[str, dict, str]] = []
    unsupported: list[tuple[OpName, str, str]] = []
    loaded_plugins: dict[str, Any] = {}
    seen: dict[str, str] = {}
    known = _known(cached)
    with _opsets.reading():  # the helpers the packs' impls share are read once
        for found in discovered():
            name = found.name
            base = PackReport(name, found.distribution, found.version, found.entry_point.value, DISABLED)
            if name in seen:
                reason = f"pack name {name!r} is already taken by {seen[name]}"
                warn_once(name, reason)
                reports.append(dataclasses.replace(base, status=FAILED, reason=reason))
                continue
            seen[name] = base.distribution
            reason = selection_reason(name, selection.plugins, selection.exclude)
            if reason is not None:
                reports.append(dataclasses.replace(base, reason=reason))
                continue
            loaded = load_one(pm, found, base, known.get(name))
            if loaded.registrar is None:
                reports.append(loaded.report)
                continue
            taken = {**{n: "opreg" for n in BUILTIN_PROFILES}, **{n: p for n, _, p in profiles}}
            report, accepted = settle(loaded, taken)
            reports.append(report)
            if report.status != LOADED:
                pm.unregister(loaded.plugin)
                continue
            loaded_plugins[name] = loaded.plugin
            impls += loaded.registrar.impls
            profiles += accepted
            unsupported += [(op, name, why) for op, why in loaded.registrar.declined.items()]

    reports = [dataclasses.replace(r, hooks=_hooks_of(pm, loaded_plugins.get(r.name))) for r in reports]
    if known:
        taken = sum(k.taken for k in known.values())
        logger.debug("%d of %d impls as the pack cache knew them; the others read anew", taken, len(impls))
    declared = Declared(tuple(reports), tuple(impls), tuple(profiles), tuple(unsupported))
    return declared, PackSet(declared.reports, pm, loaded_plugins, contracts=hookspecs.CONTRACTS, strict=strict)


def assemble(declared: Declared, selection: Selection, *, strict: bool = False) -> Registry:
    """The frozen registry of what packs ``declared``, ties settled as ``selection`` prefers (data only:
    no pack code runs; :func:`declared_registry` builds one so, from its cache). ``strict`` as
    for :func:`build`."""
    preferences = selection.prefer
    loaded = {r.name for r in declared.reports if r.status == LOADED}
    _check_preferences(preferences, declared.impls, loaded)
    known = {(i.op, i.pack) for i in declared.impls}
    settled = {op: pack for op, pack in preferences.items() if (op, pack) in known}
    registry = Registry.build(
        declared.impls,
        profiles=declared.profiles,
        unsupported=declared.unsupported,
        preferences=settled,
        packs=PackReports(declared.reports, (selection.plugins, selection.exclude, bool(strict))),
    )
    if strict:
        _refuse_problems(declared.reports, declared.impls, preferences)
    return registry


def _check_preferences(preferences: Mapping[OpName, str], impls: Iterable[Impl], loaded: set[str]) -> None:
    """Refuse a preference for a loaded pack that has no impl of the op (a misspelled op, or
    the wrong pack): it would settle nothing. One for a pack that did not load is left to
    that pack's report."""
    packs_of: dict[OpName, set[str]] = {}
    for impl in impls:
        packs_of.setdefault(impl.op, set()).add(impl.pack)
    for op, pack in preferences.items():
        if pack not in loaded or pack in packs_of.get(op, ()):
            continue
        have = packs_of.get(op)
        if have:
            hint = f"packs with an impl of it: {', '.join(sorted(have))}"
        else:
            names = [str(o) for o, p in packs_of.items() if pack in p]
            close = difflib.get_close_matches(str(op), names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"no pack has an impl of {op}"
        raise InvalidArgumentError(f"cannot prefer pack {pack!r} for {op}: it has no impl of it ({hint})")


def _hooks_of(pm: pluggy.PluginManager, plugin: Any) -> tuple[str, ...]:
    """The hooks a loaded pack implements, sorted (a fact of its report: data, not a call)."""
    if plugin is None:
        return ()
    return tuple(sorted(caller.name for caller in pm.get_hookcallers(plugin) or ()))


def _refuse_problems(reports: Iterable[PackReport], impls: Iterable[Impl], preferences: Mapping[OpName, str]) -> None:
    problems = [r.describe() for r in reports if not r.ok]
    problems += [
        f"{group[0].op}: {', '.join(i.label for i in group)} tie (settle it with prefer={{'{group[0].op}': PACK}} "
        f"or -p no:PACK)"
        for group in pack_conflicts(impls, preferences)
    ]
    if problems:
        raise PluginError(
            "strict mode: "
            + "; ".join(problems)
            + " (fix or exclude these packs, or drop strict mode to leave them out)"
        )


def load(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
    prefer: Mapping[Any, str] | None = None,
) -> Loaded:
    """The installed packs of this selection, loaded once per process: their shared, frozen registry
    and their host (:class:`Loaded`). Cached per plugin selection, preferences and installed packs;
    arguments as for :func:`build`."""
    key = (
        pack_names(plugins, "plugins"),
        pack_names(exclude, "exclude") or frozenset(),
        bool(strict),
        tuple(sorted((str(OpName.of(op)), pack) for op, pack in (prefer or {}).items())),
        autoload_disabled(),
        discovered(),
    )
    with _cache_lock:
        loaded = _loaded_cache.get(key)
        if loaded is None:
            loaded = _loaded_cache[key] = build(plugins, exclude, strict, prefer)
    return loaded


def default_registry(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
    prefer: Mapping[Any, str] | None = None,
) -> Registry:
    """The registry built from the installed packs, shared and frozen: :func:`load`'s registry.

    Cached per plugin selection, preferences and installed packs;
    :meth:`Registry.copy` it to add impls of your own. Arguments as for
    :func:`build`.
    """
    return load(plugins, exclude, strict, prefer).registry


def default_host(
    plugins: Iterable[str] | None = None, exclude: Iterable[str] | None = None, strict: bool = False
) -> PackHost:
    """The host of the installed packs of this selection (:func:`load`'s): what an export asks of
    their code when it is given no ``host=``. Arguments as for :func:`build`."""
    return load(plugins, exclude, strict).host


_NO_PACKS = PackHost()


def of_settings(settings: Any) -> Loaded:
    """The registry and the host an export with :class:`opreg.ExportSettings` ``settings`` uses:
    ``registry=``, else the installed packs' of ``plugins``/``exclude``; ``host=``, else the host of
    the installed packs of the registry's selection (:func:`host_of`)."""
    if settings.registry is None:
        loaded = load(plugins=settings.plugins, exclude=settings.exclude)
        return loaded if settings.host is None else Loaded(loaded.registry, settings.host)
    return Loaded(settings.registry, settings.host if settings.host is not None else host_of(settings.registry))


def host_of(registry: Registry) -> PackHost:
    """The host of the packs ``registry`` was built from: the one :func:`build` made beside it (one
    of the latest few builds, or a copy of its registry: a copy keeps the reports), else
    :func:`default_host` of the selection its reports answer (``registry.packs.selection``), or a
    host with no packs for a registry built by hand. What an export given ``registry=`` and no
    ``host=`` asks: the packs are not loaded a second time for it."""
    with _cache_lock:
        packs, host = _beside.get(id(registry.packs), (None, None))
    if packs is registry.packs and host is not None:
        return host
    selection = registry.packs.selection
    return _NO_PACKS if selection is None else default_host(*selection)


__all__ = [
    "AUTOLOAD_ENV", "CORE_PACK", "DISABLED", "ENTRY_POINT_GROUP", "FAILED", "INCOMPATIBLE", "LOADED",
    "PLUGIN_API_VERSION", "SLOW_IMPORT_ENV", "SLOW_IMPORT_SECONDS", "SUPPORTED_API_VERSIONS", "TABLE_ATTRIBUTE",
    "USER_PACK", "Declared", "DiscoveredPack", "Loaded", "PackReport", "PackReports", "PackSet", "Rejection",
    "Selection", "assemble", "autoload_disabled", "build", "build_registry", "clear_cache", "declared_registry",
    "default_host", "host_of", "of_settings",
    "default_registry", "discover", "discovered", "hook_names", "load", "load_packs", "pack_conflicts",
    "require_installed", "selection_reason", "slow_import_seconds", "table_profile",
]  # fmt: skip
