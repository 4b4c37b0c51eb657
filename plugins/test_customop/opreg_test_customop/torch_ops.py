"""The torch side: ``mylibrary::addandround_op(x) = round(x + x)``."""

from __future__ import annotations

import torch


@torch.library.custom_op("mylibrary::addandround_op", mutates_args=())
def addandround_op(tensor_x: torch.Tensor) -> torch.Tensor:
    return torch.round(tensor_x + tensor_x)


@addandround_op.register_fake
def _(tensor_x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor_x)
