"""The families' checks against transformers: one comparison per output, and the error listing
those that differ."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

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


ONE_ROW_KEY = "opreg.one_row_after_a_cache"
"""A model metadata key: when set, a batch of prompts after a cache (more than one row, more than
one token, a past) is refused by the model's attention kernel, and runs one row at a time
(opreg-ort-contrib's GroupQueryAttention without ``query_seqlens``, what ONNX Runtime 1.30 loads)."""


def runnable(program: Any, shapes: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``(batch, sequence, past)`` ``shapes`` as ``program`` (an :class:`opreg.OnnxProgram`) runs them:
    a batch of prompts after a cache as one row where its metadata says so (:data:`ONE_ROW_KEY`)."""
    one_row = ONE_ROW_KEY in program.model.metadata_props
    return [(1 if one_row and s > 1 and p > 0 else b, s, p) for b, s, p in shapes]
