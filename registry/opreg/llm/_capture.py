"""What every family's export does around torch.export: the example's sizes, a step module
exported with its dynamic dims, the model in eval mode while it is captured, and the dims of the
models' inputs and outputs named as ONNX Runtime GenAI names them (a dim torch.export fixed is
an error there, naming it)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import onnx_ir as ir
import torch

from opreg.errors import ExportError
from opreg.exporter import OnnxProgram, export
from opreg.settings import ExportSettings

EXAMPLE = (2, 3, 4)
"""Batch, sequence and past length of the examples a decoder is captured with: none 0 or 1,
which torch.export would specialise."""


def export_shaped(module: torch.nn.Module, args: tuple, settings: ExportSettings, dims: Any,
                  kwargs: dict[str, Any] | None = None) -> OnnxProgram:  # fmt: skip
    """:func:`opreg.export` of ``module`` with ``settings`` and the dynamic shapes ``dims``."""
    return export(module, args, kwargs, settings=dataclasses.replace(settings, dynamic_shapes=dims))


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in ``eval()`` mode while the block runs, its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def set_dims(value: ir.Value, names: Sequence[str | None]) -> None:
    """Name ``value``'s dims ``names`` (``None``: leave the dim as it is), or an
    :class:`opreg.ExportError` where torch.export fixed a dim that must be dynamic."""
    shape = list(value.shape or ())
    if len(shape) != len(names):
        raise ExportError(f"the decoder's {value.name} has shape {shape}, expected {len(names)} dims")
    for index, name in enumerate(names):
        if name is None:
            continue
        if isinstance(shape[index], int):
            raise ExportError(
                f"torch.export fixed dim {index} ({name}) of the decoder's {value.name} at {shape[index]}: the "
                "model's code branches on that length; the decoder would only run at that size"
            )
        shape[index] = ir.SymbolicDim(name)
    value.shape = ir.Shape(shape)
