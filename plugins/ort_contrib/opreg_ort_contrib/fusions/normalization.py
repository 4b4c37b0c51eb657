"""Normalization rules: the residual sum before a LayerNormalization written as ``Sum``, which ONNX
Runtime leaves be (its SkipLayerNormalization is slower on the CPU build). The RMS norms are
onnxscript's (:mod:`.maintained`)."""

from __future__ import annotations

from onnxscript.rewriter import pattern

from opreg_ort_contrib.fusions.values import dims_of


class ResidualSum(pattern.RewriteRuleClassBase):
    """``LayerNormalization(Add(a, b))`` -> ``LayerNormalization(Sum(a, b))``: ONNX Runtime then
    keeps the two kernels instead of fusing them into its slower SkipLayerNormalization."""

    def pattern(self, op, a, b):
        return op.Add(a, b)

    def check(self, context, a, b, **_):
        result = pattern.MatchResult()
        users = context.output_values[0].uses()
        if len(users) != 1 or context.output_values[0].is_graph_output():
            return result.fail("the sum has other users: ONNX Runtime would not fuse it")
        node = next(iter(users)).node
        if node.op_type != "LayerNormalization" or node.domain or next(iter(users)).idx != 0:
            return result.fail("not the input of a LayerNormalization")
        if dims_of(a) is None or dims_of(a) != dims_of(b) or len(dims_of(a)) != 3:
            return result.fail("not two 3-D tensors of one shape (what ONNX Runtime fuses)")
        return result

    def rewrite(self, op, a, b):
        return op.Sum(a, b)
