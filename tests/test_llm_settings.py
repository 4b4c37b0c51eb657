"""``opreg.llm.LLMSettings``: the options of a language-model export declared once. The flags of
``opreg llm export``, the keywords of ``opreg.llm``'s functions and docs/language-models.md's
table ("Options") name the same options; an option a family does not take is refused with a
message made from its declaration; the context length is checked against every family's position
limit, on both sides of it.

Each check runs before anything is loaded or captured: seconds, no export."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import opreg
import opreg.llm
from opreg.llm import LLMSettings, _export, _precision
from opreg.settings import ExportSettings
from tests import language_models as lm
from tests import speech_models as sm
from tests import vision_models as vm
from tests.test_cli import run

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = {"causal": opreg.llm.export_decoder, "whisper": opreg.llm.export_whisper, "vision": opreg.llm.export_vision}
COMMAND = {"folder", "output", "verify", "json", "debug", "plugin_args", "prefer", "strict", "help"}
"""The dests of ``opreg llm export`` that are the command's own, not options of an export."""


def declared() -> dict[str, tuple[dataclasses.Field, object]]:
    return {field.name: (field, option) for field, option in LLMSettings.options()}


def docs_rows() -> list[list[str]]:
    """The cells of each row of docs/language-models.md's "Options" table."""
    section = (ROOT / "docs" / "language-models.md").read_text().split("## Options\n", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]  # fmt: skip
    assert {len(row) for row in rows} == {5}
    return rows


def llm_export_parser() -> argparse.ArgumentParser:
    from opreg.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    (llm,) = [a for a in commands.choices["llm"]._actions if isinstance(a, argparse._SubParsersAction)]
    return llm.choices["export"]


def keywords(function) -> list[str]:
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters if p.kind == p.KEYWORD_ONLY and p.name in LLMSettings.names()]


def test_the_flags_the_keywords_and_the_docs_table_name_the_same_options():
    fields = declared()
    rows = docs_rows()
    assert [row[0].strip("`") for row in rows] == list(fields), "a docs row per option, in the fields' order"
    flags = {}  # option -> its flags, as the command line has them
    for action in llm_export_parser()._actions:
        if action.dest not in COMMAND:
            flags.setdefault(action.dest, set()).update(action.option_strings)
    assert set(flags) == {name for name, (_, option) in fields.items() if option.flags}
    for cell, flag_cell, default, families, _ in rows:
        name = cell.strip("`")
        field, option = fields[name]
        assert default == f"`{field.default!r}`", name
        assert set(re.findall(r"-{1,2}[a-z][a-z0-9-]*", flag_cell)) == flags.get(name, set()), name
        taken = "every family" if option.families == tuple(opreg.llm._settings.FAMILIES) else families
        assert families == taken, name
        if families != "every family":
            assert families == " or ".join(opreg.llm._settings.FAMILIES[key] for key in option.families), name
    for key, function in FUNCTIONS.items():
        assert keywords(function) == [name for name, (_, option) in fields.items() if key in option.families]
    assert keywords(opreg.llm.export_checkpoint) == list(fields)
    assert set().union(*(keywords(function) for function in FUNCTIONS.values())) == set(fields)


def test_the_docstring_and_the_help_come_from_the_fields():
    attributes = LLMSettings.__doc__.split("Attributes:", 1)[1]
    assert re.findall(r"^    (\w+): ", attributes, flags=re.MULTILINE) == list(declared())
    helps = {action.dest: action.help for action in llm_export_parser()._actions}
    assert helps["context_length"] == declared()["context_length"][1].help
    assert helps["tokenizer"] == "write no tokenizer (and no warning when the checkpoint has none)"  # the flag's own


def test_precisions_are_declared_once():
    (precision,) = [a for a in llm_export_parser()._actions if a.dest == "precision"]
    assert tuple(precision.choices) == opreg.llm.PRECISIONS == tuple(_precision.BITS)
    with pytest.raises(opreg.InvalidArgumentError, match="precision= takes one of fp32, int8, int4, got 'int3'"):
        LLMSettings(precision="int3")


@pytest.mark.parametrize(
    ("options", "given"),
    [
        ({"precision": "int4", "accuracy_level": 0}, {"accuracy_level": 0}),  # 0 is given, not left out
        ({"precision": "int4", "symmetric": False}, {"symmetric": False}),
        ({"precision": "int4", "symmetric": True, "block_size": 16}, {"block_size": 16, "symmetric": True}),
        ({"precision": "int4", "symmetric": None, "accuracy_level": None}, {}),  # None: left out
    ],
)
def test_quantization_options_given_as_false_or_0_are_given(options, given):
    settings = LLMSettings(**options)
    assert settings.quantization() == given
    if given and "accuracy_level" not in given:  # the same without a quantized precision: refused, naming them
        with pytest.raises(opreg.InvalidArgumentError, match=f"{', '.join(given)} sets? how weights are quantized"):
            LLMSettings(**{**options, "precision": "fp32"})
    elif given:  # a quantized checkpoint takes it at fp32: a float one's export refuses it
        float32 = {**options, "precision": "fp32"}
        LLMSettings(**float32)
        with pytest.raises(opreg.InvalidArgumentError, match="accuracy_level sets how weights are quantized"):
            opreg.llm.export_decoder(lm.causal_lm("llama"), **float32)


def test_a_bad_value_is_refused_when_the_settings_are_made():
    for value, message in [(0, "at least 1, got 0"), (2**31, "above 2147483647"), (True, "takes a positive int")]:
        with pytest.raises(opreg.InvalidArgumentError, match=message):
            LLMSettings(context_length=value)
    assert LLMSettings(context_length=1).context_length == 1 and LLMSettings(context_length=2**31 - 1)
    with pytest.raises(opreg.InvalidArgumentError, match="layout= takes one of genai, optimum, got 'onnx'"):
        LLMSettings(layout="onnx")


@pytest.mark.parametrize(
    ("family", "options", "message"),
    [
        ("whisper", {"block_size": 64, "precision": "int4"},
         r"a Whisper model does not take block_size \(--block-size\): it is for a causal LM only; leave it out"),
        ("whisper", {"symmetric": False, "precision": "int4"}, r"does not take symmetric \(--symmetric/--asymmetric\)"),
        ("vision", {"streaming": False}, r"a vision-language model does not take streaming \(--no-streaming\)"),
        ("vision", {"feature_extractor": "x"}, "does not take feature_extractor: it is for a Whisper model only"),
        ("causal", {"image_processor": "x", "feature_extractor": "x"},
         "a causal LM does not take image_processor, feature_extractor: they are for a Whisper model or "
         "vision-language model only; leave them out"),
    ],
)  # fmt: skip
def test_an_option_the_family_does_not_take_is_refused_before_anything_is_loaded(family, options, message):
    stages = []
    with pytest.raises(opreg.InvalidArgumentError, match=message):
        FUNCTIONS[family](None, progress=stages.append, **options)  # refused before the model is looked at
    assert stages == []


def test_an_option_the_family_does_not_take_at_its_default_is_taken():
    """Given as its default (``None``), it is not given: the function runs on (and refuses the
    model, here, for what it is)."""
    with pytest.raises(opreg.InvalidArgumentError, match="export_whisper takes a transformers Whisper model"):
        opreg.llm.export_whisper(42, block_size=None, streaming=None, symmetric=None)


def test_the_command_refuses_a_causal_lm_option_for_a_whisper_checkpoint_before_reading_weights(tmp_path, capsys):
    checkpoint = sm.checkpoint(sm.whisper(), tmp_path / "whisper")
    (checkpoint / "model.safetensors").write_bytes(b"not weights")
    capsys.readouterr()
    argv = ["llm", "export", str(checkpoint), "-o", str(tmp_path / "out"), "--precision", "int4", "--asymmetric"]
    code, stdout, err = run(capsys, *argv)
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert "a Whisper model does not take symmetric (--symmetric/--asymmetric): it is for a causal LM only" in err
    assert not (tmp_path / "out").exists()


def prepared(model, **options):
    """What the export of ``model`` (its family picked from its config) is handed, checks done."""
    return _export.prepare(None, model, LLMSettings(**options), None, ExportSettings(), "export_checkpoint")


LIMITS = [
    ("causal", lambda: lm.causal_lm("llama"), 256, "max_position_embeddings 256"),
    ("whisper", sm.whisper, 448, "max_target_positions 448"),
    ("vision", vm.qwen2_5_vl, 1024, "max_position_embeddings 1024"),
]


@pytest.mark.parametrize(("family", "make", "limit", "named"), LIMITS, ids=[row[0] for row in LIMITS])
def test_the_context_length_is_checked_against_every_familys_position_limit_on_both_sides(family, make, limit, named):
    model = make()
    assert prepared(model).settings.context_length == limit  # the default: the limit
    assert prepared(model, context_length=limit).settings.context_length == limit  # exactly at it
    with pytest.raises(opreg.InvalidArgumentError, match=rf"context_length {limit + 1} is above the model's position "
                       rf"limit \({named}\)"):  # fmt: skip
        prepared(model, context_length=limit + 1)  # one past it
    with pytest.raises(opreg.InvalidArgumentError, match="above the model's position limit"):
        prepared(model, context_length=limit + 1, allow_longer_context=False)  # False given, not left out
    longer = prepared(model, context_length=limit + 1, allow_longer_context=True)
    assert (longer.family.key, longer.settings.context_length) == (family, limit + 1)
    stages = []
    with pytest.raises(opreg.InvalidArgumentError, match="above the model's position limit"):
        FUNCTIONS[family](model, context_length=5000, progress=stages.append)
    assert stages == []


def test_the_command_refuses_a_context_past_qwen_2_5_vls_limit_unless_allowed(tmp_path, capsys):
    """Issue 53: ``--context-length 5000`` above Qwen2.5-VL's 1024 was accepted, and
    ``--allow-longer-context`` ignored."""
    checkpoint = tmp_path / "qwen"
    vm.qwen2_5_vl().save_pretrained(checkpoint)
    (checkpoint / "model.safetensors").write_bytes(b"not weights")
    capsys.readouterr()
    argv = ["llm", "export", str(checkpoint), "-o", str(tmp_path / "out"), "--context-length", "5000", "--no-tokenizer"]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "context_length 5000 is above the model's position limit (max_position_embeddings 1024)" in err
    code, _, err = run(capsys, *argv, "--allow-longer-context")
    assert code == 2 and "transformers could not load a vision-language model" in err, err  # on to the weights
