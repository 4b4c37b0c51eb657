"""``int4_algo='gptq'``: opreg's own GPTQ (Frantar et al., 2022) of a causal LM's linear layers,
computed in PyTorch before the capture and written as stored blocks (:class:`opreg.weights.StoredBlocks`,
the form a GPTQ checkpoint's integers take), which opreg-ort-contrib's stored pass makes MatMulNBits.

GPTQ rounds a layer's weight one input channel at a time, in blocks of ``block_size`` along K,
and spreads each channel's rounding error over the channels not yet rounded, weighted by the
inverse of the layer's input Gram matrix ``H = X^T X`` (its inputs ``X`` on calibration text): the
error the layer's *outputs* see shrinks, not the weight's. Symmetric blocks (MatMulNBits' signed
form, no zero points: what ``rtn`` writes), each block's scale ``absmax / -8`` taken where GPTQ
reaches the block.

The calibration: :data:`SEQUENCES` sequences of :data:`LENGTH` token ids drawn uniformly (seeded)
from the config's vocabulary, run once through the float model (a checkpoint folder's, loaded
in float32 for it) as one batch. A pre-hook on each linear layer rounds its weight from the
inputs it gets and then lets it run with the rounded weight, so later layers are calibrated on
what the quantized model computes (GPTQ's sequential order); layers reading one input (q, k,
v; gate, up) share its ``H``. The head's product, the largest, is not computed: the run stops
once the head is rounded. A head tied to the embedding table is left to ``rtn`` (its rows are
read by the embedding's Gather too).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from opreg.weights import LazyWeight, StoredBlocks, lazy

logger = logging.getLogger(__name__)

SEQUENCES = 128
LENGTH = 128
"""The calibration batch: 128 random sequences of 128 token ids (16384 positions). With 32, the trained
model's top-1 moved with the seed (97.99% and 99.10% in eager PyTorch; 128: 98.83% and 99.12%)."""
DAMPING = 0.01
"""Added to ``H``'s diagonal, times its mean: GPTQ's default, for an ``H`` that is not invertible."""
BITS = 4
BLOCK_SIZE = 128
"""The block size where none is given: the quantization pass's default (``opreg_ort_contrib.quantize.BLOCK_SIZE``)."""


class _Rounded(Exception):
    """Raised by the head's hook: every layer is rounded, the logits are not needed."""


def gptq_weights(model: Any, weights: Any, block_size: int, seed: int = 0) -> Any:
    """``weights`` (the checkpoint's :class:`opreg.weights.Weights`) with each linear layer of the
    float ``model`` (loaded in memory, its names the checkpoint's) replaced by its GPTQ blocks (a
    float weight, the blocks' dequantization, carrying them as ``stored``)."""
    tied = bool(getattr(model.config.get_text_config(decoder=True), "tie_word_embeddings", False))
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    head = model.get_output_embeddings()
    rounded: dict[str, LazyWeight] = {}
    shared: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # a parent's last input and its H
    hooks = []
    for name, linear in linears.items():
        if f"{name}.weight" not in weights or (linear is head and tied):
            continue

        def hook(module: torch.nn.Module, args: tuple, name: str = name) -> None:
            parent = name.rpartition(".")[0]
            x = args[0]
            if parent not in shared or shared[parent][0] is not x:
                flat = x.reshape(-1, x.shape[-1]).double()
                shared[parent] = (x, (flat.T @ flat).float())
            q, scales = gptq(module.weight.detach().float(), shared[parent][1], block_size)
            module.weight.data = dequantize(q, scales, block_size, module.weight.shape[1])
            rounded[f"{name}.weight"] = stored(q, scales, block_size, module.weight.shape[1], name)
            if module is head:
                raise _Rounded

        hooks.append(linear.register_forward_pre_hook(hook))
    drawn = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, int(model.config.get_text_config(decoder=True).vocab_size), (SEQUENCES, LENGTH),
                        generator=drawn)  # fmt: skip
    try:
        with torch.no_grad():
            model(input_ids=ids)
    except _Rounded:
        pass
    finally:
        for handle in hooks:
            handle.remove()
    logger.info("GPTQ rounded %d linear layers on %d calibration tokens", len(rounded), ids.numel())
    return weights.with_tensors(rounded)


def gptq(weight: torch.Tensor, gram: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ of an ``(N, K)`` weight with its input's ``gram`` ``(K, K)``: the unsigned values ``(N, K)``
    (``(q - 8) * scale``) and the scales ``(N, blocks)`` of symmetric blocks of ``block_size``."""
    w = weight.clone()
    n, k = w.shape
    h = gram.clone()
    dead = torch.diag(h) == 0  # an input channel always 0: its weights do not matter
    h[dead, dead] = 1
    w[:, dead] = 0
    h += DAMPING * torch.mean(torch.diag(h)) * torch.eye(k)
    inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.zeros(n, k, dtype=torch.uint8)
    scales = torch.zeros(n, -(-k // block_size))
    top = 2**BITS - 1
    middle = 2 ** (BITS - 1)
    for start in range(0, k, block_size):
        stop = min(start + block_size, k)
        block, errors, inv = w[:, start:stop].clone(), torch.zeros(n, stop - start), inverse[start:stop, start:stop]
        signed = block.gather(1, block.abs().argmax(1, keepdim=True))  # the value of largest magnitude
        scale = signed / -middle
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        scales[:, start // block_size] = scale[:, 0]
        for i in range(stop - start):
            column = block[:, i : i + 1]
            values = torch.clamp(torch.round(column / scale) + middle, 0, top)
            q[:, start + i] = values[:, 0].to(torch.uint8)
            error = (column - (values - middle) * scale) / inv[i, i]
            block[:, i:] -= error @ inv[i : i + 1, i:]
            errors[:, i : i + 1] = error
        w[:, stop:] -= errors @ inverse[start:stop, stop:]
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, block_size: int, k: int) -> torch.Tensor:
    """The ``(N, K)`` float32 weight of symmetric blocks: ``(q - 8) * scale``."""
    return (q.float() - 2 ** (BITS - 1)) * scales.repeat_interleave(block_size, 1)[:, :k]


def stored(q: torch.Tensor, scales: torch.Tensor, block_size: int, k: int, name: str) -> LazyWeight:
    """The layer's float weight carrying its blocks as MatMulNBits reads them (K padded to whole
    blocks with the midpoint, the kernel's zero)."""
    from opreg.llm._quantized_read import dequantized, pack

    n, count = scales.shape
    padded = torch.full((n, count * block_size), 2 ** (BITS - 1), dtype=torch.int32)
    padded[:, :k] = q
    packed = pack(padded.reshape(n, count, block_size), BITS)
    blocks = StoredBlocks(BITS, block_size, lazy(packed, f"{name}.weight_Q4"), lazy(scales.float(), f"{name}.scales"),
                          None, None, f"GPTQ blocks of {name}", k=k)  # fmt: skip
    return dequantized(blocks, name)
