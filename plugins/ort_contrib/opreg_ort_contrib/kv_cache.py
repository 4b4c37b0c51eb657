"""A decoder's attention on its KV cache as ONNX Runtime's GroupQueryAttention, past and present
able to share one buffer.

A language model exported with its cache as inputs and outputs (``past_key_values.*`` in,
``present.*`` out, as ONNX Runtime GenAI runs it) reaches this pass, at the ``onnxruntime``
target, with every layer's attention written as the sdpa impl and the lean pass leave it::

    present_k = Concat(past_k, k_new, axis=2)                      # a graph input, a graph output
    keys = Reshape(Expand(Unsqueeze(present_k, 2), ...), ...)    # transformers' repeat_kv
    y = MultiHeadAttention(q, keys, values, bias)                # bias: the model's 4-D mask
    y = Mul(y, rows_with_keys)                                   # a row with no key gives 0, as torch's

:class:`GroupQueryAttentionOnCache` makes it one node per layer::

    y, present_k, present_v = GroupQueryAttention(q, k_new, v_new, past_k, past_v,
                                                  seqlens_k, total_sequence_length, ...,
                                                  attention_bias, head_sink[, ..., query_seqlens])

on the unrepeated cache, which it appends to in place when past and present are bound to
one buffer (ONNX Runtime GenAI's ``past_present_share_buffer``), and which it returns
as ``past + new`` when they are not. Everything it reads comes from the 2-D attention mask
(batch, total length): ``total_sequence_length`` is the mask's length ``T``, every row's
``seqlens_k`` is ``T - 1`` (a row's keys are the mask's columns, left padding included),
the padding becomes ``attention_bias`` (0 or float32's lowest), and a ``head_sink`` far below
any score makes a row with no key (a left-padded query of a prompt) 0, as torch gives it. The
kernel's causal mask does the rest. This is exact for left padding and with a shared buffer,
whose length (the longest generation) the graph never reads; ONNX Runtime GenAI's builder
derives ``seqlens_k`` from the mask's sum instead, which a left-padded row gets wrong.

The node has 16 inputs, as ONNX Runtime 1.30 (onnxruntime-node in transformers.js 4.3) loads
it, unless the pass is made with ``query_lengths=True`` (a target naming ONNX Runtime 1.32 or
newer, ``onnxruntime==1.32``): then its 17th input ``query_seqlens``, the query length, lifts
the kernel's batch-1 limit on a batch of prompts after a cache (a query of more than one token
and a past), which without it the kernel refuses at run time ("batch_size must be 1 when
sequence_length > 1 and past context is given"), as it refuses the builder's graph. Where both
run they give the same values (``tests/test_older_runtimes.py``, ``bench/llm.py``).

The rewrite must not change what the model computes, so the mask is not recognised by its
spelling (every architecture and transformers version writes it differently) but by its
values: the nodes that compute it from the graph's inputs are run, on their own, in ONNX
Runtime for a few batches, lengths and paddings (up to a past of 2**17, so a sliding window
shows), and only a mask that is exactly "causal and not padding" in each is replaced. A
model whose mask is something else (a sliding window, bidirectional tokens, ALiBi) keeps
its attention as it is. Measured (``bench/llm.py``, ONNX Runtime 1.32, 1 thread):
GroupQueryAttention with the bias (and ``query_seqlens``) costs what it costs without
them; rotary embedding inside it (``do_rotary``, with the packed projection it allows) is
left out, at most 1% of a decode step and slower in a prompt (see the bench's kernels).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from opreg_ort_contrib import CONTRIB_DOMAIN
from opreg_ort_contrib.probe import Slice, dim_name, dims, provenance

_LOWEST = float(np.finfo(np.float32).min)
_SINK = -1e30
"""GroupQueryAttention's ``head_sink``: a logit added to each row's softmax. Far below any
score, it changes nothing in a row that sees a key; in a row that sees none (a left-padded
query of a prompt, every key at float32's lowest) it is the only term left, so the row's
output is 0, as torch's. Measured as fast as the kernel without it, or faster."""
_MASK_TYPES = (ir.DataType.INT64, ir.DataType.INT32, ir.DataType.BOOL)
ONE_ROW_KEY = "opreg.one_row_after_a_cache"
"""The model's metadata key saying that a batch of prompts after a cache runs one row at a time
(GroupQueryAttention without ``query_seqlens``); :meth:`opreg.llm.Decoder.verify` reads it."""
LONG_PAST = 1 << 17
"""The past of the probe's long decode step: a mask with a sliding window shorter than this differs
from a causal one there."""


# -- finding the pattern ---------------------------------------------------------------------------


def _ints(value: ir.Value | None) -> list[int] | None:
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else [int(v) for v in tensor.numpy().reshape(-1)]


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = None if value is None else value.producer()
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _unrepeated(keys: ir.Value) -> ir.Value | None:
    """The (batch, kv heads, seq, size) value that ``keys`` repeats (transformers' ``repeat_kv``:
    ``Reshape(Expand(Unsqueeze(x, 2)))``), ``keys`` itself if it is not repeated, looking through
    a move into (batch, seq, hidden); ``None`` if it is something else."""
    reshape = _producer(keys, "Reshape")
    if reshape is not None and _ints(reshape.inputs[1]) == [0, 0, -1]:  # moved to 3-D for the kernel
        transpose = _producer(reshape.inputs[0], "Transpose")
        if transpose is None or list(transpose.attributes["perm"].as_ints()) != [0, 2, 1, 3]:
            return None
        keys = transpose.inputs[0]
        reshape = _producer(keys, "Reshape")
    expand = _producer(reshape.inputs[0], "Expand") if reshape is not None else None
    unsqueeze = _producer(expand.inputs[0], "Unsqueeze") if expand is not None else None
    if unsqueeze is not None and _ints(unsqueeze.inputs[1]) == [2]:
        return unsqueeze.inputs[0]
    return keys


@dataclasses.dataclass
class _Cache:
    """One layer's cache: ``present = Concat(past, new, axis=2)``."""

    concat: ir.Node
    past: ir.Value
    new: ir.Value

    @property
    def present(self) -> ir.Value:
        return self.concat.outputs[0]


def _cache(value: ir.Value | None) -> _Cache | None:
    """``value`` as a cache appended to: a graph output that concatenates a 4-D graph input and new keys."""
    concat = _producer(value, "Concat")
    if concat is None or len(concat.inputs) != 2 or concat.attributes["axis"].as_int() not in (2, -2):
        return None
    past, new = concat.inputs
    if past is None or new is None or not past.is_graph_input() or not value.is_graph_output():
        return None
    if len(dims(past) or ()) != 4 or len(dims(new) or ()) != 4:
        return None
    return _Cache(concat, past, new)


@dataclasses.dataclass
class _Layer:
    """One attention on a cache, as the pass found it."""

    node: ir.Node
    query: ir.Value
    key: _Cache
    value: _Cache
    bias: ir.Value
    heads: int
    kv_heads: int
    output: ir.Value
    """What the layer's later nodes read: the attention's output, or its product with the rows with keys."""


def _layers(graph: ir.Graph) -> Iterator[_Layer]:
    for node in graph:
        if node.op_type != "MultiHeadAttention" or node.domain != CONTRIB_DOMAIN:
            continue
        inputs = list(node.inputs) + [None] * (6 - len(node.inputs))
        query, keys, values, bias = inputs[0], inputs[1], inputs[2], inputs[5]
        if any(v is not None for v in inputs[3:5]) or len(node.inputs) > 6 or bias is None:
            continue  # a packed bias, a key padding mask or a past of its own; or no mask
        if any(a.name not in ("num_heads", "scale", "unidirectional") for a in node.attributes.values()):
            continue
        if node.attributes.get("unidirectional") is not None and node.attributes["unidirectional"].as_int():
            continue
        key, value = _cache(_unrepeated(keys)), _cache(_unrepeated(values))
        heads = node.attributes["num_heads"].as_int()
        if key is None or value is None or len(dims(query) or ()) != 3:
            continue
        kv_heads, size = dims(key.past)[1], dims(key.past)[3]
        if not isinstance(kv_heads, int) or not isinstance(size, int) or heads % kv_heads or size % 8:
            continue  # GroupQueryAttention's head size is a multiple of 8
        if dims(value.past)[1] != kv_heads or dims(bias) is None or len(dims(bias)) != 4:
            continue
        if query.dtype != ir.DataType.FLOAT or key.past.dtype != ir.DataType.FLOAT:
            continue  # its CPU kernel is float32's
        output = node.outputs[0]
        uses = list(output.uses())
        if len(uses) == 1 and uses[0].node.op_type == "Mul" and uses[0].node.domain == "" and uses[0].idx == 0:
            output = uses[0].node.outputs[0]  # the sdpa impl's product with the rows that have keys
        yield _Layer(node, query, key, value, bias, heads, kv_heads, output)


# -- the mask, by its values ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Sizes:
    """The dims a probe gives values to (an int, or a symbolic dim's name): batch, query
    length, past length and the mask's length."""

    batch: int | str
    query: int | str
    past: int | str
    total: int | str

    @staticmethod
    def of(*dims) -> _Sizes | None:
        names = [dim_name(d) for d in dims]
        return None if any(n is None for n in names) else _Sizes(*names)

    def values(self, batch: int, query: int, past: int) -> dict[str, int]:
        """The value of each symbolic dim in a probe of these sizes."""
        pairs = ((self.batch, batch), (self.query, query), (self.past, past), (self.total, query + past))
        values: dict[str, int] = {}
        for dim, value in pairs:
            if isinstance(dim, str) and values.setdefault(dim, value) != value:
                raise ValueError(dim)  # one symbol, two sizes: not a probe these dims allow
        return values


def _probe_cases(static: dict[str, int]) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """(batch, query length, past length, mask) for the probe: prompts, decode steps, a long past,
    left padding and a hole, within what the static sizes in ``static`` allow."""
    cases = [(2, 3, 4), (2, 1, 11), (3, 6, 0), (1, 1, LONG_PAST), (2, 4, 9)]
    for rows, length, cached in cases:
        batch, query = static.get("batch", rows), static.get("query", length)
        past = static["past"] if "past" in static else static.get("total", query + cached) - query
        total = query + past
        if past < 0 or static.get("total", total) != total:
            continue
        mask = np.ones((batch, total), np.int64)
        for row in range(1, batch):
            mask[row, : min(row * 2, total - 1)] = 0  # left padding, more in each row
        if batch > 2 and total > 4:
            mask[2, total - 3] = 0  # a hole
        yield batch, query, past, mask


def _expected(query: int, past: int, mask: np.ndarray) -> np.ndarray:
    """(batch, 1, query, total): key j is seen by query i if it is causal and not padding."""
    total = mask.shape[1]
    causal = np.arange(total)[None, :] <= past + np.arange(query)[:, None]
    return causal[None, None] & (mask[:, None, None, :] != 0)


def is_causal_padding_mask(bias: ir.Value, batch, query, past) -> ir.Value | None:
    """The 2-D mask input from which ``bias`` (bool: True sees; float: 0 sees, float32's lowest
    or -inf does not) is computed as "causal and not padding", for the ``batch``, ``query`` and
    ``past`` dims (ints or symbolic dims), checked by running its nodes (see the module
    docstring); ``None`` if it is not that, or cannot be checked."""
    cut = Slice.of(bias)
    mask = None if cut is None else cut.source
    if mask is None or len(dims(mask) or ()) != 2 or mask.dtype not in _MASK_TYPES:
        return None
    sizes = _Sizes.of(batch, query, past, dims(mask)[1])
    if sizes is None or dim_name(dims(mask)[0]) != sizes.batch:
        return None
    prober = cut.prober()
    if prober is None:
        return None
    roles = ("batch", "query", "past", "total")
    static = {role: getattr(sizes, role) for role in roles if isinstance(getattr(sizes, role), int)}
    probed = 0
    for rows, length, cached, padded in _probe_cases(static):
        try:
            values = sizes.values(rows, length, cached)
        except ValueError:
            continue
        got, expected = prober(padded, values), _expected(length, cached, padded)
        try:
            got = np.broadcast_to(got, expected.shape)
        except (TypeError, ValueError):  # failed to run at these sizes, or another shape: not the mask
            return None
        if got.dtype == np.bool_:
            sees = got
        else:
            sees = got == 0
            if not np.all(sees | (got <= _LOWEST)):
                return None  # values other than "sees" and "does not": a bias, not a mask
        if not np.array_equal(sees, expected):
            return None
        probed += 1
    return mask if probed else None


# -- the rewrite -----------------------------------------------------------------------------------


class _Builder:
    """Adds nodes before ``anchor`` with the provenance ``metadata``."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node, metadata: dict[str, str]) -> None:
        self.graph, self.anchor, self.metadata = graph, anchor, metadata

    def __call__(self, op_type: str, *inputs, domain: str = "", outputs: int = 1, **attributes):
        node = ir.node(
            op_type, list(inputs), attributes, domain=domain, num_outputs=outputs, metadata_props=dict(self.metadata)
        )
        self.graph.insert_before(self.anchor, node)
        return node.outputs[0] if outputs == 1 else node.outputs

    def constant(self, array) -> ir.Value:
        return self("Constant", value=ir.tensor(np.asarray(array)))


@dataclasses.dataclass
class _MaskInputs:
    """What every layer's GroupQueryAttention reads, computed once from the mask."""

    bias: ir.Value
    seqlens: ir.Value
    total: ir.Value
    query_lengths: ir.Value | None
    """Every row's query length (``query_seqlens``), or ``None`` when the node leaves it out."""


def _mask_inputs(build: _Builder, mask: ir.Value, query: ir.Value, query_lengths: bool) -> _MaskInputs:
    length = _size(build, query, 1)  # the query length, (1,)
    batch, total = _size(build, mask, 0), _size(build, mask, 1)
    seen = build("Cast", mask, to=ir.DataType.BOOL) if mask.dtype != ir.DataType.BOOL else mask
    padding = build("Where", build("Unsqueeze", seen, build.constant([1, 2])), build.constant(np.float32(0.0)),
                    build.constant(np.float32(_LOWEST)))  # fmt: skip
    bias = build("Expand", padding, build("Concat", batch, build.constant([1]), length, total, axis=0))
    i32 = ir.DataType.INT32
    total32 = build("Cast", total, to=i32)
    seqlens = build("Expand", build("Sub", total32, build.constant(np.array([1], np.int32))), batch)
    lengths = build("Expand", build("Cast", length, to=i32), batch) if query_lengths else None
    return _MaskInputs(bias, seqlens, build("Squeeze", total32), lengths)


def _size(build: _Builder, value: ir.Value, axis: int) -> ir.Value:
    """``value``'s size at ``axis`` as a (1,) int64: a constant if static, else read from a graph input
    with the same symbolic dim (every layer then reads the same ``Shape``), or ``value`` itself."""
    dim = dims(value)[axis] if dims(value) is not None else None
    if isinstance(dim, int):
        return build.constant([dim])
    source, index = _size_source(build.graph, value, axis)
    return build("Shape", source, start=index, end=index + 1)


def _size_source(graph: ir.Graph, value: ir.Value, axis: int) -> tuple[ir.Value, int]:
    """A graph input with ``value``'s symbolic dim at ``axis`` (every layer then reads the same
    ``Shape``), else ``value`` itself."""
    dim = value.shape[axis] if value.shape is not None else None
    if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
        for graph_input in graph.inputs:
            for index, other in enumerate(graph_input.shape or ()):
                if isinstance(other, ir.SymbolicDim) and other.value == dim.value:
                    return graph_input, index
    return value, axis


def _split_from(x: ir.Value) -> ir.Value | None:
    """The 3-D (batch, seq, heads * size) value ``x`` (batch, heads, seq, size) was split from
    (``Transpose(Reshape(p, (batch, seq, heads, size)), [0, 2, 1, 3])``), if it was."""
    transpose = _producer(x, "Transpose")
    reshape = _producer(transpose.inputs[0], "Reshape") if transpose is not None else None
    if reshape is None or list(transpose.attributes["perm"].as_ints()) != [0, 2, 1, 3]:
        return None
    source, split = reshape.inputs[0], dims(reshape.outputs[0])
    return source if len(dims(source) or ()) == 3 and split is not None and len(split) == 4 else None


def _heads_last(build: _Builder, x: ir.Value) -> ir.Value:
    """(batch, heads, seq, size) -> (batch, seq, heads * size): the value ``x`` was split from, or
    ``x`` moved."""
    source = _split_from(x)
    if source is not None:
        return source
    return build("Reshape", build("Transpose", x, perm=[0, 2, 1, 3]), build.constant([0, 0, -1]))


def _merged(query: ir.Value) -> ir.Value:
    """The attention's 3-D query without a split and merge of its heads around it (the lean
    pass removes such round trips only after the rewrites)."""
    reshape = _producer(query, "Reshape")
    transpose = _producer(reshape.inputs[0], "Transpose") if reshape is not None else None
    if (
        transpose is None
        or _ints(reshape.inputs[1]) != [0, 0, -1]
        or list(transpose.attributes["perm"].as_ints()) != [0, 2, 1, 3]
    ):
        return query
    source = _split_from(transpose.inputs[0])
    return query if source is None or dims(source) != dims(query) else source


def _rewrite(graph: ir.Graph, layer: _Layer, shared: dict, mask: ir.Value, query_lengths: bool) -> None:
    replaced = [layer.node, layer.key.concat, layer.value.concat]
    if layer.output is not layer.node.outputs[0]:
        replaced.append(layer.output.producer())
    build = _Builder(graph, layer.node, provenance(replaced))
    if ("mask", id(mask)) not in shared:
        shared["mask", id(mask)] = _mask_inputs(build, mask, layer.query, query_lengths)
    inputs = shared["mask", id(mask)]
    extra = {}
    if "scale" in layer.node.attributes:
        extra["scale"] = layer.node.attributes["scale"].as_float()
    if ("sink", layer.heads) not in shared:  # every head's sink: a logit no key reaches, which a row with no key gets
        shared["sink", layer.heads] = build.constant(np.full(layer.heads, _SINK, np.float32))
    operands = [
        _merged(layer.query), _heads_last(build, layer.key.new), _heads_last(build, layer.value.new),
        layer.key.past, layer.value.past, inputs.seqlens, inputs.total, None, None, None, inputs.bias,
        shared["sink", layer.heads],
    ]  # fmt: skip
    if inputs.query_lengths is not None:
        operands += [None, None, None, None, inputs.query_lengths]
    out, present_key, present_value = build(
        "GroupQueryAttention", *operands,
        domain=CONTRIB_DOMAIN, outputs=3, num_heads=layer.heads, kv_num_heads=layer.kv_heads, **extra,
    )  # fmt: skip
    out.type, out.shape = layer.output.type, layer.output.shape
    for cache, present in ((layer.key, present_key), (layer.value, present_value)):
        present.type, present.shape = cache.present.type, cache.present.shape
        ir.convenience.replace_all_uses_with(cache.present, present, replace_graph_outputs=True)
    ir.convenience.replace_all_uses_with(layer.output, out, replace_graph_outputs=True)


class GroupQueryAttentionOnCache(ir.passes.InPlacePass):
    """Every attention of a decoder on its KV cache whose mask is "causal and not padding" of a
    2-D attention mask -> GroupQueryAttention that past and present can share one buffer with
    (see the module docstring); with ``query_lengths``, its 17th input ``query_seqlens`` too."""

    def __init__(self, query_lengths: bool = False) -> None:
        super().__init__()
        self.query_lengths = query_lengths

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        shared: dict = {}  # what the layers share: the mask's inputs, the sinks
        verdicts: dict[int, ir.Value | None] = {}
        modified = False
        for layer in list(_layers(graph)):
            if id(layer.bias) not in verdicts:
                past = dims(layer.key.past)
                verdicts[id(layer.bias)] = is_causal_padding_mask(layer.bias, past[0], dims(layer.query)[1], past[2])
            mask = verdicts[id(layer.bias)]
            if mask is None:
                continue
            _rewrite(graph, layer, shared, mask, self.query_lengths)
            modified = True
        if modified:  # the replaced nodes, so that the lean pass after the rewrites sees the new graph alone
            ir.passes.common.RemoveUnusedNodesPass()(model)
            if not self.query_lengths:
                model.metadata_props[ONE_ROW_KEY] = (
                    "GroupQueryAttention without query_seqlens (what ONNX Runtime 1.30 loads) refuses a batch of "
                    "prompts after a cache; export at target onnxruntime==1.32 or newer for it"
                )
        return ir.passes.PassResult(model, modified)
