"""ONNX Runtime's 8-bit integer kernels on this CPU: whether they compute a QDQ model's products exactly.

ONNX Runtime fuses a QDQ model's QuantizeLinear/DequantizeLinear pairs around MatMul, Gemm and
Conv into integer kernels (QGemm, QLinearMatMul, QLinearConv, MatMulInteger). With uint8
activations and int8 weights (the u8s8 form pt2e's X86InductorQuantizer and ONNX Runtime's own
quantizer produce) its MLAS library multiplies, on x86 CPUs with AVX2 or AVX-512 but neither
AVX-VNNI nor AVX512-VNNI, with VPMADDUBSW: it adds each pair of adjacent products into a
*saturating* 16-bit integer. ``255 * -128 * 2 = -65280`` becomes ``-32768``. A pair saturates
only when both activations are far from 0 and both weights beyond about +-64, which full-range
int8 weights (symmetric per channel: each channel's largest weight is +-127) and 8-bit
activations reach; 7-bit activations (``0..127``) or weights (``-64..63``) never do. VNNI's
VPDPBUSD adds in 32 bits, and the uint8-weight (u8u8) and SSE-only kernels widen to 16 bits
first: those are exact.

:func:`integer_products_saturate` asks the installed ONNX Runtime, on this CPU, instead of
reading CPU flags: one MatMulInteger whose exact result is known.

Importing this module is cheap: no torch, no onnxruntime until the question is asked.
"""

from __future__ import annotations

import functools
import logging

import onnx_ir as ir

logger = logging.getLogger(__name__)

DOCS = "docs/quantization.md, 'Integer kernels on x86 CPUs without VNNI'"
"""Where the behaviour is explained to users."""

_DEPTH = 2
"""The probe's inner dimension: one pair of products."""


@functools.cache
def integer_products_saturate() -> bool:
    """Whether ONNX Runtime's u8s8 integer kernels on this CPU saturate a pair of products:
    ``[255, 255] @ [[-128], [-128]]`` in MatMulInteger, whose exact value is -65280."""
    import numpy as np
    import onnxruntime

    a = ir.val("a", ir.DataType.UINT8, ir.Shape([1, _DEPTH]))
    b = ir.val("b", ir.DataType.INT8, ir.Shape([_DEPTH, 1]))
    node = ir.node("MatMulInteger", [a, b], num_outputs=1)
    node.outputs[0].name, node.outputs[0].dtype = "y", ir.DataType.INT32
    node.outputs[0].shape = ir.Shape([1, 1])
    graph = ir.Graph([a, b], node.outputs, nodes=[node], opset_imports={"": 18}, name="probe")
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"a": np.full((1, _DEPTH), 255, np.uint8), "b": np.full((_DEPTH, 1), -128, np.int8)}
    (got,) = session.run(None, feeds)
    saturates = int(got.item()) != 255 * -128 * _DEPTH
    logger.debug("ONNX Runtime's u8s8 kernels on this CPU %s", "saturate" if saturates else "are exact")
    return saturates


def has_int8_weights(model: ir.Model) -> bool:
    """Whether ``model`` dequantizes an int8 constant (a weight): the u8s8 form ONNX Runtime fuses."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx") and node.inputs:
            source = node.inputs[0]
            if source is not None and source.dtype == ir.DataType.INT8 and source.const_value is not None:
                return True
    return False


def saturation_hint(model: ir.Model, saturates: bool) -> str:
    """What to tell a user whose QDQ model does not match in ONNX Runtime on a CPU whose integer
    kernels saturate (``""`` when that cannot be the cause)."""
    if not saturates or not has_int8_weights(model):
        return ""
    return (
        "\nThis CPU has AVX2 or AVX-512 but no VNNI: ONNX Runtime's int8 kernels add pairs of uint8 x int8 "
        "products in saturating 16-bit integers here, so full-range int8 weights times 8-bit activations can "
        "come out many quantization steps away (exact on CPUs with VNNI and on ARM, and with ONNX Runtime's "
        "graph optimizations off). Quantize the activations to 7 bits (X86InductorQuantizer: "
        f"get_default_x86_inductor_quantization_config(reduce_range=True)) to be exact everywhere; see {DOCS}."
    )
