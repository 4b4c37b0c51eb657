"""A tiny Whisper, built here (nothing downloaded): for ``tests/test_llm_whisper.py``."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 310
START = 300
"""``<|startoftranscript|>``: the first of the special tokens that follow the text tokens."""


def whisper(seed: int = 0, **overrides: Any) -> Any:
    """A tiny ``WhisperForConditionalGeneration`` (d_model 64, 2 encoder and 2 decoder layers of 4
    heads, 80 mel bins, 30 s of audio as 3000 frames) with random weights (seeded), in ``eval()``."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    values = {
        "vocab_size": VOCAB, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "bos_token_id": 0,
        "eos_token_id": 0, "pad_token_id": 1, "decoder_start_token_id": START,
    }  # fmt: skip
    values.update(overrides)
    torch.manual_seed(seed)
    return WhisperForConditionalGeneration(WhisperConfig(**values)).eval()
