"""opreg.testing's sample harness itself: what it compares, and that it leaves the samples alone."""

from __future__ import annotations

import pytest
import torch

from opreg.testing import PASSED, SHAPE_ONLY, Arg, GatherIndices, Sample, check_samples, compare_outputs
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


def test_uninitialized_results_are_shape_only_not_passed():
    (check,) = check_samples(torch.empty_like, [Sample.of(torch.randn(2, 3))], targets=OPSETS[:1], values=False)
    (result,) = check.results
    assert result.status == SHAPE_ONLY and "values not compared" in result.detail
    assert not check.failures() and not check.compared and not check.ok  # nothing compared: not a pass
    assert "0 passed, 1 shape-only, 0 failed, 0 skipped" in str(check)


def test_a_shape_only_sample_beside_a_compared_one_keeps_the_check_ok():
    samples = [Sample.of(torch.randn(2, 3))]
    (compared,) = check_samples(torch.zeros_like, samples, targets=OPSETS[:1])
    assert compared.ok and compared.compared and compared.count(PASSED) == 1


TIES = torch.tensor([[3.0, 1.0, 3.0, 1.0], [2.0, 2.0, 2.0, 0.0]])


def test_gather_indices_accepts_any_pick_among_equal_elements():
    compare = GatherIndices(Arg(1, "dim", -1))
    sample = Sample.of(TIES, 1, True)  # sort(x, 1, descending=True)
    values, indices = torch.sort(TIES, dim=1, descending=True, stable=True)
    other = torch.tensor([[2, 0, 3, 1], [1, 2, 0, 3]])  # the same values, ties picked in another order
    assert compare(sample, [values, other], [values, indices], 0.0, 0.0) == []
    assert compare_outputs(sample, [values, other], [values, indices], 0.0, 0.0)  # elementwise would refuse it
    wrong = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])
    (problem,) = compare(sample, [values, wrong], [values, indices], 0.0, 0.0)
    assert problem == "output 1 (indices): 2 of 8 pick an element unequal to eager PyTorch's pick"


def test_gather_indices_of_a_reduced_dim_and_of_values():
    compare = GatherIndices(Arg(1, "dim"), Arg(2, "keepdim", False))
    sample = Sample.of(TIES, 1)  # max(x, 1)
    values, indices = torch.max(TIES, 1)
    assert compare(sample, [values, torch.tensor([2, 1])], [values, indices], 0.0, 0.0) == []
    (problem,) = compare(sample, [values + 1, indices], [values, indices], 0.0, 0.0)
    assert problem.startswith("output 0: 2 of 2 elements out of tolerance")
    (problem,) = compare(sample, [values, torch.tensor([4, 0])], [values, indices], 0.0, 0.0)
    assert problem == "output 1 (indices): indices outside [0, 4) along dim 1"
    keep = Sample.of(TIES, 1, True)
    values, indices = torch.max(TIES, 1, keepdim=True)
    assert compare(keep, [values, torch.tensor([[2], [1]])], [values, indices], 0.0, 0.0) == []


@pytest.mark.parametrize("opset", OPSETS)
def test_sort_ties_are_checked_through_the_opinfo_compare_hook(opset):
    """sort's OpInfo compares indices by gathering (ties), and checks values as usual."""
    from opreg.testing import opinfo

    samples = [Sample.of(TIES, 1, True), Sample.of(torch.randint(0, 3, (4, 50)).float())]
    (check,) = check_samples(torch.sort, samples, targets=[opset], compare=opinfo.COMPARE["sort"])
    assert [r.status for r in check.results] == [PASSED, PASSED], str(check)
