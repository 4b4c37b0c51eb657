"""Loading one op pack on its own: import its entry point, check the plugin API and torch it
declares, hook it into pluggy (``check_pending``), run its registration hooks through the one
per-pack caller, and settle what it contributes. A pack that fails any step is reported (a
:class:`~opreg.pluginapi.PackReport` with its reason) and left out; the others load as usual.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opreg.errors import InvalidTargetError, OpregError, PluginError
from opreg.packs.discovery import (
    PLUGIN_API_VERSION,
    SUPPORTED_API_VERSIONS,
    DiscoveredPack,
    hook_names,
    slow_import_seconds,
)
from opreg.packs.hookchecks import Checked
from opreg.packs.packset import call_one
from opreg.pluginapi import FAILED, INCOMPATIBLE, LOADED, HookError, PackReport
from opreg.registry.impls import Impl
from opreg.registry.targets import BUILTIN_PROFILES, Target, domain_label

if TYPE_CHECKING:  # imported where packs are loaded
    import pluggy

    from opreg.registry.registrar import Known, Registrar

logger = logging.getLogger(__name__)

TABLE_ATTRIBUTE = "OPREG_TRANSLATION_TABLE"
"""A pack module may define a ``custom_translation_table`` under this name; its functions
are registered before the module's ``opreg_register_ops`` hook runs."""


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
class LoadedPack:
    """One pack after its registration hooks ran: what it contributes, not yet in a registry."""

    report: PackReport
    plugin: Any = None
    registrar: Registrar | None = None
    profiles: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    schemas: list[Any] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)


def _call_one(pm: pluggy.PluginManager, plugin: Any, pack: str, hook: str, **kwargs: Any) -> Checked:
    """``plugin``'s ``hook`` through the one per-pack caller (:func:`opreg.packs.packset.call_one`), as
    the exporter and the kit call it: a :class:`~opreg.packs.hookchecks.Checked`, or its
    :class:`~opreg.pluginapi.HookError`."""
    from opreg.packs import hookspecs

    return call_one(pm, plugin, pack, hookspecs.CONTRACTS[hook], kwargs)


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_once(pack: str, reason: str, error: BaseException | None = None) -> None:
    """A failed pack is logged once per process at WARNING (its one-line reason), the
    traceback at DEBUG: every registry build meets the same failure again."""
    with _warned_lock:
        if (pack, reason) in _warned:
            return
        _warned.add((pack, reason))
    logger.warning("pack %r left out: %s", pack, reason)
    if error is not None:
        logger.debug("pack %r: traceback of the failure", pack, exc_info=error)


def load_one(
    pm: pluggy.PluginManager, found: DiscoveredPack, base: PackReport, known: Known | None = None
) -> LoadedPack:
    """Import, hook and register one pack, isolated: a failure is its report's. ``known``: what its
    impls were last found to be, if its code is unchanged since (:class:`opreg.registry.registrar.Known`)."""
    import pluggy

    from opreg.registry.registrar import Registrar

    ep = found.entry_point
    started = time.perf_counter()

    def failed(reason: str, hook: str | None = None, status: str = FAILED, error: BaseException | None = None):
        warn_once(ep.name, f"{hook + ': ' if hook else ''}{reason}", error)
        return LoadedPack(dataclasses.replace(base, status=status, reason=reason, hook=hook))

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
        return load_table(pm, found, base, obj, imported)

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

    loaded = LoadedPack(base, plugin=obj)
    hook = "opreg_targets"
    try:
        checked = _call_one(pm, obj, ep.name, hook)
        loaded.profiles.update(checked.value)
        loaded.problems += [f"{hook}: {problem}" for problem in checked.problems]
        hook = "opreg_schemas"
        checked = _call_one(pm, obj, ep.name, hook)
        loaded.schemas.extend(checked.value)
        loaded.problems += [f"{hook}: {problem}" for problem in checked.problems]
        registrar = Registrar(ep.name, known)
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


def load_table(
    pm: pluggy.PluginManager, found: DiscoveredPack, base: PackReport, table: Mapping, imported: float
) -> LoadedPack:
    """A pack that is a ``custom_translation_table``: its functions, and a target profile named
    after it when they emit custom domains (see :func:`table_profile`)."""
    from opreg.registry.registrar import Registrar

    name = found.name
    registrar = Registrar(name)
    try:
        registrar.register_translation_table(table)
    except Exception as e:  # the table cannot be read at all
        reason = f"translation table {found.entry_point.value}: {type(e).__name__}: {e}"
        warn_once(name, reason, e)
        return LoadedPack(dataclasses.replace(base, status=FAILED, reason=reason))
    plugin = TablePack(name)
    pm.register(plugin, name=name)
    profile = table_profile(registrar.impls)
    profiles = {name: profile} if profile and name.isidentifier() else {}
    report = dataclasses.replace(base, seconds=imported)
    return LoadedPack(report, plugin=plugin, registrar=registrar, profiles=profiles)


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


def settle(loaded: LoadedPack, taken_profiles: Mapping[str, str]) -> tuple[PackReport, list[tuple[str, dict, str]]]:
    """The report of a loaded pack and the profiles it may add (a name already taken is reported)."""
    report = loaded.report
    registrar = loaded.registrar
    assert registrar is not None
    rejected = tuple(registrar.rejected)
    if rejected and not registrar.impls:
        reason = f"all {len(rejected)} impl(s) rejected; first: {rejected[0].op}: {rejected[0].error}"
        warn_once(report.name, reason)
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


__all__ = ["TABLE_ATTRIBUTE", "LoadedPack", "TablePack", "load_one", "settle", "table_profile", "warn_once"]
