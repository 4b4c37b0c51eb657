"""Where a pipeline component's weights are: diffusers' and transformers' file names, plain, sharded
(an ``.index.json``) or of a variant (``diffusion_pytorch_model.fp16.safetensors``).

Reads file names only.
"""

from __future__ import annotations

import re

import opreg

STEMS = ("diffusion_pytorch_model", "model", "pytorch_model")
"""diffusers' weight files' stem, and transformers' (safetensors, then the legacy ``.bin``)."""
_WEIGHTS = re.compile(
    r"^(?:" + "|".join(STEMS) + r")(?:\.(?P<variant>[A-Za-z0-9_-]+))?\.(?:safetensors|bin)(?:\.index\.json)?$"
)


def files(checkpoint: opreg.Checkpoint, name: str) -> list[str]:
    """The weight files (or shard indexes) of component ``name``, relative to its folder."""
    folder = checkpoint.file(name)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_file() and _WEIGHTS.match(p.name))


def variant(checkpoint: opreg.Checkpoint, name: str) -> str | None:
    """The variant to load component ``name`` with: ``None`` when its plain weights are there, else
    the variant of the weights it has (``"fp16"``), the first in name order."""
    found = [_WEIGHTS.match(f) for f in files(checkpoint, name)]
    variants = [m.group("variant") for m in found if m is not None]
    if not variants or None in variants:
        return None
    return sorted(variants)[0]
