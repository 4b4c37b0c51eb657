"""Weights quantized in PyTorch, exported as ONNX Runtime's ``com.microsoft::MatMulNBits`` on their
integers: :class:`TorchaoWeights`, the pass the pack offers at targets with com.microsoft (its
``opreg_rewrite_rules``). A model quantized with torchao's weight-only configs (``IntxWeightOnlyConfig``
with int4 or int8 and ``PerGroup``/``PerAxis``, ``Int8WeightOnlyConfig``) exports its dequantization as
arithmetic on the integer weights; the pass finds each linear layer whose weight is so computed, reads
the integers, scales and zero points back, checks that they give exactly the weight the model
computes, and makes the layer one MatMulNBits on them (no re-rounding). The kernel and the pass that
quantizes float weights are :mod:`opreg_ort_contrib.quantize`'s.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from opreg_ort_contrib.quantize import check_accuracy_level, initializers, replace_node, transposed_b

_INTEGER_TYPES = (ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT32, ir.DataType.INT16)
_MAX_BLOCK = 256


def _block_size(group: int) -> int | None:
    """MatMulNBits' block size for groups of ``group`` values along K: the group if it is a power
    of two from 16 to 256, else the largest such that divides it (scales repeated); ``None`` if none does."""
    for size in (group, *(1 << b for b in range(8, 3, -1))):
        if 16 <= size <= _MAX_BLOCK and not size & (size - 1) and group % size == 0:
            return size
    return None


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """(rows, n) unsigned values -> bytes: 8 bits as they are, 4 bits two per byte, the first in the low nibble."""
    values = values.astype(np.uint8)
    if bits == 8:
        return values
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], -1)
    return values[..., 0::2] | (values[..., 1::2] << 4)


class _Dequantized:
    """A weight the graph computes from integers: ``(q - zero_point) * scale`` per group along K."""

    def __init__(self, q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None) -> None:
        self.q, self.scale, self.zero = q, scale, zero  # (N, K), (N, G), (N, G) or None

    def matmul_nbits(self) -> tuple[dict, dict] | None:
        """MatMulNBits' tensors and attributes, or ``None`` if it cannot hold these values."""
        n, k = self.q.shape
        groups = self.scale.shape[1]
        block = _block_size(k // groups) if k % groups == 0 else None
        if block is None:
            return None
        repeat = k // groups // block
        scale = np.repeat(self.scale, repeat, axis=1).astype(np.float32)  # (N, K blocks)
        zero = np.zeros_like(self.scale, dtype=np.int64) if self.zero is None else self.zero.astype(np.int64)
        zero = np.repeat(zero, repeat, axis=1)
        q = self.q.astype(np.int64)
        lowest, highest = min(q.min(), zero.min()), max(q.max(), zero.max())
        signed = lowest < 0
        if (signed and lowest >= -8 and highest <= 7) or (not signed and highest <= 15):
            bits = 4
        elif (signed and lowest >= -128 and highest <= 127) or (not signed and highest <= 255):
            bits = 8
        else:
            return None
        offset = 1 << (bits - 1) if signed else 0  # MatMulNBits' values are unsigned, its default zero point 2^(bits-1)
        blocks = k // block
        tensors = {"B": _pack((q + offset).reshape(n, blocks, block), bits), "scales": scale}
        zero = zero + offset
        if not np.all(zero == 1 << (bits - 1)):
            tensors["zero_points"] = _pack(zero, bits)
        return tensors, {"K": k, "N": n, "bits": bits, "block_size": block}


def _dequantized(weight_nk: np.ndarray, cut, scale_after: np.ndarray | None) -> _Dequantized | None:
    """The integers, scales and zero points among ``cut``'s constants that give ``weight_nk``
    exactly (times ``scale_after``, a per-output scale the graph applies after the product)."""
    n, k = weight_nk.shape
    arrays = [(c, c.const_value.numpy()) for c in cut.constants]
    integers = [a for c, a in arrays if c.dtype in _INTEGER_TYPES]
    floats = [a for c, a in arrays if c.dtype == ir.DataType.FLOAT]
    candidates = []
    for q in integers:
        if q.size != n * k:
            continue
        if q.shape == (n, k):
            candidates.append(q)
        if q.shape == (k, n):
            candidates.append(q.T)
    for q in candidates:
        if scale_after is not None:
            if np.array_equal(q.astype(np.float32), weight_nk):
                return _Dequantized(q, scale_after.reshape(n, 1), None)
            continue
        for found in floats:
            if found.size % n or k % (found.size // n):
                continue
            groups = found.size // n
            scale = found.reshape(n, groups)
            zeros = [z.reshape(n, groups) for z in integers if z is not q and z.size == scale.size] or [None]
            for zero in zeros:
                shift = 0 if zero is None else np.repeat(zero.astype(np.float32), k // groups, axis=1)
                expected = (q.astype(np.float32) - shift) * np.repeat(scale, k // groups, axis=1)
                if np.allclose(expected, weight_nk, rtol=1e-6, atol=0):
                    return _Dequantized(q, scale, zero)
    return None


def _scale_after(node: ir.Node, n: int) -> tuple[ir.Node, int, np.ndarray] | None:
    """``(Mul node, the product's input index, scale)`` if the product's only use is a Mul by a constant per-output scale
    (of ``n`` values along the last axis; a Reshape keeping the last axis may come between)."""
    value = node.outputs[0]
    uses = list(value.uses())
    if len(uses) == 1 and uses[0].node.op_type == "Reshape" and not value.is_graph_output():
        reshape = uses[0].node
        shape = reshape.inputs[1].const_value.numpy() if reshape.inputs[1].const_value is not None else None
        if shape is None or shape[-1] not in (n,) or reshape.inputs[0] is not value:
            return None
        value = reshape.outputs[0]
        uses = list(value.uses())
    if len(uses) != 1 or uses[0].node.op_type != "Mul" or value.is_graph_output():
        return None
    mul = uses[0].node
    scale = _constant(mul.inputs[1 - uses[0].idx])
    if scale is None or scale.size != n or (scale.ndim and scale.shape[-1] != n):
        return None
    return mul, uses[0].idx, scale.reshape(n).astype(np.float32)


def _constant(value: ir.Value | None) -> np.ndarray | None:
    """``value`` if it is computed from initializers and constants alone (run on their own), else ``None``."""
    from opreg_ort_contrib.probe import Slice

    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is not None:
        return tensor.numpy()
    cut = Slice.constant(value)
    prober = None if cut is None else cut.prober()
    return None if prober is None else prober()


class TorchaoWeights(ir.passes.InPlacePass):
    """Linear layers whose weight the graph dequantizes from integers (a model quantized in
    PyTorch with torchao's weight-only configs) -> ``com.microsoft::MatMulNBits`` on those
    integers, 4 or 8 bits as their range allows, with their scales and zero points.

    The weight must be computed from initializers alone; its value is computed (the nodes run
    in ONNX Runtime on their own), and the rewrite happens only if some integer, scale (and
    zero point) initializers among them give exactly that value: ``(q - zero) * scale`` per
    group of K (torchao's ``IntxWeightOnlyConfig``, any ``PerGroup`` or ``PerAxis``), or ``q``
    with the scale applied to the product (``Int8WeightOnlyConfig``).

    Args:
        accuracy_level: MatMulNBits' ``accuracy_level`` (``None``: the kernel's default, which
            computes in float32 like the dequantized model; ``4``: int8, faster).
    """

    def __init__(self, accuracy_level: int | None = None) -> None:
        super().__init__()
        check_accuracy_level("TorchaoWeights", accuracy_level)
        self.accuracy_level = accuracy_level

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from opreg_ort_contrib.probe import Slice

        graph = model.graph
        modified = False
        for node in list(graph):
            stored_nk = transposed_b(node)  # FusedMatMul(x, W, transB=1): W is (N, K)
            if ((node.op_type, node.domain) != ("MatMul", "") and not stored_nk) or len(node.inputs) != 2:
                continue
            x, weight = node.inputs
            if weight is None or weight.is_initializer() or x is None or x.dtype != ir.DataType.FLOAT:
                continue
            cut = Slice.constant(weight)
            prober = None if cut is None or not any(c.dtype in _INTEGER_TYPES for c in cut.constants) else cut.prober()
            value = None if prober is None else prober()
            if value is None or value.ndim != 2 or value.dtype != np.float32:
                continue
            weight_nk = np.ascontiguousarray(value if stored_nk else value.T)
            after = _scale_after(node, weight_nk.shape[0])
            found = _dequantized(weight_nk, cut, None)
            if found is None and after is not None:
                found = _dequantized(weight_nk, cut, after[2])
            else:
                after = None
            made = None if found is None else found.matmul_nbits()
            if made is None:
                continue
            tensors, attributes = made
            if self.accuracy_level is not None:
                attributes["accuracy_level"] = self.accuracy_level
            stem = (weight.name or "weight").removesuffix("_Transpose")
            named = {role: (f"{stem}_{role}", array) for role, array in tensors.items()}
            inputs = initializers(graph, named)
            replace_node(graph, node, x, inputs, attributes)
            if after is not None:  # the scale is in MatMulNBits now: the product's Mul goes
                mul, index, _ = after
                ir.convenience.replace_all_uses_with(mul.outputs[0], mul.inputs[index], replace_graph_outputs=True)
                graph.remove(mul, safe=True)
            modified = True
        if modified:
            onnx_ir.passes.common.RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified)
