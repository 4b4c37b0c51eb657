"""Capture patches: export-friendly replacements a pack applies while ``torch.export`` captures a model.

Some library code fights ``torch.export``: it branches on a size only known at
run time (``if boxes.numel() == 0``), calls ``len()`` on a tensor whose length
is data-dependent, or loops over detections. A pack that knows such a library
offers :class:`CapturePatch` es through the ``opreg_capture_patches`` hook (the
pluggable form of optimum's model patchers). Each one declares what it patches
(a module, a function in it, the library versions it was written for) and an
equivalent that captures; opreg installs it only while it captures a model that
uses that code, and reverts it afterwards, also on error.

A patch is installed for a capture when all of these hold:

- the user did not turn it off (``opreg.export(..., patches=False)`` or
  ``exclude_patches=["pack:name"]``; ``--no-patches`` / ``--no-patch NAME``);
- the distribution its ``versions`` names is installed at a version it admits;
- the module it patches is already imported (a model that never imported the
  library cannot use its code);
- the model uses that code: it holds a submodule whose class is defined under
  one of the patch's ``used_by`` module prefixes (default: the patched module's
  top-level package, so any torchvision model for a torchvision patch), or a
  submodule's ``forward`` names the patched function.

It is **applied** when the capture called it (a ``context`` patch: when it was
installed); only applied patches are recorded in the model's
``opreg.capture_patches`` metadata and in :attr:`OnnxProgram.capture_patches`.
A patch that raises, in the hook, while being installed, while the capture runs
through it or while being reverted, is reported against its pack (a warning and
a ``failed`` outcome) and the capture is run again without it.

This module chooses which patches apply and runs a capture with them (:class:`PatchedCapture`);
installing each and putting everything back is :mod:`opreg.packs.installing`'s. Importing it is
cheap: no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opreg.errors import InvalidArgumentError
from opreg.packs import packfaults
from opreg.packs.installing import Guard, Installed, error_text, joined, resolve, revert_all
from opreg.pluginapi import CapturePatch, HookError, PatchOutcome, foreign_versions, installed_version, requirement

if TYPE_CHECKING:
    from opreg.packs.host import PackHost

logger = logging.getLogger(__name__)

HOOK = "opreg_capture_patches"
"""The hook through which packs offer their patches."""
SAMPLES_HOOK = "opreg_capture_samples"
"""The hook through which packs offer models that run through their patches (for the kit)."""
METADATA_KEY = "opreg.capture_patches"
"""Model ``metadata_props``: a JSON list of the patches applied while capturing (see :meth:`PatchOutcome.record`)."""

APPLIED = "applied"
"""Installed, and the capture called it."""
UNREACHED = "unreached"
"""Installed, but the capture never called it: it changed nothing."""
UNUSED = "unused"
"""Not installed: the model does not use the code it patches."""
INCOMPATIBLE = "incompatible"
"""Not installed: the library it patches is missing or at a version it was not written for."""
DISABLED = "disabled"
"""Not installed: the user turned it off."""
FAILED = "failed"
"""It raised (in its hook, installing, during the capture or reverting); the capture went on without it."""
STATUSES = (APPLIED, UNREACHED, UNUSED, INCOMPATIBLE, DISABLED, FAILED)

T = TypeVar("T")


def metadata(outcomes: Iterable[PatchOutcome]) -> str | None:
    """The :data:`METADATA_KEY` value for ``outcomes`` (``None`` when no patch was applied)."""
    applied = [o.record() for o in outcomes if o.status == APPLIED]
    return json.dumps(applied) if applied else None


def read_metadata(value: str | None) -> list[dict[str, Any]]:
    """The applied patches a model's :data:`METADATA_KEY` metadata lists (``[]`` if none or unreadable)."""
    return packfaults.read_metadata(value)


# -- what the packs offer ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Offer:
    """The patches the loaded packs offer, and the packs whose hook failed.

    Fields:
        patches: ``(pack, patch)`` in load order.
        problems: a ``failed`` outcome per pack whose hook raised or returned something else.
    """

    patches: tuple[tuple[str, CapturePatch], ...] = ()
    problems: tuple[PatchOutcome, ...] = ()

    def labels(self) -> list[str]:
        return [f"{pack}:{patch.name}" for pack, patch in self.patches]

    def find(self, name: str) -> list[tuple[str, CapturePatch]]:
        """The patches ``name`` designates: ``pack:name``, a patch name, or what it patches."""
        return [
            (pack, patch) for pack, patch in self.patches if name in (f"{pack}:{patch.name}", patch.name, patch.target)
        ]


def offered(host: PackHost, own: Iterable[tuple[str, CapturePatch]] = ()) -> Offer:
    """The patches added by hand (``own``: a registry's :meth:`~opreg.Registry.capture_patches`), then
    those of every loaded pack's :data:`HOOK`, asked of ``host`` (called one pack at a time, its result
    checked by the hook's contract, ``opreg.packs.hookspecs.CONTRACTS``): a pack whose hook raises or returns
    something else than a list is reported and its patches left out; an item that is not a
    ``CapturePatch``, or repeats a name, is reported and left out."""
    packs = host.packs
    patches: list[tuple[str, CapturePatch]] = list(own)
    problems: list[PatchOutcome] = []
    for pack in packs.loaded:
        if HOOK not in packs.implemented(pack):
            continue
        try:
            checked = packs.call_pack(pack, HOOK)
        except HookError as e:
            found, failures = [], [e.problem]
        else:
            found, failures = list(checked.value or ()), list(checked.problems)
        for problem in failures:
            detail = f"{HOOK}: {problem}"
            _warn(pack, f"{pack}:*", detail)
            problems.append(PatchOutcome(pack, "*", "", "", FAILED, detail))
        patches += [(pack, p) for p in found]
    return Offer(tuple(patches), tuple(problems))


def select(offer: Offer, exclude: Iterable[str]) -> set[tuple[str, str]]:
    """The ``(pack, name)`` of the patches ``exclude`` names; :class:`InvalidArgumentError` for a
    name that designates no offered patch."""
    chosen: set[tuple[str, str]] = set()
    for name in exclude:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"exclude_patches= takes patch names such as 'pack:name', got {name!r}")
        found = offer.find(name)
        if not found:
            known = ", ".join(offer.labels()) or "none (no installed pack offers capture patches)"
            raise InvalidArgumentError(f"no capture patch is named {name!r}; the installed packs offer: {known}")
        chosen.update((pack, patch.name) for pack, patch in found)
    return chosen


# -- which apply to a model ------------------------------------------------------------------


def uses(model: Any, patch: CapturePatch) -> bool:
    """Whether ``model`` uses the code ``patch`` replaces: it holds a submodule whose class is defined
    under one of ``patch.scope``, or a submodule's ``forward`` names the patched function (a model of
    one's own that calls ``torchvision.ops.batched_nms``), its method (``decode`` of ``BoxCoder.decode``)
    or its class (``RTDetrModel``): not ``forward`` or ``__call__``, which every wrapper's forward names."""
    modules = list(model.modules()) if hasattr(model, "modules") else [model]
    prefixes = patch.scope
    parts = patch.function.split(".")
    wanted = {parts[0], parts[-1]} - {"forward", "__call__"}
    for module in modules:
        defined = type(module).__module__ or ""
        if any(defined == p or defined.startswith(p + ".") for p in prefixes):
            return True
    return any(wanted & _names(getattr(type(module), "forward", None)) for module in modules)


def _names(function: Any) -> set[str]:
    """The global and attribute names ``function``'s code (and the code it nests) reads."""
    code = getattr(function, "__code__", None)
    names: set[str] = set()
    stack = [code] if code is not None else []
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack += [c for c in current.co_consts if isinstance(c, types.CodeType)]
    return names


def _warn(pack: str, label: str, detail: str) -> None:
    packfaults.report(packfaults.PackFault(pack, packfaults.PATCH, label, f"left out: {detail}"))


# -- around a capture (installing and reverting: opreg.packs.installing) ------------------------


def _in_chain(error: BaseException | None, candidates: Sequence[BaseException]) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        if any(error is c for c in candidates):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


class PatchedCapture:
    """The capture patches of one export: which apply to the model, installed around the capture.

    Built by the exporter from the registry's own patches, its host's packs and the user's choice;
    :meth:`run` captures with them and leaves what happened to each in :attr:`outcomes`.
    """

    def __init__(self, offer: Offer, *, enabled: bool = True, exclude: Iterable[str] = ()) -> None:
        self.offer = offer
        self.enabled = bool(enabled)
        self.excluded = select(offer, exclude)
        self.outcomes: tuple[PatchOutcome, ...] = tuple(offer.problems)

    @classmethod
    def of(
        cls,
        host: PackHost,
        own: Iterable[tuple[str, CapturePatch]] = (),
        *,
        enabled: bool = True,
        exclude: Iterable[str] = (),
    ) -> PatchedCapture:
        """The patches added by hand (``own``) and those ``host``'s packs offer (see :func:`offered`),
        with the user's choice."""
        exclude = list(exclude)
        if not enabled and not exclude:  # nothing to look up: no hook is called
            return cls(Offer(), enabled=False)
        return cls(offered(host, own), enabled=enabled, exclude=exclude)

    def _screen(self, model: Any) -> tuple[list[tuple[str, CapturePatch, str]], list[PatchOutcome]]:
        """The patches to install (with the installed library version) and the outcomes of the others."""
        chosen: list[tuple[str, CapturePatch, str]] = []
        others: list[PatchOutcome] = []
        for pack, patch in self.offer.patches:
            outcome = functools.partial(_outcome, pack, patch)
            if not self.enabled:
                others.append(outcome(DISABLED, "capture patches are turned off (patches=False / --no-patches)"))
                continue
            if (pack, patch.name) in self.excluded:
                others.append(outcome(DISABLED, "turned off by name (exclude_patches= / --no-patch)"))
                continue
            version, fits = installed_version(patch)
            if version is None:
                name = requirement(patch).name
                others.append(outcome(UNUSED, f"{name} is not installed"))
                continue
            if not fits:
                others.append(outcome(INCOMPATIBLE, f"written for {patch.versions}; {version} is installed", version))
                continue
            if patch.module.split(".", 1)[0] not in sys.modules or not uses(model, patch):
                scope = ", ".join(patch.scope)
                detail = f"the model has no module from {scope} and no forward calling {patch.function}"
                others.append(outcome(UNUSED, detail, version))
                continue
            foreign = foreign_versions(patch)
            if foreign is not None:
                _warn(pack, f"{pack}:{patch.name}", foreign)
                others.append(outcome(FAILED, foreign, version))
                continue
            chosen.append((pack, patch, version))
        return chosen, others

    def run(self, model: Any, capture: Callable[[], T]) -> T:
        """``capture()`` with the patches that apply to ``model`` installed. A patch that raises while
        installed, during the capture (when the capture then fails) or while reverted is reported,
        and the capture is run again without it. Whatever a patch does, what the patches declare
        they patch is compared after each capture with what it was before, and put back if it
        differs (reported against the patch)."""
        chosen, others = self._screen(model)
        failed: list[PatchOutcome] = []
        versions = {(pack, patch.name): version for pack, patch, version in chosen}
        while True:
            installed: list[Installed] = []
            refused: list[tuple[Installed, str]] = []
            result: Any = None
            error: BaseException | None = None
            guard = Guard(chosen)
            try:
                for pack, patch, _ in chosen:
                    one = Installed(pack, patch)
                    try:
                        one.install()
                    except Exception as e:
                        with contextlib.suppress(Exception):
                            one.revert()
                        refused.append((one, f"installing it raised {error_text(e)}"))
                        continue
                    except BaseException:  # an interrupt while installing: reverted with the others below
                        installed.append(one)
                        raise
                    installed.append(one)
                try:
                    result = capture()
                except Exception as e:
                    error = e
            finally:
                problems = revert_all(installed, guard)
            attempt_failed = [
                self._failed(one, versions[one.key], joined(detail, problems.pop(one.label, "")))
                for one, detail in refused
            ]
            if error is not None:
                for one in installed:
                    raised = one.raised and _in_chain(error, one.raised)
                    if raised or one.label in problems:
                        detail = f"it raised {error_text(one.raised[-1])} during the capture" if raised else ""
                        detail = joined(detail, problems.pop(one.label, ""), "captured again without it")
                        attempt_failed.append(self._failed(one, versions[one.key], detail))
            failed += attempt_failed
            gone = {(o.pack, o.name) for o in attempt_failed}
            if error is not None and gone:
                chosen = [c for c in chosen if (c[0], c[1].name) not in gone]
                continue  # without the patches that failed
            self.outcomes = (*self.outcomes, *failed, *self._settled(installed, versions, gone, problems), *others)
            if error is not None:
                raise error
            return result

    def _failed(self, one: Installed, version: str, detail: str) -> PatchOutcome:
        _warn(one.pack, one.label, detail)
        return _outcome(one.pack, one.patch, FAILED, detail, version)

    @staticmethod
    def _settled(
        installed: Sequence[Installed],
        versions: Mapping[tuple[str, str], str],
        gone: set[tuple[str, str]],
        problems: Mapping[str, str],
    ) -> list[PatchOutcome]:
        """The outcomes of the patches that stayed installed through the capture (``problems``: what
        went wrong putting one back, reported as its pack's fault; the capture still used it)."""
        outcomes = []
        for one in installed:
            patch = one.patch
            if one.key in gone:
                continue
            if patch.context is not None:
                status, calls, detail = APPLIED, None, "installed for the capture"
            elif one.calls:
                status, calls, detail = APPLIED, one.calls, f"called {one.calls} time(s) during the capture"
            else:
                status, calls, detail = UNREACHED, 0, "installed, but the capture never called it"
            problem = problems.get(one.label)
            if problem:
                what = "the model was captured with it" if status == APPLIED else "the capture never called it"
                packfaults.report(packfaults.PackFault(one.pack, packfaults.PATCH, one.label, f"{problem} ({what})"))
                detail = joined(detail, problem)
            outcomes.append(_outcome(one.pack, patch, status, detail, versions[one.key], calls))
        return outcomes

    @contextlib.contextmanager
    def installed(self, model: Any) -> Iterator[list[PatchOutcome]]:
        """The patches that apply to ``model``, installed for the block (outside a capture: the
        conformance kit runs eager models through them); yields the outcomes, filled on exit."""
        box: list[PatchOutcome] = []
        chosen, others = self._screen(model)
        guard = Guard(chosen)
        installed: list[Installed] = []
        try:
            for pack, patch, _ in chosen:
                one = Installed(pack, patch)
                installed.append(one)  # before installing: one that fails halfway is reverted too
                one.install()
            yield box
        finally:
            problems = revert_all(installed, guard)
            versions = {(pack, patch.name): version for pack, patch, version in chosen}
            box += self._settled(installed, versions, set(), problems) + others


def _outcome(pack: str, patch: CapturePatch, status: str, detail: str, installed: str = "",
             calls: int | None = None) -> PatchOutcome:  # fmt: skip
    return PatchOutcome(pack, patch.name, patch.target, patch.versions, status, detail, installed, calls)


__all__ = [
    "APPLIED",
    "DISABLED",
    "FAILED",
    "HOOK",
    "INCOMPATIBLE",
    "METADATA_KEY",
    "SAMPLES_HOOK",
    "STATUSES",
    "UNREACHED",
    "UNUSED",
    "CapturePatch",
    "Offer",
    "PatchOutcome",
    "PatchedCapture",
    "installed_version",
    "metadata",
    "offered",
    "read_metadata",
    "requirement",
    "resolve",
    "select",
    "uses",
]
