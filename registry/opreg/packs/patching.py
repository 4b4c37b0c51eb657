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

Importing this module is cheap: no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import json
import logging
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opreg.errors import InvalidArgumentError, PluginError
from opreg.packs import packfaults
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


# -- installing ----------------------------------------------------------------------------


def uses(model: Any, patch: CapturePatch) -> bool:
    """Whether ``model`` uses the code ``patch`` replaces: it holds a submodule whose class is defined
    under one of ``patch.scope``, or a submodule's ``forward`` names the patched function (a model of
    one's own that calls ``torchvision.ops.batched_nms``)."""
    modules = list(model.modules()) if hasattr(model, "modules") else [model]
    prefixes = patch.scope
    name = patch.function.rsplit(".", 1)[-1]
    for module in modules:
        defined = type(module).__module__ or ""
        if any(defined == p or defined.startswith(p + ".") for p in prefixes):
            return True
    return any(name in _names(getattr(type(module), "forward", None)) for module in modules)


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


class _Installed:
    """One patch installed for one capture attempt: counts its calls, remembers an error it raised,
    and knows how to put back what it replaced."""

    def __init__(self, pack: str, patch: CapturePatch) -> None:
        self.pack = pack
        self.patch = patch
        self.calls = 0
        self.raised: list[BaseException] = []
        self._restore: list[Callable[[], None]] = []
        self._context: Any = None

    @property
    def label(self) -> str:
        return f"{self.pack}:{self.patch.name}"

    @property
    def key(self) -> tuple[str, str]:
        return self.pack, self.patch.name

    def install(self) -> None:
        patch = self.patch
        if patch.context is not None:
            self._context = patch.context()  # before entering: an __enter__ that raises is exited too
            self._context.__enter__()
            return
        owner, attribute = resolve(patch)
        raw = owner.__dict__[attribute] if attribute in vars(owner) else getattr(owner, attribute)
        kind = staticmethod if isinstance(raw, staticmethod) else classmethod if isinstance(raw, classmethod) else None
        original = raw.__func__ if kind is not None else raw
        if not callable(original):
            raise PluginError(f"{patch.target} is a {type(original).__name__}, not a function")
        new: Any = self._counting(original)
        new = kind(new) if kind is not None else new
        self._replace(owner, attribute, new)
        for module in _copies(owner, attribute, original):  # `from library import function` made other references
            self._replace(module, attribute, new)

    def _counting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        replacement = self.patch.replacement
        assert replacement is not None
        call = functools.partial(replacement, original) if self.patch.wraps_original else replacement

        @functools.wraps(original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            try:
                return call(*args, **kwargs)
            except Exception as e:
                self.raised.append(e)
                raise

        return patched

    def _replace(self, owner: Any, attribute: str, new: Any) -> None:
        had = attribute in vars(owner)
        old = vars(owner).get(attribute)
        setattr(owner, attribute, new)
        self._restore.append(lambda: setattr(owner, attribute, old) if had else delattr(owner, attribute))

    def revert(self) -> None:
        """Put everything back; raises the first error met, after trying every step."""
        errors: list[BaseException] = []
        if self._context is not None:
            context, self._context = self._context, None
            try:
                context.__exit__(None, None, None)
            except Exception as e:
                errors.append(e)
        while self._restore:
            try:
                self._restore.pop()()
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]


def _copies(owner: Any, attribute: str, original: Any) -> list[types.ModuleType]:
    """The other loaded modules that hold ``original`` under ``attribute`` (``from owner import
    attribute``), when ``owner`` is a module."""
    if not isinstance(owner, types.ModuleType):
        return []
    return [
        module
        for module in list(sys.modules.values())
        if module is not owner
        and isinstance(module, types.ModuleType)
        and attribute in vars(module)
        and vars(module)[attribute] is original
    ]


_ABSENT = object()


class _Guard:
    """What the chosen patches declare they patch (each ``module.function`` and the modules that
    imported it by name), as it was before a capture: :meth:`restore` compares after the patches
    were reverted, and puts back what differs, whatever the patch did on install, enter or exit."""

    def __init__(self, chosen: Sequence[tuple[str, CapturePatch, str]]) -> None:
        self._entries: list[tuple[str, str, Any, str, Any]] = []  # label, target, holder, attribute, value
        for pack, patch, _ in chosen:
            try:
                owner, attribute = resolve(patch)
            except Exception:  # nothing there to guard: installing it fails and says so
                continue
            value = vars(owner).get(attribute, _ABSENT)
            label = f"{pack}:{patch.name}"
            self._entries.append((label, patch.target, owner, attribute, value))
            for module in _copies(owner, attribute, value) if value is not _ABSENT else []:
                self._entries.append((label, f"{module.__name__}.{attribute}", module, attribute, value))

    def restore(self) -> dict[str, list[str]]:
        """Put back every guarded attribute that changed; ``{patch label: [what it left changed]}``.
        :class:`PluginError` naming it when one cannot be put back."""
        changed: dict[str, list[str]] = {}
        for label, target, holder, attribute, value in self._entries:
            if vars(holder).get(attribute, _ABSENT) is value:
                continue
            try:
                _put(holder, attribute, value)
            except Exception as e:
                raise PluginError(
                    f"capture patch {label} left {target} changed after the capture and opreg could not put the "
                    f"original back ({_error(e)}): restart the Python process before using {target} again"
                ) from e
            changed.setdefault(label, []).append(target)
        return changed


def _put(holder: Any, attribute: str, value: Any) -> None:
    """``holder.attribute = value`` (or deleted, for :data:`_ABSENT`), past a ``__setattr__`` of its own."""
    if isinstance(holder, types.ModuleType):
        if value is _ABSENT:
            vars(holder).pop(attribute, None)
        else:
            vars(holder)[attribute] = value
        return
    kind = type if isinstance(holder, type) else object
    if value is _ABSENT:
        kind.__delattr__(holder, attribute)
    else:
        kind.__setattr__(holder, attribute, value)


def resolve(patch: CapturePatch) -> tuple[Any, str]:
    """The object holding what ``patch`` replaces (importing its module), and the attribute's name;
    :class:`PluginError` when the installed library has no such function."""
    owner: Any = importlib.import_module(patch.module)
    *path, attribute = patch.function.split(".")
    for part in path:
        owner = getattr(owner, part)
    if not hasattr(owner, attribute):
        raise PluginError(
            f"{patch.module} has no {patch.function}: the patch was written for {patch.versions} and does not "
            "fit this version's code"
        )
    return owner, attribute


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
            installed: list[_Installed] = []
            refused: list[tuple[_Installed, str]] = []
            result: Any = None
            error: BaseException | None = None
            guard = _Guard(chosen)
            try:
                for pack, patch, _ in chosen:
                    one = _Installed(pack, patch)
                    try:
                        one.install()
                    except Exception as e:
                        with contextlib.suppress(Exception):
                            one.revert()
                        refused.append((one, f"installing it raised {_error(e)}"))
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
                problems = _revert_all(installed, guard)
            attempt_failed = [
                self._failed(one, versions[one.key], _joined(detail, problems.pop(one.label, "")))
                for one, detail in refused
            ]
            if error is not None:
                for one in installed:
                    raised = one.raised and _in_chain(error, one.raised)
                    if raised or one.label in problems:
                        detail = f"it raised {_error(one.raised[-1])} during the capture" if raised else ""
                        detail = _joined(detail, problems.pop(one.label, ""), "captured again without it")
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

    def _failed(self, one: _Installed, version: str, detail: str) -> PatchOutcome:
        _warn(one.pack, one.label, detail)
        return _outcome(one.pack, one.patch, FAILED, detail, version)

    @staticmethod
    def _settled(
        installed: Sequence[_Installed],
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
                detail = _joined(detail, problem)
            outcomes.append(_outcome(one.pack, patch, status, detail, versions[one.key], calls))
        return outcomes

    @contextlib.contextmanager
    def installed(self, model: Any) -> Iterator[list[PatchOutcome]]:
        """The patches that apply to ``model``, installed for the block (outside a capture: the
        conformance kit runs eager models through them); yields the outcomes, filled on exit."""
        box: list[PatchOutcome] = []
        chosen, others = self._screen(model)
        guard = _Guard(chosen)
        installed: list[_Installed] = []
        try:
            for pack, patch, _ in chosen:
                one = _Installed(pack, patch)
                installed.append(one)  # before installing: one that fails halfway is reverted too
                one.install()
            yield box
        finally:
            problems = _revert_all(installed, guard)
            versions = {(pack, patch.name): version for pack, patch, version in chosen}
            box += self._settled(installed, versions, set(), problems) + others


def _revert_all(installed: Sequence[_Installed], guard: _Guard) -> dict[str, str]:
    """Revert ``installed`` (last first), then put back whatever the guard finds still changed;
    ``{patch label: what went wrong}`` for each patch whose revert raised or left a change."""
    problems: dict[str, str] = {}
    for one in reversed(installed):
        try:
            one.revert()
        except Exception as e:
            problems[one.label] = f"reverting it raised {_error(e)}"
    for label, targets in guard.restore().items():
        left = f"it left {', '.join(targets)} changed after the capture; opreg put the original back"
        problems[label] = _joined(problems.get(label, ""), left)
    return problems


def _joined(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _outcome(pack: str, patch: CapturePatch, status: str, detail: str, installed: str = "",
             calls: int | None = None) -> PatchOutcome:  # fmt: skip
    return PatchOutcome(pack, patch.name, patch.target, patch.versions, status, detail, installed, calls)


def _error(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


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
