"""Testing helpers for opreg and for op packs: drive impls with sample inputs,
export one-op models, run them and compare with eager PyTorch.

``opreg.testing.opinfo`` feeds ATen impls PyTorch's own OpInfo samples.
"""

from __future__ import annotations

from opreg.testing._samples import (
    FAILED,
    PASSED,
    SKIPPED,
    TOLERANCES,
    OpCall,
    Sample,
    SampleCheck,
    SampleResult,
    check_samples,
    describe,
)

__all__ = [
    "FAILED",
    "PASSED",
    "SKIPPED",
    "TOLERANCES",
    "OpCall",
    "Sample",
    "SampleCheck",
    "SampleResult",
    "check_samples",
    "describe",
]
