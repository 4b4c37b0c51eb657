"""Each model of a pipeline as an :class:`opreg.Component`: its file, inputs, outputs and dims as
optimum-onnx 0.1.0's diffusers configs name them (``optimum/exporters/onnx/model_configs.py``:
``CLIPTextOnnxConfig``, ``CLIPTextWithProjectionOnnxConfig``, ``T5EncoderOnnxConfig``,
``UNetOnnxConfig``, ``SD3TransformerOnnxConfig``, ``FluxTransformerOnnxConfig``,
``VaeEncoderOnnxConfig``, ``VaeDecoderOnnxConfig``), inputs in the order of the model's
``forward`` (optimum's ``ordered_inputs``), sizes read from the component's ``config.json``.

Imports neither torch nor diffusers: a component's ``build`` does (:mod:`opreg_diffusers.modules`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import opreg

BATCH = opreg.DynamicDim("batch_size", example=2, other=3)
UPSAMPLED_BATCH = opreg.DynamicDim("batch_size", example=2, other=3, max=63)
"""The batch of a model with diffusers' ``Upsample2D`` (the UNet, a VAE decoder of several blocks):
it calls ``.contiguous()`` from a batch of 64 on (``if hidden_states.shape[0] >= 64``, a workaround
of a CUDA kernel's limit), a branch torch.export cannot keep dynamic, so the capture is bounded at
63 (a no-op on CPU: the ONNX graph itself computes any batch the same way)."""
PROMPT = "sequence_length"

Loader = Callable[[str], Any]
"""``model(name)``: the pipeline's model ``name`` (``"unet"``), loaded once (:class:`opreg_diffusers.modules.Parts`)."""


def _sequence(longest: int | None) -> opreg.DynamicDim:
    top = 16 if longest is None else min(16, longest)
    return opreg.DynamicDim(PROMPT, example=top, other=min(7, top), max=longest)


def _sides(names: tuple[str, str], multiple: int, longest: int | None = None) -> tuple[opreg.DynamicDim, ...]:
    """Height and width, multiples of ``multiple``: 2 and 3 times it, then 3 and 2 times it (not square,
    so that neither is specialised to the other)."""
    return tuple(
        opreg.DynamicDim(name, example=a * multiple, other=b * multiple, min=multiple, max=longest, multiple=multiple)
        for name, a, b in ((names[0], 2, 3), (names[1], 3, 2))
    )


def _floats(name: str, shape: tuple[str | int, ...], fill: str = "normal") -> opreg.ModelInput:
    return opreg.ModelInput(name, shape, "float32", fill=fill)


def _build(model: Loader, name: str, wrapper: str, **options: Any) -> Callable[[], Any]:
    def build() -> Any:
        from opreg_diffusers import modules

        return getattr(modules, wrapper)(model(name), **options)

    return build


def text_encoder(
    name: str, kind: str, config: Mapping[str, Any], model: Loader, hidden_states: bool
) -> opreg.Component:
    """A CLIP text encoder (with or without its projection) or T5's encoder: ``input_ids`` ->
    ``last_hidden_state`` and, for CLIP, ``pooler_output`` or ``text_embeds`` and (``hidden_states``,
    SDXL and SD3) ``hidden_states.0`` ... ``hidden_states.N``, the embeddings and each layer's output."""
    clip = kind.startswith("clip")
    longest = int(config.get("max_position_embeddings", 77)) if clip else None  # T5's positions are relative
    sequence = _sequence(longest)
    outputs = {
        "clip-text": ("last_hidden_state", "pooler_output"),
        "clip-text-with-projection": ("text_embeds", "last_hidden_state"),
        "t5-encoder": ("last_hidden_state",),
    }[kind]
    every_layer = clip and hidden_states
    if every_layer:
        outputs += tuple(f"hidden_states.{i}" for i in range(int(config["num_hidden_layers"]) + 1))
    return opreg.Component(
        name=name,
        file=f"{name}/model.onnx",
        build=_build(model, name, "TextEncoder", hidden_states=every_layer),
        inputs=(opreg.ModelInput("input_ids", (BATCH.name, PROMPT), fill="ids", high=int(config["vocab_size"])),),
        outputs=outputs,
        dims=(BATCH, sequence),
    )


def unet(config: Mapping[str, Any], model: Loader, time_ids: int) -> opreg.Component:
    """The UNet: ``sample``, ``timestep`` (a scalar), ``encoder_hidden_states`` (and ``timestep_cond``
    for a latent-consistency UNet, ``text_embeds`` and ``time_ids`` for SDXL's) -> ``out_sample``.
    Height and width are multiples of the UNet's upsampling factor, 2 ** (its blocks - 1)."""
    batch, sequence = UPSAMPLED_BATCH.name, PROMPT
    height, width = _sides(("height", "width"), 2 ** (len(config["block_out_channels"]) - 1))
    inputs = [
        _floats("sample", (batch, int(config["in_channels"]), height.name, width.name)),
        _floats("timestep", (), fill="uniform"),
        _floats("encoder_hidden_states", (batch, sequence, int(config["cross_attention_dim"]))),
    ]
    if config.get("time_cond_proj_dim") is not None:
        inputs.append(_floats("timestep_cond", (batch, int(config["time_cond_proj_dim"]))))
    if config.get("addition_embed_type") == "text_time":
        projection = (
            int(config["projection_class_embeddings_input_dim"]) - int(config["addition_time_embed_dim"]) * time_ids
        )
        inputs += [_floats("text_embeds", (batch, projection)), _floats("time_ids", (batch, time_ids), "uniform")]
    return opreg.Component(
        name="unet",
        file="unet/model.onnx",
        build=_build(model, "unet", "Denoiser", output="out_sample", added=("text_embeds", "time_ids")),
        inputs=tuple(inputs),
        outputs=("out_sample",),
        dims=(UPSAMPLED_BATCH, _sequence(None), height, width),
    )


def sd3_transformer(config: Mapping[str, Any], model: Loader) -> opreg.Component:
    """SD3's transformer: ``hidden_states``, ``encoder_hidden_states``, ``pooled_projections``,
    ``timestep`` (one per sample: optimum names its dim ``step``, which must equal the batch) ->
    ``out_hidden_states``.

    The model crops its position embeddings (a table of ``pos_embed_max_size`` patches a side) to the
    middle: torch.export keeps dynamic only an even number of patches (it cannot bound
    ``(size - n) // 2`` for odd ``n``), fewer than the table's (the whole table is another case to
    its slicing). Sides are so multiples of two patches, at most ``pos_embed_max_size - 2`` patches."""
    patch = int(config.get("patch_size", 2))
    most = config.get("pos_embed_max_size")
    height, width = _sides(("height", "width"), 2 * patch, None if most is None else (int(most) - 2) * patch)
    inputs = (
        _floats("hidden_states", (BATCH.name, int(config["in_channels"]), height.name, width.name)),
        _floats("encoder_hidden_states", (BATCH.name, PROMPT, int(config["joint_attention_dim"]))),
        _floats("pooled_projections", (BATCH.name, int(config["pooled_projection_dim"]))),
        _floats("timestep", (BATCH.name,), fill="uniform"),
    )
    return _transformer(model, inputs, (BATCH, _sequence(None), height, width))


def flux_transformer(config: Mapping[str, Any], model: Loader) -> opreg.Component:
    """Flux's transformer: the latents packed 2 x 2 (``hidden_states`` ``[batch_size,
    packed_height_width, in_channels]``), ``encoder_hidden_states``, ``pooled_projections``,
    ``timestep``, the positions ``img_ids`` and ``txt_ids`` (int64, as optimum exports them) and,
    for a guidance-distilled model, ``guidance`` -> ``out_hidden_states``."""
    packed = opreg.DynamicDim("packed_height_width", example=12, other=20)
    inputs = [
        _floats("hidden_states", (BATCH.name, packed.name, int(config["in_channels"]))),
        _floats("encoder_hidden_states", (BATCH.name, PROMPT, int(config["joint_attention_dim"]))),
        _floats("pooled_projections", (BATCH.name, int(config["pooled_projection_dim"]))),
        _floats("timestep", (BATCH.name,), fill="uniform"),
        opreg.ModelInput("img_ids", (packed.name, 3), fill="ids", high=8),
        opreg.ModelInput("txt_ids", (PROMPT, 3), fill="ids", high=8),
    ]
    if config.get("guidance_embeds"):
        inputs.append(_floats("guidance", (BATCH.name,), fill="uniform"))
    return _transformer(model, tuple(inputs), (BATCH, _sequence(None), packed))


def _transformer(
    model: Loader, inputs: tuple[opreg.ModelInput, ...], dims: tuple[opreg.DynamicDim, ...]
) -> opreg.Component:
    return opreg.Component(
        name="transformer",
        file="transformer/model.onnx",
        build=_build(model, "transformer", "Denoiser", output="out_hidden_states"),
        inputs=inputs,
        outputs=("out_hidden_states",),
        dims=dims,
    )


def vae(config: Mapping[str, Any], model: Loader) -> tuple[opreg.Component, opreg.Component]:
    """The VAE as two models, as optimum exports it: the encoder (``sample`` -> ``latent_parameters``,
    the mean and log-variance the decoder's distribution is rebuilt from; sides multiples of the
    downsampling factor) and the decoder (``latent_sample`` -> ``sample``)."""
    blocks = len(config["block_out_channels"])
    sample = _sides(("sample_height", "sample_width"), 2 ** (blocks - 1))
    latent = _sides(("latent_height", "latent_width"), 1)
    encoder = _vae_half(
        model, "VaeEncoder", ("sample", "latent_parameters"), int(config["in_channels"]), (BATCH, *sample)
    )
    batch = UPSAMPLED_BATCH if blocks > 1 else BATCH
    decoder = _vae_half(
        model, "VaeDecoder", ("latent_sample", "sample"), int(config["latent_channels"]), (batch, *latent)
    )
    return encoder, decoder


def _vae_half(
    model: Loader, wrapper: str, ends: tuple[str, str], channels: int, dims: tuple[opreg.DynamicDim, ...]
) -> opreg.Component:
    """The VAE's encoder or decoder (``wrapper``: its module in :mod:`opreg_diffusers.modules`): one
    input ``[batch_size, channels, height, width]`` (``dims``), one output (``ends``)."""
    name = {"VaeEncoder": "vae_encoder", "VaeDecoder": "vae_decoder"}[wrapper]
    batch, height, width = (d.name for d in dims)
    return opreg.Component(
        name=name,
        file=f"{name}/model.onnx",
        build=_build(model, "vae", wrapper),
        inputs=(_floats(ends[0], (batch, channels, height, width)),),
        outputs=(ends[1],),
        dims=dims,
    )
