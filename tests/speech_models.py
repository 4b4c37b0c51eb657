"""A tiny Whisper, its tokenizer and a sound, built here (nothing downloaded): for
``tests/test_llm_whisper.py`` and ``bench/whisper.py``.

:func:`whisper` is random-init with weights of std 0.3 (Whisper's 0.02 makes a random model say
one token forever); its generation config suppresses no tokens (GenAI applies no such list).
:func:`tokenizer` is the text tests' byte-level BPE (``tests/language_models.py``) with Whisper's
task tokens after its 300 text tokens. :func:`write_sound` writes a 3 s, 16 kHz sound (two
tones and noise) that starts and ends in silence, where GenAI's features and transformers' agree.
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests import language_models as lm

VOCAB = 310
SPECIALS = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|translate|>", "<|notimestamps|>")
START = lm.VOCAB
"""``<|startoftranscript|>``: the first of :data:`SPECIALS`, which follow the text tokens."""
PROMPT = [START, START + 1, START + 2, START + 4]
"""``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``: what a transcription starts from."""
PROMPT_TEXT = "".join(SPECIALS[i] for i in (0, 1, 2, 4))
RATE = 16000


def whisper(seed: int = 0, **overrides: Any) -> Any:
    """A tiny ``WhisperForConditionalGeneration`` (d_model 64, 2 encoder and 2 decoder layers of 4
    heads, 80 mel bins, 30 s of audio as 3000 frames) with random weights (seeded), in ``eval()``."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    values = {
        "vocab_size": VOCAB, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "bos_token_id": lm.EOS,
        "eos_token_id": lm.EOS, "pad_token_id": lm.PAD, "decoder_start_token_id": START, "init_std": 0.3,
    }  # fmt: skip
    values.update(overrides)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(WhisperConfig(**values)).eval()
    model.generation_config.begin_suppress_tokens = None
    model.generation_config.suppress_tokens = None
    return model


def tokenizer() -> Any:
    """The text tests' tokenizer with :data:`SPECIALS` added (ids 300-304)."""
    words = lm.tokenizer()
    words.add_special_tokens({"additional_special_tokens": list(SPECIALS)})
    return words


def checkpoint(model: Any, folder: Path) -> Path:
    """Save ``model``, :func:`tokenizer` and Whisper's feature extractor as a checkpoint folder."""
    from transformers import WhisperFeatureExtractor

    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=model.config.num_mel_bins).save_pretrained(folder)
    return folder


def sound(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """16-bit samples at 16 kHz: two tones (one gliding) and noise, faded in after 0.25 s and out
    0.25 s before the end."""
    t = np.arange(int(seconds * RATE)) / RATE
    noise = np.random.default_rng(seed).standard_normal(t.size)
    wave_ = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t * (1 + t / 6)) + 0.05 * noise
    envelope = np.clip(np.minimum(t - 0.25, seconds - 0.25 - t) / 0.05, 0, 1)
    return (np.clip(wave_ * envelope, -1, 1) * 32767).astype(np.int16)


def write_sound(path: Path, samples: np.ndarray) -> Path:
    """``samples`` as a mono 16 kHz WAV file."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(samples.tobytes())
    return path


def features(samples: np.ndarray, num_mel_bins: int = 80) -> torch.Tensor:
    """transformers' log-mel features of ``samples`` (``[1, num_mel_bins, 3000]``)."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=num_mel_bins)
    return extractor(samples.astype(np.float32) / 32768, sampling_rate=RATE, return_tensors="pt").input_features


def transcribe(model: Any, features: torch.Tensor, length: int) -> list[int]:
    """transformers' greedy ``generate`` from :data:`PROMPT`: the prompt and what follows, ``length``
    tokens in all."""
    prompt = torch.tensor([PROMPT])
    with torch.no_grad():
        out = model.generate(features, decoder_input_ids=prompt, max_new_tokens=length - len(PROMPT), do_sample=False)
    return PROMPT + out[0].tolist()


def genai_transcribe(folder: Path, sound_file: Path, length: int) -> tuple[list[int], np.ndarray]:
    """ONNX Runtime GenAI's greedy transcription of ``sound_file`` (its own audio processing, the
    prompt :data:`PROMPT_TEXT`): the tokens, and the features its processor made."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    processor = model.create_multimodal_processor()
    inputs = processor(PROMPT_TEXT, audios=og.Audios.open(str(sound_file)))
    features = inputs["audio_features"].as_numpy().copy()  # the generator takes the tensors over
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=length)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(token) for token in generator.get_sequence(0)], features
