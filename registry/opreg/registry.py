"""The registry: torch op -> candidate impls, and resolution for a target.

Resolution (DESIGN.md §4) for one op, one target and optionally one node:

1. drop every impl whose opset requirement the target does not meet;
2. order the rest by: explicit user override first, then higher priority,
   then the newest requirement (ai.onnx minimum, then the custom domains it
   uses), then impls with a predicate before unconditional ones at the same
   rank (:meth:`Impl.rank`); what still ties is broken by the pack the user
   prefers for the op (:meth:`Registry.prefer`), else the core pack, else pack
   name, function name and requirement (:meth:`Impl.tie_break`), and last
   registration order, so the same impls always give the same answer;
3. the first impl whose predicate accepts the node (or that has none) wins.
   A node with complex values (:func:`opreg.values.has_complex`) is served
   only by impls registered with ``complex=True``, and those serve no other.

Two unconditional impls that tie on override, priority and requirement are a
*conflict*: the order above still picks one, and :meth:`Registry.conflicts`
and :meth:`Registry.explain` report it (``opreg plugins``, ``opreg check`` and
``export`` warn; ``--strict`` refuses a conflict the user has not settled).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opreg import _inspect, _opsets
from opreg.errors import (
    FrozenRegistryError,
    InvalidArgumentError,
    InvalidTargetError,
    NoImplementationError,
    RegistrationError,
)
from opreg.marks import marked, profile_names
from opreg.opname import OpName
from opreg.packset import PackSet
from opreg.targets import (
    BUILTIN_PROFILES,
    ONNX_DOMAIN,
    OpsetRequirement,
    Target,
    TargetLike,
    VersionRange,
    VersionRangeLike,
    normalize_domain,
    onnx_opset_range,
)
from opreg.values import has_complex

if TYPE_CHECKING:
    from opreg.pluginapi import CapturePatch

logger = logging.getLogger(__name__)

USER_PACK = "<user>"
"""Pack name of impls registered by hand on a :class:`Registry`."""
CORE_PACK = "core"
"""Entry-point name of the core pack (distribution ``opreg``): it wins unconditional ties."""

Predicate = Callable[[Any], bool]


@dataclasses.dataclass(frozen=True, slots=True)
class Impl:
    """One registered implementation of a torch op: a value (frozen, hashable, compared field by
    field; ``function`` and ``predicate`` by identity, as Python compares functions; ``params``,
    read from ``function``, not at all).

    Fields:
        op: the torch op it implements.
        function: the onnxscript script function or trace-only function.
        requirement: the ai.onnx range and custom-domain versions it needs.
        priority: higher wins among impls a target can use (default 0).
        predicate: ``predicate(node) -> bool`` on the ``torch.fx.Node``, for
            impls that only cover some cases; ``None`` covers every node.
        pack: the pack it came from, filled in by opreg (``"<user>"`` for
            impls registered by hand).
        override: registered by the user, so it wins over every pack.
        complex: it serves exactly the nodes with complex values, which reach it as
            real tensors with a trailing dimension of 2 (see :mod:`opreg.values`);
            impls without it never see such a node.
        kind: ``"script"`` or ``"trace"``.
        name: the function's name, as shown in reports.
        schema_checked: whether its signature was checked against torch's schema.
        params: the function's parameters as read at registration (the
            exporter maps a node's arguments onto them).
        convention: how the exporter passes a node's arguments: ``"opreg"``, or
            ``"torch.onnx"`` for a function written for torch.onnx (a
            ``custom_translation_table`` value, the tutorials' ``register_op``),
            which gets them as torch.onnx passes them.
        source: ``path/to/module.py:LINE`` where the function is defined (``""`` if unknown).
        profiles: the target profiles it is for: it is eligible only at a target that offers
            every custom domain one of them names, at that profile's version (the profile's
            ai.onnx version aside: ``opset`` says that); ``()``: wherever ``requirement`` is met.
            Decided by :meth:`Registry.unmet` without a node, as ``requirement`` is.
    """

    op: OpName
    function: Any
    requirement: OpsetRequirement
    priority: int = 0
    predicate: Predicate | None = None
    pack: str = USER_PACK
    override: bool = False
    complex: bool = False
    kind: str = _inspect.TRACE
    name: str = ""
    schema_checked: bool = False
    params: _inspect.Params | None = dataclasses.field(default=None, compare=False, repr=False)
    convention: str = _inspect.OPREG
    source: str = ""
    profiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.op, OpName):
            raise RegistrationError(f"Impl.op must be an OpName, got {self.op!r}")
        if not callable(self.function):
            raise RegistrationError(f"impl for {self.op} must be callable, got {self.function!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise RegistrationError(f"priority of impl for {self.op} must be an int, got {self.priority!r}")
        if self.predicate is not None and not callable(self.predicate):
            raise RegistrationError(f"predicate of impl for {self.op} must be callable, got {self.predicate!r}")
        if self.kind not in (_inspect.SCRIPT, _inspect.TRACE):
            raise RegistrationError(f"impl kind must be 'script' or 'trace', got {self.kind!r}")
        if self.convention not in (_inspect.OPREG, _inspect.TORCH_ONNX):
            raise RegistrationError(f"impl convention must be 'opreg' or 'torch.onnx', got {self.convention!r}")
        object.__setattr__(self, "profiles", profile_names(self.profiles, f"impl for {self.op}"))

    @property
    def label(self) -> str:
        return f"{self.pack}:{self.name}"

    def rank(self) -> tuple:
        """What resolution orders impls by, best first: user override, priority, newest
        requirement, and a predicate before no predicate. Impls of equal rank tie."""
        onnx_min, n_domains, domain_sum = self.requirement.rank()
        return (not self.override, -self.priority, -onnx_min, -n_domains, -domain_sum, self.predicate is None)

    def tie_break(self) -> tuple:
        """How a tie is broken when the user has not said which pack they prefer: the core
        pack first, then pack and function name (never registration order)."""
        return (self.pack != CORE_PACK, self.pack, self.name, str(self.requirement))

    def sort_key(self) -> tuple:
        return (*self.rank(), *self.tie_break())

    def tie_key(self) -> tuple:
        return (self.override, self.priority, self.requirement.rank())

    @property
    def keywords(self) -> dict[str, int]:
        """What every call of the function gets besides the node's arguments: for an impl whose
        function takes the opset it is registered at (one body for several versions), that
        version (``{"opset": 20}``); else nothing."""
        if self.params is not None and self.params.takes_opset:
            return {_inspect.OPSET_PARAMETER: self.requirement.onnx.min}
        return {}

    @property
    def conditional(self) -> bool:
        """Whether it covers only some nodes (it has a predicate, or serves complex values only)."""
        return self.predicate is not None or self.complex

    def accepts(self, node: Any) -> bool:
        """Whether this impl covers ``node``: complex values or not as it serves them, and
        its predicate agrees (a predicate that raises says no)."""
        if has_complex(node) != self.complex:
            return False
        if self.predicate is None:
            return True
        try:
            return bool(self.predicate(node))
        except Exception:
            logger.exception("predicate of %s for %s raised; treating the node as not covered", self.label, self.op)
            return False


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


@dataclasses.dataclass(frozen=True, slots=True)
class RegistryData:
    """What a :class:`Registry` holds (:meth:`Registry.data`): hashable, comparable values.

    Fields:
        impls: every impl, in registration order.
        profiles: ``(name, ((domain, version), ...), pack)`` for every target profile, built-in ones first.
        unsupported: ``(op, pack, reason)`` for every op a pack (or the user) declines.
        preferences: ``(op, pack)`` for every op whose ties a preferred pack settles.
        capture_patches: ``(pack, patch)`` for every capture patch added by hand (the packs' come from a hook).
    """

    impls: tuple[Impl, ...]
    profiles: tuple[tuple[str, tuple[tuple[str, int], ...], str], ...]
    unsupported: tuple[tuple[OpName, str, str], ...]
    preferences: tuple[tuple[OpName, str], ...]
    capture_patches: tuple[tuple[str, CapturePatch], ...] = ()


class Registry:
    """Torch op -> impls, with profiles and resolution for targets.

    :func:`opreg.default_registry` gives the registry built from the installed
    packs (:meth:`build`): shared and frozen, a value. :meth:`copy` it to
    extend it, or start from ``Registry()``; :meth:`register`,
    :meth:`add_profile`, :meth:`mark_unsupported`, :meth:`prefer` and
    :meth:`add_capture_patch` change an unfrozen registry.

    Attributes:
        packs: the :class:`opreg.PackSet` it was built from: each discovered
            pack's report (iterate it), and the loaded packs' hooks.
    """

    def __init__(self) -> None:
        self._impls: dict[OpName, list[Impl]] = {}
        self._order: dict[Impl, int] = {}
        self._unsupported: dict[OpName, tuple[str, str]] = {}
        self._profiles: dict[str, tuple[dict[str, int], str]] = {
            name: (dict(versions), "opreg") for name, versions in BUILTIN_PROFILES.items()
        }
        self._preferred: dict[OpName, str] = {}
        self._frozen = False
        self._ordered: dict[tuple[OpName, Target], tuple[Impl, ...]] = {}
        self._targets: dict[Any, Target] = {}
        self._patches: dict[str, CapturePatch] = {}
        self.packs: PackSet = PackSet()

    @classmethod
    def build(
        cls,
        impls: Iterable[Impl] = (),
        *,
        profiles: Iterable[tuple[str, Mapping[str, int], str]] = (),
        unsupported: Iterable[tuple[Any, str, str]] = (),
        preferences: Mapping[Any, str] | None = None,
        packs: PackSet | None = None,
    ) -> Registry:
        """A frozen registry of ``impls`` (in this order) and the named ``profiles``
        (``(name, {domain: version}, pack)``), the ops declared ``unsupported``
        (``(op, pack, reason)``), tie ``preferences`` (op -> pack, see
        :meth:`prefer`) and the :class:`opreg.PackSet` they came from. A profile
        name given twice is an :class:`InvalidTargetError`."""
        registry = cls()
        for name, versions, pack in profiles:
            registry.add_profile(name, versions, pack=pack)
        for op, pack, reason in unsupported:
            registry.mark_unsupported(op, reason, pack=pack)
        for impl in impls:
            registry._store(impl)
        for op, pack in (preferences or {}).items():
            registry.prefer(op, pack)
        if packs is not None:
            registry.packs = packs
        return registry.freeze()

    # -- changing an unfrozen registry ---------------------------------------------------

    def register(
        self,
        op: Any,
        function: Any,
        *,
        opset: VersionRangeLike | None = None,
        domains: Mapping[str, VersionRangeLike] | None = None,
        priority: int = 0,
        predicate: Predicate | None = None,
        complex: bool = False,
        profiles: Iterable[str] = (),
    ) -> Impl:
        """Register ``function`` for torch op ``op`` as a user override.

        Impls registered here win over every pack's (see :meth:`resolve`).
        ``opset`` is the ai.onnx range (``18``, ``(18, 20)``); ``domains`` maps
        each custom domain the impl emits to its version. Both default to what
        the function visibly uses. ``complex=True`` makes it the impl for nodes with
        complex values (see :mod:`opreg.values`); ``profiles`` keeps it for the targets that
        serve one of those profiles (:meth:`unmet`). Raises :class:`RegistrationError` (or its
        :class:`SignatureMismatchError`) with what to fix.
        """
        self._check_mutable()
        impl = build_impl(
            op, function, opset=opset, domains=domains, priority=priority,
            predicate=predicate, pack=USER_PACK, override=True, complex=complex, profiles=profiles,
        )  # fmt: skip
        return self._store(impl)

    def register_module(self, *modules: Any) -> list[Impl]:
        """Register, as user overrides, every function of ``modules`` marked with :func:`opreg.impl`
        (see :meth:`opreg.Registrar.register_module`); returns the impls. Raises like :meth:`register`
        at the first mark it cannot take."""
        return [self.register(spec.op, function, **spec.arguments()) for function, spec in marked(*modules)]

    def add(self, *impls: Impl) -> None:
        """Add impls already built (:func:`build_impl`, :func:`opreg.table_in.torch_impl`), under
        the pack and with the override flag they carry."""
        self._check_mutable()
        for impl in impls:
            if not isinstance(impl, Impl):
                raise RegistrationError(f"Registry.add takes opreg.Impl objects, got {impl!r}")
            self._store(impl)

    def add_profile(self, name: str, versions: Mapping[str, int], *, pack: str = USER_PACK) -> None:
        """Add the named target profile ``name``; a name already taken is an error."""
        self._check_mutable()
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidTargetError(f"profile name must be an identifier, got {name!r}")
        if name in self._profiles:
            raise InvalidTargetError(
                f"target profile {name!r} from {pack} is already defined by {self._profiles[name][1]}: "
                "choose another name"
            )
        target = Target.of(dict(versions))  # validates
        self._profiles[name] = (target.as_dict(), pack)
        self._targets.clear()
        self._ordered.clear()  # impls for this profile may apply now

    def mark_unsupported(self, op: Any, reason: str, *, pack: str = USER_PACK) -> None:
        """Record that ``pack`` deliberately leaves ``op`` without an impl, and why."""
        self._check_mutable()
        self._unsupported[OpName.of(op)] = (pack, str(reason))

    def prefer(self, op: Any, pack: str) -> None:
        """Resolve ties of ``op`` in favour of ``pack``'s impl (by default the core pack
        wins a tie, then the pack whose name sorts first): among impls of equal override,
        priority and opset requirement, ``pack``'s come first, also before another pack's
        conditional impl (one with a predicate). Overrides, priority and opset
        requirements still rank first."""
        self._check_mutable()
        op = OpName.of(op)
        packs = {i.pack for i in self._impls.get(op, ())}
        if pack not in packs:
            have = ", ".join(sorted(packs)) or "none"
            raise NoImplementationError(f"cannot prefer pack {pack!r} for {op}: it has no impl of it (packs: {have})")
        self._preferred[op] = pack
        self._ordered.clear()

    def add_capture_patch(self, patch: CapturePatch) -> CapturePatch:
        """Add a capture patch of your own (``user:name``), installed for the captures this registry exports
        as the packs' ``opreg_capture_patches`` are (see :mod:`opreg.patching`). A name already added is an
        :class:`InvalidArgumentError`."""
        from opreg.pluginapi import CapturePatch

        self._check_mutable()
        if not isinstance(patch, CapturePatch):
            raise InvalidArgumentError(f"add_capture_patch takes an opreg.CapturePatch, got {type(patch).__name__}")
        if patch.name in self._patches:
            raise InvalidArgumentError(f"a capture patch named {patch.name!r} was already added: choose another name")
        self._patches[patch.name] = patch
        return patch

    def capture_patches(self) -> tuple[tuple[str, CapturePatch], ...]:
        """``(USER_PACK, patch)`` for each capture patch added with :meth:`add_capture_patch`, in order
        (the packs' come from their hook)."""
        return tuple((USER_PACK, patch) for patch in self._patches.values())

    def _store(self, impl: Impl) -> Impl:
        self._impls.setdefault(impl.op, []).append(impl)
        self._order[impl] = len(self._order)
        self._ordered.clear()
        return impl

    def _check_mutable(self) -> None:
        if self._frozen:
            raise FrozenRegistryError(
                "this registry is shared (built from the installed packs and cached): call .copy() and extend the copy"
            )

    def freeze(self) -> Registry:
        """Refuse further changes; returns ``self``."""
        self._frozen = True
        return self

    @property
    def frozen(self) -> bool:
        return self._frozen

    def copy(self) -> Registry:
        """An unfrozen copy with the same impls, profiles, preferences and packs."""
        new = Registry()
        new._profiles = dict(self._profiles)
        new._impls = {op: list(impls) for op, impls in self._impls.items()}
        new._order = dict(self._order)
        new._unsupported = dict(self._unsupported)
        new._preferred = dict(self._preferred)
        new._patches = dict(self._patches)
        new.packs = self.packs
        return new

    def call_hook(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``(pack, result)`` of ``hook`` on every loaded pack (see :meth:`opreg.PackSet.call`)."""
        return self.packs.call(hook, **kwargs)

    # -- reading --------------------------------------------------------------

    @property
    def profiles(self) -> dict[str, dict[str, int]]:
        """Profile name -> ``{domain: version}``."""
        return {name: dict(versions) for name, (versions, _) in self._profiles.items()}

    def target(self, spec: TargetLike = "onnx") -> Target:
        """Build a :class:`Target` from ``spec``, knowing this registry's profiles
        (and, for a profile no loaded pack defines, which failed pack might have)."""
        if isinstance(spec, Target):
            return spec
        key = spec if isinstance(spec, (str, int)) else None
        if key is not None and key in self._targets:
            return self._targets[key]
        try:
            target = Target.of(spec, self.profiles)
        except InvalidTargetError as e:
            raise InvalidTargetError(f"{e}{self._failed_packs_hint()}") from e
        self._check_served(target)
        if key is not None:
            self._targets[key] = target
        return target

    def _check_served(self, target: Target) -> None:
        """Refuse a custom domain no impl of this registry emits and no profile names (a typo, most
        likely). Data only: a pack whose rewrite rules make nodes of a domain no impl emits names it
        in a profile (``opreg_targets``); no pack code runs to parse a target."""
        impls = self.impls()
        if not impls:
            return  # a registry being built by hand: anything may come
        emitted = {d for i in impls for d, _ in i.requirement.domains}
        named = {d for versions, _ in self._profiles.values() for d in versions}
        known = (emitted | named) - {ONNX_DOMAIN}
        for domain in [d for d, _ in target.versions if d != ONNX_DOMAIN and d not in known]:
            close = difflib.get_close_matches(domain, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (impls emit {', '.join(sorted(emitted)) or 'none'})"
            raise InvalidTargetError(
                f"no impl in the registry emits domain {domain!r} of target {target} and no profile names it{hint}"
            )

    def _failed_packs_hint(self) -> str:
        failed = [r for r in self.packs if r.status in ("failed", "incompatible")]
        if not failed:
            return ""
        return " (packs that did not load and may define it: " + "; ".join(r.describe() for r in failed) + ")"

    def ops(self) -> list[OpName]:
        """Every op with at least one impl, sorted."""
        return sorted(self._impls)

    def impls(self, op: Any = None) -> tuple[Impl, ...]:
        """The impls of ``op`` in registration order, or every impl."""
        if op is None:
            return tuple(i for op_impls in self._impls.values() for i in op_impls)
        return tuple(self._impls.get(OpName.of(op), ()))

    def unsupported(self, op: Any = None) -> dict[OpName, tuple[str, str]]:
        """Ops declared unsupported: op -> ``(pack, reason)``; just ``op``'s if given."""
        if op is None:
            return dict(self._unsupported)
        op = OpName.of(op)
        return {op: self._unsupported[op]} if op in self._unsupported else {}

    def preferences(self) -> dict[OpName, str]:
        """Op -> the pack :meth:`prefer` chose for its ties."""
        return dict(self._preferred)

    def data(self) -> RegistryData:
        """What this registry holds, as one hashable value: two registries built from the same
        packs (or a registry and its copy) give equal data; the pack set is not part of it."""
        return RegistryData(
            impls=self.impls(),
            profiles=tuple(
                (name, tuple(sorted(versions.items())), pack) for name, (versions, pack) in self._profiles.items()
            ),
            unsupported=tuple((op, pack, reason) for op, (pack, reason) in self._unsupported.items()),
            preferences=tuple(self._preferred.items()),
            capture_patches=self.capture_patches(),
        )

    def __contains__(self, op: object) -> bool:
        return OpName.of(op) in self._impls

    def __len__(self) -> int:
        return sum(len(v) for v in self._impls.values())

    # -- resolving ------------------------------------------------------------

    def _key(self, op: OpName) -> Callable[[Impl], tuple]:
        # the preferred pack goes first among impls of equal override, priority and requirement,
        # before the rank's last item (a conditional impl before an unconditional one)
        preferred = self._preferred.get(op)
        return lambda impl: (
            *impl.rank()[:-1],
            impl.pack != preferred,
            impl.rank()[-1],
            *impl.tie_break(),
            self._order.get(impl, 0),
        )

    def unmet(self, impl: Impl, target: TargetLike = "onnx") -> str | None:
        """Why ``target`` cannot use ``impl``, or ``None`` if it can: its opset requirement
        (:meth:`opreg.Target.unmet`), then its profiles. An impl for profiles (``profiles=``) is
        eligible where the target offers every custom domain one of them names, at that profile's
        version; a profile no loaded pack defines serves no target."""
        target = self.target(target)
        why = target.unmet(impl.requirement)
        if why is not None or not impl.profiles:
            return why
        reasons = []
        for name in impl.profiles:
            known = self._profiles.get(name)
            if known is None:
                reasons.append(f"{name!r}, which no loaded pack defines")
                continue
            wanted = {d: v for d, v in known[0].items() if d != ONNX_DOMAIN}
            missing = [f"{d}={v}" for d, v in sorted(wanted.items()) if target.get(d) != v]
            if not missing:
                return None
            reasons.append(f"{name}, which needs {', '.join(missing)}")
        return f"only for profile {' or '.join(reasons)}"

    def candidates(self, op: Any, target: TargetLike = "onnx") -> tuple[Impl, ...]:
        """Impls of ``op`` that ``target`` can use (:meth:`unmet`), best first (predicates not evaluated)."""
        op = OpName.of(op)
        target = self.target(target)
        key = (op, target)
        ordered = self._ordered.get(key)
        if ordered is None:
            eligible = [i for i in self._impls.get(op, ()) if self.unmet(i, target) is None]
            ordered = tuple(sorted(eligible, key=self._key(op)))
            self._ordered[key] = ordered
        return ordered

    def resolve(self, op: Any, target: TargetLike = "onnx", node: Any = None) -> Impl | None:
        """The impl used for ``op`` (and ``node``, if given) at ``target``, or ``None``.

        Without a node, conditional impls (a predicate, or complex values only)
        cannot be shown to apply and are passed over.
        """
        for impl in self.candidates(op, target):
            if (not impl.conditional) if node is None else impl.accepts(node):
                return impl
        return None

    def get(self, op: Any, target: TargetLike = "onnx", node: Any = None) -> Impl:
        """Like :meth:`resolve`, but raise :class:`NoImplementationError` saying why."""
        impl = self.resolve(op, target, node)
        if impl is None:
            raise NoImplementationError(str(self.explain(op, target, node)))
        return impl

    def explain(self, op: Any, target: TargetLike = "onnx", node: Any = None) -> Explanation:
        """Every impl of ``op`` with the reason it is chosen or not at ``target``."""
        op = OpName.of(op)
        target = self.target(target)
        ordered = self.candidates(op, target)
        chosen = self.resolve(op, target, node)
        rows: list[Candidate] = []
        for impl in ordered:
            if impl is chosen:
                rows.append(Candidate(impl, CHOSEN, _why_chosen(impl, ordered, self._preferred.get(op), node)))
            elif impl.conditional if node is None else not impl.accepts(node):
                rows.append(Candidate(impl, CONDITIONAL, _why_not(impl, node)))
            else:
                rows.append(
                    Candidate(impl, OUTRANKED, f"ranked below {_name(chosen, impl)}" if chosen else "not reached")
                )
        for impl in sorted(self._impls.get(op, ()), key=self._key(op)):
            if impl not in ordered:
                rows.append(Candidate(impl, DROPPED, self.unmet(impl, target) or "not eligible"))
        ties = _ties(ordered, complex=chosen is not None and chosen.complex)
        conflicts = ties[1:] if chosen is not None and ties and ties[0] is chosen else ()
        elsewhere = self._elsewhere(op, target, node) if chosen is None else ""
        return Explanation(op, target, tuple(rows), chosen, tuple(conflicts), elsewhere)

    def _elsewhere(self, op: OpName, target: Target, node: Any) -> str:
        """Where ``op`` is served when ``target`` cannot serve it: the target with the domains its best
        impl needs (which an export adds by itself), and the profiles that serve it."""
        parts = []
        widening = self.widen(op, target, node)
        if widening is not None:
            added = ", ".join(f"{d}={v}" for d, v in widening.target.versions if target.get(d) is None)
            how = (
                f"an export adds {added} by itself, the version pack {widening.impl.pack} declares"
                if widening.exact
                else f"pack {widening.impl.pack} declares {', '.join(f'{d}={v}' for d, v in widening.declared)}, "
                "which its impl does not accept: an export refuses it"
            )
            parts.append(f"served at -t {widening.target.spec} by {widening.impl.label} ({how})")
        profiles = [name for name in self._profiles if self.resolve(op, Target.of(name, self.profiles), node)]
        if profiles:
            parts.append(f"served by profile {', '.join(profiles)}")
        return "; ".join(parts)

    def declared_version(self, pack: str, domain: str) -> int | None:
        """The version of custom ``domain`` that ``pack`` declares: the highest its target profiles give
        it, else the highest minimum its impls need (``None`` if it names the domain nowhere)."""
        named = [v[domain] for v, owner in self._profiles.values() if owner == pack and domain in v]
        if named:
            return max(named)
        needed = [r.min for i in self.impls() if i.pack == pack for d, r in i.requirement.domains if d == domain]
        return max(needed, default=None)

    def widen(self, op: Any, target: TargetLike = "onnx", node: Any = None) -> Widening | None:
        """How ``target`` would serve ``op`` when no impl can: the first impl in resolution order that
        needs only custom domains the target does not name (and takes ``node``; without one, an impl
        without a predicate), with those domains added (:class:`Widening`). ``None`` when the target
        serves the op, or no impl is a set of domains away. What an export does when a model uses an
        op only a pack's custom domain covers: the domain joins the target."""
        op = OpName.of(op)
        target = self.target(target)
        if self.resolve(op, target, node) is not None:
            return None
        for impl in sorted(self._impls.get(op, ()), key=self._key(op)):
            absent = {d: r for d, r in impl.requirement.domains if target.get(d) is None}
            if not absent or not (impl.accepts(node) if node is not None else not impl.conditional):
                continue
            declared = {d: self.declared_version(impl.pack, d) or r.min for d, r in absent.items()}
            fitting = {d: v if v in absent[d] else absent[d].min for d, v in declared.items()}
            widened = target.extended(fitting)
            if self.unmet(impl, widened) is None:
                return Widening(op, impl, tuple(sorted(declared.items())), widened)
        return None

    def translation_table(self, target: TargetLike = "onnx") -> Any:
        """This registry as a ``custom_translation_table`` for ``torch.onnx.export(dynamo=True)``.

        Returns an :class:`opreg.table_out.TranslationTable`, a dict ``{torch op
        overload: function}`` holding, for every op this registry resolves at
        ``target`` (without a node), the impl opreg would choose, in a form
        torch.onnx takes (:mod:`opreg.table_out`). Pass
        ``opset_version=table.opset_version`` to ``torch.onnx.export``. What
        torch.onnx cannot take (an impl with a predicate, an op torch has not
        loaded, ...) is left out, listed in ``table.left_out`` and in one
        :class:`opreg.table_out.TranslationTableWarning`.
        """
        from opreg import table_out

        return table_out.build(self, target)

    def conflicts(self, target: TargetLike = "onnx") -> list[Conflict]:
        """Every op whose best unconditional impls tie at ``target``."""
        target = self.target(target)
        found = []
        for op in self.ops():
            for complex in (False, True):
                ties = _ties(self.candidates(op, target), complex=complex)
                if len(ties) > 1:
                    found.append(Conflict(op, target, ties, preferred=op in self._preferred))
        return found


def _ties(ordered: tuple[Impl, ...], *, complex: bool) -> tuple[Impl, ...]:
    """The best impls without a predicate that tie, among those for complex values or the others."""
    unconditional = [i for i in ordered if i.predicate is None and i.complex is complex]
    if not unconditional:
        return ()
    top = unconditional[0].tie_key()
    return tuple(i for i in unconditional if i.tie_key() == top)


def _name(impl: Impl, other: Impl) -> str:
    """``impl``'s label, with its requirement where ``other`` is another version of the same function."""
    return impl.label if impl.label != other.label else f"{impl.label} at {impl.requirement}"


def _why_not(impl: Impl, node: Any) -> str:
    """Why a conditional impl is not chosen for ``node`` (``None``: no node to test it on)."""
    if node is None:
        return "for complex values only; no node to test" if impl.complex else "has a predicate; no node to test it on"
    if has_complex(node) != impl.complex:
        if impl.complex:
            return "for complex values only; the node has none"
        return "the node has complex values (real pairs), which this impl is not registered for (complex=True)"
    return "its predicate rejects the node"


def _why_chosen(impl: Impl, ordered: tuple[Impl, ...], preferred: str | None, node: Any) -> str:
    """Why resolution picks ``impl`` from ``ordered`` (every impl the target can use, in resolution
    order): what sets it above the next impl of its kind, and the impls ranked above it that were
    passed over (each conditional: no node to test it on, or it does not take this node)."""
    index = ordered.index(impl)
    above = ordered[:index]
    below = [i for i in ordered[index + 1 :] if i.complex is impl.complex]
    if impl.override and not (below and below[0].override):
        reason = "registered by the user (overrides packs)"
    elif below:
        reason = _beats(impl, below[0], preferred)
    else:
        reason = "the only impl this target can use" if not above else "the only other impl this target can use"
    if above:
        passed = "; ".join(f"{i.label} ({_why_not(i, node)})" for i in above)
        reason += f"; ranked above it but passed over: {passed}"
    if impl.profiles:
        reason += f"; for profile {', '.join(impl.profiles)}, which this target serves"
    return reason


def _beats(impl: Impl, runner: Impl, preferred: str | None) -> str:
    """The first key of resolution's order (:meth:`Registry._key`) on which ``impl`` goes before ``runner``."""
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
    return f"ties with {_name(runner, impl)}; broken by pack and function name (choose with prefer=)"


# -- building impls -------------------------------------------------------------


def build_impl(
    op: Any,
    function: Any,
    *,
    opset: VersionRangeLike | None,
    domains: Mapping[str, VersionRangeLike] | None,
    priority: int,
    predicate: Predicate | None,
    pack: str,
    override: bool,
    torch_function: bool = False,
    complex: bool = False,
    profiles: Iterable[str] = (),
) -> Impl:
    """Validate and describe one impl; raise :class:`RegistrationError` on any problem.

    ``torch_function``: ``function`` was written for torch.onnx; it is checked
    for what torch.onnx needs of it (see :func:`opreg._inspect.check_signature`)
    and called as torch.onnx calls it. :func:`opreg.table_in.torch_impl` is the
    way in for such functions.
    """
    op = OpName.of(op)
    if not callable(function):
        raise RegistrationError(
            f"impl for {op} from {pack} must be an onnxscript function or callable, got {function!r}"
        )
    kind = _inspect.impl_kind(function)
    _inspect.lint_script_domain(function)
    params = _inspect.read_params(function)
    if params.takes_opset and opset is None:
        raise RegistrationError(
            f"impl {_inspect.display_signature(function)} for {op} takes the opset it is registered at "
            f"(keyword-only parameter {_inspect.OPSET_PARAMETER!r}): declare it, @opreg.impl({str(op)!r}, opset=N)"
        )
    used = _opsets.used_opsets(function)
    requirement = _requirement(op, function, used, opset, domains, versioned=params.takes_opset)

    schema = _inspect.torch_schema(op)
    if schema is not None:
        _inspect.check_signature(op, function, schema, params, torch_function=torch_function)
    elif not (torch_function and kind == _inspect.TRACE):
        _inspect.lint_unannotated_attributes(function, params)

    return Impl(
        op=op,
        function=function,
        requirement=requirement,
        priority=priority,
        predicate=predicate,
        pack=pack,
        override=override,
        complex=bool(complex),
        kind=kind,
        name=impl_name(function),
        schema_checked=schema is not None,
        params=params,
        convention=_inspect.TORCH_ONNX if torch_function else _inspect.OPREG,
        source=_inspect.source_location(function),
        profiles=profile_names(profiles, f"impl {impl_name(function)} for {op}"),
    )


def impl_name(function: Any) -> str:
    """How an impl is named in reports: the script function's or Python function's name."""
    return getattr(function, "name", None) or getattr(function, "__name__", None) or type(function).__name__


def _requirement(
    op: OpName,
    function: Any,
    used: dict[str, set[int | None]],
    opset: VersionRangeLike | None,
    domains: Mapping[str, VersionRangeLike] | None,
    *,
    versioned: bool = False,
) -> OpsetRequirement:
    """The impl's requirement: the declared one, checked against the opsets its code visibly uses.
    A ``versioned`` impl (one body for several opsets, told its own) uses every version's opset
    module; what it emits at each is checked when a model is exported."""

    def name() -> str:  # formatted only for an error message
        return _inspect.display_signature(function)

    modules = _opsets.onnx_module_versions(used)
    if opset is None:
        onnx_range = VersionRange(max(modules) if modules else onnx_opset_range()[0])
    else:
        onnx_range = VersionRange.of(opset)
        newest = max(modules, default=None)
        if newest is not None and newest > onnx_range.min and not versioned:
            raise RegistrationError(
                f"impl {name()} for {op} uses ai.onnx opset {newest} but declares ai.onnx{onnx_range}: "
                f"declare opset={newest} (or more), or use opset{onnx_range.min}'s ops"
            )

    custom_used = {d: v for d, v in used.items() if d != ONNX_DOMAIN}
    for domain, versions in custom_used.items():
        if None in versions:
            raise RegistrationError(
                f"impl {name()} for {op} emits {domain} ops through an Opset with no version: "
                f"give it one, e.g. onnxscript.values.Opset({domain!r}, 1), and declare "
                f"domains={{{domain!r}: 1}}"
            )
    if domains is None:
        declared = {d: VersionRange(max(v)) for d, v in custom_used.items()}  # type: ignore[type-var]
    else:
        declared = {normalize_domain(d): VersionRange.of(v) for d, v in domains.items()}
        for domain, versions in custom_used.items():
            if domain not in declared:
                raise RegistrationError(
                    f"impl {name()} for {op} emits {domain} ops but declares no version for {domain}: "
                    f"add domains={{..., {domain!r}: {max(versions)}}}"  # type: ignore[type-var]
                )
            newest = max(versions)  # type: ignore[type-var]
            if newest > declared[domain].min:
                raise RegistrationError(
                    f"impl {name()} for {op} uses {domain} version {newest} but declares {domain}{declared[domain]}: "
                    f"declare {{{domain!r}: {newest}}}"
                )
    try:
        return OpsetRequirement.build(onnx_range, declared)
    except InvalidTargetError as e:
        raise RegistrationError(f"impl {name()} for {op}: {e}") from e
