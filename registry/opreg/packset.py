"""The packs a registry was built from: what happened to each, and their hooks.

A :class:`PackSet` is built by :func:`opreg.build_registry` and held by the
registry (``registry.packs``). It iterates over the :class:`PackReport` of
every discovered pack, and calls the loaded packs' runtime hooks
(``opreg_configure_session``, ``opreg_reference_kernels``, ...) one pack at a
time through pluggy's ``subset_hook_caller``, so a pack whose hook raises is
logged and left out while the others answer.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pluggy

    from opreg.registrar import Rejection

logger = logging.getLogger(__name__)

LOADED = "loaded"
FAILED = "failed"
DISABLED = "disabled"
INCOMPATIBLE = "incompatible"
STATUSES = (LOADED, FAILED, INCOMPATIBLE, DISABLED)


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
        seconds: how long importing its entry point took.
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
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"pack status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status in (LOADED, DISABLED) and not self.rejected

    def describe(self) -> str:
        where = f"pack {self.name!r} ({self.distribution} {self.version})"
        hook = f" in hook {self.hook}" if self.hook else ""
        return f"{where} {self.status}{hook}: {self.reason}" if self.reason else f"{where} {self.status}"


class PackSet:
    """The reports of every discovered pack, and the hooks of the loaded ones.

    Iterating gives the :class:`PackReport` s in load order. A hand-built
    registry has the empty set: no reports, and no hook answers.
    """

    def __init__(
        self,
        reports: tuple[PackReport, ...] = (),
        manager: pluggy.PluginManager | None = None,
        plugins: Mapping[str, object] | None = None,
    ) -> None:
        self._reports = tuple(reports)
        self._manager = manager
        self._plugins = dict(plugins or {})

    # -- reports ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[PackReport]:
        return iter(self._reports)

    def __len__(self) -> int:
        return len(self._reports)

    def __getitem__(self, index: int) -> PackReport:
        return self._reports[index]

    def __repr__(self) -> str:
        return f"PackSet({', '.join(f'{r.name}:{r.status}' for r in self._reports)})"

    def report(self, name: str) -> PackReport:
        """The report of pack ``name``; ``KeyError`` if no such pack was discovered."""
        for report in self._reports:
            if report.name == name:
                return report
        raise KeyError(name)

    @property
    def loaded(self) -> tuple[str, ...]:
        """Names of the packs whose hooks this set calls, in load order."""
        return tuple(self._plugins)

    # -- hooks -----------------------------------------------------------------------

    def implemented(self, pack: str) -> tuple[str, ...]:
        """The hooks loaded pack ``pack`` implements, sorted (``()`` if it is not loaded)."""
        plugin = self._plugins.get(pack)
        if plugin is None or self._manager is None:
            return ()
        return tuple(sorted(caller.name for caller in self._manager.get_hookcallers(plugin) or ()))

    def call_pack(self, pack: str, hook: str, **kwargs: Any) -> list[Any]:
        """The non-``None`` results of pack ``pack``'s ``hook``; an exception propagates
        (the conformance kit reports it). ``KeyError`` if the pack is not loaded."""
        plugin = self._plugins[pack]
        assert self._manager is not None
        others = [p for p in self._manager.get_plugins() if p is not plugin]
        return list(self._manager.subset_hook_caller(hook, remove_plugins=others)(**kwargs))

    def call(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``(pack, result)`` for each loaded pack implementing ``hook``, in load order
        (``None`` results are not listed, as pluggy calls hooks); a pack whose hook
        raises is logged and left out."""
        results = []
        for pack in self._plugins:
            try:
                results += [(pack, result) for result in self.call_pack(pack, hook, **kwargs)]
            except Exception as e:
                reason = f"{type(e).__name__}: {e}"
                if (pack, hook, reason) not in _WARNED:  # once per process: the hook is called again and again
                    _WARNED.add((pack, hook, reason))
                    logger.warning("pack %r: hook %s raised (%s); leaving it out", pack, hook, reason)
                logger.debug("pack %r: hook %s raised", pack, hook, exc_info=e)
        return results


_WARNED: set[tuple[str, str, str]] = set()
