"""The tutorials' scenarios in examples/ run as written, with their own assertions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


def test_the_four_scenarios_are_there():
    assert [p.stem for p in EXAMPLES] == [
        "custom_aten_add",
        "custom_gelu_contrib",
        "custom_op_addandround",
        "inverse_contrib",
    ]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_its_assertions_hold(example, tmp_path):
    # each in its own interpreter: the third defines a torch op, as the tutorial does
    proc = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "as in the" in proc.stdout
