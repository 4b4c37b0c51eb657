"""The result of an export: the model, its names and ``save``; running, verifying and locating it
are :mod:`opreg.exporter.diagnosis`'s, which ``run``, ``verify`` and ``locate`` forward to."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
import torch

from opreg.errors import (
    ExportError,
    InvalidArgumentError,
    InvalidInputError,
    OpregError,
)
from opreg.exporter._capture import TRACING_LOCK, constant_inputs, symbolic_int_inputs
from opreg.exporter._nodes import Trace
from opreg.exporter._plan import JoinedDomain
from opreg.exporter._state import BUFFER, StateSlot
from opreg.exporter.diagnosis.compare import Verification, as_pair
from opreg.exporter.diagnosis.report import Location
from opreg.exporter.diagnosis.run import ONNXRUNTIME, Runner, run_program, to_torch
from opreg.exporter.diagnosis.verify import verify_program
from opreg.packs.packfaults import PackFault
from opreg.packs.patching import PatchOutcome
from opreg.registry.targets import Target, domain_label
from opreg.values import is_complex

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
            control-flow body alone with it (:meth:`export_alone`).
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
        fixed_dims: the dims ``dynamic_shapes`` asked to be dynamic (``Dim.AUTO``, ``"auto"``) that
            the model has at a fixed size, each with the guard that fixed it
            (:class:`opreg.FixedDim`; also in the model's ``opreg.fixed_dims`` metadata).
        shape_guards: the guards torch.export kept on the dims marked dynamic that narrow them
            beyond their range and that the model does not check
            (:class:`opreg.exporter.ShapeGuard`, each also warned as an :class:`opreg.ShapeGuardWarning`
            and in the model's ``opreg.shape_guards`` metadata).
        grown_dims: the dims marked dynamic of example size 1 that were captured from the example
            repeated to 2 along them, because torch's own code had fixed them at 1
            (:class:`opreg.exporter.GrownDim`; also logged, and in the model's
            ``opreg.grown_dims`` metadata).
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
        module: torch.nn.Module | torch.export.ExportedProgram,
        input_names: Sequence[str],
        input_leaves: Sequence[int],
        outputs: Sequence[OutputSlot],
        in_spec: Any,
        out_spec: Any,
        checked: bool,
        traces: Mapping[str, Trace] | None = None,
        state: Sequence[StateSlot] = (),
        capture_patches: Sequence[PatchOutcome] = (),
        joined_domains: Sequence[JoinedDomain] = (),
    ) -> None:
        self.model = model
        self.capture_patches = tuple(capture_patches)
        self.joined_domains = tuple(joined_domains)
        self.fixed_dims: tuple[Any, ...] = ()  # opreg.export sets what capture fixed
        self.shape_guards: tuple[Any, ...] = ()  # and the guards the model does not check
        self.grown_dims: tuple[Any, ...] = ()  # and the dims captured from a grown example
        self.pack_faults: tuple[PackFault, ...] = ()
        self.target = target
        self.runner = runner
        self.exported_program = exported_program
        self.input_names = tuple(input_names)
        self.output_names = tuple(s.name for s in outputs if s.name is not None)
        self._module = module
        self._input_leaves = tuple(input_leaves)
        self._constants = constant_inputs(exported_program, module)
        self._int_inputs = frozenset(symbolic_int_inputs(exported_program))
        self.output_slots = tuple(outputs)
        self._in_spec = in_spec
        self._out_spec = out_spec
        self._checked = checked
        self.traces = dict(traces or {})
        self.exporter: Any = None  # opreg.export, bound to its registry: locate() exports control-flow bodies alone
        self.state_slots = tuple(state)
        self.state: dict[str, torch.Tensor] = {
            slot.key: _initial_value(exported_program, slot.key) for slot in self.state_slots if slot.kind == BUFFER
        }

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
        graph = self.model.graph
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
        self.input_names = tuple(names.get(n, n) for n in self.input_names)
        self.output_names = tuple(names.get(n, n) for n in self.output_names)
        self.output_slots = tuple(dataclasses.replace(s, name=names.get(s.name, s.name)) for s in self.output_slots)
        self.state_slots = tuple(
            dataclasses.replace(s, input=names.get(s.input, s.input), output=names.get(s.output, s.output))
            for s in self.state_slots
        )
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

    # -- torch calls and the ONNX inputs and outputs --------------------------------------

    def adapt_torch_inputs_to_onnx(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """The tensors among ``model(*args, **kwargs)``'s inputs, in the ONNX inputs' order (a complex
        tensor as the real pair the model takes, ``torch.view_as_real``; a dynamic int as a 0-d int64
        tensor). The call may spell arguments as the module's ``forward`` takes them (by position or
        keyword, defaults left out); an argument the export made a constant must have the value it
        had then, else :class:`opreg.InvalidInputError` names it and both values."""
        leaves = self.call_leaves(args, kwargs)
        for index, (name, exported) in self._constants.items():
            _check_constant(name, leaves[index], exported)
        tensors = []
        for index, name, value_info in zip(self._input_leaves, self.input_names, self.model.graph.inputs, strict=False):
            value = leaves[index]
            if index in self._int_inputs and isinstance(value, int) and not isinstance(value, bool):
                value = torch.tensor(value, dtype=torch.int64)  # a dynamic int: the model's 0-d INT64 input
            if not isinstance(value, torch.Tensor):
                kind = "an int" if index in self._int_inputs else "a tensor"
                raise InvalidInputError(f"input {name!r} must be {kind}, got {type(value).__name__}")
            if is_complex(value_info) != value.is_complex():
                kind = "a complex" if is_complex(value_info) else "a real"
                raise InvalidInputError(f"input {name!r} must be {kind} tensor, got {value.dtype}")
            value = as_pair(value)
            _check_input(name, value, value_info)
            tensors.append(value)
        return tensors

    def input_values(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        """The leaves of ``(args, kwargs)`` the ONNX inputs take, in their order (as given:
        not checked, not converted)."""
        leaves = self.call_leaves(args, kwargs)
        return [leaves[index] for index in self._input_leaves]

    def _flat_call(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
        pytree = torch.utils._pytree
        kwarg_spec = self._in_spec.child(1) if self._in_spec.num_children == 2 else None
        if kwarg_spec is not None and kwarg_spec.context and set(kwargs) == set(kwarg_spec.context):
            kwargs = {key: kwargs[key] for key in kwarg_spec.context}  # the export's keyword order
        return pytree.tree_flatten((args, kwargs))

    def call_leaves(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        """The leaves of ``(args, kwargs)`` in the export's structure: a call that spells the
        arguments otherwise (a keyword given by position, a default left out) is bound to the
        module's ``forward`` first."""
        leaves, spec = self._flat_call(args, kwargs)
        if spec != self._in_spec:
            rebound = _rebind(self._module, self._in_spec, args, kwargs)
            if rebound is not None:
                leaves, spec = self._flat_call(*rebound)
        if spec != self._in_spec:
            raise InvalidInputError(
                f"the inputs do not have the structure of the export's example inputs: expected "
                f"{_describe_inputs(self._in_spec)}, got {_describe_inputs(spec)}"
            )
        return leaves

    def adapt_torch_outputs_to_onnx(self, outputs: Any) -> list[torch.Tensor]:
        """The tensors among the module's ``outputs``, in the ONNX outputs' order (a complex
        tensor as the real pair the model returns)."""
        leaves = torch.utils._pytree.tree_leaves(outputs)
        if len(leaves) != len(self.output_slots):
            raise ExportError(f"expected {len(self.output_slots)} output values like the export's, got {len(leaves)}")
        return [as_pair(leaf) for leaf, slot in zip(leaves, self.output_slots, strict=True) if slot.name is not None]

    def outputs_from(self, results: Sequence[Any]) -> Any:
        """The model's output values (``output_names``' order) in the structure the module returns,
        as torch (a complex output made complex again; a constant torch baked in put back)."""
        by_name = dict(zip(self.output_names, results, strict=True))
        leaves = [to_torch(by_name[s.name], s.complex) if s.name is not None else s.value for s in self.output_slots]
        return torch.utils._pytree.tree_unflatten(leaves, self._out_spec)

    def eager_module(self, what: str) -> torch.nn.Module:
        """The module to compare with in eager PyTorch (made from an ``ExportedProgram`` when first
        needed); ``what`` (``verify``, ``locate``) names the caller in the error for a module whose
        weights are on the ``meta`` device (no values to compare with)."""
        module = self._module
        if (
            self.streamed
            and isinstance(module, torch.nn.Module)
            and any(p.device.type == "meta" for p in module.parameters())
        ):
            raise InvalidArgumentError(
                f"{what} compares with eager PyTorch, and {type(module).__name__}'s weights are on the meta device "
                "(exported with weights=): load the model with its weights and export or compare that one"
            )
        if isinstance(module, torch.export.ExportedProgram):  # made when first needed: it costs
            with TRACING_LOCK:
                self._module = module = module.module()
        return module

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
        rtol: float = 1e-4,
        atol: float = 1e-4,
        runtime: str = "auto",
        locate: bool = False,
        **kwargs: Any,
    ) -> Verification:
        """Run the model and eager PyTorch on the same inputs and compare every output: returns a
        :class:`Verification`, raises :class:`opreg.VerificationError` listing the mismatches (with
        ``locate=True``, located). See docs/exporting.md, section ``opreg.export``."""
        return verify_program(self, args, kwargs, rtol=rtol, atol=atol, runtime=runtime, locate=locate)

    def locate(
        self, *args: Any, rtol: float = 1e-4, atol: float = 1e-4, runtime: str = "auto", **kwargs: Any
    ) -> Location:
        """Compare every intermediate value with eager PyTorch and say where the model goes wrong:
        returns a :class:`opreg.exporter.Location`. See docs/when-numbers-differ.md."""
        from opreg.exporter.diagnosis.locate import locate_program  # imported when asked for: an export needs none

        return locate_program(self, args, kwargs, rtol=rtol, atol=atol, runtime=runtime)

    # -- a body exported alone, with the exporter bound to the export's registry ---------------

    def export_alone(self, module: torch.fx.GraphModule, inputs: tuple) -> OnnxProgram:
        """A graph module (a control-flow body ``locate`` looks inside) exported on its own, with this
        export's exporter (bound to its registry) and target."""
        if self.exporter is None:
            raise OpregError("this program does not know the exporter that made it")
        return self.exporter(module, inputs, target=self.target)


def _unused(stem: str, taken: Mapping[str, Any]) -> str:
    index = 0
    while f"{stem}{index}" in taken:
        index += 1
    return f"{stem}{index}"


def _initial_value(program: torch.export.ExportedProgram, key: str) -> torch.Tensor:
    """A buffer's value when it was exported (a non-persistent buffer is among the constants)."""
    value = program.state_dict[key] if key in program.state_dict else program.constants[key]
    return value.detach().clone()


def _rebind(module: Any, in_spec: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    """``(args, kwargs)`` spelled as the export's call spelled them (the same positional count and
    keywords), by binding them to ``module.forward``'s signature with its defaults; ``None`` when
    they do not bind or the signature cannot say. An argument the export's call left out took its
    default then: a call that gives it another value is refused (:func:`_check_constant`)."""
    if not isinstance(module, torch.nn.Module) or in_spec.num_children != 2:
        return None
    try:
        signature = inspect.signature(module.forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    given = dict(bound.arguments)
    bound.apply_defaults()
    values = dict(bound.arguments)
    kinds = inspect.Parameter
    positional: list[Any] = []  # the values forward's positional parameters and *args bound
    named: list[str] = []
    extra: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        if parameter.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD):
            positional.append(values[parameter.name])
            named.append(parameter.name)
        elif parameter.kind is kinds.VAR_POSITIONAL:
            positional.extend(values.pop(parameter.name, ()))
        elif parameter.kind is kinds.VAR_KEYWORD:
            extra = dict(values.pop(parameter.name, {}))
    count = in_spec.child(0).num_children
    keywords = list(in_spec.child(1).context or ())
    scope = {**values, **extra}
    if len(positional) < count or set(named[:count]) & set(keywords) or any(k not in scope for k in keywords):
        return None
    for name in set(given) - set(named[:count]) - set(keywords):
        parameter = signature.parameters[name]
        if parameter.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD):
            _check_constant(name, given[name], parameter.default)
    return tuple(positional[:count]), {k: scope[k] for k in keywords}


def _same_constant(given: Any, exported: Any) -> bool:
    if type(given) is not type(exported):
        return False
    if isinstance(exported, float) and math.isnan(exported):
        return math.isnan(given)
    try:
        return bool(given == exported)
    except Exception:
        return given is exported


def _check_constant(name: str, given: Any, exported: Any) -> None:
    """An argument the export made a constant must be passed with the value it had then."""
    if _same_constant(given, exported):
        return
    shown, wanted = _show(exported), _show(given)
    again = f"{name}={wanted}" if name.isidentifier() else "that value"
    if isinstance(exported, int) and not isinstance(exported, bool) and isinstance(given, int):
        again += f" (an int that varies at run time: dynamic_shapes={{{name!r}: torch.export.Dim.DYNAMIC}})"
    raise InvalidInputError(
        f"argument {name} was {shown} when the model was exported, got {wanted}: torch.export made it a "
        f"constant, so the model always computes with {shown}. Pass {shown}, or export again with {again}"
    )


def _show(value: Any) -> str:
    return f"{type(value).__name__}.{value.name}" if isinstance(value, enum.Enum) else repr(value)


def _describe_inputs(spec: Any) -> str:
    """``(args, kwargs)``'s structure in words: how many positional arguments, which keywords."""
    args, kwargs = (spec.child(0), spec.child(1)) if spec.num_children == 2 else (spec, None)
    text = f"{args.num_children} positional argument(s)"
    keys = list(kwargs.context or ()) if kwargs is not None else []
    return text + (f" and keyword argument(s) {', '.join(map(str, keys))}" if keys else " and no keyword arguments")


def _check_input(name: str, tensor: torch.Tensor, value: ir.Value) -> None:
    """The model's input ``name`` takes ``tensor``: same dtype, rank and fixed dims (named dims are free)."""
    from onnx_ir import tensor_adapters

    if value.dtype is not None and tensor_adapters.from_torch_dtype(tensor.dtype) != value.dtype:
        expected = tensor_adapters.to_torch_dtype(value.dtype)
        raise InvalidInputError(f"input {name!r} must be {expected}, got {tensor.dtype}: cast it with .to({expected})")
    if value.shape is None:
        return
    if tensor.dim() != len(value.shape):
        raise InvalidInputError(
            f"input {name!r} must have {len(value.shape)} dim(s) {_shape_text(value.shape)}, got shape "
            f"{tuple(tensor.shape)}"
        )
    for index, (dim, size) in enumerate(zip(value.shape, tensor.shape, strict=True)):
        if isinstance(dim, int) and dim != size:
            raise InvalidInputError(
                f"dim {index} of input {name!r} is fixed at {dim} in the exported model {_shape_text(value.shape)}, "
                f"got {size}: export with dynamic_shapes naming that dim to vary it"
            )


def _shape_text(shape: ir.Shape) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else str(d.value or "?") for d in shape) + "]"
