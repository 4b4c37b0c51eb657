"""Phi-4-multimodal (``Phi4MultimodalForCausalLM``): its vision part and its language model.

Its image processor cuts an image into a grid of crops of ``crop_size`` (as many as the image's
aspect and ``dynamic_hd`` allow), padded on the right and at the bottom, plus the whole image
resized to one crop first; the vision encoder (SigLIP) runs on each crop, pooled 2x2 to ``base x
base`` features, and transformers lays the crops' features out as one grid, trimmed to the
unpadded rows and columns (read from the mask), each row closed by a learnt separator, then the
separator of the whole image and its own grid. transformers reads the grid and the trimmed sizes
from the values of ``image_sizes`` and of the mask (``int(mask.sum().item())``), in a loop over
the images, which torch.export cannot capture (``GuardOnDataDependentSymNode``). The capture
computes the same layout with tensor ops (:func:`layout_index`): every candidate position of the
largest grid the number of crops allows, a gather for each, and the unpadded ones selected (their
number is data-dependent: ONNX's ``NonZero``). One image a run (``[1, crops, 3, crop, crop]``):
the crops of several images are padded to one count. Audio is left out: the decoder takes the
image's embeddings, the audio encoder and its LoRA are not exported.

The decoder is Phi-3's (``model.layers``); the image token is ``vision_config.image_token_id``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.llm._vision_architecture import IMAGE_TOKENS, Architecture

CROPS = "num_crops"


def position_ids(mask: torch.Tensor, side: int) -> torch.Tensor:
    """``Phi4MultimodalVisionEmbeddings``' position ids with tensor ops: each crop's unpadded patches
    (``mask`` ``[crops, rows, columns]``) spread over the ``side x side`` table, bucketed as
    ``torch.bucketize(..., right=True)`` buckets (the count of boundaries at or below), 0 for padding."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    rows, columns = mask.shape[1], mask.shape[2]

    def buckets(count: torch.Tensor, length: int) -> torch.Tensor:
        fractions = torch.clamp(torch.arange(length, dtype=torch.float32)[None, :] / count[:, None], max=1.0 - 1e-6)
        return (fractions[..., None] >= boundaries).sum(-1)

    by_row, by_column = buckets(mask[:, :, 0].sum(1), rows), buckets(mask[:, 0, :].sum(1), columns)
    ids = (by_row[:, :, None] * side + by_column[:, None, :]).reshape(mask.shape[0], -1)
    return torch.where(mask.reshape(mask.shape[0], -1), ids, 0)


def layout_index(sizes: torch.Tensor, mask: torch.Tensor, crop: int, base: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which crop feature each image token of the crops' grid takes, ``-1`` for a row's separator,
    and which of the candidates are tokens. ``sizes``: the image's ``(height, width)``; ``mask``:
    the image processor's patch mask, ``[1 + crops, 2 * base, 2 * base]`` (the whole image's
    first), read at the pooled features' patches (every other one) by index, not by a strided
    view (whose contiguity check would fix a crop count of 2). Candidates: ``crops * base`` rows of
    ``width + 1`` positions, row-major (the grid's rows and columns, ``height x width`` crops of
    ``base`` features, as transformers reads them from ``sizes``)."""
    crops = mask.shape[0] - 1
    high, wide = sizes[0] // crop, sizes[1] // crop
    columns = wide * base + 1
    candidate = torch.arange(crops * base * (crops * base + 1))
    row, column = candidate // columns, candidate % columns
    span = torch.arange(crops * base)
    # transformers' useful height and width: the unpadded features down the first column and along the first row
    used_rows = torch.where(span < high * base, mask[1 + (span // base) * wide % crops, 2 * (span % base), 0], 0).sum()
    used_columns = torch.where(span < wide * base, mask[1 + span // base % crops, 0, 2 * (span % base)], 0).sum()
    separator = column == wide * base
    token = (row < used_rows) & ((column < used_columns) | separator)
    source = ((row // base) * wide + column // base) * base * base + (row % base) * base + column % base
    return torch.where(separator, -1, source), token


@contextlib.contextmanager
def bidirectional(model: Any) -> Iterator[None]:
    """The vision encoder's attention bidirectional, as SigLIP's and the checkpoint's: transformers
    5.17 marks it causal (``is_causal = True``), which its SDPA path applies when it drops an
    all-ones mask (no crop padded) and nowhere else; the export materialises the mask, so its
    attention is bidirectional whatever the padding."""
    attentions = [layer.self_attn for layer in model.model.embed_tokens_extend.image_embed.img_processor.encoder.layers]
    before = [attention.is_causal for attention in attentions]
    try:
        for attention in attentions:
            attention.is_causal = False
        yield
    finally:
        for attention, causal in zip(attentions, before, strict=True):
            attention.is_causal = causal


class Phi4Multimodal(Architecture):
    """Phi-4-multimodal's vision part (see the module's docstring)."""

    model_types = ("phi4_multimodal",)
    text_layers = "model.layers"
    vision_input_dims = ((None, CROPS, None, None, None), (None, None), (None, CROPS, None, None))  # one image
    feature_dims = (IMAGE_TOKENS, None)

    def image_token_id(self, model: Any) -> int:
        return int(model.config.vision_config.image_token_id)

    def image_size(self, model: Any) -> int:
        return int(model.config.vision_config.crop_size)

    def check(self, model: Any) -> None:
        vision = model.config.vision_config
        side = int(vision.image_size) // int(vision.patch_size)
        if side % 2 or int(vision.image_size) != int(vision.crop_size):
            raise ExportError(
                f"{type(model).__name__}'s vision encoder takes {vision.image_size}-pixel images in patches of "
                f"{vision.patch_size} and crops of {vision.crop_size}: export_vision lays out an even patch grid the "
                "size of a crop (as Phi-4-multimodal's, 448 in patches of 14)"
            )

    def check_processor(self, model: Any, processor: Any) -> None:
        vision = model.config.vision_config
        pairs = (("patch_size", vision.patch_size), ("size", {"height": vision.crop_size, "width": vision.crop_size}))
        for name, taken in pairs:
            made = getattr(processor, name, None)
            made = {"height": made["height"], "width": made["width"]} if name == "size" and made else made
            if made is not None and made != taken:
                raise ExportError(
                    f"the image processor's {name} is {made}, the model's {taken}: give the model's own image "
                    "processor (image_processor=, or the checkpoint folder's)"
                )

    def embedder(self, model: Any) -> Any:
        return model.model.embed_tokens_extend.image_embed

    def base(self, model: Any) -> int:
        """The side of a crop's pooled grid of features."""
        return self.image_size(model) // int(model.config.vision_config.patch_size) // 2

    def token_count(self, model: Any, sizes: torch.Tensor, mask: torch.Tensor) -> int:
        """The image's tokens, as transformers lays them out (eager)."""
        base = self.base(model)
        return int(layout_index(sizes[0], mask[0], self.image_size(model), base)[1].sum()) + 1 + base * (base + 1)

    def image_features(self, model: Any, pixel_values: torch.Tensor, sizes: torch.Tensor, mask: torch.Tensor
                       ) -> torch.Tensor:  # fmt: skip
        """transformers' own path: the image embedding on a prompt of image tokens only, its vision
        attention bidirectional (:func:`bidirectional`)."""
        count, hidden = self.token_count(model, sizes, mask), int(model.config.hidden_size)
        ids = torch.full((1, count), self.image_token_id(model))
        blank = torch.zeros(1, count, hidden, dtype=model.dtype)
        with bidirectional(model):
            return self.embedder(model)(ids, blank, pixel_values, sizes, mask)[0]

    def captured_features(self, model: Any, pixel_values: torch.Tensor, sizes: torch.Tensor, mask: torch.Tensor
                          ) -> torch.Tensor:  # fmt: skip
        """Each crop's pooled features (the embeddings' position ids by :func:`position_ids`, on the
        instance for this call only), laid out by :func:`layout_index`, then the projection."""
        embed = self.embedder(model)
        embeddings = embed.img_processor.embeddings
        side = embeddings.num_patches_per_side
        patch_mask = mask[0].to(torch.bool)

        def forward(pixel_values: torch.Tensor, patch_attention_mask: torch.Tensor) -> torch.Tensor:
            patches = embeddings.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
            return patches + embeddings.position_embedding(position_ids(patch_attention_mask, side))

        embeddings.forward = forward
        try:
            pooled = embed.get_img_features(pixel_values[0], attention_mask=patch_mask)
        finally:
            del embeddings.forward
        base, dim = self.base(model), pooled.shape[-1]
        index, token = layout_index(sizes[0], patch_mask.to(torch.int64), self.image_size(model), base)
        flat = pooled.reshape(-1, dim)  # not pooled[1:]: a slice's contiguity check fixes a crop count of 2
        separator = embed.sub_img_feature_extensor.reshape(1, dim)
        index = index[token.nonzero().squeeze(1)]  # the tokens' (data-dependent count), before any gather
        picked = torch.where((index < 0)[:, None], separator, flat[index.clamp(min=0) + base * base])
        whole = torch.cat([pooled[0].reshape(base, base, dim), separator.expand(base, 1, dim)], dim=1)
        features = torch.cat([picked, embed.global_img_feature_extensor.reshape(1, dim), whole.reshape(-1, dim)])
        return embed.img_projection_down(torch.nn.functional.gelu(embed.img_projection_up(features)))

    def vision_step(self, model: Any) -> torch.nn.Module:
        return Phi4VisionStep(model, self)

    def pixels(self, model: Any, high: int, wide: int, padded: tuple[int, int] = (0, 0),
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:  # fmt: skip
        """One image of ``high x wide`` crops as the image processor makes it, its last ``padded``
        (rows, columns) of patches padding."""
        crop, patch = self.image_size(model), int(model.config.vision_config.patch_size)
        side = crop // patch
        grid = torch.ones(high * side, wide * side)
        grid[grid.shape[0] - padded[0] :] = 0
        grid[:, grid.shape[1] - padded[1] :] = 0
        crops = grid.reshape(high, side, wide, side).transpose(1, 2).reshape(-1, side, side)
        mask = torch.cat([torch.ones(1, side, side), crops])[None]
        pixels = torch.randn(1, 1 + high * wide, 3, crop, crop, generator=generator).to(model.dtype)
        return pixels, torch.tensor([[high * crop, wide * crop]]), mask

    def vision_example(self, model: Any) -> tuple[tuple, Any, list[str], tuple]:
        dims = {"pixel_values": {1: torch.export.Dim(CROPS, min=2)}, "image_sizes": None,
                "image_attention_mask": {1: torch.export.Dim(CROPS, min=2)}}  # fmt: skip
        names = ["pixel_values", "image_sizes", "image_attention_mask"]
        return self.pixels(model, 2, 3, (2, 3)), dims, names, (IMAGE_TOKENS, None)

    def vision_samples(self, model: Any, generator: torch.Generator) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
        # the first, which verify also runs through the model's forward, padded: transformers' vision attention
        # is bidirectional only then (:func:`bidirectional`)
        grids = (((2, 1), (3, 0)), ((1, 1), (0, 0)), ((1, 3), (0, 5)), ((2, 2), (1, 1)))
        return [(f"{h}x{w} crops, padding {p}x{q}", self.pixels(model, h, w, (p, q), generator))
                for (h, w), (p, q) in grids]  # fmt: skip

    def forward_pixels(self, model: Any, input_ids: torch.Tensor, pixels: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        return {"image_pixel_values": pixels[0], "image_sizes": pixels[1], "image_attention_mask": pixels[2]}

    def default_image_processor(self, model: Any) -> Any:
        from transformers import Phi4MultimodalImageProcessor

        size, patch = self.image_size(model), int(model.config.vision_config.patch_size)
        return Phi4MultimodalImageProcessor(size={"height": size, "width": size}, patch_size=patch)

    def processor_config(self, processor: Any) -> None:
        return None


class Phi4VisionStep(torch.nn.Module):
    """``forward(pixel_values, image_sizes, image_attention_mask)``: an image's features
    (:meth:`Phi4Multimodal.captured_features`)."""

    def __init__(self, model: torch.nn.Module, architecture: Phi4Multimodal) -> None:
        super().__init__()
        self.model, self.architecture = model, architecture

    def forward(self, pixel_values: torch.Tensor, image_sizes: torch.Tensor, image_attention_mask: torch.Tensor
                ) -> torch.Tensor:  # fmt: skip
        return self.architecture.captured_features(self.model, pixel_values, image_sizes, image_attention_mask)
