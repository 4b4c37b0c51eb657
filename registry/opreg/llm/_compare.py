"""The families' checks against transformers: one comparison per output, and the error listing
those that differ."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from opreg.exporter import OutputCheck
from opreg.exporter.diagnosis.compare import compare_output, mismatch_error


def compare_all(
    label: str,
    names: Sequence[str],
    got: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    rtol: float,
    atol: float,
) -> list[OutputCheck]:
    """One check per output, named ``"NAME (label)"``."""
    pairs = zip(names, got, expected, strict=True)
    return [compare_output(f"{name} ({label})", mine, theirs, rtol, atol) for name, mine, theirs in pairs]


def checked(checks: list[OutputCheck], what: str, rtol: float, atol: float) -> list[OutputCheck]:
    """``checks``, or a :class:`opreg.VerificationError` listing those that failed (``what``: whose
    outputs, in the message)."""
    if not all(c.ok for c in checks):
        raise mismatch_error(checks, f"{what} outputs differ from transformers' (rtol={rtol}, atol={atol})")
    return checks
