"""Capture patches for transformers' model code that torch.export cannot capture
(:func:`opreg_transformers.opreg_capture_patches`).

``rt_detr_batch_len``: ``RTDetrModel.forward`` reads its batch size as ``len(source_flatten)``, and
``len()`` must return a Python int, so torch.export specializes the batch to the example's. While
it captures, the patch gives ``modeling_rt_detr`` a module-level ``len`` that answers
``tensor.shape[0]`` (a symbolic size) for a tensor and defers to the builtin for anything else; on
exit the name is removed and the builtin is the module's ``len`` again.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator
from typing import Any

import opreg

MODELING = "transformers.models.rt_detr.modeling_rt_detr"
VERSIONS = "transformers>=5.0"


def _first_dim_len(value: Any) -> Any:
    """``len(value)``, as ``value.shape[0]`` for a tensor (which stays symbolic in a capture)."""
    import torch

    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.shape[0]
    return builtins.len(value)


@contextlib.contextmanager
def rt_detr_batch_len() -> Iterator[None]:
    """Shadow ``len`` in RT-DETR's modeling module for the block (:func:`_first_dim_len`)."""
    import importlib

    module = importlib.import_module(MODELING)
    module.len = _first_dim_len  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del module.len  # type: ignore[attr-defined]


PATCHES = (
    opreg.CapturePatch(
        name="rt_detr_batch_len",
        module=MODELING,
        function="RTDetrModel.forward",
        versions=VERSIONS,
        context=rt_detr_batch_len,
        used_by=("transformers.models.rt_detr",),  # not every transformers model: importing it imports torchvision
        reason="RTDetrModel.forward takes len() of the batch's features, which fixes the batch; the patch makes "
        "len() of a tensor its shape[0]",
    ),
)
"""What :func:`opreg_transformers.opreg_capture_patches` offers."""
