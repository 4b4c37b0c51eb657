"""A small Llama briefly trained on text from a random Markov chain, and held-out text of the same chain:
what bench/llm.py (part 7, accuracy) and bench/big_streaming.py (int4 streamed against fp32) compare
quantized exports on. Random-init logits are nearly flat (their argmax says nothing about
quantization); a trained model's are not."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bench.ort_contrib import _quiet

HELD_OUT = 64
"""Held-out texts (of 128 tokens each) :func:`trained_checkpoint` returns."""

TRAINED = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 512}  # fmt: skip
"""A small Llama trained on text from a random Markov chain: random-init logits are nearly flat (their
argmax says nothing about quantization), a trained model's are not."""


def _chain(rng, vocab: int) -> np.ndarray:
    """Each token's next-token probabilities: four likely successors (0.55, 0.25, 0.1, 0.05), the rest rare."""
    table = np.full((vocab, vocab), 0.05 / (vocab - 4))
    for token in range(vocab):
        table[token, rng.choice(vocab, 4, replace=False)] = (0.55, 0.25, 0.1, 0.05)
    return table / table.sum(1, keepdims=True)


def _text(rng, table: np.ndarray, rows: int, length: int) -> np.ndarray:
    tokens = np.empty((rows, length), np.int64)
    tokens[:, 0] = rng.integers(3, len(table), rows)
    cumulative = table.cumsum(1)
    for step in range(1, length):
        draws = rng.random(rows)[:, None]
        tokens[:, step] = np.minimum((draws > cumulative[tokens[:, step - 1]]).sum(1), len(table) - 1)
    return tokens


def trained_checkpoint(folder: Path, steps: int) -> tuple[Path, np.ndarray]:
    """The small Llama of :data:`TRAINED` after ``steps`` steps of AdamW on the chain's text, saved
    (once per ``steps``, under ``folder``) with a word-level tokenizer; and held-out text."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = np.random.default_rng(5)
    table = _chain(rng, TRAINED["vocab_size"])
    held_out = _text(np.random.default_rng(6), table, HELD_OUT, 128)
    entropy = -(table * np.log(table)).sum(1).mean()
    folder = folder / f"steps_{steps}"
    if (folder / "config.json").is_file():
        print(f"   trained {steps} steps (kept from an earlier run in {folder})")
        return folder, held_out
    torch.manual_seed(0)
    config = LlamaConfig(**TRAINED, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    started = time.process_time()
    for _ in range(steps):
        batch = torch.from_numpy(_text(rng, table, 32, 64))
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"   trained {steps} steps in {time.process_time() - started:.0f} CPU s: loss {loss.item():.2f} (the "
          f"chain's entropy is {entropy:.2f}: perplexity {np.exp(entropy):.3f} at best)")  # fmt: skip
    with _quiet():
        model.eval().save_pretrained(folder)
    vocab = TRAINED["vocab_size"]
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, bos_token="t1", eos_token="t2", pad_token="t0").save_pretrained(
        folder
    )
    return folder, held_out
