"""Graph-level rewrites for the `onnxruntime` target: patterns that span several ops.

Each rule is an onnxscript ``RewriteRule`` that opreg applies after translation and
the lean pass (see ``opreg_rewrite_rules`` in docs/writing-packs.md), one module per family
(:mod:`.attention`, :mod:`.packed`, :mod:`.rotary`, :mod:`.activations`; onnxscript's, adapted,
in :mod:`.maintained`; what GroupQueryAttention takes over, :mod:`.gqa`). Which ones the pack
offers, and for which targets, is one declared table, :data:`opreg_ort_contrib.fusions.policy.POLICY`; why each is there (or is not) is
measured by ``bench/ort_contrib.py`` (and, for a decoder, ``bench/llm.py``) on ONNX
Runtime's CPU build.

onnxscript's maintained rules, where they do what the pack's own did (the same nodes fused
on BERT, GPT-2 and Llama), under the pack's names and float32 only (:mod:`.maintained`):

- ``RMSNormalization``, ``RMSNormalizationWeightLast``: ``x * rsqrt(mean(x**2) + eps) *
  weight`` becomes ai.onnx ``RMSNormalization`` (opset 23) (``rules.fusion``'s RmsNormFusion).
- ``BiasGelu``: ``Gelu(x + bias)`` (erf) becomes BiasGelu (``ort_fusions``' BiasGeluFusion).
- ``FusedMatMul``: ``MatMul(x, Transpose(y))`` becomes ``FusedMatMul(x, y, transB=1)``: as fast
  in whole models (0.99-1.00x), and a weight keeps its ``state_dict`` layout and name, with no
  Transpose left in the graph (``ort_fusions``' TransposeMatMul2).

The pack's own, which onnxscript's rules do not match in opreg's graphs, each measured:

- ``GroupQueryAttention``: transformers' ``repeat_kv`` (Unsqueeze, Expand, Reshape
  of the key/value heads) feeding a MultiHeadAttention becomes GroupQueryAttention
  on the unrepeated heads: no copies of the keys and values (onnxscript's GQA fusion reads
  torch.onnx's SDPA and com.microsoft RotaryEmbedding, which opreg does not emit).
- ``RotaryEmbedding``: ``x * cos + rotate_half(x) * sin`` with the cos/sin of
  duplicated frequencies (``cat(freqs, freqs)``, as every RoPE model computes them, scaled or
  not) becomes ai.onnx ``RotaryEmbedding`` (opset 23), fed the cos/sin of the frequencies
  themselves, on the (batch, seq, hidden) heads before they are moved first when it can: the
  projection they were split off, or the heads merged when something acts on them between
  (Qwen3's and LFM2's per-head norms); the attention kernel can then take them directly
  (onnxscript's RotaryEmbedding23 wants the cos/sin unscaled and the heads split).
- ``InterleavedRotaryEmbedding``: the same for interleaved pairs (GPT-J's ``rotate_every_two``,
  Cohere's: ``stack(-x[..., 1::2], x[..., ::2]).flatten(-2)``, cos/sin of ``repeat_interleave(f, 2)``),
  with ``interleaved=1``. Where the tables are ``cat(c, c)`` of a cos already taken (Qwen2-VL's
  3-D rotary picks each section of ``c`` from another position stream), ``c`` itself is the
  kernel's per-token cos (not interleaved).
- ``PackedAttention``: the q, k and v projections (MatMul + Add) of one input feeding a
  MultiHeadAttention become com.microsoft ``Attention`` on the packed weights (:mod:`.packed`;
  onnxscript's ``FuseBiasMHA`` + ``AttentionFusion`` in one match).
- ``UngroupedBias``, at ``onnxruntime==1.18`` and ``==1.20`` only: GroupQueryAttention with an
  ``attention_bias`` (a masked ``enable_gqa`` sdpa, or ``repeat_kv`` before a masked one), which those
  releases do not load (9 inputs), becomes MultiHeadAttention on the keys and values repeated to the
  query's heads; ``BiasPerHead`` then expands its bias.
- ``BiasPerHead``, at ``onnxruntime==1.18`` and ``==1.20`` only: MultiHeadAttention's
  ``attention_bias`` of one head for all expanded to its heads, which those releases need
  (1.18 refuses the shared head, 1.20 computes it wrong). The kit's targets name no release,
  so ``tests/test_older_runtimes.py`` checks it, in venvs of those releases.
- ``GroupedAttention``, ``AttentionOnHeads``, ``MultiHeadAttentionOnHeads``: the same
  for ai.onnx Attention (``kv_num_heads``), and the attention kernels reading a KV cache
  in its (batch, heads, seq, size) layout instead of a moved copy of it.
- ``FastGelu``, ``FastGeluHalfFirst`` (the tanh formula in torch's order and GPT-2's
  ``gelu_new``'s, neither of which onnxscript's GeluTanhFusion matches), ``FastGeluBias`` (a
  bias added before it), ``QuickGelu`` (``x * sigmoid(alpha * x)``, SiLU being alpha 1).

Then the passes of a decoder (:mod:`opreg_ort_contrib.kv_cache`, :mod:`.gqa`)
and of weights quantized in PyTorch (:class:`opreg_ort_contrib.torchao.TorchaoWeights`).

Measured and left out: SkipLayerNormalization and SkipSimplifiedLayerNormalization,
slower than the kernels they replace (see ``RMSNormalization``; the exporter writes a residual
``Add`` read by a LayerNormalization as ``Sum`` at every target, so that ONNX Runtime does not fuse
the two into SkipLayerNormalization at load: ``opreg.exporter.passes.lean.ResidualSums``).

All of them are exact but for rounding (the kernels sum in another order): each is
checked against eager PyTorch by the conformance kit (``samples.py``) and the tests.
"""

from __future__ import annotations

from opreg_ort_contrib.fusions.policy import rules

__all__ = ["rules"]
