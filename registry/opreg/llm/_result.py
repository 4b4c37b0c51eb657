"""What every language-model export returns: an :class:`ExportedModel`, whichever its family.

``opreg llm export`` reports any family through this class alone (the models by file name, the
layout's layers, the target, the precision, the files a save wrote); :mod:`opreg.llm`'s
``Decoder``, ``Whisper`` and ``VisionLanguage`` are its subclasses, each adding what its family
has besides (a decoder's ``inputs`` and ``run``, Whisper's ``encode``, a vision-language model's
``generate``). torch-free.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import pathlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opreg.exporter import OnnxProgram, OutputCheck
    from opreg.registry.targets import Target


@dataclasses.dataclass(frozen=True)
class SavedFolder:
    """What a save wrote.

    Fields:
        folder: the model folder.
        files: the names the save wrote in it, sorted (not the entries of an old folder it kept).
    """

    folder: pathlib.Path
    files: tuple[str, ...]


class ExportedModel(abc.ABC):
    """An exported language model: the ONNX models of its family's folder, their layout, and how to
    check them against transformers and write the folder ONNX Runtime GenAI loads.

    Attributes:
        programs: the models by the file name :meth:`save` gives each (:class:`opreg.OnnxProgram`),
            the decoder last.
        layout: the family's layout: the models' input and output names and shapes, as
            ``genai_config.json`` describes them; every layout has ``num_layers``, the decoder's layers.
        model: the transformers model they were exported from (on the ``meta`` device when its
            weights were streamed from the checkpoint).
        precision: the linear layers' weights: ``"fp32"``, ``"int8"`` or ``"int4"``; a quantized
            checkpoint's, the bits its layers store (``"int4"`` for a 4-bit GPTQ checkpoint, whatever
            ``precision`` the export was given: that one quantizes the layers it keeps float).
        stored_format: the quantized checkpoint's format whose integers were written as they are
            (``"GPTQ"``, ``"AWQ"``, ``"compressed-tensors"``), else ``None``.
        target: the :class:`opreg.Target` the models were exported for (the decoder's).
        context_length: the longest sequence ``genai_config.json`` lets GenAI generate.
        tokenizer: what :meth:`save` writes beside the models (a tokenizer, a folder holding one;
            ``None`` or ``False``: none).
        saved: what the last :meth:`save` wrote (``None`` before one).
    """

    layout: Any
    model: Any
    precision: str
    stored_format: str | None = None
    context_length: int
    tokenizer: Any
    saved: SavedFolder | None = None

    @property
    @abc.abstractmethod
    def programs(self) -> dict[str, OnnxProgram]:
        """The models by file name, the decoder last."""

    @property
    def target(self) -> Target:
        """The target the models were exported for: the decoder's."""
        return list(self.programs.values())[-1].target

    @abc.abstractmethod
    def verify(self) -> list[OutputCheck]:
        """Compare every model with the transformers model it came from; raise
        :class:`opreg.VerificationError` listing what differs, else return every check."""

    @abc.abstractmethod
    def genai_config(self) -> dict[str, Any]:
        """``genai_config.json`` for these models."""

    @abc.abstractmethod
    def write_folder(self, folder: str | os.PathLike[str], external_data: bool) -> SavedFolder:
        """Write the family's folder at ``folder`` whole (:mod:`opreg.llm._folder`): what :meth:`save` does."""

    def save(self, folder: str | os.PathLike[str], external_data: bool | None = None) -> pathlib.Path:
        """Write the folder ONNX Runtime GenAI loads: each model of :attr:`programs` (its weights in
        a file beside it, ``<name>.<token>.data``, unless ``external_data`` is ``False``: then
        inside it, up to 2 GB), ``genai_config.json``, the family's processor recipe and the
        tokenizer's files; returns the folder, and keeps it with the names written as :attr:`saved`.

        The folder is written whole: the new one is staged beside it and swapped in at once, so
        at every instant ``folder`` is the complete old folder or the complete new one, even if
        the process is killed (a leftover staging folder is removed by the next save there).
        Entries of the old folder the save does not write are kept. Raises
        :class:`opreg.SaveError` (nothing changed) for a folder that cannot be written, and on
        Ctrl-C or SIGTERM once the new folder is in place :class:`opreg.InterruptedAfterSave`."""
        self.saved = self.write_folder(folder, external_data is not False)
        return self.saved.folder
