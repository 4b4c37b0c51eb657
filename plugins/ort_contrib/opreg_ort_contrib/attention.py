"""scaled_dot_product_attention on ONNX Runtime's fused attention kernels.

``aten::scaled_dot_product_attention`` takes query, key and value as (batch, heads,
sequence, head size); the fused kernels take them as (batch, sequence, heads * head
size) and return that layout. The impls move the heads back (Transpose + Reshape) on
the way in and out; a model that split the heads off a projection just before
(``view`` + ``transpose``, as every transformers model does) ends up with the two
layout changes back to back, and the lean pass removes both. What is left is the
projection feeding the kernel directly.

Which kernel, by measurement on ONNX Runtime 1.32's CPU build (``bench/ort_contrib.py``):

- At ai.onnx 23 and 24: ai.onnx ``Attention`` in its 3-D form (``q_num_heads``,
  ``kv_num_heads``: grouped heads without repeating them). There it is about 1.3x faster
  than com.microsoft MultiHeadAttention and 1.1-1.4x faster than GroupQueryAttention at
  the benchmark's shapes, takes bool masks as they are (but expanded to the query length,
  :func:`_full_mask`), gives 0 (as torch does) for a query whose keys are all masked, and
  takes torch's top-left causal mask for any lengths. From ai.onnx 25 the op is Attention-25, for which ONNX Runtime 1.32 has no
  kernel: it runs the op's function body, 2-3x slower than the contrib kernels.
- Elsewhere with com.microsoft (the ``onnxruntime`` profile, ai.onnx 27 here, and
  ``target="18,com.microsoft=1"``), the contrib kernels: ``com.microsoft::MultiHeadAttention`` for equal head counts, and
  ``com.microsoft::GroupQueryAttention`` (``kv_num_heads``) for fewer key/value heads
  (``enable_gqa=True``), over the whole sequence (no KV cache: ``seqlens_k`` is the
  sequence length - 1), so only where query and key have the same length. A mask
  becomes their ``attention_bias`` (bool: 0 / -inf), broadcast to (batch or 1, heads or
  1, query length, key length); ``is_causal`` their causal mode, which agrees with
  torch's top-left causal mask where query and key have the same length, so only
  there. A row whose keys are all masked gives NaN in these kernels (a softmax over
  -inf only) where torch gives 0: a bool mask becomes a finite bias and the output is
  multiplied by "the row has a key" (computed once per mask); after a float mask,
  ``Where(IsNaN(y), 0, y)``.

The kernels are float32-only on ONNX Runtime's CPU build; other dtypes, dropout and
shapes the kernels cannot take fall through (predicate) to the core pack's impls.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset23 as op23
from onnxscript.values import Opset

import opreg
from opreg.ops import node_arg, node_value
from opreg_ort_contrib import CONTRIB_DOMAIN, CONTRIB_PRIORITY

msft = Opset("com.microsoft", 1)


def _same(a, b) -> bool:
    """Two (possibly symbolic) sizes are equal for every input the export allows."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))


def _covered(node) -> bool:
    """What the fused kernels take: float32 4-D query/key/value with static head counts and
    sizes, no dropout, a bool or float32 mask of rank <= 4, and a causal mask only where
    query and key have the same length (see the module docstring)."""
    import torch

    query, key, value = (node_value(node, i, n) for i, n in enumerate(("query", "key", "value")))
    if any(t is None or t.dim() != 4 or t.dtype != torch.float32 for t in (query, key, value)):
        return False
    if node_arg(node, 4, "dropout_p", 0.0) != 0.0:
        return False
    sizes = (query.shape[1], key.shape[1], value.shape[1], query.shape[3], value.shape[3])
    if not all(isinstance(s, int) for s in sizes):
        return False
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != value.shape[1] or heads % kv_heads:
        return False
    same_length = _same(query.shape[2], key.shape[2])
    if heads != kv_heads and (not same_length or not node_arg(node, 7, "enable_gqa", False)):
        return False
    if node_arg(node, 5, "is_causal", False) and not same_length:
        return False
    mask = node_value(node, 3, "attn_mask")
    return mask is None or (mask.dim() <= 4 and mask.dtype in (torch.bool, torch.float32))


def _heads_last(x):
    """(batch, heads, sequence, size) -> (batch, sequence, heads * size)."""
    return op18.Reshape(op18.Transpose(x, perm=[0, 2, 1, 3]), [0, 0, -1])


def _heads_first(y, heads: int, size: int):
    """(batch, sequence, heads * size) -> (batch, heads, sequence, size)."""
    return op18.Transpose(op18.Reshape(y, [0, 0, heads, size]), perm=[0, 2, 1, 3])


_LOWEST = float(np.finfo(np.float32).min)


def _full_mask(mask, query, key):
    """``attn_mask`` of shape (batch or 1, heads or 1, S, T): every kernel here refuses a mask that
    broadcasts over the query length S, as a padding mask of (batch, 1, 1, T) does (ONNX Runtime
    1.32's Attention-23: "inconsistent q_sequence_length (between attn_mask and Q)", 2026-12-07)."""
    rank = len(mask.shape)
    if rank < 4:
        mask = op18.Unsqueeze(mask, list(range(4 - rank)))
    rows, columns = mask.shape[-2] if rank >= 2 else 1, mask.shape[-1]
    if rows != query.shape[2] or columns != key.shape[2]:
        size = op18.Concat(
            op18.Shape(mask, start=0, end=2), op18.Shape(query, start=2, end=3), op18.Shape(key, start=2, end=3), axis=0
        )
        mask = op18.Expand(mask, size)
    return mask


def _attention_bias(mask, query, key, masked_value: float):
    """``attn_mask`` as the kernels' additive bias of shape (batch or 1, heads or 1, S, T);
    a bool mask's False as ``masked_value``."""
    full = _full_mask(mask, query, key)
    if mask.dtype == ir.DataType.BOOL:
        return op18.Where(full, op18.CastLike(0.0, query), op18.CastLike(masked_value, query))
    return full


def _rows_with_keys(mask):
    """1.0 for the query rows of a bool ``mask`` that keep at least one key, else 0.0, shaped to
    broadcast over the kernels' (batch, S, hidden) output; ``None`` if the mask has a dim per
    head (the rows differ between heads there). Every layer computes it from the same mask,
    so after the lean pass's common-subexpression pass the model computes it once."""
    dims = list(mask.shape)
    if len(dims) == 4 and dims[1] != 1:
        return None
    keep = op18.ReduceMax(op18.Cast(mask, to=ir.DataType.FLOAT), [-1], keepdims=1)
    return op18.Squeeze(keep, [1]) if len(dims) == 4 else keep


def _seqlens(query, key):
    """GroupQueryAttention's ``seqlens_k`` (batch,) and ``total_sequence_length`` () for a
    whole sequence of keys: every row attends to all ``T`` keys (up to its mask)."""
    total = op18.Cast(op18.Shape(key, start=2, end=3), to=ir.DataType.INT32)
    seqlens = op18.Expand(op18.Sub(total, op18.CastLike(1, total)), op18.Shape(query, start=0, end=1))
    return seqlens, op18.Squeeze(total, [0])


def _covered_23(node) -> bool:
    """What the 3-D Attention-23 takes: as :func:`_covered`, but any query and key lengths."""
    import torch

    query, key, value = (node_value(node, i, n) for i, n in enumerate(("query", "key", "value")))
    if any(t is None or t.dim() != 4 or t.dtype != torch.float32 for t in (query, key, value)):
        return False
    if node_arg(node, 4, "dropout_p", 0.0) != 0.0:
        return False
    sizes = (query.shape[1], key.shape[1], value.shape[1], query.shape[3], key.shape[3], value.shape[3])
    if not all(isinstance(s, int) for s in sizes):
        return False
    heads, kv_heads = query.shape[1], key.shape[1]
    if (
        kv_heads != value.shape[1]
        or heads % kv_heads
        or (heads != kv_heads and not node_arg(node, 7, "enable_gqa", False))
    ):
        return False
    mask = node_value(node, 3, "attn_mask")
    return mask is None or (mask.dim() <= 4 and mask.dtype in (torch.bool, torch.float32))


@opreg.impl(
    "aten::scaled_dot_product_attention",
    opset=18,
    domains={CONTRIB_DOMAIN: 1},
    priority=CONTRIB_PRIORITY,
    predicate=_covered,
)
@opreg.impl(
    "aten::scaled_dot_product_attention",
    opset=(23, 24),  # ONNX Runtime 1.32 has no Attention-25 kernel: it expands the function body, 2-3x slower
    domains={CONTRIB_DOMAIN: 1},  # ai.onnx ops only, but chosen by measurement for ONNX Runtime targets
    priority=CONTRIB_PRIORITY,
    predicate=_covered_23,
)
def aten_scaled_dot_product_attention_contrib(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    opset: int,
):
    """scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0., bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor: com.microsoft::MultiHeadAttention, or GroupQueryAttention for fewer key/value heads; at ai.onnx 23 and 24, ai.onnx Attention on (batch, sequence, hidden) inputs, grouped heads as kv_num_heads."""
    heads, kv_heads, size = query.shape[1], key.shape[1], value.shape[3]
    extra = {} if scale is None else {"scale": float(scale)}
    if opset >= 23:
        out, *_ = op23.Attention(
            _heads_last(query), _heads_last(key), _heads_last(value),
            None if attn_mask is None else _full_mask(attn_mask, query, key),
            q_num_heads=heads, kv_num_heads=kv_heads, is_causal=int(is_causal), **extra,
        )  # fmt: skip
        return _heads_first(out, heads, size)
    # Rows whose keys are all masked: the kernels give NaN over a -inf bias, torch gives 0. With a
    # bool mask, a finite bias and a multiplication by "has a key" (one op, computed once) fix it;
    # a float mask may hold -inf itself, and its NaN rows are zeroed after the kernel.
    keep = None if attn_mask is None or attn_mask.dtype != ir.DataType.BOOL else _rows_with_keys(attn_mask)
    bias = None
    if attn_mask is not None:
        bias = _attention_bias(attn_mask, query, key, _LOWEST if keep is not None else float("-inf"))
    q, k, v = _heads_last(query), _heads_last(key), _heads_last(value)
    if heads == kv_heads:
        out = msft.MultiHeadAttention(
            q, k, v, None, None, bias, num_heads=heads, unidirectional=int(is_causal), _outputs=1, **extra
        )
    else:
        seqlens, total = _seqlens(query, key)
        out = msft.GroupQueryAttention(
            q, k, v, None, None, seqlens, total, None, None, None, bias,
            num_heads=heads, kv_num_heads=kv_heads, causal=int(is_causal), _outputs=1, **extra,
        )  # fmt: skip
    if keep is not None:
        out = op18.Mul(out, op18.CastLike(keep, out))
    elif attn_mask is not None:
        out = op18.Where(op18.IsNaN(out), op18.CastLike(0.0, out), out)
    return _heads_first(out, heads, size)
