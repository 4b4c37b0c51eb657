"""The plugin host: the packs a registry was built from, what happened to each, and their hooks.

A :class:`PackSet` is built by :func:`opreg.packs.plugins.load` beside the registry and held by
its plugin host (``host.packs``, :class:`opreg.packs.host.PackHost`); the exporter asks the
host, and the conformance kit calls hooks through the set. It
iterates over the :class:`~opreg.pluginapi.PackReport` of every discovered pack, and
calls the loaded packs' hooks one pack at a time through pluggy's
``subset_hook_caller`` (cached per pack and hook), checking each result against the
hook's contract (:data:`opreg.packs.hookspecs.CONTRACTS`), through :func:`call_one`, the one per-pack
caller the loader uses too. A pack whose hook raises or
breaks its contract is logged once per host and left out while the others answer;
with ``strict`` the :class:`~opreg.pluginapi.HookError` is raised instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from opreg.packs.hookchecks import Checked, Contract
from opreg.pluginapi import (
    DISABLED,
    FAILED,
    INCOMPATIBLE,
    LOADED,
    STATUSES,
    HookError,
    PackReport,
    PackReports,
    Rejection,
    ReportSequence,
)  # fmt: skip

logger = logging.getLogger(__name__)

__all__ = [
    "DISABLED", "FAILED", "INCOMPATIBLE", "LOADED", "STATUSES", "PackReport", "PackReports", "PackSet", "Rejection",
]  # fmt: skip


class PackSet(ReportSequence):
    """The reports of every discovered pack, and the hooks of the loaded ones.

    Iterating gives the :class:`~opreg.pluginapi.PackReport` s in load order. The host of a
    registry built by hand has the empty set: no reports, and no hook answers.

    Attributes:
        strict: a hook that raises or breaks its contract raises :class:`~opreg.pluginapi.HookError`
            instead of being left out (``strict=True`` / ``--strict`` when the registry was built).
    """

    def __init__(
        self,
        reports: tuple[PackReport, ...] = (),
        manager: Any = None,
        plugins: Mapping[str, object] | None = None,
        *,
        contracts: Mapping[str, Contract] | None = None,
        strict: bool = False,
    ) -> None:
        self._reports = PackReports(tuple(reports))
        self._manager = manager
        self._plugins = dict(plugins or {})
        self._contracts = dict(contracts or {})
        self.strict = strict
        self._callers: dict[tuple[str, str], Any] = {}
        self._implemented: dict[str, tuple[str, ...]] = {}
        self._failures: dict[str, HookError] = {}

    # -- reports (read as a sequence, and by name: ReportSequence) ----------------------

    def __repr__(self) -> str:
        return f"PackSet({', '.join(f'{r.name}:{r.status}' for r in self._reports)})"

    @property
    def reports(self) -> PackReports:
        """Every discovered pack's report, as a value (what the registry built with this set holds)."""
        return self._reports

    @property
    def loaded(self) -> tuple[str, ...]:
        """Names of the packs whose hooks this set calls, in load order."""
        return tuple(self._plugins)

    @property
    def failures(self) -> tuple[HookError, ...]:
        """The hook failures met so far (each once), in order: what the CLI reports after a command."""
        return tuple(self._failures.values())

    # -- hooks -----------------------------------------------------------------------

    def implemented(self, pack: str) -> tuple[str, ...]:
        """The hooks loaded pack ``pack`` implements, sorted (``()`` if it is not loaded)."""
        found = self._implemented.get(pack)
        if found is None:
            plugin = self._plugins.get(pack)
            if plugin is None or self._manager is None:
                return ()
            found = tuple(sorted(caller.name for caller in self._manager.get_hookcallers(plugin) or ()))
            self._implemented[pack] = found
        return found

    def call_pack(self, pack: str, hook: str, **kwargs: Any) -> Checked:
        """Pack ``pack``'s ``hook``, checked against its contract (see :func:`call_one`; the
        caller is made once per pack and hook); ``KeyError`` if the pack is not loaded."""
        plugin = self._plugins[pack]
        assert self._manager is not None
        return call_one(self._manager, plugin, pack, self._contracts[hook], kwargs, callers=self._callers)

    def call(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``(pack, value)`` for each loaded pack implementing ``hook``, in load order, each value
        checked against the hook's contract (``None`` values are not listed). A pack whose hook
        raises or returns something it cannot use is logged (once per host) and left out, an
        item its contract refuses is logged and left out of the value; with :attr:`strict`,
        either raises :class:`~opreg.pluginapi.HookError`."""
        results = []
        for pack in self._plugins:
            if hook not in self.implemented(pack):
                continue
            try:
                checked = self.call_pack(pack, hook, **kwargs)
            except HookError as e:
                self.fail(e, "leaving it out")
                continue
            for problem in checked.problems:
                self.fail(HookError(pack, hook, problem), "leaving that item out")
            if checked.value is not None:  # as pluggy calls hooks: None answers are not listed
                results.append((pack, checked.value))
        return results

    def fail(self, error: HookError, consequence: str) -> None:
        """Report a pack's fault met while its hook's answer was used (the hook raised or broke its
        contract, or pack code it returned raised, as a checkpoint loader's ``plan`` may): logged
        once per host and listed in :attr:`failures`, ``consequence`` saying what opreg did
        instead; with :attr:`strict`, raised."""
        if self.strict:
            raise error
        if str(error) in self._failures:
            return  # once per host: hooks are called again and again
        self._failures[str(error)] = error
        logger.warning("%s; %s", error, consequence)
        if error.__cause__ is not None:
            logger.debug("%s: traceback", error, exc_info=error.__cause__)


def call_one(
    manager: Any,
    plugin: object,
    pack: str,
    contract: Contract,
    kwargs: Mapping[str, Any],
    *,
    callers: dict[tuple[str, str], Any] | None = None,
) -> Checked:
    """The one per-pack caller, used by the loader and by :class:`PackSet`: pack ``pack``'s
    (``plugin``'s) hook ``contract.hook`` called alone, through pluggy's ``subset_hook_caller`` of
    ``manager`` (kept in ``callers`` under ``(pack, hook)`` when given), its result checked against
    ``contract``: a :class:`~opreg.packs.hookchecks.Checked` (the normalized value, and the problems of
    the items left out of it). :class:`~opreg.pluginapi.HookError` if the hook raises or its result
    cannot be used."""
    hook = contract.hook
    caller = None if callers is None else callers.get((pack, hook))
    if caller is None:
        others = [p for p in manager.get_plugins() if p is not plugin]
        caller = manager.subset_hook_caller(hook, remove_plugins=others)
        if callers is not None:
            callers[(pack, hook)] = caller
    try:
        results = caller(**kwargs)
    except Exception as e:
        raise HookError(pack, hook, f"raised {type(e).__name__}: {e}") from e
    return contract.apply(pack, results[0] if results else None)
