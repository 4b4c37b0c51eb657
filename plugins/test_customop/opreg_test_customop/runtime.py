"""Running test.customop without its native library: reference kernels for
``onnx.reference``, ONNX function definitions to embed, and schemas.

The ops are the ones of onnxruntime's test custom-op library
(``custom_op_library/cpu/cpu_ops.cc``): ``CustomOpOne(X, Y) = X + Y`` on
floats, ``CustomOpTwo(X) = round(X)`` as int32.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.reference.op_run import OpRun

from opreg_test_customop import DOMAIN


class CustomOpOne(OpRun):
    """test.customop::CustomOpOne: elementwise sum of two float tensors."""

    op_domain = DOMAIN

    def _run(self, x, y):
        return (np.add(x, y).astype(x.dtype),)


class CustomOpTwo(OpRun):
    """test.customop::CustomOpTwo: round half to even, as int32."""

    op_domain = DOMAIN

    def _run(self, x):
        return (np.round(x).astype(np.int32),)


def reference_kernels() -> list[type[OpRun]]:
    return [CustomOpOne, CustomOpTwo]


def functions(onnx_opset: int = 18) -> list[onnx.FunctionProto]:
    """The two ops as ONNX functions over standard ops (opreg sets the opset to the model's)."""
    opsets = [helper.make_opsetid("", onnx_opset)]
    one = helper.make_function(
        DOMAIN, "CustomOpOne", ["X", "Y"], ["Z"], [helper.make_node("Add", ["X", "Y"], ["Z"])], opsets
    )
    two = helper.make_function(
        DOMAIN,
        "CustomOpTwo",
        ["X"],
        ["Y"],
        [
            helper.make_node("Round", ["X"], ["rounded"]),
            helper.make_node("Cast", ["rounded"], ["Y"], to=onnx.TensorProto.INT32),
        ],
        opsets,
    )
    return [one, two]


def schemas() -> list:
    from onnx.defs import OpSchema

    def same_as_input(ctx) -> None:
        ctx.set_output_type(0, ctx.get_input_type(0))

    def int32_like_input(ctx) -> None:
        output = onnx.TypeProto()
        output.CopyFrom(ctx.get_input_type(0))
        output.tensor_type.elem_type = onnx.TensorProto.INT32
        ctx.set_output_type(0, output)

    one = OpSchema(
        "CustomOpOne", DOMAIN, 1, "X + Y (onnxruntime's test custom op library).",
        inputs=[OpSchema.FormalParameter("X", "T"), OpSchema.FormalParameter("Y", "T")],
        outputs=[OpSchema.FormalParameter("Z", "T")],
        type_constraints=[("T", ["tensor(float)"], "float tensors")],
    )  # fmt: skip
    one.set_type_and_shape_inference_function(same_as_input)
    two = OpSchema(
        "CustomOpTwo", DOMAIN, 1, "round(X) as int32 (onnxruntime's test custom op library).",
        inputs=[OpSchema.FormalParameter("X", "T")],
        outputs=[OpSchema.FormalParameter("Y", "tensor(int32)")],
        type_constraints=[("T", ["tensor(float)"], "float tensors")],
    )  # fmt: skip
    two.set_type_and_shape_inference_function(int32_like_input)
    return [one, two]
