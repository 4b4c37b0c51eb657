"""Tiny random vision, vision-text and audio checkpoints, written with ``save_pretrained`` as the
hub holds them: the folders tests/test_checkpoint_media.py exports (and that a runtime's check, such
as tools/tjs_media.mjs, can load). Hidden sizes of 32 or less, two layers, a few labels; nothing is
downloaded.

``save(name, folder)`` writes the checkpoint ``name`` (one of :data:`CHECKPOINTS`) into ``folder``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers as T

LAYERS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
LABELS = dict(num_labels=3)
TEXT = dict(vocab_size=99, max_position_embeddings=20, **LAYERS)
VISION = dict(image_size=32, patch_size=8, **LAYERS)
AUDIO = dict(
    conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2, vocab_size=12, **LAYERS, **LABELS,
)  # fmt: skip
SEGMENTS = dict(
    num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2],
    patch_sizes=[7, 3], strides=[4, 2], decoder_hidden_size=16, mlp_ratios=[2, 2],
)  # fmt: skip

DEPTH = dict(
    **{**VISION, "num_hidden_layers": 4}, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 24, 32],
    fusion_hidden_size=16, head_hidden_size=8,
)  # fmt: skip


def _detr(config_class: type = T.DetrConfig) -> T.PretrainedConfig:
    """DETR (or Table Transformer, its architecture) with a transformers ResNet as its backbone (the
    hub's use timm's, built by timm)."""
    backbone = T.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], out_features=["stage1", "stage2"], layer_type="basic"
    )
    return config_class(
        use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=37, decoder_ffn_dim=37, num_queries=5, **LABELS,
    )  # fmt: skip


def _cvt() -> T.PretrainedConfig:
    """CvT of three stages (transformers reads stage i's i-th drop-path rate: its depths grow)."""
    three = dict(
        embed_dim=[8, 16, 24], num_heads=[1, 2, 2], depth=[1, 2, 3], mlp_ratio=[2.0, 2.0, 2.0],
        attention_drop_rate=[0.0] * 3, drop_rate=[0.0] * 3, drop_path_rate=[0.0] * 3, cls_token=[False, False, True],
    )  # fmt: skip
    return T.CvtConfig(**three, **LABELS)


def _image_processor(folder: Path) -> None:
    T.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)


def _detection() -> Any:
    """opreg-transformers' RT-DETR helpers, imported when used: bench/optimum_side.py imports this
    module in a venv without opreg."""
    from opreg_transformers import detection

    return detection


def _detection_processor(folder: Path) -> None:
    side = _detection().SIDE
    T.RTDetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)


def _audio_processor(folder: Path) -> None:
    T.Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000).save_pretrained(folder)


CHECKPOINTS: dict[str, tuple[str, Callable[[], T.PretrainedConfig], Callable[[Path], None] | None]] = {
    "vit": ("ViTForImageClassification", lambda: T.ViTConfig(**VISION, **LABELS), _image_processor),
    "vit-masked": ("ViTForMaskedImageModeling", lambda: T.ViTConfig(**VISION, encoder_stride=8), None),
    "convnext": (
        "ConvNextForImageClassification",
        lambda: T.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], **LABELS),
        None,
    ),
    "swin": (
        "SwinForImageClassification",
        lambda: T.SwinConfig(
            image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=2, **LABELS
        ),
        None,
    ),
    "swin-masked": (
        "SwinForMaskedImageModeling",
        lambda: T.SwinConfig(image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=2),
        None,
    ),
    "dinov2": ("Dinov2ForImageClassification", lambda: T.Dinov2Config(**VISION, **LABELS), None),
    "detr": ("DetrForObjectDetection", _detr, None),
    "yolos": (
        "YolosForObjectDetection",
        lambda: T.YolosConfig(**{**VISION, "image_size": [32, 32]}, num_detection_tokens=5, **LABELS),
        None,
    ),
    "rt-detr": ("RTDetrForObjectDetection", lambda: _detection().tiny_rt_detr_config(), _detection_processor),
    "rt-detr-v2": (
        "RTDetrV2ForObjectDetection",
        lambda: _detection().tiny_rt_detr_config("rt_detr_v2"),
        _detection_processor,
    ),
    "segformer": ("SegformerForSemanticSegmentation", lambda: T.SegformerConfig(**SEGMENTS, **LABELS), None),
    "dpt": ("DPTForDepthEstimation", lambda: T.DPTConfig(**DEPTH), None),
    "dpt-segmenter": ("DPTForSemanticSegmentation", lambda: T.DPTConfig(**DEPTH, **LABELS), None),
    "glpn": ("GLPNForDepthEstimation", lambda: T.GLPNConfig(**SEGMENTS, max_depth=10), None),
    "clip": ("CLIPModel", lambda: T.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=16), None),
    "siglip": ("SiglipModel", lambda: T.SiglipConfig(text_config=TEXT, vision_config=VISION), None),
    "clip-classifier": (
        "CLIPForImageClassification",
        lambda: T.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=16, **LABELS),
        None,
    ),
    "clip-vision": ("CLIPVisionModel", lambda: T.CLIPVisionConfig(**VISION), _image_processor),
    "wav2vec2-ctc": ("Wav2Vec2ForCTC", lambda: T.Wav2Vec2Config(**AUDIO), _audio_processor),
    "hubert-ctc": ("HubertForCTC", lambda: T.HubertConfig(**AUDIO), _audio_processor),
    "wav2vec2-classifier": ("Wav2Vec2ForSequenceClassification", lambda: T.Wav2Vec2Config(**AUDIO), None),
    "hubert-classifier": ("HubertForSequenceClassification", lambda: T.HubertConfig(**AUDIO), None),
    "wav2vec2-frames": ("Wav2Vec2ForAudioFrameClassification", lambda: T.Wav2Vec2Config(**AUDIO), None),
    "wav2vec2-xvector": (
        "Wav2Vec2ForXVector",
        lambda: T.Wav2Vec2Config(**AUDIO, tdnn_dim=(8, 8, 8, 8, 16), xvector_output_dim=8),
        None,
    ),
    "deit": ("DeiTForImageClassification", lambda: T.DeiTConfig(**VISION, **LABELS), None),
    "beit": ("BeitForImageClassification", lambda: T.BeitConfig(**VISION, **LABELS), None),
    "data2vec-vision": ("Data2VecVisionModel", lambda: T.Data2VecVisionConfig(**VISION), None),
    "vit-msn": ("ViTMSNForImageClassification", lambda: T.ViTMSNConfig(**VISION, **LABELS), None),
    "convnextv2": (
        "ConvNextV2ForImageClassification",
        lambda: T.ConvNextV2Config(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], **LABELS),
        None,
    ),
    "resnet": (
        "ResNetForImageClassification",
        lambda: T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", **LABELS),
        None,
    ),
    "regnet": (
        "RegNetModel",
        lambda: T.RegNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8),
        None,
    ),
    "efficientnet": (
        "EfficientNetForImageClassification",
        lambda: T.EfficientNetConfig(
            image_size=32, width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=128, **LABELS
        ),
        None,
    ),
    "mobilenet-v1": (
        "MobileNetV1ForImageClassification",
        lambda: T.MobileNetV1Config(image_size=32, depth_multiplier=0.25, min_depth=4, **LABELS),
        None,
    ),
    "mobilenet-v2": ("MobileNetV2Model", lambda: T.MobileNetV2Config(image_size=32, depth_multiplier=0.25), None),
    "levit": (
        "LevitForImageClassification",
        lambda: T.LevitConfig(
            image_size=32,
            hidden_sizes=[16, 24, 32],
            num_attention_heads=[1, 2, 2],
            depths=[1, 1, 1],
            key_dim=[8, 8, 8],
            **LABELS,
        ),
        None,
    ),
    "poolformer": (
        "PoolFormerForImageClassification",
        lambda: T.PoolFormerConfig(
            num_encoder_blocks=2,
            depths=[1, 1],
            hidden_sizes=[8, 16],
            patch_sizes=[7, 3],
            strides=[4, 2],
            padding=[2, 1],
            **LABELS,
        ),
        None,
    ),
    "pvt": (
        "PvtForImageClassification",
        lambda: T.PvtConfig(
            image_size=32,
            num_encoder_blocks=2,
            depths=[1, 1],
            hidden_sizes=[8, 16],
            num_attention_heads=[1, 2],
            patch_sizes=[4, 2],
            strides=[4, 2],
            sequence_reduction_ratios=[2, 1],
            mlp_ratios=[2, 2],
            **LABELS,
        ),
        None,
    ),
    "cvt": ("CvtForImageClassification", _cvt, None),
    "swinv2-masked": (
        "Swinv2ForMaskedImageModeling",
        lambda: T.Swinv2Config(
            image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=2
        ),
        None,
    ),
    "hiera": (
        "HieraForImageClassification",
        lambda: T.HieraConfig(
            image_size=[32, 32],
            patch_size=[3, 3],
            patch_stride=[2, 2],
            patch_padding=[1, 1],
            embed_dim=8,
            num_heads=[1, 2],
            depths=[1, 1],
            query_stride=[2, 2],
            masked_unit_size=[4, 4],
            num_query_pool=1,
            **LABELS,
        ),
        None,
    ),
    "mobilevit-segmenter": (
        "MobileViTForSemanticSegmentation",
        lambda: T.MobileViTConfig(
            image_size=64,
            patch_size=2,
            hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
            num_attention_heads=2,
            aspp_out_channels=16,
            **LABELS,
        ),
        None,
    ),
    "table-transformer": ("TableTransformerForObjectDetection", lambda: _detr(T.TableTransformerConfig), None),
    "wavlm-ctc": ("WavLMForCTC", lambda: T.WavLMConfig(**AUDIO), None),
    "unispeech-classifier": ("UniSpeechForSequenceClassification", lambda: T.UniSpeechConfig(**AUDIO), None),
    "unispeech-sat-frames": (
        "UniSpeechSatForAudioFrameClassification",
        lambda: T.UniSpeechSatConfig(**AUDIO),
        None,
    ),
    "sew-ctc": ("SEWForCTC", lambda: T.SEWConfig(**AUDIO), None),
    "sew-d-classifier": ("SEWDForSequenceClassification", lambda: T.SEWDConfig(**AUDIO), None),
    "data2vec-audio-xvector": (
        "Data2VecAudioForXVector",
        lambda: T.Data2VecAudioConfig(**AUDIO, tdnn_dim=(8, 8, 8, 8, 16), xvector_output_dim=8),
        None,
    ),
    "wav2vec2-conformer-ctc": ("Wav2Vec2ConformerForCTC", lambda: T.Wav2Vec2ConformerConfig(**AUDIO), None),
    "ast": (
        "ASTForAudioClassification",
        lambda: T.ASTConfig(
            **LAYERS, **LABELS, patch_size=8, max_length=24, num_mel_bins=16, frequency_stride=4, time_stride=4
        ),
        None,
    ),
}
"""``{name: (transformers class, config, processor writer or None)}``."""

BUILT = {
    "rt-detr": lambda: _detection().tiny_rt_detr(),
    "rt-detr-v2": lambda: _detection().tiny_rt_detr("rt_detr_v2"),
}
"""``{name: builder}`` of the checkpoints whose weights are not transformers' initialisation (a tiny
RT-DETR's ties every score: :mod:`opreg_transformers.detection`)."""


def save(name: str, folder: Path) -> Path:
    """Write the tiny checkpoint ``name`` into ``folder`` (seeded: the same weights every time)."""
    model_class, config, processor = CHECKPOINTS[name]
    torch.manual_seed(0)
    model = BUILT[name]() if name in BUILT else getattr(T, model_class)(config())
    model.save_pretrained(folder)
    if processor is not None:
        processor(folder)
    return folder
