"""Which loader exports a checkpoint, and its plan: every installed pack's loaders asked to
recognise the folder, the highest priority chosen (a tie at the top refused unless ``library=``
picks), the task checked against what it can do, then its plan.

A loader is pack code: one whose ``recognise`` or ``plan`` raises (anything but
:class:`opreg.CheckpointError`, which is the folder's fault) or answers something else than its
value is reported against its pack (:meth:`opreg.PackSet.fail`: a warning, an error under
``strict``) and the next candidate is asked.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from opreg.errors import CheckpointError
from opreg.host import CHECKPOINT_LOADERS, PackHost
from opreg.loaderapi import Checkpoint, CheckpointLoader, ExportPlan, Recognition
from opreg.pluginapi import HookError

logger = logging.getLogger(__name__)

__all__ = ["Candidate", "Choice", "candidates", "choose"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A loader that recognised the folder.

    Fields:
        pack: the pack that offers it.
        loader: the :class:`opreg.CheckpointLoader`.
        recognition: its answer.
    """

    pack: str
    loader: CheckpointLoader
    recognition: Recognition

    @property
    def label(self) -> str:
        """``pack:loader``."""
        return f"{self.pack}:{self.loader.name}"

    def picked_by(self, library: str) -> bool:
        """Whether ``library=`` names this loader: its library, its name or its label."""
        return library in (self.loader.library, self.loader.name, self.label)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The loader chosen for a checkpoint, the task and its plan.

    Fields:
        candidate: the loader chosen.
        task: the task exported (asked, or the one the loader inferred).
        inferred: whether the task was inferred from the folder (not asked).
        plan: the loader's :class:`opreg.ExportPlan`.
        others: the other loaders that recognised the folder, by priority (what ``library=`` could pick).
    """

    candidate: Candidate
    task: str
    inferred: bool
    plan: ExportPlan
    others: tuple[Candidate, ...] = ()


def _guarded(host: PackHost, pack: str, loader: CheckpointLoader, what: str, call: Callable[[], Any]) -> Any:
    """``call()``, a raise (but :class:`opreg.CheckpointError`) reported against ``pack`` as a
    :class:`~opreg.pluginapi.HookError` of the loaders' hook (raised under ``strict``); ``None`` then."""
    try:
        return call()
    except CheckpointError:
        raise
    except Exception as e:
        error = HookError(pack, CHECKPOINT_LOADERS, f"loader {loader.name!r} {what} raised {type(e).__name__}: {e}")
        error.__cause__ = e
        host.packs.fail(error, "leaving that loader out")
        return None


def _wrong(host: PackHost, pack: str, loader: CheckpointLoader, what: str, value: Any, kind: type) -> bool:
    """Whether ``value`` is not a ``kind``: then reported against ``pack``."""
    if isinstance(value, kind):
        return False
    problem = f"loader {loader.name!r} {what} returned {type(value).__name__}, not an opreg.{kind.__name__}"
    host.packs.fail(HookError(pack, CHECKPOINT_LOADERS, problem), "leaving that loader out")
    return True


def candidates(checkpoint: Checkpoint, host: PackHost) -> tuple[list[Candidate], list[tuple[str, CheckpointLoader]]]:
    """The loaders that recognise ``checkpoint``, highest priority first (load order within one
    priority), and every loader asked."""
    asked = host.checkpoint_loaders()
    found = []
    for pack, loader in asked:
        call = functools.partial(loader.recognise, checkpoint)
        answer = _guarded(host, pack, loader, f"recognising {checkpoint.path}", call)
        if answer is None or _wrong(host, pack, loader, "recognise", answer, Recognition):
            continue
        found.append(Candidate(pack, loader, answer))
    found.sort(key=lambda c: -c.loader.priority)
    return found, asked


def choose(checkpoint: Checkpoint, host: PackHost, *, task: str | None = None, library: str | None = None) -> Choice:
    """The loader that exports ``checkpoint``, for ``task`` (default: the one it infers), and its
    plan; :class:`opreg.CheckpointError` naming what was looked for when none can."""
    found, asked = candidates(checkpoint, host)
    everyone = tuple(found)
    if library is not None:
        picked = [c for c in found if c.picked_by(library)]
        if not picked:
            raise CheckpointError(_unpicked(checkpoint, library, found, asked))
        found = picked
    if not found:
        raise CheckpointError(_unrecognised(checkpoint, asked))
    usable = [c for c in found if not c.recognition.refusal]
    top = [c for c in found if c.loader.priority == found[0].loader.priority]
    if all(c.recognition.refusal for c in top):  # the most specific loader knows the folder and refuses it
        raise CheckpointError(_refused(checkpoint, top[0], usable))
    _no_tie(checkpoint, [c for c in top if not c.recognition.refusal])
    for candidate in usable:
        chosen_task = task or candidate.recognition.task
        assert chosen_task is not None  # a usable recognition names its task
        if chosen_task not in candidate.recognition.tasks:
            if candidate is usable[0]:
                raise CheckpointError(_cannot(checkpoint, chosen_task, candidate))
            continue
        plan = _plan(checkpoint, host, candidate, chosen_task)
        if plan is not None:
            others = tuple(c for c in everyone if c is not candidate)
            return Choice(candidate, chosen_task, task is None, plan, others)
    raise CheckpointError(
        f"{checkpoint.source or checkpoint.path}: every loader that recognised it failed to plan its export "
        f"({', '.join(c.label for c in usable)}; see the warnings above): report it to their packs"
    )


def _plan(checkpoint: Checkpoint, host: PackHost, candidate: Candidate, task: str) -> ExportPlan | None:
    pack, loader = candidate.pack, candidate.loader
    plan = _guarded(host, pack, loader, f"planning {task}", lambda: loader.plan(checkpoint, task))
    if plan is None or _wrong(host, pack, loader, "plan", plan, ExportPlan):
        return None
    if plan.task != task:
        problem = f"loader {loader.name!r} was asked to plan {task!r} and planned {plan.task!r}"
        host.packs.fail(HookError(pack, CHECKPOINT_LOADERS, problem), "leaving that loader out")
        return None
    return plan


def _no_tie(checkpoint: Checkpoint, usable: Sequence[Candidate]) -> None:
    top = [c for c in usable if c.loader.priority == usable[0].loader.priority]
    if len({c.label for c in top}) > 1:
        names = ", ".join(f"{c.label} (library {c.loader.library})" for c in top)
        raise CheckpointError(
            f"{checkpoint.source or checkpoint.path} is recognised by {len(top)} loaders of the same priority "
            f"({usable[0].loader.priority}): {names}; choose one with --library NAME (library=NAME)"
        )


def _refused(checkpoint: Checkpoint, candidate: Candidate, usable: Sequence[Candidate]) -> str:
    where = checkpoint.source or checkpoint.path
    hint = (
        f" ({candidate.label} refuses it; --library {usable[0].loader.library} would export it as that)"
        if usable
        else ""
    )
    return f"{where}: {candidate.recognition.refusal}{hint}"


def _cannot(checkpoint: Checkpoint, task: str, candidate: Candidate) -> str:
    recognition = candidate.recognition
    return (
        f"{checkpoint.source or checkpoint.path} ({recognition.evidence}) cannot be exported for task {task!r} by "
        f"{candidate.label}: the tasks it can do are {', '.join(recognition.tasks)}; give one of them with --task "
        "(task=)"
    )


def _looked_for(asked: Sequence[tuple[str, CheckpointLoader]]) -> str:
    return "; ".join(f"{pack}:{loader.name} looks for {loader.looks_for}" for pack, loader in asked)


def _unrecognised(checkpoint: Checkpoint, asked: Sequence[tuple[str, CheckpointLoader]]) -> str:
    where = checkpoint.source or checkpoint.path
    if not asked:
        return (
            f"{where}: no installed pack offers a checkpoint loader: install the pack of its library "
            "(pip install opreg-transformers for transformers, sentence-transformers), or export it from a factory "
            "file (path/to/file.py:make)"
        )
    return (
        f"no installed pack's loader recognises {where} ({_looked_for(asked)}): check that it is the checkpoint "
        "folder (the one holding config.json or model_index.json), or install the pack of its library"
    )


def _unpicked(checkpoint: Checkpoint, library: str, found: Sequence[Candidate], asked: Sequence[Any]) -> str:
    where = checkpoint.source or checkpoint.path
    if found:
        names = ", ".join(f"{c.loader.library} ({c.label})" for c in found)
        return f"--library {library}: no loader of that library recognises {where}; those that do: {names}"
    return f"--library {library}: {_unrecognised(checkpoint, asked)}"
