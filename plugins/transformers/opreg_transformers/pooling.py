"""A sentence-transformers pipeline as one torch module: the folder's transformers encoder, then its
``Pooling`` (every mode sentence-transformers 6 has) and ``Normalize``, computed as
``sentence_transformers.sentence_transformer.modules.pooling.Pooling._forward_padded`` computes them
(the first and last tokens taken where the attention mask says they are, so left padding works).

Imports torch: :mod:`opreg_transformers.sentence`'s build step imports it. The library itself is not
needed; ``bench/sentence_transformers_check.py`` compares with it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _cls(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    first = mask.to(torch.int32).argmax(dim=1)
    return torch.gather(tokens, 1, first.view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])).squeeze(1)


def _max(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return tokens.masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values


def _sums(tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weights = mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * weights).sum(dim=1), torch.clamp(weights.sum(dim=1), min=1e-9)


def _mean(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    total, count = _sums(tokens, mask)
    return total / count


def _mean_sqrt_len(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    total, count = _sums(tokens, mask)
    return total / torch.sqrt(count)


def _weighted_mean(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(1, tokens.shape[1] + 1, dtype=tokens.dtype).view(1, -1, 1)
    padding = mask.to(torch.int32).argmax(dim=1).to(tokens.dtype).view(-1, 1, 1)  # left padding shifts weights
    weights = mask.unsqueeze(-1).to(tokens.dtype) * (positions - padding)
    return (tokens * weights).sum(dim=1) / torch.clamp(weights.sum(dim=1), min=1e-9)


def _last_token(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    length = tokens.shape[1]
    values, indices = mask.to(torch.int32).flip(1).max(1)
    indices = torch.where(values == 0, length - 1, indices)
    index = (length - indices - 1).view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])
    return torch.gather(tokens * mask.unsqueeze(-1).to(tokens.dtype), 1, index).squeeze(1)


MODES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cls": _cls,
    "max": _max,
    "mean": _mean,
    "mean_sqrt_len_tokens": _mean_sqrt_len,
    "weightedmean": _weighted_mean,
    "lasttoken": _last_token,
}
"""sentence-transformers' pooling modes, by the names its ``1_Pooling/config.json`` gives them."""


class SentenceEmbedding(torch.nn.Module):
    """``input_ids``, ``attention_mask`` -> ``token_embeddings`` (the encoder's last hidden state) and
    ``sentence_embedding`` (each mode's pooling, concatenated in order, then L2-normalised if asked)."""

    def __init__(self, encoder: torch.nn.Module, modes: tuple[str, ...], normalize: bool) -> None:
        super().__init__()
        self.encoder, self.modes, self.normalize = encoder, modes, normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        tokens = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = torch.cat([MODES[mode](tokens, attention_mask) for mode in self.modes], dim=-1)
        if self.normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        return {"token_embeddings": tokens, "sentence_embedding": pooled}
