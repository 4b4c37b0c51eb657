"""State: buffers a model updates during ``forward``, and inputs it updates in place.

An ONNX graph holds no state, so such an update is either exported as an input/output
pair (``state="io"``), knowingly left out (``state="drop"``), or refused with an error
naming what the model mutates (``state="error"``, the default). It is never dropped
without a word (docs/design.md, "An export").

Only an update that would be lost is refused: an input updated in place whose new value
the model also returns (``return x.normal_()``) is exported under the default, as
torch.onnx exports it; the caller reads the new value from that output. A buffer's update
always would be lost (the next call reads the exported value), so it is always refused.

What a model mutates is read from the decomposed program's signature: torch's
functionalization lists every mutated buffer and input there, and the decomposition
stage always runs for a graph that mutates one (:func:`opreg.exporter._plan.prepare`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import torch
from torch.export.graph_signature import OutputKind, TensorArgument

from opreg.errors import StateError

BUFFER = "buffer"
INPUT = "input"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StateSlot:
    """One piece of state a model exported with ``state="io"`` updates.

    Fields:
        kind: ``"buffer"`` (a buffer of the module) or ``"input"`` (an input updated in place).
        key: the buffer's ``state_dict`` name, or the input's name.
        input: the ONNX input holding the value before the call (for an input, the input itself).
        output: the ONNX output holding the value after the call.
    """

    kind: str
    key: str
    input: str
    output: str


@dataclasses.dataclass(frozen=True)
class Mutations:
    """What a program mutates: buffers by ``state_dict`` name and user inputs by placeholder
    name, each in the order of the program's outputs; ``returned``: the inputs among them whose
    new value is also one of the model's outputs (its update is not lost without ``state=``)."""

    buffers: tuple[str, ...]
    inputs: tuple[str, ...]
    returned: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.buffers or self.inputs)

    @property
    def lost(self) -> Mutations:
        """The updates an ONNX graph would lose: every buffer's, and the inputs' no output carries."""
        return Mutations(self.buffers, tuple(i for i in self.inputs if i not in self.returned))


def mutations(program: torch.export.ExportedProgram) -> Mutations:
    specs = program.graph_signature.output_specs
    buffers = tuple(s.target for s in specs if s.kind == OutputKind.BUFFER_MUTATION)
    inputs = tuple(s.target for s in specs if s.kind == OutputKind.USER_INPUT_MUTATION)
    outputs = {s.arg.name for s in specs if s.kind == OutputKind.USER_OUTPUT and isinstance(s.arg, TensorArgument)}
    returned = tuple(
        s.target for s in specs if s.kind == OutputKind.USER_INPUT_MUTATION and s.arg.name in outputs
    )  # the very value the update writes, not a view of it
    return Mutations(buffers, inputs, returned)


def check(program: torch.export.ExportedProgram, state: str, model_name: str) -> Mutations:
    """What ``program`` mutates; raises :class:`opreg.StateError` when ``state`` is ``"error"``
    and an update would be lost (:attr:`Mutations.lost`)."""
    found = mutations(program)
    if found.returned:
        logger.info(
            "%s updates input(s) %s in place and returns the new value: exported without the update, which "
            "the caller reads from that output",
            model_name,
            ", ".join(map(repr, found.returned)),
        )
    if state != "error" or not found.lost:
        return found
    found = found.lost
    parts = []
    if found.buffers:
        parts.append(f"buffer(s) {', '.join(map(repr, found.buffers))}")
    if found.inputs:
        parts.append(f"input(s) {', '.join(map(repr, found.inputs))} in place")
    raise StateError(
        f"{model_name} updates {' and '.join(parts)} during forward, and an ONNX graph holds no state: "
        "export with state='io' (CLI: --state io) to make each an input and an output of the model (feed "
        "the output back as the next call's input), or state='drop' (--state drop) to leave the updates "
        "out (the model then always reads the values it was exported with)",
        buffers=found.buffers,
        inputs=found.inputs,
    )


def initial_values(program: torch.export.ExportedProgram, slots: Sequence[StateSlot]) -> dict[str, torch.Tensor]:
    """The value each buffer of ``slots`` had when it was exported, by ``state_dict`` name (a
    non-persistent buffer is among the program's constants): what ``OnnxProgram.state`` starts at."""
    values = {}
    for slot in slots:
        if slot.kind == BUFFER:
            value = program.state_dict[slot.key] if slot.key in program.state_dict else program.constants[slot.key]
            values[slot.key] = value.detach().clone()
    return values


def renamed(slots: Sequence[StateSlot], names: Mapping[str, str]) -> tuple[StateSlot, ...]:
    """``slots`` with the ONNX inputs and outputs they name renamed, ``{old: new}`` (``OnnxProgram.rename``)."""
    return tuple(
        dataclasses.replace(s, input=names.get(s.input, s.input), output=names.get(s.output, s.output)) for s in slots
    )
