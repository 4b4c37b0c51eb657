"""opreg.testing's sample harness itself: what it compares, and that it leaves the samples alone."""

from __future__ import annotations

import torch

from opreg.testing import PASSED, Sample, check_samples
from tests.optest import OPSETS


def bump_and_add(x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """Mutates ``buffer`` like batch norm's running statistics in training, then reads it."""
    buffer.add_(1.0)
    return x + buffer


def test_samples_are_deep_copied_before_each_eager_run_and_export():
    """Two samples sharing a mutated tensor: each eager run and each export sees the original values."""
    shared = torch.tensor([1.0, 2.0, 3.0])
    samples = [Sample.of(torch.zeros(3), shared), Sample.of(torch.ones(3), shared)]
    checks = check_samples(bump_and_add, samples, targets=OPSETS)
    for check in checks:
        assert [r.status for r in check.results] == [PASSED, PASSED], str(check)
    assert torch.equal(shared, torch.tensor([1.0, 2.0, 3.0]))  # the caller's tensor is untouched


def test_sample_copy_keeps_sharing_within_a_sample():
    x = torch.randn(3)
    sample = Sample.of(x, [x, 2])
    copied = sample.copy()
    assert copied.args[0] is not x and copied.args[1][0] is copied.args[0]
    assert copied.label == sample.label
