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
import types
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opreg.errors import (
    FrozenRegistryError,
    InvalidArgumentError,
    InvalidTargetError,
    NoImplementationError,
    RegistrationError,
)
from opreg.pluginapi import PackReports
from opreg.registry.explanation import (
    CHOSEN,
    CONDITIONAL,
    DROPPED,
    OUTRANKED,
    Candidate,
    Conflict,
    Explanation,
    Widening,
    label_beside,
    tied,
    why_chosen,
    why_not,
)
from opreg.registry.impls import CORE_PACK, USER_PACK, Impl, Predicate, build_impl, impl_name
from opreg.registry.marks import marked
from opreg.registry.opname import OpName
from opreg.registry.targets import BUILTIN_PROFILES, ONNX_DOMAIN, Target, TargetLike, VersionRangeLike

if TYPE_CHECKING:
    from opreg.pluginapi import CapturePatch

logger = logging.getLogger(__name__)

__all__ = [
    "CORE_PACK", "USER_PACK", "Candidate", "Conflict", "Explanation", "Impl", "Predicate", "Registry",
    "RegistryData", "Widening", "build_impl", "impl_name",
]  # fmt: skip
"""Impls and explanations are defined in :mod:`.impls` and :mod:`.explanation`, and read from here too."""


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


@dataclasses.dataclass(slots=True)
class _Memo:
    """What resolution remembers of one registry: its answers, never part of its value."""

    ordered: dict[tuple[OpName, Target], tuple[Impl, ...]] = dataclasses.field(default_factory=dict)
    targets: dict[Any, Target] = dataclasses.field(default_factory=dict)


_MEMOS: dict[int, _Memo] = {}
"""Resolution's memo of each live registry, by ``id``: per ``(op, target)`` the eligible impls in
order, and parsed targets. Kept here, not on the registry, so a frozen registry's state never
changes; dropped when its registry is collected (or changed, while it is unfrozen)."""


class Registry:
    """Torch op -> impls, with profiles and resolution for targets.

    :func:`opreg.default_registry` gives the registry built from the installed
    packs (:meth:`build`): shared and frozen, a value. :meth:`copy` it to
    extend it, or start from ``Registry()``; :meth:`register`,
    :meth:`add_profile`, :meth:`mark_unsupported`, :meth:`prefer` and
    :meth:`add_capture_patch` change an unfrozen registry.

    A frozen registry is a value: equal to (and hashing as) any registry holding the same
    :meth:`data`, taken when it is frozen, and nothing of it changes after (setting an attribute
    raises :class:`opreg.FrozenRegistryError`). The packs' code is not part of it: their hooks are
    called through the :class:`opreg.packs.host.PackHost` built beside it (:func:`opreg.packs.plugins.load`,
    :func:`opreg.default_host`), which an export takes as ``host=``. (Resolution remembers its
    answers per op and target in a memo of this module, never in the registry.)
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
        self._patches: dict[str, CapturePatch] = {}
        self._packs = PackReports()
        self._data: RegistryData | None = None  # what a frozen registry holds, its value
        self._hash = 0
        weakref.finalize(self, _MEMOS.pop, id(self), None)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise FrozenRegistryError(f"a frozen opreg.Registry is a value: {name!r} cannot be set (copy() it)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)  # raises on a frozen registry
        object.__delattr__(self, name)

    def _memo(self) -> _Memo:
        memo = _MEMOS.get(id(self))
        if memo is None:
            memo = _MEMOS[id(self)] = _Memo()
        return memo

    @classmethod
    def build(
        cls,
        impls: Iterable[Impl] = (),
        *,
        profiles: Iterable[tuple[str, Mapping[str, int], str]] = (),
        unsupported: Iterable[tuple[Any, str, str]] = (),
        preferences: Mapping[Any, str] | None = None,
        packs: PackReports | None = None,
    ) -> Registry:
        """A frozen registry of ``impls`` (in this order) and the named ``profiles``
        (``(name, {domain: version}, pack)``), the ops declared ``unsupported``
        (``(op, pack, reason)``), tie ``preferences`` (op -> pack, see
        :meth:`prefer`), and the reports of the ``packs`` they came from (:attr:`packs`).
        A profile name given twice is an :class:`InvalidTargetError`."""
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
            registry._packs = packs
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
        """Add impls already built (:func:`build_impl`, :func:`opreg.registry.table_in.torch_impl`), under
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
        _MEMOS.pop(id(self), None)  # impls for this profile may apply now

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
        _MEMOS.pop(id(self), None)

    def add_capture_patch(self, patch: CapturePatch) -> CapturePatch:
        """Add a capture patch of your own (``user:name``), installed for the captures this registry exports
        as the packs' ``opreg_capture_patches`` are (see :mod:`opreg.packs.patching`). A name already added is an
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
        _MEMOS.pop(id(self), None)
        return impl

    def _check_mutable(self) -> None:
        if self._frozen:
            raise FrozenRegistryError(
                "this registry is shared (built from the installed packs and cached): call .copy() and extend the copy"
            )

    def freeze(self) -> Registry:
        """Refuse further changes; returns ``self``, now a value (hashable, see :meth:`data`)."""
        if not self._frozen:
            data = self._collect()
            frozen = {
                "_impls": types.MappingProxyType({op: tuple(impls) for op, impls in self._impls.items()}),
                "_order": types.MappingProxyType(self._order),
                "_unsupported": types.MappingProxyType(self._unsupported),
                "_profiles": types.MappingProxyType(self._profiles),
                "_preferred": types.MappingProxyType(self._preferred),
                "_patches": types.MappingProxyType(self._patches),
                "_data": data,
                "_hash": hash(data),
                "_frozen": True,
            }
            for name, value in frozen.items():
                object.__setattr__(self, name, value)
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
        new._packs = self._packs
        return new

    @property
    def packs(self) -> PackReports:
        """What happened to every pack discovered when this registry was built (iterate it; ``report(name)``,
        ``loaded``): data, as the packs declared it (their hooks are the host's)."""
        return self._packs

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
        memo = _MEMOS.get(id(self)) or self._memo()
        if key is not None and key in memo.targets:
            return memo.targets[key]
        try:
            target = Target.of(spec, self.profiles)
        except InvalidTargetError as e:
            raise InvalidTargetError(f"{e}{self._failed_packs_hint()}") from e
        self._check_served(target)
        if key is not None:
            memo.targets[key] = target
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
        failed = [r for r in self._packs if r.status in ("failed", "incompatible")]
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
        packs (or a registry and its copy) give equal data; the packs' reports and host are not part of it."""
        return self._data if self._data is not None else self._collect()

    def _collect(self) -> RegistryData:
        return RegistryData(
            impls=self.impls(),
            profiles=tuple(
                (name, tuple(sorted(versions.items())), pack) for name, (versions, pack) in self._profiles.items()
            ),
            unsupported=tuple((op, pack, reason) for op, (pack, reason) in self._unsupported.items()),
            preferences=tuple(self._preferred.items()),
            capture_patches=self.capture_patches(),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Registry):
            return NotImplemented
        return self is other or self.data() == other.data()

    def __hash__(self) -> int:
        if self._data is None:
            raise TypeError("an unfrozen opreg.Registry is not hashable: freeze() it first")
        return self._hash

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
        memo = _MEMOS.get(id(self)) or self._memo()
        ordered = memo.ordered.get(key)
        if ordered is None:
            eligible = [i for i in self._impls.get(op, ()) if self.unmet(i, target) is None]
            ordered = tuple(sorted(eligible, key=self._key(op)))
            memo.ordered[key] = ordered
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
                rows.append(Candidate(impl, CHOSEN, why_chosen(impl, ordered, self._preferred.get(op), node)))
            elif impl.conditional if node is None else not impl.accepts(node):
                rows.append(Candidate(impl, CONDITIONAL, why_not(impl, node)))
            else:
                rows.append(
                    Candidate(
                        impl, OUTRANKED, f"ranked below {label_beside(chosen, impl)}" if chosen else "not reached"
                    )
                )
        for impl in sorted(self._impls.get(op, ()), key=self._key(op)):
            if impl not in ordered:
                rows.append(Candidate(impl, DROPPED, self.unmet(impl, target) or "not eligible"))
        ties = tied(ordered, complex=chosen is not None and chosen.complex)
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

        Returns an :class:`opreg.registry.table_out.TranslationTable`, a dict ``{torch op
        overload: function}`` holding, for every op this registry resolves at
        ``target`` (without a node), the impl opreg would choose, in a form
        torch.onnx takes (:mod:`opreg.registry.table_out`). Pass
        ``opset_version=table.opset_version`` to ``torch.onnx.export``. What
        torch.onnx cannot take (an impl with a predicate, an op torch has not
        loaded, ...) is left out, listed in ``table.left_out`` and in one
        :class:`opreg.registry.table_out.TranslationTableWarning`.
        """
        from opreg.registry import table_out

        return table_out.build(self, target)

    def conflicts(self, target: TargetLike = "onnx") -> list[Conflict]:
        """Every op whose best unconditional impls tie at ``target``."""
        target = self.target(target)
        found = []
        for op in self.ops():
            for complex in (False, True):
                ties = tied(self.candidates(op, target), complex=complex)
                if len(ties) > 1:
                    found.append(Conflict(op, target, ties, preferred=op in self._preferred))
        return found
