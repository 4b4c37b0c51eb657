"""opreg pack for ONNX Runtime's com.microsoft contrib ops.

Importing this module imports neither onnxruntime nor onnxscript; the hooks do.
"""

from __future__ import annotations

import functools

import opreg

OPREG_API_VERSION = 1

CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_PRIORITY = 10
"""Contrib impls outrank the core pack's wherever the target offers com.microsoft."""


@functools.cache
def newest_onnxruntime_opset() -> int:
    """The newest ai.onnx opset the installed onnxruntime loads, found by trying."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    from opreg.targets import onnx_opset_range

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    ])  # fmt: skip
    low, high = onnx_opset_range()
    for version in range(high, low - 1, -1):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
        try:
            onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:
            continue
        return version
    raise RuntimeError(
        f"onnxruntime {onnxruntime.__version__} loads no opset from {low} to {high} (onnx {onnx.__version__})"
    )


@opreg.hookimpl
def opreg_targets():
    return {"onnxruntime": {"": newest_onnxruntime_opset(), CONTRIB_DOMAIN: 1}}


@opreg.hookimpl
def opreg_register_ops(registry: opreg.Registrar) -> None:
    from opreg_ort_contrib import activation

    activation.register(registry)
