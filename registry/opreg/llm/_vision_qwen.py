"""Qwen2.5-VL for ONNX Runtime GenAI's ``qwen2_5_vl`` pipeline.

Its vision encoder takes an image's patches ``[num_patches, channels * temporal * patch * patch]``
and its grid ``[1, 3]`` (GenAI runs it once per image) of any size. transformers computes what
depends on the grid's values (the patches' rotary positions, the windows and their attention
spans) with Python loops, and splits attention per window with ``lengths.tolist()``; its vision
utilities take those values precomputed (``transformers.vision_utils``), so the capture computes
them from the grid with tensor ops (:func:`grid_inputs`), and attention on the spans is one masked
attention over the whole image (:func:`span_attention`, in transformers' attention functions under
a flash name while the encoder is captured, which makes the encoder hand it the spans). The eager
model that :meth:`opreg.llm.VisionLanguage.verify` compares with runs transformers' own path.

The decoder takes 3-D positions ``[3, batch, sequence]`` (temporal, height, width), which GenAI
computes from the prompt and the grid as transformers' ``get_rope_index`` does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from opreg.llm._vision_architecture import IMAGE_TOKENS, Architecture, Layers, attending, recipe, resample

SPAN_ATTENTION = "opreg_flash_spans"
"""The name :func:`span_attention` is registered under while the encoder is captured (``flash`` in
it: the encoder then passes the spans it attends within)."""
PATCHES = "num_patches"


def span_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any = None,
                   scaling: float | None = None, dropout: float = 0.0, cu_seq_lens_q: Any = None, **kwargs: Any
                   ) -> tuple[torch.Tensor, None]:  # fmt: skip
    """Attention of each position to the positions of its span (``cu_seq_lens_q``: the spans'
    cumulative ends, zero-length spans allowed), as one attention with a block-diagonal mask;
    ``(batch, sequence, heads, size)`` as transformers' attention functions return it."""
    length = query.shape[2]
    span = (torch.arange(length, device=query.device)[:, None] >= cu_seq_lens_q[None, 1:]).sum(-1)
    mask = span[:, None] == span[None, :]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def patch_positions(grid: torch.Tensor, merge: int) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """One image's grid ``[[1, h, w]]``: ``h``, ``w`` and its patches' rows and columns, in the order
    the encoder takes them (merge blocks of ``merge`` x ``merge`` patches, row by row)."""
    t, h, w = grid[0, 0].item(), grid[0, 1].item(), grid[0, 2].item()
    torch._check(t == 1)  # an image: one temporal patch
    torch._check(h > 0)
    torch._check(w > 0)
    torch._check(h % merge == 0)
    torch._check(w % merge == 0)
    blocks = (h // merge, merge, w // merge, merge)
    rows = torch.arange(h).unsqueeze(1).expand(h, w).reshape(blocks).transpose(1, 2).flatten()
    columns = torch.arange(w).unsqueeze(0).expand(h, w).reshape(blocks).transpose(1, 2).flatten()
    return h, w, rows, columns


def grid_inputs(grid: torch.Tensor, merge: int, window: int) -> dict[str, Any]:
    """What transformers' vision utilities compute from one image's grid ``[[1, h, w]]``, with
    tensor ops torch.export captures: the patches' (row, column) positions in merge blocks, the
    order of the merged patches by window and the windows' cumulative ends (empty windows kept:
    :func:`span_attention` allows them), and the image's span."""
    h, w, rows, columns = patch_positions(grid, merge)
    merged_h, merged_w = h // merge, w // merge
    index = torch.arange(merged_h * merged_w).reshape(merged_h, merged_w)
    pad_h, pad_w = window - merged_h % window, window - merged_w % window  # as transformers pads: a whole window
    padded = F.pad(index, (0, pad_w, 0, pad_h), value=-100)
    windows_h, windows_w = (merged_h + pad_h) // window, (merged_w + pad_w) // window
    padded = padded.reshape(windows_h, window, windows_w, window).permute(0, 2, 1, 3)
    padded = padded.reshape(windows_h * windows_w, window, window)
    lengths = (padded != -100).sum([1, 2])
    flat = padded.reshape(-1)
    order = torch.argsort((flat == -100).to(torch.int32), stable=True)  # the padding last, the rest in order
    return {
        "position_ids": torch.stack([rows, columns], -1),
        "cu_seqlens": (torch.arange(2) * (h * w)).to(torch.int32),
        "window_index": flat[order[: merged_h * merged_w]],
        "cu_window_seqlens": F.pad(lengths.cumsum(0) * (merge * merge), (1, 0)).to(torch.int32),
        "max_seqlen": 1,  # given, so that the encoder reads no maximum from the spans (span_attention needs none)
        "max_window_seqlen": 1,
    }


class Qwen25VL(Architecture):
    """Qwen2.5-VL (see the module's docstring)."""

    model_types = ("qwen2_5_vl",)
    genai_type = "qwen2_5_vl"
    recipe_name = "qwen2_5_image_processor"
    """ONNX Runtime Extensions' name of the image recipe, and its Normalize step's flag."""
    vision_input_dims = ((PATCHES, None), (None, None))
    feature_dims = (IMAGE_TOKENS, None)

    def image_features(self, model: Any, pixel_values: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return model.model.visual(pixel_values, grid_thw=grid).pooler_output

    def captured_features(self, model: Any, pixel_values: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        visual = model.model.visual
        window = visual.window_size // visual.spatial_merge_size // visual.patch_size
        # on the instance the models read, for this call only: transformers' global mapping is left as it was
        with attending(visual.config, SPAN_ATTENTION, span_attention):
            precomputed = grid_inputs(grid, visual.spatial_merge_size, window)
            return visual(pixel_values, grid_thw=grid, **precomputed).pooler_output

    def vision_layers(self, model: Any) -> Layers:
        """The blocks; the full-attention ones attend within the image, the others within windows."""
        vision = model.config.vision_config
        full = frozenset(int(i) for i in vision.fullatt_block_indexes)
        return Layers("model.visual.blocks", int(vision.depth), full.__contains__)

    def _patch(self, model: Any) -> tuple[int, int]:
        vision = model.config.vision_config
        return int(vision.patch_size), int(vision.in_channels * vision.temporal_patch_size * vision.patch_size**2)

    def _pixels(self, model: Any, h: int, w: int, generator: torch.Generator | None = None) -> tuple:
        _, size = self._patch(model)
        pixels = torch.randn(h * w, size, generator=generator).to(model.dtype)
        return pixels, torch.tensor([[1, h, w]])

    def vision_example(self, model: Any) -> tuple[tuple, Any, list[str], tuple]:
        tokens = torch.export.Dim(IMAGE_TOKENS, min=2)
        merge = int(model.config.vision_config.spatial_merge_size)
        dims = {"pixel_values": {0: merge * merge * tokens}, "image_grid_thw": None}
        return self._pixels(model, 8, 12), dims, ["pixel_values", "image_grid_thw"], (IMAGE_TOKENS, None)

    def vision_samples(self, model: Any, generator: torch.Generator) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
        return [(f"grid {h}x{w}", self._pixels(model, h, w, generator)) for h, w in ((8, 12), (6, 10), (4, 4))]

    def prompt(self, model: Any, image_tokens: int, generator: torch.Generator) -> torch.Tensor:
        ids = super().prompt(model, image_tokens, generator)[0]
        start, end = model.config.vision_start_token_id, model.config.vision_end_token_id
        return torch.cat([ids[:3], torch.tensor([start]), ids[3:-2], torch.tensor([end]), ids[-2:]])[None]

    def forward_pixels(self, model: Any, input_ids: torch.Tensor, pixels: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        kinds = (input_ids == self.image_token_id(model)).int()
        return {"pixel_values": pixels[0], "image_grid_thw": pixels[1], "mm_token_type_ids": kinds}

    def positions(self, past: int, length: int, batch: int) -> torch.Tensor:
        return torch.arange(past, past + length).expand(3, batch, length).contiguous()

    def prompt_positions(self, model: Any, input_ids: torch.Tensor, pixels: tuple[torch.Tensor, ...]) -> torch.Tensor:
        kinds = (input_ids == self.image_token_id(model)).int()
        return model.model.get_rope_index(input_ids, mm_token_type_ids=kinds, image_grid_thw=pixels[1])[0]

    def genai(self, model: Any) -> dict[str, Any]:
        config, vision = model.config, model.config.vision_config
        return {
            "image_token_id": int(config.image_token_id), "video_token_id": int(config.video_token_id),
            "vision_start_token_id": int(config.vision_start_token_id),
            "vision": {"spatial_merge_size": int(vision.spatial_merge_size), "patch_size": int(vision.patch_size),
                       "tokens_per_second": float(getattr(vision, "tokens_per_second", 2)), **self.windows(model)},
        }  # fmt: skip

    def windows(self, model: Any) -> dict[str, int]:
        """``genai_config.json``'s window size (in pixels), for GenAI's window order."""
        return {"window_size": int(model.config.vision_config.window_size)}

    def default_image_processor(self, model: Any) -> Any:
        from transformers import Qwen2VLImageProcessor

        vision = model.config.vision_config
        return Qwen2VLImageProcessor(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                                     merge_size=vision.spatial_merge_size)  # fmt: skip

    def processor_config(self, processor: Any) -> dict[str, Any]:
        size, patch, merge = processor.size, int(processor.patch_size), int(processor.merge_size)
        temporal = int(processor.temporal_patch_size)
        resize = {"smart_resize": 1, "min_pixels": int(size["shortest_edge"]), "max_pixels": int(size["longest_edge"]),
                  "patch_size": patch, "merge_size": merge, "interpolation": resample(processor)}  # fmt: skip
        return recipe(self.recipe_name, [
            ("convert_to_rgb", "ConvertRGB", None),  # the channels in the order Normalize and PatchImage read here
            ("resize", "Resize", resize),
            ("rescale", "Rescale", {"rescale_factor": float(processor.rescale_factor)}),
            ("normalize", "Normalize", {"mean": list(processor.image_mean), "std": list(processor.image_std),
                                        self.genai_type: 1}),
            ("patch_image", "PatchImage", {"patch_size": patch, "temporal_patch_size": temporal, "merge_size": merge}),
        ])  # fmt: skip
