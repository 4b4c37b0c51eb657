"""Weight-only quantization of linear layers to ONNX Runtime's ``com.microsoft::MatMulNBits``.

MatMulNBits multiplies a float input by a weight stored block-wise in 4 or 8 bits along its
input dim ``K``: each block of ``block_size`` values has a float scale and (asymmetric) a
zero point, and the value is ``(q - zero_point) * scale``. On ONNX Runtime's CPU build it
reads a quarter (8 bits) or an eighth (4 bits) of a float32 weight's bytes, which is what a
decode step of a language model spends its time on, and with ``accuracy_level=4`` it
multiplies in int8 (the input quantized per block as it goes).

Two ways in:

- :class:`MatMulNBitsQuantization`, an ``onnx_ir`` pass given to ``opreg.export(...,
  passes=[...])``: it quantizes the float32 weight of every ``MatMul``/``FusedMatMul`` (and
  2-D linear ``Gemm``) that reads one (round to nearest, with the kernels ONNX Runtime's own
  ``DefaultWeightOnlyQuantizer`` calls, which its ``MatMulNBitsQuantizer`` and ONNX Runtime
  GenAI's builder use, so the same weights give the same bytes). ``int4_algo`` chooses int4 values
  more accurately than that: :mod:`opreg_ort_contrib.int4_algos`.
- :class:`opreg_ort_contrib.torchao.TorchaoWeights`, offered by the pack's ``opreg_rewrite_rules`` at targets with
  com.microsoft: a model quantized in PyTorch with torchao's weight-only configs
  (``IntxWeightOnlyConfig`` with int4 or int8 and ``PerGroup``/``PerAxis``,
  ``Int8WeightOnlyConfig``) exports its dequantization as arithmetic on the integer
  weights; the pass finds each linear layer whose weight is so computed, reads the integers,
  scales and zero points back, checks that they give exactly the weight the model computes,
  and makes the layer one MatMulNBits on those integers (no re-rounding).
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from opreg import weights as lazy_weights
from opreg.ops import user_stacklevel
from opreg_ort_contrib import CONTRIB_DOMAIN, int4_algos

BITS = (4, 8)
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
BLOCK_SIZE = 128
"""The default block size: the fastest measured on ONNX Runtime 1.32's CPU kernels (``python
bench/llm.py --accuracy --settings``, parts 9 and 7, 2026-11-28: the 55M Llama at 1 thread, int4,
accuracy level 4: blocks of 32, ONNX Runtime GenAI's builder's default, take 1.27x / 1.13x / 1.29x
as long for a decode step at past 128 / 1024 and a 128-token prefill, blocks of 64 1.08x / 1.05x /
1.24x), at a perplexity within 0.2% of 32's and of fp32's on a small trained Llama (5.268, 32's
5.260, fp32's 5.261; docs/quantization.md has the table)."""
SYMMETRIC = True
"""Symmetric by default: one fewer input, the same speed (asymmetric: 0.97x / 1.01x / 1.00x, inside
the spread of two identical models) and more accurate on the trained Llama at blocks of 128
(next-token top-1 equal to fp32's 98.4% of the time against 96.7%; greedy runs equal to fp32's 15
of 16 against 12)."""
ACCURACY_LEVEL = 4
"""MatMulNBits computes with its input quantized to int8 per block by default: without it (the
kernel's float path; same measurement) int4 takes 1.4-1.9x as long and int8 3.6-41x, for the same
perplexity (the builder sets 4 on CPU for the same reason)."""


def transposed_b(node: ir.Node) -> bool:
    """``node`` is ``FusedMatMul(x, W, transB=1)`` and nothing else (a plain product with W (N, K))."""
    if node.op_type != "FusedMatMul" or node.domain != CONTRIB_DOMAIN:
        return False
    attributes = {a.name: a.value for a in node.attributes.values()}
    return (
        attributes.get("transB", 0) == 1
        and all(attributes.get(name, 0) == 0 for name in ("transA", "transBatchA", "transBatchB"))
        and attributes.get("alpha", 1.0) == 1.0
    )


def weight_of(node: ir.Node) -> tuple[ir.Value, bool] | None:
    """``(weight, stored (N, K))`` if ``node`` is a linear layer on a float32 2-D initializer:
    ``MatMul(x, W)`` (W is (K, N)), ``MatMul(x, Transpose(W))`` or ``FusedMatMul(x, W, transB=1)``
    (W is (N, K))."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    weight, transposed = node.inputs[1], False
    transpose = weight.producer()
    if transpose is not None and transpose.op_type == "Transpose" and transpose.domain == "":
        perm = transpose.attributes.get("perm")
        if perm is None or list(perm.as_ints()) != [1, 0] or node.op_type != "MatMul":
            return None
        weight, transposed = transpose.inputs[0], True  # MatMul(x, Transpose(W)): W is (N, K)
    if not weight.is_initializer() or weight.const_value is None or weight.dtype != ir.DataType.FLOAT:
        return None
    if weight.shape is None or len(weight.shape) != 2 or node.inputs[0].dtype != ir.DataType.FLOAT:
        return None
    if node.op_type == "MatMul" and node.domain == "":
        return weight, transposed
    if transposed_b(node) and not transposed:
        return weight, True
    return None


def gemm_of(node: ir.Node) -> tuple[ir.Value, bool, ir.Value | None] | str | None:
    """``(weight, stored (N, K), bias or None)`` if ``node`` is ``Gemm(x, W, C)`` computing a linear layer
    (a 2-D Linear: ``x @ W.T + C``) on a float32 2-D initializer; why it cannot be one MatMulNBits if
    it is such a Gemm in another form (a string); ``None`` if it is no such Gemm."""
    if (node.op_type, node.domain) != ("Gemm", "") or len(node.inputs) < 2 or node.inputs[0] is None:
        return None
    x, weight = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if weight is None or not weight.is_initializer() or weight.const_value is None:
        return None
    if weight.dtype != ir.DataType.FLOAT or x.dtype != ir.DataType.FLOAT or weight.shape is None:
        return None
    attributes = {a.name: a.value for a in node.attributes.values()}
    scaled = {k: attributes[k] for k in ("alpha", "beta", "transA") if k in attributes}
    beta = scaled.get("beta", 1.0) if bias is not None else 1.0  # without C, beta does nothing
    if scaled.get("transA", 0) or scaled.get("alpha", 1.0) != 1.0 or beta != 1.0:
        shown = ", ".join(f"{k}={v}" for k, v in scaled.items())
        return f"its Gemm ({shown}) is not a plain x @ W + bias, which MatMulNBits computes"
    return weight, bool(attributes.get("transB", 0)), bias


def initializers(graph: ir.Graph, tensors: dict[str, tuple[str, np.ndarray] | None]) -> list[ir.Value | None]:
    """MatMulNBits' inputs after A (``B``, ``scales``, ``zero_points``, ``g_idx``, ``bias``) as new
    initializers, from ``{role: (name, array) or None}``; trailing absent ones dropped."""
    inputs = [None if tensors.get(role) is None else new_initializer(graph, *tensors[role])
              for role in ("B", "scales", "zero_points", "g_idx", "bias")]  # fmt: skip
    while inputs[-1] is None:
        inputs.pop()
    return inputs


def new_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """A new initializer holding ``array``, named ``name`` (or ``name_1``, ... if that is taken)."""
    name = _fresh(graph, name)
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.type, value.shape = ir.TensorType(ir.DataType.from_numpy(array.dtype)), ir.Shape(array.shape)
    graph.register_initializer(value)
    return value


def quantize_rows(quantizer, rows) -> tuple:
    """Block quantization of a run of rows of an ``(N, K)`` float32 weight (a torch tensor):
    ``(packed, scales, zero_points)`` of those rows, as torch tensors, by ``quantizer`` (the kernels
    ONNX Runtime's ``DefaultWeightOnlyQuantizer`` calls, :class:`_BlockQuantizer`, or that quantizer) (each row is one column of MatMulNBits' ``(K, N)`` weight, its
    blocks along K: the rows of a weight are quantized independently, so a run at a time gives the
    bytes the whole weight gives)."""
    import torch

    kn = np.ascontiguousarray(rows.numpy().T, dtype=np.float32)
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in quantizer.qbits_block_quant(kn))


def quantized_weights(nk, quantizer, names: dict[str, str], bits: int, block_size: int) -> dict:
    """MatMulNBits' ``B``, ``scales`` and ``zero_points`` of the lazy ``(N, K)`` float32 weight ``nk``
    (:class:`opreg.weights.LazyWeight`), as lazy tensors named by ``names``: computed by
    :func:`quantize_rows` a run of rows at a time as the model is written, never the whole weight at once."""
    import torch

    n, k = (int(d) for d in nk.shape)
    blocks = (k + block_size - 1) // block_size
    per_byte = 8 // bits
    specs = [
        lazy_weights.TensorSpec(torch.uint8, (n, blocks, (block_size + per_byte - 1) // per_byte), names["B"]),
        lazy_weights.TensorSpec(torch.float32, (n, blocks), names["scales"]),
        lazy_weights.TensorSpec(torch.uint8, (n, (blocks + per_byte - 1) // per_byte), names["zero_points"]),
    ]
    nk = lazy_weights.finite(nk, f"int{bits} blocks would make a NaN a number and an infinity's block all wrong")
    made = lazy_weights.rowwise(nk, lambda rows: quantize_rows(quantizer, rows), specs, f"int{bits} blocks")
    return dict(zip(("B", "scales", "zero_points"), made, strict=True))


def register_tensor(graph: ir.Graph, tensor) -> ir.Value:
    """``tensor`` (named) as a new initializer of ``graph``."""
    value = ir.Value(name=tensor.name, const_value=tensor)
    value.type, value.shape = ir.TensorType(tensor.dtype), ir.Shape(list(tensor.shape))
    graph.register_initializer(value)
    return value


def replace_node(
    graph: ir.Graph, node: ir.Node, x: ir.Value, inputs: list[ir.Value | None], attributes, bias: ir.Value | None = None
) -> None:
    """Replace ``node`` by ``MatMulNBits(x, *inputs)`` (+ ``bias``: its input when it is a vector of
    N, else an Add after it), keeping its provenance and its output's name, type and shape (a graph
    output stays one by name)."""
    vector = bias is not None and bias.shape is not None and list(bias.shape) == [attributes["N"]]
    if vector:
        inputs = [*inputs, *[None] * (4 - len(inputs)), bias]  # B, scales, zero_points, g_idx, bias
    metadata = dict(node.metadata_props)
    made = [ir.node("MatMulNBits", [x, *inputs], attributes, domain=CONTRIB_DOMAIN, metadata_props=metadata)]
    if bias is not None and not vector:  # a bias of another shape (1 x N, M x N) broadcasts as Gemm's C does
        made.append(ir.node("Add", [made[0].outputs[0], bias], metadata_props=dict(metadata)))
    ir.convenience.replace_nodes_and_values(graph, node, [node], made, [node.outputs[0]], [made[-1].outputs[0]])


def _fresh(graph: ir.Graph, name: str) -> str:
    taken = graph.initializers
    if name not in taken:
        return name
    index = 1
    while f"{name}_{index}" in taken:
        index += 1
    return f"{name}_{index}"


class _BlockQuantizer:
    """ONNX Runtime's block quantization of a (K, N) float32 weight for MatMulNBits: the C++ kernels
    (``quantize_matmul_4bits`` / ``_8bits``) that its ``DefaultWeightOnlyQuantizer.qbits_block_quant``
    calls in the QOperator format, called the same way, so the same weights give the same bytes
    (``plugins/ort_contrib/tests/test_quantize.py`` compares the two).

    Not through ``onnxruntime.quantization``: importing it calls ``logging.basicConfig(level=INFO)``
    (the whole process then logs INFO records to stderr) and, through ``onnxruntime.transformers``,
    appends that package's folder to ``sys.path``; an export must change neither."""

    def __init__(self, bits: int, block_size: int, symmetric: bool) -> None:
        self.bits, self.block_size, self.symmetric = bits, block_size, symmetric

    def qbits_block_quant(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(packed (N, blocks, bytes per block), scales (N, blocks), zero points (N, packed blocks))``."""
        from onnxruntime.capi import _pybind_state as kernels

        rows, cols = weight.shape  # K, N
        per_byte, size = 8 // self.bits, self.block_size
        blocks = (rows + size - 1) // size
        if blocks * size > rows:
            weight = np.pad(weight, ((0, blocks * size - rows), (0, 0)), "constant")
        packed = np.zeros((cols, blocks, (size + per_byte - 1) // per_byte), dtype=np.uint8)
        zero_points = np.zeros((cols, (blocks + per_byte - 1) // per_byte), dtype=np.uint8)
        scales = np.zeros((cols, blocks), dtype=weight.dtype)
        quantize = kernels.quantize_matmul_8bits if self.bits == 8 else kernels.quantize_matmul_4bits
        quantize(packed, weight, scales, zero_points, size, cols, rows, self.symmetric)
        return packed, scales, zero_points


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(owner: str, option: str, value: object, ok: bool, takes: str) -> None:
    """:class:`opreg.InvalidArgumentError` naming the option and what it takes, unless ``ok``: options
    are checked when the pass is made, before any capture."""
    if not ok:
        from opreg import InvalidArgumentError

        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise InvalidArgumentError(f"{owner}: {option}= takes {takes}, got {type(value).__name__} {shown}")


def check_accuracy_level(owner: str, level: object) -> None:
    ok = level is None or (_is_int(level) and level in ACCURACY_LEVELS)
    _check(owner, "accuracy_level", level, ok, "None or 0, 1, 2, 3, 4 (4: int8, the fastest on CPU)")


class MatMulNBitsQuantization(ir.passes.InPlacePass):
    """Quantize the float32 weights of linear layers to ``bits`` (4 or 8), block-wise along K,
    as ``com.microsoft::MatMulNBits``.

    Args:
        bits: 4 or 8.
        block_size: values per block along K (a power of two, at least 16); each block has
            its own scale. Smaller is more accurate, larger and slower; default
            :data:`BLOCK_SIZE` (128), the fastest measured.
        symmetric: ``True`` (the default with ``int4_algo="rtn"``, :data:`SYMMETRIC`): signed
            values around 0, no zero points; ``False`` (the default, and the only choice, with
            ``k_quant`` and ``hqq``): unsigned values with a zero point per block.
        accuracy_level: MatMulNBits' ``accuracy_level``: the lowest precision the input may be
            computed in: ``4`` (default, :data:`ACCURACY_LEVEL`): int8, the fastest on CPU by far;
            ``None``: the kernel's float path (what a dequantized model computes).
        exclude: weights to keep in float, by initializer name (``fnmatch`` patterns, e.g.
            ``"*lm_head*"``).
        embeddings: ``True``: an embedding table no linear layer reads (a float32 2-D initializer
            only ``Gather``s of rows read) is quantized too, its Gathers made
            ``com.microsoft::GatherBlockQuantized`` (a vision-language model's embedding model);
            default ``False``: such a table stays float.
        int4_algo: how the int4 values are chosen (:mod:`opreg_ort_contrib.int4_algos`):
            ``"rtn"`` (default) round to nearest; ``"k_quant"`` ONNX Runtime's k-quant search of
            each block's scale and zero point, the head and the most sensitive projections in 8
            bits (ONNX Runtime GenAI's builder's ``k_quant_mixed``); ``"hqq"`` ONNX Runtime's HQQ,
            its zero points rounded to MatMulNBits' integers. ``bits=8`` takes ``"rtn"`` only.

    Each new node keeps the provenance of the layer it replaces. A tied embedding table (the
    head's weight, also read by a ``Gather`` of its rows) is stored once, quantized: the Gather
    becomes ``com.microsoft::GatherBlockQuantized`` of the head's quantized rows. A weight other
    nodes read otherwise stays float for them.
    """

    def __init__(
        self,
        bits: int = 4,
        block_size: int = BLOCK_SIZE,
        symmetric: bool | None = None,
        accuracy_level: int | None = ACCURACY_LEVEL,
        exclude: Iterable[str] = (),
        embeddings: bool = False,
        int4_algo: str = "rtn",
    ) -> None:
        super().__init__()
        name = "MatMulNBitsQuantization"
        _check(name, "bits", bits, _is_int(bits) and bits in BITS, "4 or 8")
        power = _is_int(block_size) and block_size >= 16 and not block_size & (block_size - 1)
        _check(name, "block_size", block_size, power, "a power of two, at least 16 (16, 32, 64, 128, 256)")
        _check(name, "symmetric", symmetric, symmetric is None or isinstance(symmetric, bool), "True or False")
        check_accuracy_level(name, accuracy_level)
        patterns = None if isinstance(exclude, (str, bytes)) or not isinstance(exclude, Iterable) else tuple(exclude)
        names = patterns is not None and all(isinstance(p, str) for p in patterns)
        _check(name, "exclude", exclude, names, "a list of weight names or fnmatch patterns, e.g. ['*lm_head*']")
        _check(name, "embeddings", embeddings, isinstance(embeddings, bool), "True or False")
        _check(name, "int4_algo", int4_algo, int4_algo in int4_algos.ALGORITHMS, " or ".join(int4_algos.ALGORITHMS))
        searched = int4_algo != "rtn"
        _check(name, "int4_algo", int4_algo, bits == 4 or not searched, "'rtn' at bits=8 (the others choose int4)")
        _check(name, "symmetric", symmetric, not (searched and symmetric), f"False or None with {int4_algo}, which "
               "fits a zero point to each block")  # fmt: skip
        self.bits, self.block_size, self.int4_algo = bits, block_size, int4_algo
        self.symmetric = (not searched and SYMMETRIC) if symmetric is None else symmetric
        self.accuracy_level, self.exclude, self.embeddings = accuracy_level, patterns or (), embeddings

    def __repr__(self) -> str:
        return (
            f"MatMulNBitsQuantization(bits={self.bits}, block_size={self.block_size}, symmetric={self.symmetric}, "
            f"accuracy_level={self.accuracy_level}, exclude={list(self.exclude)}, embeddings={self.embeddings}, "
            f"int4_algo={self.int4_algo!r})"
        )

    def _quantizer(self, bits: int | None = None) -> Any:
        """The block quantizer of ``bits`` (default the pass's) by :attr:`int4_algo`."""
        bits = bits or self.bits
        if self.int4_algo == "k_quant":
            return int4_algos.KQuantBlocks(bits, self.block_size)
        if self.int4_algo == "hqq":
            return int4_algos.HQQBlocks(bits, self.block_size)
        return _BlockQuantizer(bits, self.block_size, self.symmetric)

    def _quantized(self, graph: ir.Graph, weight: ir.Value, stored_nk: bool, bits: int) -> tuple[list, dict]:
        """MatMulNBits' inputs after A for ``weight`` in ``bits`` (new lazy initializers, computed block by
        block as the model is written: :func:`quantized_weights`) and its attributes."""
        nk = lazy_weights.lazy(weight.const_value, weight.name)
        if not stored_nk:
            nk = lazy_weights.transpose(nk, [1, 0])
        names = {
            role: _fresh(graph, f"{weight.name}{suffix}")
            for role, suffix in (("B", f"_Q{bits}"), ("scales", "_scales"), ("zero_points", "_zero_points"))
        }
        tensors = quantized_weights(nk, self._quantizer(bits), names, bits, self.block_size)
        if self.symmetric:
            del tensors["zero_points"]
        n, k = (int(d) for d in nk.shape)
        attributes = {"K": k, "N": n, "bits": bits, "block_size": self.block_size}
        if self.accuracy_level is not None:
            attributes["accuracy_level"] = self.accuracy_level
        inputs = []
        for role in ("B", "scales", "zero_points"):
            tensor = tensors.get(role)
            inputs.append(None if tensor is None else register_tensor(graph, tensor))
        while inputs[-1] is None:
            inputs.pop()
        return inputs, attributes

    def _excluded(self, weight: ir.Value) -> bool:
        return any(fnmatch.fnmatchcase(weight.name or "", pattern) for pattern in self.exclude)

    def _linears(self, graph: ir.Graph) -> list[tuple[ir.Node, ir.Value, bool, ir.Value | None]]:
        """``(node, weight, stored (N, K), bias)`` of each linear layer to quantize, in graph order
        (a Gemm that cannot be one MatMulNBits is reported and left)."""
        found = []
        for node in list(graph):
            linear, bias = weight_of(node), None
            if linear is None:
                gemm = gemm_of(node)
                if isinstance(gemm, str):
                    weight_name = node.inputs[1].name if node.inputs[1] is not None else "?"
                    warnings.warn(
                        f"MatMulNBitsQuantization: weight {weight_name!r} stays float32: {gemm}",
                        stacklevel=user_stacklevel(),
                    )
                    continue
                linear, bias = (gemm[:2], gemm[2]) if gemm is not None else (None, None)
            if linear is not None and not self._excluded(linear[0]):
                found.append((node, *linear, bias))
        return found

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        done: dict[tuple[str, bool], tuple[list[ir.Value | None], dict]] = {}
        weights: dict[tuple[str, bool], ir.Value] = {}
        linears = self._linears(graph)
        ordered = list(dict.fromkeys(weight.name or "" for _, weight, _, _ in linears))
        wider = int4_algos.sensitive(ordered) if self.int4_algo == "k_quant" else set()
        for node, weight, stored_nk, bias in linears:
            key = (weight.name, stored_nk)
            if key not in done:  # a weight two layers read is quantized once
                bits = 8 if weight.name in wider else self.bits
                done[key] = self._quantized(graph, weight, stored_nk, bits)
                weights[key] = weight
            inputs, attributes = done[key]
            replace_node(graph, node, node.inputs[0], inputs, attributes, bias)
        if self.embeddings:
            for weight in _tables(graph, done):
                if not self._excluded(weight):
                    done[(weight.name, True)] = self._quantized(graph, weight, True, self.bits)
                    weights[(weight.name, True)] = weight
        if not done:
            return ir.passes.PassResult(model, False)
        for key, weight in weights.items():
            if key[1]:  # an (N, K) weight: a tied embedding table reads its rows
                _embeddings_from(graph, weight, *done[key])
        onnx_ir.passes.common.RemoveUnusedNodesPass()(model)  # and the float weights no node reads now
        return ir.passes.PassResult(model, True)


def _tables(graph: ir.Graph, done: Mapping[tuple[str, bool], Any]) -> list[ir.Value]:
    """The float32 2-D initializers that only ``Gather``s of rows (axis 0) read: untied embedding tables
    (a table a linear layer reads, ``done``, is quantized as its weight)."""
    found = []
    for weight in graph.initializers.values():
        if (weight.name, True) in done or weight.const_value is None or weight.dtype != ir.DataType.FLOAT:
            continue
        if weight.shape is None or len(weight.shape) != 2 or not weight.uses():
            continue
        rows = all((n.op_type, n.domain, i) == ("Gather", "", 0) and n.attributes.get_int("axis", 0) == 0
                   for n, i in weight.uses())  # fmt: skip
        if rows:
            found.append(weight)
    return found


def _embeddings_from(graph: ir.Graph, weight: ir.Value, inputs: list[ir.Value | None], attributes: dict) -> None:
    """Make every ``Gather(weight, ids)`` of rows (a tied embedding table, ``weight`` (N, K)) a
    ``com.microsoft::GatherBlockQuantized`` of the rows of the quantized weight MatMulNBits reads:
    the table is stored once, in its quantized form (what ONNX Runtime GenAI's builder does for
    tied embeddings). Its rows are padded to whole blocks; a Slice drops the padding."""
    gathers = [
        node for node, index in weight.uses()
        if (node.op_type, node.domain, index) == ("Gather", "", 0) and node.attributes.get_int("axis", 0) == 0
    ]  # fmt: skip
    if not gathers:
        return
    b, scales, zero_points = [*inputs, None, None][:3]
    n, k, block, bits = attributes["N"], attributes["K"], attributes["block_size"], attributes["bits"]
    padded = -(-k // block) * block
    rows = ir.node("Reshape", [b, new_initializer(graph, f"{b.name}_rows_shape", np.array([n, -1], np.int64))])
    rows.outputs[0].type = ir.TensorType(ir.DataType.UINT8)
    rows.outputs[0].shape = ir.Shape([n, padded * bits // 8])
    graph.insert_before(gathers[0], rows)
    slice_bounds = None
    if padded != k:  # rows come padded to whole blocks
        slice_bounds = [new_initializer(graph, f"{b.name}_rows_{part}", np.array([value], np.int64))
                        for part, value in (("start", 0), ("end", k), ("axis", -1))]  # fmt: skip
    quantized = {"bits": bits, "block_size": block, "gather_axis": 0, "quantize_axis": 1}
    for gather in gathers:
        provenance = dict(gather.metadata_props)
        made = [ir.node(
            "GatherBlockQuantized", [rows.outputs[0], gather.inputs[1], scales, *([zero_points] if zero_points else [])],
            quantized, domain=CONTRIB_DOMAIN, metadata_props=provenance,
        )]  # fmt: skip
        if slice_bounds is not None:
            made.append(ir.node("Slice", [made[0].outputs[0], *slice_bounds], metadata_props=provenance))
        ir.convenience.replace_nodes_and_values(
            graph, gather, [gather], made, [gather.outputs[0]], [made[-1].outputs[0]]
        )
