"""A timm model as its ONNX model takes it: ``forward(pixel_values)`` (timm's models take ``x``),
returning ``logits``. Imports torch and timm: imported by the loader's build step only."""

from __future__ import annotations

from pathlib import Path

import timm
import torch


class Classifier(torch.nn.Module):
    """``model`` behind optimum's input name."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    @classmethod
    def from_folder(cls, folder: Path) -> Classifier:
        """The model of a timm folder, with its weights (``local-dir:``)."""
        return cls(timm.create_model(f"local-dir:{folder}", pretrained=True)).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values)
