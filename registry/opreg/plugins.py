"""Finding, loading and isolating op packs, and building registries from them.

Packs are entry points in the group ``opreg.plugins`` (the core pack too).
Nothing is imported until a registry is first asked for. Each pack is loaded
and hooked on its own (pluggy's ``check_pending`` and ``subset_hook_caller``,
one pack at a time): a pack that fails to import, is written for another
plugin API or torch, implements an unknown hook, raises in a hook, or has
every impl rejected is reported and left out, and the others load as usual.
``strict=True`` turns any such failure, and any tie between packs the user
has not settled with ``prefer=``, into a :class:`PluginError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opreg.errors import InvalidArgumentError, InvalidTargetError, OpregError, PluginError, PluginNotFoundError
from opreg.hookchecks import Checked
from opreg.host import PackHost
from opreg.opname import OpName
from opreg.packset import PackSet, call_one
from opreg.pluginapi import DISABLED, FAILED, INCOMPATIBLE, LOADED, HookError, PackReport, Rejection
from opreg.registry import CORE_PACK, USER_PACK, Impl, Registry
from opreg.targets import BUILTIN_PROFILES, Target, domain_label

if TYPE_CHECKING:  # imported where packs are found and loaded: assembling cached data needs none of them
    import importlib.metadata

    import pluggy

    from opreg.registrar import Registrar

logger = logging.getLogger(__name__)

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
TABLE_ATTRIBUTE = "OPREG_TRANSLATION_TABLE"
"""A pack module may define a ``custom_translation_table`` under this name; its functions
are registered before the module's ``opreg_register_ops`` hook runs."""


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
    """The hooks a pack may implement: every spec in :mod:`opreg.hookspecs`, in its order."""
    from opreg import hookspecs

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
_registry_cache: dict[tuple, Registry] = {}
_warned: set[tuple[str, str]] = set()


def clear_cache() -> None:
    """Forget discovered entry points and built registries (after installing a pack)."""
    with _cache_lock:
        _ep_cache.clear()
        _registry_cache.clear()


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


def _selection_reason(name: str, plugins: frozenset[str] | None, exclude: frozenset[str]) -> str | None:
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


def _names(value: Iterable[str] | None, what: str) -> frozenset[str] | None:
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


# -- loading --------------------------------------------------------------------


def _torch_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _incompatibility(obj: Any) -> str | None:
    api = getattr(obj, "OPREG_API_VERSION", None)
    if api is None:
        return f"declares no OPREG_API_VERSION; packs for this opreg set OPREG_API_VERSION = {PLUGIN_API_VERSION}"
    if api not in SUPPORTED_API_VERSIONS:
        served = ", ".join(map(str, sorted(SUPPORTED_API_VERSIONS)))
        return (
            f"written for plugin API {api!r}, this opreg serves API {served}: "
            "install a release of the pack (or of opreg) that matches"
        )
    requires = getattr(obj, "OPREG_REQUIRES_TORCH", None)
    if requires:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import Version

        try:
            spec = SpecifierSet(requires)
        except InvalidSpecifier:
            return f"OPREG_REQUIRES_TORCH = {requires!r} is not a PEP 440 specifier (e.g. '>=2.6,<3')"
        installed = _torch_version()
        if installed is None:
            return f"needs torch{requires}, but torch is not installed"
        if not spec.contains(Version(installed).public, prereleases=True):
            return f"supports torch{requires}, installed torch is {installed}"
    return None


@dataclasses.dataclass
class _Loaded:
    """One pack after its registration hooks ran: what it contributes, not yet in a registry."""

    report: PackReport
    plugin: Any = None
    registrar: Registrar | None = None
    profiles: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    schemas: list[Any] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)


def _call_one(pm: pluggy.PluginManager, plugin: Any, pack: str, hook: str, **kwargs: Any) -> Checked:
    """``plugin``'s ``hook`` through the one per-pack caller (:func:`opreg.packset.call_one`), as
    the exporter and the kit call it: a :class:`~opreg.hookchecks.Checked`, or its
    :class:`~opreg.pluginapi.HookError`."""
    from opreg import hookspecs

    return call_one(pm, plugin, pack, hookspecs.CONTRACTS[hook], kwargs)


def _warn_once(pack: str, reason: str, error: BaseException | None = None) -> None:
    """A failed pack is logged once per process at WARNING (its one-line reason), the
    traceback at DEBUG: every registry build meets the same failure again."""
    with _cache_lock:
        if (pack, reason) in _warned:
            return
        _warned.add((pack, reason))
    logger.warning("pack %r left out: %s", pack, reason)
    if error is not None:
        logger.debug("pack %r: traceback of the failure", pack, exc_info=error)


def _load_one(pm: pluggy.PluginManager, found: DiscoveredPack, base: PackReport) -> _Loaded:
    import pluggy

    from opreg.registrar import Registrar

    ep = found.entry_point
    started = time.perf_counter()

    def failed(reason: str, hook: str | None = None, status: str = FAILED, error: BaseException | None = None):
        _warn_once(ep.name, f"{hook + ': ' if hook else ''}{reason}", error)
        return _Loaded(dataclasses.replace(base, status=status, reason=reason, hook=hook))

    if not ep.pattern.match(ep.value):
        return failed(
            f"entry point value {ep.value!r} is not of the form 'module' or 'module:attr' "
            f"(in {base.distribution}'s entry_points.txt; TOML quotes do not belong there)"
        )
    try:
        obj = ep.load()
    except Exception as e:
        return failed(f"import of {ep.value} failed: {type(e).__name__}: {e}", error=e)
    imported = time.perf_counter() - started
    if isinstance(obj, Mapping):  # the entry point names a custom_translation_table
        return _load_table(pm, found, base, obj, imported)

    problem = _incompatibility(obj)
    if problem is not None:
        return failed(problem, status=INCOMPATIBLE)

    try:
        pm.register(obj, name=ep.name)
    except Exception as e:
        return failed(f"bad hook implementation: {e}", error=e)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        pm.unregister(obj)
        return failed(f"{e}; the hooks are {', '.join(hook_names())}")

    loaded = _Loaded(base, plugin=obj)
    hook = "opreg_targets"
    try:
        checked = _call_one(pm, obj, ep.name, hook)
        loaded.profiles.update(checked.value)
        loaded.problems += [f"{hook}: {problem}" for problem in checked.problems]
        hook = "opreg_schemas"
        checked = _call_one(pm, obj, ep.name, hook)
        loaded.schemas.extend(checked.value)
        loaded.problems += [f"{hook}: {problem}" for problem in checked.problems]
        registrar = Registrar(ep.name)
        table = getattr(obj, TABLE_ATTRIBUTE, None)
        if table is not None:
            hook = TABLE_ATTRIBUTE
            registrar.register_translation_table(table)
        hook = "opreg_register_ops"
        _call_one(pm, obj, ep.name, hook, registry=registrar)
    except HookError as e:
        pm.unregister(obj)
        return failed(e.problem, hook=hook, error=e.__cause__)
    except Exception as e:
        pm.unregister(obj)
        return failed(f"raised {type(e).__name__}: {e}", hook=hook, error=e)
    loaded.registrar = registrar
    loaded.report = dataclasses.replace(base, seconds=imported)
    return loaded


class TablePack:
    """What pluggy holds for a pack whose entry point names a ``custom_translation_table``:
    no hooks, only the table's impls."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<translation table pack {self.name!r}>"


def _load_table(
    pm: pluggy.PluginManager, found: DiscoveredPack, base: PackReport, table: Mapping, imported: float
) -> _Loaded:
    """A pack that is a ``custom_translation_table``: its functions, and a target profile named
    after it when they emit custom domains (see :func:`table_profile`)."""
    from opreg.registrar import Registrar

    name = found.name
    registrar = Registrar(name)
    try:
        registrar.register_translation_table(table)
    except Exception as e:  # the table cannot be read at all
        reason = f"translation table {found.entry_point.value}: {type(e).__name__}: {e}"
        _warn_once(name, reason, e)
        return _Loaded(dataclasses.replace(base, status=FAILED, reason=reason))
    plugin = TablePack(name)
    pm.register(plugin, name=name)
    profile = table_profile(registrar.impls)
    profiles = {name: profile} if profile and name.isidentifier() else {}
    report = dataclasses.replace(base, seconds=imported)
    return _Loaded(report, plugin=plugin, registrar=registrar, profiles=profiles)


def table_profile(impls: Iterable[Impl]) -> dict[str, int] | None:
    """The target profile a table's impls need: the ``onnx`` profile plus every custom
    domain they emit, at the newest minimum any of them declares; ``None`` when they
    emit no custom domain."""
    domains: dict[str, int] = {}
    for impl in impls:
        for domain, versions in impl.requirement.domains:
            domains[domain] = max(domains.get(domain, 0), versions.min)
    if not domains:
        return None
    return {**BUILTIN_PROFILES["onnx"], **domains}


def _settle(loaded: _Loaded, taken_profiles: Mapping[str, str]) -> tuple[PackReport, list[tuple[str, dict, str]]]:
    """The report of a loaded pack and the profiles it may add (a name already taken is reported)."""
    report = loaded.report
    registrar = loaded.registrar
    assert registrar is not None
    rejected = tuple(registrar.rejected)
    if rejected and not registrar.impls:
        reason = f"all {len(rejected)} impl(s) rejected; first: {rejected[0].op}: {rejected[0].error}"
        _warn_once(report.name, reason)
        return dataclasses.replace(
            report, status=FAILED, hook="opreg_register_ops", rejected=rejected, reason=reason
        ), []
    problems = list(loaded.problems)
    profiles = []
    for name, versions in loaded.profiles.items():
        if name in taken_profiles:
            problems.append(
                f"profile {name!r} rejected: target profile {name!r} from {report.name} is already defined by "
                f"{taken_profiles[name]}: choose another name"
            )
            continue
        try:
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidTargetError(f"profile name must be an identifier, got {name!r}")
            Target.of(dict(versions))
        except (OpregError, TypeError, ValueError) as e:
            problems.append(f"profile {name!r} rejected: {e}")
            continue
        profiles.append((name, versions, report.name))
    schemas: tuple[str, ...] = ()
    try:
        _register_schemas(loaded.schemas)
        schemas = tuple(sorted({f"{s.domain}::{s.name}" for s in loaded.schemas}))
    except Exception as e:
        problems.append(f"schemas rejected: {e}")
    if rejected:
        problems.append(f"{len(rejected)} impl(s) rejected")
    if report.seconds > slow_import_seconds():
        problems.append(
            f"slow import: importing {report.value} took {report.seconds:.1f} s, paid by every process that "
            "discovers packs (import heavy modules inside the hooks that need them)"
        )
    domains = sorted({domain_label(d) for i in registrar.impls for d in ("", *dict(i.requirement.domains))})
    report = dataclasses.replace(
        report, status=LOADED, reason="; ".join(problems), impls=len(registrar.impls),
        domains=tuple(domains), profiles=tuple(name for name, _, _ in profiles), rejected=rejected,
        schemas=schemas,
    )  # fmt: skip
    return report, profiles


def _register_schemas(schemas: Iterable[Any]) -> None:
    """Register custom-domain OpSchemas with onnx, once each."""
    schemas = list(schemas)
    if not schemas:
        return
    import onnx.defs

    for schema in schemas:
        if not isinstance(schema, onnx.defs.OpSchema):
            raise PluginError(f"opreg_schemas must return onnx.defs.OpSchema objects, got {schema!r}")
        if not onnx.defs.has(schema.name, schema.since_version, schema.domain):
            onnx.defs.register_schema(schema)


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
class Declared:
    """What the selected packs declare, as data: what a registry is built from besides the packs' hooks.

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
            _names(plugins, "plugins"),
            _names(exclude, "exclude") or frozenset(),
            {OpName.of(op): pack for op, pack in (prefer or {}).items()},
        )

    def require_installed(self, installed: Iterable[str] | None = None) -> None:
        """Raise :class:`PluginNotFoundError` for a pack this selection names that is not installed
        (``installed``: the installed packs' names; by default, the discovered ones)."""
        require_installed(self.plugins or (), installed=installed)
        require_installed(set(self.prefer.values()) - {USER_PACK}, "pack to prefer", installed=installed)


def build_registry(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
    prefer: Mapping[Any, str] | None = None,
) -> Registry:
    """Load the selected packs into a new, frozen (uncached) registry.

    ``plugins``: pack names to load besides the core pack (``None``: every
    installed pack, unless ``OPREG_DISABLE_PLUGIN_AUTOLOAD`` is set).
    ``exclude``: pack names to leave out (the core pack too). ``prefer``:
    op -> pack that wins that op's ties (by default the core pack does).
    ``strict``: raise :class:`PluginError` if any selected pack fails, or if
    packs tie on an op that ``prefer`` does not settle. The packs' hooks are
    called through ``registry.host``; their load reports are ``registry.packs``.
    """
    selection = Selection.of(plugins, exclude, prefer)
    selection.require_installed()
    declared, packs = load_packs(selection, strict=strict)
    return assemble(declared, selection, strict=strict, packs=packs)


def load_packs(selection: Selection, *, strict: bool = False) -> tuple[Declared, PackSet]:
    """Import and hook the selected packs (their code runs): what they declare, and the
    :class:`PackSet` that calls their hooks (``strict``: a failing hook raises)."""
    import pluggy

    from opreg import hookspecs

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    reports: list[PackReport] = []
    impls: list[Impl] = []
    profiles: list[tuple[str, dict, str]] = []
    unsupported: list[tuple[OpName, str, str]] = []
    loaded_plugins: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for found in discovered():
        name = found.name
        base = PackReport(name, found.distribution, found.version, found.entry_point.value, DISABLED)
        if name in seen:
            reason = f"pack name {name!r} is already taken by {seen[name]}"
            _warn_once(name, reason)
            reports.append(dataclasses.replace(base, status=FAILED, reason=reason))
            continue
        seen[name] = base.distribution
        reason = _selection_reason(name, selection.plugins, selection.exclude)
        if reason is not None:
            reports.append(dataclasses.replace(base, reason=reason))
            continue
        loaded = _load_one(pm, found, base)
        if loaded.registrar is None:
            reports.append(loaded.report)
            continue
        taken = {**{n: "opreg" for n in BUILTIN_PROFILES}, **{n: p for n, _, p in profiles}}
        report, accepted = _settle(loaded, taken)
        reports.append(report)
        if report.status != LOADED:
            pm.unregister(loaded.plugin)
            continue
        loaded_plugins[name] = loaded.plugin
        impls += loaded.registrar.impls
        profiles += accepted
        unsupported += [(op, name, why) for op, why in loaded.registrar.declined.items()]

    reports = [dataclasses.replace(r, hooks=_hooks_of(pm, loaded_plugins.get(r.name))) for r in reports]
    declared = Declared(tuple(reports), tuple(impls), tuple(profiles), tuple(unsupported))
    return declared, PackSet(declared.reports, pm, loaded_plugins, contracts=hookspecs.CONTRACTS, strict=strict)


def assemble(
    declared: Declared, selection: Selection, *, strict: bool = False, packs: PackSet | None = None
) -> Registry:
    """The frozen registry of what packs ``declared``, ties settled as ``selection`` prefers (data only:
    no pack code runs). ``packs`` calls the packs' hooks (the registry's host); without it the host has only the reports
    (:func:`opreg.packcache.registry` builds one so, from its cache). ``strict`` as for :func:`build_registry`."""
    preferences = selection.prefer
    loaded = {r.name for r in declared.reports if r.status == LOADED}
    _check_preferences(preferences, declared.impls, loaded)
    known = {(i.op, i.pack) for i in declared.impls}
    settled = {op: pack for op, pack in preferences.items() if (op, pack) in known}
    if packs is None:
        packs = PackSet(declared.reports, strict=strict)
    registry = Registry.build(
        declared.impls,
        profiles=declared.profiles,
        unsupported=declared.unsupported,
        preferences=settled,
        host=PackHost(packs),
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


def default_registry(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
    prefer: Mapping[Any, str] | None = None,
) -> Registry:
    """The registry built from the installed packs, shared and frozen.

    Cached per plugin selection, preferences and installed packs;
    :meth:`Registry.copy` it to add impls of your own. Arguments as for
    :func:`build_registry`.
    """
    key = (
        _names(plugins, "plugins"),
        _names(exclude, "exclude") or frozenset(),
        bool(strict),
        tuple(sorted((str(OpName.of(op)), pack) for op, pack in (prefer or {}).items())),
        autoload_disabled(),
        discovered(),
    )
    with _cache_lock:
        registry = _registry_cache.get(key)
        if registry is None:
            registry = build_registry(plugins, exclude, strict, prefer)
            _registry_cache[key] = registry
    return registry


__all__ = [
    "AUTOLOAD_ENV",
    "CORE_PACK",
    "DISABLED",
    "ENTRY_POINT_GROUP",
    "FAILED",
    "INCOMPATIBLE",
    "LOADED",
    "PLUGIN_API_VERSION",
    "USER_PACK",
    "Declared",
    "DiscoveredPack",
    "PackReport",
    "PackSet",
    "Rejection",
    "Selection",
    "assemble",
    "build_registry",
    "clear_cache",
    "default_registry",
    "discover",
    "discovered",
    "hook_names",
    "load_packs",
    "pack_conflicts",
    "require_installed",
    "table_profile",
]
