"""The plugin API's value types, on the ground floor: what hooks return and what reports say.

A pack builds :class:`Sample` s and :class:`ModelSample` s in its
``opreg_samples`` and ``opreg_rewrite_samples`` hooks; opreg describes what
happened to a pack with a :class:`PackReport` (its impls refused with a
:class:`Rejection`) and a hook that broke its contract with a
:class:`HookError`. These are plain values: this module imports nothing but
the standard library and :mod:`opreg.errors` (torch only inside the methods
that need it), so the hookspecs, the registry, the loader, the exporter and the
conformance kit all import them from here without importing each other. They
are re-exported where they used to live (``opreg.testing``, ``opreg``).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any

from opreg.errors import PluginError

# -- what a pack's hooks hand over --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    """One call of an op: ``fn(*args, **kwargs)``.

    Fields:
        args, kwargs: the arguments; tensors anywhere in them (also in lists)
            become the model's inputs, everything else is baked in.
        label: how the sample is named in reports (shapes and scalars).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    label: str = ""

    @classmethod
    def of(cls, *args: Any, **kwargs: Any) -> Sample:
        return cls(args, kwargs, describe(args, kwargs))

    def copy(self) -> Sample:
        """A deep copy (tensors, lists and dicts copied; tensors shared within the sample stay shared),
        so running an op that mutates its arguments on the copy leaves this sample untouched."""
        args, kwargs = copy.deepcopy((self.args, self.kwargs))
        return Sample(args, kwargs, self.label)


@dataclasses.dataclass(frozen=True)
class ModelSample:
    """A small model holding a pattern, and its inputs: what the conformance kit exports
    to see one of a pack's rewrite rules fire (``opreg_rewrite_samples``).

    Fields:
        module: the model (put in ``eval()`` mode by the kit).
        args, kwargs: its inputs, as ``module(*args, **kwargs)`` takes them.
        label: how the sample is named in reports (default: the module's class and the inputs).
        rtol, atol: tolerances for comparing with eager PyTorch (default:
            :data:`opreg.testing.TOLERANCES` by the inputs' floating dtype); a fused kernel
            may sum in another order.
    """

    module: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    label: str = ""
    rtol: float | None = None
    atol: float | None = None

    def __post_init__(self) -> None:
        import torch

        if not isinstance(self.module, torch.nn.Module):
            raise TypeError(f"ModelSample.module must be a torch.nn.Module, got {type(self.module).__name__}")

    @classmethod
    def of(cls, module: Any, *args: Any, **kwargs: Any) -> ModelSample:
        """``module`` called with ``args`` and ``kwargs``, labelled by class and inputs."""
        return cls(module, args, kwargs, f"{type(module).__name__}({describe(args, kwargs)})")

    def tolerances(self) -> tuple[float, float]:
        """``(rtol, atol)``: the given ones, else :data:`opreg.testing.TOLERANCES` of the inputs' floating dtype."""
        import torch

        tensors = [t for t in torch.utils._pytree.tree_leaves((self.args, self.kwargs)) if isinstance(t, torch.Tensor)]
        floating = [str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()]
        rtol, atol = TOLERANCES.get(floating[0] if floating else "float32", (1e-5, 1e-5))
        return (rtol if self.rtol is None else self.rtol, atol if self.atol is None else self.atol)

    def with_tolerances(self, rtol: float, atol: float) -> ModelSample:
        """This sample compared within ``rtol``/``atol``."""
        return dataclasses.replace(self, rtol=rtol, atol=atol)


TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1e-5),
    "float16": (5e-3, 5e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "float64": (1e-7, 1e-7),
}
"""Default ``(rtol, atol)`` by the name of a sample's floating dtype (``opreg.testing.TOLERANCES`` has
them by torch dtype); integer and bool results must be exact. float32: torch's own ``assert_close``
atol, a looser rtol for different summation orders; float16: about five float16 ulps, since ONNX
Runtime often computes float16 ops in float32 and rounds once where torch's CPU kernels round each step."""


def describe(args: Any, kwargs: Any = None) -> str:
    """A short label for arguments: tensors as ``f32[2,3]``, the rest as repr."""

    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported

    def one(value: Any) -> str:
        if torch is not None and isinstance(value, torch.Tensor):
            dtype = str(value.dtype).replace("torch.", "")
            return f"{dtype}[{','.join(map(str, value.shape))}]"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(one(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in (kwargs or {}).items()]
    return ", ".join(parts)


# -- what opreg says about a pack ---------------------------------------------------------------

LOADED = "loaded"
FAILED = "failed"
DISABLED = "disabled"
INCOMPATIBLE = "incompatible"
STATUSES = (LOADED, FAILED, INCOMPATIBLE, DISABLED)


@dataclasses.dataclass(frozen=True, slots=True)
class Rejection:
    """An impl a pack tried to register and opreg refused.

    Fields:
        op: the torch op, as the pack wrote it.
        function: the impl's name.
        error: why it was refused (the exception's type and message).
    """

    op: str
    function: str
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class PackReport:
    """What happened to one discovered pack.

    Fields:
        name: the entry-point name (what ``-p NAME`` takes).
        distribution: the distribution that declares it.
        version: that distribution's version.
        value: the entry point's target (``module`` or ``module:attr``).
        status: ``loaded``, ``failed``, ``incompatible`` or ``disabled``.
        reason: why it is not loaded (or what went partly wrong), else ``""``.
        hook: the hook that failed, if one did.
        impls: how many impls it registered.
        domains: the ONNX domains its impls emit.
        profiles: the target profiles it contributes.
        rejected: impls opreg refused.
        seconds: how long importing its entry point took.
        hooks: the hooks it implements, sorted (``()`` unless it loaded).
    """

    name: str
    distribution: str
    version: str
    value: str
    status: str
    reason: str = ""
    hook: str | None = None
    impls: int = 0
    domains: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    seconds: float = 0.0
    hooks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"pack status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status in (LOADED, DISABLED) and not self.rejected

    def describe(self) -> str:
        where = f"pack {self.name!r} ({self.distribution} {self.version})"
        hook = f" in hook {self.hook}" if self.hook else ""
        return f"{where} {self.status}{hook}: {self.reason}" if self.reason else f"{where} {self.status}"


class HookError(PluginError):
    """A pack's hook raised, or returned something else than its contract says
    (:data:`opreg.hookspecs.CONTRACTS`). The loader, the exporter and the conformance kit
    word it the same way: ``pack 'NAME' failed in hook HOOK: PROBLEM``.

    Attributes:
        pack: the pack's name.
        hook: the hook's name.
        problem: what is wrong (``raised ValueError: ...``, ``must return ..., got ...``).
    """

    def __init__(self, pack: str, hook: str, problem: str) -> None:
        self.pack, self.hook, self.problem = pack, hook, problem
        super().__init__(f"pack {pack!r} failed in hook {hook}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.pack, self.hook, self.problem))


__all__ = [
    "DISABLED",
    "FAILED",
    "INCOMPATIBLE",
    "LOADED",
    "STATUSES",
    "HookError",
    "ModelSample",
    "PackReport",
    "Rejection",
    "Sample",
    "describe",
]
