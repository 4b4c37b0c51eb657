"""Attention: scaled_dot_product_attention as MatMul/Softmax (opset 18; with dropout_p > 0, a
random dropout of the attention weights) and as Attention (opset 23, without dropout)."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset23 as op23

import opreg
from opreg.ops import Tensor, node_arg, node_rank, rank_of
from opreg_core_ops.ops.random import training_dropout


def _transpose_last(x):
    rank = rank_of(x)
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return op18.Transpose(x, perm=perm)


def _repeat_heads(x, repeats: int):
    """(..., Hk, S, E) -> (..., Hk*repeats, S, E), each head repeated in place (torch's repeat_interleave)."""
    # (..., Hk, 1, S, E) broadcast against (..., Hk, r, 1, 1)
    expanded = op18.Expand(
        op18.Unsqueeze(x, [-3]), op18.Concat(op18.Shape(x, start=0, end=-2), [repeats, 1, 1], axis=0)
    )
    return op18.Reshape(expanded, op18.Concat(op18.Shape(x, start=0, end=-3), [-1], op18.Shape(x, start=-2), axis=0))


def _attention_scores(query, key, attn_mask, is_causal, scale, enable_gqa):
    """Masked, scaled QK^T (before the softmax), and the key after GQA head repetition."""
    head_dim = query.shape[-1]
    if scale is None:
        if not isinstance(head_dim, int):
            raise ValueError("scaled_dot_product_attention needs a static head size when scale is not given")
        scale = 1.0 / math.sqrt(head_dim)
    if enable_gqa:
        key = _repeat_heads(key, query.shape[-3] // key.shape[-3])
    scores = op18.Mul(op18.MatMul(query, _transpose_last(key)), op18.CastLike(float(scale), query))
    if is_causal:
        scores = op18.Add(scores, _causal_mask(query, key))
    if attn_mask is not None:
        if attn_mask.dtype == ir.DataType.BOOL:
            attn_mask = op18.Where(attn_mask, op18.CastLike(0.0, query), op18.CastLike(float("-inf"), query))
        scores = op18.Add(scores, attn_mask)
    return scores


STATIC_MASK_LIMIT = 512 * 512
"""The most elements a causal mask of static size is written as a constant with (onnxscript's
constant folding limit); a larger one is computed in the graph."""


def _causal_mask(query, key):
    """(query length, key length): -inf above the diagonal, 0 elsewhere (torch's top-left causal
    mask). Where both lengths are static and the mask small, a constant: one for the whole model,
    shared by every layer, rather than a mask built from the shapes in each layer."""
    lengths = (query.shape[-2], key.shape[-2]) if query.shape is not None and key.shape is not None else None
    if lengths is not None and all(isinstance(n, int) for n in lengths) and math.prod(lengths) <= STATIC_MASK_LIMIT:
        return np.triu(np.full(lengths, -np.inf, dtype=np.float32), 1)
    size = op18.Concat(op18.Shape(query, start=-2, end=-1), op18.Shape(key, start=-2, end=-1), axis=0)
    return op18.Trilu(op18.Expand(op18.CastLike(float("-inf"), query), size), 1, upper=1)


def _safe_softmax(scores, masked: bool):
    """Softmax over the last axis; rows masked out entirely give 0 (torch's _safe_softmax), not NaN.

    A fully masked row is all -inf, whose softmax is NaN: ``Where(IsNaN(p), 0, p)`` zeroes it.
    This is the form ONNX Runtime's attention fusions match (onnxscript's SDPA pattern, as
    torch.onnx emits it); the price is that a NaN coming from the inputs of a masked
    attention also becomes 0 where torch keeps it."""
    probs = op18.Softmax(scores, axis=-1)
    if not masked:
        return probs
    return op18.Where(op18.IsNaN(probs), op18.CastLike(0.0, probs), probs)


def _repeat_value(value, query, enable_gqa):
    return _repeat_heads(value, query.shape[-3] // value.shape[-3]) if enable_gqa else value


def _full_mask(attn_mask, query, key):
    """``attn_mask`` expanded over its last two dims to (query length, key length): ONNX Runtime's
    Attention refuses a mask that broadcasts there ("inconsistent q_sequence_length"), torch's does not."""
    mask_shape, q_shape, k_shape = attn_mask.shape, query.shape, key.shape
    if (
        mask_shape is not None and q_shape is not None and k_shape is not None
        and mask_shape[-2] == q_shape[-2] and mask_shape[-1] == k_shape[-2]
    ):  # fmt: skip
        return attn_mask
    ones = [1] * (rank_of(attn_mask) - 2)
    lengths = [op18.Shape(query, start=-2, end=-1), op18.Shape(key, start=-2, end=-1)]
    return op18.Expand(attn_mask, op18.Concat(*([ones] if ones else []), *lengths, axis=0))


def _attention23_covered(node) -> bool:
    """Attention-23 reads 3-D inputs as (batch, seq, heads*size), torch as (batch, seq, size): 4-D only."""
    if node_arg(node, 4, "dropout_p", 0.0) != 0.0:
        return False
    # ONNX Runtime's float16 Attention strays from torch beyond float16 tolerance; the decomposition does not.
    query = node.args[0].meta.get("val")
    if query is not None and query.dtype.itemsize < 4:
        return False
    return all(node_rank(node, i) == 4 for i in range(3))


@opreg.impl("aten::scaled_dot_product_attention", opset=18)
@opreg.impl("aten::scaled_dot_product_attention", opset=23, predicate=_attention23_covered)
def aten_scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    opset: int,
):
    """scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0., bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor: MatMul/Softmax decomposition; dropout_p > 0 drops attention weights at random, as torch does even in eval(). From opset 23, Attention for the 4-D nodes without dropout its predicate accepts."""
    if opset >= 23:
        out, _present_key, _present_value, _qk = op23.Attention(
            query,
            key,
            value,
            None if attn_mask is None else _full_mask(attn_mask, query, key),
            is_causal=int(is_causal),
            scale=None if scale is None else float(scale),
        )
        return out
    scores = _attention_scores(query, key, attn_mask, is_causal, scale, enable_gqa)
    probs = _safe_softmax(scores, attn_mask is not None)
    if dropout_p > 0:
        probs, _ = training_dropout(probs, dropout_p)
    return op18.MatMul(probs, _repeat_value(value, query, enable_gqa))


def _no_dropout(index: int):
    return lambda node: node_arg(node, index, "dropout_p", 0.0) == 0.0


@opreg.impl("aten::_scaled_dot_product_flash_attention_for_cpu", predicate=_no_dropout(3))
def aten_scaled_dot_product_flash_attention_for_cpu(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
):
    """_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) -> (Tensor output, Tensor logsumexp): MatMul/Softmax decomposition, ReduceLogSumExp (no dropout)."""
    scores = _attention_scores(query, key, attn_mask, is_causal, scale, False)
    probs = _safe_softmax(scores, attn_mask is not None)
    out = op18.MatMul(probs, value)
    logsumexp = op18.ReduceLogSumExp(op18.Cast(scores, to=ir.DataType.FLOAT), [-1], keepdims=0)
    return out, logsumexp
