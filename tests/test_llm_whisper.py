"""Whisper for ONNX Runtime GenAI: ``opreg.llm.export_whisper`` and ``opreg llm export`` write the
encoder (with the cross-attention keys and values), the decoder (its self-attention cache in and
out), ``genai_config.json``, GenAI's audio recipe and the tokenizer; GenAI transcribes a sound
with its own audio processing into eager ``generate``'s greedy tokens.

A tiny random-init Whisper and a synthetic sound (tests/speech_models.py): nothing is downloaded.
Numerics are compared with transformers (rtol=atol=1e-4, float32).
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest
import torch

import opreg
from opreg.llm import WHISPER_LAYOUT
from tests import speech_models as sm
from tests.test_cli import run

LENGTH = 24
FILES = [
    "audio_processor_config.json", "decoder.onnx", "decoder.onnx.*.data", "encoder.onnx", "encoder.onnx.*.data",
    "genai_config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
]  # fmt: skip
"""The folder's files; each model's weights in a side file, as the builder writes them."""


def files(names) -> list[str]:
    """``names`` sorted, a side file's token as ``*``."""
    import re

    return sorted(re.sub(r"\.onnx\.[0-9a-f]+\.data$", ".onnx.*.data", name) for name in names)


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """A Whisper exported at the standard target to a GenAI folder, and a sound file."""
    model = sm.whisper()
    root = tmp_path_factory.mktemp("whisper")
    exported = opreg.llm.export_whisper(model, root / "genai", tokenizer=sm.tokenizer())
    return model, exported, root / "genai", sm.write_sound(root / "sound.wav", sm.sound())


def dims(value):
    return [d if isinstance(d, int) else d.value for d in value.shape]


def test_the_encoder_and_decoder_have_genai_names_and_dynamic_lengths(whisper):
    _, exported, _, _ = whisper
    encoder, decoder = exported.encoder.model.graph, exported.decoder.model.graph
    assert [v.name for v in encoder.inputs] == ["audio_features"]
    assert dims(encoder.inputs[0]) == ["batch_size", 80, 3000]  # 30 s: Whisper's encoder takes no other length
    assert [v.name for v in encoder.outputs] == [
        "hidden_states", "present_key_cross_0", "present_value_cross_0", "present_key_cross_1", "present_value_cross_1"
    ]  # fmt: skip
    assert dims(encoder.outputs[0]) == ["batch_size", 1500, 64]
    assert dims(encoder.outputs[1]) == ["batch_size", 4, 1500, 16]  # BNSH, computed once per sound
    layers = range(2)
    assert [v.name for v in decoder.inputs] == [
        "input_ids",
        *[f"past_{kind}_self_{i}" for i in layers for kind in ("key", "value")],
        *[f"past_{kind}_cross_{i}" for i in layers for kind in ("key", "value")],
    ]
    assert [v.name for v in decoder.outputs] == [
        "logits", *[f"present_{kind}_self_{i}" for i in layers for kind in ("key", "value")]
    ]  # fmt: skip
    by_name = {v.name: v for v in [*decoder.inputs, *decoder.outputs]}
    assert dims(by_name["input_ids"]) == ["batch_size", "sequence_length"]
    assert dims(by_name["past_value_self_1"]) == ["batch_size", 4, "past_sequence_length", 16]
    assert dims(by_name["past_key_cross_0"]) == ["batch_size", 4, "encoder_sequence_length", 16]
    assert dims(by_name["logits"]) == ["batch_size", "sequence_length", sm.VOCAB]
    assert dims(by_name["present_key_self_0"]) == ["batch_size", 4, "total_sequence_length", 16]
    for value in by_name.values():  # plain ONNX: past and new keys and values are concatenated
        if value.name.startswith("present_"):
            assert value.producer().op_type == "Concat" and value.producer().inputs[0].name.startswith("past_")
    assert set(exported.encoder.model.opset_imports) == set(exported.decoder.model.opset_imports) == {""}


def test_the_encoder_and_decoder_match_transformers(whisper):
    _, exported, _, _ = whisper
    checks = exported.verify()  # encoder at batch 1 and 2; decoder at sequence 1, 4 and 7, past 0 and 5
    labels = {c.name for c in checks}
    assert {
        "present_key_cross_1 (batch 2)", "logits (batch 3, sequence 7, past 5)",
        "present_value_self_0 (batch 1, sequence 1, past 0)", "logits (features to a prefill, batch 2)",
    } <= labels  # fmt: skip
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4


def test_verify_fails_when_the_models_do_not_match(whisper):
    _, exported, _, _ = whisper
    original = exported.model
    exported.model = sm.whisper(seed=1)  # other weights: the same graphs, other numbers
    try:
        with pytest.raises(opreg.VerificationError, match="Whisper outputs differ from transformers'"):
            exported.verify([(1, 2, 0)])
    finally:
        exported.model = original


def test_one_layer_of_the_encoder_and_of_the_decoder_is_captured_and_copied_with_its_own_weights_and_caches(
    caplog, monkeypatch
):
    """Whisper's layers read nothing of the layers before them but the hidden state: layer 0 of the
    encoder and of the decoder is captured, the others are copies, each on its own weights, self-
    attention cache and cross-attention keys and values (random: a mix-up shows). The models are
    those a whole capture makes (the same ops and weights) and match transformers."""
    import collections

    from opreg.llm import _layers

    model = sm.whisper(encoder_layers=3, decoder_layers=3)
    with caplog.at_level("INFO", logger="opreg.llm"):
        exported = opreg.llm.export_whisper(model)
    for layers in ("model.encoder.layers", "model.decoder.layers"):
        assert f"captured the first 1 of 3 layers; the others are copies ({layers})" in caplog.text
    exported.verify([(1, 1, 0), (3, 7, 5)])
    monkeypatch.setattr(_layers, "plan_layers", lambda *args, **kwargs: None)
    whole = opreg.llm.export_whisper(model)

    def ops(program):
        return sorted(collections.Counter((n.domain, n.op_type) for n in program.model.graph).items())

    def weights(program):
        return sorted(name for name in program.model.graph.initializers if name.startswith("model."))

    for mine, theirs in ((exported.encoder, whole.encoder), (exported.decoder, whole.decoder)):
        assert ops(mine) == ops(theirs)
        assert weights(mine) == weights(theirs)


def test_genai_transcribes_the_sound_with_its_own_audio_processing_into_eager_greedy_tokens(whisper):
    import onnxruntime_genai as og

    model, _, folder, sound = whisper
    assert files(p.name for p in folder.iterdir()) == FILES
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "whisper" and config["encoder"]["filename"] == "encoder.onnx"
    assert config["decoder"]["inputs"]["cross_past_key_names"] == WHISPER_LAYOUT["cross_past_key"]
    assert config["encoder"]["outputs"]["cross_present_value_names"] == "present_value_cross_%d"
    assert (config["eos_token_id"], config["context_length"]) == (0, 448)
    tokens, features = sm.genai_transcribe(folder, sound, LENGTH)
    expected_features = sm.features(sm.sound())
    np.testing.assert_allclose(features, expected_features.numpy(), rtol=1e-4, atol=1e-4)  # GenAI's log-mel
    expected = sm.transcribe(model, expected_features, LENGTH)
    assert tokens == expected and len(set(expected[len(sm.PROMPT) :])) > 5  # varied tokens, not one repeated
    tokenizer = og.Tokenizer(og.Model(str(folder)))
    assert list(tokenizer.encode(sm.PROMPT_TEXT)) == sm.PROMPT


def ort_transcribe(folder, features: np.ndarray, length: int) -> list[int]:
    """A plain ONNX Runtime loop over the folder's models: the encoder once, then the decoder from
    the prompt, one token at a time, each call's present fed back as the next call's past."""
    encoder = onnxruntime.InferenceSession(str(folder / "encoder.onnx"))
    decoder = onnxruntime.InferenceSession(str(folder / "decoder.onnx"))
    _, *cross = encoder.run(None, {"audio_features": features})
    names = [i.name for i in decoder.get_inputs()]
    past = [np.zeros((1, 4, 0, 16), np.float32) for _ in range(4)]
    tokens, step = list(sm.PROMPT), np.array([sm.PROMPT], dtype=np.int64)
    while len(tokens) < length:
        logits, *past = decoder.run(None, dict(zip(names, [step, *past, *cross], strict=True)))
        tokens.append(int(logits[0, -1].argmax()))
        step = np.array([[tokens[-1]]], dtype=np.int64)
    return tokens


def test_int4_quantizes_both_models_like_the_builder_and_genai_runs_them(whisper, tmp_path):
    """``precision="int4"`` (ONNX Runtime's kernels): every linear layer of the encoder and decoder
    is a MatMulNBits of 4 bits in blocks of 32, accuracy level 4 (the builder's CPU settings); GenAI
    generates what a plain ONNX Runtime loop over the same two models does."""
    model, _, _, sound = whisper
    exported = opreg.llm.export_whisper(
        model, tmp_path, target="onnxruntime", precision="int4", tokenizer=sm.tokenizer()
    )
    for program in (exported.encoder, exported.decoder):
        nbits = [n for n in program.model.graph if n.op_type == "MatMulNBits"]
        settings = {tuple(n.attributes[a].as_int() for a in ("bits", "block_size", "accuracy_level")) for n in nbits}
        assert nbits and settings == {(4, 32, 4)}
        assert not [n for n in program.model.graph if n.op_type in ("MatMul", "Gemm") and n.inputs[1].is_initializer()]
    tokens, features = sm.genai_transcribe(tmp_path, sound, LENGTH)
    assert tokens == ort_transcribe(tmp_path, features, LENGTH)
    with pytest.raises(opreg.InvalidArgumentError, match="com.microsoft::MatMulNBits, which target 'onnx' does not"):
        opreg.llm.export_whisper(model, precision="int4")  # the standard target has no MatMulNBits
    with pytest.raises(opreg.InvalidArgumentError, match="precision= takes one of fp32, int8, int4, got 'int3'"):
        opreg.llm.export_whisper(model, precision="int3")


def test_cli_llm_export_picks_whisper_for_a_whisper_checkpoint(whisper, tmp_path, capsys):
    model, _, _, sound = whisper
    checkpoint = sm.checkpoint(model, tmp_path / "checkpoint")
    out = tmp_path / "out"
    code, stdout, _ = run(capsys, "llm", "export", str(checkpoint), "-o", str(out), "--verify", "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert files(summary["files"]) == FILES
    assert list(summary["models"]) == ["encoder.onnx", "decoder.onnx"] and summary["verified"] > 0
    assert summary["models"]["encoder.onnx"]["inputs"] == ["audio_features"]
    tokens, features = sm.genai_transcribe(out, sound, LENGTH)
    assert tokens == sm.transcribe(model, torch.from_numpy(features), LENGTH)


def test_a_whisper_checkpoint_is_refused_by_the_text_export_with_the_export_that_serves_it(tmp_path):
    """transformers maps Whisper's config to ``WhisperForCausalLM``: the text path would write a
    decoder without the encoder and its cross-attention, which GenAI runs and which transcribes nothing."""
    model = sm.whisper()
    model.save_pretrained(tmp_path / "checkpoint")
    with pytest.raises(opreg.ExportError, match="holds a WhisperForConditionalGeneration: it is an encoder-") as e:
        opreg.llm.export_decoder(tmp_path / "checkpoint", tmp_path / "out")
    assert "export it with opreg.llm.export_whisper (`opreg llm export` picks it)" in str(e.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(opreg.ExportError, match="the WhisperForConditionalGeneration given is an encoder-decoder"):
        opreg.llm.export_decoder(model)


def test_a_model_that_is_not_whisper_is_refused_and_so_is_a_feature_extractor_that_does_not_fit(whisper, tmp_path):
    from transformers import WhisperFeatureExtractor

    from tests import language_models as lm

    with pytest.raises(opreg.ExportError, match="the LlamaForCausalLM given is not a Whisper model"):
        opreg.llm.export_whisper(lm.causal_lm("llama"))
    _, exported, _, _ = whisper
    exported.feature_extractor = WhisperFeatureExtractor(feature_size=128)
    try:
        with pytest.raises(opreg.ExportError, match="makes 128 mel bins, the encoder takes 80"):
            exported.save(tmp_path / "out")
    finally:
        exported.feature_extractor = None
    assert not (tmp_path / "out").exists()


def test_a_vision_language_checkpoint_is_refused_by_the_text_export():
    """Gemma-3's vision-language model loads as a causal LM: its text decoder alone would take no images."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}  # fmt: skip
    model = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4))
    with pytest.raises(opreg.ExportError, match="is a vision-language model: export_decoder would export its text"):
        opreg.llm.export_decoder(model)
