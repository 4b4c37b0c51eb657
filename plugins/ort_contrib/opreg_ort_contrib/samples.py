"""Small models in which each of the pack's rewrite rules fires, for the conformance kit.

``opreg_rewrite_samples`` returns them; ``opreg.testing.check_pack`` exports each at
every target the rule is offered for, checks that the rule fired and compares the
model with eager PyTorch. Imported only by that hook (it imports torch).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from opreg.testing import ModelSample, Sample

HIDDEN, HEADS, KV_HEADS, SEQ, VOCAB = 32, 4, 2, 6, 48
SIZE = HIDDEN // HEADS


def _split(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, seq, heads * size) -> (batch, heads, seq, size), as transformers models write it."""
    batch, seq, _ = x.shape
    return x.view(batch, seq, heads, -1).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    batch, _, seq, _ = x.shape
    return x.transpose(1, 2).reshape(batch, seq, -1)


def _repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """transformers' repeat_kv: (batch, kv heads, seq, size) -> (batch, kv heads * times, seq, size)."""
    batch, heads, seq, size = x.shape
    return x[:, :, None].expand(batch, heads, times, seq, size).reshape(batch, heads * times, seq, size)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's (and Cohere's) rotation of interleaved pairs."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _grouped_attention_weights(module: nn.Module, hidden: int, heads: int, kv_heads: int, size: int) -> None:
    """Give ``module`` Llama's q/k/v/o projections (no bias) for ``heads`` query heads and ``kv_heads``
    key/value heads of ``size``, and the rotary frequencies ``inv_freq`` (base 10000)."""
    module.q = nn.Linear(hidden, heads * size, bias=False)
    module.k = nn.Linear(hidden, kv_heads * size, bias=False)
    module.v = nn.Linear(hidden, kv_heads * size, bias=False)
    module.o = nn.Linear(heads * size, hidden, bias=False)
    module.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, size, 2).float() / size), persistent=False)


class GroupedSelfAttention(nn.Module):
    """Llama's attention: q/k/v projections, rotary embedding of q and k, repeat_kv, sdpa with a mask."""

    def __init__(self, rotary: bool = True, interleaved: bool = False) -> None:
        super().__init__()
        self.interleaved = interleaved
        _grouped_attention_weights(self, HIDDEN, HEADS, KV_HEADS, SIZE)
        self.rotary = rotary

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = _split(self.q(x), HEADS), _split(self.k(x), KV_HEADS), _split(self.v(x), KV_HEADS)
        if self.rotary:
            # positions counted from the mask's last row (0..seq-1 under a causal mask): a runtime value, as a
            # model's position_ids are; an arange of the static length would fold into constant tables
            positions = mask[:1, 0, -1].to(torch.float32).cumsum(-1) - 1
            freqs = (self.inv_freq[None, :, None] @ positions[:, None, :]).transpose(1, 2)
            if self.interleaved:
                angles, rotate = torch.repeat_interleave(freqs, 2, dim=-1), _rotate_every_two
            else:
                angles, rotate = torch.cat((freqs, freqs), dim=-1), _rotate_half
            cos, sin = angles.cos()[:, None], angles.sin()[:, None]
            q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
        k, v = _repeat_kv(k, HEADS // KV_HEADS), _repeat_kv(v, HEADS // KV_HEADS)
        return self.o(_merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


class SectionRotaryAttention(GroupedSelfAttention):
    """Qwen2-VL's 3-D rotary: three position streams (temporal, height, width), each section of the
    frequencies rotated by its own stream's cos/sin (transformers' multimodal rotary), the table
    ``cat(c, c)`` of the sections picked after the cos is taken."""

    SECTIONS = (1, 2, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = _split(self.q(x), HEADS), _split(self.k(x), KV_HEADS), _split(self.v(x), KV_HEADS)
        positions = mask[:1, 0, -1].to(torch.float32).cumsum(-1) - 1  # a runtime value (see the parent)
        streams = torch.stack((positions, positions // 2, positions * 3 % 5))  # (3, batch, seq)
        freqs = (self.inv_freq[None, None, :, None] @ streams[:, :, None, :]).transpose(2, 3)  # (3, batch, seq, half)
        halves = []
        for table in (freqs.cos(), freqs.sin()):
            pieces = table.split(list(self.SECTIONS), dim=-1)
            picked = torch.cat([piece[i % 3] for i, piece in enumerate(pieces)], dim=-1)
            halves.append(torch.cat((picked, picked), dim=-1)[:, None])
        cos, sin = halves
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = _repeat_kv(k, HEADS // KV_HEADS), _repeat_kv(v, HEADS // KV_HEADS)
        return self.o(_merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


class BiasedSelfAttention(nn.Module):
    """BERT's self-attention: q/k/v projections of one input, with biases, as many key/value heads
    as query heads, sdpa with a mask (PackedAttention packs the three projections)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (_split(projection(x), HEADS) for projection in (self.q, self.k, self.v))
        return _merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


class CachedAttention(nn.Module):
    """A decode step: one query token against keys and values given as (batch, heads, seq, size)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return _merge(F.scaled_dot_product_attention(_split(self.q(x), HEADS), keys, values, attn_mask=mask))


class RMSNorm(nn.Module):
    """Llama's RMSNorm, weight first or last."""

    def __init__(self, weight_first: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(HIDDEN) + 0.5)
        self.weight_first = weight_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normalized = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * normalized if self.weight_first else normalized * self.weight


class TiedHead(nn.Module):
    """A language model's head tied to its embedding table: the Gather and the head read the one
    table, which is stored as it is (opreg stores only a weight read through a Transpose alone
    transposed), so the head is FusedMatMul(transB=1) on it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(torch.tanh(self.embed(ids)), self.embed.weight)


class Activation(nn.Module):
    """A linear layer (with bias) and an activation written as in the models that use it."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.linear, self.kind = nn.Linear(HIDDEN, HIDDEN), kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        c = math.sqrt(2.0 / math.pi)
        if self.kind == "gelu":
            return F.gelu(y)
        if self.kind == "gelu_tanh":
            return F.gelu(y, approximate="tanh")
        if self.kind == "gelu_new":  # GPT-2's NewGELUActivation
            return 0.5 * y * (1.0 + torch.tanh(c * (y + 0.044715 * torch.pow(y, 3.0))))
        if self.kind == "gelu_torch_order":  # torch.onnx's order of the same formula
            return y * (0.5 * (torch.tanh(c * (y + 0.044715 * torch.pow(y, 3.0))) + 1.0))
        if self.kind == "silu":
            return F.silu(y)
        if self.kind == "quick_gelu":  # CLIP's QuickGELU, sigmoid first
            return torch.sigmoid(1.702 * y) * y
        raise ValueError(self.kind)


DECODER_HIDDEN, DECODER_HEADS, DECODER_KV_HEADS = 64, 4, 2
DECODER_SIZE = DECODER_HIDDEN // DECODER_HEADS  # GroupQueryAttention rotates heads of a multiple of 16


class CachedDecoderLayer(nn.Module):
    """A decoder layer's attention with its KV cache as inputs and outputs, as transformers'
    models compute it: positions and a "causal and not padding" mask from a 2-D attention mask
    (left padding), rotary embedding, the cache concatenated, ``repeat_kv``, sdpa."""

    def __init__(self, window: int | None = None) -> None:
        super().__init__()
        self.window = window  # a sliding window: each query sees its last ``window`` positions
        _grouped_attention_weights(self, DECODER_HIDDEN, DECODER_HEADS, DECODER_KV_HEADS, DECODER_SIZE)

    def forward(self, x, attention_mask, past_key, past_value):
        seq, past = x.shape[1], past_key.shape[2]
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -seq:]
        freqs = (self.inv_freq[None, :, None] @ positions[:, None, :].float()).transpose(1, 2)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        q, k = _split(self.q(x), DECODER_HEADS), _split(self.k(x), DECODER_KV_HEADS)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        key, value = torch.cat([past_key, k], 2), torch.cat([past_value, _split(self.v(x), DECODER_KV_HEADS)], 2)
        offset = (past + torch.arange(seq))[:, None] - torch.arange(key.shape[2])[None, :]
        causal = offset >= 0 if self.window is None else (offset >= 0) & (offset < self.window)
        mask = causal[None, None] & attention_mask[:, None, None, :].bool()
        times = DECODER_HEADS // DECODER_KV_HEADS
        out = F.scaled_dot_product_attention(q, _repeat_kv(key, times), _repeat_kv(value, times), attn_mask=mask)
        return self.o(_merge(out)), key, value


def _decoder_sample(window: int | None = None) -> ModelSample:
    """A row of 3 new tokens after a past of 4, left-padded by 5, so its first query sees no key (one
    row: GroupQueryAttention without ``query_seqlens``, what ONNX Runtime 1.30 loads, refuses a batch
    of prompts after a cache)."""
    mask = torch.ones(1, 7, dtype=torch.int64)
    mask[0, :5] = 0
    past = [torch.randn(1, DECODER_KV_HEADS, 4, DECODER_SIZE) for _ in range(2)]
    model = CachedDecoderLayer(window).eval()
    return ModelSample.of(model, torch.randn(1, 3, DECODER_HIDDEN), mask, *past).with_tolerances(1e-4, 1e-5)


class DequantizedLinear(nn.Module):
    """A linear layer whose weight is dequantized from integers in the model, as torchao's weight-only
    configs export: ``(q - zero) * scale`` per group of 32 (``IntxWeightOnlyConfig``), or ``q`` with the
    scale applied to the product (``Int8WeightOnlyConfig``)."""

    def __init__(self, scale_after: bool) -> None:
        super().__init__()
        self.scale_after = scale_after
        low, high = (-128, 128) if scale_after else (-8, 8)
        self.register_buffer("q", torch.randint(low, high, (HIDDEN, 2 * HIDDEN), dtype=torch.int8))
        groups = 1 if scale_after else 2 * HIDDEN // 32
        self.register_buffer("scale", torch.rand(HIDDEN, groups) * 0.1 + 0.01)
        self.register_buffer("zero", torch.randint(-2, 3, (HIDDEN, groups), dtype=torch.int8))

    def forward(self, x):
        if self.scale_after:
            return (x @ self.q.t().float()) * self.scale.flatten()
        grouped = self.q.view(HIDDEN, -1, 32).float() - self.zero[..., None].float()
        return F.linear(x, (grouped * self.scale[..., None]).view(HIDDEN, -1))


def _causal_mask(batch: int = 2, seq: int = SEQ) -> torch.Tensor:
    """A causal mask with the first row's last two keys padded away."""
    mask = torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch, 1, seq, seq).clone()
    mask[0, ..., -2:] = False
    mask[0, :, -2:, -2:] = torch.eye(2, dtype=torch.bool)  # padded queries still see themselves
    return mask


def samples() -> dict[str, list[ModelSample]]:
    """``{rule name: [ModelSample, ...]}`` for every rule in :mod:`opreg_ort_contrib.fusions`."""
    torch.manual_seed(0)
    x = torch.randn(2, SEQ, HIDDEN)
    attention = ModelSample.of(GroupedSelfAttention().eval(), x, _causal_mask()).with_tolerances(1e-4, 1e-5)
    plain_attention = ModelSample.of(GroupedSelfAttention(rotary=False).eval(), x, _causal_mask())
    cache = 9
    decode = ModelSample.of(
        CachedAttention().eval(), torch.randn(2, 1, HIDDEN), torch.randn(2, HEADS, cache, SIZE),
        torch.randn(2, HEADS, cache, SIZE), torch.rand(2, 1, 1, cache) > 0.3,
    ).with_tolerances(1e-4, 1e-5)  # fmt: skip

    def activation(kind: str) -> list[ModelSample]:
        return [ModelSample.of(Activation(kind).eval(), x).with_tolerances(1e-4, 1e-5)]

    return {
        "GroupedAttention": [attention],
        "GroupQueryAttention": [plain_attention.with_tolerances(1e-4, 1e-5)],
        "AttentionOnHeads": [decode],
        "MultiHeadAttentionOnHeads": [decode],
        "RotaryEmbedding": [
            attention,
            ModelSample.of(SectionRotaryAttention().eval(), x, _causal_mask()).with_tolerances(1e-4, 1e-5),
        ],
        "InterleavedRotaryEmbedding": [
            ModelSample.of(GroupedSelfAttention(interleaved=True).eval(), x, _causal_mask()).with_tolerances(1e-4, 1e-5)
        ],
        "RMSNormalization": [ModelSample.of(RMSNorm(weight_first=True).eval(), x).with_tolerances(1e-4, 1e-5)],
        "RMSNormalizationWeightLast": [
            ModelSample.of(RMSNorm(weight_first=False).eval(), x).with_tolerances(1e-4, 1e-5)
        ],
        "PackedAttention": [
            ModelSample.of(BiasedSelfAttention().eval(), x, _causal_mask()).with_tolerances(1e-4, 1e-5),
            ModelSample.of(BiasedSelfAttention().eval(), x, torch.rand(2, 1, 1, SEQ) > 0.3).with_tolerances(1e-4, 1e-5),
        ],
        "FastGelu": activation("gelu_torch_order"),
        "FastGeluHalfFirst": activation("gelu_new"),
        "BiasGelu": activation("gelu"),
        "FastGeluBias": activation("gelu_tanh"),
        "QuickGelu": activation("silu"),
        "QuickGeluSigmoidFirst": activation("quick_gelu"),
        "FusedMatMul": [
            ModelSample.of(TiedHead().eval(), torch.randint(0, VOCAB, (2, SEQ))).with_tolerances(1e-4, 1e-5)
        ],
        "GroupQueryAttentionOnCache": [_decoder_sample()],
        # RotaryInsideAttention is offered only at a target naming ONNX Runtime 1.32+ (policy.WITH_QUERY_LENGTHS),
        # which the kit does not export at: tests/test_decoder.py drives it
        "PackedQKV": [_decoder_sample()],
        "TorchaoWeights": [
            ModelSample.of(DequantizedLinear(scale_after=False).eval(), torch.randn(2, 3, 2 * HIDDEN)),
            ModelSample.of(DequantizedLinear(scale_after=True).eval(), torch.randn(2, 3, 2 * HIDDEN)),
        ],
    }


def op_samples() -> dict[str, list[Sample]]:
    """Samples for the pack's sdpa impls: what they take (no dropout, 4-D), each mask kind,
    causal, a scale, grouped heads, and a query shorter than the keys. PyTorch's OpInfo
    samples are mostly dropout or 3-D, which the impls leave to the core pack."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, HEADS, SEQ, SIZE) for _ in range(3))
    kv = (torch.randn(2, KV_HEADS, SEQ, SIZE), torch.randn(2, KV_HEADS, SEQ, SIZE))
    long_k, long_v = torch.randn(2, HEADS, SEQ + 3, SIZE), torch.randn(2, HEADS, SEQ + 3, SIZE)
    return {
        "aten::scaled_dot_product_attention": [
            Sample.of(q, k, v),
            Sample.of(q, k, v, is_causal=True),
            Sample.of(q, k, v, attn_mask=_causal_mask()),
            Sample.of(q, k, v, attn_mask=torch.randn(SEQ, SEQ), scale=0.3),
            Sample.of(q, *kv, is_causal=True, enable_gqa=True),
            Sample.of(q, *kv, attn_mask=_causal_mask(), enable_gqa=True),
            Sample.of(q, long_k, long_v, attn_mask=torch.rand(2, 1, SEQ, SEQ + 3) > 0.3),
        ]
    }
