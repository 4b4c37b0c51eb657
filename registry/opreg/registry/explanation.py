"""Why resolution picks what it picks: :meth:`opreg.Registry.explain`'s :class:`Explanation` (each
candidate's fate and reason, :func:`explain`), the :class:`Conflict` s it reports, and the
:class:`Widening` of a target that cannot serve an op (:func:`widen`). Values, the functions that
find them on a registry, and those that word the reasons.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from opreg.registry.impls import CORE_PACK, Impl
from opreg.registry.opname import OpName
from opreg.registry.resolution import Resolving, tied
from opreg.registry.targets import Target
from opreg.values import has_complex

CHOSEN = "chosen"
OUTRANKED = "outranked"
DROPPED = "dropped"
CONDITIONAL = "conditional"


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One impl in an :class:`Explanation`, with its fate and the reason."""

    impl: Impl
    status: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Explanation:
    """Why :meth:`Registry.resolve` picks what it picks.

    Fields:
        op: the torch op.
        target: the target resolved for.
        candidates: every impl registered for ``op``, in resolution order
            (eligible first), each with a status (chosen, outranked, dropped,
            conditional) and a reason.
        chosen: the winning impl, or ``None``.
        conflicts: unconditional impls that tie with the chosen one.
        elsewhere: when nothing is chosen, where the op would be served: the target with the
            custom domains its best impl needs (:meth:`Registry.widen`), and the profiles that
            serve it; ``""`` otherwise.
    """

    op: OpName
    target: Target
    candidates: tuple[Candidate, ...]
    chosen: Impl | None
    conflicts: tuple[Impl, ...]
    elsewhere: str = ""

    def __str__(self) -> str:
        lines = [f"{self.op} for target {self.target}:"]
        if not self.candidates:
            lines.append("  no impl is registered")
        for c in self.candidates:
            lines.append(
                f"  [{c.status}] {c.impl.label} ({c.impl.requirement}, priority {c.impl.priority}): {c.reason}"
            )
        if self.conflicts:
            lines.append("  conflict: ties with " + ", ".join(i.label for i in self.conflicts))
        if self.elsewhere:
            lines.append(f"  {self.elsewhere}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True, slots=True)
class Widening:
    """How a target that cannot serve an op would (:meth:`Registry.widen`): with the custom domains
    the op's best impl needs that the target does not name.

    Fields:
        op: the torch op.
        impl: the impl that would serve it.
        declared: ``((domain, version), ...)``: each domain added, at the version the impl's pack
            declares (:meth:`Registry.declared_version`).
        target: the target with the domains added at versions the impl accepts: the declared
            ones where they fit its requirement (:attr:`exact`), else its requirement's lowest.
    """

    op: OpName
    impl: Impl
    declared: tuple[tuple[str, int], ...]
    target: Target

    @property
    def exact(self) -> bool:
        """Whether the impl accepts every domain at the version its pack declares."""
        return all(self.target.get(d) == v for d, v in self.declared)

    def __str__(self) -> str:
        added = ", ".join(f"{d}={v}" for d, v in self.declared)
        return f"{self.impl.label} at {added}, the version {self.impl.pack} declares (-t {self.target.spec})"


@dataclasses.dataclass(frozen=True, slots=True)
class Conflict:
    """Unconditional impls of one op that tie for a target; ``impls[0]`` wins.

    Fields:
        op: the torch op.
        target: the target they tie at.
        impls: the tied impls, the one used first.
        preferred: the user chose the winner (:meth:`Registry.prefer`); otherwise
            it won by the default rule (the core pack, else pack name).
    """

    op: OpName
    target: Target
    impls: tuple[Impl, ...]
    preferred: bool = False

    def __str__(self) -> str:
        names = ", ".join(i.label for i in self.impls)
        how = "as preferred" if self.preferred else "by default; choose with prefer="
        return f"{self.op} at {self.target}: {names} tie; {self.impls[0].label} is used ({how})"


def label_beside(impl: Impl, other: Impl) -> str:
    """``impl``'s label, with its requirement where ``other`` is another version of the same function."""
    return impl.label if impl.label != other.label else f"{impl.label} at {impl.requirement}"


def why_not(impl: Impl, node: Any) -> str:
    """Why a conditional impl is not chosen for ``node`` (``None``: no node to test it on)."""
    if node is None:
        return "for complex values only; no node to test" if impl.complex else "has a predicate; no node to test it on"
    if has_complex(node) != impl.complex:
        if impl.complex:
            return "for complex values only; the node has none"
        return "the node has complex values (real pairs), which this impl is not registered for (complex=True)"
    return "its predicate rejects the node"


def why_chosen(impl: Impl, ordered: tuple[Impl, ...], preferred: str | None, node: Any) -> str:
    """Why resolution picks ``impl`` from ``ordered`` (every impl the target can use, in resolution
    order): what sets it above the next impl of its kind, and the impls ranked above it that were
    passed over (each conditional: no node to test it on, or it does not take this node)."""
    index = ordered.index(impl)
    above = ordered[:index]
    below = [i for i in ordered[index + 1 :] if i.complex is impl.complex]
    if impl.override and not (below and below[0].override):
        reason = "registered by the user (overrides packs)"
    elif below:
        reason = beats(impl, below[0], preferred)
    else:
        reason = "the only impl this target can use" if not above else "the only other impl this target can use"
    if above:
        passed = "; ".join(f"{i.label} ({why_not(i, node)})" for i in above)
        reason += f"; ranked above it but passed over: {passed}"
    if impl.profiles and not reason.startswith("for profile"):
        reason += f"; for profile {', '.join(impl.profiles)}, which this target serves"
    return reason


def beats(impl: Impl, runner: Impl, preferred: str | None) -> str:
    """The first key of resolution's order (:meth:`opreg.Registry.candidates`) on which ``impl`` goes
    before ``runner``."""
    if impl.priority != runner.priority:
        return f"higher priority ({impl.priority} > {runner.priority} of {runner.label})"
    if bool(impl.profiles) != bool(runner.profiles):
        return f"for profile {', '.join(impl.profiles)}, which this target serves ({runner.label} is for every target)"
    if impl.requirement.rank() != runner.requirement.rank():
        return f"newest opset requirement ({impl.requirement} vs {runner.requirement} of {runner.label})"
    if impl.pack == preferred and runner.pack != preferred:
        return f"ties with {runner.label}; pack {preferred!r} is preferred (prefer=)"
    if impl.predicate is not None and runner.predicate is None:
        return f"its predicate accepts the node (tried before {runner.label}, which has none)"
    if impl.pack == CORE_PACK and runner.pack != CORE_PACK:
        return f"ties with {runner.label}; the core pack wins ties unless another pack is preferred (prefer=)"
    return f"ties with {label_beside(runner, impl)}; broken by pack and function name (choose with prefer=)"


def explain(registry: Resolving, op: OpName, target: Target, node: Any) -> Explanation:
    """Every impl of ``op`` in ``registry`` with the reason it is chosen or not at ``target``."""
    ordered = registry.candidates(op, target)
    chosen = registry.resolve(op, target, node)
    rows: list[Candidate] = []
    for impl in ordered:
        if impl is chosen:
            rows.append(Candidate(impl, CHOSEN, why_chosen(impl, ordered, registry.preferences().get(op), node)))
        elif impl.conditional if node is None else not impl.accepts(node):
            rows.append(Candidate(impl, CONDITIONAL, why_not(impl, node)))
        else:
            reason = "not reached"
            if chosen is not None:
                why = beats(chosen, impl, registry.preferences().get(op))
                reason = f"ranked below {label_beside(chosen, impl)}: {why}"
            rows.append(Candidate(impl, OUTRANKED, reason))
    for impl in registry.ranked(op):
        if impl not in ordered:
            rows.append(Candidate(impl, DROPPED, registry.unmet(impl, target) or "not eligible"))
    ties = tied(ordered, complex=chosen is not None and chosen.complex)
    conflicts = ties[1:] if chosen is not None and ties and ties[0] is chosen else ()
    where = elsewhere(registry, op, target, node) if chosen is None else ""
    return Explanation(op, target, tuple(rows), chosen, tuple(conflicts), where)


def elsewhere(registry: Resolving, op: OpName, target: Target, node: Any) -> str:
    """Where ``op`` is served when ``target`` cannot serve it: the target with the domains its best
    impl needs (which an export adds by itself), and the profiles that serve it."""
    parts = []
    widening = widen(registry, op, target, node)
    if widening is not None:
        added = ", ".join(f"{d}={v}" for d, v in widening.target.versions if target.get(d) is None)
        how = (
            f"an export adds {added} by itself, the version pack {widening.impl.pack} declares"
            if widening.exact
            else f"pack {widening.impl.pack} declares {', '.join(f'{d}={v}' for d, v in widening.declared)}, "
            "which its impl does not accept: an export refuses it"
        )
        parts.append(f"served at -t {widening.target.spec} by {widening.impl.label} ({how})")
    profiles = registry.profiles
    served = [name for name in profiles if registry.resolve(op, Target.of(name, profiles), node)]
    if served:
        parts.append(f"served by profile {', '.join(served)}")
    return "; ".join(parts)


def widen(registry: Resolving, op: OpName, target: Target, node: Any) -> Widening | None:
    """How ``target`` would serve ``op`` when no impl of ``registry`` can (:meth:`opreg.Registry.widen`):
    the first impl in resolution order that needs only custom domains the target does not name (and
    takes ``node``; without one, an impl without a predicate), with those domains added."""
    if registry.resolve(op, target, node) is not None:
        return None
    for impl in registry.ranked(op):
        absent = {d: r for d, r in impl.requirement.domains if target.get(d) is None}
        if not absent or not (impl.accepts(node) if node is not None else not impl.conditional):
            continue
        declared = {d: registry.declared_version(impl.pack, d) or r.min for d, r in absent.items()}
        fitting = {d: v if v in absent[d] else absent[d].min for d, v in declared.items()}
        widened = target.extended(fitting)
        if registry.unmet(impl, widened) is None:
            return Widening(op, impl, tuple(sorted(declared.items())), widened)
    return None
