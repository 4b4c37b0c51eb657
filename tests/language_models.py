"""Tiny transformers causal LMs and a tokenizer, built here (nothing downloaded): for the
language-model tests (``tests/test_llm.py``) and ``bench/llm_models.py``.

:func:`causal_lm` builds any ``*ForCausalLM`` of transformers' causal-LM mapping from its
default config shrunk to :data:`SMALL` (only the keys the config has), plus the overrides of
:data:`SAMPLE` for the architectures the issue names. :func:`tokenizer` trains a byte-level BPE
of :data:`VOCAB` tokens on a fixed text; ONNX Runtime GenAI reads it as transformers does.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

VOCAB = 300
EOS, PAD = 0, 1
"""The tokenizer's ``<|endoftext|>`` and ``<pad>`` ids."""
SMALL: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "n_embd": 64,
    "d_model": 64,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "num_layers": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rotary_dim": 16,
    "intermediate_size": 128,
    "ffn_dim": 128,
    "n_inner": 128,
    "ffn_hidden_size": 128,
    "max_position_embeddings": 256,
    "n_positions": 256,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "bos_token_id": EOS,
    "eos_token_id": EOS,
    "pad_token_id": PAD,
}
"""Config values of a tiny model; each is set when the architecture's config has the key."""
SAMPLE: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": 4},  # shorter than the tests' sequences: the window matters
    "qwen2": {},
    "qwen3": {},
    "phi3": {},
    "gemma2": {"sliding_window": 4},
    "gemma3_text": {"sliding_window": 4},
    "gpt_neox": {"rotary_pct": 0.5},  # partial rotary
    "falcon": {},
    "olmo": {},
    "olmo2": {},
    "mixtral": {},
    "qwen2_moe": {"decoder_sparse_step": 1, "mlp_only_layers": []},
    "mamba": {"state_size": 8, "expand": 2},
    "gpt2": {},
    "phi": {},
    "stablelm": {},
    "granite": {},
    "starcoder2": {},
    "gemma": {},
    "smollm3": {},
    "bloom": {},
    "opt": {},
    "gptj": {},
    "codegen": {},
    "gpt_bigcode": {},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # one pair for 2 layers
    "mpt": {},
    "cohere": {},
    "cohere2": {"sliding_window": 4},
    "qwen3_moe": {},
    "glm4": {},
    "exaone4": {"sliding_window": 4, "sliding_window_pattern": 2},  # a sliding layer, then a full one
    "ernie4_5": {},
    "hunyuan_v1_dense": {},
    "granitemoe": {},
    "nemotron": {},
    "gpt_oss": {"sliding_window": 4},  # sliding and full layers, attention sinks, experts
    "phimoe": {},
    "olmoe": {},
    "llama4_text": {"attention_chunk_size": 4, "no_rope_layer_interval": 2},  # chunked + rotary, then full, no rotary
    "apertus": {},
    "seed_oss": {},
    "arcee": {},
    "lfm2": {"layer_types": ["conv", "full_attention"]},  # a short convolution, then attention
}
"""The architectures the issue names (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma-2, Gemma-3,
GPT-NeoX, Falcon, OLMo, a mixture of experts, a state-space model), others GenAI's builder
knows, other common causal LMs, and newer ones (from Qwen3-MoE on), by ``model_type``, with
what their tiny config needs besides :data:`SMALL` (``bench/llm_models.py`` runs them all)."""


def config(model_type: str, **overrides: Any) -> Any:
    """The tiny config of ``model_type``."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    defaults = config_class().to_dict()
    values = {key: value for key, value in SMALL.items() if key in defaults}
    values.update(SAMPLE.get(model_type, {}))
    values.update(overrides)
    return config_class(**values)


def causal_lm(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """A tiny ``model_type`` causal LM with random weights (seeded), in ``eval()`` mode, in
    float32, greedy generation configured."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(model_type, **overrides), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    model.generation_config.bos_token_id = EOS
    model.generation_config.do_sample = False
    return model


TEXT = (
    "the quick brown fox jumps over the lazy dog. hello world, this is a tiny tokenizer for tests. "
    "language models predict the next token from the tokens before it; a decoder keeps a cache of keys "
    "and values so that each new token reads the past without computing it again."
)


@functools.cache
def _tokenizer_object() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>", "<pad>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tokenizer.train_from_iterator([TEXT] * 20, trainer)
    return tokenizer


def tokenizer() -> Any:
    """A byte-level BPE tokenizer of :data:`VOCAB` tokens (``<|endoftext|>`` is :data:`EOS`)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=_tokenizer_object(), eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<pad>"
    )


def checkpoint(model: Any, folder: Path) -> Path:
    """Save ``model`` and :func:`tokenizer` as a transformers checkpoint folder."""
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


def greedy(model: Any, prompt: list[int], length: int) -> list[int]:
    """transformers' greedy ``generate``: the prompt and what follows, ``length`` tokens in all."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_length=length, do_sample=False)
    return out[0].tolist()


def genai_greedy(folder: Path, prompt: list[int], length: int) -> list[int]:
    """ONNX Runtime GenAI's greedy generation from the model folder ``folder``."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens([prompt])
    while not generator.is_done():
        generator.generate_next_token()
    return [int(token) for token in generator.get_sequence(0)]
