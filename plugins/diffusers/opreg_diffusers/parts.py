"""The pipeline's models, each loaded once from its folder (:class:`Parts`): for its export, and for
the eager pipeline the loop check compares with.

Imports torch and the model's library when a model is first asked for, not before.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import opreg
from opreg_diffusers import weights


class Parts:
    """The pipeline's models, each loaded once (for its export, and for the eager pipeline the loop
    check compares with), in float32 as optimum exports them by default.

    ``entries`` maps a component's name to its ``(library, class)`` in ``model_index.json``.
    """

    def __init__(self, checkpoint: opreg.Checkpoint, entries: Mapping[str, tuple[str, str]]) -> None:
        self.checkpoint = checkpoint
        self.entries = dict(entries)
        self.loaded: dict[str, Any] = {}

    def model(self, name: str) -> Any:
        """The model ``name`` (``"unet"``), loaded from its folder on first use."""
        if name not in self.loaded:
            library, class_name = self.entries[name]
            import torch

            kind = getattr(importlib.import_module(library), class_name)
            folder = self.checkpoint.file(name)
            precision = {"dtype" if library == "transformers" else "torch_dtype": torch.float32}
            variant = weights.variant(self.checkpoint, name)
            self.loaded[name] = kind.from_pretrained(folder, variant=variant, **precision).eval()
        return self.loaded[name]
