"""A quantized checkpoint's linear layers as ``com.microsoft::MatMulNBits`` on the integers it
stores: :class:`StoredBlocksToMatMulNBits`.

A model exported from a GPTQ, AWQ or compressed-tensors checkpoint (``opreg.llm``) holds each
quantized layer's weight as a float :class:`opreg.weights.LazyWeight` whose ``stored`` holds the
checkpoint's integers, scales and zero points as MatMulNBits reads them
(:class:`opreg.weights.StoredBlocks`, repacked as the model is written). This pass makes each
linear layer reading such a weight one MatMulNBits on them: no value is quantized again. Where
the blocks run along the input channels in another order (GPTQ's act-order), the layer's input
is reordered first by one ``Gather`` (shared by the layers reading the same input in the same
order). A stored weight read by anything but a linear layer is refused: writing it would write
its dequantization.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from opreg import ExportError
from opreg_ort_contrib import CONTRIB_DOMAIN
from opreg_ort_contrib.quantize import (
    ACCURACY_LEVEL,
    check_accuracy_level,
    gemm_of,
    new_initializer,
    register_tensor,
    replace_node,
)
from opreg_ort_contrib.quantize import weight_of as linear_weight


def stored_blocks(weight: ir.Value, stored_nk: bool) -> list[Any]:
    """The :class:`opreg.weights.StoredBlocks` a linear layer's ``weight`` (stored ``(N, K)`` or,
    transposed, ``(K, N)``) is the dequantization of, as one list (empty: none): a weight's own;
    the blocks of the weights a packed projection concatenates along N (query, key and value),
    concatenated where alike (one MatMulNBits), else each part's (one MatMulNBits each)."""
    parts = _stored_parts(weight.const_value, stored_nk)
    if not parts or any(part is None for part in parts):
        return []
    return [_concatenated(parts)] if _alike(parts) else parts


def _stored_parts(value: Any, stored_nk: bool) -> list[Any]:
    """The stored blocks of each ``(N, K)`` part ``value`` is made of along N (``None`` for a part
    stored float); empty where it is none of those."""
    if not stored_nk:
        concatenated = getattr(value, "parts", None)
        if concatenated is not None and concatenated[1] == 1:  # (K, N1 | N2 | ...): each part transposed
            return [part for piece in concatenated[0] for part in _stored_parts(piece, False) or [None]]
        transposed = getattr(value, "transposed", None)
        if transposed is None or tuple(transposed[1]) != (1, 0):
            return []
        value = transposed[0]
    concatenated = getattr(value, "parts", None)
    if concatenated is not None and concatenated[1] == 0:
        return [getattr(piece, "stored", None) for piece in concatenated[0]]
    return [getattr(value, "stored", None)]


def _alike(parts: list[Any]) -> bool:
    """Whether the blocks of ``parts`` can be one MatMulNBits: bits, blocks, zero points, order alike."""
    first = parts[0]
    return all(
        (p.bits, p.block_size, p.zero_points is None, p.k) == (first.bits, first.block_size, first.zero_points is None, first.k)
        and (p.order is None) == (first.order is None) and (p.order is None or bool((p.order == first.order).all()))
        for p in parts
    )  # fmt: skip


def _concatenated(parts: list[Any]) -> Any:
    """The blocks of alike weights concatenated along N."""
    from opreg import weights

    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    zero_points = None if first.zero_points is None else weights.concat([p.zero_points for p in parts], 0)
    return weights.StoredBlocks(
        first.bits, first.block_size, weights.concat([p.packed for p in parts], 0),
        weights.concat([p.scales for p in parts], 0), zero_points, first.order, " + ".join(p.source for p in parts),
        first.k,
    )  # fmt: skip


class StoredBlocksToMatMulNBits(ir.passes.InPlacePass):
    """Each linear layer whose weight a checkpoint stores quantized as one MatMulNBits on the
    stored blocks (see the module).

    Args:
        accuracy_level: MatMulNBits' ``accuracy_level`` (default 4: the input in int8, the fastest
            on CPU; ``None``: the kernel's float path).
    """

    def __init__(self, accuracy_level: int | None = ACCURACY_LEVEL) -> None:
        super().__init__()
        check_accuracy_level("StoredBlocksToMatMulNBits", accuracy_level)
        self.accuracy_level = accuracy_level

    def __repr__(self) -> str:
        return f"StoredBlocksToMatMulNBits(accuracy_level={self.accuracy_level})"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        made: dict[int, list[ir.Value | None]] = {}
        gathers: dict[tuple[int, bytes], ir.Value] = {}
        for node in list(graph):
            found = linear_weight(node)
            bias = None
            if found is None:
                gemm = gemm_of(node)
                found, bias = (gemm[:2], gemm[2]) if isinstance(gemm, tuple) else (None, None)
            parts = [] if found is None else stored_blocks(*found)
            for index, blocks in enumerate(parts):
                if id(blocks) not in made:
                    name = found[0].name or "weight"
                    made[id(blocks)] = self._inputs(graph, name if len(parts) == 1 else f"{name}_{index}", blocks)
            if len(parts) == 1:
                x = _reordered(graph, node, node.inputs[0], parts[0].order, gathers)
                replace_node(graph, node, x, made[id(parts[0])], self._attributes(parts[0]), bias)
            elif parts:
                self._split(graph, node, parts, made, gathers, bias)
        if not made:
            return ir.passes.PassResult(model, False)
        onnx_ir.passes.common.RemoveUnusedNodesPass()(model)
        _refuse_left(graph)
        return ir.passes.PassResult(model, True)

    def _attributes(self, blocks: Any) -> dict[str, int]:
        n = int(blocks.packed.shape[0])
        attributes = {"K": blocks.input_channels, "N": n, "bits": blocks.bits, "block_size": blocks.block_size}
        if self.accuracy_level is not None:
            attributes["accuracy_level"] = self.accuracy_level
        return attributes

    def _split(self, graph: ir.Graph, node: ir.Node, parts: list, made: dict, gathers: dict, bias: Any) -> None:
        """``node``, a product packing unlike stored weights along N, as one MatMulNBits per weight
        and a Concat of their outputs (and the bias added)."""
        metadata = dict(node.metadata_props)
        nodes = []
        for blocks in parts:
            x = _reordered(graph, node, node.inputs[0], blocks.order, gathers)
            nodes.append(ir.node("MatMulNBits", [x, *made[id(blocks)]], self._attributes(blocks),
                                 domain=CONTRIB_DOMAIN, metadata_props=dict(metadata)))  # fmt: skip
        nodes.append(ir.node("Concat", [n.outputs[0] for n in nodes], {"axis": -1}, metadata_props=dict(metadata)))
        if bias is not None:
            nodes.append(ir.node("Add", [nodes[-1].outputs[0], bias], metadata_props=dict(metadata)))
        ir.convenience.replace_nodes_and_values(graph, node, [node], nodes, [node.outputs[0]], [nodes[-1].outputs[0]])

    def _inputs(self, graph: ir.Graph, name: str, blocks: Any) -> list[ir.Value | None]:
        base = name.removesuffix(".weight") if name.endswith(".weight") else name
        tensors = [blocks.packed.named(f"{base}.weight_Q{blocks.bits}"), blocks.scales.named(f"{base}.weight_scales")]
        if blocks.zero_points is not None:
            tensors.append(blocks.zero_points.named(f"{base}.weight_zero_points"))
        return [register_tensor(graph, tensor) for tensor in tensors]


def _reordered(graph: ir.Graph, node: ir.Node, x: ir.Value, order: Any, made: dict) -> ir.Value:
    """``x`` with its last dim in ``order`` (a Gather before ``node``; one per input and order;
    ``x`` itself for no order)."""
    if order is None:
        return x
    indices = np.ascontiguousarray(order.numpy(), dtype=np.int64)
    key = (id(x), indices.tobytes())
    if key not in made:
        value = new_initializer(graph, f"{x.name or 'input'}_act_order", indices)
        gather = ir.node("Gather", [x, value], {"axis": -1}, metadata_props=dict(node.metadata_props))
        gather.outputs[0].type, gather.outputs[0].shape = x.type, x.shape
        graph.insert_before(node, gather)
        made[key] = gather.outputs[0]
    return made[key]


def _refuse_left(graph: ir.Graph) -> None:
    """Refuse a stored weight still read (by something other than a plain linear layer)."""
    for value in graph.initializers.values():
        if not value.uses():
            continue
        parts = [p for p in _stored_parts(value.const_value, True) + _stored_parts(value.const_value, False) if p]
        if parts:
            blocks = parts[0]  # the first of them, named
            readers = ", ".join(sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n, _ in value.uses()}))
            raise ExportError(
                f"{value.name} is stored quantized ({blocks.source}) but read by {readers}, not as a plain linear "
                "layer's weight, which MatMulNBits computes: writing it would write its dequantization; keep the "
                "layer out of the checkpoint's quantization (its ignore list)"
            )
