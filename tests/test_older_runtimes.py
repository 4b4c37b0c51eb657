"""Exports load, and match, in an older ONNX Runtime than the installed one (issue 50): the model zoo
at the default targets, and a language-model folder, run in onnxruntime 1.30 (what transformers.js
4.3 ships), in a venv of its own under ``build/`` (:mod:`tests.side_runtimes`; its first run installs
onnxruntime 1.30.0 and numpy from the package index, ~30 s, then it is reused)."""

from __future__ import annotations

import pytest
import torch

import opreg
from tests import language_models as lm
from tests import real_models, side_runtimes

OLDER = "1.30.0"
"""The release: ai.onnx up to 26, IR up to 13 (the installed 1.32 reads 28 and 14)."""
CONTRIB = "onnxruntime" in opreg.default_registry().profiles
TARGETS = ("onnx", "onnxruntime") if CONTRIB else ("onnx",)
ZOO = (
    real_models.tutorial_cnn, real_models.resnet18, real_models.mobilenet, real_models.bert, real_models.distilbert,
    real_models.gpt2, real_models.llama, real_models.vit, real_models.greedy_decoder, real_models.early_exit,
)  # fmt: skip


@pytest.fixture(scope="session")
def older_runtime():
    """The Python of a venv with onnxruntime 1.30.0 (made once, kept in build/)."""
    return side_runtimes.python_of(OLDER)


def _zoo_case(make, target: str, folder) -> tuple:
    case = make()
    program = opreg.export(case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes, target=target)
    assert program.model.opset_imports[""] <= 26 and program.model.ir_version <= 13, (case.name, target)
    path = folder / f"{case.name}-{target}.onnx"
    program.save(path)
    feeds = program.adapt_torch_inputs_to_onnx(*case.args, **case.kwargs)
    with torch.no_grad():
        eager = case.model(*case.args, **case.kwargs)
    expected = [t.detach().numpy() for t in program.adapt_torch_outputs_to_onnx(eager)]
    named = {name: feed.numpy() for name, feed in zip(program.input_names, feeds, strict=True)}
    return (str(path), *side_runtimes.write_case(folder, f"{case.name}-{target}", named, expected), 1e-3, 1e-4)


def test_the_zoo_at_the_default_targets_loads_and_matches_eager_in_onnxruntime_1_30(older_runtime, tmp_path):
    cases = [_zoo_case(make, target, tmp_path) for make in ZOO for target in TARGETS]
    rows = side_runtimes.run_models(older_runtime, cases)
    assert {row["version"] for row in rows} == {OLDER}
    failing = [row for row in rows if not (row["loaded"] and row.get("matches"))]
    assert not failing, failing


CASES = {
    "left-padded prompts": (2, 5, 0, 2),
    "decode step": (2, 1, 4, 2),
    "a prompt after a cache": (1, 3, 4, 0),
}
"""``(batch, new tokens, past, left padding)`` of the steps a generation takes (a batch of prompts
after a cache is one row at the default: the 16-input GroupQueryAttention 1.30 loads refuses more, as
the builder's graph does)."""


@pytest.mark.skipif(not CONTRIB, reason="opreg-ort-contrib is not installed")
def test_the_default_language_model_folder_loads_and_matches_in_onnxruntime_1_30(older_runtime, tmp_path):
    """``opreg llm export``'s default (the onnxruntime target): GroupQueryAttention on the cache with
    the 16 inputs 1.30 takes, at an opset 1.30 reads; there it gives what the installed release gives
    (which matches eager transformers: ``verify``) on a generation's steps, left padding included."""
    import onnxruntime

    default = opreg.llm.export_decoder(lm.causal_lm("llama"), tmp_path / "default", tokenizer=lm.tokenizer())
    ((name, model),) = default.programs.items()
    assert model.model.opset_imports[""] <= 26 and model.model.ir_version <= 13
    attention = [n for n in model.model.graph if n.op_type == "GroupQueryAttention"]
    assert attention and all(len(n.inputs) <= 16 for n in attention)
    default.verify()
    path = tmp_path / "default" / name
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cases = []
    for label, sizes in CASES.items():
        feeds = side_runtimes.decoder_step(session.get_inputs(), *sizes)
        written = side_runtimes.write_case(tmp_path, label.replace(" ", "-"), feeds, session.run(None, feeds))
        cases.append((str(path), *written, 1e-4, 1e-5))
    rows = side_runtimes.run_models(older_runtime, cases)
    assert [row["version"] for row in rows] == [OLDER] * len(CASES)
    assert all(row["loaded"] and row.get("matches") for row in rows), rows
