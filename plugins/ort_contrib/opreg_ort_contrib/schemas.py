"""ONNX schemas of the com.microsoft ops this pack emits.

ONNX Runtime implements these kernels but ``onnx.defs`` does not know them; with
these registered, onnxscript can trace them, the rewrite rules see typed and
shaped values, and the checker and shape inference understand them. Inputs,
outputs and attributes are those of ONNX Runtime's own definitions
(``onnxruntime/core/graph/contrib_ops``), trimmed to the ones this pack uses where
ONNX Runtime has many more (GroupQueryAttention's quantized cache inputs are left
out). Shape inference covers the outputs the pack reads.
"""

from __future__ import annotations

import copy

from opreg_ort_contrib import CONTRIB_DOMAIN

_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)"]
_ATTENTION_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]


def _input(name: str, type_str: str, doc: str, optional: bool = False):
    from onnx.defs import OpSchema

    option = OpSchema.FormalParameterOption.Optional if optional else OpSchema.FormalParameterOption.Single
    return OpSchema.FormalParameter(name, type_str, doc, param_option=option)


def _attr(name: str, kind: str, doc: str):
    from onnx.defs import OpSchema

    return OpSchema.Attribute(name, getattr(OpSchema.AttrType, kind), doc, required=False)


def _schema(name: str, doc: str, inputs, outputs, types, attributes=(), infer=None):
    from onnx.defs import OpSchema

    schema = OpSchema(
        name,
        CONTRIB_DOMAIN,
        1,
        doc,
        inputs=inputs,
        outputs=outputs,
        type_constraints=types,
        attributes=list(attributes),
    )
    schema.set_type_and_shape_inference_function(infer or _same_as_input)
    return schema


# -- shape inference -------------------------------------------------------------------------


def _same_as_input(ctx) -> None:
    ctx.set_output_type(0, ctx.get_input_type(0))


def _dims(ctx, index: int):
    """The dims of input ``index`` (``None`` if its shape is unknown)."""
    if not ctx.has_input(index):
        return None
    tensor = ctx.get_input_type(index).tensor_type
    return list(tensor.shape.dim) if tensor.HasField("shape") else None


def _int_attr(ctx, name: str, default: int = 0) -> int:
    attr = ctx.get_attribute(name)
    return default if attr is None else attr.i


def _output(ctx, index: int, like: int, dims) -> None:
    """Set output ``index`` to input ``like``'s element type and ``dims`` (when known)."""
    output = copy.deepcopy(ctx.get_input_type(like))
    shape = output.tensor_type.shape
    del shape.dim[:]
    if dims is None:
        output.tensor_type.ClearField("shape")
    else:
        for dim in dims:
            added = shape.dim.add()
            if isinstance(dim, int):
                added.dim_value = dim
            else:
                added.CopyFrom(dim)
    ctx.set_output_type(index, output)


def _attention_output(ctx) -> None:
    """MultiHeadAttention / GroupQueryAttention: (batch, sequence, value hidden size)."""
    query, value = _dims(ctx, 0), _dims(ctx, 2)
    if query is None or len(query) != 3:
        _output(ctx, 0, 0, None)
        return
    hidden = query[2]
    if value is not None and len(value) == 3:
        if ctx.get_attribute("kv_num_heads") is not None:  # GroupQueryAttention: heads * (kv hidden / kv heads)
            kv_heads, heads = _int_attr(ctx, "kv_num_heads"), _int_attr(ctx, "num_heads")
            if value[2].HasField("dim_value") and kv_heads:
                hidden = value[2].dim_value // kv_heads * heads
        else:
            hidden = value[2]
    _output(ctx, 0, 0, [query[0], query[1], hidden])


def _group_query_attention_output(ctx) -> None:
    """GroupQueryAttention: the output as :func:`_attention_output` (a packed query holds the key
    and value heads too); the present keys and values (batch, kv heads, ?, head size) in the
    past's type (their length is the buffer's or the total)."""
    query = _dims(ctx, 0)
    heads, kv_heads = _int_attr(ctx, "num_heads"), _int_attr(ctx, "kv_num_heads")
    if not ctx.has_input(1) and query is not None and len(query) == 3 and query[2].HasField("dim_value") and heads:
        _output(ctx, 0, 0, [query[0], query[1], query[2].dim_value * heads // (heads + 2 * kv_heads)])
    else:
        _attention_output(ctx)
    for index, past in ((1, 3), (2, 4)):
        if ctx.has_output(index) and ctx.has_input(past):
            dims = _dims(ctx, past)
            unknown = None
            if dims is not None and len(dims) == 4:
                unknown = copy.deepcopy(dims[2])
                unknown.Clear()
            _output(ctx, index, past, None if dims is None or len(dims) != 4 else [dims[0], dims[1], unknown, dims[3]])


def _packed_attention_output(ctx) -> None:
    """Attention: (batch, sequence, v hidden size) from ``qkv_hidden_sizes`` or the weights."""
    x, weights = _dims(ctx, 0), _dims(ctx, 1)
    if x is None or weights is None or len(x) != 3 or len(weights) != 2:
        _output(ctx, 0, 0, None)
        return
    sizes = ctx.get_attribute("qkv_hidden_sizes")
    if sizes is not None and len(sizes.ints) == 3:
        hidden = int(sizes.ints[2])
    elif weights[1].HasField("dim_value"):
        hidden = weights[1].dim_value // 3
    else:
        _output(ctx, 0, 0, None)
        return
    _output(ctx, 0, 0, [x[0], x[1], hidden])


def _fused_matmul_output(ctx) -> None:
    """FusedMatMul: MatMul's broadcast, each operand's last two dims swapped first when asked."""
    a, b = _dims(ctx, 0), _dims(ctx, 1)
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        _output(ctx, 0, 0, None)
        return
    if _int_attr(ctx, "transA"):
        a[-1], a[-2] = a[-2], a[-1]
    if _int_attr(ctx, "transB"):
        b[-1], b[-2] = b[-2], b[-1]
    batch_a, batch_b = a[:-2], b[:-2]
    longer = batch_a if len(batch_a) >= len(batch_b) else batch_b
    other = batch_b if longer is batch_a else batch_a
    batch = list(longer)
    for i in range(1, len(other) + 1):
        mine, theirs = batch[-i], other[-i]
        if mine.HasField("dim_value") and mine.dim_value == 1:
            batch[-i] = theirs
    _output(ctx, 0, 0, [*batch, a[-2], b[-1]])


# -- the ops ---------------------------------------------------------------------------------------


def _unary(name: str, doc: str, *, optional_bias: bool = False, attributes=()):
    inputs = [_input("X", "T", "input")]
    if optional_bias:
        inputs.append(_input("bias", "T", "bias added first", optional=True))
    return _schema(
        name, doc, inputs, [_input("Y", "T", "output, same type and shape as X")],
        [("T", _FLOATS, "floating point tensors")], attributes,
    )  # fmt: skip


def _attention_schemas() -> list:
    t = [("T", _ATTENTION_FLOATS, "floating point tensors"), ("M", ["tensor(int32)"], "masks and lengths")]
    return [_multi_head_attention_schema(t), _group_query_attention_schema(t), _packed_attention_schema(t)]


def _multi_head_attention_schema(t: list):
    return _schema(
        "MultiHeadAttention",
        "Multi-head self or cross attention on (batch, sequence, hidden) inputs (onnxruntime contrib).",
        [
            _input("query", "T", "(batch, sequence, hidden)"),
            _input("key", "T", "(batch, kv sequence, hidden)", optional=True),
            _input("value", "T", "(batch, kv sequence, v hidden)", optional=True),
            _input("bias", "T", "packed q, k, v projection bias", optional=True),
            _input("key_padding_mask", "M", "key padding mask", optional=True),
            _input("attention_bias", "T", "added to QK' (batch or 1, heads or 1, sequence, total)", optional=True),
            _input("past_key", "T", "past keys", optional=True),
            _input("past_value", "T", "past values", optional=True),
        ],
        [
            _input("output", "T", "(batch, sequence, v hidden)"),
            _input("present_key", "T", "present keys", optional=True),
            _input("present_value", "T", "present values", optional=True),
        ],
        t,
        [
            _attr("num_heads", "INT", "number of heads"),
            _attr("scale", "FLOAT", "scale of QK' (default 1/sqrt(head size))"),
            _attr("mask_filter_value", "FLOAT", "value of masked-out positions"),
            _attr("unidirectional", "INT", "causal (1) or not (0)"),
        ],
        _attention_output,
    )


def _group_query_attention_schema(t: list):
    return _schema(
        "GroupQueryAttention",
        "Attention with fewer key/value heads than query heads (onnxruntime contrib).",
        [
            _input("query", "T", "(batch, sequence, heads * head size)"),
            _input("key", "T", "(batch, sequence, kv heads * head size)", optional=True),
            _input("value", "T", "(batch, sequence, kv heads * head size)", optional=True),
            _input("past_key", "T", "past keys (batch, kv heads, past, head size)", optional=True),
            _input("past_value", "T", "past values (batch, kv heads, past, head size)", optional=True),
            _input("seqlens_k", "M", "(batch,): total sequence length - 1 of each row"),
            _input("total_sequence_length", "M", "(): the longest total sequence length"),
            _input("cos_cache", "T", "rotary cos cache", optional=True),
            _input("sin_cache", "T", "rotary sin cache", optional=True),
            _input("position_ids", "tensor(int64)", "rotary positions", optional=True),
            _input("attention_bias", "T", "added to QK' (batch or 1, heads or 1, sequence, total)", optional=True),
            _input("head_sink", "T", "(heads,): added to each head's softmax denominator", optional=True),
            _input("k_scale", "tensor(float)", "scale of a quantized past_key", optional=True),
            _input("v_scale", "tensor(float)", "scale of a quantized past_value", optional=True),
            _input("q_norm_weight", "T", "(head size): RMS norm of each query head first", optional=True),
            _input("k_norm_weight", "T", "(head size): RMS norm of each key head first", optional=True),
            _input("query_seqlens", "M", "(batch,): the query's valid (not right-padded) rows", optional=True),
        ],
        [
            _input("output", "T", "(batch, sequence, heads * head size)"),
            _input("present_key", "T", "present keys (batch, kv heads, total or buffer, head size)", optional=True),
            _input("present_value", "T", "present values (batch, kv heads, total or buffer, head size)", optional=True),
        ],
        t,
        [
            _attr("num_heads", "INT", "number of query heads"),
            _attr("kv_num_heads", "INT", "number of key/value heads"),
            _attr("scale", "FLOAT", "scale of QK' (default 1/sqrt(head size))"),
            _attr("causal", "INT", "causal (1, the default) or not (0)"),
            _attr("do_rotary", "INT", "apply rotary embedding to query and key"),
            _attr("rotary_interleaved", "INT", "interleaved rotary"),
            _attr("local_window_size", "INT", "sliding window (-1: none)"),
            _attr("softcap", "FLOAT", "softcap of the scores (0: none)"),
        ],
        _group_query_attention_output,
    )


def _packed_attention_schema(t: list):
    return _schema(
        "Attention",
        "Self attention with the q, k, v projections packed into one weight (onnxruntime contrib).",
        [
            _input("input", "T", "(batch, sequence, input hidden)"),
            _input("weights", "T", "(input hidden, q hidden + k hidden + v hidden)"),
            _input("bias", "T", "(q hidden + k hidden + v hidden)", optional=True),
            _input("mask_index", "M", "mask index", optional=True),
            _input("past", "T", "past state", optional=True),
            _input("attention_bias", "T", "added to QK' (batch or 1, heads or 1, sequence, total)", optional=True),
        ],
        [_input("output", "T", "(batch, sequence, v hidden)"), _input("present", "T", "present", optional=True)],
        t,
        [
            _attr("num_heads", "INT", "number of heads"),
            _attr("qkv_hidden_sizes", "INTS", "hidden sizes of q, k and v"),
            _attr("scale", "FLOAT", "scale of QK' (default 1/sqrt(head size))"),
            _attr("mask_filter_value", "FLOAT", "value of masked-out positions"),
            _attr("unidirectional", "INT", "causal (1) or not (0)"),
        ],
        _packed_attention_output,
    )


def _normalization_schemas() -> list:
    t = [("T", _ATTENTION_FLOATS, "floating point tensors"), ("U", ["tensor(float)"], "statistics")]
    outputs = [
        _input("output", "T", "normalized input + skip (+ bias)"),
        _input("mean", "U", "mean", optional=True),
        _input("inv_std_var", "U", "inverse standard deviation", optional=True),
        _input("input_skip_bias_sum", "T", "input + skip (+ bias)", optional=True),
    ]
    epsilon = [_attr("epsilon", "FLOAT", "added to the variance")]

    def infer(ctx) -> None:
        for index in range(ctx.get_num_outputs()):
            if ctx.has_output(index) and index in (0, 3):
                ctx.set_output_type(index, ctx.get_input_type(0))

    skip = _schema(
        "SkipLayerNormalization", "LayerNormalization of input + skip (+ bias) (onnxruntime contrib).",
        [
            _input("input", "T", "(batch, sequence, hidden)"), _input("skip", "T", "same shape as input"),
            _input("gamma", "T", "(hidden)"), _input("beta", "T", "(hidden)", optional=True),
            _input("bias", "T", "(hidden)", optional=True),
        ],
        outputs, t, epsilon, infer,
    )  # fmt: skip
    simplified = _schema(
        "SkipSimplifiedLayerNormalization", "RMS normalization of input + skip (+ bias) (onnxruntime contrib).",
        [
            _input("input", "T", "(batch, sequence, hidden)"), _input("skip", "T", "same shape as input"),
            _input("gamma", "T", "(hidden)"), _input("bias", "T", "(hidden)", optional=True),
        ],
        outputs, t, epsilon, infer,
    )  # fmt: skip
    return [skip, simplified]


def _matmul_nbits_output(ctx) -> None:
    """MatMulNBits: A's dims with the last one ``N``."""
    a = _dims(ctx, 0)
    n = ctx.get_attribute("N")
    _output(ctx, 0, 0, None if a is None or n is None else [*a[:-1], n.i])


def _matmul_nbits_schema():
    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    return _schema(
        "MatMulNBits",
        "MatMul of A and a weight quantized block-wise to N bits along K (onnxruntime contrib).",
        [
            _input("A", "T1", "(..., K), not quantized"),
            _input("B", "T2", "(N, K blocks, block bytes): the weight's packed quantized values"),
            _input("scales", "T1", "(N, K blocks) or (N * K blocks): each block's scale"),
            _input("zero_points", "T3", "each block's zero point, packed uint8 or A's type (default 2^(bits-1))",
                   optional=True),
            _input("g_idx", "T4", "group index (deprecated)", optional=True),
            _input("bias", "T1", "(N): added to the result", optional=True),
        ],
        [_input("Y", "T1", "(..., N)")],
        [
            ("T1", floats, "A, scales, bias and Y"), ("T2", ["tensor(uint8)", "tensor(int32)"], "packed weight"),
            ("T3", ["tensor(uint8)", "tensor(int32)", *floats], "zero points"), ("T4", ["tensor(int32)"], "g_idx"),
        ],
        [
            _attr("K", "INT", "input feature dim"), _attr("N", "INT", "output feature dim"),
            _attr("bits", "INT", "bits per weight (2, 4 or 8)"), _attr("block_size", "INT", "block size along K"),
            _attr("accuracy_level", "INT", "minimum precision of A in the computation (4: int8)"),
        ],
        _matmul_nbits_output,
    )  # fmt: skip


def _gather_block_quantized_output(ctx) -> None:
    """GatherBlockQuantized (gather_axis 0, quantize_axis 1, 2-D data): the indices' dims and the
    row's values (packed bytes times 8 / bits), in the scales' type."""
    data, indices, bits = _dims(ctx, 0), _dims(ctx, 1), _int_attr(ctx, "bits", 4)
    row = data[1] if data is not None and len(data) == 2 and data[1].HasField("dim_value") else None
    dims = None if indices is None or row is None else [*indices, row.dim_value * 8 // bits]
    _output(ctx, 0, 2, dims)


def _gather_block_quantized_schema():
    return _schema(
        "GatherBlockQuantized",
        "Gather of rows of a table quantized block-wise along its rows (onnxruntime contrib).",
        [
            _input("data", "T1", "(N, row bytes): the rows' packed quantized values"),
            _input("indices", "Tind", "which rows"),
            _input("scales", "T2", "(N, blocks per row): each block's scale"),
            _input("zero_points", "T1", "each block's zero point, packed (default 2^(bits-1) for uint8)",
                   optional=True),
        ],
        [_input("output", "T2", "indices' dims and the row's values")],
        [
            ("T1", ["tensor(uint8)", "tensor(int4)", "tensor(uint4)"], "quantized values"),
            ("Tind", ["tensor(int32)", "tensor(int64)"], "indices"),
            ("T2", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "scales and output"),
        ],
        [
            _attr("bits", "INT", "bits per value (2, 4 or 8) of uint8 data"),
            _attr("block_size", "INT", "block size along quantize_axis"),
            _attr("gather_axis", "INT", "the axis gathered (0)"), _attr("quantize_axis", "INT", "the axis quantized"),
        ],
        _gather_block_quantized_output,
    )  # fmt: skip


def schemas() -> list:
    """Every com.microsoft op the pack's impls and rewrite rules emit, version 1."""
    floats = [("T", _FLOATS, "floating point tensors")]
    rotary = _schema(
        "RotaryEmbedding",
        "Rotary position embedding of (batch, sequence, hidden) or (batch, heads, sequence, head size) "
        "inputs (onnxruntime contrib).",
        [
            _input("input", "T", "input"),
            _input("position_ids", "M", "(batch, sequence) or (1)"),
            _input("cos_cache", "T", "(max sequence, rotary dim / 2)"),
            _input("sin_cache", "T", "(max sequence, rotary dim / 2)"),
        ],
        [_input("output", "T", "same shape as input")],
        [("T", _ATTENTION_FLOATS, "floating point tensors"), ("M", ["tensor(int64)"], "positions")],
        [
            _attr("interleaved", "INT", "rotate interleaved pairs (1) or halves (0)"),
            _attr("num_heads", "INT", "number of heads of a 3-D input"),
            _attr("rotary_embedding_dim", "INT", "rotary dim (default: head size)"),
            _attr("scale", "FLOAT", "scale of the positions"),
        ],
    )
    bias_gelu = _schema(
        "BiasGelu", "Gelu (erf) of A + bias B (onnxruntime contrib).",
        [_input("A", "T", "input"), _input("B", "T", "bias, 1-D of A's last dim")],
        [_input("C", "T", "output, same type and shape as A")], floats,
    )  # fmt: skip
    fused_matmul = _schema(
        "FusedMatMul", "alpha * MatMul of optionally transposed operands (onnxruntime contrib).",
        [_input("A", "T", "left operand"), _input("B", "T", "right operand")], [_input("Y", "T", "product")], floats,
        [_attr(n, "INT", f"transpose {n[-1]}") for n in ("transA", "transB", "transBatchA", "transBatchB")]
        + [_attr("alpha", "FLOAT", "scale of the product")],
        _fused_matmul_output,
    )  # fmt: skip
    return [
        _unary("Gelu", "Gaussian error linear unit, erf form (onnxruntime contrib)."),
        _unary("FastGelu", "GELU, tanh approximation (onnxruntime contrib).", optional_bias=True),
        _unary(
            "QuickGelu",
            "x * sigmoid(alpha * x) (onnxruntime contrib).",
            attributes=[_attr("alpha", "FLOAT", "alpha (default 1.702)")],
        ),
        _unary("Inverse", "Inverse of square matrices over the last two dims (onnxruntime contrib)."),
        bias_gelu,
        fused_matmul,
        rotary,
        *_attention_schemas(),
        *_normalization_schemas(),
        _matmul_nbits_schema(),
        _gather_block_quantized_schema(),
    ]
