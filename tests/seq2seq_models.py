"""Tiny encoder-decoder checkpoints (T5, mT5, BART, mBART, Marian, M2M100, Pegasus, Blenderbot and
Blenderbot-small) with a tokenizer, built here (nothing downloaded), and the two ends the tests
compare: transformers' ``generate`` on the checkpoint and transformers.js's text2text-generation
pipeline on an exported folder (``tests/transformersjs/pipeline.mjs``). For
``tests/test_checkpoint_seq2seq.py``, and for whoever runs transformers.js on seq2seq folders
(bench/, the suite's runtime tests).

Every family shares one word-level tokenizer of :data:`VOCAB` tokens (``<s>``, ``<pad>``, ``</s>``,
``<unk>`` first: the ids the configs use) and the sizes of :data:`SIZES`; T5's relative attention
has 8 buckets up to a distance of 20, so 24 greedy steps cross its exact, logarithmic and clamped
buckets. A tiny random model generates its start token over and over (T5, BART) or one token
(M2M100): its token's own embedding outweighs what its layers add. A decoder fed one token at every
position hides wrong positions (T5 has no other: a bucket counted from the wrong place changes
nothing when every key is the same), so the output embeddings here are not tied to the input ones
(T5 always ties them: its embeddings are shrunk tenfold instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FAMILIES = ("t5", "mt5", "bart", "mbart", "marian", "m2m_100", "pegasus", "blenderbot", "blenderbot-small")
BOS, PAD, EOS, UNK = 0, 1, 2, 3
WORDS = ["<s>", "<pad>", "</s>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "and"]
VOCAB = 64
SIZES = dict(
    vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
    decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
    bos_token_id=BOS, pad_token_id=PAD, eos_token_id=EOS,
)  # fmt: skip


def config(model_type: str) -> Any:
    """A tiny config of ``model_type``, its decoder starting as the family's checkpoints do."""
    import transformers

    if model_type in ("t5", "mt5"):
        return transformers.AutoConfig.for_model(
            model_type,
            vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=37, num_layers=2, num_heads=2,
            relative_attention_num_buckets=8, relative_attention_max_distance=20,
            pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
        )  # fmt: skip
    start = PAD if model_type in ("marian", "pegasus") else EOS
    extra = {"forced_eos_token_id": EOS} if model_type == "bart" else {}
    return transformers.AutoConfig.for_model(
        model_type, **SIZES, decoder_start_token_id=start, tie_word_embeddings=False, **extra
    )


def tokenizer() -> Any:
    """The word-level tokenizer every family here uses (an end token after each text)."""
    import tokenizers
    import transformers
    from tokenizers import models, pre_tokenizers, processors

    words = WORDS + [f"w{i}" for i in range(VOCAB - len(WORDS))]
    model = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def checkpoint(model_type: str, folder: Path, seed: int = 0, auto: str = "AutoModelForSeq2SeqLM") -> Path:
    """A random ``model_type`` seq2seq LM (or the transformers ``auto`` class's model) and the
    tokenizer, saved with ``save_pretrained``."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, auto).from_config(config(model_type))
    if model_type in ("t5", "mt5"):
        with torch.no_grad():
            model.shared.weight.mul_(0.1)
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


def eager(folder: Path, texts: list[str], generate: dict[str, Any]) -> list[list[int]]:
    """``generate``'s tokens for ``texts`` (padded together) from the checkpoint ``folder``, its
    generation config applied, as the pipeline applies the exported folder's copy."""
    import transformers

    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    inputs = transformers.AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, num_beams=1, **generate).tolist()


def transformersjs(
    folder: Path, texts: list[str], generate: dict[str, Any], tjs: Path, task: str = "text2text-generation"
) -> dict[str, Any]:
    """tests/transformersjs/pipeline.mjs's answer on ``folder`` for ``task`` (``text-generation`` for a
    causal LM), transformers.js in ``tjs``: ``tokens`` (``generate``'s ids), ``texts`` (the
    pipeline's), ``input_ids``, ``versions``."""
    from tests import transformersjs_runtime

    return transformersjs_runtime.run("pipeline.mjs", folder, {"task": task, "texts": texts, "generate": generate}, tjs)
