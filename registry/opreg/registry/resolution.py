"""Resolution: which impl of an op a target gets (docs/design.md, "Registry and resolution").

For one op, one target and optionally one node:

1. drop every impl whose opset requirement the target does not meet, that emits an op the target's
   ONNX Runtime release has no CPU kernel for (``onnxruntime==1.22``), or whose profiles it does not
   serve (:func:`unmet`);
2. order the rest by: explicit user override first, then higher priority,
   then an impl for profiles (eligible here, so for a profile this target serves) before an
   impl for every target, then the newest requirement (ai.onnx minimum, then the custom domains it
   uses), then impls with a predicate before unconditional ones at the same
   rank (:meth:`Impl.rank`); what still ties is broken by the pack the user
   prefers for the op (:meth:`Registry.prefer`), else the core pack, else pack
   name, function name and requirement (:meth:`Impl.tie_break`), and last
   registration order, so the same impls always give the same answer (:func:`ranking`);
3. the first impl whose predicate accepts the node (or that has none) wins (:func:`first`).
   A node with complex values (:func:`opreg.values.has_complex`) is served
   only by impls registered with ``complex=True``, and those serve no other.

Two unconditional impls that tie on override, priority, profiles and requirement are a
*conflict* (:func:`tied`, :func:`conflicts`): the order above still picks one, and
:meth:`Registry.conflicts` and :meth:`Registry.explain` report it (``opreg plugins``,
``opreg check`` and ``export`` warn; ``--strict`` refuses a conflict the user has not settled).

:class:`opreg.Registry` holds the impls and calls these; resolution remembers its answers per
registry in a :class:`Memo` of this module (:func:`memo`), never in the registry, so a frozen
registry's state never changes.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from opreg.registry import _opsets, runtimes
from opreg.registry.impls import Impl
from opreg.registry.opname import OpName
from opreg.registry.targets import ONNX_DOMAIN, Target, TargetLike
from opreg.registry.versions import since


class Resolving(Protocol):
    """What resolution's explanations read of a registry (:class:`opreg.Registry` is one)."""

    @property
    def profiles(self) -> dict[str, dict[str, int]]: ...

    def target(self, spec: TargetLike = "onnx") -> Target: ...
    def ops(self) -> list[OpName]: ...
    def impls(self, op: Any = None) -> tuple[Impl, ...]: ...
    def preferences(self) -> dict[OpName, str]: ...
    def declared_version(self, pack: str, domain: str) -> int | None: ...
    def ranked(self, op: Any) -> tuple[Impl, ...]: ...
    def unmet(self, impl: Impl, target: TargetLike = "onnx") -> str | None: ...
    def candidates(self, op: Any, target: TargetLike = "onnx") -> tuple[Impl, ...]: ...
    def resolve(self, op: Any, target: TargetLike = "onnx", node: Any = None) -> Impl | None: ...


@dataclasses.dataclass(slots=True)
class Memo:
    """What resolution remembers of one registry: its answers, never part of its value.

    Fields:
        ordered: per ``(op, target)``, the impls the target can use, in resolution order.
        targets: per target spec (a profile name, a version), the parsed :class:`Target`.
    """

    ordered: dict[tuple[OpName, Target], tuple[Impl, ...]] = dataclasses.field(default_factory=dict)
    targets: dict[Any, Target] = dataclasses.field(default_factory=dict)


_MEMOS: dict[int, Memo] = {}
"""Resolution's memo of each live registry, by ``id``: dropped when its registry is collected
(:func:`track`) or changed, while it is unfrozen (:func:`forget`)."""


def track(registry: object) -> None:
    """Drop ``registry``'s memo when it is collected (its ``id`` may then be another's)."""
    weakref.finalize(registry, _MEMOS.pop, id(registry), None)


def memo(registry: object) -> Memo:
    """``registry``'s memo, made on first use."""
    found = _MEMOS.get(id(registry))
    if found is None:
        found = _MEMOS[id(registry)] = Memo()
    return found


def forget(registry: object) -> None:
    """Drop what resolution remembers of ``registry``: it changed."""
    _MEMOS.pop(id(registry), None)


def ranking(preferred: str | None, order: Mapping[Impl, int]) -> Callable[[Impl], tuple]:
    """The key that sorts an op's impls in resolution order (rule 2): ``preferred`` is the pack the
    user prefers for the op, ``order`` each impl's registration index."""
    # the preferred pack goes first among impls of equal override, priority and requirement,
    # before the rank's last item (a conditional impl before an unconditional one)
    return lambda impl: (
        *impl.rank()[:-1],
        impl.pack != preferred,
        impl.rank()[-1],
        *impl.tie_break(),
        order.get(impl, 0),
    )


def unmet(impl: Impl, target: Target, profiles: Mapping[str, tuple[Mapping[str, int], str]]) -> str | None:
    """Why ``target`` cannot use ``impl`` (rule 1), or ``None`` if it can: its opset requirement
    (:meth:`opreg.Target.unmet`), the target's ONNX Runtime release's kernels for the ops it emits
    (:func:`unplaced`), then its profiles (``profiles``: name -> ``({domain: version}, pack)``
    of every profile the registry knows). An impl for profiles (``profiles=``) is eligible where the
    target offers every custom domain one of them names, at that profile's version; a profile no
    loaded pack defines serves no target."""
    why = target.unmet(impl.requirement) or unplaced(impl, target)
    if why is not None or not impl.profiles:
        return why
    reasons = []
    for name in impl.profiles:
        known = profiles.get(name)
        if known is None:
            reasons.append(f"{name!r}, which no loaded pack defines")
            continue
        wanted = {d: v for d, v in known[0].items() if d != ONNX_DOMAIN}
        missing = [f"{d}={v}" for d, v in sorted(wanted.items()) if target.get(d) != v]
        if not missing:
            return None
        reasons.append(f"{name}, which needs {', '.join(missing)}")
    return f"only for profile {' or '.join(reasons)}"


def first(candidates: Iterable[Impl], node: Any) -> Impl | None:
    """The impl of ``candidates`` (in resolution order) that serves ``node`` (rule 3), or ``None``.
    Without a node, conditional impls (a predicate, or complex values only) cannot be shown to apply
    and are passed over."""
    for impl in candidates:
        if (not impl.conditional) if node is None else impl.accepts(node):
            return impl
    return None


def tied(ordered: tuple[Impl, ...], *, complex: bool) -> tuple[Impl, ...]:
    """The best impls without a predicate that tie, among those for complex values or the others."""
    unconditional = [i for i in ordered if i.predicate is None and i.complex is complex]
    if not unconditional:
        return ()
    top = unconditional[0].tie_key()
    return tuple(i for i in unconditional if i.tie_key() == top)


def conflicts(registry: Resolving, target: Target) -> list[tuple[OpName, tuple[Impl, ...], bool]]:
    """``(op, tied impls, whether the user settled it)`` for every op whose best unconditional impls
    tie at ``target``, real and complex ones apart."""
    preferred = registry.preferences()
    found = []
    for op in registry.ops():
        for complex in (False, True):
            ties = tied(registry.candidates(op, target), complex=complex)
            if len(ties) > 1:
                found.append((op, ties, op in preferred))
    return found


def unplaced(impl: Impl, target: Target) -> str | None:
    """Why ``target``'s ONNX Runtime release cannot run ``impl`` (an op it emits with no CPU kernel
    there, :func:`opreg.registry.runtimes.lacks`), or ``None``: it can, or the target names no
    release. Each op is judged at the version the impl emits it (at most the target's): the opset a
    model imports is lowered to the one its nodes need, never raised."""
    if target.runtime is None:
        return None
    found = runtimes.release(target.runtime)
    for domain, version, op in sorted(_emitted(impl.function), key=str):
        at = target.get(domain) if domain else min(version or target.onnx, target.onnx)
        if domain not in runtimes.KERNEL_DOMAINS or at is None:
            continue
        defined = since(op, at, domain)
        if defined is None and domain in ("", "ai.onnx.ml"):
            continue  # not an op at this version: a branch the impl takes only at newer targets
        schema = defined or at  # ONNX defines no com.microsoft schemas: its version
        if not found.runs(domain, op, schema):
            return f"emits {runtimes.lacks(found, domain, op, schema)}"
    return None


_EMITTED: dict[int, tuple[object, frozenset[tuple[str, int | None, str]]]] = {}


def _emitted(function: object) -> frozenset[tuple[str, int | None, str]]:
    """:func:`opreg.registry._opsets.emitted_ops_deep`, once per impl function (kept with it, so
    its id stays its own)."""
    held = _EMITTED.get(id(function))
    if held is None or held[0] is not function:
        held = _EMITTED[id(function)] = (function, frozenset(_opsets.emitted_ops_deep(function)))
    return held[1]
