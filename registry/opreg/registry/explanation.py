"""Why resolution picks what it picks: :meth:`opreg.Registry.explain`'s :class:`Explanation` (each
candidate's fate and reason), the :class:`Conflict` s it reports, and the :class:`Widening` of a target
that cannot serve an op. Values, and the functions that word the reasons.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from opreg.registry.impls import CORE_PACK, Impl
from opreg.registry.opname import OpName
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


def tied(ordered: tuple[Impl, ...], *, complex: bool) -> tuple[Impl, ...]:
    """The best impls without a predicate that tie, among those for complex values or the others."""
    unconditional = [i for i in ordered if i.predicate is None and i.complex is complex]
    if not unconditional:
        return ()
    top = unconditional[0].tie_key()
    return tuple(i for i in unconditional if i.tie_key() == top)


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
    if impl.profiles:
        reason += f"; for profile {', '.join(impl.profiles)}, which this target serves"
    return reason


def beats(impl: Impl, runner: Impl, preferred: str | None) -> str:
    """The first key of resolution's order (:meth:`opreg.Registry.candidates`) on which ``impl`` goes
    before ``runner``."""
    if impl.priority != runner.priority:
        return f"higher priority ({impl.priority} > {runner.priority} of {runner.label})"
    if impl.requirement.rank() != runner.requirement.rank():
        return f"newest opset requirement ({impl.requirement} vs {runner.requirement} of {runner.label})"
    if impl.pack == preferred and runner.pack != preferred:
        return f"ties with {runner.label}; pack {preferred!r} is preferred (prefer=)"
    if impl.predicate is not None and runner.predicate is None:
        return f"its predicate accepts the node (tried before {runner.label}, which has none)"
    if impl.pack == CORE_PACK and runner.pack != CORE_PACK:
        return f"ties with {runner.label}; the core pack wins ties unless another pack is preferred (prefer=)"
    return f"ties with {label_beside(runner, impl)}; broken by pack and function name (choose with prefer=)"
