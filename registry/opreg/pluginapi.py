"""The plugin API's value types, on the ground floor: what hooks return and what reports say.

A pack builds :class:`Sample` s and :class:`ModelSample` s in its
``opreg_samples``, ``opreg_rewrite_samples`` and ``opreg_capture_samples``
hooks, and :class:`CapturePatch` es in ``opreg_capture_patches``; opreg
reports what a capture did with each patch in a :class:`PatchOutcome`, and
describes what
happened to a pack with a :class:`PackReport` (its impls refused with a
:class:`Rejection`) and a hook that broke its contract with a
:class:`HookError`. These are plain values: this module imports nothing but
the standard library and :mod:`opreg.errors` (torch and packaging only inside
the functions that need them), so the hookspecs, the registry, the loader, the exporter and the
conformance kit all import them from here without importing each other. They
are re-exported where they used to live (``opreg.testing``, ``opreg``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opreg.errors import InvalidArgumentError, PluginError

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
        schemas: the custom-domain ops it registers ONNX schemas for (``opreg_schemas``), as
            ``domain::Name``, sorted: what its impls, and other packs' impls, may call by name.
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
    schemas: tuple[str, ...] = ()

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


class ReportSequence:
    """The :class:`PackReport` s an object holds as ``reports``, in load order, read as a sequence
    (iterate, ``len``, index) and by name (:meth:`report`): what :class:`PackReports` and
    :class:`opreg.PackSet` (which holds a :class:`PackReports`) share."""

    __slots__ = ()
    reports: Sequence[PackReport]

    def __iter__(self) -> Iterator[PackReport]:
        return iter(self.reports)

    def __len__(self) -> int:
        return len(self.reports)

    def __getitem__(self, index: int) -> PackReport:
        return self.reports[index]

    def report(self, name: str) -> PackReport:
        """The report of pack ``name``; ``KeyError`` if no such pack was discovered."""
        for report in self.reports:
            if report.name == name:
                return report
        raise KeyError(name)


@dataclasses.dataclass(frozen=True, slots=True)
class PackReports(ReportSequence):
    """What happened to every discovered pack, in load order: a value (iterate it), what
    :attr:`opreg.Registry.packs` and :attr:`opreg.PackSet.reports` give.

    Fields:
        reports: each pack's :class:`PackReport`.
        selection: the selection they answer, ``(plugins, exclude, strict)`` as
            :func:`opreg.packs.plugins.load` takes it (``None``: no packs were loaded, a registry built by
            hand); :func:`opreg.packs.plugins.host_of` finds the host of the same packs by it.
    """

    reports: tuple[PackReport, ...] = ()
    selection: tuple[frozenset[str] | None, frozenset[str], bool] | None = None

    @property
    def loaded(self) -> tuple[str, ...]:
        """Names of the packs that loaded, in load order."""
        return tuple(r.name for r in self.reports if r.status == LOADED)


class HookError(PluginError):
    """A pack's hook raised, or returned something else than its contract says
    (:data:`opreg.packs.hookspecs.CONTRACTS`). The loader, the exporter and the conformance kit
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


# -- capture patches: what opreg_capture_patches hands over, and what happened to each -------------------

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclasses.dataclass(frozen=True)
class CapturePatch:
    """One export-friendly replacement a pack offers for capture (``opreg_capture_patches``).

    Fields:
        name: unique within the pack; users name it ``pack:name`` (``torchvision:batched_nms``).
        module: the module that holds what is patched (``"torchvision.ops.boxes"``).
        function: its attribute path in ``module``: a function (``"batched_nms"``) or a
            method (``"BoxCoder.decode"``).
        versions: the library versions it was written for, as a requirement on a distribution
            (``"torchvision>=0.17,<0.29"``); elsewhere it is not installed (``incompatible``).
        replacement: the function installed in place of ``module.function`` while capturing; it
            takes the same arguments and must give the same results in eager mode (the
            conformance kit compares). A module-level function is also replaced in every
            loaded module that imported it by name.
        wraps_original: ``replacement`` receives the original function as its first argument
            (before ``self`` for a method), e.g. to fall back to it.
        context: instead of ``replacement``, a callable returning a context manager that
            installs the patch itself on entry and reverts it on exit (for what is not an
            attribute, such as a fake kernel registered with ``torch.library``).
        used_by: module prefixes: the patch is installed for models holding a submodule whose
            class is defined under one of them (default: ``module``'s top-level package), and for
            models whose ``forward`` names the patched function.
        reason: one line: what in the original fights ``torch.export`` and what the patch does
            instead (shown by ``opreg explain``).
    """

    name: str
    module: str
    function: str
    versions: str
    replacement: Callable[..., Any] | None = None
    wraps_original: bool = False
    context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    used_by: tuple[str, ...] = ()
    reason: str = ""

    def __post_init__(self) -> None:
        where = f"CapturePatch {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidArgumentError(f"{where}: name must be an identifier-like string (no ':'), got {self.name!r}")
        for field in ("module", "function"):
            value = getattr(self, field)
            if not isinstance(value, str) or not _DOTTED.match(value):
                raise InvalidArgumentError(f"{where}: {field} must be a dotted name, got {value!r}")
        if (self.replacement is None) == (self.context is None):
            raise InvalidArgumentError(f"{where}: give exactly one of replacement= and context=")
        for field in ("replacement", "context"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise InvalidArgumentError(f"{where}: {field} must be callable, got {type(value).__name__}")
        if isinstance(self.used_by, str) or not all(isinstance(p, str) and p for p in self.used_by):
            raise InvalidArgumentError(f"{where}: used_by must be a tuple of module prefixes, got {self.used_by!r}")
        requirement(self)  # a versions string packaging cannot read is the pack's mistake: say so now

    @property
    def target(self) -> str:
        """What it patches, as one dotted path (``torchvision.ops.boxes.batched_nms``)."""
        return f"{self.module}.{self.function}"

    @property
    def scope(self) -> tuple[str, ...]:
        """The module prefixes whose classes make a model use the patched code."""
        return self.used_by or (self.module.split(".", 1)[0],)


def requirement(patch: CapturePatch) -> Any:
    """``patch.versions`` as a ``packaging.requirements.Requirement``."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(patch.versions)
    except (InvalidRequirement, TypeError) as e:
        raise InvalidArgumentError(
            f"CapturePatch {patch.name!r}: versions must name the distribution it patches and the versions it "
            f"was written for, e.g. 'torchvision>=0.17,<0.29'; got {patch.versions!r} ({e})"
        ) from e


def installed_version(patch: CapturePatch) -> tuple[str | None, bool]:
    """``(installed version or None, whether ``patch.versions`` admits it)``."""
    from packaging.version import InvalidVersion, Version

    wanted = requirement(patch)
    try:
        version = importlib.metadata.version(wanted.name)
    except importlib.metadata.PackageNotFoundError:
        return None, False
    try:
        public = Version(version).public
    except InvalidVersion:
        return version, False
    return version, wanted.specifier.contains(public, prereleases=True)


def foreign_versions(patch: CapturePatch) -> str | None:
    """Why ``patch.versions`` does not say which versions of the patched code it fits: it names a
    distribution other than the one that installed ``patch.module``; ``None`` when it names that
    one, or when no installed distribution is known to own the module (a module on ``sys.path``
    without a record)."""
    from packaging.utils import canonicalize_name

    top = patch.module.split(".", 1)[0]
    named = requirement(patch).name
    try:
        distribution = importlib.metadata.distribution(named)
    except importlib.metadata.PackageNotFoundError:
        return None
    if _provides(distribution, top):
        return None
    owners = importlib.metadata.packages_distributions().get(top) or []
    if not owners or canonicalize_name(named) in {canonicalize_name(o) for o in owners}:
        return None
    return (
        f"versions={patch.versions!r} names the distribution {named!r}, but {patch.module} is installed by "
        f"{', '.join(sorted(set(owners)))}: a patch's versions are those of the code it patches (e.g. "
        f"'{sorted(owners)[0]}>=...'); the patch is not installed"
    )


def _provides(distribution: importlib.metadata.Distribution, top: str) -> bool:
    """Whether ``distribution``'s record says it installed the top-level module or package ``top``."""
    listed = distribution.read_text("top_level.txt")
    if listed:
        return top in listed.split()
    return any(f.parts and f.parts[0].removesuffix(".py") == top for f in distribution.files or ())


@dataclasses.dataclass(frozen=True, slots=True)
class PatchOutcome:
    """What happened to one offered patch in one capture.

    Fields:
        pack: the pack that offers it.
        name: the patch's name (``label`` is ``pack:name``).
        target: what it patches (``module.function``).
        versions: the library versions it was written for.
        status: one of :data:`STATUSES`.
        detail: why (the error of a failed patch, the version found, ...).
        installed: the installed version of the patched library (``""`` if unknown).
        calls: how often the capture called it (``None`` for a ``context`` patch).
    """

    pack: str
    name: str
    target: str
    versions: str
    status: str
    detail: str = ""
    installed: str = ""
    calls: int | None = None

    @property
    def label(self) -> str:
        return f"{self.pack}:{self.name}"

    def record(self) -> dict[str, Any]:
        """The entry of an applied patch in the model's :data:`METADATA_KEY` metadata."""
        entry: dict[str, Any] = {"patch": self.label, "patches": self.target, "versions": self.versions}
        entry["installed"] = self.installed
        if self.calls is not None:
            entry["calls"] = self.calls
        return entry

    def __str__(self) -> str:
        return f"{self.label} ({self.target}): {self.status}" + (f": {self.detail}" if self.detail else "")


__all__ = [
    "CapturePatch",
    "PatchOutcome",
    "foreign_versions",
    "installed_version",
    "requirement",
    "DISABLED",
    "FAILED",
    "INCOMPATIBLE",
    "LOADED",
    "STATUSES",
    "HookError",
    "ModelSample",
    "PackReport",
    "PackReports",
    "ReportSequence",
    "Rejection",
    "Sample",
    "describe",
]
