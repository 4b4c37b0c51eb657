"""``opreg.export_checkpoint`` and ``opreg export FOLDER``: a checkpoint exported as the installed
packs' loaders (``opreg_checkpoint_loaders``) plan it.

Its rooms, bottom to top: :mod:`~opreg.checkpoint.source` (what a SOURCE names: a factory, a
folder, a hub id), :mod:`~opreg.checkpoint.choice` (which loader, which task, its plan),
:mod:`~opreg.checkpoint.inputs` (a component as torch.export takes it; imports torch) and
:mod:`~opreg.checkpoint.run` (the export, the folder written whole, the verification). The values a
loader hands over are in :mod:`opreg.loaderapi`.
"""

from opreg.checkpoint.run import CheckpointExport, ExportedModel, export_checkpoint

__all__ = ["CheckpointExport", "ExportedModel", "export_checkpoint"]
