"""Tiny quantized checkpoints written here from a known float model (tests/language_models.py),
for tests/test_llm_quantized.py and bench/llm_quantized.py.

- compressed-tensors ``pack-quantized``: by the ``compressed-tensors`` package itself (its
  ``apply_quantization_config``, min-max scales by its ``calculate_qparams``, its
  ``ModelCompressor``), which transformers also loads on the CPU: the reference is its model.
- GPTQ and AWQ: their loaders (gptqmodel, autoawq) build CUDA extensions and do not install on
  this machine, so the layouts are written here as their packers document them (auto-gptq's
  ``QuantLinear.pack``, autoawq's ``WQLinear_GEMM.from_linear``) from integers, scales and zero
  points computed here; the reference is the float model whose weights are ``(q - z) * s`` of
  those same integers, computed without reading the packed tensors back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests import language_models as lm

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""autoawq's GEMM packing: word position ``i`` holds column ``AWQ_ORDER[i]`` of its eight."""

SHARED_INPUT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
"""The Llama layers that read one input with the layers beside them."""


def float_model(architecture: str = "llama", seed: int = 0, **config: Any) -> Any:
    """The tiny ``architecture`` (``config``: its config's values overridden: a larger one for bench/)."""
    torch.manual_seed(seed)
    return lm.causal_lm(architecture, **config).eval()


def _layers(model: Any) -> list[tuple[str, torch.nn.Linear]]:
    """The linear layers a quantizer quantizes: every one but the head."""
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and "lm_head" not in name]  # fmt: skip


def quantize(weight: torch.Tensor, bits: int, group: int, symmetric: bool) -> tuple[torch.Tensor, ...]:
    """Min-max round-to-nearest of ``weight`` ``(N, K)`` in contiguous groups along K: unsigned
    integers ``q`` ``(N, K)``, float16 scales ``s`` and integer zero points ``z`` ``(N, K / group)``."""
    n, k = weight.shape
    groups = weight.reshape(n, k // group, group)
    top = (1 << bits) - 1
    if symmetric:
        scales = (groups.abs().amax(-1) / (top // 2)).clamp(min=1e-6).half()
        zeros = torch.full(scales.shape, (top + 1) // 2, dtype=torch.int32)
    else:
        low, high = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
        scales = ((high - low) / top).clamp(min=1e-6).half()
        zeros = torch.round(-low / scales.float()).clamp(0, top).to(torch.int32)
    q = torch.round(groups / scales.float()[..., None] + zeros[..., None]).clamp(0, top).to(torch.int32)
    return q.reshape(n, k), scales, zeros


def dequantized(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int) -> torch.Tensor:
    return (q - zeros.repeat_interleave(group, 1)).float() * scales.float().repeat_interleave(group, 1)


def pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int values packed into int32 words along ``dim``, the lowest bits first (both packers' loops)."""
    per = 32 // bits
    moved = values.movedim(dim, -1).to(torch.int64)
    words = moved.reshape(*moved.shape[:-1], -1, per) << (torch.arange(per) * bits)
    packed = words.sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.movedim(-1, dim).contiguous()


def _save(model: Any, folder: Path, tensors: dict[str, torch.Tensor], quantization: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    model.save_pretrained(folder)
    for file in folder.glob("*.safetensors"):
        file.unlink()
    save_file({name: t.contiguous() for name, t in tensors.items()}, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def gptq(folder: Path, bits: int = 4, group: int = 32, symmetric: bool = False, act_order: bool = False,
         seed: int = 0, version: str = "gptq", shared: bool = True, **config: Any) -> Any:  # fmt: skip
    """A GPTQ checkpoint of the tiny Llama at ``folder``; returns the reference float model
    (``shared=False``: act-order's layers reading one input each in their own order, as GPTQ never
    makes them: a packed projection of unlike blocks; ``config``: :func:`float_model`'s)."""
    model = float_model(seed=seed, **config)
    tensors = {name: t.detach().clone() for name, t in model.state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    orders: dict[str, torch.Tensor] = {}
    for name, layer in _layers(model):
        weight = layer.weight.detach()
        k = weight.shape[1]
        # act-order sorts a layer's input channels by its Hessian: layers reading one input share it (q, k, v)
        reads = name.rsplit(".", 1)[0] if name.endswith(SHARED_INPUT) and shared else name
        if reads not in orders:
            orders[reads] = torch.randperm(k, generator=generator) if act_order else torch.arange(k)
        order = orders[reads]
        q_sorted, scales, zeros = quantize(weight[:, order], bits, group, symmetric)
        q = torch.empty_like(q_sorted)
        q[:, order] = q_sorted
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[order] = (torch.arange(k) // group).to(torch.int32)
        reference = torch.empty_like(weight)
        reference[:, order] = dequantized(q_sorted, scales, zeros, group)
        layer.weight.data = reference
        stored_zeros = (zeros - (1 if version == "gptq" else 0)) & ((1 << bits) - 1)
        del tensors[f"{name}.weight"]
        tensors.update({
            f"{name}.qweight": pack(q.T, bits, 0), f"{name}.qzeros": pack(stored_zeros.T, bits, 1),
            f"{name}.scales": scales.T.contiguous(), f"{name}.g_idx": g_idx,
        })  # fmt: skip
    _save(model, folder, tensors, {
        "quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order, "sym": symmetric,
        "checkpoint_format": version, "true_sequential": True,
    })  # fmt: skip
    return model


def awq(folder: Path, group: int = 32, seed: int = 0, **config: Any) -> Any:
    """An AWQ (GEMM) checkpoint of the tiny Llama at ``folder``; returns the reference float model."""
    model = float_model(seed=seed, **config)
    tensors = {name: t.detach().clone() for name, t in model.state_dict().items()}
    order = torch.tensor(AWQ_ORDER)
    for name, layer in _layers(model):
        q, scales, zeros = quantize(layer.weight.detach(), 4, group, symmetric=False)
        layer.weight.data = dequantized(q, scales, zeros, group)

        def columns(values: torch.Tensor) -> torch.Tensor:  # (rows, N): each eight columns in AWQ's order
            return values.reshape(values.shape[0], -1, 8)[..., order].reshape(values.shape[0], -1)

        del tensors[f"{name}.weight"]
        tensors.update({
            f"{name}.qweight": pack(columns(q.T), 4, 1), f"{name}.qzeros": pack(columns(zeros.T), 4, 1),
            f"{name}.scales": scales.T.contiguous(),
        })  # fmt: skip
    _save(model, folder, tensors, {
        "quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
    })  # fmt: skip
    return model


def compressed(
    folder: Path, bits: int = 4, group: int | None = 32, symmetric: bool = True, seed: int = 0, **config: Any
) -> None:
    """A compressed-tensors ``pack-quantized`` checkpoint of the tiny Llama at ``folder``, written by the
    ``compressed-tensors`` package (``group=None``: one scale per output channel)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    model = float_model(seed=seed, **config)
    strategy = {"strategy": "group", "group_size": group} if group else {"strategy": "channel"}
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, **strategy)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for _, layer in _layers(model):
        weight = layer.weight.detach()
        grouped = weight.reshape(weight.shape[0], -1, group or weight.shape[1])
        scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
        layer.weight_scale.data.copy_(scale)
        if hasattr(layer, "weight_zero_point"):
            layer.weight_zero_point.data.copy_(zero)
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(str(folder))
