"""Weight-only quantization of linear layers to ONNX Runtime's ``com.microsoft::MatMulNBits``.

MatMulNBits multiplies a float input by a weight stored block-wise in 4 or 8 bits along its
input dim ``K``: each block of ``block_size`` values has a float scale and (asymmetric) a
zero point, and the value is ``(q - zero_point) * scale``. On ONNX Runtime's CPU build it
reads a quarter (8 bits) or an eighth (4 bits) of a float32 weight's bytes, which is what a
decode step of a language model spends its time on, and with ``accuracy_level=4`` it
multiplies in int8 (the input quantized per block as it goes).

Two ways in:

- :class:`MatMulNBitsQuantization`, an ``onnx_ir`` pass given to ``opreg.export(...,
  passes=[...])``: it quantizes the float32 weight of every ``MatMul``/``FusedMatMul`` that
  reads one (round to nearest, ONNX Runtime's own ``DefaultWeightOnlyQuantizer``, the
  kernel its ``MatMulNBitsQuantizer`` and ONNX Runtime GenAI's builder call, so the same
  weights give the same bytes).
- :class:`TorchaoWeights`, offered by the pack's ``opreg_rewrite_rules`` at targets with
  com.microsoft: a model quantized in PyTorch with torchao's weight-only configs
  (``IntxWeightOnlyConfig`` with int4 or int8 and ``PerGroup``/``PerAxis``,
  ``Int8WeightOnlyConfig``) exports its dequantization as arithmetic on the integer
  weights; the pass finds each linear layer whose weight is so computed, reads the integers,
  scales and zero points back, checks that they give exactly the weight the model computes,
  and makes the layer one MatMulNBits on those integers (no re-rounding).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from opreg_ort_contrib import CONTRIB_DOMAIN

BITS = (4, 8)
ACCURACY_LEVELS = (0, 1, 2, 3, 4)


def _weight_of(node: ir.Node) -> tuple[ir.Value, bool] | None:
    """``(weight, stored (N, K))`` if ``node`` is a linear layer on a float32 2-D initializer:
    ``MatMul(x, W)`` (W is (K, N)) or ``FusedMatMul(x, W, transB=1)`` (W is (N, K))."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    weight = node.inputs[1]
    if not weight.is_initializer() or weight.const_value is None or weight.dtype != ir.DataType.FLOAT:
        return None
    if weight.shape is None or len(weight.shape) != 2 or node.inputs[0].dtype != ir.DataType.FLOAT:
        return None
    if node.op_type == "MatMul" and node.domain == "":
        return weight, False
    if node.op_type == "FusedMatMul" and node.domain == CONTRIB_DOMAIN:
        attributes = {a.name: a.value for a in node.attributes.values()}
        plain = attributes.get("transA", 0) == 0 and attributes.get("alpha", 1.0) == 1.0
        plain = plain and attributes.get("transBatchA", 0) == 0 and attributes.get("transBatchB", 0) == 0
        if plain and attributes.get("transB", 0) == 1:
            return weight, True
    return None


def _initializers(graph: ir.Graph, tensors: dict[str, tuple[str, np.ndarray] | None]) -> list[ir.Value | None]:
    """MatMulNBits' inputs after A (``B``, ``scales``, ``zero_points``, ``g_idx``, ``bias``) as new
    initializers, from ``{role: (name, array) or None}``; trailing absent ones dropped."""
    inputs: list[ir.Value | None] = []
    for role in ("B", "scales", "zero_points", "g_idx", "bias"):
        named = tensors.get(role)
        if named is None:
            inputs.append(None)
            continue
        name, array = named
        name = _fresh(graph, name)
        value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        value.type, value.shape = ir.TensorType(ir.DataType.from_numpy(array.dtype)), ir.Shape(array.shape)
        graph.register_initializer(value)
        inputs.append(value)
    while inputs[-1] is None:
        inputs.pop()
    return inputs


def _replace(graph: ir.Graph, node: ir.Node, x: ir.Value, inputs: list[ir.Value | None], attributes) -> None:
    """Replace ``node`` by ``MatMulNBits(x, *inputs)``, keeping its provenance."""
    new = ir.node(
        "MatMulNBits", [x, *inputs], attributes, domain=CONTRIB_DOMAIN, metadata_props=dict(node.metadata_props)
    )
    graph.insert_before(node, new)
    old = node.outputs[0]
    new.outputs[0].type, new.outputs[0].shape = old.type, old.shape
    ir.convenience.replace_all_uses_with(old, new.outputs[0], replace_graph_outputs=True)
    graph.remove(node, safe=True)


def _fresh(graph: ir.Graph, name: str) -> str:
    taken = graph.initializers
    if name not in taken:
        return name
    index = 1
    while f"{name}_{index}" in taken:
        index += 1
    return f"{name}_{index}"


class MatMulNBitsQuantization(ir.passes.InPlacePass):
    """Quantize the float32 weights of linear layers to ``bits`` (4 or 8), block-wise along K,
    as ``com.microsoft::MatMulNBits``.

    Args:
        bits: 4 or 8.
        block_size: values per block along K (a power of two, at least 16); each block has
            its own scale. Smaller is more accurate and larger.
        symmetric: ``True``: signed values around 0, no zero points (ONNX Runtime GenAI's
            builder's default); ``False``: unsigned values with a zero point per block.
        accuracy_level: MatMulNBits' ``accuracy_level``: the lowest precision the input may be
            computed in (``4``: int8, what the builder uses on CPU, and fastest there;
            ``None``: the kernel's default).
        exclude: weights to keep in float, by initializer name (``fnmatch`` patterns, e.g.
            ``"*lm_head*"``).

    Each new node keeps the provenance of the layer it replaces. A weight other nodes also
    read (tied embeddings) stays for them.
    """

    def __init__(
        self,
        bits: int = 4,
        block_size: int = 32,
        symmetric: bool = True,
        accuracy_level: int | None = None,
        exclude: Iterable[str] = (),
    ) -> None:
        from opreg import InvalidArgumentError

        super().__init__()
        if bits not in BITS:
            raise InvalidArgumentError(f"MatMulNBitsQuantization: bits must be 4 or 8, got {bits!r}")
        if not isinstance(block_size, int) or block_size < 16 or block_size & (block_size - 1):
            raise InvalidArgumentError(
                f"MatMulNBitsQuantization: block_size must be a power of two, at least 16, got {block_size!r}"
            )
        if accuracy_level is not None and accuracy_level not in ACCURACY_LEVELS:
            raise InvalidArgumentError(
                f"MatMulNBitsQuantization: accuracy_level must be None or 0-4, got {accuracy_level!r}"
            )
        if isinstance(exclude, str):
            raise InvalidArgumentError(f"MatMulNBitsQuantization: exclude must be a list of names, got {exclude!r}")
        self.bits, self.block_size, self.symmetric = bits, block_size, symmetric
        self.accuracy_level, self.exclude = accuracy_level, tuple(exclude)

    def __repr__(self) -> str:
        return (
            f"MatMulNBitsQuantization(bits={self.bits}, block_size={self.block_size}, symmetric={self.symmetric}, "
            f"accuracy_level={self.accuracy_level}, exclude={list(self.exclude)})"
        )

    def _quantizer(self):
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            DefaultWeightOnlyQuantizer,
        )

        config = DefaultWeightOnlyQuantConfig(
            block_size=self.block_size, is_symmetric=self.symmetric, accuracy_level=self.accuracy_level, bits=self.bits
        )
        return DefaultWeightOnlyQuantizer(config)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        quantizer = None
        done: dict[tuple[str, bool], tuple[list[ir.Value | None], dict]] = {}
        for node in list(graph):
            found = _weight_of(node)
            if found is None:
                continue
            weight, stored_nk = found
            if any(fnmatch.fnmatchcase(weight.name or "", pattern) for pattern in self.exclude):
                continue
            key = (weight.name, stored_nk)
            if key not in done:  # a weight two layers read is quantized once
                quantizer = quantizer or self._quantizer()
                array = weight.const_value.numpy()
                kn = np.ascontiguousarray(array.T if stored_nk else array, dtype=np.float32)
                packed, scales, zero_points = quantizer.qbits_block_quant(kn)
                tensors = {
                    "B": (f"{weight.name}_Q{self.bits}", packed),
                    "scales": (f"{weight.name}_scales", scales),
                    "zero_points": None if self.symmetric else (f"{weight.name}_zero_points", zero_points),
                }
                attributes = {"K": kn.shape[0], "N": kn.shape[1], "bits": self.bits, "block_size": self.block_size}
                if self.accuracy_level is not None:
                    attributes["accuracy_level"] = self.accuracy_level
                done[key] = (_initializers(graph, tensors), attributes)
            inputs, attributes = done[key]
            _replace(graph, node, node.inputs[0], inputs, attributes)
        if not done:
            return ir.passes.PassResult(model, False)
        onnx_ir.passes.common.RemoveUnusedNodesPass()(model)  # and the float weights no node reads now
        return ir.passes.PassResult(model, True)
