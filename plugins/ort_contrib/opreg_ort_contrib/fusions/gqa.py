"""What GroupQueryAttention can take over once a decoder's attention is one
(:mod:`opreg_ort_contrib.kv_cache`): the rotary embedding of the query and key, and the
query, key and value projections as one matrix multiplication, as ONNX Runtime GenAI's
builder writes its graphs.

- :class:`RotaryInsideAttention`: ``RotaryEmbedding-23`` of the query and of the key, both
  with the cos/sin of one set of positions, become GroupQueryAttention's ``do_rotary`` with
  tables of every position the model can see (``cos_cache``, ``sin_cache``) and the
  positions themselves (``position_ids``); an interleaved rotary (pairs, not halves) as
  ``rotary_interleaved``, with the same tables. The tables are computed by running the model's
  own nodes for positions ``0 .. L-1`` (:mod:`opreg_ort_contrib.probe`; checked against
  random positions), where ``L`` is the longest total length the export allows: the bounds
  of its past and query dims (``torch.export.Dim(..., max=N)``, in the model's
  ``opreg.dim_bounds``). Without bounds the rotary stays where it is. With
  ``query_seqlens`` (which the cache rewrite gives at a target naming ONNX Runtime 1.32 or
  newer) the kernel rotates each token by its own position, left padding included. Without it
  (the default, what 1.30 loads) the rotary stays outside too: the kernel then rotates a
  prompt's tokens by 0, 1, 2, ... whatever ``position_ids`` say, which leaves the logits
  right (both sides shift alike) but writes a left-padded row's cache at the wrong positions,
  so the next step's logits are wrong.
- :class:`PackedQKV`: the three projections of one input feeding GroupQueryAttention's
  query, key and value (``MatMul`` or ``FusedMatMul``, with or without biases) become one,
  on the weights concatenated, and GroupQueryAttention takes the packed result as its query.
  The new weight is described in the model's ``opreg.folded_weights``.

Measured by ``bench/llm.py`` (ONNX Runtime 1.32, 1 thread): one int4 MatMulNBits for q, k
and v instead of three is 1.3x faster in a decode step, and the two together are what
brings the decoder to the builder's speed at int4; each is kept only as its ablation shows.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from opreg_ort_contrib import CONTRIB_DOMAIN
from opreg_ort_contrib.probe import Slice, dim_name, dims, provenance

DIM_BOUNDS_KEY = "opreg.dim_bounds"
FOLDED_WEIGHTS_KEY = "opreg.folded_weights"
MAX_TABLE = 1 << 20
"""Positions a rotary table holds at most (a bound beyond it keeps the rotary outside)."""
_INTEGERS = (ir.DataType.INT64, ir.DataType.INT32)


def _attention_nodes(graph: ir.Graph):
    return [n for n in graph if n.op_type == "GroupQueryAttention" and n.domain == CONTRIB_DOMAIN]


def _replace_node(graph: ir.Graph, node: ir.Node, inputs: list, attributes: dict) -> None:
    """``node`` made again with ``inputs`` and ``attributes`` (its outputs' users follow)."""
    while inputs and inputs[-1] is None:
        inputs.pop()
    new = ir.node(
        node.op_type, inputs, attributes, domain=node.domain, num_outputs=len(node.outputs),
        metadata_props=dict(node.metadata_props),
    )  # fmt: skip
    graph.insert_before(node, new)
    for old, made in zip(node.outputs, new.outputs, strict=True):
        made.type, made.shape = old.type, old.shape
        ir.convenience.replace_all_uses_with(old, made, replace_graph_outputs=True)
    graph.remove(node, safe=True)


def _fresh(graph: ir.Graph, name: str) -> str:
    taken, index, base = graph.initializers, 1, name
    while name in taken:
        name, index = f"{base}_{index}", index + 1
    return name


def _initializer(graph: ir.Graph, name: str, array: np.ndarray | ir.TensorProtocol) -> ir.Value:
    """A new initializer of ``array`` (a numpy array, or a tensor such as a lazy weight)."""
    name = _fresh(graph, name)
    tensor = ir.tensor(array, name=name) if isinstance(array, np.ndarray) else array
    value = ir.Value(name=name, const_value=tensor)
    value.type, value.shape = ir.TensorType(tensor.dtype), ir.Shape(list(tensor.shape))
    graph.register_initializer(value)
    return value


def _packed(graph: ir.Graph, name: str, weights: list[ir.Value], axis: int):
    """The initializers ``weights`` concatenated along ``axis``, computed as the model is written
    (:func:`opreg.weights.concat`), named ``name`` (made unique)."""
    from opreg import weights as lazy_weights

    parts = [lazy_weights.lazy(w.const_value, w.name) for w in weights]
    return lazy_weights.concat(parts, axis, name=_fresh(graph, name))


# -- rotary inside ----------------------------------------------------------------------------------


def _rotary(value: ir.Value | None, heads: int) -> ir.Node | None:
    """The ``RotaryEmbedding-23`` of a 3-D (batch, seq, heads * size) value that made ``value``
    (of the halves or, ``interleaved``, of pairs: GroupQueryAttention's ``rotary_interleaved``)."""
    node = None if value is None else value.producer()
    if node is None or node.op_type != "RotaryEmbedding" or node.domain != "" or len(node.inputs) != 3:
        return None
    attributes = {a.name: a.value for a in node.attributes.values()}
    if attributes.get("num_heads") != heads or attributes.get("rotary_embedding_dim", 0):
        return None
    return node if dims(node.inputs[0]) is None or len(dims(node.inputs[0])) == 3 else None


def _interleaved(rotary: ir.Node) -> int:
    found = rotary.attributes.get("interleaved")
    return 0 if found is None else found.as_int()


def _positions(angle: ir.Value, batch, query) -> ir.Value | None:
    """The (batch, query) integer value the rotary ``angle`` (cos or sin) is computed from: the
    nearest one among the nodes that make it."""
    wanted = (dim_name(batch), dim_name(query))
    seen, frontier = set(), [angle]
    while frontier:
        value = frontier.pop(0)
        node = value.producer()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for source in node.inputs:
            if source is None:
                continue
            shape = dims(source)
            if (
                source.dtype in _INTEGERS
                and shape is not None
                and len(shape) == 2
                and tuple(map(dim_name, shape)) == wanted
            ):
                return source
            frontier.append(source)
    return None


def _table(
    angle: ir.Value, positions: ir.Value, length: int, sizes: dict[str, int], names, memo: dict[tuple, Any]
) -> np.ndarray | None:
    """``angle`` (cos or sin) at positions ``0 .. length-1`` as a (length, half) table, if it
    depends on the positions alone (checked at random ones); else ``None``. ``memo`` holds the
    tables made, by what their slice computes: each layer's copy of the angles is probed once
    (48 probes of a 65536-row table took 1.5 s of CPU on a 24-layer model)."""
    cut = Slice.of(angle, cut=positions)
    if cut is None:
        return None
    key = (cut.key(), length, tuple(sorted(sizes.items())), tuple(names))
    if key not in memo:
        memo[key] = _probed(cut, length, sizes, names)
    return memo[key]


def _probed(cut: Slice, length: int, sizes: dict[str, int], names) -> np.ndarray | None:
    prober = cut.prober()
    if prober is None:
        return None
    batch, query = names
    full = prober(np.arange(length, dtype=np.int64)[None], {**sizes, batch: 1, query: length})
    if full is None or full.ndim != 3 or full.shape[:2] != (1, length) or full.shape[2] % 8:
        return None
    table = np.ascontiguousarray(full[0], dtype=np.float32)
    rng = np.random.default_rng(0)
    some = rng.integers(0, length, (2, 5))
    got = prober(some, {**sizes, batch: 2, query: 5})
    if got is None or got.shape != (2, 5, table.shape[1]) or not np.allclose(got, table[some], rtol=1e-6, atol=1e-6):
        return None
    return table


def _bound(model: ir.Model, *dimensions) -> int | None:
    """The sum of the dims' upper bounds (``opreg.dim_bounds``; an int dim is its own)."""
    bounds = json.loads(model.metadata_props.get(DIM_BOUNDS_KEY, "{}"))
    total = 0
    for dim in dimensions:
        name = dim_name(dim)
        if isinstance(name, int):
            total += name
        elif name in bounds:
            total += int(bounds[name][1])
        else:
            return None
    return total


class _Tables:
    """The rotary tables and positions of one run of :class:`RotaryInsideAttention`: each made
    once, whichever layer (and, before the lean pass merges them, whichever copy of the
    angles) asks."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.by_angles: dict[tuple[int, int], tuple | None] = {}
        self.made: list[tuple[np.ndarray, np.ndarray, ir.Value, ir.Value]] = []
        self.positions: dict[int, ir.Value] = {}
        self.probed: dict[tuple, Any] = {}

    def of(self, anchor: ir.Node, query: ir.Value, past: ir.Value, rotary: ir.Node):
        """``(positions, cos_cache, sin_cache)`` of ``rotary``'s cos and sin, or ``None``."""
        cos, sin = rotary.inputs[1], rotary.inputs[2]
        key = (id(cos), id(sin))
        if key not in self.by_angles:
            self.by_angles[key] = self._make(anchor, query, past, cos, sin)
        return self.by_angles[key]

    def _make(self, anchor: ir.Node, query: ir.Value, past: ir.Value, cos: ir.Value, sin: ir.Value):
        graph = self.model.graph
        shape, cached = dims(query), dims(past)
        if shape is None or len(shape) != 3:
            return None
        length = _bound(self.model, shape[1], cached[2])
        positions = _positions(cos, shape[0], shape[1])
        if length is None or length > MAX_TABLE or positions is None:
            return None
        names = (dim_name(shape[0]), dim_name(shape[1]))
        sizes = {name: 0 for name in (dim_name(cached[2]),) if isinstance(name, str)}
        found = [_table(angle, positions, length, sizes, names, self.probed) for angle in (cos, sin)]
        if any(table is None for table in found):
            return None
        if positions.dtype != ir.DataType.INT64:
            if id(positions) not in self.positions:
                cast = ir.node("Cast", [positions], {"to": ir.DataType.INT64})
                graph.insert_before(anchor, cast)
                self.positions[id(positions)] = cast.outputs[0]
            positions = self.positions[id(positions)]
        for made in self.made:
            if np.array_equal(made[0], found[0]) and np.array_equal(made[1], found[1]):
                return positions, made[2], made[3]
        cos_cache = _initializer(graph, "rotary_cos_cache", found[0])
        sin_cache = _initializer(graph, "rotary_sin_cache", found[1])
        self.made.append((found[0], found[1], cos_cache, sin_cache))
        return positions, cos_cache, sin_cache


class RotaryInsideAttention(ir.passes.InPlacePass):
    """RotaryEmbedding-23 of GroupQueryAttention's query and key -> its ``do_rotary`` with cos/sin
    tables and the positions (see the module docstring)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        tables = _Tables(model)
        modified = False
        for node in _attention_nodes(graph):
            inputs = list(node.inputs) + [None] * (17 - len(node.inputs))
            attributes = {a.name: a.value for a in node.attributes.values()}
            if attributes.get("do_rotary", 0) or inputs[1] is None or inputs[3] is None or inputs[16] is None:
                continue  # already rotating, packed, without a cache, or without query_seqlens
            heads, kv_heads = attributes["num_heads"], attributes["kv_num_heads"]
            query, key = _rotary(inputs[0], heads), _rotary(inputs[1], kv_heads)
            if query is None or key is None or _interleaved(query) != _interleaved(key):
                continue
            size = dims(inputs[3])[3]  # the past keys' head size
            if not isinstance(size, int) or size % 16:  # the kernel rotates heads of a multiple of 16
                continue
            found = [tables.of(node, inputs[0], inputs[3], rotary) for rotary in (query, key)]
            if found[0] is None or found[0] != found[1]:
                continue  # not rotated alike
            positions, cos_cache, sin_cache = found[0]
            inputs[0], inputs[1] = query.inputs[0], key.inputs[0]
            inputs[7], inputs[8], inputs[9] = cos_cache, sin_cache, positions
            rotary = {"do_rotary": 1} | ({"rotary_interleaved": 1} if _interleaved(query) else {})
            _replace_node(graph, node, inputs, {**attributes, **rotary})
            modified = True
        if modified:
            onnx_ir.passes.common.RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified)


# -- packed q, k, v -----------------------------------------------------------------------------------


def _projection(value: ir.Value | None):
    """``(kind, node, x, weight, bias)`` if ``value`` is ``MatMul(x, W)`` or ``FusedMatMul(x, W,
    transB=1)`` of a float32 2-D initializer, optionally plus a 1-D constant bias."""
    node = None if value is None else value.producer()
    bias = None
    if node is not None and node.op_type == "Add" and node.domain == "" and len(node.inputs) == 2:
        bias = node.inputs[1]
        if bias is None or bias.const_value is None or len(dims(bias) or ()) != 1:
            return None
        node = node.inputs[0].producer()
    if node is None or len(node.inputs) != 2:
        return None
    x, weight = node.inputs
    if weight is None or not weight.is_initializer() or weight.const_value is None or len(dims(weight) or ()) != 2:
        return None
    if node.op_type == "MatMul" and node.domain == "":
        kind = "MatMul"
    elif node.op_type == "FusedMatMul" and node.domain == CONTRIB_DOMAIN:
        attributes = {a.name: a.value for a in node.attributes.values()}
        if attributes not in ({"transB": 1, "alpha": 1.0}, {"transB": 1}):
            return None
        kind = "FusedMatMul"
    else:
        return None
    return kind, node, x, weight, bias


def _packed_projection(graph: ir.Graph, before: ir.Node, found: list, folded: dict) -> tuple[ir.Value, list[int]]:
    """One projection on the concatenated weights (and biases) of ``found`` (three :func:`_projection`
    results of one input), added before ``before``; its result, and each part's width."""
    kind, first, x = found[0][0], found[0][1], found[0][2]
    axis = 0 if kind == "FusedMatMul" else 1  # the output dim of (N, K) and of (K, N)
    weights = [f[3] for f in found]
    prefix = os.path.commonprefix([w.name or "" for w in weights])  # noqa: RUF071 (names, not paths)
    packed = _packed(graph, f"{prefix}qkv_packed", weights, axis)  # read as the model is written
    weight = _initializer(graph, packed.name, packed)
    folded[weight.name] = f"concat([{', '.join(w.name or '' for w in weights)}], axis={axis})"
    attributes = {a.name: a.value for a in first.attributes.values()}
    metadata = provenance([f[1] for f in found])
    projection = ir.node(first.op_type, [x, weight], attributes, domain=first.domain, metadata_props=metadata)
    graph.insert_before(before, projection)
    result = projection.outputs[0]
    if found[0][4] is not None:
        bias = _packed(graph, f"{prefix}qkv_packed_bias", [f[4] for f in found], 0)
        add = ir.node("Add", [result, _initializer(graph, bias.name, bias)], metadata_props=metadata)
        graph.insert_before(before, add)
        result = add.outputs[0]
    return result, [int(w.shape[axis]) for w in weights]


def _projected(node: ir.Node) -> tuple[list[ir.Value | None], bool]:
    """What GroupQueryAttention ``node``'s query, key and value are projections of: the values
    themselves, or for the query and key the inputs of their RotaryEmbedding (the rotary outside the
    kernel: ``True``)."""
    inputs = list(node.inputs) + [None] * 3
    attributes = {a.name: a.value for a in node.attributes.values()}
    rotaries = [_rotary(inputs[0], attributes["num_heads"]), _rotary(inputs[1], attributes["kv_num_heads"])]
    if None in rotaries:
        return inputs[:3], False
    return [rotaries[0].inputs[0], rotaries[1].inputs[0], inputs[2]], True


class PackedQKV(ir.passes.InPlacePass):
    """GroupQueryAttention's query, key and value projected from one input by three matrix
    multiplications -> one on the concatenated weights: taken as a packed query, or split into the
    three again where the query and key are rotated before the kernel."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        folded = json.loads(model.metadata_props.get(FOLDED_WEIGHTS_KEY, "{}"))
        modified = False
        for node in _attention_nodes(graph):
            values, rotated = _projected(node)
            found = [_projection(v) for v in values]
            if any(f is None for f in found):
                continue
            kinds, xs = {f[0] for f in found}, {id(f[2]) for f in found}
            with_bias = {f[4] is not None for f in found}
            if len(kinds) != 1 or len(xs) != 1 or len(with_bias) != 1:
                continue
            if any(len(list(v.uses())) != 1 for v in values):
                continue  # a projection something else reads too
            result, widths = _packed_projection(graph, _first_user(graph, values), found, folded)
            result.type = values[0].type
            query = dims(values[0])
            if query is not None:
                result.shape = ir.Shape([*query[:2], sum(widths)])
            if rotated:
                _split(graph, result, values, widths)
            else:
                inputs = list(node.inputs)
                _replace_node(
                    graph, node, [result, None, None, *inputs[3:]], {a.name: a.value for a in node.attributes.values()}
                )
            modified = True
        if modified:
            model.metadata_props[FOLDED_WEIGHTS_KEY] = json.dumps(folded, sort_keys=True)
            onnx_ir.passes.common.RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified)


def _first_user(graph: ir.Graph, values: list[ir.Value]) -> ir.Node:
    """The earliest node in ``graph`` that reads one of ``values`` (the rotary before the kernel, or
    the kernel): where what replaces them must be made."""
    users = {id(use.node) for value in values for use in value.uses()}
    return next(node for node in graph if id(node) in users)


def _split(graph: ir.Graph, packed: ir.Value, values: list[ir.Value], widths: list[int]) -> None:
    """``packed`` split on its last axis into the parts (of ``widths``) ``values`` were, which their
    users then read."""
    before = _first_user(graph, values)
    sizes = ir.node("Constant", [], {"value": ir.tensor(np.array(widths, dtype=np.int64))})
    graph.insert_before(before, sizes)
    split = ir.node("Split", [packed, sizes.outputs[0]], {"axis": -1}, num_outputs=3,
                    metadata_props=dict(packed.producer().metadata_props))  # fmt: skip
    graph.insert_before(before, split)
    for old, part in zip(values, split.outputs, strict=True):
        part.type, part.shape = old.type, old.shape
        ir.convenience.replace_all_uses_with(old, part)
