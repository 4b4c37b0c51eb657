"""Model by model, opreg against ``torch.onnx.export(dynamo=True)``: architectures a new user
would try, random init and small configs, nothing downloaded. Not part of the suite.

    python bench/models_sweep.py --jobs 2            # everything not cached yet, then the report
    python bench/models_sweep.py --only 'timm/*'     # a subset (glob on the names --list prints)
    python bench/models_sweep.py --report            # the report from the cache alone
    python bench/models_sweep.py --list              # the catalog
    python bench/models_sweep.py --dynamic --jobs 2  # dynamic shapes from a batch of one (below)

The catalog (:func:`catalog`):

- transformers: a stated sample of ``*Model``/``*For*`` classes across its families (text
  encoders, decoders, encoder-decoders, vision, audio, multimodal), each from its default config
  made small (:func:`small_config`: 2 layers, hidden 64, 4 heads, ...), called as a user calls it
  (``model(input_ids, attention_mask=...)``: causal LMs then return their cache, as by default);
- timm: one model per family (``timm.list_modules()``), the one with the fewest parameters among
  its smallest-sounding names, at its default input size;
- torchvision: classification (one per family), segmentation, video and optical flow (RAFT with
  ``num_flow_updates=4``); its detection models are branch ``vision``'s;
- diffusers: UNets, VAEs and transformers from small configs, called with ``return_dict=False``.

Each model runs in a process of its own (``--timeout`` per exporter, the process killed at twice
that): the model is built (seeded) and run eagerly once; then torch.onnx exports it (first, so
opreg's pytree registrations cannot help it) and opreg does, each with its defaults (torch.onnx
at opset 18, opreg at ``target="onnx"``); ONNX Runtime runs each model on the same inputs (opreg's
through ``program.run``, torch.onnx's on the tensor leaves of the inputs) and each output is
compared with eager PyTorch: floating outputs within ``ATOL * max(1, max|eager|) + RTOL * |eager|``
element by element (``RTOL = 1e-3``, ``ATOL = 1e-4``: the scale of a random model's outputs varies),
integer and bool outputs exactly, the same number of outputs. A model passes when it exports,
runs and agrees. For opreg the record also says which captured ops sent the graph through torch's
decomposition (the audit of issue 24).

``--dynamic``: each model is exported the way its users export it with dynamic shapes, from a
batch of one: the batch (dim 0 of every input of two or more dims whose dim 0 is the builder's
batch) ``Dim.DYNAMIC``, and where the inputs have them the sequence length (dim 1 of integer
inputs of two dims, a decoder's separately), the number of audio samples and the image size
(the last two dims of four- and five-dim float inputs) ``Dim.AUTO``: kept dynamic where
``torch.export`` can. Both exporters get the same ``dynamic_shapes``. Each exported model is then
run at two other shapes (:data:`BATCHES`; each dim it kept dynamic scaled by :data:`SCALES`, the
others as in the example, inputs drawn like the example's) and compared with eager PyTorch by the
same rules. A model passes when it exports and agrees at both shapes. The report adds, for each
model failing in both, the guard that stopped it. Results go to ``build/models_sweep_dynamic.jsonl``.

Results are kept in ``build/models_sweep.jsonl``, one record per model and exporter, keyed by
what they depend on (opreg's sources, or torch's and onnxscript's versions): a rerun after a
change to opreg redoes opreg's side only. The report prints both pass / opreg only / torch only /
neither, the torch-only list, and each "neither" model's cause in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import hashlib
import io
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "models_sweep.jsonl"
DYNAMIC_CACHE = ROOT / "build" / "models_sweep_dynamic.jsonl"
MODE = {"dynamic": False}
"""``--dynamic``: this run's results go to :data:`DYNAMIC_CACHE`."""


def cache_path() -> Path:
    return DYNAMIC_CACHE if MODE["dynamic"] else CACHE


OPREG, TORCH_ONNX = "opreg", "torch.onnx"
EXPORTERS = (TORCH_ONNX, OPREG)  # torch.onnx first: opreg's registrations must not help it
RTOL, ATOL = 1e-3, 1e-4
PASS = "pass"
_SOURCES = (ROOT / "registry" / "opreg", ROOT / "core_ops" / "opreg_core_ops")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One architecture: ``name`` (``source/what``), its family, and how to build it."""

    name: str
    source: str
    family: str
    spec: tuple

    def key(self) -> str:
        return hashlib.sha256(repr((self.name, self.spec)).encode()).hexdigest()[:10]


# -- transformers ------------------------------------------------------------------------------

SMALL = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 128, "head_dim": 16, "d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2,
    "num_decoder_layers": 2, "num_heads": 4, "encoder_layers": 2, "decoder_layers": 2,
    "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
    "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128, "ffn_dim": 128, "embed_dim": 64,
    "num_experts": 4, "num_local_experts": 4, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
    "num_experts_per_tok": 2, "projection_dim": 32, "embedding_size": 64, "max_source_positions": 64,
    "num_mel_bins": 16, "n_routed_experts": 4, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8, "v_head_dim": 16, "conv_dim": [32, 32], "conv_stride": [5, 2], "conv_kernel": [10, 3],
    "num_feat_extract_layers": 2, "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4,
    "tdnn_dim": [32, 32], "tdnn_kernel": [3, 3], "tdnn_dilation": [1, 2], "xvector_output_dim": 32,
    "first_k_dense_replace": 1, "n_shared_experts": 1, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16,
}  # fmt: skip
"""Sizes a config is made small with, where its default is larger (and lists of the same length)."""
DEPTH_LISTS = ("depths", "num_layers_per_block", "encoder_layers_per_stage")
"""Per-stage depths of vision configs: each stage gets one block."""

TEXT, DECODER, SEQ2SEQ, VISION, AUDIO_WAVE, AUDIO_FEATURES, CLIP = (
    "text", "decoder", "encoder-decoder", "vision", "audio", "audio (features)", "multimodal",
)  # fmt: skip

TRANSFORMERS: list[tuple[str, str, str]] = [
    # (model_type, class, modality)
    *((t, c, TEXT) for t, c in [
        ("bert", "BertModel"), ("roberta", "RobertaForSequenceClassification"), ("distilbert", "DistilBertModel"),
        ("albert", "AlbertForMaskedLM"), ("electra", "ElectraModel"), ("deberta-v2", "DebertaV2ForTokenClassification"),
        ("xlm-roberta", "XLMRobertaModel"), ("mpnet", "MPNetModel"), ("funnel", "FunnelModel"), ("xlnet", "XLNetModel"),
        ("big_bird", "BigBirdModel"), ("fnet", "FNetModel"), ("modernbert", "ModernBertModel"),
        ("longformer", "LongformerModel"),
    ]),
    *((t, c, DECODER) for t, c in [
        ("gpt2", "GPT2LMHeadModel"), ("gpt_neo", "GPTNeoForCausalLM"), ("gptj", "GPTJForCausalLM"),
        ("gpt_neox", "GPTNeoXForCausalLM"), ("opt", "OPTForCausalLM"), ("bloom", "BloomForCausalLM"),
        ("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM"), ("mixtral", "MixtralForCausalLM"),
        ("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM"), ("phi3", "Phi3ForCausalLM"),
        ("gemma2", "Gemma2ForCausalLM"), ("gemma3_text", "Gemma3ForCausalLM"), ("falcon", "FalconForCausalLM"),
        ("mamba", "MambaForCausalLM"), ("deepseek_v3", "DeepseekV3ForCausalLM"),
        ("gpt_bigcode", "GPTBigCodeForCausalLM"),
        ("qwen3_next", "Qwen3NextForCausalLM"),
    ]),
    *((t, c, SEQ2SEQ) for t, c in [
        ("t5", "T5ForConditionalGeneration"), ("bart", "BartForConditionalGeneration"), ("marian", "MarianMTModel"),
        ("m2m_100", "M2M100ForConditionalGeneration"), ("mt5", "MT5Model"), ("led", "LEDModel"),
        ("switch_transformers", "SwitchTransformersModel"),
    ]),
    *((t, c, VISION) for t, c in [
        ("vit", "ViTForImageClassification"), ("deit", "DeiTModel"), ("beit", "BeitModel"), ("swin", "SwinModel"),
        ("swinv2", "Swinv2Model"), ("convnext", "ConvNextForImageClassification"),
        ("resnet", "ResNetForImageClassification"), ("mobilevit", "MobileViTModel"), ("levit", "LevitModel"),
        ("efficientnet", "EfficientNetModel"), ("segformer", "SegformerForSemanticSegmentation"),
        ("dinov2", "Dinov2Model"), ("dpt", "DPTForDepthEstimation"), ("hiera", "HieraModel"),
    ]),
    *((t, c, AUDIO_WAVE) for t, c in [
        ("wav2vec2", "Wav2Vec2ForCTC"), ("hubert", "HubertModel"), ("wavlm", "WavLMModel"),
    ]),
    *((t, c, AUDIO_FEATURES) for t, c in [
        ("whisper", "WhisperForConditionalGeneration"), ("speech_to_text", "Speech2TextModel"),
        ("audio-spectrogram-transformer", "ASTModel"),
    ]),
    *((t, c, CLIP) for t, c in [
        ("clip", "CLIPModel"), ("siglip", "SiglipModel"), ("owlvit", "OwlViTModel"), ("blip", "BlipModel"),
    ]),
]  # fmt: skip
"""The transformers sample: (model type, class, modality). Classes whose small config does not
build are reported as such and left out of the counts."""


def _shrink(values: dict[str, Any]) -> dict[str, Any]:
    """The overrides that make a config's dict small (sub-configs too)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and ("model_type" in value or "hidden_size" in value):
            sub = _shrink(value)
            if sub:
                out[key] = sub
        elif key in SMALL and isinstance(value, int) and not isinstance(value, bool) and isinstance(SMALL[key], int):
            if value > SMALL[key]:
                out[key] = SMALL[key]
        elif key in SMALL and isinstance(value, list) and isinstance(SMALL[key], list) and len(value) > 0:
            out[key] = SMALL[key]
        elif key in DEPTH_LISTS and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            out[key] = [1] * len(value)
    if "image_size" in values and isinstance(values["image_size"], int) and values["image_size"] > 224:
        out["image_size"] = 224
    return out


FITTED = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # one entry per layer
    "gptj": {"rotary_dim": 8},  # at most the head size
    "codegen": {"rotary_dim": 8},
    "deepseek_v3": {"head_dim": 8},  # its rotary part: qk_rope_head_dim
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention"]},  # one of each
    "swin": {"num_heads": [2, 4, 8, 16]},  # dividing the doubling widths
    "swinv2": {"num_heads": [2, 4, 8, 16]},
}
"""Settings a family's small config needs besides :data:`SMALL` to stay consistent."""


def small_config(model_type: str) -> Any:
    """``model_type``'s default config with :data:`SMALL` sizes (and one block per vision stage)."""
    import transformers

    base = transformers.AutoConfig.for_model(model_type)
    return transformers.AutoConfig.for_model(model_type, **{**_shrink(base.to_dict()), **FITTED.get(model_type, {})})


def _image_size(config: Any, default: int = 224) -> int:
    for source in (config, getattr(config, "vision_config", None)):
        size = getattr(source, "image_size", None) if source is not None else None
        if isinstance(size, (list, tuple)):
            size = size[0]
        if isinstance(size, int):
            return size
    return default


def build_transformers(model_type: str, class_name: str, modality: str) -> tuple[Any, tuple, dict[str, Any]]:
    import torch
    import transformers

    config = small_config(model_type)
    model = getattr(transformers, class_name)(config).eval()
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None) or 100
    ids = torch.randint(3, min(int(vocab), 1000), (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    if modality in (TEXT, DECODER):
        return model, (ids,), {"attention_mask": mask}
    if modality == SEQ2SEQ:
        return model, (ids,), {"attention_mask": mask, "decoder_input_ids": ids[:, :4]}
    if modality == VISION:
        size, channels = _image_size(config), getattr(config, "num_channels", 3)
        return model, (torch.randn(2, channels, size, size),), {}
    if modality == AUDIO_WAVE:
        return model, (torch.randn(2, 4000),), {}
    if modality == AUDIO_FEATURES:
        bins = getattr(config, "num_mel_bins", 80)
        if model_type == "whisper":
            frames = 2 * config.max_source_positions
            return model, (torch.randn(2, bins, frames),), {"decoder_input_ids": ids[:, :4]}
        if model_type == "audio-spectrogram-transformer":
            return model, (torch.randn(2, config.max_length, bins),), {}
        return (
            model,
            (torch.randn(2, 64, getattr(config, "input_feat_per_channel", bins)),),
            {"decoder_input_ids": ids[:, :4]},
        )
    if modality == CLIP:
        size = _image_size(config)
        pixels = torch.randn(2, 3, size, size)
        if model_type == "x_clip":
            frames = getattr(config.vision_config, "num_frames", 8)
            pixels = torch.randn(2, frames, 3, size, size)
        return model, (ids,), {"pixel_values": pixels, "attention_mask": mask}
    raise ValueError(f"unknown modality {modality}")


# -- timm -------------------------------------------------------------------------------------

_SMALL_WORDS = ("test", "atto", "femto", "pico", "nano", "tiny", "xxs", "xs", "mini", "small", "s0", "b0", "m0", "t0")
_BIG_WORDS = ("large", "huge", "giant", "gigantic", "enormous", "xl", "_l_", "big", "1b", "3b", "7b")


def _sounds_small(name: str) -> tuple[int, int, int]:
    small = next((i for i, w in enumerate(_SMALL_WORDS) if w in name), len(_SMALL_WORDS))
    big = any(w in name for w in _BIG_WORDS)
    return (int(big), small, len(name))


def timm_choice(module: str) -> str:
    """The model of a timm family with the fewest parameters among its five smallest-sounding
    names (counted on the meta device: nothing is allocated)."""
    import timm
    import torch

    names = sorted(timm.list_models(module=module), key=_sounds_small)
    best, fewest = names[0], math.inf
    for name in names[:5]:
        try:
            with torch.device("meta"):
                model = timm.create_model(name, pretrained=False)
        except Exception:
            continue
        count = sum(p.numel() for p in model.parameters())
        if count < fewest:
            best, fewest = name, count
    return best


def build_timm(name: str) -> tuple[Any, tuple, dict[str, Any]]:
    import timm
    import torch

    model = timm.create_model(name, pretrained=False).eval()
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    return model, (torch.randn(1, *size),), {}


# -- torchvision -----------------------------------------------------------------------------

TORCHVISION = [
    *(("classification", n) for n in (
        "alexnet", "vgg11", "resnet18", "resnext50_32x4d", "wide_resnet50_2", "squeezenet1_0", "densenet121",
        "inception_v3", "googlenet", "shufflenet_v2_x0_5", "mobilenet_v2", "mobilenet_v3_small", "mnasnet0_5",
        "efficientnet_b0", "efficientnet_v2_s", "regnet_x_400mf", "regnet_y_400mf", "vit_b_16", "convnext_tiny",
        "swin_t", "swin_v2_t", "maxvit_t",
    )),
    *(("segmentation", n) for n in (
        "fcn_resnet50", "deeplabv3_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large",
    )),
    *(("video", n) for n in ("r3d_18", "mc3_18", "r2plus1d_18", "s3d", "mvit_v1_b", "mvit_v2_s", "swin3d_t")),
    *(("optical_flow", n) for n in ("raft_small", "raft_large")),
]  # fmt: skip


def build_torchvision(kind: str, name: str) -> tuple[Any, tuple, dict[str, Any]]:
    import torch
    import torchvision

    options: dict[str, Any] = {"weights": None}
    if name in ("inception_v3", "googlenet"):
        options["aux_logits"] = False
        options["init_weights"] = True
    if kind == "segmentation":
        options["weights_backbone"] = None
        options["num_classes"] = 21
    model = torchvision.models.get_model(name, **options).eval()
    if kind == "video":
        frames, size = (16, 224) if name.startswith(("mvit", "s3d", "swin3d")) else (8, 112)
        return model, (torch.randn(1, 3, frames, size, size),), {}
    if kind == "optical_flow":
        frames = torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128)
        return model, frames, {"num_flow_updates": 4}
    size = 299 if name == "inception_v3" else 224
    return model, (torch.randn(1, 3, size, size),), {}


# -- diffusers -------------------------------------------------------------------------------


def _diffusers_table() -> dict[str, tuple[dict[str, Any], Callable[[], tuple[tuple, dict[str, Any]]]]]:
    """diffusers class -> (small config, inputs): every call with ``return_dict=False`` where it takes one."""
    import torch

    r, t = torch.randn, torch.tensor
    unet = dict(block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8)
    cross = dict(unet, cross_attention_dim=32, attention_head_dim=8)
    vae = dict(
        unet, latent_channels=4, down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2
    )
    flat = {"return_dict": False}
    image = lambda: ((r(1, 3, 32, 32),), flat)  # noqa: E731
    return {
        "UNet2DModel": (dict(unet, sample_size=32, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                             up_block_types=("AttnUpBlock2D", "UpBlock2D")),
                        lambda: ((r(1, 3, 32, 32), t([10])), flat)),
        "UNet2DConditionModel": (dict(cross, sample_size=32, in_channels=4, out_channels=4,
                                      down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                      up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")),
                                 lambda: ((r(1, 4, 32, 32), t([10]), r(1, 7, 32)), flat)),
        "ControlNetModel": (dict(cross, in_channels=4, conditioning_embedding_out_channels=(16, 16, 32, 32),
                                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D")),
                            lambda: ((r(1, 4, 32, 32), t([10]), r(1, 7, 32)),
                                     {"controlnet_cond": r(1, 3, 256, 256), **flat})),
        "UNet1DModel": (dict(block_out_channels=(32, 32, 64), in_channels=2, out_channels=2, extra_in_channels=64,
                             layers_per_block=1),
                        lambda: ((r(1, 2, 64), t([10])), flat)),
        "UNet3DConditionModel": (dict(cross, in_channels=4, out_channels=4, sample_size=16,
                                      down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                                      up_block_types=("UpBlock3D", "CrossAttnUpBlock3D")),
                                 lambda: ((r(1, 4, 2, 16, 16), t([10]), r(1, 7, 32)), flat)),
        "UNetSpatioTemporalConditionModel": (
            dict(block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=32, num_attention_heads=(2, 4),
                 in_channels=8, out_channels=4, sample_size=16, addition_time_embed_dim=4,
                 projection_class_embeddings_input_dim=12,
                 down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
                 up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal")),
            lambda: ((r(1, 2, 8, 16, 16), t([10]), r(1, 1, 32)), {"added_time_ids": r(1, 3), **flat})),
        "AutoencoderKL": (vae, image),
        "VQModel": (dict(vae, num_vq_embeddings=32), image),
        "AsymmetricAutoencoderKL": (
            dict(down_block_out_channels=(32, 64), up_block_out_channels=(32, 64), norm_num_groups=8,
                 layers_per_down_block=1, layers_per_up_block=1, latent_channels=4,
                 down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2),
            image),
        "AutoencoderKLTemporalDecoder": (
            dict(block_out_channels=(32, 64), latent_channels=4, layers_per_block=1,
                 down_block_types=("DownEncoderBlock2D",) * 2),
            lambda: ((r(2, 3, 32, 32),), {"num_frames": 2, **flat})),
        "AutoencoderTiny": (dict(encoder_block_out_channels=(16, 16), decoder_block_out_channels=(16, 16),
                                 num_encoder_blocks=(1, 1), num_decoder_blocks=(1, 1), latent_channels=4), image),
        "AutoencoderDC": (
            dict(in_channels=3, latent_channels=4, encoder_block_out_channels=(16, 32),
                 decoder_block_out_channels=(16, 32), encoder_layers_per_block=(1, 1),
                 decoder_layers_per_block=(1, 1), attention_head_dim=8, encoder_block_types="ResBlock",
                 decoder_block_types="ResBlock", encoder_qkv_multiscales=((), ()), decoder_qkv_multiscales=((), ()),
                 decoder_norm_types="rms_norm", decoder_act_fns="silu"),
            image),
        "DiTTransformer2DModel": (
            dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=2,
                 sample_size=8, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=4),
            lambda: ((r(1, 4, 8, 8),), {"timestep": t([3]), "class_labels": t([1]), **flat})),
        "PixArtTransformer2DModel": (
            dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2,
                 sample_size=8, patch_size=2, cross_attention_dim=32, caption_channels=16, norm_num_groups=4),
            lambda: ((r(1, 4, 8, 8),), {"encoder_hidden_states": r(1, 7, 16), "timestep": t([3]),
                                        "added_cond_kwargs": {"resolution": None, "aspect_ratio": None}, **flat})),
        "SD3Transformer2DModel": (  # called as a user does, returning its unkeyed Transformer2DModelOutput
            dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
                 joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=16, out_channels=4,
                 pos_embed_max_size=16),
            lambda: ((r(1, 4, 8, 8),), {"encoder_hidden_states": r(1, 7, 32), "pooled_projections": r(1, 16),
                                        "timestep": t([3])})),
        "FluxTransformer2DModel": (  # the same
            dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6)),
            lambda: ((r(1, 16, 16),), {"encoder_hidden_states": r(1, 7, 32), "pooled_projections": r(1, 16),
                                       "timestep": t([0.5]), "img_ids": r(16, 3), "txt_ids": r(7, 3)})),
        "HunyuanDiT2DModel": (
            dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, learn_sigma=False, patch_size=2,
                 sample_size=8, hidden_size=32, num_layers=2, cross_attention_dim=32, cross_attention_dim_t5=32,
                 pooled_projection_dim=16, text_len=7, text_len_t5=7),
            lambda: ((r(1, 4, 8, 8), t([3.0])), {  # a float timestep: its dtype is the embeddings'
                "encoder_hidden_states": r(1, 7, 32), "text_embedding_mask": torch.ones(1, 7),
                "encoder_hidden_states_t5": r(1, 7, 32), "text_embedding_mask_t5": torch.ones(1, 7),
                "image_meta_size": r(1, 6), "style": torch.zeros(1, dtype=torch.long),
                "image_rotary_emb": (r(16, 16), r(16, 16)), **flat})),
        "AuraFlowTransformer2DModel": (
            dict(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
                 attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
                 out_channels=4, pos_embed_max_size=16),
            lambda: ((r(1, 4, 8, 8),), {"encoder_hidden_states": r(1, 7, 32), "timestep": t([3]), **flat})),
        "CogVideoXTransformer3DModel": (
            dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=8,
                 text_embed_dim=32, num_layers=1, sample_width=8, sample_height=8, sample_frames=9, patch_size=2,
                 temporal_compression_ratio=4, max_text_seq_length=7),
            lambda: ((r(1, 3, 4, 8, 8), r(1, 7, 32), t([3])), flat)),
        "SanaTransformer2DModel": (
            dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
                 num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32,
                 caption_channels=16, sample_size=8, patch_size=1),
            lambda: ((r(1, 4, 8, 8), r(1, 7, 16), t([3])), flat)),
        "LTXVideoTransformer3DModel": (
            dict(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2,
                 attention_head_dim=8, cross_attention_dim=16, num_layers=1, caption_channels=16),
            lambda: ((r(1, 32, 8), r(1, 7, 16), t([3]), torch.ones(1, 7)),
                     {"num_frames": 2, "height": 4, "width": 4, **flat})),
        "WanTransformer3DModel": (
            dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                 text_dim=16, freq_dim=32, ffn_dim=32, num_layers=1, rope_max_seq_len=32),
            lambda: ((r(1, 4, 2, 8, 8), t([3]), r(1, 7, 16)), flat)),
        "Lumina2Transformer2DModel": (
            dict(sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=1, num_refiner_layers=1,
                 num_attention_heads=2, num_kv_heads=2, multiple_of=16, cap_feat_dim=16, axes_dim_rope=(4, 6, 6),
                 axes_lens=(64, 16, 16)),
            lambda: ((r(1, 4, 8, 8), t([0.5]), r(1, 7, 16), torch.ones(1, 7, dtype=torch.bool)), flat)),
        "PriorTransformer": (
            dict(num_attention_heads=2, attention_head_dim=8, num_layers=2, embedding_dim=16, num_embeddings=7,
                 additional_embeddings=4),
            lambda: ((r(1, 16), t([3]), r(1, 16)), {"encoder_hidden_states": r(1, 7, 16),
                                                      "attention_mask": torch.ones(1, 7, dtype=torch.bool), **flat})),
    }  # fmt: skip


DIFFUSERS = [
    "UNet2DModel", "UNet2DConditionModel", "UNet1DModel", "UNet3DConditionModel", "UNetSpatioTemporalConditionModel",
    "ControlNetModel", "AutoencoderKL", "AutoencoderTiny", "VQModel", "AsymmetricAutoencoderKL",
    "AutoencoderKLTemporalDecoder", "AutoencoderDC", "DiTTransformer2DModel", "PixArtTransformer2DModel",
    "SD3Transformer2DModel", "FluxTransformer2DModel", "HunyuanDiT2DModel", "AuraFlowTransformer2DModel",
    "CogVideoXTransformer3DModel", "SanaTransformer2DModel", "LTXVideoTransformer3DModel", "WanTransformer3DModel",
    "Lumina2Transformer2DModel", "PriorTransformer",
]  # fmt: skip


def build_diffusers(name: str) -> tuple[Any, tuple, dict[str, Any]]:
    import diffusers

    config, inputs = _diffusers_table()[name]
    args, kwargs = inputs()
    return getattr(diffusers, name)(**config).eval(), args, kwargs


# -- the libraries of issue 38's probe ---------------------------------------------------------

PROBE = [
    *(("ultralytics", n) for n in (
        "yolo11n.yaml", "yolo11n-seg.yaml", "yolo11n-pose.yaml", "yolo11n-obb.yaml", "yolo11n-cls.yaml",
        "yolov8n.yaml", "rtdetr-l.yaml",
    )),
    ("segmentation_models_pytorch", "Unet"), ("segmentation_models_pytorch", "FPN"),
    ("kornia", "gaussian_blur2d"), ("kornia", "resize_antialias"),
    ("open_clip", "ViT-B-32"),
]  # fmt: skip
"""Models of the libraries a probe of dynamic exports tried (issue 38), built when the library is
installed (none is a dependency of opreg: ``pip install --no-deps`` them beside the locked torch);
else each is reported as not built and left out of the counts."""


def build_probe(library: str, name: str) -> tuple[Any, tuple, dict[str, Any]]:
    import torch

    if library == "ultralytics":
        import os

        os.environ.setdefault("YOLO_OFFLINE", "1")
        from ultralytics import RTDETR, YOLO

        model = (RTDETR if name.startswith("rtdetr") else YOLO)(name).model.eval()
        for module in model.modules():  # as ultralytics' own exporter prepares the heads
            if hasattr(module, "export"):
                module.export, module.format, module.dynamic = True, "onnx", True
        size = 224 if "-cls" in name else 320
        return model, (torch.randn(1, 3, size, size),), {}
    if library == "segmentation_models_pytorch":
        import segmentation_models_pytorch as smp

        model = getattr(smp, name)("resnet18", encoder_weights=None, classes=3).eval()
        return model, (torch.randn(1, 3, 128, 128),), {}
    if library == "kornia":
        import kornia

        class Op(torch.nn.Module):
            def forward(self, image: torch.Tensor) -> torch.Tensor:
                if name == "gaussian_blur2d":
                    return kornia.filters.gaussian_blur2d(image, (5, 5), (1.5, 1.5))
                return kornia.geometry.transform.resize(image, (32, 32), antialias=True)

        return Op().eval(), (torch.randn(1, 3, 64, 64),), {}
    if library == "open_clip":
        import open_clip

        model = open_clip.create_model(name, pretrained=None).eval()

        class Image(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, image: torch.Tensor) -> torch.Tensor:
                return self.model.encode_image(image)

        return Image().eval(), (torch.randn(1, 3, 224, 224),), {}
    raise ValueError(f"unknown probe library {library}")


# -- the catalog --------------------------------------------------------------------------------


def catalog(timm_names: dict[str, str] | None = None) -> list[Entry]:
    """Every architecture of the sweep (timm's choices from ``timm_names``, else computed)."""
    entries = [Entry(f"transformers/{c}", "transformers", m, (t, c, m)) for t, c, m in TRANSFORMERS]
    timm_names = timm_names if timm_names is not None else timm_choices()
    entries += [Entry(f"timm/{n}", "timm", module, (n,)) for module, n in sorted(timm_names.items())]
    entries += [Entry(f"torchvision/{n}", "torchvision", k, (k, n)) for k, n in TORCHVISION]
    entries += [Entry(f"diffusers/{n}", "diffusers", "diffusion", (n,)) for n in DIFFUSERS]
    entries += [Entry(f"probe/{lib}/{n.removesuffix('.yaml')}", "probe", lib, (lib, n)) for lib, n in PROBE]
    return entries


def timm_choices() -> dict[str, str]:
    """timm family -> the model picked for it (computed once, kept in ``build/``)."""
    import timm

    path = ROOT / "build" / f"models_sweep_timm_{timm.__version__}.json"
    if path.is_file():
        return json.loads(path.read_text())
    chosen = {module: timm_choice(module) for module in timm.list_modules()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chosen, indent=1, sort_keys=True))
    return chosen


BUILDERS: dict[str, Callable[..., tuple[Any, tuple, dict[str, Any]]]] = {
    "transformers": build_transformers, "timm": build_timm, "torchvision": build_torchvision,
    "diffusers": build_diffusers, "probe": build_probe,
}  # fmt: skip


# -- one model, in its own process ---------------------------------------------------------------


def fingerprint(exporter: str) -> str:
    """What a result of ``exporter`` depends on: opreg's sources (its test kit aside), or torch.onnx's versions."""
    if exporter == OPREG:
        digest = hashlib.sha256()
        for folder in _SOURCES:
            for path in sorted(p for p in folder.rglob("*.py") if "testing" not in p.parts):
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
        return digest.hexdigest()[:12]
    import onnxruntime
    import onnxscript
    import torch

    return f"torch {torch.__version__}, onnxscript {onnxscript.__version__}, onnxruntime {onnxruntime.__version__}"


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def one_line(error: BaseException | str, limit: int = 300) -> str:
    """The first informative lines of an error, on one line: torch.onnx wraps the cause in banners
    and an "Exception summary", whose first lines are what is kept then."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    text = re.sub(r"\x1b?\[\d+(;\d+)*m", "", text)
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    keep = [
        line for line in lines
        if not line.startswith(("[", "-", "#", "For more", "See ", "The above", "Traceback", "(Refer to"))
    ]  # fmt: skip
    line = " | ".join((keep or lines or ["?"])[:2])
    return line if len(line) <= limit else line[: limit - 3] + "..."


def compare(got: list[Any], expected: list[Any]) -> tuple[bool, float, str]:
    """Whether every output agrees with eager PyTorch (see the module docstring); the largest
    absolute difference, and what disagreed."""
    import torch

    if len(got) != len(expected):
        return False, math.inf, f"{len(got)} outputs, eager PyTorch returns {len(expected)}"
    worst = 0.0
    for index, (value, e) in enumerate(zip(got, expected, strict=True)):
        if not isinstance(e, torch.Tensor):
            if value != e:
                return False, math.inf, f"output {index}: {value!r} != {e!r}"
            continue
        g = torch.as_tensor(value)
        if tuple(g.shape) != tuple(e.shape):
            return False, math.inf, f"output {index}: shape {tuple(g.shape)}, eager {tuple(e.shape)}"
        if e.numel() == 0:
            continue
        if not (e.dtype.is_floating_point or e.is_complex()):
            if not torch.equal(g.to(e.dtype), e):
                return False, math.inf, f"output {index} ({e.dtype}): values differ"
            continue
        g64, e64 = g.to(torch.float64), e.detach().to(torch.float64)
        finite = torch.isfinite(e64)
        scale = float(e64[finite].abs().max()) if finite.any() else 1.0
        diff = (g64 - e64).abs()
        bound = ATOL * max(1.0, scale) + RTOL * e64.abs()
        bad = ~((diff <= bound) | (torch.isnan(g64) & torch.isnan(e64)) | (g64 == e64))
        worst = max(worst, float(diff[finite].max()) if finite.any() else 0.0)
        if bool(bad.any()):
            return False, worst, f"output {index}: {int(bad.sum())} of {e.numel()} elements off (max abs {worst:.3g})"
    return True, worst, ""


def _tensors(value: Any) -> list[Any]:
    import torch

    return [leaf for leaf in torch.utils._pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def run_torch_onnx(model: Any, args: tuple, kwargs: dict[str, Any], expected: Any) -> dict[str, Any]:
    import onnxruntime
    import torch

    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, verbose=False)
    exported = time.perf_counter() - started
    record: dict[str, Any] = {"export_s": round(exported, 2)}
    try:
        session = onnxruntime.InferenceSession(
            program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        feeds = _tensors((args, kwargs))
        names = [i.name for i in session.get_inputs()]
        outputs = session.run(None, {n: t.detach().numpy() for n, t in zip(names, feeds, strict=False)})
    except Exception as e:
        return {**record, "stage": "run", "error": one_line(e)}
    ok, worst, why = compare([torch.from_numpy(o) for o in outputs], _tensors(expected))
    return {**record, "stage": PASS if ok else "match", "max_abs": worst, "error": why}


def run_opreg(model: Any, args: tuple, kwargs: dict[str, Any], expected: Any) -> dict[str, Any]:
    import torch

    import opreg

    reasons: list[str] = []

    class Listen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("running torch's decomposition for: "):
                reasons.extend(record.getMessage().split(": ", 1)[1].split(", "))

    listener = Listen()
    decompose_log = logging.getLogger("opreg.exporter._decompose")
    decompose_log.addHandler(listener)
    decompose_log.setLevel(logging.INFO)
    started = time.perf_counter()
    try:
        program = opreg.export(model, args, kwargs)
    finally:
        decompose_log.removeHandler(listener)
    record: dict[str, Any] = {"export_s": round(time.perf_counter() - started, 2), "decomposed_for": reasons}
    try:
        got = program.run(*args, **kwargs)
    except Exception as e:
        return {**record, "stage": "run", "error": one_line(e)}
    leaves = torch.utils._pytree.tree_leaves
    ok, worst, why = compare(leaves(got), leaves(expected))
    return {**record, "stage": PASS if ok else "match", "max_abs": worst, "error": why}


RUNNERS = {TORCH_ONNX: run_torch_onnx, OPREG: run_opreg}


def worker(name: str, exporters: list[str], timeout: int, dynamic: bool = False) -> None:
    """Build ``name``, run it eagerly, and try each exporter; one ``RESULT {json}`` line each."""
    import torch

    logging.basicConfig(level=logging.ERROR)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    entry = {e.name: e for e in catalog(timm_choices())}[name]
    signal.signal(signal.SIGALRM, _alarm)

    prints = {exporter: fingerprint(exporter) for exporter in exporters}  # of the code this process runs

    def emit(exporter: str, record: dict[str, Any]) -> None:
        print("RESULT " + json.dumps({"exporter": exporter, "fingerprint": prints[exporter], **record}), flush=True)

    try:
        signal.alarm(timeout)
        model, args, kwargs = BUILDERS[entry.source](*entry.spec)
        if dynamic:
            signal.alarm(0)
            dynamic_worker(entry, model, args, kwargs, exporters, timeout, emit)
            return
        with torch.no_grad():
            expected = model(*args, **kwargs)
        signal.alarm(0)
    except BaseException as e:
        signal.alarm(0)
        for exporter in exporters:
            emit(exporter, {"stage": "build", "error": one_line("timed out" if isinstance(e, _Timeout) else e)})
        return
    for exporter in exporters:
        started = time.perf_counter()
        signal.alarm(timeout)
        try:
            with torch.no_grad():
                record = RUNNERS[exporter](model, args, kwargs, expected)
        except _Timeout:
            record = {"stage": "export", "error": f"timed out after {timeout} s"}
        except BaseException as e:
            record = {"stage": "export", "error": one_line(e)}
        finally:
            signal.alarm(0)
        record["seconds"] = round(time.perf_counter() - started, 2)
        emit(exporter, record)


# -- dynamic shapes (--dynamic) ------------------------------------------------------------------

BATCHES = (3, 5)
"""The batch sizes of the two other shapes a dynamic export is run at."""
SCALES = (1.5, 2.0)
"""Each other dim the export kept dynamic (sequence length, audio samples, image size) at the two
other shapes: the example's size times these."""


@dataclasses.dataclass
class Plan:
    """A model's batch-1 example for the dynamic run, what each dim of its tensor inputs stands for
    (``roles``: leaf index -> dim -> ``batch``, ``seq``, ``h224``...), and the ``dynamic_shapes``."""

    args: tuple
    kwargs: dict[str, Any]
    leaves: list[Any]
    treespec: Any
    roles: dict[int, dict[int, str]]
    dynamic_shapes: Any


def _size_roles(entry: Entry, key: str, leaf: Any) -> dict[int, str]:
    import torch

    floating = leaf.dtype.is_floating_point
    if leaf.dim() == 2 and not floating and leaf.dtype != torch.bool:
        return {1: "dseq" if "decoder" in key else "seq"}
    if leaf.dim() == 2 and floating and entry.family == AUDIO_WAVE:
        return {1: "samples"}
    if leaf.dim() in (4, 5) and floating and min(leaf.shape[-2:]) >= 8:
        return {leaf.dim() - 2: f"h{leaf.shape[-2]}", leaf.dim() - 1: f"w{leaf.shape[-1]}"}
    return {}


def dynamic_plan(entry: Entry, args: tuple, kwargs: dict[str, Any], model: Any) -> Plan:
    """The batch-1 example of the builder's inputs and the dims to make dynamic (module docstring)."""
    import torch
    from torch.export import Dim

    pairs, treespec = torch.utils._pytree.tree_flatten_with_path((args, kwargs))
    tensors = [leaf for _, leaf in pairs if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2]
    batch = int(tensors[0].shape[0]) if tensors else None
    leaves, roles = [], {}
    shapes = torch.export.ShapesCollection()
    for index, (path, leaf) in enumerate(pairs):
        if isinstance(leaf, torch.Tensor):
            found: dict[int, str] = {}
            one = leaf
            if leaf.dim() >= 2 and int(leaf.shape[0]) == batch:
                one = leaf[:1].clone()
                found[0] = "batch"
            found.update(_size_roles(entry, torch.utils._pytree.keystr(path), one))
            roles[index] = found
            if found:
                shapes[one] = {d: Dim.DYNAMIC if role == "batch" else Dim.AUTO for d, role in found.items()}
            leaves.append(one)
        else:
            leaves.append(leaf)
    args, kwargs = torch.utils._pytree.tree_unflatten(leaves, treespec)
    return Plan(args, kwargs, leaves, treespec, roles, shapes.dynamic_shapes(model, args, kwargs))


def kept_roles(plan: Plan, onnx_inputs: list[list[Any]]) -> set[str]:
    """The roles whose every dim is symbolic in the model's inputs (one shape per tensor leaf)."""
    import torch

    tensors = [i for i, leaf in enumerate(plan.leaves) if isinstance(leaf, torch.Tensor)]
    symbolic: dict[str, bool] = {}
    for position, index in enumerate(tensors):
        shape = onnx_inputs[position] if position < len(onnx_inputs) else None
        for dim, role in plan.roles.get(index, {}).items():
            free = shape is not None and dim < len(shape) and not isinstance(shape[dim], int)
            symbolic[role] = symbolic.get(role, True) and free
    return {role for role, free in symbolic.items() if free}


def _drawn_like(example: Any, shape: list[int]) -> Any:
    import torch

    if example.dtype == torch.bool or not example.dtype.is_floating_point:
        low, high = int(example.min()), int(example.max())
        if low == high:
            return torch.full(shape, low, dtype=example.dtype)
        return torch.randint(low, high + 1, shape, dtype=torch.int64).to(example.dtype)
    return torch.randn(shape, dtype=example.dtype)


def other_inputs(plan: Plan, which: int, kept: set[str]) -> tuple[tuple, dict[str, Any]]:
    """The inputs of the ``which``-th other shape: each dim of a kept role at its new size."""
    import torch

    torch.manual_seed(100 + which)
    leaves = []
    for index, leaf in enumerate(plan.leaves):
        roles = plan.roles.get(index, {})
        if isinstance(leaf, torch.Tensor) and any(role in kept for role in roles.values()):
            shape = list(leaf.shape)
            for dim, role in roles.items():
                if role in kept:
                    shape[dim] = BATCHES[which] if role == "batch" else round(shape[dim] * SCALES[which])
            leaves.append(_drawn_like(leaf, shape))
        else:
            leaves.append(leaf)
    return torch.utils._pytree.tree_unflatten(leaves, plan.treespec)


def _onnx_shapes(proto: Any) -> list[list[Any]]:
    return [
        [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
        for value in proto.graph.input
    ]


_GUARD_LINE = re.compile(r"^\s*- .*(guard|specialized|static shape|Eq\(|==|<=|!=).*$", re.M)


def stopping_guard(text: str) -> str:
    """The first line of an exporter's error that names a guard on a dim (``""`` when none does)."""
    match = _GUARD_LINE.search(re.sub(r"\x1b?\[\d+(;\d+)*m", "", text))
    return match.group(0).strip()[:240] if match else ""


def run_dynamic(exporter: str, model: Any, plan: Plan, eager: Callable[[int, frozenset[str]], Any]) -> dict[str, Any]:
    """Export ``model`` from ``plan``'s example with its dynamic shapes and compare it with eager
    PyTorch at the two other shapes (``eager(which, kept)`` gives eager's outputs, or raises)."""
    import onnxruntime
    import torch

    started = time.perf_counter()
    try:
        if exporter == TORCH_ONNX:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.onnx.export(
                    model, plan.args, kwargs=plan.kwargs, dynamic_shapes=plan.dynamic_shapes, dynamo=True,
                    verbose=False,
                )  # fmt: skip
            proto = program.model_proto
            session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
            names = [i.name for i in session.get_inputs()]

            def run(args: tuple, kwargs: dict[str, Any]) -> list[Any]:
                feeds = {n: t.detach().numpy() for n, t in zip(names, _tensors((args, kwargs)), strict=False)}
                return [torch.from_numpy(o) for o in session.run(None, feeds)]
        else:
            import opreg

            program = opreg.export(model, plan.args, plan.kwargs, dynamic_shapes=plan.dynamic_shapes)
            proto = program.model_proto

            def run(args: tuple, kwargs: dict[str, Any]) -> list[Any]:
                return torch.utils._pytree.tree_leaves(program.run(*args, **kwargs))
    except Exception as e:
        text = f"{type(e).__name__}: {e}"
        return {"stage": "export", "error": one_line(e), "guard": stopping_guard(text)}
    kept = frozenset(kept_roles(plan, _onnx_shapes(proto)))
    record: dict[str, Any] = {"export_s": round(time.perf_counter() - started, 2), "kept": sorted(kept)}
    if exporter == OPREG:
        record["fixed_dims"] = [str(f) for f in program.fixed_dims]
        record["shape_guards"] = [str(g) for g in program.shape_guards]  # the guards the model does not check
    if "batch" not in kept:
        return {**record, "stage": "batch", "error": "the batch is not dynamic in the model's inputs"}
    worst = 0.0
    for which in range(len(BATCHES)):
        try:
            expected = eager(which, kept)
        except Exception as e:  # the model takes some sizes only: test the batch alone
            if kept == {"batch"}:
                return {**record, "stage": "eager", "error": f"eager PyTorch fails at the other shape: {one_line(e)}"}
            kept = frozenset({"batch"})
            record["tested"] = ["batch"]
            expected = eager(which, kept)
        args, kwargs = other_inputs(plan, which, kept)
        try:
            got = run(args, kwargs)
        except Exception as e:
            return {**record, "stage": "run", "error": f"shape {which + 1}: {one_line(e)}"}
        want = torch.utils._pytree.tree_leaves(expected) if exporter == OPREG else _tensors(expected)
        ok, diff, why = compare(got, want)
        worst = max(worst, diff)
        if not ok:
            return {**record, "stage": "match", "max_abs": worst, "error": f"shape {which + 1}: {why}"}
    return {**record, "stage": PASS, "max_abs": worst}


def dynamic_worker(entry: Entry, model: Any, args: tuple, kwargs: dict[str, Any], exporters: list[str],
                   timeout: int, emit: Callable[[str, dict[str, Any]], None]) -> None:  # fmt: skip
    import torch

    plan = dynamic_plan(entry, args, kwargs, model)
    eager_cache: dict[tuple[int, frozenset[str]], Any] = {}

    def eager(which: int, kept: frozenset[str]) -> Any:
        if (which, kept) not in eager_cache:
            other_args, other_kwargs = other_inputs(plan, which, kept)
            with torch.no_grad():
                eager_cache[which, kept] = model(*other_args, **other_kwargs)
        return eager_cache[which, kept]

    for exporter in exporters:
        started = time.perf_counter()
        signal.alarm(timeout)
        try:
            with torch.no_grad():
                record = run_dynamic(exporter, model, plan, eager)
        except _Timeout:
            record = {"stage": "export", "error": f"timed out after {timeout} s"}
        except BaseException as e:
            record = {"stage": "export", "error": one_line(e)}
        finally:
            signal.alarm(0)
        record["seconds"] = round(time.perf_counter() - started, 2)
        emit(exporter, record)


# -- the sweep -----------------------------------------------------------------------------------


def load_cache() -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    if cache_path().is_file():
        for line in cache_path().read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                found[(record["name"], record["exporter"])] = record
    return found


def _fresh(record: dict[str, Any] | None, entry: Entry, prints: dict[str, str]) -> bool:
    return (
        record is not None
        and record.get("fingerprint") == prints[record["exporter"]]
        and record.get("entry") == entry.key()
    )


def run_entry(entry: Entry, exporters: list[str], timeout: int, prints: dict[str, str]) -> list[dict[str, Any]]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", entry.name,
               "--exporters", ",".join(exporters), "--timeout", str(timeout)]  # fmt: skip
    if MODE["dynamic"]:
        command.append("--dynamic")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=2 * timeout + 120, cwd=ROOT, env=env, check=False
        )
        out, err, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, code = f"killed after {2 * timeout + 120} s", None
    records = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            record = json.loads(line[len("RESULT ") :])
            records[record["exporter"]] = record
    for exporter in exporters:
        if exporter not in records:
            tail = [line for line in (err or "").splitlines() if line.strip()][-1:] or [f"exit code {code}"]
            records[exporter] = {"exporter": exporter, "stage": "export", "error": one_line(f"process died: {tail[0]}")}
    result = []
    for exporter in exporters:
        record = {
            "name": entry.name,
            "source": entry.source,
            "family": entry.family,
            "entry": entry.key(),
            "fingerprint": prints[exporter],
            **records[exporter],
        }  # fmt: skip  (the worker's, when it said)
        result.append(record)
    return result


def sweep(entries: list[Entry], jobs: int, timeout: int, rerun: bool, keep: bool = False) -> None:
    prints = {e: fingerprint(e) for e in EXPORTERS}
    cache = load_cache()
    todo = []
    for entry in entries:
        wanted = [
            e
            for e in EXPORTERS
            if rerun or not (_fresh(cache.get((entry.name, e)), entry, prints) or (keep and (entry.name, e) in cache))
        ]
        if wanted:
            todo.append((entry, wanted))
    print(f"{len(entries)} models, {len(todo)} to run ({jobs} at a time, {timeout} s per exporter)", flush=True)
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool, cache_path().open("a") as sink:
        futures = [(entry, pool.submit(run_entry, entry, wanted, timeout, prints)) for entry, wanted in todo]
        for count, (entry, future) in enumerate(futures, 1):
            records = future.result()
            for record in records:
                sink.write(json.dumps(record) + "\n")
            sink.flush()
            states = ", ".join(f"{r['exporter']} {r['stage']}" for r in records)
            print(f"[{count}/{len(todo)}] {entry.name}: {states}", flush=True)


def report(entries: list[Entry]) -> int:
    cache = load_cache()
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in entries:
        got = {e: cache.get((entry.name, e)) for e in EXPORTERS}
        if all(r is not None for r in got.values()):
            rows[entry.name] = got  # type: ignore[assignment]
    built = {n: r for n, r in rows.items() if not all(x["stage"] == "build" for x in r.values())}
    unbuilt = sorted(set(rows) - set(built))
    groups: dict[str, list[str]] = {"both pass": [], "opreg only": [], "torch only": [], "neither": []}
    for name, got in built.items():
        opreg_ok, torch_ok = got[OPREG]["stage"] == PASS, got[TORCH_ONNX]["stage"] == PASS
        key = {(True, True): "both pass", (True, False): "opreg only", (False, True): "torch only"}.get(
            (opreg_ok, torch_ok), "neither"
        )
        groups[key].append(name)
    by_source: dict[str, dict[str, int]] = {}
    for key, names in groups.items():
        for name in names:
            source = name.split("/", 1)[0]
            by_source.setdefault(source, dict.fromkeys(groups, 0))[key] += 1
    prints = {e: fingerprint(e) for e in EXPORTERS}
    stale = sum(1 for got in rows.values() for r in got.values() if r.get("fingerprint") != prints[r["exporter"]])
    print(f"\n{len(built)} architectures tried by both (results in {cache_path().relative_to(ROOT)}", end="")
    print(f"; {stale} results made by other code: rerun without --keep)" if stale else ")")
    print(f"{'source':<14}" + "".join(f"{k:>12}" for k in groups) + f"{'total':>8}")
    for source, counts in sorted(by_source.items()):
        print(f"{source:<14}" + "".join(f"{counts[k]:>12}" for k in groups) + f"{sum(counts.values()):>8}")
    print(f"{'all':<14}" + "".join(f"{len(v):>12}" for v in groups.values()) + f"{len(built):>8}")
    print(f"\ntorch only ({len(groups['torch only'])}):")
    for name in sorted(groups["torch only"]):
        r = built[name][OPREG]
        print(f"  {name}: opreg {r['stage']}: {r.get('error', '')}")
    print(f"\nopreg only ({len(groups['opreg only'])}):")
    for name in sorted(groups["opreg only"]):
        r = built[name][TORCH_ONNX]
        print(f"  {name}: torch.onnx {r['stage']}: {r.get('error', '')}")
    print(f"\nneither ({len(groups['neither'])}), with the cause:")
    for name in sorted(groups["neither"]):
        a, b = built[name][OPREG], built[name][TORCH_ONNX]
        print(f"  {name}: opreg {a['stage']}: {a.get('error', '')[:160]} || torch.onnx {b['stage']}: "
              f"{b.get('error', '')[:120]}")  # fmt: skip
        guards = [f"{e} {r['guard']}" for e, r in ((OPREG, a), (TORCH_ONNX, b)) if r.get("guard")]
        if guards:
            print("      guard: " + " || ".join(guards))
    decomposed = {n: r[OPREG].get("decomposed_for") for n, r in built.items() if r[OPREG].get("decomposed_for")}
    print(f"\nopreg ran torch's decomposition for {len(decomposed)} of {len(built)} models, because of:")
    counts: dict[str, int] = {}
    for reasons in decomposed.values():
        for reason in reasons:
            counts[reason] = counts.get(reason, 0) + 1
    for reason, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {count:>4}  {reason}")
    if unbuilt:
        print(f"\nleft out: {len(unbuilt)} did not build from a small config or take the sample inputs:")
        for name in unbuilt:
            print(f"  {name}: {rows[name][OPREG].get('error', '')[:160]}")
    return 0


def _select(entries: list[Entry], patterns: list[str] | None, sources: list[str] | None) -> Iterator[Entry]:
    for entry in entries:
        if sources and entry.source not in sources:
            continue
        if patterns and not any(fnmatch.fnmatch(entry.name, p) for p in patterns):
            continue
        yield entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", "-j", type=int, default=1, help="models at a time (at most 2 here)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per exporter (and for building)")
    parser.add_argument("--only", action="append", help="glob on model names (repeatable)")
    parser.add_argument("--source", action="append", help="transformers, timm, torchvision or diffusers")
    parser.add_argument("--rerun", action="store_true", help="ignore cached results")
    parser.add_argument("--keep", action="store_true", help="keep cached results made by other code (iterating)")
    parser.add_argument("--report", action="store_true", help="print the report from the cache only")
    parser.add_argument("--list", action="store_true", help="print the catalog")
    parser.add_argument("--dynamic", action="store_true", help="dynamic shapes from a batch of one (see above)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--exporters", default=",".join(EXPORTERS), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.dynamic:
        MODE["dynamic"] = True
    if options.worker:
        worker(options.worker, options.exporters.split(","), options.timeout, options.dynamic)
        return 0
    entries = list(_select(catalog(), options.only, options.source))
    if options.list:
        for entry in entries:
            print(f"{entry.name:<60} {entry.family}")
        print(f"{len(entries)} models")
        return 0
    if not options.report:
        sweep(entries, max(1, min(options.jobs, 2)), options.timeout, options.rerun, options.keep)
    return report(entries)


if __name__ == "__main__":
    sys.exit(main())
