"""Tiny random diffusers pipelines, written with ``save_pretrained`` as the hub holds them: Stable
Diffusion, SDXL, SD3 and Flux, each with its text encoders (CLIP, T5), UNet or transformer, VAE,
scheduler and tokenizers made from tiny vocab files written here. Nothing is downloaded.

Sizes follow diffusers' own fast tests (``tests/pipelines/stable_diffusion*/``, ``flux/``): hidden
sizes of 8 to 64, one or two layers, a VAE of one or two blocks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

WORDS = ("a", "cat", "sat", "on", "the", "mat")
"""The words the loop check's prompt ("a cat sat on the mat") is made of: whole tokens in both vocabularies."""
LETTERS = "abcdefghijklmnopqrstuvwxyz"
PROMPT_TOKENS = 16
"""CLIP's positions (``max_position_embeddings``) and its tokenizer's ``model_max_length``."""


def clip_tokenizer(folder: Path) -> Any:
    """A CLIP BPE tokenizer from a vocab and merges file: every letter, and the merges that make each
    of :data:`WORDS` one token (``cat</w>``)."""
    import transformers

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    merges = []
    for letter in LETTERS:
        vocab.setdefault(letter, len(vocab))
        vocab.setdefault(f"{letter}</w>", len(vocab))
    for word in WORDS:
        pieces = [*word[:-1], f"{word[-1]}</w>"]
        while len(pieces) > 1:
            merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            vocab.setdefault(pieces[0], len(vocab))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(dict.fromkeys(merges)) + "\n")
    tokenizer = transformers.CLIPTokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    tokenizer.model_max_length = PROMPT_TOKENS
    return tokenizer


def t5_tokenizer() -> Any:
    """A T5 (unigram) tokenizer over :data:`WORDS` and the letters."""
    import transformers

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [(f"\u2581{word}", -1.0) for word in WORDS] + [(letter, -3.0) for letter in LETTERS]
    return transformers.T5Tokenizer(vocab=pieces, extra_ids=0)


def _clip(folder: Path, projection: bool = False) -> Any:
    import transformers

    config = transformers.CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, vocab_size=len(clip_tokenizer(folder / "vocab")),
        hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
        max_position_embeddings=PROMPT_TOKENS, projection_dim=32,
    )  # fmt: skip
    return (transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel)(config)


def _t5() -> Any:
    import transformers

    config = transformers.T5Config(
        vocab_size=len(t5_tokenizer()), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, decoder_start_token_id=0,
    )  # fmt: skip
    return transformers.T5EncoderModel(config)


def _vae(blocks: int, latent_channels: int = 4, **config: Any) -> Any:
    import diffusers

    return diffusers.AutoencoderKL(
        block_out_channels=(8, 16)[:blocks], in_channels=3, out_channels=3, latent_channels=latent_channels,
        down_block_types=("DownEncoderBlock2D",) * blocks, up_block_types=("UpDecoderBlock2D",) * blocks,
        layers_per_block=1, norm_num_groups=4, sample_size=16, **config,
    )  # fmt: skip


def _flow_vae(latent_channels: int) -> Any:
    """SD3's and Flux's VAE: one block, no quantisation convolutions, a shift of the latents."""
    return _vae(1, latent_channels, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609,
                scaling_factor=1.5035)  # fmt: skip


def _unet(**config: Any) -> Any:
    import diffusers

    return diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4, **config,
    )  # fmt: skip


def stable_diffusion(folder: Path) -> Any:
    import diffusers

    return diffusers.StableDiffusionPipeline(
        vae=_vae(2), text_encoder=_clip(folder), tokenizer=clip_tokenizer(folder / "vocab"),
        unet=_unet(cross_attention_dim=32, attention_head_dim=4),
        scheduler=diffusers.PNDMScheduler(skip_prk_steps=True, steps_offset=1), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip


def stable_diffusion_xl(folder: Path) -> Any:
    import diffusers

    unet = _unet(
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, projection_class_embeddings_input_dim=6 * 8 + 32, cross_attention_dim=64,
    )  # fmt: skip
    return diffusers.StableDiffusionXLPipeline(
        vae=_vae(2), text_encoder=_clip(folder), text_encoder_2=_clip(folder, projection=True),
        tokenizer=clip_tokenizer(folder / "vocab"), tokenizer_2=clip_tokenizer(folder / "vocab"), unet=unet,
        scheduler=diffusers.EulerDiscreteScheduler(), add_watermarker=False,
    )  # fmt: skip


def stable_diffusion_3(folder: Path) -> Any:
    import diffusers

    transformer = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=1, in_channels=16, num_layers=1, attention_head_dim=8, num_attention_heads=4,
        caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=16,
    )  # fmt: skip
    vae = _flow_vae(latent_channels=16)  # SD3's inpainting pipeline refuses other counts
    return diffusers.StableDiffusion3Pipeline(
        transformer=transformer, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae,
        text_encoder=_clip(folder, projection=True), tokenizer=clip_tokenizer(folder / "vocab"),
        text_encoder_2=_clip(folder, projection=True), tokenizer_2=clip_tokenizer(folder / "vocab"),
        text_encoder_3=_t5(), tokenizer_3=t5_tokenizer(),
    )  # fmt: skip


def flux(folder: Path) -> Any:
    import diffusers

    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
    )  # fmt: skip
    vae = _flow_vae(latent_channels=1)
    return diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=_clip(folder),
        tokenizer=clip_tokenizer(folder / "vocab"), text_encoder_2=_t5(), tokenizer_2=t5_tokenizer(),
        transformer=transformer,
    )  # fmt: skip


PIPELINES: dict[str, Callable[[Path], Any]] = {
    "stable-diffusion": stable_diffusion,
    "stable-diffusion-xl": stable_diffusion_xl,
    "stable-diffusion-3": stable_diffusion_3,
    "flux": flux,
}


def save(family: str, folder: Path) -> Path:
    """The tiny ``family`` pipeline (random weights, seed 0) saved into ``folder`` as the hub holds it."""
    torch.manual_seed(0)
    PIPELINES[family](folder.parent / f"{folder.name}-vocab").save_pretrained(folder)
    return folder
