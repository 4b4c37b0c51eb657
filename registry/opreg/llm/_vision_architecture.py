"""What a vision-language architecture is: :class:`Architecture`, what differs between
architectures (the vision encoder's inputs, the decoder's extra inputs and positions, GenAI's model
type, its image processor's recipe, the width of what the models hand on), each with the default
most architectures share.

The architectures themselves are in :mod:`opreg.llm._vision_models`, each an :class:`Architecture`
matched by the config's ``model_type``. GenAI 0.18 runs ``gemma3``, ``qwen2_5_vl``, ``mistral3``,
``qwen3_vl`` and ``lfm2_vl`` folders; an architecture with ``genai_type=None`` is exported in the
same layout and run by :meth:`opreg.llm.VisionLanguage.generate` (GenAI has no pipeline for it).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from opreg.errors import ExportError

NUM_IMAGES, IMAGE_TOKENS = "num_images", "num_image_tokens"
RESAMPLE = {2: "LINEAR", 3: "CUBIC"}
"""PIL's resampling filters (``Image.Resampling``) as ONNX Runtime Extensions' ``Resize`` names them."""


@dataclasses.dataclass(frozen=True)
class Layers:
    """A vision encoder's repeated layers, which the export captures once (:mod:`opreg.llm._layers`).

    Fields:
        path: the layer list's attribute path in the transformers model.
        count: how many layers it holds.
        differs: what the encoder's own code does differently for layer ``i`` (``None``: nothing;
            Qwen2.5-VL's full-attention blocks read other spans than its window blocks).
    """

    path: str
    count: int
    differs: Callable[[int], object] | None = None


class Architecture:
    """The base: an architecture whose vision encoder takes ``pixel_values`` ``[num_images, 3,
    height, width]`` of one fixed size and returns ``[num_images, tokens, hidden]``, and whose
    decoder takes ``[batch, sequence]`` positions."""

    model_types: tuple[str, ...] = ()
    genai_type: str | None = None
    text_layers = "model.language_model.layers"
    """The language model's layer list (:mod:`opreg.llm._layers` captures its repeated layers once)."""
    reads_input_ids = False
    """Whether the decoder reads the token ids besides their embeddings."""
    vision_input_dims: tuple[tuple[str | None, ...], ...] = ((NUM_IMAGES, None, None, None),)
    feature_dims: tuple[str | None, ...] = (NUM_IMAGES, IMAGE_TOKENS, None)
    """The image features' dims as the embedding model takes them."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} vision-language architecture>"

    def check(self, model: Any) -> None:
        """Refuse, with the reason, a model of this architecture GenAI's pipeline cannot run."""

    def check_processor(self, model: Any, processor: Any) -> None:
        """Refuse an image processor that contradicts the model, before the export (as Whisper's feature
        extractor's mel bins are checked): its patch, merge and temporal patch sizes against the vision
        encoder's config, and the size of the images it makes against an encoder of one fixed size."""
        vision = model.config.vision_config
        for mine, theirs in PROCESSOR_SIZES:
            made, taken = getattr(processor, mine, None), getattr(vision, theirs, None)
            if made is not None and taken is not None and int(made) != int(taken):
                raise ExportError(
                    f"the image processor's {mine} is {made}, the model's vision encoder's {theirs} {taken}: give "
                    "the model's own image processor (image_processor=, or the checkpoint folder's)"
                )
        size = made_size(processor) if getattr(processor, "patch_size", None) is None else None
        if size is not None and size != (self.image_size(model),) * 2:
            raise ExportError(
                f"the image processor makes {size[0]}x{size[1]} images, the model's vision encoder takes "
                f"{self.image_size(model)}x{self.image_size(model)}: give the model's own image processor "
                "(image_processor=, or the checkpoint folder's)"
            )

    def image_token_id(self, model: Any) -> int:
        config = model.config
        token = getattr(config, "image_token_id", None)
        token = getattr(config, "image_token_index", None) if token is None else token
        return int(token)

    def image_features(self, model: Any, pixel_values: torch.Tensor) -> torch.Tensor:
        features = model.model.get_image_features(pixel_values, return_dict=True).pooler_output
        return features if isinstance(features, torch.Tensor) else torch.stack(list(features))

    def captured_features(self, model: Any, *pixels: torch.Tensor) -> torch.Tensor:
        """:meth:`image_features` as torch.export captures it (the same unless the architecture's
        code needs help to be captured)."""
        return self.image_features(model, *pixels)

    def image_size(self, model: Any) -> int:
        return int(model.config.vision_config.image_size)

    def vision_step(self, model: Any) -> torch.nn.Module | None:
        """The module torch.export captures for the vision encoder, where its inputs are other than
        ``pixel_values`` and ``image_grid_thw`` (``None``: :class:`opreg.llm._vision.VisionStep`)."""
        return None

    def vision_layers(self, model: Any) -> Layers | None:
        """The vision encoder's repeated layers, or ``None`` to capture the encoder whole."""
        return None

    def vision_example(self, model: Any) -> tuple[tuple, Any, list[str], tuple]:
        """The encoder's example inputs, dynamic shapes, input names and output dim names."""
        size = self.image_size(model)
        example = (torch.randn(2, 3, size, size, dtype=model.dtype),)
        return example, {"pixel_values": {0: torch.export.Dim(NUM_IMAGES)}}, ["pixel_values"], (NUM_IMAGES, None, None)

    def vision_samples(self, model: Any, generator: torch.Generator) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
        """The encoder's inputs :meth:`opreg.llm.VisionLanguage.verify` compares, labelled."""
        size = self.image_size(model)
        return [(f"{n} image{'s' * (n > 1)}", (torch.randn(n, 3, size, size, generator=generator).to(model.dtype),))
                for n in (1, 2)]  # fmt: skip

    def prompt(self, model: Any, image_tokens: int, generator: torch.Generator) -> torch.Tensor:
        """A prompt of one row: text tokens around ``image_tokens`` image tokens."""
        vocab = model.config.get_text_config(decoder=True).vocab_size
        text = torch.randint(0, vocab, (5,), generator=generator)
        text[text == self.image_token_id(model)] = 0
        return torch.cat([text[:3], torch.full((image_tokens,), self.image_token_id(model)), text[3:]])[None]

    def forward_pixels(self, model: Any, input_ids: torch.Tensor, pixels: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        """The keyword arguments that give the model's own forward the images of ``pixels``."""
        return {"pixel_values": pixels[0]}

    def decoder_options(self, model: Any, input_ids: torch.Tensor | None) -> dict[str, Any]:
        """More keyword arguments of the model's forward on embeddings."""
        return {}

    def embeds_width(self, model: Any, hidden: int) -> int:
        """The width of the image features and of the embeddings the decoder takes: the language
        model's ``hidden`` size, more where they carry more (Qwen3-VL's deepstack features)."""
        return hidden

    def token_embeddings(self, model: Any, input_ids: torch.Tensor) -> torch.Tensor:
        """The tokens' embeddings, :meth:`embeds_width` wide, before the image features replace some."""
        return model.get_input_embeddings()(input_ids)

    def decoder_logits(self, model: Any, inputs_embeds: torch.Tensor, input_ids: torch.Tensor | None, *,
                       capturing: bool, **options: Any) -> torch.Tensor:  # fmt: skip
        """The logits of the language model on ``inputs_embeds`` (the embedding model's output) with the
        forward's ``options`` (mask, positions, cache); ``capturing``: under torch.export."""
        return model(inputs_embeds=inputs_embeds, **options, **self.decoder_options(model, input_ids)).logits

    def positions(self, past: int, length: int, batch: int) -> torch.Tensor:
        """Example position ids of a step of ``length`` tokens after ``past``."""
        return torch.arange(past, past + length).repeat(batch, 1)

    def prompt_positions(self, model: Any, input_ids: torch.Tensor, pixels: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The position ids of a prompt (as GenAI computes them)."""
        return torch.arange(input_ids.shape[1])[None]

    def next_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The position ids of the token after a step whose position ids were ``positions``."""
        return positions[..., -1:] + 1

    def genai(self, model: Any) -> dict[str, Any]:
        """More of ``genai_config.json``'s ``model`` section (``vision``: more of its ``vision`` section)."""
        return {}

    def default_image_processor(self, model: Any) -> Any:
        raise NotImplementedError

    def processor_config(self, processor: Any) -> dict[str, Any]:
        """ONNX Runtime Extensions' recipe for the encoder's ``pixel_values`` (``processor_config.json``)."""
        size = processor.size
        resize = {"interpolation": resample(processor), "width": int(size["width"]), "height": int(size["height"]),
                  "keep_aspect_ratio": 0}  # fmt: skip
        return recipe(type(processor).__name__, [
            ("resize", "Resize", resize),
            ("rescale", "Rescale", {"rescale_factor": float(processor.rescale_factor)}),
            ("normalize", "Normalize", {"mean": list(processor.image_mean), "std": list(processor.image_std)}),
            ("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}),
        ])  # fmt: skip


PROCESSOR_SIZES = (("patch_size", "patch_size"), ("merge_size", "spatial_merge_size"),
                   ("temporal_patch_size", "temporal_patch_size"))  # fmt: skip
"""An image processor's sizes and the vision config's that must equal them: ``(processor's, config's)``."""


def made_size(processor: Any) -> tuple[int, int] | None:
    """The ``(height, width)`` of the images ``processor`` makes, when they have one size: its crop where it
    crops, else its size where that has a height and a width; ``None`` otherwise."""
    size = processor.crop_size if getattr(processor, "do_center_crop", False) else getattr(processor, "size", None)
    get = size.get if isinstance(size, dict) else lambda name: getattr(size, name, None)  # dict, or a SizeDict
    height, width = get("height"), get("width")
    return None if height is None or width is None else (int(height), int(width))


def resample(processor: Any) -> str:
    resample = int(processor.resample)
    if resample not in RESAMPLE:
        raise ExportError(
            f"the image processor resizes with PIL filter {resample}: ONNX Runtime Extensions resizes with "
            f"{', '.join(RESAMPLE.values())} ({', '.join(map(str, RESAMPLE))})"
        )
    return RESAMPLE[resample]


def recipe(name: str, steps: list[tuple[str, str, dict[str, Any] | None]]) -> dict[str, Any]:
    """``processor_config.json``: decode the image as RGB, then ``steps`` (name, type, attributes)."""
    transforms = [{"operation": {"name": "decode_image", "type": "DecodeImage", "attrs": {"color_space": "RGB"}}}]
    for step, kind, attrs in steps:
        transforms.append({"operation": {"name": step, "type": kind, **({"attrs": attrs} if attrs else {})}})
    return {"processor": {"name": name, "transforms": transforms}}


def sized_recipe(name: str, processor: Any, resize: dict[str, Any]) -> dict[str, Any]:
    """``processor_config.json`` for an image resized whole (``resize``: the ``Resize`` step's
    attributes), rescaled, normalized, channels first, then its size (``PixtralImageSizes``: the
    pipelines that run the encoder once per image at its own size read it)."""
    return recipe(name, [
        ("resize", "Resize", resize),
        ("rescale", "Rescale", {"rescale_factor": float(processor.rescale_factor)}),
        ("normalize", "Normalize", {"mean": list(processor.image_mean), "std": list(processor.image_std)}),
        ("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}),
        ("image_sizes", "PixtralImageSizes", None),
    ])  # fmt: skip


def check_one_layer(model: Any, family: str) -> None:
    """Refuse a model whose projector reads several vision layers' features (``vision_feature_layer``
    a list): ``family`` names the models export_vision lays out (those that read one layer)."""
    if not isinstance(model.config.vision_feature_layer, int):
        raise ExportError(
            f"{type(model).__name__} concatenates the features of layers {model.config.vision_feature_layer}: "
            f"export_vision lays out {family} models that read one layer"
        )


def whole_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of every position to every other (one image's patches), as transformers' attention
    functions return it: ``(batch, sequence, heads, size)``."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def attending(config: Any, name: str, function: Callable[..., Any]) -> Iterator[None]:
    """``config``'s models attend with ``function``, registered in transformers' attention functions
    as ``name``, while the block runs (a capture): the mapping and the config are restored after."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS[name] = function
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before
        del ALL_ATTENTION_FUNCTIONS[name]
