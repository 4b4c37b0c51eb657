"""Capture patches for transformers' model code that torch.export cannot capture
(:func:`opreg_transformers.opreg_capture_patches`).

``rt_detr_batch_len``: ``RTDetrModel.forward`` reads its batch size as ``len(source_flatten)``, and
``len()`` must return a Python int, so torch.export specializes the batch to the example's. While
it captures, the patch gives ``modeling_rt_detr`` a module-level ``len`` that answers
``tensor.shape[0]`` (a symbolic size) for a tensor and defers to the builtin for anything else; on
exit the name is removed and the builtin is the module's ``len`` again. ``rt_detr_v2_batch_len``
does the same for RT-DETRv2's model, whose ``forward`` reads its batch size the same way (as
D-FINE's does: left out, its export fails on ``F.linear`` of a 1-D weight, which core's impl does
not take).
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import opreg

FAMILIES = {"rt_detr": "RTDetrModel", "rt_detr_v2": "RTDetrV2Model"}
"""``{transformers model package: the model whose forward takes len() of the batch}``."""
VERSIONS = "transformers>=5.0"


def _first_dim_len(value: Any) -> Any:
    """``len(value)``, as ``value.shape[0]`` for a tensor (which stays symbolic in a capture)."""
    import torch

    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.shape[0]
    return builtins.len(value)


def _modeling(package: str) -> str:
    return f"transformers.models.{package}.modeling_{package}"


def batch_len(package: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The context that shadows ``len`` in ``package``'s modeling module for its block (:func:`_first_dim_len`)."""

    @contextlib.contextmanager
    def shadowed() -> Iterator[None]:
        import importlib

        module = importlib.import_module(_modeling(package))
        module.len = _first_dim_len  # type: ignore[attr-defined]
        try:
            yield
        finally:
            del module.len  # type: ignore[attr-defined]

    return shadowed


PATCHES = tuple(
    opreg.CapturePatch(
        name=f"{package}_batch_len",
        module=_modeling(package),
        function=f"{model}.forward",
        versions=VERSIONS,
        context=batch_len(package),
        used_by=(f"transformers.models.{package}",),  # not every transformers model: importing it imports torchvision
        reason=f"{model}.forward takes len() of the batch's features, which fixes the batch; the patch makes "
        "len() of a tensor its shape[0]",
    )
    for package, model in FAMILIES.items()
)
"""What :func:`opreg_transformers.opreg_capture_patches` offers."""
