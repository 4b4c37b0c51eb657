"""The ONNX ops torch users write inline, through ``torch.onnx.ops``.

``torch.onnx.ops.symbolic`` and ``symbolic_multi_out`` capture as
``onnx_symbolic::_symbolic`` / ``_symbolic_multi_out`` nodes that carry an
arbitrary ONNX node (domain, op type, version, attributes, output types): it is
emitted as given. ``torch.onnx.ops.rotary_embedding`` and ``attention`` capture
as ``onnx::RotaryEmbedding.opset23`` / ``onnx::Attention.opset23``: the ONNX op
itself from ai.onnx 23, and its decomposition (after torch's reference
implementation in ``torch/onnx/ops/_impl.py``) below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx.defs
import onnx_ir as ir
import onnxscript
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset23 as op23

import opreg
from opreg.ops import Tensor, node_arg, rank_of

LOWEST_ONNX = 18
"""ai.onnx version a symbolic node without a version is emitted at, when its op exists there."""
_NOT_ONE_TO_ONE = {21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1"}
"""ONNX types torch stands in for with another type (uint8, float4_e2m1fn_x2), which opreg cannot carry."""
_INT64_MAX = 2**63 - 1


# -- torch.onnx.ops.symbolic / symbolic_multi_out ----------------------------------------------------


def _attributes(
    attr_keys: Sequence[str],
    attr_types: Sequence[str],
    attr_pos: Sequence[Sequence[int]],
    attr_ints: Sequence[int],
    attr_floats: Sequence[float],
    attr_strs: Sequence[str],
) -> dict[str, object]:
    """The attributes torch.onnx.ops encodes as parallel lists: ``attr_types`` says which list
    (``i``, ``f``, ``s``, or a sequence ``is``, ``fs``, ``ss``) and ``attr_pos`` where in it."""
    pools = {"i": attr_ints, "f": attr_floats, "s": attr_strs}
    decoded: dict[str, object] = {}
    for key, kind, (start, end) in zip(attr_keys, attr_types, attr_pos, strict=True):
        pool = pools[kind[0]]
        decoded[key] = list(pool[start:end]) if len(kind) == 2 else pool[start]
    return decoded


def _opset(domain: str, op_type: str, version: int | None) -> onnxscript.values.Opset:
    """The opset a symbolic node is emitted from: its own version, or when it gives none
    ai.onnx 18 (the op's first version if newer) and version 1 of a custom domain, as torch.onnx does."""
    if version is None:
        if domain:
            version = 1
        elif onnx.defs.has(op_type, LOWEST_ONNX, domain):
            version = LOWEST_ONNX
        else:
            version = onnx.defs.get_schema(op_type, domain).since_version if onnx.defs.has(op_type, domain) else 1
    if not domain and version == LOWEST_ONNX:
        return op18
    return onnxscript.values.Opset(domain, version)


def _emit(
    inputs: Sequence[object],
    op_type: str,
    dtypes: Sequence[int],
    domain: str,
    version: int | None,
    attributes: dict[str, object],
    metadata: dict[str, str],
) -> list[ir.Value]:
    for dtype in dtypes:
        if dtype in _NOT_ONE_TO_ONE:
            raise ValueError(
                f"{domain or 'ai.onnx'}::{op_type} declares an output of type {_NOT_ONE_TO_ONE[dtype]}, which torch "
                "stands in for with another type: opreg cannot carry it yet"
            )
    op = onnxscript.values.Op(_opset(domain, op_type, version), op_type)
    result = op(*inputs, **attributes, _outputs=len(dtypes))
    outputs = list(result) if isinstance(result, (list, tuple)) else [result]
    for value, dtype in zip(outputs, dtypes, strict=True):
        value.dtype = ir.DataType(dtype)
        producer = value.producer()
        if producer is not None:
            producer.metadata_props.update(metadata)
    return outputs


@opreg.impl("onnx_symbolic::_symbolic", opset=18)
def onnx_symbolic_symbolic(
    inputs: Sequence[Tensor | None],
    op_type: str,
    onnx_dtype: int,
    *,
    shape: Sequence[int],
    attr_keys: Sequence[str],
    attr_types: Sequence[str],
    attr_pos: Sequence[Sequence[int]],
    attr_ints: Sequence[int],
    attr_floats: Sequence[float],
    attr_strs: Sequence[str],
    metadata_props_keys: Sequence[str] = (),
    metadata_props_values: Sequence[str] = (),
    domain: str = "",
    version: int | None = None,
):
    """_symbolic(Tensor?[] inputs, str op_type, int onnx_dtype, *, SymInt[] shape, str[] attr_keys, str[] attr_types, int[][] attr_pos, int[] attr_ints, float[] attr_floats, str[] attr_strs, str[] metadata_props_keys, str[] metadata_props_values, str domain='', int? version=None) -> Tensor: the node torch.onnx.ops.symbolic describes (its shape comes from torch)."""
    attributes = _attributes(attr_keys, attr_types, attr_pos, attr_ints, attr_floats, attr_strs)
    metadata = dict(zip(metadata_props_keys, metadata_props_values, strict=True))
    (out,) = _emit(inputs, op_type, [onnx_dtype], domain, version, attributes, metadata)
    return out


@opreg.impl("onnx_symbolic::_symbolic_multi_out", opset=18)
def onnx_symbolic_symbolic_multi_out(
    inputs: Sequence[Tensor | None],
    op_type: str,
    onnx_dtypes: Sequence[int],
    *,
    shapes: Sequence[Sequence[int]],
    attr_keys: Sequence[str],
    attr_types: Sequence[str],
    attr_pos: Sequence[Sequence[int]],
    attr_ints: Sequence[int],
    attr_floats: Sequence[float],
    attr_strs: Sequence[str],
    metadata_props_keys: Sequence[str] = (),
    metadata_props_values: Sequence[str] = (),
    domain: str = "",
    version: int | None = None,
):
    """_symbolic_multi_out(Tensor?[] inputs, str op_type, int[] onnx_dtypes, *, SymInt[][] shapes, str[] attr_keys, str[] attr_types, int[][] attr_pos, int[] attr_ints, float[] attr_floats, str[] attr_strs, str[] metadata_props_keys, str[] metadata_props_values, str domain='', int? version=None) -> Tensor[]: the node torch.onnx.ops.symbolic_multi_out describes."""
    attributes = _attributes(attr_keys, attr_types, attr_pos, attr_ints, attr_floats, attr_strs)
    metadata = dict(zip(metadata_props_keys, metadata_props_values, strict=True))
    return tuple(_emit(inputs, op_type, onnx_dtypes, domain, version, attributes, metadata))


# -- RotaryEmbedding ---------------------------------------------------------------------------------


def _last(x, start: int, end: int = _INT64_MAX, step: int = 1):
    """``x[..., start:end:step]``."""
    return op18.Slice(x, [start], [end], [-1], [step])


@opreg.impl("onnx::RotaryEmbedding.opset23", opset=18)
@opreg.impl("onnx::RotaryEmbedding.opset23", opset=23)
def onnx_rotary_embedding(
    x: Tensor,
    cos_cache: Tensor,
    sin_cache: Tensor,
    position_ids: Tensor | None = None,
    *,
    interleaved: bool = False,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
    opset: int,
):
    """RotaryEmbedding.opset23(Tensor x, Tensor cos_cache, Tensor sin_cache, Tensor? position_ids=None, *, bool interleaved=False, SymInt num_heads=0, SymInt rotary_embedding_dim=0) -> Tensor: RotaryEmbedding from ai.onnx 23, before it its decomposition (Gather of the caches, Mul/Sub/Add on the halves or the interleaved pairs)."""
    if opset >= 23:
        return op23.RotaryEmbedding(
            x,
            cos_cache,
            sin_cache,
            position_ids,
            interleaved=int(interleaved),
            num_heads=num_heads,
            rotary_embedding_dim=rotary_embedding_dim,
        )
    rank = rank_of(x)
    if rank == 4:  # (batch, heads, seq, head) -> (batch, seq, heads, head)
        rotated = op18.Transpose(x, perm=[0, 2, 1, 3])
    elif rank == 3:  # (batch, seq, heads * head) -> (batch, seq, heads, head)
        if not num_heads:
            raise ValueError("RotaryEmbedding of a 3-D input needs num_heads")
        rotated = op18.Reshape(x, [0, 0, num_heads, -1])
    else:
        raise ValueError(f"RotaryEmbedding takes a 3-D or 4-D input, got rank {rank}")
    if rotary_embedding_dim:
        kept = _last(rotated, rotary_embedding_dim)
        rotated = _last(rotated, 0, rotary_embedding_dim)
    if position_ids is not None:
        cos_cache = op18.Gather(cos_cache, position_ids, axis=0)
        sin_cache = op18.Gather(sin_cache, position_ids, axis=0)
    cos = op18.Unsqueeze(cos_cache, [2])  # (batch, seq, 1, rotary / 2)
    sin = op18.Unsqueeze(sin_cache, [2])
    if interleaved:
        first, second = _last(rotated, 0, step=2), _last(rotated, 1, step=2)
    else:
        first, second = op18.Split(rotated, axis=-1, num_outputs=2)
    real = op18.Sub(op18.Mul(cos, first), op18.Mul(sin, second))
    imaginary = op18.Add(op18.Mul(sin, first), op18.Mul(cos, second))
    if interleaved:
        pairs = op18.Concat(op18.Unsqueeze(real, [-1]), op18.Unsqueeze(imaginary, [-1]), axis=-1)
        rotated = op18.Reshape(pairs, op18.Shape(rotated))
    else:
        rotated = op18.Concat(real, imaginary, axis=-1)
    if rotary_embedding_dim:
        rotated = op18.Concat(rotated, kept, axis=-1)
    if rank == 3:
        return op18.Reshape(rotated, op18.Shape(x))
    return op18.Transpose(rotated, perm=[0, 2, 1, 3])


# -- Attention ---------------------------------------------------------------------------------------


def _runtime_agrees(node) -> bool:
    """ONNX Runtime's Attention-23 (1.32) applies softcap before the mask (torch's reference, as the
    ONNX spec's diagram, after it: a masked score becomes -softcap, not -inf) and writes masked
    scores of qk_matmul_output_mode=1 otherwise: those nodes take the decomposition."""
    masked = node_arg(node, 3, "attn_mask") is not None or node.kwargs.get("is_causal", False)
    softcap = node.kwargs.get("softcap", 0.0) or 0.0
    return not masked or (softcap == 0.0 and node.kwargs.get("qk_matmul_output_mode", 0) != 1)


def _heads_first(x, heads: int):
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    return op18.Transpose(op18.Reshape(x, [0, 0, heads, -1]), perm=[0, 2, 1, 3])


def _repeat_heads(x, repeats: int):
    """(batch, heads, seq, size) -> (batch, heads * repeats, seq, size), each head repeated in place."""
    if repeats == 1:
        return x
    grown = op18.Expand(op18.Unsqueeze(x, [2]), op18.Concat(op18.Shape(x, end=2), [repeats, 1, 1], axis=0))
    return op18.Reshape(grown, op18.Concat(op18.Shape(x, end=1), [-1], op18.Shape(x, start=2), axis=0))


def _static(value, what: str) -> int:
    if not isinstance(value, int):
        raise ValueError(f"the Attention decomposition needs a static {what}, got {value}")
    return value


@opreg.impl("onnx::Attention.opset23", opset=18)
@opreg.impl("onnx::Attention.opset23", opset=23, predicate=_runtime_agrees)
def onnx_attention(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    attn_mask: Tensor | None = None,
    past_key: Tensor | None = None,
    past_value: Tensor | None = None,
    *,
    is_causal: bool = False,
    kv_num_heads: int = 0,
    q_num_heads: int = 0,
    qk_matmul_output_mode: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    opset: int,
):
    """Attention.opset23(Tensor Q, Tensor K, Tensor V, Tensor? attn_mask=None, Tensor? past_key=None, Tensor? past_value=None, *, bool is_causal=False, SymInt kv_num_heads=0, SymInt q_num_heads=0, SymInt qk_matmul_output_mode=0, float? scale=None, float softcap=0., SymInt? softmax_precision=None) -> (Tensor, Tensor, Tensor, Tensor): Attention from ai.onnx 23 where ONNX Runtime agrees with torch (predicate), else its decomposition (MatMul, masks, Softmax)."""
    if opset >= 23:
        return op23.Attention(
            Q,
            K,
            V,
            attn_mask,
            past_key,
            past_value,
            is_causal=int(is_causal),
            kv_num_heads=kv_num_heads or None,  # Attention-24 refuses head counts (even 0) with 4-D inputs
            q_num_heads=q_num_heads or None,
            qk_matmul_output_mode=qk_matmul_output_mode,
            scale=None if scale is None else float(scale),
            softcap=float(softcap),
            softmax_precision=softmax_precision,
        )
    three_d = rank_of(Q) == 3
    if three_d:
        if not (q_num_heads and kv_num_heads):
            raise ValueError("Attention of 3-D inputs needs q_num_heads and kv_num_heads")
        Q, K, V = _heads_first(Q, q_num_heads), _heads_first(K, kv_num_heads), _heads_first(V, kv_num_heads)
    present_key = K if past_key is None else op18.Concat(past_key, K, axis=2)
    present_value = V if past_value is None else op18.Concat(past_value, V, axis=2)
    heads = _static(q_num_heads if three_d else Q.shape[1], "number of query heads")
    kv_heads = _static(kv_num_heads if three_d else K.shape[1], "number of key/value heads")
    keys = _repeat_heads(present_key, heads // kv_heads)
    values = _repeat_heads(present_value, heads // kv_heads)

    if scale is None:
        size = op18.CastLike(op18.Shape(Q, start=3, end=4), Q)
        root = op18.Sqrt(op18.Sqrt(op18.Reciprocal(size)))  # sqrt of the default scale 1/sqrt(size)
    else:
        root = op18.CastLike(math.sqrt(scale), Q)
    qk = op18.MatMul(op18.Mul(Q, root), op18.Transpose(op18.Mul(keys, root), perm=[0, 1, 3, 2]))
    output_qk = qk

    lengths = op18.Concat(op18.Shape(Q, start=2, end=3), op18.Shape(keys, start=2, end=3), axis=0)
    minus_inf = op18.CastLike(float("-inf"), Q)
    if is_causal:  # -inf above the diagonal of the upper-left aligned (q, kv) square
        qk = op18.Add(qk, op18.Trilu(op18.Expand(minus_inf, lengths), 1, upper=1))
    if attn_mask is not None:
        if attn_mask.dtype == ir.DataType.BOOL:
            attn_mask = op18.Where(attn_mask, op18.CastLike(0.0, Q), minus_inf)
        qk = op18.Add(qk, attn_mask)
    if qk_matmul_output_mode == 1:
        output_qk = qk
    if softcap > 0.0:
        cap = op18.CastLike(softcap, Q)
        qk = op18.Mul(cap, op18.Tanh(op18.Div(qk, cap)))
    if qk_matmul_output_mode == 2:
        output_qk = qk
    if softmax_precision is not None:
        probabilities = op18.CastLike(op18.Softmax(op18.Cast(qk, to=softmax_precision), axis=-1), Q)
    else:
        probabilities = op18.Softmax(qk, axis=-1)
    if qk_matmul_output_mode == 3:
        output_qk = probabilities
    out = op18.MatMul(probabilities, values)
    if three_d:  # (batch, heads, seq, size) -> (batch, seq, heads * size)
        out = op18.Reshape(op18.Transpose(out, perm=[0, 2, 1, 3]), [0, 0, -1])
    return out, present_key, present_value, output_qk
