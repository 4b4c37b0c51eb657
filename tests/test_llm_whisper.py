"""Speech models for ONNX Runtime GenAI: a Whisper checkpoint is refused by the text decoder's
export with the reason (transformers would load its decoder alone, without its encoder).

A tiny random-init Whisper (tests/speech_models.py): nothing is downloaded.
"""

from __future__ import annotations

import pytest

import opreg
from tests import speech_models
from tests.test_cli import run


def test_a_whisper_checkpoint_is_refused_by_the_text_export_before_anything_is_written(tmp_path, capsys):
    """transformers maps Whisper's config to ``WhisperForCausalLM``: the text path would write a
    decoder without the encoder and its cross-attention, which GenAI runs and which transcribes nothing."""
    model = speech_models.whisper()
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    out = tmp_path / "out"
    code, _, err = run(capsys, "llm", "export", str(checkpoint), "-o", str(out))
    assert code != 0 and "holds a WhisperForConditionalGeneration: it is an encoder-decoder model" in err
    assert "without the encoder whose output its cross-attention reads" in err
    assert not out.exists()
    with pytest.raises(opreg.ExportError, match="the WhisperForConditionalGeneration given is an encoder-decoder"):
        opreg.llm.export_decoder(model)


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
