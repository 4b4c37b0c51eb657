"""The checkpoint loaders' plugin API: the plain values a pack's ``opreg_checkpoint_loaders`` hands over.

A pack that knows a library (transformers, sentence-transformers, diffusers, timm, a third party's)
returns :class:`CheckpointLoader` s. For a folder (``opreg export FOLDER``,
:func:`opreg.export_checkpoint`) opreg asks every loader to :attr:`~CheckpointLoader.recognise` it,
a cheap look at its files (:class:`Checkpoint`: JSON read on demand, no torch, no library import),
which answers a :class:`Recognition` (the library, the tasks it can export, the task it infers) or
``None``; the loader chosen (highest ``priority``; a tie is refused unless ``library=`` picks) then
:attr:`~CheckpointLoader.plan` s the export for one task, an :class:`ExportPlan`:

- :class:`Component` s, the models to export, each a ``build`` step returning the
  ``torch.nn.Module`` (it imports the library, loads the weights), its inputs
  (:class:`ModelInput`: name, shape in named dims, dtype, how to fill an example), its
  :class:`DynamicDim` s (example size, a second size to verify at, the range the config allows,
  a multiple), its output names, its file in the folder, its tolerances, and optionally its own
  target and export options;
- :class:`FileCopy` s, the checkpoint's files the runtimes read beside the models (config,
  tokenizer, processor, scheduler);
- :class:`PostStep` s, which combine exported models into another (a merged decoder: two graphs
  into one with an ``If``);
- :class:`LoopCheck` s, which run the written folder as its runtime would (a generation or a
  denoising loop) and compare with the library's own loop;
- or, instead of components, an ``export`` that does the whole export itself (a causal LM's, by
  :func:`opreg.llm.export_checkpoint`): it is handed a :class:`Handover` (the output folder, the
  settings, whether to verify, the ``layout`` asked) and returns a :class:`HandoverResult`.

These are values: this module imports only the standard library and :mod:`opreg.errors`; each
checks its fields when made (an :class:`opreg.InvalidArgumentError` naming the field), so a loader's
mistake is found where it is made. A loader's ``plan`` raises :class:`opreg.CheckpointError` for a
folder it recognises but cannot export (no weights, a config its library cannot build, a missing
component), naming the file and what to do.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from opreg.errors import CheckpointError, InvalidArgumentError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
FILLS = ("ids", "mask", "zeros", "ones", "normal", "uniform", "bbox")
"""How :class:`ModelInput` values are made: ``ids`` random integers in ``[0, high)``; ``mask``
ones, the last row's tail zeros (padding: a mask that is all ones hides wrong masking); ``zeros``,
``ones``; ``normal`` standard normal; ``uniform`` in ``[0, 1)``; ``bbox`` boxes ``(x0, y0, x1, y1)``
along a last dim of 4, corners random integers in ``[0, high)`` with ``x0 <= x1`` and ``y0 <= y1``
(LayoutLM's layout embeddings look up the width and height too)."""
_DTYPES = ("int64", "int32", "bool", "float32", "float16", "bfloat16", "float64")


def _check_name(owner: str, field: str, value: Any) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidArgumentError(f"{owner}: {field} must be an identifier-like string, got {value!r}")


def _check_callable(owner: str, field: str, value: Any) -> None:
    if not callable(value):
        raise InvalidArgumentError(f"{owner}: {field} must be callable, got {type(value).__name__}")


def _check_file(owner: str, field: str, value: Any) -> None:
    """A path relative to the folder written, inside it."""
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in Path(value).parts:
        raise InvalidArgumentError(f"{owner}: {field} must be a relative path inside the folder, got {value!r}")


def _tuple_of(owner: str, field: str, value: Any, kind: type) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, kind) for v in value):
        raise InvalidArgumentError(f"{owner}: {field} must be a tuple of {kind.__name__}, got {value!r}")


def _unique(owner: str, what: str, names: list[str]) -> None:
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidArgumentError(f"{owner}: two {what} are named {twice[0]!r}")


# -- the folder, as a loader sees it ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder, read on demand: what :attr:`CheckpointLoader.recognise` and
    :attr:`~CheckpointLoader.plan` receive.

    Fields:
        path: the folder (for a hub id, the snapshot huggingface_hub gave).
        source: what the user named (the path as given, or the hub id).
    """

    path: Path
    source: str = ""

    def file(self, name: str) -> Path:
        """The path of ``name`` (relative, ``/``-separated) in the folder."""
        return self.path / name

    def has(self, name: str) -> bool:
        """Whether the folder holds the file ``name``."""
        return self.file(name).is_file()

    def json(self, name: str, kind: type = dict) -> Any:
        """The JSON value in file ``name`` (an object, or ``kind``: ``list``), or ``None`` if there is
        no such file; :class:`opreg.CheckpointError` naming the file if it is not JSON of that kind."""
        path = self.file(name)
        if not path.is_file():
            return None
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path} cannot be read as JSON ({e}): fix or replace the file") from e
        if not isinstance(value, kind):
            raise CheckpointError(
                f"{path} holds a JSON {type(value).__name__}, not {'an object' if kind is dict else 'a list'}: "
                "fix or replace it"
            )
        return value

    def files(self) -> tuple[str, ...]:
        """Every file of the folder, relative and ``/``-separated, sorted (hidden ones left out)."""
        return tuple(
            sorted(
                p.relative_to(self.path).as_posix()
                for p in self.path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(self.path).parts)
            )
        )


@dataclasses.dataclass(frozen=True)
class Recognition:
    """A loader's answer to "is this folder yours?" (``None`` means no).

    Fields:
        library: the library whose checkpoint it is (``"transformers"``), as ``library=`` names it.
        tasks: the tasks the loader can export it for, as optimum spells them
            (``"feature-extraction"``, ``"fill-mask"``); ``()`` with ``refusal`` set.
        task: the task inferred from the folder (one of ``tasks``), used when none is asked.
        evidence: what in the folder says so (``config.json: model_type 'bert', architectures
            ['BertForMaskedLM']``), shown to the user.
        refusal: set when the folder is the library's but the loader cannot export it: why, and
            what to do (``model_type 'llama': a causal LM, exported by opreg llm export``).
    """

    library: str
    tasks: tuple[str, ...]
    task: str | None
    evidence: str
    refusal: str = ""

    def __post_init__(self) -> None:
        where = f"Recognition of library {self.library!r}"
        _check_name(where, "library", self.library)
        _tuple_of(where, "tasks", self.tasks, str)
        if self.refusal:
            return
        if not self.tasks:
            raise InvalidArgumentError(
                f"{where}: give the tasks it can export, or a refusal= saying why there are none"
            )
        if self.task not in self.tasks:
            raise InvalidArgumentError(f"{where}: task {self.task!r} is not one of its tasks {self.tasks}")


@dataclasses.dataclass(frozen=True)
class CheckpointLoader:
    """One library's knowledge of its checkpoints, returned by ``opreg_checkpoint_loaders``.

    Fields:
        name: unique within the pack (``label`` is ``pack:name``).
        library: the library it loads (``"transformers"``); ``library=`` (``--library``) picks
            loaders by it, or by name or label.
        looks_for: what in a folder it recognises (``"config.json with a model_type"``), said when
            nothing recognises a folder.
        recognise: ``recognise(checkpoint) -> Recognition | None``: reads the folder's small files
            only (:meth:`Checkpoint.json`); imports neither torch nor the library.
        plan: ``plan(checkpoint, task) -> ExportPlan``, ``task`` one of the recognition's tasks;
            may import the library (not build the models: that is each component's ``build``);
            raises :class:`opreg.CheckpointError` for what it refuses, before any export.
        priority: the higher wins when several loaders recognise a folder (a sentence-transformers
            folder is also a transformers one); a tie at the top is refused unless ``library=``
            picks one.
    """

    name: str
    library: str
    looks_for: str
    recognise: Callable[[Checkpoint], Recognition | None]
    plan: Callable[[Checkpoint, str], ExportPlan]
    priority: int = 0

    def __post_init__(self) -> None:
        where = f"CheckpointLoader {self.name!r}"
        _check_name(where, "name", self.name)
        _check_name(where, "library", self.library)
        _check_callable(where, "recognise", self.recognise)
        _check_callable(where, "plan", self.plan)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise InvalidArgumentError(f"{where}: priority must be an int, got {self.priority!r}")


# -- what to export -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DynamicDim:
    """A named dim the exported models keep dynamic (``batch_size``, ``sequence_length``).

    Fields:
        name: the dim's name in the ONNX model (as optimum names it).
        example: its size in the example inputs the model is captured with.
        other: a second size, verified too (so the model is not specialised to ``example``).
        min, max: the range the config allows (``max``: ``max_position_embeddings`` for a
            sequence; ``None``, unbounded); torch.export refuses a range the model cannot take.
        multiple: sizes are multiples of it (image sides a patch or a downsampling divides).
        auto: captured as torch.export's ``Dim.AUTO`` within ``[min, max]``, not as a named ``Dim``:
            for a dim whose guards hold over the range but torch cannot prove so (wav2vec2's
            audio length, through its feature encoder's floor divisions: a named ``Dim`` is
            refused with ``Constraints violated``). The ONNX dim still gets ``name``; an export
            in which torch fixed it is refused. Not with a ``multiple``.
    """

    name: str
    example: int
    other: int
    min: int = 1
    max: int | None = None
    multiple: int = 1
    auto: bool = False

    def __post_init__(self) -> None:
        where = f"DynamicDim {self.name!r}"
        _check_name(where, "name", self.name)
        for field in ("example", "other", "min", "multiple"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if field == "multiple" else 0):
                raise InvalidArgumentError(f"{where}: {field} must be a non-negative int, got {value!r}")
        if not isinstance(self.auto, bool) or (self.auto and self.multiple != 1):
            raise InvalidArgumentError(f"{where}: auto must be True or False, and True only without a multiple")
        top = self.max if self.max is not None else max(self.example, self.other)
        for field in ("example", "other"):
            size = getattr(self, field)
            if not self.min <= size <= top or size % self.multiple:
                raise InvalidArgumentError(
                    f"{where}: {field}={size} is outside its range [{self.min}, {self.max}] or not a multiple of "
                    f"{self.multiple}"
                )


@dataclasses.dataclass(frozen=True)
class ModelInput:
    """One input of a component's model.

    Fields:
        name: the input's name, the keyword the module's ``forward`` takes and the ONNX input's name.
        shape: each dim a :class:`DynamicDim`'s name or a fixed size (``("batch_size", 3, 224, 224)``).
        dtype: ``int64``, ``int32``, ``bool``, ``float32``, ``float16``, ``bfloat16`` or ``float64``.
        fill: how example values are made, one of :data:`FILLS`.
        high: for ``fill="ids"`` and ``"bbox"``, the exclusive upper bound (the vocabulary's size,
            the coordinates' range).
    """

    name: str
    shape: tuple[str | int, ...]
    dtype: str = "int64"
    fill: str = "ids"
    high: int | None = None

    def __post_init__(self) -> None:
        where = f"ModelInput {self.name!r}"
        _check_name(where, "name", self.name)
        if not isinstance(self.shape, tuple) or not all(
            (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or (isinstance(d, str) and d)
            for d in self.shape
        ):
            raise InvalidArgumentError(f"{where}: shape must be a tuple of dim names and sizes, got {self.shape!r}")
        if self.dtype not in _DTYPES:
            raise InvalidArgumentError(f"{where}: dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.fill not in FILLS:
            raise InvalidArgumentError(f"{where}: fill must be one of {', '.join(FILLS)}, got {self.fill!r}")
        if self.fill in ("ids", "bbox") and (not isinstance(self.high, int) or self.high < 1):
            raise InvalidArgumentError(
                f"{where}: fill={self.fill!r} needs high=, the exclusive upper bound (a vocab size)"
            )
        if self.fill == "bbox" and self.shape[-1:] != (4,):
            raise InvalidArgumentError(
                f"{where}: fill='bbox' needs a last dim of 4 (x0, y0, x1, y1), got {self.shape!r}"
            )


@dataclasses.dataclass(frozen=True)
class Component:
    """One model of the folder: how to build it, what it takes and gives, where it goes.

    Fields:
        name: unique within the plan (``"model"``, ``"encoder_model"``, ``"text_encoder"``).
        file: its path in the folder (``"model.onnx"``, ``"text_encoder/model.onnx"``).
        build: ``build() -> torch.nn.Module``, called when the export reaches it: imports the
            library and loads the weights. Its ``forward`` takes the inputs by their names; it
            returns a mapping holding the outputs by name (a transformers ``ModelOutput``), a
            tuple of them in order, or one tensor.
        inputs: its :class:`ModelInput` s, in the ONNX model's order.
        outputs: the ONNX outputs' names, in order (picked from the mapping ``forward`` returns).
        dims: the :class:`DynamicDim` s its inputs name.
        rtol, atol: the tolerances it is verified with against eager PyTorch.
        target: its own target (``"onnxruntime"``), ``None`` for the export's.
        options: more :class:`opreg.ExportSettings` fields for this component (``{"state": "io"}``).
    """

    name: str
    file: str
    build: Callable[[], Any]
    inputs: tuple[ModelInput, ...]
    outputs: tuple[str, ...]
    dims: tuple[DynamicDim, ...] = ()
    rtol: float = 1e-4
    atol: float = 1e-4
    target: Any = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"Component {self.name!r}"
        _check_name(where, "name", self.name)
        _check_file(where, "file", self.file)
        _check_callable(where, "build", self.build)
        _tuple_of(where, "inputs", self.inputs, ModelInput)
        _tuple_of(where, "outputs", self.outputs, str)
        _tuple_of(where, "dims", self.dims, DynamicDim)
        if not self.outputs:
            raise InvalidArgumentError(f"{where}: name at least one output")
        _unique(where, "inputs", [i.name for i in self.inputs])
        _unique(where, "outputs", list(self.outputs))
        _unique(where, "dims", [d.name for d in self.dims])
        known = {d.name for d in self.dims}
        for item in self.inputs:
            unknown = [d for d in item.shape if isinstance(d, str) and d not in known]
            if unknown:
                raise InvalidArgumentError(f"{where}: input {item.name!r} names dim {unknown[0]!r}, not in dims")
        if not isinstance(self.options, Mapping):
            raise InvalidArgumentError(f"{where}: options must be a mapping of ExportSettings fields")

    def dim(self, name: str) -> DynamicDim:
        """The dim named ``name``."""
        return next(d for d in self.dims if d.name == name)


@dataclasses.dataclass(frozen=True)
class FileCopy:
    """A file of the checkpoint the folder gets as it is.

    Fields:
        source: its path in the checkpoint (``"tokenizer.json"``, ``"scheduler/scheduler_config.json"``).
        dest: its path in the folder written (default: ``source``).
        required: the export is refused before it starts when the file is missing (default: it is
            copied when present).
    """

    source: str
    dest: str = ""
    required: bool = False

    def __post_init__(self) -> None:
        _check_file(f"FileCopy {self.source!r}", "source", self.source)
        if self.dest:
            _check_file(f"FileCopy {self.source!r}", "dest", self.dest)

    @property
    def target(self) -> str:
        return self.dest or self.source


@dataclasses.dataclass(frozen=True)
class CheckContext:
    """What a :class:`PostStep` or :class:`LoopCheck` is handed.

    Fields:
        checkpoint: the :class:`Checkpoint` exported.
        plan: the :class:`ExportPlan` carried out.
        programs: ``{component or post-step name: opreg.OnnxProgram or onnx_ir.Model}`` exported so far.
        modules: ``{component name: torch.nn.Module}``, the eager models built.
        folder: the folder written (``None`` for a post-step, which runs before the write).
    """

    checkpoint: Checkpoint
    plan: ExportPlan
    programs: Mapping[str, Any]
    modules: Mapping[str, Any]
    folder: Path | None = None


@dataclasses.dataclass(frozen=True)
class PostStep:
    """A model made from exported ones, after every component is exported (a merged decoder).

    Fields:
        name: unique within the plan, among components too.
        file: its path in the folder.
        combine: ``combine(context) -> onnx_ir.Model`` (a :class:`CheckContext`; ``context.programs``
            holds each component's :class:`opreg.OnnxProgram`).
        drop: the components whose files the folder then leaves out (their models stay in
            ``context.programs`` for the checks).
    """

    name: str
    file: str
    combine: Callable[[CheckContext], Any]
    drop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_name(f"PostStep {self.name!r}", "name", self.name)
        _check_file(f"PostStep {self.name!r}", "file", self.file)
        _check_callable(f"PostStep {self.name!r}", "combine", self.combine)
        _tuple_of(f"PostStep {self.name!r}", "drop", self.drop, str)


@dataclasses.dataclass(frozen=True)
class LoopCheck:
    """A check of the written folder as a runtime runs it: a generation or denoising loop in ONNX
    Runtime against the library's own (``generate``, the pipeline's call).

    Fields:
        name: unique within the plan.
        run: ``run(context) -> str``: a one-line summary of what matched (a
            :class:`CheckContext` whose ``folder`` is the folder written); raises
            :class:`opreg.VerificationError` on a mismatch.
    """

    name: str
    run: Callable[[CheckContext], str]

    def __post_init__(self) -> None:
        _check_name(f"LoopCheck {self.name!r}", "name", self.name)
        _check_callable(f"LoopCheck {self.name!r}", "run", self.run)


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """What a loader's ``plan`` returns: everything to export and write for one task.

    Fields:
        library: the library (as the recognition said).
        task: the task planned.
        components: the models to export, in order.
        files: the checkpoint's files the folder gets.
        post_steps: models combined from exported ones (:class:`PostStep`).
        checks: loops run on the written folder (:class:`LoopCheck`), when verifying.
        notes: lines shown to the user (what was inferred, what was left out and why).
        export: ``export(handover) -> HandoverResult``: the whole export done by the loader (another
            exporter writing the folder whole: :class:`Handover`), instead of ``components``, files,
            post-steps and checks; the only plan that takes ``layout=`` (``--layout``).
    """

    library: str
    task: str
    components: tuple[Component, ...]
    files: tuple[FileCopy, ...] = ()
    post_steps: tuple[PostStep, ...] = ()
    checks: tuple[LoopCheck, ...] = ()
    notes: tuple[str, ...] = ()
    export: Callable[[Handover], HandoverResult] | None = None

    def __post_init__(self) -> None:
        where = f"ExportPlan for {self.library} {self.task}"
        _tuple_of(where, "components", self.components, Component)
        _tuple_of(where, "files", self.files, FileCopy)
        _tuple_of(where, "post_steps", self.post_steps, PostStep)
        _tuple_of(where, "checks", self.checks, LoopCheck)
        _tuple_of(where, "notes", self.notes, str)
        if self.export is not None:
            _check_callable(where, "export", self.export)
            if self.components or self.files or self.post_steps or self.checks:
                raise InvalidArgumentError(f"{where}: an export done whole plans no components, files, steps or checks")
            return
        if not self.components:
            raise InvalidArgumentError(f"{where}: plan at least one component, or an export done whole")
        _unique(where, "models", [c.name for c in self.components] + [s.name for s in self.post_steps])
        _unique(where, "files written", [c.file for c in self.components] + [s.file for s in self.post_steps])
        _unique(where, "checks", [c.name for c in self.checks])
        names = {c.name for c in self.components}
        for step in self.post_steps:
            unknown = [n for n in step.drop if n not in names]
            if unknown:
                raise InvalidArgumentError(f"{where}: post-step {step.name!r} drops {unknown[0]!r}, not a component")


@dataclasses.dataclass(frozen=True)
class Handover:
    """What an :attr:`ExportPlan.export` done whole is handed.

    Fields:
        checkpoint: the :class:`Checkpoint` to export.
        output: the folder to write (checked writable): the export writes it whole (staged and
            swapped in, as :func:`opreg.export_checkpoint` writes a plan's).
        settings: the :class:`opreg.ExportSettings` of the command (its registry built, its target).
        verify: whether to compare the models with the library's and run its loop checks.
        layout: the layout asked (``--layout``), or ``None`` for the export's default.
    """

    checkpoint: Checkpoint
    output: Path
    settings: Any
    verify: bool
    layout: str | None = None


@dataclasses.dataclass(frozen=True)
class HandoverResult:
    """What an export done whole returns.

    Fields:
        models: ``{file in the folder: opreg.OnnxProgram}`` written.
        verified: ``{file: (opreg.Verification, ...)}`` for each model verified (empty without ``verify``).
        checks: each loop check's one-line summary.
    """

    models: Mapping[str, Any]
    verified: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    checks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.models:
            raise InvalidArgumentError("HandoverResult: models must name at least one file written")
        _tuple_of("HandoverResult", "checks", self.checks, str)
