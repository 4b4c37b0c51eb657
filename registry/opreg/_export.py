"""``opreg.export``, the entry point: it imports the exporter (and torch) on its first call;
``import opreg`` imports this module when ``opreg.export`` is first used."""

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opreg.settings import ExportSettings, takes_settings

if TYPE_CHECKING:
    from opreg.exporter import OnnxProgram

__all__ = ["export"]


@takes_settings()
def export(
    model: Any, args: tuple = (), kwargs: Mapping[str, Any] | str | os.PathLike[str] | None = None, *,
    settings: ExportSettings | None = None,
    **options: Any,
) -> "OnnxProgram":  # fmt: skip
    """Export a PyTorch module to ONNX through the registry: :func:`opreg.exporter.export`.

    The keyword options are the fields of :class:`ExportSettings` (docs/exporting.md, "Keyword
    options"); ``settings=`` takes them prebuilt, keywords given beside it replacing its fields.
    Returns an :class:`opreg.OnnxProgram` with ``model``, ``model_proto``, ``save``, ``run``
    and ``verify``. A file path as the third argument is ``torch.onnx.export``'s ``f``: the model
    is saved there too (``program.save(f)``), so a ``torch.onnx.export(model, args, f, ...)`` call
    runs with ``opreg.export``.
    """
    from opreg import _heap

    path = None
    if isinstance(kwargs, (str, os.PathLike)):
        path, kwargs = kwargs, None
    with _heap.quiet():  # from the exporter's import on (opreg/_heap.py)
        from opreg import exporter
        from opreg.exporter._save import check_output_path

        if path is not None:
            check_output_path(path, external_data=False)  # before the export, not after it
        program = exporter.export(model, args, kwargs, settings=settings, **options)
    if path is not None:
        program.save(path)
    return program
