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
from opreg_ort_contrib.quantize import ACCURACY_LEVEL, check_accuracy_level, gemm_of, register_tensor, replace_node
from opreg_ort_contrib.quantize import weight_of as linear_weight


def stored_blocks(weight: ir.Value, stored_nk: bool) -> Any:
    """The :class:`opreg.weights.StoredBlocks` a linear layer's ``weight`` (stored ``(N, K)`` or,
    transposed, ``(K, N)``) is the dequantization of, or ``None``: a weight's own, or the blocks
    of the weights a packed projection concatenates along N (query, key and value), concatenated."""
    parts = _stored_parts(weight.const_value, stored_nk)
    if not parts or any(part is None for part in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    return _concatenated(parts, weight.name)


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


def _concatenated(parts: list[Any], name: str | None) -> Any:
    """The blocks of weights concatenated along N, refused where they are not alike."""
    from opreg import weights

    first = parts[0]
    alike = all(
        (p.bits, p.block_size, p.zero_points is None) == (first.bits, first.block_size, first.zero_points is None)
        and (p.order is None) == (first.order is None) and (p.order is None or bool((p.order == first.order).all()))
        for p in parts
    )  # fmt: skip
    if not alike:
        sources = "; ".join(p.source for p in parts)
        raise ExportError(
            f"{name} packs layers stored in unlike blocks ({sources}: bits, block sizes, zero points or act-order "
            "differ) into one product (ONNX Runtime's packed query, key and value): give a checkpoint whose packed layers are quantized alike"
        )
    zero_points = None if first.zero_points is None else weights.concat([p.zero_points for p in parts], 0)
    return weights.StoredBlocks(
        first.bits, first.block_size, weights.concat([p.packed for p in parts], 0),
        weights.concat([p.scales for p in parts], 0), zero_points, first.order, " + ".join(p.source for p in parts),
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
            blocks = None if found is None else stored_blocks(*found)
            if blocks is None:
                continue
            n, count, _ = (int(d) for d in blocks.packed.shape)
            if id(blocks) not in made:
                made[id(blocks)] = self._inputs(graph, found[0].name or "weight", blocks)
            x = node.inputs[0]
            if blocks.order is not None:
                x = _reordered(graph, node, x, blocks.order, gathers)
            attributes = {"K": count * blocks.block_size, "N": n, "bits": blocks.bits, "block_size": blocks.block_size}
            if self.accuracy_level is not None:
                attributes["accuracy_level"] = self.accuracy_level
            replace_node(graph, node, x, made[id(blocks)], attributes, bias)
        if not made:
            return ir.passes.PassResult(model, False)
        onnx_ir.passes.common.RemoveUnusedNodesPass()(model)
        _refuse_left(graph)
        return ir.passes.PassResult(model, True)

    def _inputs(self, graph: ir.Graph, name: str, blocks: Any) -> list[ir.Value | None]:
        base = name.removesuffix(".weight") if name.endswith(".weight") else name
        tensors = [blocks.packed.named(f"{base}.weight_Q{blocks.bits}"), blocks.scales.named(f"{base}.weight_scales")]
        if blocks.zero_points is not None:
            tensors.append(blocks.zero_points.named(f"{base}.weight_zero_points"))
        return [register_tensor(graph, tensor) for tensor in tensors]


def _reordered(graph: ir.Graph, node: ir.Node, x: ir.Value, order: Any, made: dict) -> ir.Value:
    """``x`` with its last dim in ``order`` (a Gather before ``node``; one per input and order)."""
    indices = np.ascontiguousarray(order.numpy(), dtype=np.int64)
    key = (id(x), indices.tobytes())
    if key not in made:
        name = f"{x.name or 'input'}_act_order"
        value = ir.Value(name=name, const_value=ir.tensor(indices, name=name))
        value.type, value.shape = ir.TensorType(ir.DataType.INT64), ir.Shape(list(indices.shape))
        graph.register_initializer(value)
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
            blocks = parts[0]
            readers = ", ".join(sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n, _ in value.uses()}))
            raise ExportError(
                f"{value.name} is stored quantized ({blocks.source}) but read by {readers}, not as a plain linear "
                "layer's weight, which MatMulNBits computes: writing it would write its dequantization; keep the "
                "layer out of the checkpoint's quantization (its ignore list)"
            )
