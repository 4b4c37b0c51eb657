"""The registry: torch op -> candidate impls, a value once frozen, and how it is built and changed.

Which impl a target gets is :mod:`opreg.registry.resolution`'s (the rules, the ties, the memo of
answers); why, and how a target that cannot serve an op would, is :mod:`opreg.registry.explanation`'s.
:class:`Registry` holds the data and asks them.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opreg.errors import (
    FrozenRegistryError,
    InvalidArgumentError,
    InvalidTargetError,
    NoImplementationError,
    RegistrationError,
)
from opreg.pluginapi import PackReports
from opreg.registry import explanation, reach, resolution
from opreg.registry.explanation import Conflict, Explanation, Widening
from opreg.registry.impls import USER_PACK, Impl, Predicate, build_impl
from opreg.registry.marks import marked
from opreg.registry.opname import OpName
from opreg.registry.targets import BUILTIN_PROFILES, MIN_ONNX_OPSET, ONNX_DOMAIN, Target, TargetLike, VersionRangeLike

if TYPE_CHECKING:
    from opreg.pluginapi import CapturePatch

logger = logging.getLogger(__name__)


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

    A frozen registry is a value: equal to (and hashing as) any registry holding the same
    :meth:`data`, taken when it is frozen, and nothing of it changes after (setting an attribute
    raises :class:`opreg.FrozenRegistryError`). The packs' code is not part of it: their hooks are
    called through the :class:`opreg.packs.host.PackHost` built beside it (:func:`opreg.packs.plugins.load`,
    :func:`opreg.default_host`), which an export takes as ``host=``. (Resolution remembers its
    answers per op and target in a memo of :mod:`opreg.registry.resolution`, never in the registry.)
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
        resolution.track(self)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise FrozenRegistryError(f"a frozen opreg.Registry is a value: {name!r} cannot be set (copy() it)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)  # raises on a frozen registry
        object.__delattr__(self, name)

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
        resolution.forget(self)  # impls for this profile may apply now

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
        resolution.forget(self)

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
        resolution.forget(self)
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
        memo = resolution.memo(self)
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

    # -- resolving (opreg.registry.resolution, opreg.registry.explanation) -----------

    def unmet(self, impl: Impl, target: TargetLike = "onnx") -> str | None:
        """Why ``target`` cannot use ``impl``, or ``None`` if it can: its opset requirement
        (:meth:`opreg.Target.unmet`), then its profiles (:func:`opreg.registry.resolution.unmet`).
        At a target below :data:`opreg.registry.targets.MIN_ONNX_OPSET` (16, 17), an impl of opset 18
        or older that reaches the target's (:mod:`opreg.registry.reach`) is judged as at its own opset:
        the model takes what opset 18 would, where it can."""
        target = self.target(target)
        own = impl.requirement.onnx.min
        if own <= MIN_ONNX_OPSET and target.onnx < own:
            found = reach.reach(impl)
            if found.lowest > target.onnx:
                needs = f" (its {', '.join(found.set_by)})" if found.set_by else ""
                return f"needs ai.onnx{impl.requirement.onnx}{needs}, target has {target.onnx}"
            target = dataclasses.replace(target, versions=tuple((d, own if d == "" else v) for d, v in target.versions))
        return resolution.unmet(impl, target, self._profiles)

    def ranked(self, op: Any) -> tuple[Impl, ...]:
        """Every impl of ``op`` in resolution order, whether a target can use it or not."""
        op = OpName.of(op)
        return tuple(sorted(self._impls.get(op, ()), key=resolution.ranking(self._preferred.get(op), self._order)))

    def candidates(self, op: Any, target: TargetLike = "onnx") -> tuple[Impl, ...]:
        """Impls of ``op`` that ``target`` can use (:meth:`unmet`), best first (predicates not evaluated)."""
        op = OpName.of(op)
        target = self.target(target)
        key = (op, target)
        memo = resolution.memo(self)
        ordered = memo.ordered.get(key)
        if ordered is None:
            ordered = memo.ordered[key] = tuple(i for i in self.ranked(op) if self.unmet(i, target) is None)
        return ordered

    def resolve(self, op: Any, target: TargetLike = "onnx", node: Any = None) -> Impl | None:
        """The impl used for ``op`` (and ``node``, if given) at ``target``, or ``None``.

        Without a node, conditional impls (a predicate, or complex values only)
        cannot be shown to apply and are passed over.
        """
        return resolution.first(self.candidates(op, target), node)

    def get(self, op: Any, target: TargetLike = "onnx", node: Any = None) -> Impl:
        """Like :meth:`resolve`, but raise :class:`NoImplementationError` saying why."""
        impl = self.resolve(op, target, node)
        if impl is None:
            raise NoImplementationError(str(self.explain(op, target, node)))
        return impl

    def explain(self, op: Any, target: TargetLike = "onnx", node: Any = None) -> Explanation:
        """Every impl of ``op`` with the reason it is chosen or not at ``target``."""
        return explanation.explain(self, OpName.of(op), self.target(target), node)

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
        return explanation.widen(self, OpName.of(op), self.target(target), node)

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
        return [Conflict(op, target, ties, preferred=p) for op, ties, p in resolution.conflicts(self, target)]
