"""How int4 weights are chosen: the ``int4_algo`` of :class:`opreg_ort_contrib.quantize.MatMulNBitsQuantization`.

- ``rtn``: round to nearest (the pass's own block quantization, ONNX Runtime's kernels).
- ``k_quant``: what ONNX Runtime GenAI's builder writes with ``algo_config=k_quant_mixed``: each
  block's scale and zero point searched as llama.cpp's k-quants do (ONNX Runtime's
  ``quant_tensor_k_quant_cpu``, the function its ``KQuantWeightOnlyQuantConfig`` runs), and the
  most sensitive matrices in 8 bits (the builder's ``mixed_layers`` and ``last_matmul``, from
  llama.cpp's mixed strategy: :func:`sensitive`).
- ``hqq``: Half-Quadratic Quantization, ONNX Runtime's ``HQQWeightOnlyQuantizer.quantize_internal``
  (no calibration data). Its zero points are floats, which MatMulNBits' CPU kernel takes only on a
  path measured 90x slower (804 against 9.0 us a 512 x 1376 product at 1 thread); they are rounded
  to integers here and the values rounded again with them, so the weights are MatMulNBits' fast
  uint8 form.

Each quantizer has the interface of the pass's RTN one (``qbits_block_quant`` of a ``(K, N)``
weight); the pass calls it on each run of rows as the model is written. The k-quant search is per
block, so runs give the whole weight's bytes; HQQ stops iterating when the mean error of what it
is given stops falling, so a weight above the save's 64 MiB runs is optimized per run.

ONNX Runtime's quantization package reconfigures logging and ``sys.path`` when first imported:
:func:`ort_quantization` undoes both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

ALGORITHMS = ("rtn", "k_quant", "hqq")
"""The ``int4_algo`` choices, the default first."""
SENSITIVE = ("qkv", "v_proj", "down_proj")
"""The projections the builder's ``mixed_layers`` upgrades to 8 bits in its layers (its ``qkv_proj``,
``v_proj`` and ``down_proj``; opreg packs q, k and v as ``qkv_packed``)."""
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def ort_quantization(module: str) -> Any:
    """``module`` of ``onnxruntime.quantization``, imported with what that package's import does to the
    process undone (``logging.basicConfig(level=INFO)``; ``onnxruntime.transformers`` on ``sys.path``)."""
    import importlib
    import logging
    import sys

    root = logging.getLogger()
    level, handlers, path = root.level, list(root.handlers), list(sys.path)
    try:
        return importlib.import_module(module)
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
        sys.path[:] = path


def sensitive(names: Sequence[str]) -> set[str]:
    """The weights (of ``names``: the linear layers' weights in graph order, the head last) k_quant
    keeps in 8 bits: the head, and in the first and last eighth of the layers and every third layer
    between, their qkv, v and down projections (the builder's ``mixed_layers``, llama.cpp's
    ``use_more_bits``). A layer is its weight's ``layers.<i>.``."""
    layers = {name: int(found.group(1)) for name in names if (found := _LAYER.search(name))}
    count = max(layers.values(), default=-1) + 1
    upgraded = {i for i in range(count) if i < count / 8 or i >= 7 * count / 8 or (i - round(count / 8)) % 3 == 2}
    chosen = {name for name, i in layers.items() if i in upgraded and any(p in name for p in SENSITIVE)}
    return chosen | set(names[-1:])


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Values of ``bits`` (0 to 2**bits - 1) along the last axis as MatMulNBits stores them: bytes at 8
    bits, two a byte at 4 (the first in the low half; an odd count padded with 8, the kernel's zero)."""
    values = values.astype(np.uint8)
    if bits == 8:
        return values
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.full((*values.shape[:-1], 1), 8, np.uint8)], -1)
    return values[..., 0::2] | (values[..., 1::2] << 4)


def _padded_rows(kn: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """The ``(N, blocks * size)`` rows of a ``(K, N)`` weight, K padded with zeros to whole blocks, and the blocks."""
    k, n = kn.shape
    blocks = -(-k // size)
    rows = np.zeros((n, blocks * size), np.float32)
    rows[:, :k] = kn.T
    return rows, blocks


class KQuantBlocks:
    """ONNX Runtime's k-quant block search (``quant_tensor_k_quant_cpu``): per block, the scale and
    zero point of least weighted error among 20 candidates around the min-max ones."""

    def __init__(self, bits: int, block_size: int) -> None:
        self.bits, self.block_size = bits, block_size

    def qbits_block_quant(self, kn: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(packed (N, blocks, bytes per block), scales (N, blocks), zero points (N, packed blocks))``."""
        search = ort_quantization("onnxruntime.quantization.neural_compressor.weight_only").quant_tensor_k_quant_cpu
        rows, blocks = _padded_rows(kn, self.block_size)
        values, scales, zero_points = search(rows, self.bits, self.block_size)
        n = rows.shape[0]
        return (
            pack(values.reshape(n, blocks, self.block_size), self.bits),
            scales.reshape(n, blocks).astype(np.float32),
            pack(zero_points.reshape(n, blocks), self.bits),
        )


class HQQBlocks:
    """ONNX Runtime's HQQ (``HQQWeightOnlyQuantizer.quantize_internal``: min-max blocks whose zero
    points a proximal solver moves to lower an lp-norm (p = 0.7) of the error), its zero points then
    rounded to integers and the values rounded again with them (MatMulNBits' fast uint8 form)."""

    def __init__(self, bits: int, block_size: int) -> None:
        self.bits, self.block_size = bits, block_size

    def qbits_block_quant(self, kn: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(packed (N, blocks, bytes per block), scales (N, blocks), zero points (N, packed blocks))``."""
        import torch

        quantizer = ort_quantization("onnxruntime.quantization.matmul_nbits_quantizer")
        config = quantizer.HQQWeightOnlyQuantConfig(block_size=self.block_size, bits=self.bits)
        rows, blocks = _padded_rows(kn, self.block_size)
        _, scales, zeros = quantizer.HQQWeightOnlyQuantizer(config).quantize_internal(
            torch.from_numpy(rows), bits=self.bits, group_size=self.block_size
        )
        top = 2**self.bits - 1
        scales, zeros = scales.numpy().astype(np.float32), np.clip(np.round(zeros.numpy()), 0, top)
        n = rows.shape[0]
        blocked = rows.reshape(n, blocks, self.block_size)
        safe = np.where(scales == 0, 1, scales)[..., None]
        values = np.clip(np.round(blocked / safe + zeros[..., None]), 0, top)
        return pack(values, self.bits), scales, pack(zeros, self.bits)
