"""Activation rules: the tanh GELU in torch's and GPT-2's orders (FastGelu), with a bias added before it
(FastGeluBias), and ``x * sigmoid(alpha * x)`` (QuickGelu). BiasGelu is onnxscript's (:mod:`.maintained`)."""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.rewriter import pattern

from opreg_ort_contrib import CONTRIB_DOMAIN
from opreg_ort_contrib.fusions.values import close_to, const, dims_of, float32, scalar


def _check_bias(x: ir.Value, bias: ir.Value) -> pattern.MatchResult:
    """``bias`` is a float32 constant of ``x``'s last dim (what the bias inputs of the kernels take)."""
    result = pattern.MatchResult()
    dims, b = dims_of(x), dims_of(bias)
    if const(bias) is None or b is None or len(b) != 1 or dims is None or dims[-1] != b[0]:
        return result.fail("the bias is not a constant of the last dim")
    return result if float32(x, bias) else result.fail("float32 only")


_TANH_SCALE = math.sqrt(2.0 / math.pi)


class FastGelu(pattern.RewriteRuleClassBase):
    """``x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``, in the orders torch's gelu and
    GPT-2's gelu_new spell it -> FastGelu."""

    def __init__(self, name: str, half_first: bool) -> None:
        super().__init__(name)
        self._half_first = half_first

    def pattern(self, op, x, three, k, c, one, half):
        def either(f, a, b, tag):  # a commutative op, its operands in either order
            return pattern.OrValue([f(a, b), f(b, a)], tag_var=tag)

        cube = either(op.Mul, k, op.Pow(x, three), "cube_order")
        inner = either(op.Mul, c, either(op.Add, x, cube, "sum_order"), "scale_order")
        t = either(op.Add, op.Tanh(inner), one, "one_order")
        if self._half_first:  # gelu_new: (0.5 * x) * (1 + tanh(...))
            return op.Mul(either(op.Mul, x, half, "half_order"), t)
        return op.Mul(x, either(op.Mul, half, t, "half_order"))  # torch: x * (0.5 * (tanh(...) + 1))

    def check(self, context, x, three, k, c, one, half, **_):
        result = pattern.MatchResult()
        constants = ((three, 3.0), (k, 0.044715), (c, _TANH_SCALE), (one, 1.0), (half, 0.5))
        if not all(close_to(value, expected, 1e-5) for value, expected in constants):
            return result.fail("not the tanh GELU's constants")
        return result if float32(x) else result.fail("float32 only")

    def rewrite(self, op, x, **_):
        return op.FastGelu(x, _domain=CONTRIB_DOMAIN)


class FastGeluBias(pattern.RewriteRuleClassBase):
    """``FastGelu(x + bias)`` with a 1-D constant bias -> FastGelu(x, bias)."""

    def pattern(self, op, x, bias):
        return op.FastGelu(op.Add(x, bias), _domain=CONTRIB_DOMAIN)

    def check(self, context, x, bias, **_):
        return _check_bias(x, bias)

    def rewrite(self, op, x, bias):
        return op.FastGelu(x, bias, _domain=CONTRIB_DOMAIN)


class QuickGelu(pattern.RewriteRuleClassBase):
    """``x * sigmoid(alpha * x)`` (SiLU: alpha 1) -> QuickGelu."""

    def __init__(self, name: str, sigmoid_first: bool) -> None:
        super().__init__(name)
        self._sigmoid_first = sigmoid_first

    def pattern(self, op, x, alpha):
        scaled = pattern.OrValue([op.Mul(x, alpha), op.Mul(alpha, x), x], tag_var="form")
        return op.Mul(op.Sigmoid(scaled), x) if self._sigmoid_first else op.Mul(x, op.Sigmoid(scaled))

    def check(self, context, x, form=None, alpha=None, **_):
        result = pattern.MatchResult()
        self._alpha = 1.0 if alpha is None else scalar(alpha)
        if self._alpha is None:
            return result.fail("alpha is not a constant")
        return result if float32(x) else result.fail("float32 only")

    def rewrite(self, op, x, **_):
        return op.QuickGelu(x, alpha=float(self._alpha), _domain=CONTRIB_DOMAIN)
