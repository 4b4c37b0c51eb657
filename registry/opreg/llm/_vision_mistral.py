"""Mistral3 for ONNX Runtime GenAI's ``mistral3`` pipeline.

Its vision encoder (Pixtral) takes one image ``[1, 3, height, width]`` of any size (a multiple of
the patch times the merge size; GenAI runs it once per image) with 2-D rotary positions, and
returns one feature a block of merged patches, ``[num_image_tokens, hidden]``. transformers
attends with a block mask per image, built with Python loops over the images' sizes; an image
alone attends to all of itself, so the capture attends without a mask (an attention function
under a flash name while the encoder is captured: Pixtral then builds none). Its patch merger
gathers each block of patches with ``unfold``; the capture gathers the same with reshapes.

GenAI expands ``[IMG]`` in the prompt to the image's rows of ``[IMG]`` tokens, each row ended by
``[IMG_BREAK]`` and the last by ``[IMG_END]``, as transformers' Pixtral processor does; the
tokenizer must know the four tokens ``[IMG]``, ``[IMG_BREAK]``, ``[IMG_END]`` and ``[INST]``.
"""

from __future__ import annotations

from typing import Any

import torch

from opreg.errors import ExportError
from opreg.llm._vision_architecture import (
    IMAGE_TOKENS,
    Architecture,
    Layers,
    attending,
    check_one_layer,
    resample,
    sized_recipe,
    whole_attention,
)

WHOLE_ATTENTION = "opreg_flash_whole"
"""The name :func:`~opreg.llm._vision_architecture.whole_attention` is registered under while the encoder
is captured (``flash`` in it: Pixtral then builds no mask)."""
HEIGHT, WIDTH = "height", "width"


class Mistral3(Architecture):
    """Mistral3 (see the module's docstring)."""

    model_types = ("mistral3",)
    genai_type = "mistral3"
    vision_input_dims = ((None, None, HEIGHT, WIDTH),)
    feature_dims = (IMAGE_TOKENS, None)

    def check(self, model: Any) -> None:
        check_one_layer(model, "Mistral3")

    def _block(self, model: Any) -> int:
        return int(model.config.vision_config.patch_size) * int(model.config.spatial_merge_size)

    def image_features(self, model: Any, pixel_values: torch.Tensor) -> torch.Tensor:
        sizes = torch.tensor([list(pixel_values.shape[2:])] * pixel_values.shape[0])
        features = model.model.get_image_features(pixel_values, image_sizes=sizes, return_dict=True).pooler_output
        return torch.cat(list(features))

    def captured_features(self, model: Any, pixel_values: torch.Tensor) -> torch.Tensor:
        """The encoder on one image without a mask, one layer's states merged with reshapes (what
        ``unfold`` gathers) through the projector."""
        merge, layer = int(model.config.spatial_merge_size), model.config.vision_feature_layer
        block = self._block(model)
        torch._check(pixel_values.shape[2] % block == 0)
        torch._check(pixel_values.shape[3] % block == 0)
        with attending(model.model.vision_tower.config, WHOLE_ATTENTION, whole_attention):
            states = model.model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True).hidden_states
        projector = model.model.multi_modal_projector
        patches = projector.norm(states[layer][0])
        rows, columns = pixel_values.shape[2] // block, pixel_values.shape[3] // block
        size = patches.shape[-1]
        grid = patches.reshape(rows, merge, columns, merge, size).permute(0, 2, 4, 1, 3)
        merged = projector.patch_merger.merging_layer(grid.reshape(rows * columns, size * merge * merge))
        return projector.linear_2(projector.act(projector.linear_1(merged)))

    def image_size(self, model: Any) -> int:
        return 2 * self._block(model)

    def vision_layers(self, model: Any) -> Layers | None:
        return Layers("model.vision_tower.transformer.layers", int(model.config.vision_config.num_hidden_layers))

    def vision_example(self, model: Any) -> tuple[tuple, Any, list[str], tuple]:
        Dim, block = torch.export.Dim, self._block(model)
        rows, columns = Dim("rows", min=1, max=1024), Dim("columns", min=1, max=1024)
        pixels = torch.randn(1, 3, 3 * block, 5 * block, dtype=model.dtype)
        return (
            (pixels,),
            {"pixel_values": {2: block * rows, 3: block * columns}},
            ["pixel_values"],
            (IMAGE_TOKENS, None),
        )

    def vision_samples(self, model: Any, generator: torch.Generator) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
        block = self._block(model)
        return [(f"{h}x{w} pixels", (torch.randn(1, 3, h, w, generator=generator).to(model.dtype),))
                for h, w in ((3 * block, 5 * block), (4 * block, 2 * block), (block, 2 * block))]  # fmt: skip

    def forward_pixels(self, model: Any, input_ids: torch.Tensor, pixels: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        return {"pixel_values": pixels[0], "image_sizes": torch.tensor([list(pixels[0].shape[2:])])}

    def genai(self, model: Any) -> dict[str, Any]:
        vision = model.config.vision_config
        return {
            "image_token_id": self.image_token_id(model),
            "vision": {
                "patch_size": int(vision.patch_size),
                "spatial_merge_size": int(model.config.spatial_merge_size),
            },
        }

    def check_processor(self, model: Any, processor: Any) -> None:
        """The image processor's ``patch_size`` (Pixtral's: the size its images are a multiple of) must be
        the encoder's patch times the merge size, the blocks GenAI cuts images into."""
        made, block = getattr(processor, "patch_size", None), self._block(model)
        made = made.get("height") if isinstance(made, dict) else made
        if made is not None and int(made) != block:
            raise ExportError(
                f"the image processor's patch_size is {made}, the model's patches merged {block}x{block} pixels: give "
                "the model's own image processor (image_processor=, or the checkpoint folder's)"
            )

    def default_image_processor(self, model: Any) -> Any:
        from transformers import PixtralImageProcessor

        return PixtralImageProcessor(patch_size=self._block(model),
                                     size={"longest_edge": int(model.config.vision_config.image_size)})  # fmt: skip

    def processor_config(self, processor: Any) -> dict[str, Any]:
        longest, block = int(processor.size["longest_edge"]), int(processor.patch_size)
        resize = {"height": longest, "width": longest, "smart_resize": 1, "min_pixels": block * block,
                  "max_pixels": longest * longest, "patch_size": block, "merge_size": 1,
                  "interpolation": resample(processor)}  # fmt: skip
        return sized_recipe("pixtral_image_processor", processor, resize)
