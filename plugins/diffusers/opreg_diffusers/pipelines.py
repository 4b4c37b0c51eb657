"""The diffusers pipelines opreg-diffusers exports, as data: which ``_class_name`` of
``model_index.json`` is which family, the task it infers, the components each family needs.

Reads nothing and imports nothing: :mod:`opreg_diffusers.loaders` reads the folder.
"""

from __future__ import annotations

import dataclasses

TEXT_TO_IMAGE = "text-to-image"
IMAGE_TO_IMAGE = "image-to-image"
INPAINTING = "inpainting"
TASKS = (TEXT_TO_IMAGE, IMAGE_TO_IMAGE, INPAINTING)
"""optimum's diffusers tasks: each exports the same models (the pipeline's components); the task
picks the pipeline the loop check runs (diffusers' ``AutoPipelineForText2Image``,
``...Image2Image``, ``...Inpainting`` mappings)."""

MODELS = ("text_encoder", "text_encoder_2", "text_encoder_3", "unet", "transformer", "vae")
"""The entries of ``model_index.json`` that are models opreg exports (the VAE as two:
``vae_encoder``, ``vae_decoder``), in optimum's order."""
TOKENIZERS = ("tokenizer", "tokenizer_2", "tokenizer_3")
COPIED = ("scheduler", *TOKENIZERS, "feature_extractor")
"""The entries whose folders are copied as they are (optimum re-saves them; the files are the same)."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One family of pipelines.

    Fields:
        name: as the docs' task table names it (``"stable-diffusion-xl"``).
        denoiser: ``"unet"`` or ``"transformer"``.
        required: the entries ``model_index.json`` must name (not ``[null, null]``), models,
            tokenizers and the scheduler; the others are exported when named (SDXL's refiner has no
            ``text_encoder``).
        hidden_states: whether its CLIP text encoders also give every layer's hidden states
            (``hidden_states.0`` ... ``hidden_states.N``: SDXL and SD3 read the penultimate one).
    """

    name: str
    denoiser: str
    required: tuple[str, ...]
    hidden_states: bool = False


STABLE_DIFFUSION = Family("stable-diffusion", "unet", ("text_encoder", "tokenizer", "unet", "vae", "scheduler"))
STABLE_DIFFUSION_XL = Family(
    "stable-diffusion-xl", "unet", ("text_encoder_2", "tokenizer_2", "unet", "vae", "scheduler"), hidden_states=True
)
STABLE_DIFFUSION_3 = Family(
    "stable-diffusion-3",
    "transformer",
    ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer", "vae", "scheduler"),
    hidden_states=True,
)
FLUX = Family(
    "flux",
    "transformer",
    ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer", "vae", "scheduler"),
)

PIPELINES: dict[str, tuple[Family, str]] = {
    "StableDiffusionPipeline": (STABLE_DIFFUSION, TEXT_TO_IMAGE),
    "StableDiffusionImg2ImgPipeline": (STABLE_DIFFUSION, IMAGE_TO_IMAGE),
    "StableDiffusionInpaintPipeline": (STABLE_DIFFUSION, INPAINTING),
    "StableDiffusionXLPipeline": (STABLE_DIFFUSION_XL, TEXT_TO_IMAGE),
    "StableDiffusionXLImg2ImgPipeline": (STABLE_DIFFUSION_XL, IMAGE_TO_IMAGE),
    "StableDiffusionXLInpaintPipeline": (STABLE_DIFFUSION_XL, INPAINTING),
    "StableDiffusion3Pipeline": (STABLE_DIFFUSION_3, TEXT_TO_IMAGE),
    "StableDiffusion3Img2ImgPipeline": (STABLE_DIFFUSION_3, IMAGE_TO_IMAGE),
    "StableDiffusion3InpaintPipeline": (STABLE_DIFFUSION_3, INPAINTING),
    "FluxPipeline": (FLUX, TEXT_TO_IMAGE),
    "FluxImg2ImgPipeline": (FLUX, IMAGE_TO_IMAGE),
    "FluxInpaintPipeline": (FLUX, INPAINTING),
}
"""``model_index.json``'s ``_class_name`` -> its family and the task it infers."""

MODEL_CLASSES = {
    ("transformers", "CLIPTextModel"): "clip-text",
    ("transformers", "CLIPTextModelWithProjection"): "clip-text-with-projection",
    ("transformers", "T5EncoderModel"): "t5-encoder",
    ("diffusers", "UNet2DConditionModel"): "unet-2d-condition",
    ("diffusers", "SD3Transformer2DModel"): "sd3-transformer-2d",
    ("diffusers", "FluxTransformer2DModel"): "flux-transformer-2d",
    ("diffusers", "AutoencoderKL"): "vae",
}
"""A model entry's ``[library, class]`` -> its kind (optimum's ``export_model_type``); another class
is refused, naming it."""
