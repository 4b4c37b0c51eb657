"""``opreg.export``, the entry point: it imports the exporter (and torch) on its first call;
``import opreg`` imports this module when ``opreg.export`` is first used."""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opreg.settings import ExportSettings, takes_settings

if TYPE_CHECKING:
    from opreg.exporter import OnnxProgram

__all__ = ["export"]


@takes_settings()
def export(
    model: Any, args: tuple = (), kwargs: Mapping[str, Any] | None = None, *, settings: ExportSettings | None = None,
    **options: Any,
) -> "OnnxProgram":  # fmt: skip
    """Export a PyTorch module to ONNX through the registry: :func:`opreg.exporter.export`.

    The keyword options are the fields of :class:`ExportSettings` (docs/exporting.md, "Keyword
    options"); ``settings=`` takes them prebuilt, keywords given beside it replacing its fields.
    Returns an :class:`opreg.OnnxProgram` with ``model``, ``model_proto``, ``save``, ``run``
    and ``verify``.
    """
    from opreg import _heap

    with _heap.quiet():  # from the exporter's import on (opreg/_heap.py)
        from opreg import exporter

        return exporter.export(model, args, kwargs, settings=settings, **options)
