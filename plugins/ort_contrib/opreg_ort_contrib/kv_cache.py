"""A decoder's attention on its KV cache as ONNX Runtime's GroupQueryAttention, past and present
able to share one buffer.

A language model exported with its cache as inputs and outputs (``past_key_values.*`` in,
``present.*`` out, as ONNX Runtime GenAI runs it) reaches this pass, at the ``onnxruntime``
target, with every layer's attention written as the sdpa impl and the lean pass leave it::

    present_k = Concat(past_k, k_new, axis=2)                      # a graph input, a graph output
    keys = Reshape(Expand(Unsqueeze(present_k, 2), ...), ...)    # transformers' repeat_kv
    y = MultiHeadAttention(q, keys, values, bias)                # bias: the model's 4-D mask
    y = Mul(y, rows_with_keys)                                   # a fully masked row gives 0

:class:`GroupQueryAttentionOnCache` makes it one node per layer::

    y, present_k, present_v = GroupQueryAttention(q, k_new, v_new, past_k, past_v,
                                                  seqlens_k, total_sequence_length, ...,
                                                  attention_bias, ..., query_seqlens)

on the unrepeated cache, which it appends to in place when past and present are bound to
one buffer (ONNX Runtime GenAI's ``past_present_share_buffer``), and which it returns
as ``past + new`` when they are not. Everything it reads comes from the 2-D attention mask
(batch, total length): ``total_sequence_length`` is the mask's length ``T``, every row's
``seqlens_k`` is ``T - 1`` (a row's keys are the mask's columns, left padding included),
the padding becomes ``attention_bias`` (0 or float32's lowest), ``query_seqlens`` is the
query length, and the rows with keys are the mask's running sum. The kernel's causal mask
does the rest. This is exact for left padding, for a batch of prompts after a cache
(``query_seqlens`` lifts the kernel's batch-1 limit there), and with a shared buffer, whose
length (the longest generation) the graph never reads; ONNX Runtime GenAI's builder
derives ``seqlens_k`` from the mask's sum instead, which a left-padded row gets wrong.

The rewrite must not change what the model computes, so the mask is not recognised by its
spelling (every architecture and transformers version writes it differently) but by its
values: the nodes that compute it from the graph's inputs are run, on their own, in ONNX
Runtime for a few batches, lengths and paddings (up to a past of 2**17, so a sliding window
shows), and only a mask that is exactly "causal and not padding" in each is replaced. A
model whose mask is something else (a sliding window, bidirectional tokens, ALiBi) keeps
its attention as it is. Measured (``bench/llm.py``, ONNX Runtime 1.32, 1 thread):
GroupQueryAttention with the bias and ``query_seqlens`` costs what it costs without
them; rotary embedding inside it (``do_rotary``, with the packed projection it allows) is
left out, at most 1% of a decode step and slower in a prompt (see the bench's kernels).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from opreg_ort_contrib import CONTRIB_DOMAIN

_LOWEST = float(np.finfo(np.float32).min)
_MAX_SLICE_NODES = 400
"""A mask computed by more nodes than this is not probed (it is not a mask)."""
_MAX_CONSTANT_ELEMENTS = 1 << 16
"""Constants the mask's nodes read are copied into the probe; a bigger one is a weight, not a mask's."""
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


def _dims(value: ir.Value | None) -> list | None:
    return None if value is None or value.shape is None else list(value.shape)


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
    if len(_dims(past) or ()) != 4 or len(_dims(new) or ()) != 4:
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
        if key is None or value is None or len(_dims(query) or ()) != 3:
            continue
        kv_heads, size = _dims(key.past)[1], _dims(key.past)[3]
        if not isinstance(kv_heads, int) or not isinstance(size, int) or heads % kv_heads or size % 8:
            continue  # GroupQueryAttention's head size is a multiple of 8
        if _dims(value.past)[1] != kv_heads or _dims(bias) is None or len(_dims(bias)) != 4:
            continue
        if query.dtype != ir.DataType.FLOAT or key.past.dtype != ir.DataType.FLOAT:
            continue  # its CPU kernel is float32's
        output = node.outputs[0]
        uses = list(output.uses())
        if len(uses) == 1 and uses[0].node.op_type == "Mul" and uses[0].node.domain == "" and uses[0].idx == 0:
            output = uses[0].node.outputs[0]  # the sdpa impl's product with the rows that have keys
        yield _Layer(node, query, key, value, bias, heads, kv_heads, output)


# -- the mask, by its values ---------------------------------------------------------------------


@dataclasses.dataclass
class _Slice:
    """The nodes computing a value from the graph's inputs: one 2-D mask input, read as values,
    and other inputs read only through ``Shape``."""

    nodes: list[ir.Node]
    mask: ir.Value
    shapes: list[ir.Node]
    constants: list[ir.Value]


def _slice(value: ir.Value) -> _Slice | None:
    nodes: dict[int, ir.Node] = {}
    constants: dict[int, ir.Value] = {}
    masks: set[ir.Value] = set()
    shapes: list[ir.Node] = []
    stack = [value]
    while stack:
        current = stack.pop()
        producer = current.producer()
        if producer is None:
            if current.is_initializer() or current.const_value is not None:
                tensor = current.const_value
                if tensor is None or tensor.size > _MAX_CONSTANT_ELEMENTS:
                    return None
                constants[id(current)] = current
                continue
            if not current.is_graph_input():
                return None
            masks.add(current)
            continue
        if id(producer) in nodes:
            continue
        if producer.domain not in ("", "ai.onnx") or any(
            a.type == ir.AttributeType.GRAPH for a in producer.attributes.values()
        ):
            return None
        if producer.op_type == "Shape" and producer.inputs[0] is not None and producer.inputs[0].is_graph_input():
            shapes.append(producer)
            nodes[id(producer)] = producer
            continue
        nodes[id(producer)] = producer
        if len(nodes) > _MAX_SLICE_NODES:
            return None
        stack.extend(v for v in producer.inputs if v is not None)
    if len(masks) != 1:
        return None
    (mask,) = masks
    if len(_dims(mask) or ()) != 2 or mask.dtype not in (ir.DataType.INT64, ir.DataType.INT32, ir.DataType.BOOL):
        return None
    order = {id(node): index for index, node in enumerate(value.graph or [])}
    ordered = sorted(nodes.values(), key=lambda n: order.get(id(n), -1))
    return _Slice([n for n in ordered if n not in shapes], mask, shapes, list(constants.values()))


def _name(dim) -> int | str | None:
    """A dim as an int or its symbol's name; ``None`` for an unnamed one."""
    return dim if isinstance(dim, int) else getattr(dim, "value", None)


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
        names = [_name(d) for d in dims]
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


def _probe_model(cut: _Slice, output: ir.Value, opsets: dict[str, int]):
    import onnx

    names = {}

    def name(value: ir.Value) -> str:
        if id(value) not in names:
            names[id(value)] = f"v{len(names)}"
        return names[id(value)]

    graph_inputs = [onnx.helper.make_tensor_value_info(name(cut.mask), int(cut.mask.dtype), [None, None])]
    for shape in cut.shapes:
        graph_inputs.append(onnx.helper.make_tensor_value_info(name(shape.outputs[0]), onnx.TensorProto.INT64, [None]))
    initializers = []
    for constant in cut.constants:
        proto = ir.serde.serialize_tensor(constant.const_value)
        proto.name = name(constant)
        initializers.append(proto)
    nodes = []
    for node in cut.nodes:
        proto = ir.serde.serialize_node(node)
        del proto.input[:]
        proto.input.extend(name(v) if v is not None else "" for v in node.inputs)
        del proto.output[:]
        proto.output.extend(name(v) for v in node.outputs)
        del proto.metadata_props[:]
        nodes.append(proto)
    out = onnx.helper.make_tensor_value_info(name(output), int(output.dtype), None)
    graph = onnx.helper.make_graph(nodes, "mask_probe", graph_inputs, [out], initializer=initializers)
    imports = [onnx.helper.make_opsetid(d, v) for d, v in opsets.items() if d in ("", "ai.onnx")]
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=10)


def _shape_of(node: ir.Node, values: dict[str, int]) -> np.ndarray | None:
    """What ``Shape(graph input)`` gives in a probe where the symbolic dims take ``values``."""
    dims = []
    for dim in _dims(node.inputs[0]) or ():
        if isinstance(dim, int):
            dims.append(dim)
        elif _name(dim) in values:
            dims.append(values[_name(dim)])
        else:
            return None  # a dim the probe does not know how to size
    start = node.attributes["start"].as_int() if "start" in node.attributes else 0
    end = node.attributes["end"].as_int() if "end" in node.attributes else len(dims)
    return np.array(dims[start:end], dtype=np.int64)


def is_causal_padding_mask(bias: ir.Value, batch, query, past) -> ir.Value | None:
    """The 2-D mask input from which ``bias`` (bool: True sees; float: 0 sees, float32's lowest
    or -inf does not) is computed as "causal and not padding", for the ``batch``, ``query`` and
    ``past`` dims (ints or symbolic dims), checked by running its nodes (see the module
    docstring); ``None`` if it is not that, or cannot be checked."""
    import onnxruntime

    cut = _slice(bias)
    if cut is None or bias.graph is None:
        return None
    sizes = _Sizes.of(batch, query, past, _dims(cut.mask)[1])
    if sizes is None or _name(_dims(cut.mask)[0]) != sizes.batch:
        return None
    roles = ("batch", "query", "past", "total")
    static = {role: getattr(sizes, role) for role in roles if isinstance(getattr(sizes, role), int)}
    try:
        model = _probe_model(cut, bias, dict(bias.graph.opset_imports))
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # not something ONNX Runtime runs on its own: leave the attention as it is
        return None
    names = [i.name for i in session.get_inputs()]
    probed = 0
    for rows, length, cached, mask in _probe_cases(static):
        try:
            values = sizes.values(rows, length, cached)
        except ValueError:
            continue
        feeds = {names[0]: mask.astype(cut.mask.dtype.numpy())}
        for name, shape in zip(names[1:], cut.shapes, strict=True):
            found = _shape_of(shape, values)
            if found is None:
                return None
            feeds[name] = found
        try:
            (got,) = session.run(None, feeds)
            expected = _expected(length, cached, mask)
            got = np.broadcast_to(got, expected.shape)
        except Exception:  # fails to run at these sizes, or gives another shape: not the mask
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
    return cut.mask if probed else None


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


def _provenance(nodes: Sequence[ir.Node]) -> dict[str, str]:
    """The nodes' metadata_props merged: each key's distinct values joined with ``+``."""
    merged: dict[str, list[str]] = {}
    for node in nodes:
        for key, value in node.metadata_props.items():
            for part in value.split("+"):
                if part and part not in merged.setdefault(key, []):
                    merged[key].append(part)
    return {key: "+".join(values) for key, values in merged.items()}


@dataclasses.dataclass
class _MaskInputs:
    """What every layer's GroupQueryAttention reads, computed once from the mask."""

    bias: ir.Value
    keep: ir.Value
    seqlens: ir.Value
    total: ir.Value
    query_lengths: ir.Value


def _mask_inputs(build: _Builder, mask: ir.Value, query: ir.Value) -> _MaskInputs:
    i64 = ir.DataType.INT64
    source, axis = _size_source(build.graph, query, 1)
    length = build("Shape", source, start=axis, end=axis + 1)  # the query length, (1,)
    batch = build("Shape", mask, start=0, end=1)
    total = build("Shape", mask, start=1, end=2)
    counts = mask if mask.dtype == i64 else build("Cast", mask, to=i64)
    seen = build("Cast", mask, to=ir.DataType.BOOL) if mask.dtype != ir.DataType.BOOL else mask
    padding = build("Where", build("Unsqueeze", seen, build.constant([1, 2])), build.constant(np.float32(0.0)),
                    build.constant(np.float32(_LOWEST)))  # fmt: skip
    bias = build("Expand", padding, build("Concat", batch, build.constant([1]), length, total, axis=0))
    # a query row sees a key if the mask has a 1 at or before its own column
    running = build("Slice", build("CumSum", counts, build.constant(np.int64(1))), build("Neg", length),
                    build.constant([np.iinfo(np.int64).max]), build.constant([1]))  # fmt: skip
    keep = build("Unsqueeze", build("Cast", build("Greater", running, build.constant(np.int64(0))), to=ir.DataType.FLOAT),
                 build.constant([-1]))  # fmt: skip
    i32 = ir.DataType.INT32
    total32 = build("Cast", total, to=i32)
    seqlens = build("Expand", build("Sub", total32, build.constant(np.array([1], np.int32))), batch)
    query_lengths = build("Expand", build("Cast", length, to=i32), batch)
    return _MaskInputs(bias, keep, seqlens, build("Squeeze", total32), query_lengths)


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


def _heads_last(build: _Builder, x: ir.Value) -> ir.Value:
    """(batch, heads, seq, size) -> (batch, seq, heads * size): the 3-D value ``x`` was split
    from (``Transpose(Reshape(p, (batch, seq, heads, size)), [0, 2, 1, 3])``), or moved."""
    transpose = _producer(x, "Transpose")
    reshape = _producer(transpose.inputs[0], "Reshape") if transpose is not None else None
    if reshape is not None and list(transpose.attributes["perm"].as_ints()) == [0, 2, 1, 3]:
        source, split = reshape.inputs[0], _dims(reshape.outputs[0])
        if len(_dims(source) or ()) == 3 and split is not None and len(split) == 4:
            return source
    return build("Reshape", build("Transpose", x, perm=[0, 2, 1, 3]), build.constant([0, 0, -1]))


def _rewrite(graph: ir.Graph, layer: _Layer, shared: dict[int, _MaskInputs], mask: ir.Value) -> None:
    replaced = [layer.node, layer.key.concat, layer.value.concat]
    if layer.output is not layer.node.outputs[0]:
        replaced.append(layer.output.producer())
    build = _Builder(graph, layer.node, _provenance(replaced))
    if id(mask) not in shared:
        shared[id(mask)] = _mask_inputs(build, mask, layer.query)
    inputs = shared[id(mask)]
    extra = {}
    if "scale" in layer.node.attributes:
        extra["scale"] = layer.node.attributes["scale"].as_float()
    out, present_key, present_value = build(
        "GroupQueryAttention", layer.query, _heads_last(build, layer.key.new), _heads_last(build, layer.value.new),
        layer.key.past, layer.value.past, inputs.seqlens, inputs.total, None, None, None, inputs.bias,
        None, None, None, None, None, inputs.query_lengths,
        domain=CONTRIB_DOMAIN, outputs=3, num_heads=layer.heads, kv_num_heads=layer.kv_heads, **extra,
    )  # fmt: skip
    out.type, out.shape = layer.query.type, layer.output.shape
    result = build("Mul", out, inputs.keep)
    result.type, result.shape = layer.output.type, layer.output.shape
    for cache, present in ((layer.key, present_key), (layer.value, present_value)):
        present.type, present.shape = cache.present.type, cache.present.shape
        ir.convenience.replace_all_uses_with(cache.present, present, replace_graph_outputs=True)
    ir.convenience.replace_all_uses_with(layer.output, result, replace_graph_outputs=True)


class GroupQueryAttentionOnCache(ir.passes.InPlacePass):
    """Every attention of a decoder on its KV cache whose mask is "causal and not padding" of a
    2-D attention mask -> GroupQueryAttention that past and present can share one buffer with
    (see the module docstring)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        shared: dict[int, _MaskInputs] = {}
        verdicts: dict[int, ir.Value | None] = {}
        modified = False
        for layer in list(_layers(graph)):
            if id(layer.bias) not in verdicts:
                past = _dims(layer.key.past)
                verdicts[id(layer.bias)] = is_causal_padding_mask(layer.bias, past[0], _dims(layer.query)[1], past[2])
            mask = verdicts[id(layer.bias)]
            if mask is None:
                continue
            _rewrite(graph, layer, shared, mask)
            modified = True
        if modified:  # the replaced nodes, so that the lean pass after the rewrites sees the new graph alone
            ir.passes.common.RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified)
