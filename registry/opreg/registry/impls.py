"""One registered implementation of a torch op: :class:`Impl`, a value, and :func:`build_impl`, which
validates a function and describes it (its kind, parameters, opset requirement and torch schema check).

The registry (:mod:`opreg.registry.registry`) stores and resolves impls; packs register them through a
:class:`opreg.Registrar`, users through :meth:`opreg.Registry.register`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opreg.errors import InvalidTargetError, RegistrationError
from opreg.registry import _inspect, _opsets
from opreg.registry.marks import profile_names
from opreg.registry.opname import OpName
from opreg.registry.targets import (
    ONNX_DOMAIN,
    OpsetRequirement,
    VersionRange,
    VersionRangeLike,
    normalize_domain,
    onnx_opset_range,
)
from opreg.values import has_complex

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
        """What resolution orders impls by, best first: user override, priority, an impl for
        profiles (``profiles=``, eligible only at targets that serve one) before an impl for every
        target, newest requirement, and a predicate before no predicate. Impls of equal rank tie."""
        onnx_min, n_domains, domain_sum = self.requirement.rank()
        return (
            not self.override, -self.priority, not self.profiles, -onnx_min, -n_domains, -domain_sum,
            self.predicate is None,
        )  # fmt: skip

    def tie_break(self) -> tuple:
        """How a tie is broken when the user has not said which pack they prefer: the core
        pack first, then pack and function name (never registration order)."""
        return (self.pack != CORE_PACK, self.pack, self.name, str(self.requirement))

    def sort_key(self) -> tuple:
        return (*self.rank(), *self.tie_break())

    def tie_key(self) -> tuple:
        return (self.override, self.priority, bool(self.profiles), self.requirement.rank())

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
    for what torch.onnx needs of it (see :func:`opreg.registry._inspect.check_signature`)
    and called as torch.onnx calls it. :func:`opreg.registry.table_in.torch_impl` is the
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
