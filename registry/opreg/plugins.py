"""Finding, loading and isolating op packs.

Packs are entry points in the group ``opreg.plugins`` (the core pack too).
Nothing is imported until a registry is first asked for. Each pack is loaded
and hooked on its own: a pack that fails to import, is written for another
plugin API or torch, raises in a hook, or has every impl rejected is reported
and left out, and the others load as usual. ``strict=True`` turns any such
failure into a :class:`PluginError`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import pluggy

from opreg import hookspecs
from opreg.errors import OpregError, PluginError, PluginNotFoundError
from opreg.opname import OpName
from opreg.registry import USER_PACK, Impl, Predicate, Registry, build_impl
from opreg.targets import VersionRangeLike

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "opreg.plugins"
CORE_PACK = "core"
"""Entry-point name of the core pack (distribution ``opreg``)."""
AUTOLOAD_ENV = "OPREG_DISABLE_PLUGIN_AUTOLOAD"
"""Set to ``1`` to load only the core pack and the packs asked for by name."""
PLUGIN_API_VERSION = 1
"""The plugin API this opreg serves; packs declare it as ``OPREG_API_VERSION``."""
SUPPORTED_API_VERSIONS = frozenset({1})

LOADED = "loaded"
FAILED = "failed"
DISABLED = "disabled"
INCOMPATIBLE = "incompatible"


@dataclasses.dataclass(frozen=True, slots=True)
class Rejection:
    """An impl a pack tried to register and opreg refused."""

    op: str
    function: str
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class PackReport:
    """What happened to one discovered pack.

    Fields:
        name: the entry-point name (what ``-p NAME`` takes).
        distribution: the distribution that declares it.
        version: that distribution's version.
        value: the entry point's target (``module`` or ``module:attr``).
        status: ``loaded``, ``failed``, ``incompatible`` or ``disabled``.
        reason: why it is not loaded (or what went partly wrong), else ``""``.
        hook: the hook that failed, if one did.
        impls: how many impls it registered.
        domains: the ONNX domains its impls emit.
        profiles: the target profiles it contributes.
        rejected: impls opreg refused.
    """

    name: str
    distribution: str
    version: str
    value: str
    status: str
    reason: str = ""
    hook: str | None = None
    impls: int = 0
    domains: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status in (LOADED, DISABLED) and not self.rejected

    def describe(self) -> str:
        where = f"pack {self.name!r} ({self.distribution} {self.version})"
        hook = f" in hook {self.hook}" if self.hook else ""
        return f"{where} {self.status}{hook}: {self.reason}" if self.reason else f"{where} {self.status}"


class Registrar:
    """The registry as a pack sees it in ``opreg_register_ops``.

    :meth:`register` validates each impl at once; a refused impl is recorded
    (and logged) instead of raised, so one bad impl does not cost the pack
    its others. Nothing reaches the registry until the pack's hook returns.
    """

    def __init__(self, pack: str) -> None:
        self.pack = pack
        self.impls: list[Impl] = []
        self.rejected: list[Rejection] = []
        self.declined: dict[OpName, str] = {}

    def register(
        self,
        op: Any,
        function: Any,
        *,
        opset: VersionRangeLike | None = None,
        domains: Mapping[str, VersionRangeLike] | None = None,
        priority: int = 0,
        predicate: Predicate | None = None,
    ) -> Impl | None:
        """Register ``function`` for torch op ``op``; see :meth:`opreg.Registry.register`.

        Returns the impl, or ``None`` if it was rejected (the reason is in the
        pack's report, ``opreg plugins`` and the log).
        """
        try:
            impl = build_impl(
                op, function, opset=opset, domains=domains, priority=priority,
                predicate=predicate, pack=self.pack, override=False,
            )  # fmt: skip
        except Exception as e:  # a pack's mistake must not break the build
            name = getattr(function, "name", None) or getattr(function, "__name__", repr(function))
            self.rejected.append(Rejection(str(op), str(name), f"{type(e).__name__}: {e}"))
            logger.warning("pack %r: impl %s for %s rejected: %s", self.pack, name, op, e)
            return None
        self.impls.append(impl)
        return impl

    def mark_unsupported(self, op: Any, reason: str) -> None:
        """Declare that this pack deliberately has no impl for ``op``, and why
        (e.g. ONNX cannot express it); ``opreg check`` and export errors show the reason."""
        self.declined[OpName.of(op)] = str(reason)


# -- discovery ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Found:
    """An entry point with its distribution's name and version, read once."""

    ep: importlib.metadata.EntryPoint
    distribution: str
    version: str

    @classmethod
    def of(cls, ep: importlib.metadata.EntryPoint) -> _Found:
        if ep.dist is None:
            return cls(ep, "?", "?")
        metadata = ep.dist.metadata  # parsed once here; .name/.version would each re-read it
        return cls(ep, metadata["Name"] or "?", metadata["Version"] or "?")


_cache_lock = threading.RLock()
_ep_cache: dict[tuple[str, ...], tuple[_Found, ...]] = {}
_registry_cache: dict[tuple, Registry] = {}


def clear_cache() -> None:
    """Forget discovered entry points and built registries (after installing a pack)."""
    with _cache_lock:
        _ep_cache.clear()
        _registry_cache.clear()


def _discovered() -> tuple[_Found, ...]:
    """Entry points of the group ``opreg.plugins`` in load order, cached per ``sys.path``:
    the core pack first, then by name and distribution. The load order decides
    which of two packs keeps a contested profile name (the later one is reported).
    Nothing is imported."""
    key = tuple(sys.path)
    with _cache_lock:
        found = _ep_cache.get(key)
        if found is None:
            eps = [_Found.of(ep) for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
            found = tuple(sorted(eps, key=lambda f: (f.ep.name != CORE_PACK, f.ep.name, f.distribution)))
            _ep_cache[key] = found
    return found


def discover() -> tuple[importlib.metadata.EntryPoint, ...]:
    """Entry points of the group ``opreg.plugins``, in load order; nothing is imported."""
    return tuple(f.ep for f in _discovered())


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


# -- loading --------------------------------------------------------------------


def _torch_version() -> str | None:
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
    report: PackReport
    plugin: Any = None
    registrar: Registrar | None = None
    profiles: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    schemas: list[Any] = dataclasses.field(default_factory=list)


def _call(pm: pluggy.PluginManager, plugin: Any, hook: str, **kwargs: Any) -> list[Any]:
    """Call one plugin's implementation of ``hook`` (if it has one)."""
    results = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if impl.plugin is plugin:
            results.append(impl.function(**{k: kwargs[k] for k in impl.argnames}))
    return results


def _load_one(pm: pluggy.PluginManager, ep: importlib.metadata.EntryPoint, base: PackReport) -> _Loaded:
    def failed(reason: str, hook: str | None = None, status: str = FAILED) -> _Loaded:
        return _Loaded(dataclasses.replace(base, status=status, reason=reason, hook=hook))

    if not ep.pattern.match(ep.value):
        return failed(
            f"entry point value {ep.value!r} is not of the form 'module' or 'module:attr' "
            f"(in {base.distribution}'s entry_points.txt; TOML quotes do not belong there)"
        )
    try:
        obj = ep.load()
    except Exception as e:
        logger.warning("pack %r (%s) failed to import: %s", ep.name, base.distribution, e, exc_info=True)
        return failed(f"import of {ep.value} failed: {type(e).__name__}: {e}")

    problem = _incompatibility(obj)
    if problem is not None:
        logger.warning("pack %r left out: %s", ep.name, problem)
        return failed(problem, status=INCOMPATIBLE)

    try:
        pm.register(obj, name=ep.name)
    except Exception as e:
        return failed(f"bad hook implementation: {e}")
    unknown = sorted(hc.name for hc in pm.get_hookcallers(obj) or () if hc.spec is None)
    if unknown:
        pm.unregister(obj)
        known = ", ".join(hookspecs.HOOK_NAMES)
        return failed(f"implements unknown hook(s) {', '.join(unknown)}; the hooks are {known}")

    loaded = _Loaded(base, plugin=obj)
    hook = "opreg_targets"
    try:
        for result in _call(pm, obj, hook):
            if not isinstance(result, Mapping):
                raise PluginError(f"must return a dict of profile -> {{domain: version}}, got {type(result).__name__}")
            loaded.profiles.update({name: dict(versions) for name, versions in result.items()})
        hook = "opreg_schemas"
        for result in _call(pm, obj, hook):
            loaded.schemas.extend(result or ())
        hook = "opreg_register_ops"
        registrar = Registrar(ep.name)
        _call(pm, obj, hook, registry=registrar)
    except Exception as e:
        pm.unregister(obj)
        logger.warning("pack %r: hook %s raised: %s", ep.name, hook, e, exc_info=True)
        return failed(f"{type(e).__name__}: {e}", hook=hook)
    loaded.registrar = registrar
    return loaded


def _commit(registry: Registry, loaded: _Loaded) -> PackReport:
    """Move a loaded pack's profiles, schemas and impls into ``registry``."""
    report = loaded.report
    registrar = loaded.registrar
    assert registrar is not None
    rejected = tuple(registrar.rejected)
    if rejected and not registrar.impls:
        return dataclasses.replace(
            report, status=FAILED, hook="opreg_register_ops", rejected=rejected,
            reason=f"all {len(rejected)} impl(s) rejected; first: {rejected[0].op}: {rejected[0].error}",
        )  # fmt: skip
    problems = []
    profiles = []
    for name, versions in loaded.profiles.items():
        try:
            registry.add_profile(name, versions, pack=report.name)
            profiles.append(name)
        except OpregError as e:
            problems.append(f"profile {name!r} rejected: {e}")
    try:
        _register_schemas(loaded.schemas)
    except Exception as e:
        problems.append(f"schemas rejected: {e}")
    for impl in registrar.impls:  # built by this build's Registrar, used nowhere else
        registry._add(impl, owned=True)
    for op, reason in registrar.declined.items():
        registry.mark_unsupported(op, reason, pack=report.name)
    if rejected:
        problems.append(f"{len(rejected)} impl(s) rejected")
    domains = sorted({d or "ai.onnx" for i in registrar.impls for d in ("", *dict(i.requirement.domains))})
    return dataclasses.replace(
        report, status=LOADED, reason="; ".join(problems), impls=len(registrar.impls),
        domains=tuple(domains), profiles=tuple(profiles), rejected=rejected,
    )  # fmt: skip


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


def require_installed(names: Iterable[str]) -> None:
    """Raise :class:`PluginNotFoundError` naming every pack in ``names`` that is not installed."""
    installed = {f.ep.name for f in _discovered()}
    missing = sorted(set(names) - installed)
    if missing:
        raise PluginNotFoundError(
            f"no installed pack named {', '.join(map(repr, missing))}; installed packs: "
            f"{', '.join(sorted(installed)) or 'none'} (pip install the pack, or check `opreg plugins`)"
        )


def build_registry(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
) -> Registry:
    """Load the selected packs into a new (unfrozen, uncached) registry.

    ``plugins``: pack names to load besides the core pack (``None``: every
    installed pack, unless ``OPREG_DISABLE_PLUGIN_AUTOLOAD`` is set).
    ``exclude``: pack names to leave out (the core pack too). ``strict``: raise
    :class:`PluginError` if any selected pack fails. The load reports are in
    ``registry.packs``.
    """
    wanted = None if plugins is None else frozenset(plugins)
    unwanted = frozenset(exclude or ())
    found = _discovered()
    require_installed(wanted or ())

    registry = Registry()
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    reports: list[PackReport] = []
    plugin_objects: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for f in found:
        ep = f.ep
        base = PackReport(ep.name, f.distribution, f.version, ep.value, DISABLED)
        if ep.name in seen:
            reports.append(dataclasses.replace(
                base, status=FAILED, reason=f"pack name {ep.name!r} is already taken by {seen[ep.name]}",
            ))  # fmt: skip
            continue
        seen[ep.name] = base.distribution
        reason = _selection_reason(ep.name, wanted, unwanted)
        if reason is not None:
            reports.append(dataclasses.replace(base, reason=reason))
            continue
        loaded = _load_one(pm, ep, base)
        report = _commit(registry, loaded) if loaded.registrar is not None else loaded.report
        if report.status == LOADED:
            plugin_objects[ep.name] = loaded.plugin
        elif loaded.plugin is not None:
            pm.unregister(loaded.plugin)
        reports.append(report)

    registry.packs = tuple(reports)
    registry._hooks = _PackHooks(pm, plugin_objects)
    if strict:
        bad = [r for r in reports if not r.ok]
        if bad:
            raise PluginError(
                "strict mode: "
                + "; ".join(r.describe() for r in bad)
                + " (fix or exclude these packs, or drop strict mode to leave them out)"
            )
    return registry


class _PackHooks:
    """Calls the loaded packs' runtime hooks one pack at a time."""

    def __init__(self, pm: pluggy.PluginManager, plugins: Mapping[str, Any]) -> None:
        self._pm = pm
        self._plugins = dict(plugins)

    def call(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``(pack, result)`` for each loaded pack implementing ``hook``; a pack
        that raises is logged and skipped."""
        results = []
        for name, plugin in self._plugins.items():
            try:
                for result in _call(self._pm, plugin, hook, **kwargs):
                    results.append((name, result))
            except Exception:
                logger.exception("pack %r: hook %s raised; leaving it out", name, hook)
        return results

    def implemented(self, pack: str) -> tuple[str, ...]:
        """The hooks loaded pack ``pack`` implements, sorted (``()`` if it is not loaded)."""
        plugin = self._plugins.get(pack)
        if plugin is None:
            return ()
        return tuple(sorted({hc.name for hc in self._pm.get_hookcallers(plugin) or ()}))

    def call_pack(self, pack: str, hook: str, **kwargs: Any) -> list[Any]:
        """The results of loaded pack ``pack``'s ``hook``; unlike :meth:`call`, an
        exception propagates (the conformance kit reports it)."""
        return _call(self._pm, self._plugins[pack], hook, **kwargs)


def default_registry(
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool = False,
) -> Registry:
    """The registry built from the installed packs, shared and frozen.

    Cached per plugin selection and installed packs; :meth:`Registry.copy`
    it to add impls of your own. Arguments as for :func:`build_registry`.
    """
    key = (
        None if plugins is None else frozenset(plugins),
        frozenset(exclude or ()),
        bool(strict),
        autoload_disabled(),
        _discovered(),
    )
    with _cache_lock:
        registry = _registry_cache.get(key)
        if registry is None:
            registry = build_registry(plugins, exclude, strict).freeze()
            _registry_cache[key] = registry
    return registry


__all__ = [
    "AUTOLOAD_ENV",
    "CORE_PACK",
    "ENTRY_POINT_GROUP",
    "PLUGIN_API_VERSION",
    "PackReport",
    "Registrar",
    "Rejection",
    "build_registry",
    "clear_cache",
    "default_registry",
    "discover",
    "USER_PACK",
]
