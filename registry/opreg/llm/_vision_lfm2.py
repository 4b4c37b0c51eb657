"""LFM2-VL for ONNX Runtime GenAI's ``lfm2_vl`` pipeline.

Its vision encoder is SigLIP2 at the image's own size ("NaFlex"): it takes an image's patches
``[1, num_patches, channels * patch * patch]``, their mask ``[1, num_patches]`` and the patch grid
``[1, 2]`` (rows, columns), as GenAI's ``Lfm2VlImageProcessor`` makes them, and returns
``[num_image_tokens, hidden]``: the projector gathers each 2x2 block of patches into one token
(its pixel unshuffle). transformers resizes the position embeddings to each image's grid with an
antialiased bilinear ``F.interpolate`` whose size is read from the grid (``tolist()``) and loops
over the images; the capture computes the same resize as a product with the filter's weights,
themselves computed from the grid with tensor ops (:func:`resized_positions`), and the unshuffle
as a gather (:func:`unshuffle_index`), so that every size stays dynamic. One image a run: the
patches of several images of different sizes are padded to one length, and which of them are
tokens depends on the grid's values. The eager model :meth:`opreg.llm.VisionLanguage.verify`
compares with runs transformers' own path.

The decoder is LFM2 (short convolutions beside attention): its cache holds a convolution's state
in some layers and keys and values in the others (:mod:`opreg.llm._cache`).
"""

from __future__ import annotations

from typing import Any

import torch

from opreg.errors import ExportError
from opreg.llm._vision_architecture import IMAGE_TOKENS, Architecture, Layers, resample, sized_recipe

PATCHES = "num_patches"


def filter_weights(size: torch.Tensor, outputs: torch.Tensor, source: int) -> torch.Tensor:
    """The weights of torch's antialiased bilinear resize (``F.interpolate(..., antialias=True)``,
    corners not aligned) of ``source`` values to ``size``: ``[len(outputs), source]``, a row for
    each output index of ``outputs``. Its triangle filter is widened by the scale when it shrinks
    and each row is normalised: the same weights torch's kernel sums over its window."""
    scale = source / size.to(torch.float32)
    support = torch.clamp(scale, min=1.0)  # the filter's half-width: 1, widened by the scale when shrinking
    center = scale * (outputs.to(torch.float32) + 0.5)
    taps = torch.arange(source, dtype=torch.float32)
    weights = torch.clamp(1 - ((taps[None, :] + 0.5 - center[:, None]) / support[:, None]).abs(), min=0.0)
    return weights / weights.sum(-1, keepdim=True)


def resized_positions(positions: torch.Tensor, spatial_shapes: torch.Tensor, max_length: int) -> torch.Tensor:
    """``Siglip2VisionEmbeddings.resize_positional_embeddings`` with tensor ops: the ``[side, side,
    dim]`` position embeddings resized to each image's ``(rows, columns)`` and laid out by patch,
    ``[images, max_length, dim]`` (a padding patch gets the first patch's, as transformers pads)."""
    side, dim = positions.shape[0], positions.shape[-1]
    patch = torch.arange(max_length)
    rows, columns = spatial_shapes[:, :1], spatial_shapes[:, 1:]
    real = patch[None, :] < rows * columns
    row = torch.where(real, patch[None, :] // columns, 0)
    column = torch.where(real, patch[None, :] % columns, 0)
    images = spatial_shapes.shape[0]
    by_row = filter_weights(rows.expand(-1, max_length).reshape(-1), row.reshape(-1), side)
    by_column = filter_weights(columns.expand(-1, max_length).reshape(-1), column.reshape(-1), side)
    weights = (by_row[:, :, None] * by_column[:, None, :]).reshape(images * max_length, side * side)
    table = positions.to(torch.float32).reshape(side * side, dim)
    return (weights @ table).reshape(images, max_length, dim).to(positions.dtype)


def unshuffle_index(columns: torch.Tensor, tokens: int, factor: int) -> torch.Tensor:
    """The patches each token of the projector's pixel unshuffle gathers, ``[tokens, factor *
    factor]`` in the order of its channels (block row, then block column), for a grid of
    ``columns`` patches a row."""
    token = torch.arange(tokens)
    wide = columns // factor
    top, left = (token // wide) * factor, (token % wide) * factor
    dy, dx = torch.arange(factor).repeat_interleave(factor), torch.arange(factor).repeat(factor)
    return (top[:, None] + dy[None, :]) * columns + left[:, None] + dx[None, :]


class Lfm2Vl(Architecture):
    """LFM2-VL (see the module's docstring)."""

    model_types = ("lfm2_vl",)
    genai_type = "lfm2_vl"
    vision_input_dims = ((None, PATCHES, None), (None, PATCHES), (None, None))  # one image: a batch of 1
    feature_dims = (IMAGE_TOKENS, None)

    def check(self, model: Any) -> None:
        vision = model.config.vision_config
        if int(vision.num_patches) != int(vision.num_patches**0.5) ** 2:
            raise ExportError(
                f"{type(model).__name__}'s vision encoder has {vision.num_patches} position embeddings, not a square "
                "grid: SigLIP2 resizes them as one"
            )

    def check_processor(self, model: Any, processor: Any) -> None:
        """The processor's patch size and downsampling against the model's; no tiles (GenAI's
        pipeline does not split an image into tiles)."""
        pairs = (("encoder_patch_size", model.config.vision_config.patch_size),
                 ("downsample_factor", model.config.downsample_factor))  # fmt: skip
        for name, taken in pairs:
            made = getattr(processor, name, None)
            if made is not None and int(made) != int(taken):
                raise ExportError(
                    f"the image processor's {name} is {made}, the model's {taken}: give the model's own image "
                    "processor (image_processor=, or the checkpoint folder's)"
                )
        if getattr(processor, "do_image_splitting", False):
            raise ExportError(
                "the image processor splits large images into tiles (do_image_splitting): ONNX Runtime GenAI's "
                "lfm2_vl pipeline resizes each image whole; give an image processor with do_image_splitting=False"
            )

    def image_features(self, model: Any, pixel_values: torch.Tensor, mask: torch.Tensor, shapes: torch.Tensor
                       ) -> torch.Tensor:  # fmt: skip
        features = model.model.get_image_features(pixel_values, shapes, mask, return_dict=True).pooler_output
        return torch.cat(list(features))

    def captured_features(self, model: Any, pixel_values: torch.Tensor, mask: torch.Tensor, shapes: torch.Tensor
                          ) -> torch.Tensor:  # fmt: skip
        """The vision tower (its position embeddings resized by :func:`resized_positions`, on the
        instance for this call only), then the projector on the patches each token gathers."""
        tower, projector = model.model.vision_tower, model.model.multi_modal_projector
        embeddings = tower.embeddings
        embeddings.resize_positional_embeddings = resized_positions
        try:
            states = tower(pixel_values, mask, shapes).last_hidden_state
        finally:
            del embeddings.resize_positional_embeddings
        factor = projector.factor
        tokens = states.shape[1] // (factor * factor)
        index = unshuffle_index(shapes[0, 1], tokens, factor)
        gathered = states[0][index.reshape(-1)].reshape(tokens, -1)
        if projector.use_layer_norm:
            gathered = projector.layer_norm(gathered)
        return projector.linear_2(projector.act(projector.linear_1(gathered)))

    def vision_step(self, model: Any) -> torch.nn.Module:
        return Lfm2VisionStep(model, self)

    def vision_layers(self, model: Any) -> Layers:
        return Layers("model.vision_tower.encoder.layers", int(model.config.vision_config.num_hidden_layers))

    def _pixels(self, model: Any, rows: int, columns: int, generator: torch.Generator | None = None) -> tuple:
        vision = model.config.vision_config
        size = int(vision.num_channels * vision.patch_size**2)
        pixels = torch.randn(1, rows * columns, size, generator=generator).to(model.dtype)
        return pixels, torch.ones(1, rows * columns, dtype=torch.int64), torch.tensor([[rows, columns]])

    def vision_example(self, model: Any) -> tuple[tuple, Any, list[str], tuple]:
        factor = int(model.config.downsample_factor)
        patches = factor * factor * torch.export.Dim(IMAGE_TOKENS, min=2)
        dims = {"pixel_values": {1: patches}, "pixel_attention_mask": {1: patches}, "spatial_shapes": None}
        names = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]
        return self._pixels(model, 6, 8), dims, names, (IMAGE_TOKENS, None)

    def vision_samples(self, model: Any, generator: torch.Generator) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
        grids = ((6, 8), (8, 4), (2, 2))
        return [(f"grid {h}x{w}", self._pixels(model, h, w, generator)) for h, w in grids]

    def forward_pixels(self, model: Any, input_ids: torch.Tensor, pixels: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        return {"pixel_values": pixels[0], "pixel_attention_mask": pixels[1], "spatial_shapes": pixels[2]}

    def genai(self, model: Any) -> dict[str, Any]:
        inputs = {"pixel_values": "pixel_values", "attention_mask": "pixel_attention_mask",
                  "image_sizes": "spatial_shapes"}  # fmt: skip
        vision = {"patch_size": int(model.config.vision_config.patch_size),
                  "spatial_merge_size": int(model.config.downsample_factor), "inputs": inputs}  # fmt: skip
        return {"image_token_id": self.image_token_id(model), "vision": vision}

    def default_image_processor(self, model: Any) -> Any:
        from transformers import Lfm2VlImageProcessor

        patch, factor = int(model.config.vision_config.patch_size), int(model.config.downsample_factor)
        return Lfm2VlImageProcessor(encoder_patch_size=patch, downsample_factor=factor, do_image_splitting=False)

    def processor_config(self, processor: Any) -> dict[str, Any]:
        """GenAI's recipe for an image resized whole (its smart resize between the processor's
        least and most tokens), then its sizes (``PixtralImageSizes``): GenAI cuts the patches."""
        patch, factor = int(processor.encoder_patch_size), int(processor.downsample_factor)
        per_token = (patch * factor) ** 2
        resize = {"height": int(processor.size["height"]), "width": int(processor.size["width"]),
                  "interpolation": resample(processor), "smart_resize": 1,
                  "min_pixels": int(processor.min_image_tokens) * per_token,
                  "max_pixels": int(processor.max_image_tokens) * per_token, "patch_size": patch,
                  "merge_size": factor}  # fmt: skip
        return sized_recipe("lfm2_vl_image_processor", processor, resize)


class Lfm2VisionStep(torch.nn.Module):
    """``forward(pixel_values, pixel_attention_mask, spatial_shapes)``: an image's features
    (:meth:`Lfm2Vl.captured_features`)."""

    def __init__(self, model: torch.nn.Module, architecture: Lfm2Vl) -> None:
        super().__init__()
        self.model, self.architecture = model, architecture

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor, spatial_shapes: torch.Tensor
                ) -> torch.Tensor:  # fmt: skip
        return self.architecture.captured_features(self.model, pixel_values, pixel_attention_mask, spatial_shapes)
