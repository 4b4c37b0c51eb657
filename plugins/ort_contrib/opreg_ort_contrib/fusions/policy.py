"""Which rules and passes the pack offers each target: one declared table, :data:`POLICY`, in the order
they are applied. None is offered without com.microsoft 1; the attention rules follow the attention op
the sdpa impl emits at the target's ai.onnx (ai.onnx Attention where ONNX Runtime runs it as a kernel,
:data:`ATTENTION_23`; com.microsoft MultiHeadAttention elsewhere, attention.py), and the rules that make
opset-23 ops need ai.onnx 23."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opreg_ort_contrib import CONTRIB_DOMAIN
from opreg_ort_contrib.fusions.activations import FastGelu, FastGeluBias, QuickGelu
from opreg_ort_contrib.fusions.attention import (
    AttentionOnHeads,
    BiasPerHead,
    GroupedAttention,
    GroupQueryAttention,
    MultiHeadAttentionOnHeads,
    UngroupedBias,
)
from opreg_ort_contrib.fusions.maintained import maintained_rules
from opreg_ort_contrib.fusions.packed import PackedAttention
from opreg_ort_contrib.fusions.rotary import RotaryEmbedding

ATTENTION_23 = range(23, 25)
"""The ai.onnx versions whose Attention ONNX Runtime 1.32 runs as a kernel: there the pack's
sdpa impl emits ai.onnx Attention, elsewhere com.microsoft MultiHeadAttention (attention.py)."""

_MAINTAINED = maintained_rules()

RULES = {
    rule.name: rule
    for rule in (
        GroupedAttention.rule("GroupedAttention"),
        GroupQueryAttention.rule("GroupQueryAttention"),
        AttentionOnHeads.rule("AttentionOnHeads"),
        MultiHeadAttentionOnHeads.rule("MultiHeadAttentionOnHeads"),
        PackedAttention.rule("PackedAttention"),
        UngroupedBias.rule("UngroupedBias"),
        BiasPerHead.rule("BiasPerHead"),
        RotaryEmbedding.rule("RotaryEmbedding"),
        RotaryEmbedding.rule("InterleavedRotaryEmbedding", interleaved=True),
        _MAINTAINED["RMSNormalization"],
        _MAINTAINED["RMSNormalizationWeightLast"],
        FastGelu.rule("FastGelu", half_first=False),
        FastGelu.rule("FastGeluHalfFirst", half_first=True),
        _MAINTAINED["BiasGelu"],
        FastGeluBias.rule("FastGeluBias"),
        QuickGelu.rule("QuickGelu", sigmoid_first=False),
        QuickGelu.rule("QuickGeluSigmoidFirst", sigmoid_first=True),
        _MAINTAINED["FusedMatMul"],
    )
}
"""Every rewrite rule, by name (each made once; a pass is made anew for each export)."""


def _torchao_weights(target) -> Any:
    from opreg_ort_contrib.torchao import TorchaoWeights

    return TorchaoWeights()


def _attention_on_cache(target) -> Any:
    from opreg_ort_contrib.kv_cache import GroupQueryAttentionOnCache

    return GroupQueryAttentionOnCache(query_lengths=_names_release(target, QUERY_LENGTHS))


def _rotary_inside_attention(target) -> Any:
    from opreg_ort_contrib.fusions.gqa import RotaryInsideAttention

    return RotaryInsideAttention()


def _packed_qkv(target) -> Any:
    from opreg_ort_contrib.fusions.gqa import PackedQKV

    return PackedQKV()


def _rule(name: str) -> Callable[[Any], Any]:
    return lambda target: RULES[name]


def _everywhere(onnx: int) -> bool:
    return True


def _ai_onnx_attention(onnx: int) -> bool:
    return onnx in ATTENTION_23


def _contrib_attention(onnx: int) -> bool:
    return onnx not in ATTENTION_23


def _opset_23(onnx: int) -> bool:
    return onnx >= 23


def _above_ai_onnx_attention(onnx: int) -> bool:
    return onnx > max(ATTENTION_23)  # the gqa passes take RotaryEmbedding-23 into GroupQueryAttention


POLICY: tuple[tuple[str, Callable[[Any], Any], Callable[[int], bool]], ...] = (
    ("TorchaoWeights", _torchao_weights, _everywhere),  # first: on the products as the model writes them
    ("GroupedAttention", _rule("GroupedAttention"), _ai_onnx_attention),
    ("GroupQueryAttention", _rule("GroupQueryAttention"), _contrib_attention),
    ("AttentionOnHeads", _rule("AttentionOnHeads"), _ai_onnx_attention),
    ("MultiHeadAttentionOnHeads", _rule("MultiHeadAttentionOnHeads"), _contrib_attention),
    ("PackedAttention", _rule("PackedAttention"), _contrib_attention),
    ("UngroupedBias", _rule("UngroupedBias"), _contrib_attention),  # releases before 1.22 only (OLDER_RELEASE)
    ("BiasPerHead", _rule("BiasPerHead"), _contrib_attention),  # releases before 1.22 only (OLDER_RELEASE)
    ("RotaryEmbedding", _rule("RotaryEmbedding"), _opset_23),
    ("InterleavedRotaryEmbedding", _rule("InterleavedRotaryEmbedding"), _opset_23),
    ("RMSNormalization", _rule("RMSNormalization"), _opset_23),
    ("RMSNormalizationWeightLast", _rule("RMSNormalizationWeightLast"), _opset_23),
    ("FastGelu", _rule("FastGelu"), _everywhere),
    ("FastGeluHalfFirst", _rule("FastGeluHalfFirst"), _everywhere),
    ("BiasGelu", _rule("BiasGelu"), _everywhere),
    ("FastGeluBias", _rule("FastGeluBias"), _everywhere),
    ("QuickGelu", _rule("QuickGelu"), _everywhere),
    ("QuickGeluSigmoidFirst", _rule("QuickGeluSigmoidFirst"), _everywhere),
    ("FusedMatMul", _rule("FusedMatMul"), _everywhere),
    ("GroupQueryAttentionOnCache", _attention_on_cache, _contrib_attention),  # the decoder's attention on its cache
    ("RotaryInsideAttention", _rotary_inside_attention, _above_ai_onnx_attention),
    ("PackedQKV", _packed_qkv, _above_ai_onnx_attention),
)
"""What the pack offers, in the order it is applied: ``(name, make, at)``, ``make(target)`` giving the rule
or pass, ``at(onnx)`` whether a target of that ai.onnx version gets it. A new rule: its class in the module
of its family, its entry in :data:`RULES` and here."""


def rules(target) -> list:
    """The rules and passes for ``target``: none without com.microsoft 1, else those :data:`POLICY`
    offers at its ai.onnx, in its order, but those the target's ONNX Runtime release cannot load
    (:data:`NEWER_RELEASE`), those only older releases need (:data:`OLDER_RELEASE`), and those of
    :data:`WITH_QUERY_LENGTHS` where the target does not name ONNX Runtime 1.32 or newer."""
    if target.get(CONTRIB_DOMAIN) != 1:
        return []
    lengths = _names_release(target, QUERY_LENGTHS)
    return [
        make(target)
        for name, make, at in POLICY
        if at(target.onnx) and _for_release(target, name) and (lengths or name not in WITH_QUERY_LENGTHS)
    ]


QUERY_LENGTHS = (1, 32)
"""The oldest ONNX Runtime release whose GroupQueryAttention takes a 17th input, ``query_seqlens``
(kv_cache.py): the cache rewrite writes it only for a target naming such a release
(``onnxruntime==1.32``); plain ``onnxruntime`` writes the 16 inputs 1.30 loads, so the default
language-model folder loads there (onnxruntime-node 1.30 in transformers.js 4.3)."""

WITH_QUERY_LENGTHS = frozenset({"RotaryInsideAttention"})
"""The passes offered only where GroupQueryAttention takes ``query_seqlens``: without it the kernel rotates
a prompt by 0, 1, 2, ... whatever its positions (a left-padded row's cache would be wrong), so the rotary
stays outside (and PackedQKV splits the packed projection for it: fusions/gqa.py)."""

NEWER_RELEASE = {"PackedAttention": (1, 22)}
"""The passes that make nodes only newer ONNX Runtime releases load, and the oldest such release:
Attention's ``attention_bias`` of one head for all (what the sdpa impl gives it) is refused by
1.18 and computed wrong by 1.20 (MultiHeadAttention's too: 2026-12-07), right from 1.22.
(GroupQueryAttention's 17th input, 1.32's, is written only where the target names 1.32:
:data:`QUERY_LENGTHS`.)"""

OLDER_RELEASE = {"UngroupedBias": (1, 22), "BiasPerHead": (1, 22)}
"""The rules only older ONNX Runtime releases need, and the first release that does without: before
1.22, GroupQueryAttention takes no ``attention_bias`` (9 inputs: a masked ``enable_gqa`` becomes
MultiHeadAttention on repeated keys and values), and MultiHeadAttention gets its ``attention_bias``
expanded to its heads (see NEWER_RELEASE). A
target naming no release (the profile: the installed one) does without them."""


def _for_release(target, name: str) -> bool:
    """Whether the rule or pass ``name`` is for ``target``'s ONNX Runtime release, if it names one."""
    if name in OLDER_RELEASE:
        return _too_old(target, OLDER_RELEASE[name])
    return not _too_old(target, NEWER_RELEASE.get(name))


def _too_old(target, release: tuple[int, int] | None) -> bool:
    """Whether ``target`` names an ONNX Runtime release (``onnxruntime==1.20``) older than ``release``."""
    runtime = getattr(target, "runtime", None)
    if release is None or runtime is None:
        return False
    return tuple(int(part) for part in runtime.split(".")[:2]) < release


def _names_release(target, release: tuple[int, int]) -> bool:
    """Whether ``target`` names an ONNX Runtime release (``onnxruntime==1.32``) of ``release`` or newer;
    the profile alone (``onnxruntime``, the installed release) does not."""
    runtime = getattr(target, "runtime", None)
    if runtime is None or not getattr(target, "named_release", False):
        return False
    return tuple(int(part) for part in runtime.split(".")[:2]) >= release
