"""Qwen3-VL: Qwen2.5-VL's layout (:mod:`opreg.llm._vision_qwen`) plus deepstack.

Its vision encoder attends within the whole image in every block (no windows), adds a learned
position table resampled to the image's grid (bilinear, corners aligned; the capture computes the
taps and weights from the grid with tensor ops, as transformers' vision utilities do for many
images with ``repeat_interleave``), and returns, besides the image features, the features after
each of its ``deepstack_visual_indexes`` blocks (each through its own merger). transformers adds
those to the hidden states of the first text layers at the image tokens (deepstack).

The three models carry them in one tensor: the vision encoder returns ``[num_image_tokens,
hidden * (1 + deepstack)]`` (the features, then each deepstack feature), the embedding model
scatters those rows over the image tokens of ``[batch, sequence, hidden * (1 + deepstack)]``
(a text token's embedding, then zeros), and the decoder adds part ``i + 1`` to the output of
layer ``i`` (zeros but at image tokens: transformers' own sum there). GenAI's ``qwen3_vl``
pipeline runs it unchanged, its embeddings as wide as ``genai_config.json``'s
``decoder.hidden_size`` says.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.llm._vision_architecture import Layers, attending, whole_attention
from opreg.llm._vision_mistral import WHOLE_ATTENTION
from opreg.llm._vision_qwen import Qwen25VL, patch_positions


def interpolation(rows: torch.Tensor, columns: torch.Tensor, h: Any, w: Any, side: int) -> dict[str, torch.Tensor]:
    """The taps into a ``side`` x ``side`` position table and their weights for each patch at ``rows``,
    ``columns`` of an ``h`` x ``w`` grid: bilinear, corners aligned (``interp_indices``, ``interp_weights``)."""

    def axis(index: torch.Tensor, size: Any) -> tuple[torch.Tensor, torch.Tensor]:
        source = index.to(torch.float32) * (side - 1) / torch.sym_max(size - 1, 1)
        floor = torch.floor(source)
        offsets = torch.arange(2)
        taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
        return taps, (1 - (source[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)

    (row_taps, row_weights), (column_taps, column_weights) = axis(rows, h), axis(columns, w)
    return {
        "interp_indices": (row_taps[:, :, None] * side + column_taps[:, None, :]).reshape(-1, 4),
        "interp_weights": (row_weights[:, :, None] * column_weights[:, None, :]).reshape(-1, 4),
    }


def dense_deepstack(hidden_states: torch.Tensor, visual_pos_masks: Any, visual_embeds: torch.Tensor) -> torch.Tensor:
    """transformers' deepstack sum as the capture computes it: the features, zeros but at image tokens, added
    everywhere (a boolean mask's rows would be of a length torch.export cannot follow)."""
    return hidden_states + visual_embeds.reshape(hidden_states.shape).to(hidden_states.dtype)


class Qwen3VL(Qwen25VL):
    """Qwen3-VL (see the module's docstring)."""

    model_types = ("qwen3_vl",)
    genai_type = "qwen3_vl"
    recipe_name = "qwen3_vl_image_processor"

    def check(self, model: Any) -> None:
        visual = model.model.visual
        if (visual.interpolation_mode, visual.interpolation_align_corners) != ("bilinear", True):
            raise ExportError(
                f"{type(model).__name__} resamples its position table {visual.interpolation_mode} (corners aligned: "
                f"{visual.interpolation_align_corners}): export_vision lays out Qwen3-VL's bilinear, corners aligned"
            )

    def _deepstack(self, model: Any) -> int:
        return len(model.config.vision_config.deepstack_visual_indexes)

    def embeds_width(self, model: Any, hidden: int) -> int:
        return hidden * (1 + self._deepstack(model))

    def token_embeddings(self, model: Any, input_ids: torch.Tensor) -> torch.Tensor:
        embeds = model.get_input_embeddings()(input_ids)
        return torch.nn.functional.pad(embeds, (0, embeds.shape[-1] * self._deepstack(model)))

    def image_features(self, model: Any, pixel_values: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        out = model.model.visual(pixel_values, grid_thw=grid)
        return torch.cat([out.pooler_output, *out.deepstack_features], -1)

    def captured_features(self, model: Any, pixel_values: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        visual = model.model.visual
        h, w, rows, columns = patch_positions(grid, visual.spatial_merge_size)
        precomputed = {
            "position_ids": torch.stack([rows, columns], -1), "cu_seqlens": (torch.arange(2) * (h * w)).to(torch.int32),
            "max_seqlen": 1, **interpolation(rows, columns, h, w, visual.num_grid_per_side),
        }  # fmt: skip
        with attending(visual.config, WHOLE_ATTENTION, whole_attention):  # one image: every block attends to all of it
            out = visual(pixel_values, grid_thw=grid, **precomputed)
        return torch.cat([out.pooler_output, *out.deepstack_features], -1)

    def vision_layers(self, model: Any) -> Layers:
        """The blocks, each attending to the whole image. Copies of a captured block are spliced in
        after the capture, so nothing but the next block may read a copy's output: every block up to
        the last one a deepstack merger reads is a kind of its own (captured)."""
        vision = model.config.vision_config
        last = max((int(i) for i in vision.deepstack_visual_indexes), default=-1)
        return Layers("model.visual.blocks", int(vision.depth), lambda index: index if index <= last else None)

    def decoder_logits(self, model: Any, inputs_embeds: torch.Tensor, input_ids: torch.Tensor | None, *,
                       capturing: bool, **options: Any) -> torch.Tensor:  # fmt: skip
        """The language model on the embeddings' first part, deepstack parts added after the first layers
        (every position given: zeros but at image tokens), then the head."""
        hidden = model.config.text_config.hidden_size
        embeds, *deepstack = inputs_embeds.split(hidden, -1)
        language = model.model.language_model
        positions = torch.ones(embeds.shape[:2], dtype=torch.bool)
        patch = _replaced(language, "_deepstack_process", dense_deepstack) if capturing else contextlib.nullcontext()
        parts = [part.reshape(-1, hidden) for part in deepstack]
        with patch:
            out = language(inputs_embeds=embeds, visual_pos_masks=positions, deepstack_visual_embeds=parts, **options)
        return model.lm_head(out.last_hidden_state)

    def windows(self, model: Any) -> dict[str, int]:
        return {}  # no windows


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Any:
    """``owner.name`` is ``value`` while the block runs (on the instance: its class is left as it is)."""
    setattr(owner, name, value)
    try:
        yield
    finally:
        delattr(owner, name)
