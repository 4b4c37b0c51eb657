"""The vision-language architectures :func:`opreg.llm.export_vision` lays out, each an
:class:`~opreg.llm._vision_architecture.Architecture` saying what differs in it, and
:data:`ARCHITECTURES`, which lists them. Gemma-3 and LLaVA are here; Qwen2.5-VL, Mistral3,
Qwen3-VL, LFM2-VL and Phi-4-multimodal, whose vision encoders need more, have modules of their own
(:mod:`opreg.llm._vision_qwen`, :mod:`opreg.llm._vision_mistral`, :mod:`opreg.llm._vision_qwen3`,
:mod:`opreg.llm._vision_lfm2`, :mod:`opreg.llm._vision_phi4mm`).

A new architecture: its class here (or, if it is long, in a module of its own) and its instance in
:data:`ARCHITECTURES`, a test with its tiny model, a row in docs/language-models.md's table
(CONTRIBUTING.md, "a new architecture").
"""

from __future__ import annotations

from typing import Any

import torch

from opreg.errors import ExportError
from opreg.llm._vision_architecture import Architecture, Layers, check_one_layer
from opreg.llm._vision_lfm2 import Lfm2Vl
from opreg.llm._vision_mistral import Mistral3
from opreg.llm._vision_phi4mm import Phi4Multimodal
from opreg.llm._vision_qwen import Qwen25VL
from opreg.llm._vision_qwen3 import Qwen3VL


class Gemma3(Architecture):
    """Gemma-3: SigLIP at one image size, pooled to ``mm_tokens_per_image`` features (GenAI's
    ``gemma3`` pipeline expands ``<start_of_image>`` to 256 image tokens); an image's tokens see
    each other in the decoder (its ``token_type_ids``, read from the token ids)."""

    model_types = ("gemma3",)
    genai_type = "gemma3"
    reads_input_ids = True
    GENAI_IMAGE_TOKENS = 256

    def decoder_options(self, model: Any, input_ids: torch.Tensor | None) -> dict[str, Any]:
        return {"token_type_ids": (input_ids == self.image_token_id(model)).long()}

    def forward_pixels(self, model: Any, input_ids: torch.Tensor, pixels: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        return {"pixel_values": pixels[0], **self.decoder_options(model, input_ids)}

    def vision_layers(self, model: Any) -> Layers | None:
        return Layers("model.vision_tower.encoder.layers", int(model.config.vision_config.num_hidden_layers))

    def check(self, model: Any) -> None:
        if int(model.config.mm_tokens_per_image) != self.GENAI_IMAGE_TOKENS:
            raise ExportError(
                f"{type(model).__name__} makes {model.config.mm_tokens_per_image} tokens an image: ONNX Runtime "
                f"GenAI's gemma3 pipeline expands each image to {self.GENAI_IMAGE_TOKENS}"
            )

    def default_image_processor(self, model: Any) -> Any:
        from transformers import Gemma3ImageProcessor

        size = self.image_size(model)
        return Gemma3ImageProcessor(size={"height": size, "width": size}, do_pan_and_scan=False)


class Llava(Architecture):
    """LLaVA: a CLIP vision tower at one image size (its features of one layer, the class token left
    out by default) and a projector; one token an image patch. GenAI 0.18 has no pipeline for it
    (its multimodal types are those of the builder's models): the folder has the same three models
    and :meth:`opreg.llm.VisionLanguage.generate` runs them; no image recipe is written."""

    model_types = ("llava",)

    def image_features(self, model: Any, pixel_values: torch.Tensor) -> torch.Tensor:
        config = model.config
        features = model.model.get_image_features(
            pixel_values, vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy, return_dict=True,
        ).pooler_output  # fmt: skip
        return features if isinstance(features, torch.Tensor) else torch.stack(list(features))

    def captured_features(self, model: Any, pixel_values: torch.Tensor) -> torch.Tensor:
        """What ``get_image_features`` computes before it splits the batch into a list (which
        torch.export would fix at the example's number of images): one layer's hidden states (all
        but the class token by default) through the projector, one integer layer as LLaVA's are."""
        config = model.config
        states = model.model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True).hidden_states
        selected = states[config.vision_feature_layer]
        if config.vision_feature_select_strategy == "default":
            selected = selected[:, 1:]
        return model.model.multi_modal_projector(selected)

    def check(self, model: Any) -> None:
        check_one_layer(model, "LLaVA")

    def default_image_processor(self, model: Any) -> Any:
        from transformers import CLIPImageProcessor

        size = self.image_size(model)
        return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})

    def processor_config(self, processor: Any) -> dict[str, Any] | None:
        return None


ARCHITECTURES: tuple[Architecture, ...] = (
    Gemma3(),
    Qwen25VL(),
    Llava(),
    Lfm2Vl(),
    Mistral3(),
    Qwen3VL(),
    Phi4Multimodal(),
)
"""Every architecture :func:`export_vision` lays out."""


def architecture_of(model: Any) -> Architecture:
    """The :class:`~opreg.llm._vision_models.Architecture` of a transformers vision-language model,
    or an :class:`opreg.ExportError` naming those there are."""
    model_type = getattr(model.config, "model_type", None)
    for architecture in ARCHITECTURES:
        if model_type in architecture.model_types:
            architecture.check(model)
            return architecture
    known = ", ".join(t for a in ARCHITECTURES for t in a.model_types)
    raise ExportError(
        f"{type(model).__name__} (model_type {model_type!r}) is a vision-language model export_vision has no "
        f"architecture for: it exports {known}"
    )
