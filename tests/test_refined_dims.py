"""Issue 50: named dims refined as torch.export suggests, captured again and reported; a fix that
would make a dim static stays an error naming the guard."""

from __future__ import annotations

import json
import logging
import textwrap

import pytest
import torch
from torch.export import Dim

import opreg
from tests import real_models
from tests.test_cli import run


class Table(torch.nn.Module):
    """A position table of 16 rows sliced by the sequence length (BERT's position ids): torch's guard
    bounds the length at 16."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("positions", torch.randn(16, 4))

    def forward(self, x):
        return x + self.positions[: x.shape[1]]


class Fixed(torch.nn.Module):
    """Adds a weight of 6 rows: torch's fix makes the dim static."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(6, 4))

    def forward(self, x):
        return x[0] + self.weight


def test_a_named_dim_is_refined_captured_again_and_reported(caplog):
    spec = {"x": {1: Dim("sequence")}}
    with caplog.at_level(logging.WARNING, logger="opreg.exporter._dynamic"):
        program = opreg.export(Table().eval(), (torch.randn(2, 5, 4),), dynamic_shapes=spec)
    (refined,) = program.refined_dims
    assert (refined.name, refined.asked, refined.refined) == ("sequence", "Dim('sequence')", "Dim('sequence', max=16)")
    assert "<= 16" in refined.reason
    assert f"dim refined: {refined}" in caplog.text
    assert json.loads(program.model.metadata_props["opreg.refined_dims"])[0]["refined"] == "Dim('sequence', max=16)"
    assert program.model.graph.inputs[0].shape[1].value == "sequence"
    for length in (3, 16):  # the refined range's ends
        program.verify(torch.randn(2, length, 4), atol=1e-5)


def test_a_range_that_already_holds_is_not_refined():
    program = opreg.export(Table().eval(), (torch.randn(2, 5, 4),), dynamic_shapes={"x": {1: Dim("seq", max=16)}})
    assert program.refined_dims == ()
    assert "opreg.refined_dims" not in program.model.metadata_props


def test_a_fix_that_makes_the_dim_static_stays_an_error_naming_the_guard():
    with pytest.raises(opreg.ExportError, match=r"Constraints violated \(rows\)") as caught:
        opreg.export(Fixed(), (torch.randn(2, 6, 4),), dynamic_shapes={"x": {1: Dim("rows")}})
    assert "rows = 6" in str(caught.value)  # torch's fix, not applied


def test_a_tiny_bert_refines_its_sequence_to_the_position_table():
    case = real_models.bert()
    sequence = Dim("sequence")
    spec = {name: {0: real_models.BATCH, 1: sequence} for name in case.kwargs}
    program = opreg.export(case.model, case.args, case.kwargs, dynamic_shapes=spec)
    (refined,) = program.refined_dims
    assert refined.refined == "Dim('sequence', max=128)"
    program.verify(**real_models._text_inputs(3, 20), atol=1e-4)


def test_cli_export_notes_each_refined_dim(capsys, tmp_path):
    model_file = tmp_path / "table.py"
    model_file.write_text(
        textwrap.dedent(
            """
            import torch


            class Table(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.register_buffer("positions", torch.randn(16, 4))

                def forward(self, x):
                    return x + self.positions[: x.shape[1]]


            def make():
                return Table().eval(), (torch.randn(2, 5, 4),)
            """
        )
    )
    code, out, err = run(capsys, "export", f"{model_file}:make", "-o", str(tmp_path / "t.onnx"), "--dynamic", "x:1=seq")
    assert code == 0, err
    assert "note: seq: refined from Dim('seq') to Dim('seq', max=16), as torch.export suggested" in " ".join(
        out.split()
    )
