"""What the conformance kit reports: a :class:`CheckResult` row per thing checked, gathered in one
:class:`PackCheck` per pack, and the names of the checks (:mod:`opreg.testing._kit` runs them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from opreg.testing._samples import FAILED, PASSED, SKIPPED

LOAD = "load"
IMPORT = "import"
HOOKS = "hooks"
CONFLICTS = "conflicts"
KERNELS = "kernels"
SAMPLES = "samples"
REWRITES = "rewrites"
PATCHES = "patches"
CHECKS = (LOAD, IMPORT, HOOKS, CONFLICTS, KERNELS, SAMPLES, REWRITES, PATCHES)
"""The checks, in the order they run and are reported."""
REWRITE_SUBJECT = "rewrite "
"""How a rewrite rule is named among the :attr:`PackCheck.unsampled` (``rewrite pack:rule``)."""
PATCH_SUBJECT = "patch "
"""How a capture patch is named among the :attr:`PackCheck.unsampled` (``patch pack:name``)."""

_STATUSES = (PASSED, FAILED, SKIPPED)


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    """One row of a :class:`PackCheck`.

    Fields:
        check: which check, one of :data:`CHECKS`.
        subject: what was checked: the pack, a hook, a domain, an impl
            (``pack:function for op``).
        target: the target it was checked at (``""`` when none applies).
        status: ``passed``, ``failed`` or ``skipped``.
        detail: what was found, or the error.
    """

    check: str
    subject: str
    target: str
    status: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise ValueError(f"status must be one of {', '.join(_STATUSES)}, got {self.status!r}")

    def __str__(self) -> str:
        where = f" at {self.target}" if self.target else ""
        text = f"[{self.check}] {self.subject}{where}: {self.status}"
        return f"{text}: {self.detail}" if self.detail else text


@dataclasses.dataclass(frozen=True, slots=True)
class PackCheck:
    """What :func:`check_pack` found for one pack.

    Fields:
        pack: the pack's entry-point name.
        distribution: the distribution that declares it.
        version: that distribution's version.
        results: every check's rows, in :data:`CHECKS` order.
        seconds: how long the kit ran.
        unsampled: the impls (``samples`` subjects) no sample went through: the kit
            had none for them, torch rejected every one, or none reached the impl;
            the rewrite rules without samples (``rewrite pack:rule``); and the
            capture patches without samples (``patch pack:name``).
    """

    pack: str
    distribution: str
    version: str
    results: tuple[CheckResult, ...]
    seconds: float = 0.0
    unsampled: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No result failed."""
        return not self.failures()

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAILED]

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def summary(self) -> str:
        return (
            f"pack {self.pack!r} ({self.distribution} {self.version}): {self.count(PASSED)} passed, "
            f"{self.count(FAILED)} failed, {self.count(SKIPPED)} skipped in {self.seconds:.1f} s"
        )

    def assert_ok(self, *, allow_unsampled: bool = False) -> None:
        """Raise :class:`AssertionError` listing every failure (check, subject, target, detail),
        or, unless ``allow_unsampled``, saying that no impl of the pack was driven with a sample."""
        failures = self.failures()
        if failures:
            lines = [f"{self.summary()}; failures:", *(f"  - {r}" for r in failures)]
            raise AssertionError("\n".join(lines))
        unchecked = {
            PATCH_SUBJECT: (
                "capture patches",
                "never compared a model run through them with the same model run without them",
                "Return models that call the patched code from opreg_capture_samples",
                "patch_name",
                "patches",
            ),
            REWRITE_SUBJECT: (
                "rewrite rules",
                "never saw them fire nor compared their models with eager PyTorch",
                "Return models holding their patterns from opreg_rewrite_samples",
                "rule_name",
                "rules",
            ),
        }
        for prefix, (what, missed, fix, key, plural) in unchecked.items():
            names = [u.removeprefix(prefix) for u in self.unsampled if u.startswith(prefix)]
            if names and not allow_unsampled:
                raise AssertionError(
                    f"{self.summary()}; these {what} have no sample, so the kit {missed}: {', '.join(names)}. "
                    f"{fix} ({{{key}: [opreg.testing.ModelSample.of(module, *inputs)]}}), or call "
                    f"assert_ok(allow_unsampled=True) to accept unchecked {plural}"
                )
        impls = {r.subject for r in self.results if r.check == SAMPLES and r.subject != self.pack}
        if impls and set(self.unsampled) >= impls and not allow_unsampled:
            why = [r for r in self.results if r.check == SAMPLES]
            lines = [
                f"{self.summary()}; none of its {len(impls)} impl(s) was driven with a sample, so the kit "
                "compared nothing with eager PyTorch. Provide sample inputs with the opreg_samples hook "
                "(return {torch_op: [opreg.testing.Sample.of(...), ...]}), or call "
                "assert_ok(allow_unsampled=True) to accept an unchecked pack:",
                *(f"  - {r}" for r in why),
            ]
            raise AssertionError("\n".join(lines))

    def as_dict(self) -> dict[str, Any]:
        return {
            "pack": self.pack,
            "distribution": self.distribution,
            "version": self.version,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "results": [dataclasses.asdict(r) for r in self.results],
            "unsampled": list(self.unsampled),
        }

    def __str__(self) -> str:
        columns = ("check", "subject", "target", "status", "detail")
        rows = [columns, *((r.check, r.subject, r.target, r.status, r.detail) for r in self.results)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(columns) - 1)]
        lines = [self.summary()]
        for n, row in enumerate(rows):
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            lines.append("  ".join([*cells, row[-1]]).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in [*widths, len(columns[-1])]))
        return "\n".join(lines)
