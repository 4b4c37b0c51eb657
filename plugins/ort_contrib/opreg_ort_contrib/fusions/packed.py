"""The query, key and value projections of one input packed into com.microsoft Attention.

BERT-like self-attention (three ``Linear`` of one hidden state, with biases, then sdpa on as many
key/value heads as query heads) comes out of the sdpa impl as three MatMul + Add feeding a
MultiHeadAttention. ONNX Runtime's Attention kernel takes the input and the three weights packed
(what ``--optimize O2`` of optimum and ``onnxruntime.transformers.optimizer`` write): one GEMM
instead of three, one kernel instead of seven. onnxscript's ``ort_fusions`` make the same node in
two steps (``FuseBiasMHA``, then ``AttentionFusion``); the first alone, the biases moved into
MultiHeadAttention where the second does not follow (cross-attention), measured slower, so the
pack matches the whole at once. The weights are concatenated by a ``Concat`` of the stored ones
(``state_dict`` names kept), which ONNX Runtime folds when the session loads.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from opreg_ort_contrib import CONTRIB_DOMAIN
from opreg_ort_contrib.fusions.values import const, dims_of, float32

CARRIED = ("num_heads", "scale", "unidirectional", "mask_filter_value")
"""MultiHeadAttention's attributes that Attention takes under the same name and meaning."""


class PackedAttention(pattern.RewriteRuleClassBase):
    """``MultiHeadAttention(x @ Wq + bq, x @ Wk + bk, x @ Wv + bv, attention_bias=B)`` ->
    ``Attention(x, [Wq Wk Wv], [bq bk bv], attention_bias=B)`` for constant weights and biases."""

    def pattern(self, op, x, wq, wk, wv, bq, bk, bv):
        query, key, value = (op.Add(op.MatMul(x, w), b) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
        return op.MultiHeadAttention(
            query, key, value, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["out"],
            _domain=CONTRIB_DOMAIN,
        )  # fmt: skip

    def check(self, context, x, wq, wk, wv, bq, bk, bv, out, **_):
        result = pattern.MatchResult()
        node = out.producer()
        extra = list(node.inputs[3:])
        if len(extra) > 3 or any(v is not None for v in extra[:2]) or len(node.outputs) != 1:
            return result.fail("MultiHeadAttention with a packed bias, a key padding mask or a cache")
        if any(name not in CARRIED for name in node.attributes):
            return result.fail("MultiHeadAttention attributes Attention has no counterpart for")
        dims = dims_of(x)
        if dims is None or len(dims) != 3 or not float32(x, wq, wk, wv, bq, bk, bv):
            return result.fail("not a float32 (batch, seq, hidden) input")
        weights, biases = [const(w) for w in (wq, wk, wv)], [const(b) for b in (bq, bk, bv)]
        if any(w is None or w.ndim != 2 or w.shape[0] != dims[2] for w in weights):
            return result.fail("the projections' weights are not constant (hidden, size) matrices")
        if any(b is None or b.shape != (w.shape[1],) for w, b in zip(weights, biases, strict=True)):
            return result.fail("the projections' biases are not constant vectors of their sizes")
        if weights[0].shape[1] != weights[1].shape[1]:
            return result.fail("queries and keys of different sizes (Attention needs them equal)")
        self._sizes = [int(w.shape[1]) for w in weights]
        self._attention_bias = extra[2] if len(extra) == 3 else None
        self._attributes = {a.name: a.value for a in node.attributes.values()}
        return result

    def rewrite(self, op, x, wq, wk, wv, bq, bk, bv, **_):
        return op.Attention(
            x, op.Concat(wq, wk, wv, axis=1), op.Concat(bq, bk, bv, axis=0), None, None, self._attention_bias,
            qkv_hidden_sizes=self._sizes, _domain=CONTRIB_DOMAIN, _outputs=1, **self._attributes,
        )  # fmt: skip
