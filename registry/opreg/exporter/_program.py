"""The result of an export: the model, its names and ``save``; running, verifying and locating it
are :mod:`opreg.exporter.diagnosis`'s, which ``run``, ``verify`` and ``locate`` forward to."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
import torch

from opreg.errors import (
    InvalidArgumentError,
)
from opreg.exporter._calls import Calls
from opreg.exporter._nodes import Trace
from opreg.exporter._plan import JoinedDomain
from opreg.exporter._state import StateSlot, initial_values, renamed
from opreg.exporter.diagnosis.compare import Verification
from opreg.exporter.diagnosis.report import Location
from opreg.exporter.diagnosis.run import ONNXRUNTIME, Runner, run_program
from opreg.exporter.diagnosis.verify import verify_program
from opreg.packs.packfaults import PackFault
from opreg.packs.patching import PatchOutcome
from opreg.registry.targets import Target, domain_label
from opreg.registry.versions import floors_of

logger = logging.getLogger(__name__)

EXTERNAL_DATA_THRESHOLD = onnx.checker.MAXIMUM_PROTOBUF * 9 // 10
"""Initializer bytes above which ``save`` writes weights to a side file: a single
protobuf cannot exceed 2 GB (``onnx.checker.MAXIMUM_PROTOBUF``), and the graph needs room too."""


@dataclasses.dataclass(frozen=True)
class OutputSlot:
    """Where one leaf of the model's returned structure comes from: an ONNX output
    (``name``) or a constant torch baked in (``value``); ``complex`` when the output is
    a complex tensor the model returns as a real pair (trailing dimension of 2)."""

    name: str | None
    value: Any = None
    complex: bool = False


class OnnxProgram:
    """An exported model.

    Attributes:
        model: the ``onnx_ir.Model`` (edit it freely; ``model_proto`` and
            ``save`` read it each time).
        target: the :class:`opreg.Target` it was built for.
        exported_program: the ``torch.export.ExportedProgram`` it came from.
        input_names / output_names: the ONNX inputs and outputs of the module's own
            inputs and outputs, in order.
        state_slots: with ``state="io"``, one :class:`StateSlot` per buffer or input the model
            updates: the ONNX input it is read from and the output its new value is written to
            (after ``input_names`` and ``output_names`` in the graph).
        state: the current value of each buffer in ``state_slots``, by ``state_dict`` name: at
            first the value it was exported with; :meth:`run` feeds these and keeps the new ones,
            as calling the module updates its buffers. Assign to it to start again.
        exporter: the function that made it (``opreg.export``); :meth:`locate` exports a
            control-flow body alone with it (:func:`opreg.exporter.diagnosis.locate.export_alone`).
        calls: how a torch call of the module maps onto the model's inputs and outputs
            (:class:`opreg.exporter._calls.Calls`).
        runner: what runs the model (:class:`opreg.exporter.diagnosis.run.Runner`): ONNX Runtime
            sessions and the reference evaluator with the packs' session options and kernels.
        output_slots: where each leaf of the returned structure comes from (:class:`OutputSlot`).
        traces: what translation made of each FX node of the main graph, by name
            (:class:`opreg.exporter._nodes.Trace`): what :meth:`locate` compares.
        capture_patches: what happened to each capture patch the packs offered
            (:class:`opreg.PatchOutcome`; the applied ones are also in the model's
            ``opreg.capture_patches`` metadata).
        joined_domains: the custom domains the export added to the target it was given
            (:class:`opreg.exporter.JoinedDomain`): the model used ops only a pack's own domain
            covers (also in the model's ``opreg.joined_domains`` metadata; ``target`` includes them).
        fixed_dims, shape_guards, grown_dims, refined_dims: what the capture made of the dims marked
            dynamic, each also in the model's metadata of that name (``opreg.fixed_dims``, ...): those
            fixed by a guard (:class:`opreg.FixedDim`); the guards narrowing them that the model does
            not check (:class:`opreg.exporter.ShapeGuard`, each warned as an
            :class:`opreg.ShapeGuardWarning`); those of example size 1 captured from the example repeated
            to 2 (:class:`opreg.exporter.GrownDim`); the named dims torch.export's suggested fixes refined.
        pack_faults: what the packs got wrong in the export and opreg worked around
            (:class:`opreg.packs.packfaults.PackFault`: a rewrite left out, a capture patch left out
            or put back), each also warned as an :class:`opreg.PackWarning` and listed in the
            model's ``opreg.pack_faults`` metadata.
    """

    def __init__(
        self,
        model: ir.Model,
        *,
        target: Target,
        runner: Runner,
        exported_program: torch.export.ExportedProgram,
        calls: Calls,
        input_names: Sequence[str],
        outputs: Sequence[OutputSlot],
        checked: bool,
        traces: Mapping[str, Trace] | None = None,
        state: Sequence[StateSlot] = (),
        capture_patches: Sequence[PatchOutcome] = (),
        joined_domains: Sequence[JoinedDomain] = (),
    ) -> None:
        self.model = model
        self.capture_patches = tuple(capture_patches)
        self.joined_domains = tuple(joined_domains)
        self.opset_floors = floors_of(model.metadata_props)  # per domain lowered below the target: version, set_by
        self.fixed_dims: tuple[Any, ...] = ()  # opreg.export sets what capture fixed
        self.shape_guards: tuple[Any, ...] = ()  # and the guards the model does not check
        self.grown_dims: tuple[Any, ...] = ()  # and the dims captured from a grown example
        self.refined_dims: tuple[Any, ...] = ()  # and the named dims torch.export's suggested fixes refined
        self.pack_faults: tuple[PackFault, ...] = ()
        self.target = target
        self.runner = runner
        self.exported_program = exported_program
        self.input_names = tuple(input_names)
        self.output_names = tuple(s.name for s in outputs if s.name is not None)
        self.calls = calls
        self.output_slots = tuple(outputs)
        self._checked = checked
        self.traces = dict(traces or {})
        self.exporter: Any = None  # opreg.export, bound to its registry: locate() exports control-flow bodies alone
        self.state_slots = tuple(state)
        self.state: dict[str, torch.Tensor] = initial_values(exported_program, self.state_slots)

    def __repr__(self) -> str:
        opsets = ", ".join(f"{domain_label(d)}={v}" for d, v in sorted(self.model.opset_imports.items()))
        state = f", state {[s.key for s in self.state_slots]}" if self.state_slots else ""
        return (
            f"<OnnxProgram {len(self.model.graph)} nodes, inputs {list(self.input_names)}, "
            f"outputs {list(self.output_names)}{state}, opsets {opsets}>"
        )

    def rename(self, names: Mapping[str, str]) -> None:
        """Rename ONNX inputs and outputs, ``{old: new}``; ``run``, ``verify`` and ``save`` use
        the new names (an intermediate value holding a new name gets another)."""
        rename_ends(self.model.graph, names)
        self.input_names = tuple(names.get(n, n) for n in self.input_names)
        self.output_names = tuple(names.get(n, n) for n in self.output_names)
        self.output_slots = tuple(dataclasses.replace(s, name=names.get(s.name, s.name)) for s in self.output_slots)
        self.state_slots = renamed(self.state_slots, names)
        self.runner.forget()

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as an ``onnx.ModelProto`` (serialised from :attr:`model` on each access)."""
        return ir.serde.serialize_model(self.model)

    streamed = False
    """Whether the weights are read from a checkpoint as the model is written (``opreg.export(...,
    weights=...)``): then they always go to an external-data file, a run of rows at a time."""

    # -- saving --------------------------------------------------------------------------

    def initializer_bytes(self) -> int:
        """How many bytes the model's weights take."""
        from opreg.exporter import _runtime

        return _runtime.initializer_bytes(self.model)

    def save(self, path: str | bytes | os.PathLike[str], external_data: bool | None = None) -> Path:
        """Write the model to ``path``; returns the path (a symlink's target, if ``path`` is one).

        ``external_data=None`` keeps weights inside the file unless they exceed
        what one protobuf holds (about 2 GB) or were streamed from a checkpoint
        (:attr:`streamed`: inside the file, the whole model would be one protobuf
        in memory); then, or with ``True``, they go to
        a side file ``<file name>.<token>.data`` that the model names (a new
        token at each save; tensors of at most 256 bytes stay inside). The save
        is atomic for the pair: at every instant ``path`` holds the complete old
        model with its data, or the complete new one, even if the process is
        killed; the old data file (the one the old model records as opreg's, and
        only that one) is removed after the new model is in place.

        Raises :class:`opreg.SaveError` for any ``OSError`` (a folder that cannot
        be written, a name too long, a full disk; nothing there is changed),
        :class:`opreg.InvalidArgumentError` for a ``path`` that is not one, and,
        on Ctrl-C or SIGTERM once the new model is in place,
        :class:`opreg.InterruptedAfterSave` (a ``KeyboardInterrupt``; before that
        instant a plain one, and the old pair stays).
        """
        from opreg.exporter import _save

        if external_data is None:
            external_data = self.streamed or self.initializer_bytes() > EXTERNAL_DATA_THRESHOLD
        return _save.save_model(self.model, path, external_data=external_data, check=not self._checked)

    # -- torch calls and the ONNX inputs and outputs: opreg.exporter._calls ------------------

    def adapt_torch_inputs_to_onnx(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """The tensors among ``model(*args, **kwargs)``'s inputs, in the ONNX inputs' order (a complex
        tensor as the real pair the model takes, ``torch.view_as_real``; a dynamic int as a 0-d int64
        tensor). The call may spell arguments as the module's ``forward`` takes them (by position or
        keyword, defaults left out); an argument the export made a constant must have the value it
        had then, else :class:`opreg.InvalidInputError` names it and both values."""
        return self.calls.onnx_inputs(args, kwargs, self.input_names, self.model.graph.inputs)

    def adapt_torch_outputs_to_onnx(self, outputs: Any) -> list[torch.Tensor]:
        """The tensors among the module's ``outputs``, in the ONNX outputs' order (a complex
        tensor as the real pair the model returns)."""
        return self.calls.onnx_outputs(outputs, self.output_slots)

    # -- running, verifying, locating: opreg.exporter.diagnosis ------------------------------

    def runtime_for(self) -> str:
        """``onnxruntime`` if it can run every op in the model, else ``reference``: the model uses
        custom ops no loaded pack gives ONNX Runtime kernels for, or random ops at an opset this
        ONNX Runtime has no kernels for (22 and up, see ``_runtime.missing_random_kernel``)."""
        return self.runner.choose(self.model)

    def run(self, *args: Any, runtime: str = ONNXRUNTIME, **kwargs: Any) -> Any:
        """Run the model on torch inputs shaped like the export's; returns torch outputs in the
        structure the module returns (``runtime``: ``"onnxruntime"``, ``"reference"`` or ``"auto"``).
        See docs/exporting.md, section ``opreg.export``."""
        return run_program(self, args, kwargs, runtime)

    def verify(
        self,
        *args: Any,
        rtol: float | None = None,
        atol: float | None = None,
        runtime: str = "auto",
        locate: bool = False,
        **kwargs: Any,
    ) -> Verification:
        """Run the model and eager PyTorch on the same inputs and compare every output (``rtol``/``atol``
        ``None``: each output's dtype's default, torch.testing's): returns a :class:`Verification`, raises
        :class:`opreg.VerificationError` listing the mismatches (with ``locate=True``, located). See
        docs/exporting.md, section ``opreg.export``."""
        return verify_program(self, args, kwargs, rtol=rtol, atol=atol, runtime=runtime, locate=locate)

    def locate(
        self, *args: Any, rtol: float | None = None, atol: float | None = None, runtime: str = "auto", **kwargs: Any
    ) -> Location:
        """Compare every intermediate value with eager PyTorch and say where the model goes wrong:
        returns a :class:`opreg.exporter.Location`. See docs/when-numbers-differ.md."""
        from opreg.exporter.diagnosis.locate import locate_program  # imported when asked for: an export needs none

        return locate_program(self, args, kwargs, rtol=rtol, atol=atol, runtime=runtime)


def rename_ends(graph: ir.Graph, names: Mapping[str, str]) -> None:
    """Rename ``graph``'s inputs and outputs, ``{old: new}``; an intermediate value or a weight holding
    a new name gets another. :class:`opreg.InvalidArgumentError` for a name the graph has no input or
    output of, or a renaming that gives two of them one name."""
    ends = {v.name: v for v in [*graph.inputs, *graph.outputs]}
    unknown = sorted(set(names) - set(ends))
    if unknown:
        raise InvalidArgumentError(f"the model has no input or output {', '.join(unknown)}; it has {list(ends)}")
    final = [names.get(name, name) for name in ends]
    if len(set(final)) != len(final):
        raise InvalidArgumentError(f"renaming {dict(names)} would give two inputs or outputs one name")
    values = {v.name: v for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs}
    values.update((name, v) for name, v in graph.initializers.items())
    for old, new in names.items():
        clash = values.get(new)
        if clash is not None and clash is not ends[old] and new not in ends:
            clash.name = _unused(f"{new}_", values)
            values[clash.name] = clash
        ends[old].name = new


def _unused(stem: str, taken: Mapping[str, Any]) -> str:
    index = 0
    while f"{stem}{index}" in taken:
        index += 1
    return f"{stem}{index}"
