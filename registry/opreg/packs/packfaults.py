"""A pack's faults in one export, shown wherever a user looks.

opreg works around what a pack gets wrong while it exports: a rewrite rule or pass that
raises or leaves an invalid graph is undone and left out (:mod:`opreg.exporter._rewrite`),
a capture patch that fails is left out and one that leaves the library changed is put
back (:mod:`opreg.packs.patching`). Each such fault is a :class:`PackFault`, and it is shown

- in Python, as a :class:`opreg.PackWarning` (``warnings.warn``: filter it like any warning),
- on the command line, as a ``warning:`` line (cold or warm cache alike),
- in the result, :attr:`opreg.OnnxProgram.pack_faults`,
- in the model, its :data:`METADATA_KEY` metadata (``opreg inspect`` lists them),

and logged (``opreg.packs.packfaults``, debug level: the warning is the report).
Importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from opreg.errors import PackWarning, user_stacklevel

logger = logging.getLogger(__name__)

METADATA_KEY = "opreg.pack_faults"
"""Model ``metadata_props``: a JSON list of the export's pack faults (:meth:`PackFault.record`)."""

REWRITE = "rewrite"
PATCH = "capture patch"
KINDS = (REWRITE, PATCH)


@dataclasses.dataclass(frozen=True)
class PackFault:
    """One thing a pack got wrong in an export, and what opreg did about it.

    Fields:
        pack: the pack at fault.
        kind: what of the pack's: :data:`REWRITE` (a rule or pass of ``opreg_rewrite_rules``)
            or :data:`PATCH` (an ``opreg_capture_patches`` patch).
        name: its label, ``pack:name``.
        detail: what it did and what opreg did (``raised ValueError: ...; it is left out``).
    """

    pack: str
    kind: str
    name: str
    detail: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a pack fault's kind is one of {KINDS}, got {self.kind!r}")

    def __str__(self) -> str:
        return f"pack {self.pack!r}: {self.kind} {self.name} {self.detail}"

    def record(self) -> dict[str, str]:
        """Its entry in the model's :data:`METADATA_KEY` metadata."""
        return {"pack": self.pack, "kind": self.kind, "name": self.name, "detail": self.detail}


_COLLECTED: contextvars.ContextVar[list[PackFault] | None] = contextvars.ContextVar("opreg_pack_faults", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[list[PackFault]]:
    """The faults :func:`report`\\ ed in the block (in this thread or task), in order."""
    found: list[PackFault] = []
    token = _COLLECTED.set(found)
    try:
        yield found
    finally:
        _COLLECTED.reset(token)


def report(fault: PackFault) -> None:
    """Record ``fault`` for the export under way (see :func:`collecting`); outside one, warn now."""
    logger.debug("%s", fault)
    found = _COLLECTED.get()
    if found is None:
        warn([fault])
    elif fault not in found:
        found.append(fault)


def warn(faults: Iterable[PackFault]) -> None:
    """A :class:`opreg.PackWarning` per fault, attributed to the user's ``opreg.export(...)`` line."""
    level = user_stacklevel()
    for fault in faults:
        warnings.warn(str(fault), PackWarning, stacklevel=level)


def metadata(faults: Iterable[PackFault]) -> str | None:
    """The :data:`METADATA_KEY` value for ``faults`` (``None`` when there are none)."""
    entries = [f.record() for f in faults]
    return json.dumps(entries) if entries else None


def read_metadata(value: str | None) -> list[dict[str, Any]]:
    """The entries of a JSON list in a model's metadata, such as :data:`METADATA_KEY`'s (``[]`` if
    none or unreadable)."""
    if not value:
        return []
    try:
        entries = json.loads(value)
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


__all__ = ["KINDS", "METADATA_KEY", "PATCH", "REWRITE", "PackFault", "collecting", "metadata", "read_metadata",
           "report", "user_stacklevel", "warn"]  # fmt: skip
