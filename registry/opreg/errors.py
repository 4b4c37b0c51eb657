"""Every error opreg raises derives from :class:`OpregError`.

Messages say what went wrong, name the thing, and say what to do next.
"""

from __future__ import annotations

import sys


class OpregError(Exception):
    """Base class of every error opreg raises."""


class InvalidOpNameError(OpregError, ValueError):
    """A torch op name is not of the form ``namespace::name[.overload]``."""


class InvalidArgumentError(OpregError, TypeError):
    """An argument of opreg's Python API has the wrong type or form (the message says
    what it takes)."""


class InvalidInputError(OpregError, ValueError):
    """Inputs given to an exported model do not fit it (structure, dtype, rank or a fixed dim)."""


class InvalidTargetError(OpregError, ValueError):
    """A target or target profile is malformed, unknown or out of range."""


class RegistrationError(OpregError):
    """An impl was refused at registration (bad metadata, lint failure)."""


class SignatureMismatchError(RegistrationError):
    """An impl's parameters do not match the torch op's schema."""


class FrozenRegistryError(OpregError):
    """A shared (built and cached) registry was asked to change."""


class PluginError(OpregError):
    """A pack failed to load or a hook raised, and strict mode is on."""


class PluginNotFoundError(PluginError, LookupError):
    """A pack was requested by name but no installed pack has that name."""


class NoImplementationError(OpregError, LookupError):
    """No registered impl can serve an op for a target."""


class ExportError(OpregError):
    """Exporting a model failed: capture, translation or validation."""


class SaveError(ExportError, OSError):
    """A model could not be written where asked (missing or unwritable folder, full disk).

    Nothing at the target path has changed."""


class InterruptedAfterSave(KeyboardInterrupt):
    """An interrupt (Ctrl-C, SIGTERM) arrived once a save had switched to the new model: the
    save finished (``path`` holds the new model and its data, the replaced data file is gone),
    and the interrupt goes on as a ``KeyboardInterrupt``. Before the switch a save raises a
    plain ``KeyboardInterrupt`` and the old model stays."""

    def __init__(self, path: object) -> None:
        super().__init__(f"interrupted after the save: {path} holds the new model")
        self.path = path


class UnsupportedOpsError(ExportError):
    """Ops in the model have no impl for the target; raised before any translation.

    ``missing`` holds one :class:`opreg.exporter.MissingOp` per op: its name,
    how many nodes use it, where they are, and which installed packs would
    cover it under another target.
    """

    def __init__(self, message: str, missing: tuple = ()) -> None:
        super().__init__(message)
        self.missing = missing


class StateError(ExportError):
    """The model updates state during ``forward`` (a buffer, or an input in place) and the
    export was not told what to do with it: ONNX graphs hold no state.

    ``buffers`` and ``inputs`` name what the model mutates. Export with ``state="io"`` (each
    becomes an input and an output of the model) or ``state="drop"`` (the updates are left out).
    """

    def __init__(self, message: str, buffers: tuple[str, ...] = (), inputs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.buffers = buffers
        self.inputs = inputs


class WeightsError(ExportError):
    """The weights given to an export (``weights=``, a checkpoint) do not fit the model: a tensor
    missing, or of another shape or kind of dtype; or a checkpoint that cannot be read. Raised
    before anything is written. ``problems`` lists each tensor's problem."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


class StreamingError(ExportError):
    """A language model built on the ``meta`` device (no weight in memory: the streamed export of
    :mod:`opreg.llm`) does not run there: its code reads a value (OPT's mask) or wants a dtype the
    device cannot give. Raised before anything is captured; exporting it with its weights loaded
    first (``streaming=False``, ``--no-streaming``) can work."""


class CheckpointError(OpregError):
    """A checkpoint (a folder, or a hub id) cannot be exported as asked: no installed pack's loader
    recognises it, two tie, it lacks its weights, its config cannot be built, it cannot do the task
    asked, a component of its pipeline is missing. Raised before anything is exported or written;
    the message names the file and what to do. A pack's checkpoint loader raises it for a folder it
    recognises but refuses (``opreg_checkpoint_loaders``)."""


class OpsetConflictError(ExportError):
    """Two impls in one export need incompatible versions of one domain."""


class VerificationError(OpregError, AssertionError):
    """The exported model's outputs do not match eager PyTorch's.

    ``results`` holds one :class:`opreg.exporter.OutputCheck` per output.
    """

    def __init__(self, message: str, results: tuple = ()) -> None:
        super().__init__(message)
        self.results = results


class RuntimeUnavailableError(OpregError):
    """No runtime at hand can execute the model (e.g. custom ops with no kernel)."""


class ShapeGuardWarning(UserWarning):
    """torch.export kept a guard on dims marked dynamic that narrows them beyond their range and
    that the ONNX model does not check (ONNX has no assert): the model may be wrong where the guard
    fails. The message names the guard in the inputs' dims and the model's line; the export's
    :attr:`opreg.OnnxProgram.shape_guards` and the model's ``opreg.shape_guards`` metadata list the
    same (docs/exporting.md, "Dynamic shapes")."""


class PackWarning(UserWarning):
    """A pack's fault that opreg worked around during an export: a rewrite rule or pass that
    raised or left an invalid graph (undone, left out), a capture patch that failed or left the
    library changed (left out, or put back). The message names the pack and what it did; the
    export's :attr:`opreg.OnnxProgram.pack_faults` and the model's ``opreg.pack_faults``
    metadata list the same. Filter it as any warning (``warnings.simplefilter("error",
    opreg.PackWarning)`` makes it an error)."""


class WeightsWarning(UserWarning):
    """A checkpoint's weight the export did not read as it is stored: a weight missing from the
    checkpoint tied again to the tensor it shared when the model was saved, or a head new to the
    task, random as transformers makes it (docs/exporting-checkpoints.md). The message names the
    weights."""


INTERNAL = ("opreg", "onnx_ir", "onnxscript", "contextlib")
"""Top-level modules whose frames :func:`user_stacklevel` skips: opreg's own (and its packs',
``opreg_*``) and those an export calls passes through."""


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller of this function point at the
    first frame outside :data:`INTERNAL` (the user's line), for a warning about what the user asked."""
    level, frame = 2, sys._getframe(2)  # stacklevel 2 is the caller's caller
    while frame is not None:
        top = frame.f_globals.get("__name__", "").split(".", 1)[0]
        if top not in INTERNAL and not top.startswith("opreg_"):
            break
        level, frame = level + 1, frame.f_back
    return level
