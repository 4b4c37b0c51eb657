"""Checking an exported vision-language model against transformers, and running its three models
in plain ONNX Runtime as GenAI's pipeline does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opreg.exporter import OutputCheck
from opreg.exporter._capture import TRACING_LOCK
from opreg.exporter.diagnosis.compare import compare_output
from opreg.llm._compare import compare_all, runnable
from opreg.llm._layout import LAYOUT

VisionLanguage = Any
"""An :class:`opreg.llm.VisionLanguage` (not imported: ``_vision`` imports this module)."""
DECODER_SHAPES = ((1, 1, 0), (1, 7, 0), (3, 1, 5), (3, 7, 5))
"""The decoder's ``(batch, sequence, past)`` checked: a prefill and a decode step, alone and batched."""


def run_decoder(vl: VisionLanguage, ids: torch.Tensor, embeds: torch.Tensor, mask: torch.Tensor,
                positions: torch.Tensor, past: Sequence[torch.Tensor]) -> Any:  # fmt: skip
    """The exported decoder in ONNX Runtime (the token ids given where the architecture reads them)."""
    extra = {"input_ids": ids} if vl.architecture.reads_input_ids else {}
    return vl.decoder.run(embeds, mask, positions, list(past), **extra)


def checks(vl: VisionLanguage, generator: torch.Generator, rtol: float, atol: float) -> list[OutputCheck]:
    """Every comparison :meth:`opreg.llm.VisionLanguage.verify` makes."""
    layout, image = vl.layout, vl.image_token_id
    width = vl.architecture.embeds_width(vl.model, layout.hidden_size)
    made: list[OutputCheck] = []
    for label, pixels in vl.architecture.vision_samples(vl.model, generator):
        made.append(compare_output(f"image_features ({label})", vl.vision.run(*pixels), vl.eager_vision(*pixels),
                                   rtol, atol))  # fmt: skip
    for batch, images in ((1, 2), (2, 0)):  # a prompt with images, a decode step without
        ids = torch.randint(0, layout.vocab_size, (batch, 5 + 2 * images), generator=generator)
        ids[ids == image] = 0
        ids[0, 2 : 2 + images] = image
        features = torch.randn(images, width, generator=generator).to(layout.dtype)
        leading = [1] if len(vl.architecture.feature_dims) == 3 else []
        features = features.reshape(*leading, images, width)
        label = f"inputs_embeds (batch {batch}, {images} image tokens)"
        got, expected = vl.embedding.run(ids, features), vl.eager_embedding(ids, features)
        made.append(compare_output(label, got, expected, rtol, atol))
    for batch, length, past in runnable(vl.decoder, DECODER_SHAPES):
        ids = torch.randint(0, layout.vocab_size, (batch, length), generator=generator)
        ids[:, length // 2 : length // 2 + 2] = image  # image tokens in the prompt: Gemma-3 lets them see each other
        embeds = torch.randn(batch, length, width, generator=generator).to(layout.dtype)
        mask = torch.ones(batch, past + length, dtype=torch.int64)
        positions = vl.architecture.positions(past, length, batch)
        cache = layout.empty_cache(batch)  # a prefill's: a convolution's state is zeros
        if past:
            cache = [torch.randn(t.shape(batch, past), generator=generator).to(layout.dtype) for _, t in layout.cache]
        got, expected = (
            run_decoder(vl, ids, embeds, mask, positions, cache),
            vl.eager_decoder(ids, embeds, mask, positions, cache),
        )
        label = f"batch {batch}, sequence {length}, past {past}"
        mine, theirs = [got["logits"], *got["present"]], [expected["logits"], *expected["present"]]
        made += compare_all(label, layout.output_names, mine, theirs, rtol, atol)
    made.append(_whole(vl, generator, rtol, atol))
    return made


def _whole(vl: VisionLanguage, generator: torch.Generator, rtol: float, atol: float) -> OutputCheck:
    """An image and a prompt through the three models, against the transformers model's forward."""
    _, pixels = next(iter(vl.architecture.vision_samples(vl.model, generator)))
    features = vl.vision.run(*pixels)
    ids = vl.architecture.prompt(vl.model, features.reshape(-1, features.shape[-1]).shape[0], generator)
    embeds = vl.embedding.run(ids, features)
    positions = vl.architecture.prompt_positions(vl.model, ids, pixels)
    past = vl.layout.empty_cache(1)
    mask = torch.ones_like(ids)
    logits = run_decoder(vl, ids, embeds, mask, positions, past)["logits"]
    with TRACING_LOCK, torch.no_grad():
        expected = vl.model(input_ids=ids, attention_mask=mask, **vl.architecture.forward_pixels(vl.model, ids, pixels))
    return compare_output(f"{LAYOUT['logits']} (an image and a prompt of {ids.shape[1]} tokens)", logits,
                          expected.logits, rtol, atol)  # fmt: skip


def greedy(vl: VisionLanguage, input_ids: torch.Tensor, pixels: Sequence[torch.Tensor], length: int) -> list[int]:
    """A plain ONNX Runtime loop: the vision encoder once, then per step the embedding (image
    features for the prompt, none after) and the decoder, each step's present fed back as past."""
    layout = vl.layout
    features = vl.vision.run(*pixels)
    none = features[..., :0, :] if features.dim() == 3 else features[:0]
    tokens = input_ids[0].tolist()
    past = layout.empty_cache(1)
    positions = vl.architecture.prompt_positions(vl.model, input_ids, pixels)
    step, step_features = input_ids, features
    while len(tokens) < length:
        total = layout.past_length(past) + step.shape[1]
        embeds = vl.embedding.run(step, step_features)
        out = run_decoder(vl, step, embeds, torch.ones(1, total, dtype=torch.int64), positions, past)
        tokens.append(int(out["logits"][0, -1].argmax()))
        past, step, step_features = out["present"], torch.tensor([[tokens[-1]]]), none
        positions = vl.architecture.next_positions(positions)
    return tokens
