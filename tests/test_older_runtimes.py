"""Exports load, and match, in an older ONNX Runtime than the installed one (issue 50): the model zoo
at the default targets, and a language-model folder, run in onnxruntime 1.30 (what transformers.js
4.3 ships), in a venv of its own under ``build/`` (:mod:`tests.side_runtimes`; its first run installs
onnxruntime 1.30.0 and numpy from the package index, ~30 s, then it is reused); and attention with a
mask exported for onnxruntime 1.18 and 1.20, run in venvs of 1.18.1 and 1.20.1 made the same way."""

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
        cases.append(_eager_case(tmp_path, name, program, model, (x, mask)))
    rows = side_runtimes.run_models(python, cases)
    assert {row["version"] for row in rows} == {version}
    assert all(row["loaded"] and row.get("matches") for row in rows), rows


class _GroupedSdpa(torch.nn.Module):
    """q/k/v projections, fewer key/value heads than query heads, sdpa with ``enable_gqa=True`` and a mask."""

    def __init__(self, hidden: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.size = heads, kv_heads, hidden // heads
        self.q = torch.nn.Linear(hidden, hidden)
        self.kv = torch.nn.Linear(hidden, 2 * kv_heads * self.size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q(x).view(batch, seq, self.heads, self.size).transpose(1, 2)
        k, v = self.kv(x).view(batch, seq, 2 * self.kv_heads, self.size).transpose(1, 2).chunk(2, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(batch, seq, -1)


@pytest.mark.parametrize("version", sorted(BIAS_RELEASES))
def test_grouped_attention_with_a_mask_exported_for_an_older_release_matches_eager_there(version, tmp_path):
    """Their GroupQueryAttention takes 9 inputs, no ``attention_bias``: at ``onnxruntime==1.18`` and
    ``==1.20`` a masked sdpa with ``enable_gqa=True`` (and transformers' ``repeat_kv`` before a masked
    sdpa) becomes MultiHeadAttention on the repeated keys and values, its bias expanded to its heads
    (the UngroupedBias and BiasPerHead rules); at ``==1.22`` it stays GroupQueryAttention."""
    if not CONTRIB:
        pytest.skip("needs opreg-ort-contrib")
    from opreg_ort_contrib import samples

    python = side_runtimes.python_of(version, BIAS_RELEASES[version])
    torch.manual_seed(0)
    x, padding = torch.randn(2, samples.SEQ, samples.HIDDEN), torch.rand(2, 1, 1, samples.SEQ) > 0.3
    models = {"enable-gqa": _GroupedSdpa(), "repeat-kv": samples.GroupedSelfAttention(rotary=False)}
    cases = []
    for name, model in models.items():
        model.eval()
        newer = opreg.export(model, (x, padding), target="onnxruntime==1.22").model_proto.graph.node
        assert [len(n.input) for n in newer if n.op_type == "GroupQueryAttention"] == [11], name
        program = opreg.export(model, (x, padding), target=f"onnxruntime=={version[:4]}")
        kinds = [n.op_type for n in program.model_proto.graph.node if n.domain == "com.microsoft"]
        assert kinds == ["MultiHeadAttention"], (name, kinds)
        cases.append(_eager_case(tmp_path, name, program, model, (x, padding)))
    rows = side_runtimes.run_models(python, cases)
    assert {row["version"] for row in rows} == {version}
    assert all(row["loaded"] and row.get("matches") for row in rows), rows


def _eager_case(tmp_path, name: str, program, model, inputs: tuple) -> tuple:
    """``program`` saved as ``name``.onnx, with ``inputs`` and eager ``model``'s output written for a side
    runtime (:func:`tests.side_runtimes.run_models`), compared within 1e-5."""
    path = tmp_path / f"{name}.onnx"
    program.save(path)
    with torch.no_grad():
        expected = [model(*inputs).numpy()]
    named = dict(zip(program.input_names, (value.numpy() for value in inputs), strict=True))
    return (str(path), *side_runtimes.write_case(tmp_path, name, named, expected), 0, 1e-5)
