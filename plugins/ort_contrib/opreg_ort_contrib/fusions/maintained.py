"""onnxscript's maintained rules, where they do what the pack's own did (the same nodes fused on BERT,
GPT-2 and Llama), adapted: under the pack's names, and matching float32 only."""

from __future__ import annotations

from onnxscript.rewriter import pattern

from opreg_ort_contrib.fusions.values import float32


def _float32_only(rule_class: type, *names: str) -> type:
    """``rule_class`` (an onnxscript rule) matching only where the values bound to ``names`` are
    float32: the CPU kernels its rewrite makes (and the pack's tests) are float32's."""

    class Float32(rule_class):
        def check(self, context, **bindings):
            result = super().check(context, **bindings)
            if result and not float32(*(bindings.get(name) for name in names)):
                return pattern.MatchResult().fail("float32 only")
            return result

    Float32.__name__ = Float32.__qualname__ = rule_class.__name__
    return Float32


def maintained_rules() -> dict:
    """onnxscript's rules that do what the pack's own did, under the pack's names: RMS norms to
    RMSNormalization-23 (``rules.fusion``, which onnxscript's ``onnx_fusions`` applies; no public
    name), ``Gelu(x + bias)`` to BiasGelu and ``MatMul(x, Transpose(W))`` to FusedMatMul
    (``ort_fusions``, which its ``optimize_for_ort`` applies)."""
    from onnxscript.rewriter.ort_fusions.bias_gelu import BiasGeluFusion
    from onnxscript.rewriter.ort_fusions.fused_matmul_rule_sets import TransposeMatMul2
    from onnxscript.rewriter.rules.fusion._rms_normalization import RmsNormFusion

    rms = _float32_only(RmsNormFusion, "x", "scale")
    return {
        "RMSNormalization": rms.rule("RMSNormalization", mul_order=False),  # weight * normalized
        "RMSNormalizationWeightLast": rms.rule("RMSNormalizationWeightLast", mul_order=True),
        "BiasGelu": _float32_only(BiasGeluFusion, "input", "bias").rule("BiasGelu", contrib_op=True),
        "FusedMatMul": _float32_only(TransposeMatMul2, "x", "y").rule("FusedMatMul"),
    }
