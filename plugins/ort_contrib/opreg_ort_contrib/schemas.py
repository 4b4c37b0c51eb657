"""ONNX schemas of the com.microsoft ops this pack emits.

ONNX Runtime implements these kernels but ``onnx.defs`` does not know them;
with these registered, onnxscript can trace them, and the checker and shape
inference understand them (outputs keep their input's type and shape).
"""

from __future__ import annotations

from opreg_ort_contrib import CONTRIB_DOMAIN

_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)"]


def _same_as_input(ctx) -> None:
    ctx.set_output_type(0, ctx.get_input_type(0))


def _unary(name: str, doc: str, *, optional_bias: bool = False):
    from onnx.defs import OpSchema

    inputs = [OpSchema.FormalParameter("X", "T", "input")]
    if optional_bias:
        inputs.append(
            OpSchema.FormalParameter(
                "bias", "T", "bias added first", param_option=OpSchema.FormalParameterOption.Optional
            )
        )
    schema = OpSchema(
        name,
        CONTRIB_DOMAIN,
        1,
        doc,
        inputs=inputs,
        outputs=[OpSchema.FormalParameter("Y", "T", "output, same type and shape as X")],
        type_constraints=[("T", _FLOATS, "floating point tensors")],
    )
    schema.set_type_and_shape_inference_function(_same_as_input)
    return schema


def schemas() -> list:
    """Gelu, FastGelu and Inverse, com.microsoft version 1."""
    return [
        _unary("Gelu", "Gaussian error linear unit, erf form (onnxruntime contrib)."),
        _unary("FastGelu", "GELU, tanh approximation (onnxruntime contrib).", optional_bias=True),
        _unary("Inverse", "Inverse of square matrices over the last two dims (onnxruntime contrib)."),
    ]
