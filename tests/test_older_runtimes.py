"""Exports load, and match, in an older ONNX Runtime than the installed one (issue 50): the model zoo
at the default targets, and a language-model folder, run in onnxruntime 1.30 (what transformers.js
4.3 ships), in a venv of its own under ``build/`` (:mod:`tests.side_runtimes`; its first run installs
onnxruntime 1.30.0 and numpy from the package index, ~30 s, then it is reused); and attention with a
mask exported for onnxruntime 1.18 and 1.20, run in venvs of 1.18.1 and 1.20.1 made the same way."""

from __future__ import annotations

import numpy as np
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


SIZES = {"batch_size": 2, "sequence_length": 3, "past_sequence_length": 4, "total_sequence_length": 7}


def _decoder_feeds(path) -> dict[str, np.ndarray]:
    """A decode step's inputs for the folder's model, from the session's own input names and shapes:
    a batch of 2, 3 new tokens after a past of 4."""
    import onnxruntime

    rng = np.random.default_rng(0)
    feeds = {}
    for value in onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs():
        shape = [d if isinstance(d, int) else SIZES[d] for d in value.shape]
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, 50, shape).astype(np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones(shape, np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.broadcast_to(np.arange(4, 7), shape).astype(np.int64).copy()
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.skipif(not CONTRIB, reason="opreg-ort-contrib is not installed")
def test_a_language_model_folder_loads_and_matches_in_onnxruntime_1_30(older_runtime, tmp_path):
    """At its default target (the installed release) the folder imports the opset its nodes need,
    which 1.30 reads; for 1.30 itself (``onnxruntime==1.30``) it loads there and gives what the
    installed release gives on a decode step."""
    import onnxruntime

    default = opreg.llm.export_decoder(lm.causal_lm("llama"), tmp_path / "default", tokenizer=lm.tokenizer())
    (model,) = default.programs.values()
    assert model.model.opset_imports[""] <= 26 and model.model.ir_version <= 13
    older = opreg.llm.export_decoder(
        lm.causal_lm("llama"), tmp_path / "older", target=f"onnxruntime=={OLDER}", tokenizer=lm.tokenizer()
    )
    path = tmp_path / "older" / next(iter(older.programs))
    feeds = _decoder_feeds(path)
    expected = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    case = (str(path), *side_runtimes.write_case(tmp_path, "decoder", feeds, expected), 1e-4, 1e-5)
    (row,) = side_runtimes.run_models(older_runtime, [case])
    assert row["loaded"] and row["matches"], row


BIAS_RELEASES = {"1.18.1": ["numpy<2"], "1.20.1": []}
"""Releases whose MultiHeadAttention takes no ``attention_bias`` of one head for all (1.18.1 refuses
it, 1.20.1 computes it wrong), and what their venvs need besides (1.18 is built against numpy 1)."""


@pytest.mark.parametrize("version", sorted(BIAS_RELEASES))
def test_attention_with_a_mask_exported_for_an_older_release_matches_eager_there(version, tmp_path):
    """At ``onnxruntime==1.18`` and ``==1.20`` the pack's MultiHeadAttention gets its mask as a bias
    expanded to its heads (the BiasPerHead rule), which those releases compute right."""
    if not CONTRIB:
        pytest.skip("needs opreg-ort-contrib")
    from opreg_ort_contrib import samples

    python = side_runtimes.python_of(version, BIAS_RELEASES[version])
    torch.manual_seed(0)
    model, x = samples.BiasedSelfAttention().eval(), torch.randn(2, samples.SEQ, samples.HIDDEN)
    cases = []
    causal = torch.ones(samples.SEQ, samples.SEQ, dtype=torch.bool).tril().expand(2, 1, -1, -1)
    for name, mask in {"causal": causal, "padding": torch.rand(2, 1, 1, samples.SEQ) > 0.3}.items():
        program = opreg.export(model, (x, mask), target=f"onnxruntime=={version[:4]}")
        attention = [n for n in program.model_proto.graph.node if n.op_type == "MultiHeadAttention"]
        assert len(attention) == 1 and attention[0].input[5], name
        path = tmp_path / f"{name}.onnx"
        program.save(path)
        with torch.no_grad():
            expected = [model(x, mask).numpy()]
        named = dict(zip(program.input_names, (x.numpy(), mask.numpy()), strict=True))
        cases.append((str(path), *side_runtimes.write_case(tmp_path, name, named, expected), 0, 1e-5))
    rows = side_runtimes.run_models(python, cases)
    assert {row["version"] for row in rows} == {version}
    assert all(row["loaded"] and row.get("matches") for row in rows), rows
