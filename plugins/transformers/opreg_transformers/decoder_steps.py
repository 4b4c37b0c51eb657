"""The modules :mod:`opreg_transformers.decoders` exports, each a ``torch.nn.Module`` around the
transformers model that takes and returns optimum's names. Imports torch: imported by a
component's build step."""

from __future__ import annotations

import torch


class WithoutCache(torch.nn.Module):
    """A causal LM with its cache off: ``forward(input_ids, attention_mask, position_ids=None)``
    -> ``{"logits"}`` (the model's own ``forward``, ``use_cache=False``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        extra = {} if position_ids is None else {"position_ids": position_ids}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra)
        return {"logits": out.logits}
