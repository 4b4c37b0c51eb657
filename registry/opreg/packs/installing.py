"""Installing capture patches and putting everything back (:mod:`opreg.packs.patching` chooses which).

:class:`Installed` is one patch installed for one capture attempt: its replacement (counting its
calls, remembering an error it raised) set on the module or class that holds the function, and on
every loaded module that imported it by name, or its context entered; :meth:`Installed.revert` puts
each back. :class:`Guard` takes what the patches declare they patch before a capture and, after
:func:`revert_all`, puts back whatever a patch still left changed, past a ``__setattr__`` of its own.

Importing this module is cheap: no torch.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from opreg.errors import PluginError
from opreg.pluginapi import CapturePatch


class Installed:
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
        for module in copies(owner, attribute, original):  # `from library import function` made other references
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


def copies(owner: Any, attribute: str, original: Any) -> list[types.ModuleType]:
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


class Guard:
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
            for module in copies(owner, attribute, value) if value is not _ABSENT else []:
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
                    f"original back ({error_text(e)}): restart the Python process before using {target} again"
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


def revert_all(installed: Sequence[Installed], guard: Guard) -> dict[str, str]:
    """Revert ``installed`` (last first), then put back whatever the guard finds still changed;
    ``{patch label: what went wrong}`` for each patch whose revert raised or left a change."""
    problems: dict[str, str] = {}
    for one in reversed(installed):
        try:
            one.revert()
        except Exception as e:
            problems[one.label] = f"reverting it raised {error_text(e)}"
    for label, targets in guard.restore().items():
        left = f"it left {', '.join(targets)} changed after the capture; opreg put the original back"
        problems[label] = joined(problems.get(label, ""), left)
    return problems


def joined(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def error_text(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"
