"""``opreg.ExportSettings``: export's keyword options written once. The signatures of the
functions that take them, docs/exporting.md's table and the class docstring follow its fields;
a wrong value or an unknown keyword is refused before anything is captured."""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opreg
import opreg.llm
from opreg import exporter
from opreg.settings import ExportSettings

ROOT = Path(__file__).resolve().parents[1]
FIELDS = dataclasses.fields(ExportSettings)
NAMES = [f.name for f in FIELDS]


def keyword_options(function) -> dict[str, inspect.Parameter]:
    """The keyword-only parameters ``inspect.signature`` shows, but ``settings``."""
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p for p in parameters if p.kind == p.KEYWORD_ONLY and p.name != "settings"}


@pytest.mark.parametrize("function", [opreg.export, exporter.export, exporter.plan_export], ids=lambda f: f.__module__)
def test_every_option_is_in_the_signature_with_its_type_and_default_and_nothing_else(function):
    shown = keyword_options(function)
    assert list(shown) == NAMES
    for field in FIELDS:
        assert (shown[field.name].annotation, shown[field.name].default) == (field.type, field.default), field.name
    assert inspect.signature(function).parameters["settings"].default is None
    positional = [p.name for p in inspect.signature(function).parameters.values() if p.kind != p.KEYWORD_ONLY]
    assert positional == ["model", "args", "kwargs"]


def test_export_decoder_takes_every_option_but_those_the_layout_sets():
    """Its own options (``opreg.llm.LLMSettings``' fields a causal LM takes: tests/test_llm_settings.py
    holds them to the docs), then export's, but those the layout sets and the target (one of its own)."""
    shown = keyword_options(opreg.llm.export_decoder)
    own = [f.name for f, option in opreg.llm.LLMSettings.options() if "causal" in option.families]
    assert own[:3] == ["target", "layout", "precision"] and "streaming" in own and "feature_extractor" not in own
    assert list(shown) == own + [n for n in NAMES if n not in (*opreg.llm.DECODER_OPTIONS, "target")]
    assert set(opreg.llm.DECODER_OPTIONS) <= set(NAMES)


def test_no_docstring_lists_the_options_again():
    """The options are documented once: the class docstring's attributes (a line each) and the
    table in docs/exporting.md; the functions that take them point there."""
    for function in (opreg.export, exporter.export, exporter.plan_export):
        doc = inspect.getdoc(function)
        assert "ExportSettings" in doc, function
        pasted = [name for name in NAMES if re.search(rf"^\s*{name}\b.*:|\b{name}=", doc, flags=re.MULTILINE)]
        assert not pasted, f"{function.__module__}.{function.__name__}'s docstring lists {pasted}"
    attributes = inspect.getdoc(ExportSettings).split("Attributes:", 1)[1]
    assert re.findall(r"^    (\w+): ", attributes, flags=re.MULTILINE) == NAMES


def test_docs_table_has_a_row_per_option_with_its_default():
    guide = (ROOT / "docs" / "exporting.md").read_text()
    section = guide.split("## Keyword options", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", section, flags=re.MULTILINE)
    assert [name for name, _ in rows] == NAMES
    assert {name: default for name, default in rows} == {f.name: repr(f.default) for f in FIELDS}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seed": "1"}, r"seed= takes an int \(or None for unseeded random nodes\), got str '1'"),
        ({"seed": True}, "seed= takes an int"),
        ({"inline": "no"}, "inline= takes True, False or a node count N >= 0"),
        ({"inline": -1}, "inline= takes True, False or a node count N >= 0"),
        ({"optimize": 1}, "optimize= takes True or False, got int 1"),
        ({"strict": "yes"}, "strict= takes True or False"),
        ({"patches": None}, "patches= takes True or False, got None"),
        ({"state": "keep"}, "state='keep': use 'error' .* 'io' .* or 'drop'"),
        ({"exclude_patches": "pack:name"}, "exclude_patches= takes a list of patch names, got the string"),
        ({"progress": "stages"}, "progress= takes a function"),
        ({"registry": {}}, "registry= takes an opreg.Registry"),
    ],
)
def test_a_wrong_value_names_the_option_and_what_it_takes(options, message):
    with pytest.raises(opreg.InvalidArgumentError, match=message):
        ExportSettings(**options)


def test_registry_and_plugins_together_are_refused():
    with pytest.raises(opreg.InvalidArgumentError, match="either registry= or plugins=/exclude="):
        ExportSettings(registry=opreg.default_registry(), exclude=["ort_contrib"])


def test_wrong_options_are_refused_before_anything_is_captured():
    stages = []
    model, x = torch.nn.Linear(2, 2), torch.randn(1, 2)
    with pytest.raises(opreg.InvalidArgumentError, match="seed="):
        opreg.export(model, (x,), seed="1", progress=stages.append)
    with pytest.raises(opreg.InvalidArgumentError, match="plan_export got seeds"):
        exporter.plan_export(model, (x,), seeds=1)
    assert stages == []


def test_an_unknown_keyword_lists_the_options():
    with pytest.raises(opreg.InvalidArgumentError) as caught:
        opreg.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),), fold_weight=False)
    message = str(caught.value)
    assert message.startswith("opreg.export got fold_weight, which it does not take (did you mean fold_weights?)")
    assert message.endswith(f"its keyword options are {', '.join(NAMES)} (docs/exporting.md, 'Keyword options')")


def test_settings_are_frozen_and_keywords_beside_them_replace_their_fields():
    settings = ExportSettings(target=18, optimize=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.target = 20  # type: ignore[misc]
    stages = []
    model, x = torch.nn.Linear(2, 2).eval(), torch.randn(1, 2)
    program = opreg.export(model, (x,), settings=settings, progress=stages.append)
    assert program.model.opset_imports[""] == 18 and stages == list(exporter.STAGES)
    assert settings.progress is None  # replaced in a copy
    with pytest.raises(opreg.InvalidArgumentError, match="settings= takes an opreg.ExportSettings, got dict"):
        opreg.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),), settings={"target": 18})


def test_export_decoder_refuses_settings_that_set_the_layouts_options():
    with pytest.raises(opreg.InvalidArgumentError, match="export_decoder sets state itself"):
        opreg.llm.export_decoder(None, settings=ExportSettings(state="io"))


def test_importing_opreg_imports_no_settings_until_export_is_used():
    code = (
        "import sys, opreg; assert 'opreg.settings' not in sys.modules; "
        "import inspect; inspect.signature(opreg.export); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
