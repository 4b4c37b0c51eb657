"""Issue 53, defect 7: a dim captured again from an example grown to 2 keeps the first capture's
guards, and a squeeze that keeps it where eager PyTorch removes it at the example's 1 is an error."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.export import Dim

import opreg
from tests.test_dynamic import AttendTwice


class SqueezedAfterAttention(AttendTwice):
    """AttendTwice (torch's code fixes a batch of one, so it is captured again at 2), ending in
    ``.squeeze(0).sum(0)``: at batch 1 eager returns (16, 16), a graph that keeps the dim (3, 16, 16)."""

    def forward(self, x):
        return super().forward(x).squeeze(0).sum(0)


class SqueezedAlone(torch.nn.Module):
    """The same ending with no op of torch's that fixes the batch: nothing is grown."""

    def forward(self, x):
        return (x * 2).squeeze(0).sum(0)


def test_a_squeeze_of_a_grown_dim_is_an_error_naming_it():
    spec = {"x": {0: Dim.DYNAMIC}}
    with pytest.raises(opreg.ExportError, match=r"a squeeze keeps a dim marked dynamic") as caught:
        opreg.export(SqueezedAfterAttention().eval(), (torch.rand(1, 3, 16, 16),), dynamic_shapes=spec)
    message = str(caught.value)
    assert "x.shape[0] != 1 (a squeeze keeps the dim, which eager PyTorch removes at size 1)" in message
    assert "test_grown_guards.py" in message and "in forward" in message  # the squeeze's line
    assert "captured again from an example grown to 2" in message
    assert "Export from an example with the dim at 2 or more" in message


def test_the_same_squeeze_without_a_grown_dim_stays_a_warning():
    spec = {"x": {0: Dim.DYNAMIC}}
    with pytest.warns(opreg.ShapeGuardWarning, match=r"x.shape\[0\] != 1 \(a squeeze keeps the dim"):
        program = opreg.export(SqueezedAlone(), (torch.rand(1, 3, 8, 8),), dynamic_shapes=spec)
    assert program.grown_dims == ()


def test_a_grown_dim_from_an_example_of_two_needs_no_recapture():
    """The other side: from an example at batch 2 nothing is grown, and the squeeze is right there."""
    model = SqueezedAfterAttention().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", opreg.ShapeGuardWarning)  # the squeeze's guard at 1, reported
        program = opreg.export(model, (torch.rand(2, 3, 16, 16),), dynamic_shapes={"x": {0: Dim.DYNAMIC}})
    assert program.grown_dims == ()
    program.verify(torch.rand(3, 3, 16, 16), atol=1e-4)


def test_a_grown_dim_keeps_the_first_captures_guards():
    """AttendTwice's branch on its number of elements is a guard of the first capture, kept after the
    recapture, with the grown dim reported."""
    spec = {"x": {0: "batch", 2: Dim.AUTO, 3: Dim.AUTO}}  # a string name: Dim.DYNAMIC named batch
    with pytest.warns(opreg.ShapeGuardWarning, match=r"<= 2147483648"):
        program = opreg.export(AttendTwice().eval(), (torch.rand(1, 3, 16, 16),), dynamic_shapes=spec)
    assert [g.input for g in program.grown_dims] == ["x"]
    assert any(g.guard.endswith("<= 2147483648") for g in program.shape_guards)
    assert program.model.graph.inputs[0].shape[0].value == "batch"


class ViewedAsStatic(torch.nn.Module):
    """A view of the dynamic batch onto a static one: torch's view check narrows it (in torch's code),
    and from the example grown to 2 the view cannot be captured, so the first capture stands."""

    def forward(self, x, y):
        return x.view(y.shape).sum(0)


def test_a_recapture_that_did_not_stand_reports_no_grown_dim(caplog):
    """Issue 53's both-sides row: a dim is reported grown only when the grown capture stood."""
    spec = {"x": {0: Dim.DYNAMIC}, "y": None}
    with caplog.at_level("WARNING", logger="opreg.exporter._dynamic"):
        program = opreg.export(ViewedAsStatic(), (torch.randn(1, 3, 4), torch.randn(1, 3, 4)), dynamic_shapes=spec)
    assert program.grown_dims == ()
    assert "opreg.grown_dims" not in program.model.metadata_props
    assert "captured from an example with it at 2" not in caplog.text
    assert "kept dynamic: the model's code does not branch on it" in caplog.text
    # the other side: AttendTwice's grown capture stood, and is reported
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", opreg.ShapeGuardWarning)
        grown = opreg.export(AttendTwice().eval(), (torch.rand(1, 3, 16, 16),), dynamic_shapes={"x": {0: Dim.DYNAMIC}})
    assert [g.input for g in grown.grown_dims] == ["x"] and "opreg.grown_dims" in grown.model.metadata_props
