"""An impl's registration on its ``def``: the :func:`impl` mark, and :func:`marked` to read it back.

A pack marks each impl where it is written::

    @opreg.impl("aten::gelu", opset=20)
    def aten_gelu(self: Tensor, approximate: str = "none"):
        ...

The mark only records an :class:`ImplSpec` on the function; it fills no global
table. A pack's ``opreg_register_ops`` hook hands its modules to
:meth:`opreg.Registrar.register_module` (a hand-built registry to
:meth:`opreg.Registry.register_module`), which registers every marked function.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from opreg.errors import RegistrationError
from opreg.registry.targets import VersionRangeLike

IMPL_ATTRIBUTE = "__opreg_impls__"
"""The attribute :func:`impl` sets on a function: a tuple of :class:`ImplSpec`."""

F = TypeVar("F")


@dataclasses.dataclass(frozen=True, slots=True)
class ImplSpec:
    """What :func:`impl` records on a function: the arguments of one ``register`` call.

    Fields:
        op: the torch op (``"aten::gelu"``, ``"aten::add.Tensor"``, an ``OpOverload``).
        opset: the ai.onnx range the impl needs (``18``, ``(18, 20)``); ``None``: what it visibly uses.
        domains: ``((domain, version), ...)``, each custom domain it emits; ``None``: what it visibly uses.
        priority: ranks impls of one op (higher wins; the core pack's are 0).
        predicate: ``predicate(node) -> bool`` limits the impl to the nodes it accepts.
        complex: the impl serves nodes with complex values (as real pairs) and no others.
        profiles: the target profiles it is for (``("onnxruntime",)``): it applies only at targets
            that offer every custom domain one of them names, at that profile's version; ``()``:
            wherever its requirement is met.
    """

    op: Any
    opset: VersionRangeLike | None = None
    domains: tuple[tuple[str, VersionRangeLike], ...] | None = None
    priority: int = 0
    predicate: Callable[[Any], bool] | None = None
    complex: bool = False
    profiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise RegistrationError(f"@opreg.impl({self.op!r}): priority must be an int, got {self.priority!r}")
        if self.predicate is not None and not callable(self.predicate):
            raise RegistrationError(f"@opreg.impl({self.op!r}): predicate must be callable, got {self.predicate!r}")
        object.__setattr__(self, "profiles", profile_names(self.profiles, f"@opreg.impl({self.op!r})"))

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of the ``register(op, function, ...)`` call this mark stands for."""
        return {
            "opset": self.opset, "domains": None if self.domains is None else dict(self.domains),
            "priority": self.priority, "predicate": self.predicate, "complex": self.complex,
            "profiles": self.profiles,
        }  # fmt: skip


def profile_names(value: Any, where: str) -> tuple[str, ...]:
    """``profiles=`` as a tuple of profile names; a lone string or a name that is not an identifier
    is a :class:`RegistrationError` saying what to write."""
    if isinstance(value, str):
        raise RegistrationError(f"{where}: profiles= takes a tuple of profile names, got {value!r}: write ({value!r},)")
    try:
        names = tuple(value)
    except TypeError as e:
        raise RegistrationError(f"{where}: profiles= takes a tuple of profile names, got {value!r}") from e
    bad = [repr(n) for n in names if not isinstance(n, str) or not n.isidentifier()]
    if bad:
        raise RegistrationError(
            f"{where}: profiles= takes target profile names such as 'onnxruntime', got {', '.join(bad)}"
        )
    return tuple(dict.fromkeys(names))


def impl(
    op: Any,
    *,
    opset: VersionRangeLike | None = None,
    domains: Mapping[str, VersionRangeLike] | None = None,
    priority: int = 0,
    predicate: Callable[[Any], bool] | None = None,
    complex: bool = False,
    profiles: Iterable[str] = (),
) -> Callable[[F], F]:
    """Mark a function as the impl of torch op ``op``; arguments as :meth:`Registrar.register` takes them.

    Metadata only: the function is returned unchanged but for an attribute
    (:data:`IMPL_ATTRIBUTE`), and nothing is registered until the pack's
    ``opreg_register_ops`` hands the module to :meth:`opreg.Registrar.register_module`.
    Stack it to register one function for several ops (or complex and real
    values); stacked marks register top to bottom. Put it above
    ``@onnxscript.script()`` (it marks the script function).

    All versions of an op from one body: stack one mark per opset and give the
    trace-only function a keyword-only parameter ``opset``; each registration
    is an impl of its own (its own requirement, priority and predicate), and
    the exporter passes the ai.onnx version it was registered at::

        @opreg.impl("aten::gelu", opset=18)
        @opreg.impl("aten::gelu", opset=20)
        def aten_gelu(self: Tensor, approximate: str = "none", *, opset: int):
            if opset >= 20:
                return op20.Gelu(self, approximate=approximate)
            ...  # the decomposition, in opset 18's ops
    """
    spec = ImplSpec(
        op, opset=opset, domains=None if domains is None else tuple(domains.items()),
        priority=priority, predicate=predicate, complex=complex, profiles=profiles,
    )  # fmt: skip

    def mark(function: F) -> F:
        setattr(function, IMPL_ATTRIBUTE, (spec, *_specs(function)))  # applied bottom-up: keep reading order
        return function

    return mark


def _specs(function: Any) -> tuple[ImplSpec, ...]:
    specs = getattr(function, IMPL_ATTRIBUTE, None)
    if specs is None and callable(getattr(function, "function", None)):  # a script function marked inside
        specs = getattr(function.function, IMPL_ATTRIBUTE, None)
    return tuple(specs or ())


def _defined_in(function: Any, module: types.ModuleType) -> bool:
    inner = getattr(function, "function", function)  # onnxscript.OnnxFunction wraps the Python function
    return getattr(inner, "__module__", None) == module.__name__


def marked(*modules: types.ModuleType) -> Iterator[tuple[Any, ImplSpec]]:
    """``(function, spec)`` for every function defined in ``modules`` and marked with :func:`impl`,
    in definition order (a function's stacked marks top to bottom). A marked function a module
    imports from another is left to that module."""
    for module in modules:
        for function in list(vars(module).values()):
            specs = _specs(function)
            if specs and _defined_in(function, module):
                for spec in specs:
                    yield function, spec
