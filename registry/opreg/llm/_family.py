"""A family of language models, as a value: :class:`Family`, and :class:`Request`, what its
export is handed once every check before it is done (:mod:`opreg.llm._export`).

A family is one kind of folder ONNX Runtime GenAI runs (a causal LM's decoder, Whisper's encoder
and decoder, a vision-language model's three models). :mod:`opreg.llm._families` lists them; the
command line and :func:`opreg.llm.export_checkpoint` pick one by its ``serves`` and call its
``export``, which returns an :class:`opreg.llm.ExportedModel`, without knowing which they hold.
torch-free (the families' modules are imported by :mod:`opreg.llm._families`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opreg.llm._result import ExportedModel
    from opreg.llm._settings import LLMSettings
    from opreg.settings import ExportSettings


@dataclasses.dataclass(frozen=True)
class Family:
    """One kind of model folder :mod:`opreg.llm` writes.

    Fields:
        key: how :class:`opreg.llm.LLMSettings`' options name it (``"causal"``: an option's
            ``families``; :data:`opreg.llm._settings.FAMILIES` says what it exports, in messages:
            :attr:`name`).
        function: its :mod:`opreg.llm` function (``"export_decoder"``), named in messages.
        auto_class: the transformers ``Auto*`` class that loads its checkpoints.
        serves: whether a model of a config is of this family.
        export: its export, ``export(request) -> ExportedModel``; it writes no folder.
        quantization: the quantization settings it uses where the options give none
            (:attr:`opreg.llm._settings.Option.quantizes`); empty: the quantization pass's defaults.
        layouts: the folder layouts it writes (:data:`opreg.llm._settings.LAYOUTS`); another is refused.
    """

    key: str
    function: str
    auto_class: str
    serves: Callable[[Any], bool]
    export: Callable[[Request], ExportedModel]
    quantization: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    layouts: tuple[str, ...] = ("genai",)

    @property
    def name(self) -> str:
        """What the family exports, in messages (``"causal LM"``)."""
        from opreg.llm._settings import FAMILIES

        return FAMILIES[self.key]


@dataclasses.dataclass(frozen=True)
class Request:
    """What a family's export is handed: a model or checkpoint its family serves, and options
    checked against it.

    Fields:
        family: the :class:`Family` exporting it.
        model: the transformers model given, or ``None`` for a checkpoint folder (:meth:`load`).
        folder: the checkpoint folder, or ``None`` for a model given.
        config: the model's transformers config (a folder's, read from its ``config.json``).
        settings: the :class:`opreg.llm.LLMSettings`, ``context_length`` the one checked against
            the model's position limit and ``tokenizer`` what to save (the folder's, when it has
            one).
        export: the :class:`opreg.ExportSettings` of every model's export: the registry built, the
            target resolved (an :class:`opreg.Target`), the caller's passes.
    """

    family: Family
    model: Any
    folder: Path | None
    config: Any
    settings: LLMSettings
    export: ExportSettings

    def load(self) -> Any:
        """The model: the one given, else the checkpoint loaded in float32 by the family's Auto class."""
        if self.model is not None:
            return self.model
        from opreg.llm._checkpoint import load_model

        return load_model(self.folder, self.family.auto_class, self.family.name)

    def quantized(self, embeddings: bool = False, stored: str | None = None) -> ExportSettings:
        """:attr:`export` with the pass that gives the linear layers' weights the precision, after
        the caller's passes (``embeddings``: the pass for an embedding table no linear layer reads;
        ``stored``: a quantized checkpoint, named, whose stored integers a pass writes first)."""
        from opreg.llm._precision import with_precision

        return with_precision(self.export, self.settings, self.family.quantization, embeddings, stored)
