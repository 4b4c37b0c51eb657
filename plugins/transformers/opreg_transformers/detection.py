"""A tiny random RT-DETR, the model :mod:`opreg_transformers.patches`' RT-DETR patch is checked on
(the conformance kit's ``patches`` check, :func:`patch_samples`) and tests/media_checkpoints.py
saves as a checkpoint folder: two-digit channels, one decoder layer, five queries, 64-pixel images
(its feature maps 8, 4 and 2 on a side).

transformers' initialisation of so small an RT-DETR gives its encoder one output at every position,
so every query has one score and the top-k keeps whichever tied queries the runtime orders first
(ONNX Runtime others than torch): :func:`tiny_rt_detr` redraws its weights, seeded, at a scale that
keeps the positions apart (the kept scores then differ by 2e-4 and more, far above float error)."""

from __future__ import annotations

from typing import Any

SIDE = 64
MODELS = {
    "rt_detr": ("RTDetrConfig", "RTDetrForObjectDetection", 1),
    "rt_detr_v2": ("RTDetrV2Config", "RTDetrV2ForObjectDetection", 2),
}
"""``{model_type: (config class, model class, decoder layers)}``: RT-DETR and the families built
on it (RT-DETRv2's ties its box heads from the second layer on: one is refused)."""


def tiny_rt_detr_config(kind: str = "rt_detr") -> Any:
    """The config of ``kind`` (:data:`MODELS`) with a small transformers ResNet backbone."""
    import transformers as T

    config_class, _, layers = MODELS[kind]
    backbone = T.RTDetrResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], out_indices=[2, 3, 4], layer_type="basic"
    )
    return getattr(T, config_class)(
        backbone_config=backbone, encoder_in_channels=[16, 24, 32], encoder_hidden_dim=16, d_model=16,
        decoder_in_channels=[16, 16, 16], encoder_ffn_dim=37, decoder_ffn_dim=37, encoder_attention_heads=2,
        decoder_attention_heads=2, decoder_layers=layers, num_queries=5, num_labels=3,
    )  # fmt: skip


def tiny_rt_detr(kind: str = "rt_detr") -> Any:
    """The tiny detector of ``kind`` (:data:`MODELS`, RT-DETR's ``RTDetrForObjectDetection``), in eval mode, with untied scores (seeded: the same weights
    every time): each matrix and kernel redrawn at ``1 / sqrt(fan_in)``, each vector moved by 0.1."""
    import torch
    import transformers as T

    model = getattr(T, MODELS[kind][1])(tiny_rt_detr_config(kind)).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            noise = torch.randn(weight.shape, generator=generator)
            weight.copy_(noise / weight[0].numel() ** 0.5 if weight.dim() > 1 else weight + 0.1 * noise)
    return model


def patch_samples() -> dict[str, list[Any]]:
    """``{patch name: [ModelSample, ...]}``: each tiny detector on a batch of one and of three images."""
    import torch

    from opreg.testing import ModelSample

    generator = torch.Generator().manual_seed(0)
    images = [torch.randn(batch, 3, SIDE, SIDE, generator=generator) for batch in (1, 3)]
    return {f"{kind}_batch_len": [ModelSample.of(tiny_rt_detr(kind), pixels) for pixels in images] for kind in MODELS}
