"""Comparing a value of the ONNX model with eager PyTorch's: the one comparison ``verify``, ``locate``
and the language-model decoder's ``verify`` use."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from opreg.errors import VerificationError

DTYPE_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
"""The least ``(rtol, atol)`` a half-precision value is held to (``torch.testing``'s defaults)."""
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
"""``(rtol, atol)`` by dtype that ``verify`` and ``locate`` hold a value to when the caller gives
none: ``torch.testing.assert_close``'s defaults (``torch.testing._comparison._DTYPE_PRECISIONS``).
Other dtypes (integers, bool, float8) must match exactly."""
REPLAY_TOLERANCES = {
    torch.float16: (4 * 2.0**-10, 1e-5),
    torch.bfloat16: (4 * 2.0**-7, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
"""The least ``(rtol, atol)`` a node's value is held to against its replay: two correct kernels of
one op round differently, so below these a node is not called wrong, whatever tolerance the values
themselves are compared with (``rtol=atol=0`` included). ``torch.testing``'s defaults for float32
and float64; four units in the last place for the half types, whose default (about one unit at the
bottom of a binade, half of one at its top) calls a correct float16 erf or sum off by two wrong."""


@dataclasses.dataclass(frozen=True)
class Error:
    """How one value differs from eager PyTorch.

    Fields:
        ratio: the largest ``|onnx - eager| / (atol + rtol * |eager|)``; above 1 is out
            of tolerance (``inf`` for a wrong shape or dtype, or a NaN eager lacks).
        max_abs / max_rel: the largest absolute and relative differences.
        bad: how many elements are out of tolerance, of ``count``.
        detail: a wrong shape or dtype, in words ("" otherwise).
    """

    ratio: float
    max_abs: float = 0.0
    max_rel: float = 0.0
    bad: int = 0
    count: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def __str__(self) -> str:
        if self.detail:
            return self.detail
        return (
            f"{_times(self.ratio)} the tolerance ({self.bad} of {self.count} elements out; "
            f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g})"
        )


def _times(ratio: float) -> str:
    return "inf x" if math.isinf(ratio) else f"{ratio:.3g} x"


def default_tolerances(dtype: torch.dtype, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """``(rtol, atol)`` for a value of ``dtype``: the ones given, each ``None`` replaced by the dtype's
    default (:data:`DEFAULT_TOLERANCES`; 0 for a dtype compared exactly)."""
    default_rtol, default_atol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
    return default_rtol if rtol is None else rtol, default_atol if atol is None else atol


def tolerances(
    dtype: torch.dtype,
    rtol: float | None,
    atol: float | None,
    floors: Mapping[torch.dtype, tuple[float, float]] = DTYPE_TOLERANCES,
) -> tuple[float, float]:
    rtol, atol = default_tolerances(dtype, rtol, atol)
    low_rtol, low_atol = floors.get(dtype, (0.0, 0.0))
    return max(rtol, low_rtol), max(atol, low_atol)


def compare(
    got: Any,
    expected: Any,
    rtol: float | None,
    atol: float | None,
    floors: Mapping[torch.dtype, tuple[float, float]] = DTYPE_TOLERANCES,
) -> Error:
    """How ``got`` (the ONNX value, as torch) differs from ``expected`` (eager's), in tolerance units
    (a float dtype's tolerances at least its ``floors``; ``None``: the dtype's default)."""
    if not isinstance(expected, torch.Tensor):
        dtype = torch.float64 if isinstance(expected, float) else torch.int64
        rtol, atol = default_tolerances(dtype, rtol, atol)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        same = got == expected or (isinstance(expected, float) and abs(got - expected) <= atol + rtol * abs(expected))
        detail = "" if same else f"{got} != {expected}"
        return Error(0.0 if same else math.inf, count=1, bad=0 if same else 1, detail=detail)
    expected = as_pair(expected.detach())
    if not isinstance(got, torch.Tensor):
        return Error(math.inf, detail=f"got {type(got).__name__}, expected a tensor")
    if tuple(got.shape) != tuple(expected.shape):
        return Error(math.inf, detail=f"shape {tuple(got.shape)} where eager has {tuple(expected.shape)}")
    if got.dtype != expected.dtype:
        return Error(math.inf, detail=f"dtype {got.dtype} where eager has {expected.dtype}")
    count = expected.numel()
    if count == 0:
        return Error(0.0)
    if not expected.dtype.is_floating_point:
        wrong = got != expected
        bad = int(wrong.sum())
        diff = float(bad > 0)
        if expected.dtype != torch.bool:
            diff = float((got.to(torch.float64) - expected.to(torch.float64)).abs().max())
        return Error(math.inf if bad else 0.0, diff, 0.0, bad, count)
    rtol, atol = tolerances(expected.dtype, rtol, atol, floors)
    g, e = got.to(torch.float64), expected.to(torch.float64)
    nan_g, nan_e = torch.isnan(g), torch.isnan(e)
    diff = (g - e).abs()
    diff = torch.where(nan_g & nan_e, torch.zeros_like(diff), diff)
    same_inf = torch.isinf(g) & torch.isinf(e) & (g == e)
    diff = torch.where(same_inf, torch.zeros_like(diff), diff)
    allowed = atol + rtol * e.abs().nan_to_num(posinf=0.0)
    ratios = torch.where(diff == 0, torch.zeros_like(diff), diff / allowed).nan_to_num(nan=math.inf, posinf=math.inf)
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if finite.any() else math.inf
    rel = diff[finite] / e.abs()[finite].clamp_min(1e-12)
    max_rel = float(rel.max()) if rel.numel() else math.inf
    return Error(float(ratios.max()), max_abs, max_rel, int((ratios > 1).sum()), count)


def as_pair(value: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(value.resolve_conj()) if value.is_complex() else value


def worst(errors: Sequence[Error]) -> Error:
    return max(errors, key=lambda e: e.ratio, default=Error(0.0))


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """How one output compares with eager PyTorch.

    Fields:
        name: the ONNX output name.
        max_abs: largest absolute difference.
        max_rel: largest difference relative to the eager value.
        ok: within ``atol + rtol * |eager|`` everywhere, and same shape and dtype.
        detail: what did not match, when not ok.
        rtol / atol: the tolerances it was held to (``None`` when it was not compared by value).
        tolerance: where they came from: ``"float16's default"`` (:data:`DEFAULT_TOLERANCES`),
            ``"given"``, or ``"float16's default rtol, atol given"``; ``"exact"`` for integers.
    """

    name: str
    max_abs: float
    max_rel: float
    ok: bool
    detail: str = ""
    rtol: float | None = None
    atol: float | None = None
    tolerance: str = ""

    def __str__(self) -> str:
        state = "ok" if self.ok else "MISMATCH"
        text = f"{self.name}: {state} (max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}{self._held()})"
        return f"{text}: {self.detail}" if self.detail else text

    def _held(self) -> str:
        """``; rtol=0.001, atol=1e-05, float16's default``: what the output was held to."""
        if self.rtol is None or self.atol is None:
            return ""
        return f"; rtol={self.rtol:g}, atol={self.atol:g}" + (f", {self.tolerance}" if self.tolerance else "")


@dataclasses.dataclass(frozen=True)
class Verification:
    """The result of :meth:`OnnxProgram.verify`: which runtime ran it, and each output."""

    runtime: str
    outputs: tuple[OutputCheck, ...]

    def __iter__(self):
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def __getitem__(self, index: int) -> OutputCheck:
        return self.outputs[index]

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    def tolerances(self) -> str:
        """The tolerances the outputs were held to, each once: ``rtol=0.001, atol=1e-05 (float16's default)``."""
        held = {(o.rtol, o.atol, o.tolerance): None for o in self.outputs if o.rtol is not None and o.atol is not None}
        return "; ".join(f"rtol={r:g}, atol={a:g}" + (f" ({why})" if why else "") for r, a, why in held)

    def __str__(self) -> str:
        lines = "\n".join(f"  {o}" for o in self.outputs)
        return f"{len(self.outputs)} output(s) match eager PyTorch ({self.runtime}, {self.tolerances()}):\n{lines}"


def _held(dtype: torch.dtype, rtol: float | None, atol: float | None) -> tuple[float, float, str]:
    """The tolerances a value of ``dtype`` is held to, and where they came from, in words."""
    name = str(dtype).removeprefix("torch.")
    if dtype not in DEFAULT_TOLERANCES:
        return (rtol or 0.0), (atol or 0.0), "exact" if rtol is None and atol is None else "given"
    given = [n for n, v in (("rtol", rtol), ("atol", atol)) if v is not None]
    why = "given" if len(given) == 2 else f"{name}'s default" + (f", {given[0]} given" if given else "")
    return (*default_tolerances(dtype, rtol, atol), why)


def compare_output(name: str, got: Any, expected: Any, rtol: float | None, atol: float | None) -> OutputCheck:
    """How one output ``got`` compares with the eager value ``expected`` (``rtol``/``atol`` ``None``:
    the dtype's default, :data:`DEFAULT_TOLERANCES`)."""
    if not isinstance(expected, torch.Tensor):
        same = got == expected
        return OutputCheck(name, 0.0, 0.0, bool(same), "" if same else f"{got!r} != {expected!r}")
    expected = expected.detach().cpu()
    rtol, atol, why = _held(expected.dtype, rtol, atol)
    held = {"rtol": rtol, "atol": atol, "tolerance": why}
    if not isinstance(got, torch.Tensor):
        return OutputCheck(name, float("inf"), float("inf"), False, f"got {type(got).__name__}, expected a tensor")
    if tuple(got.shape) != tuple(expected.shape):
        return OutputCheck(
            name, float("inf"), float("inf"), False, f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
        )
    if got.dtype != expected.dtype:
        return OutputCheck(name, float("inf"), float("inf"), False, f"dtype {got.dtype} != {expected.dtype}")
    if got.numel() == 0:
        return OutputCheck(name, 0.0, 0.0, True, **held)
    if expected.dtype == torch.bool or (not expected.dtype.is_floating_point and not expected.is_complex()):
        diff = (got.to(torch.float64) - expected.to(torch.float64)).abs()
        ok = bool(torch.equal(got, expected)) if expected.dtype == torch.bool else bool((diff <= atol).all())
        return OutputCheck(name, float(diff.max()), 0.0, ok, "" if ok else "values differ", **held)
    wide = torch.complex128 if expected.is_complex() else torch.float64  # complex: |got - eager| as torch measures it
    g, e = got.resolve_conj().to(wide), expected.resolve_conj().to(wide)
    close = torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    both = torch.isfinite(g) & torch.isfinite(e)
    diff = (g - e).abs()[both]
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / e.abs()[both].clamp_min(1e-12)).max()) if diff.numel() else 0.0
    ok = bool(close.all())
    detail = "" if ok else _out_of_tolerance(g, e, close)
    return OutputCheck(name, max_abs, max_rel, ok, detail, **held)


def _out_of_tolerance(got: torch.Tensor, expected: torch.Tensor, close: torch.Tensor) -> str:
    """``"3 of 24 elements out of tolerance"``, saying apart the NaN eager has no NaN for (and where)."""
    text = f"{int((~close).sum())} of {close.numel()} elements out of tolerance"
    stray = torch.isnan(got) & ~torch.isnan(expected)
    if not stray.any():
        return text
    where = [tuple(i.tolist()) for i in stray.nonzero()[:3]]
    more = ", ..." if int(stray.sum()) > 3 else ""
    return (
        f"{text}, {int(stray.sum())} of them NaN where eager PyTorch has a number (at "
        f"{', '.join(map(str, where))}{more})"
    )


def mismatch_error(checks: Sequence[OutputCheck], differ: str, after: str = "") -> VerificationError:
    """The error for ``checks`` of which some are not ok: ``"<n> of <m> <differ>:"``, a line per
    mismatch, then ``after``; its ``results`` holds every check."""
    bad = [c for c in checks if not c.ok]
    lines = "\n".join(f"  {c}" for c in bad)
    return VerificationError(f"{len(bad)} of {len(checks)} {differ}:\n{lines}{after}", tuple(checks))
