"""The result of an export: the model, and ways to save, run and verify it."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import inspect
import logging
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from opreg.errors import (
    ExportError,
    InvalidArgumentError,
    InvalidInputError,
    OpregError,
    RuntimeUnavailableError,
    VerificationError,
)
from opreg.exporter._capture import TRACING_LOCK, constant_inputs, symbolic_int_inputs
from opreg.exporter._locate import Location, Trace
from opreg.exporter._plan import JoinedDomain
from opreg.exporter._state import BUFFER, StateSlot
from opreg.packfaults import PackFault
from opreg.patching import PatchOutcome
from opreg.registry import Registry
from opreg.targets import Target, domain_label
from opreg.values import is_complex

logger = logging.getLogger(__name__)

EXTERNAL_DATA_THRESHOLD = onnx.checker.MAXIMUM_PROTOBUF * 9 // 10
"""Initializer bytes above which ``save`` writes weights to a side file: a single
protobuf cannot exceed 2 GB (``onnx.checker.MAXIMUM_PROTOBUF``), and the graph needs room too."""

ONNXRUNTIME = "onnxruntime"
REFERENCE = "reference"


@dataclasses.dataclass(frozen=True)
class OutputSlot:
    """Where one leaf of the model's returned structure comes from: an ONNX output
    (``name``) or a constant torch baked in (``value``); ``complex`` when the output is
    a complex tensor the model returns as a real pair (trailing dimension of 2)."""

    name: str | None
    value: Any = None
    complex: bool = False


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """How one output compares with eager PyTorch.

    Fields:
        name: the ONNX output name.
        max_abs: largest absolute difference.
        max_rel: largest difference relative to the eager value.
        ok: within ``atol + rtol * |eager|`` everywhere, and same shape and dtype.
        detail: what did not match, when not ok.
    """

    name: str
    max_abs: float
    max_rel: float
    ok: bool
    detail: str = ""

    def __str__(self) -> str:
        state = "ok" if self.ok else "MISMATCH"
        text = f"{self.name}: {state} (max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g})"
        return f"{text}: {self.detail}" if self.detail else text


@dataclasses.dataclass(frozen=True)
class Verification:
    """The result of :meth:`OnnxProgram.verify`: which runtime ran it, and each output."""

    runtime: str
    outputs: tuple[OutputCheck, ...]

    def __iter__(self):
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def __getitem__(self, index: int) -> OutputCheck:
        return self.outputs[index]

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)


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
            control-flow body alone with it.
        capture_patches: what happened to each capture patch the packs offered
            (:class:`opreg.PatchOutcome`; the applied ones are also in the model's
            ``opreg.capture_patches`` metadata).
        joined_domains: the custom domains the export added to the target it was given
            (:class:`opreg.exporter.JoinedDomain`): the model used ops only a pack's own domain
            covers (also in the model's ``opreg.joined_domains`` metadata; ``target`` includes them).
        fixed_dims: the dims ``dynamic_shapes`` asked to be dynamic (``Dim.AUTO``, ``"auto"``) that
            the model has at a fixed size, each with the guard that fixed it
            (:class:`opreg.FixedDim`; also in the model's ``opreg.fixed_dims`` metadata).
        pack_faults: what the packs got wrong in the export and opreg worked around
            (:class:`opreg.packfaults.PackFault`: a rewrite left out, a capture patch left out
            or put back), each also warned as an :class:`opreg.PackWarning` and listed in the
            model's ``opreg.pack_faults`` metadata.
    """

    def __init__(
        self,
        model: ir.Model,
        *,
        target: Target,
        registry: Registry,
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
        self.pack_faults: tuple[PackFault, ...] = ()
        self.target = target
        self.registry = registry
        self.exported_program = exported_program
        self.input_names = tuple(input_names)
        self.output_names = tuple(s.name for s in outputs if s.name is not None)
        self._module = module
        self._input_leaves = tuple(input_leaves)
        self._constants = constant_inputs(exported_program, module)
        self._int_inputs = frozenset(symbolic_int_inputs(exported_program))
        self._outputs = tuple(outputs)
        self._in_spec = in_spec
        self._out_spec = out_spec
        self._checked = checked
        self._traces = dict(traces or {})
        self.exporter: Any = None  # opreg.export sets itself here: locate() exports control-flow bodies alone
        self._sessions: dict[str, Any] = {}
        self._choice: str | None = None  # what runtime="auto" runs, once found
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
        self._outputs = tuple(dataclasses.replace(s, name=names.get(s.name, s.name)) for s in self._outputs)
        self.state_slots = tuple(
            dataclasses.replace(s, input=names.get(s.input, s.input), output=names.get(s.output, s.output))
            for s in self.state_slots
        )
        self._sessions.clear()

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

    # -- running -------------------------------------------------------------------------

    def adapt_torch_inputs_to_onnx(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """The tensors among ``model(*args, **kwargs)``'s inputs, in the ONNX inputs' order (a complex
        tensor as the real pair the model takes, ``torch.view_as_real``; a dynamic int as a 0-d int64
        tensor). The call may spell arguments as the module's ``forward`` takes them (by position or
        keyword, defaults left out); an argument the export made a constant must have the value it
        had then, else :class:`opreg.InvalidInputError` names it and both values."""
        leaves = self._flatten_call(args, kwargs)
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
            value = _as_pair(value)
            _check_input(name, value, value_info)
            tensors.append(value)
        return tensors

    def _input_tensors(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        """The leaves of ``(args, kwargs)`` the ONNX inputs take, in their order (as given:
        not checked, not converted)."""
        leaves = self._flatten_call(args, kwargs)
        return [leaves[index] for index in self._input_leaves]

    def _flat_call(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
        pytree = torch.utils._pytree
        kwarg_spec = self._in_spec.child(1) if self._in_spec.num_children == 2 else None
        if kwarg_spec is not None and kwarg_spec.context and set(kwargs) == set(kwarg_spec.context):
            kwargs = {key: kwargs[key] for key in kwarg_spec.context}  # the export's keyword order
        return pytree.tree_flatten((args, kwargs))

    def _flatten_call(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
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
        if len(leaves) != len(self._outputs):
            raise ExportError(f"expected {len(self._outputs)} output values like the export's, got {len(leaves)}")
        return [_as_pair(leaf) for leaf, slot in zip(leaves, self._outputs, strict=True) if slot.name is not None]

    def _flat_inputs(self, args: tuple, kwargs: dict[str, Any]) -> list[np.ndarray]:
        return [_to_numpy(t) for t in self.adapt_torch_inputs_to_onnx(*args, **kwargs)]

    def _unflatten(self, results: Sequence[np.ndarray]) -> Any:
        by_name = dict(zip(self.output_names, results, strict=True))
        leaves = [_to_torch(by_name[s.name], s.complex) if s.name is not None else s.value for s in self._outputs]
        return torch.utils._pytree.tree_unflatten(leaves, self._out_spec)

    def runtime_for(self) -> str:
        """``onnxruntime`` if it can run every op in the model, else ``reference``: the model uses
        custom ops no loaded pack gives ONNX Runtime kernels for, or random ops at an opset this
        ONNX Runtime has no kernels for (22 and up, see ``_runtime.missing_random_kernel``)."""
        from opreg.exporter import _runtime

        if self._choice is not None:
            return self._choice
        self._choice = ONNXRUNTIME
        try:
            self._session(ONNXRUNTIME)  # kept for run()
        except RuntimeUnavailableError as e:
            cause = e.__cause__ if e.__cause__ is not None else e
            if not _runtime.builtin_domains_only(self.model):
                self._choice = REFERENCE
            elif _runtime.missing_random_kernel(cause):
                logger.info("ONNX Runtime cannot run the model (%s); using the reference evaluator", cause)
                self._choice = REFERENCE
        return self._choice

    def _session(self, runtime: str) -> Any:
        """The ONNX Runtime session or reference evaluator of this model, made once."""
        from opreg.exporter import _runtime

        session = self._sessions.get(runtime)
        if session is None:
            if runtime == ONNXRUNTIME:
                session = _runtime.onnxruntime_session(self.model, self.registry.packs)
            else:
                session = _runtime.reference_evaluator(self.model, self.registry.packs)
            self._sessions[runtime] = session
        return session

    def run(self, *args: Any, runtime: str = ONNXRUNTIME, **kwargs: Any) -> Any:
        """Run the model on torch inputs shaped like the export's; returns torch
        outputs in the structure the module returns. Complex inputs are fed as the
        real pairs the model takes, and complex outputs come back complex.

        ``runtime`` is ``"onnxruntime"`` (with every loaded pack's
        ``opreg_configure_session`` applied), ``"reference"`` (``onnx.reference``
        with the packs' reference kernels) or ``"auto"``.
        """
        _check_runtime(runtime, "auto")
        if runtime == "auto":
            runtime = self.runtime_for()
        feeds = dict(zip(self.input_names, self._flat_inputs(args, kwargs), strict=True))
        feeds.update({s.input: _to_numpy(_as_pair(self.state[s.key])) for s in self.state_slots if s.kind == BUFFER})
        session = self._session(runtime)
        names = [*self.output_names, *(s.output for s in self.state_slots)]
        if runtime == ONNXRUNTIME and self._has_bfloat16(feeds):
            results = _run_with_ort_values(session, names, feeds)
        else:
            results = session.run(names, feeds)
        self._advance_state(results[len(self.output_names) :], args, kwargs)
        return self._unflatten(results[: len(self.output_names)])

    def _advance_state(self, updates: Sequence[Any], args: tuple, kwargs: dict[str, Any]) -> None:
        """Keep the buffers' new values, and write the inputs' into the tensors given, as eager PyTorch does."""
        if not self.state_slots:
            return
        given = dict(zip(self.input_names, self._input_tensors(args, kwargs), strict=True))
        for slot, update in zip(self.state_slots, updates, strict=True):
            if slot.kind == BUFFER:  # a complex buffer travels as its real pair
                self.state[slot.key] = _to_torch(update, complex=self.state[slot.key].is_complex())
            else:
                with torch.no_grad():
                    given[slot.input].copy_(_to_torch(update, complex=given[slot.input].is_complex()))

    def _has_bfloat16(self, feeds: dict[str, np.ndarray]) -> bool:
        outputs = [v.dtype for v in self.model.graph.outputs]
        return ir.DataType.BFLOAT16 in outputs or any(a.dtype.name == "bfloat16" for a in feeds.values())

    def verify(
        self,
        *args: Any,
        rtol: float = 1e-4,
        atol: float = 1e-4,
        runtime: str = "auto",
        locate: bool = False,
        **kwargs: Any,
    ) -> Verification:
        """Run the model and eager PyTorch on the same inputs and compare every output.

        Each output must match in shape and dtype and satisfy
        ``|onnx - eager| <= atol + rtol * |eager|`` everywhere. Each side runs on its own copy of the
        inputs, so a model that updates an input in place never changes the caller's tensor. Returns a
        :class:`Verification` (the runtime used, one :class:`OutputCheck` per
        output); raises :class:`VerificationError` listing the mismatches. With
        ``locate=True`` a mismatch is also located (:meth:`locate`, on the same
        inputs and tolerances): the error's message ends with the report and its
        ``location`` attribute holds it.
        ``runtime="auto"`` uses ONNX Runtime when it can run every domain in
        the model, else the reference evaluator.
        """
        _check_tolerances(rtol, atol)
        _check_runtime(runtime, "auto")
        if not isinstance(locate, bool):
            raise InvalidArgumentError(f"locate= takes True or False, got {type(locate).__name__} {locate!r}")
        self.adapt_torch_inputs_to_onnx(*args, **kwargs)  # wrong inputs get opreg's error, not torch's
        self._check_eager("verify")
        if runtime == "auto":
            runtime = self.runtime_for()
        saved = dict(self.state)
        # Each side its own copy: a model may update an input in place (exported as state, or dropped
        # with state="drop"), and verify never changes the caller's tensors.
        eager_inputs, onnx_inputs = copy.deepcopy((args, kwargs)), copy.deepcopy((args, kwargs))
        # Behind the capture lock: while another thread captures, torch marks the whole process as
        # exporting, and the functions it keeps from dynamo (a custom op's Python kernel,
        # torch.manual_seed) then edit its global trace metadata, which is not thread-safe.
        with TRACING_LOCK:
            if isinstance(self._module, torch.export.ExportedProgram):  # made when first needed: it costs
                self._module = self._module.module()
            module = self._module
            with torch.no_grad(), _buffers_kept(module):  # the call may update buffers (batch-norm statistics)
                for key, value in self.state.items():  # eager starts from the state the model is fed
                    module.get_buffer(key).copy_(value)
                expected = module(*eager_inputs[0], **eager_inputs[1])
                updated = {key: module.get_buffer(key).clone() for key in self.state}
        try:
            got = self.run(*onnx_inputs[0], runtime=runtime, **onnx_inputs[1])
            exp_leaves = torch.utils._pytree.tree_leaves(expected)
            got_leaves = torch.utils._pytree.tree_leaves(got)
            names = [s.name or f"constant_{i}" for i, s in enumerate(self._outputs)]
            for slot in self.state_slots:  # and the state it leaves
                names.append(slot.output)
                if slot.kind == BUFFER:
                    exp_leaves.append(updated[slot.key])
                    got_leaves.append(self.state[slot.key])
                else:
                    exp_leaves.append(self._input_tensors(*eager_inputs)[self.input_names.index(slot.input)])
                    got_leaves.append(self._input_tensors(*onnx_inputs)[self.input_names.index(slot.input)])
        finally:
            self.state = saved  # verify leaves the state as it found it
        if len(exp_leaves) != len(got_leaves):
            raise VerificationError(
                f"eager PyTorch returned {len(exp_leaves)} values, the ONNX model {len(got_leaves)}"
            )
        checks = tuple(
            compare_output(n, g, e, rtol, atol) for n, g, e in zip(names, got_leaves, exp_leaves, strict=True)
        )
        bad = [c for c in checks if not c.ok]
        if bad:
            lines = "\n".join(f"  {c}" for c in bad)
            location = self.locate(*args, rtol=rtol, atol=atol, runtime=runtime, **kwargs) if locate else None
            where = f"\nwhere it goes wrong:\n{location}" if location is not None else ""
            error = VerificationError(
                f"{len(bad)} of {len(checks)} output(s) differ from eager PyTorch "
                f"({runtime}, rtol={rtol}, atol={atol}):\n{lines}{where}{self._random_hint()}"
                f"{self._saturation_hint(runtime)}",
                checks,
            )
            error.location = location
            raise error
        return Verification(runtime, checks)

    def _check_eager(self, what: str) -> None:
        """Refuse to compare with a module whose weights are on the ``meta`` device (no values)."""
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

    def locate(
        self, *args: Any, rtol: float = 1e-4, atol: float = 1e-4, runtime: str = "auto", **kwargs: Any
    ) -> Location:
        """Compare every intermediate value with eager PyTorch and say where the model goes wrong.

        Runs the exported program's graph once in eager PyTorch, keeping every node's value,
        and the model once with those values exposed as extra outputs; each node's value is
        compared in ``|onnx - eager| / (atol + rtol * |eager|)`` terms, and each one out of
        tolerance is replayed: its torch op on the model's own inputs to it. Returns a
        :class:`opreg.exporter.Location`: ``verdict`` (``ok``, ``fault`` or ``drift``),
        ``suspects`` (the impls and rewrite rules that compute another function than
        torch), ``divergences`` (each with torch op, pack, impl and its ``file:line``,
        rule, source line and error), ``path`` and ``grew_most`` (where the error grew).
        """
        from opreg.exporter import _locate

        _check_tolerances(rtol, atol)
        _check_runtime(runtime, "auto")
        self._check_eager("locate")
        leaves = self._flatten_call(args, kwargs)
        feeds = dict(zip(self.input_names, self._flat_inputs(args, kwargs), strict=True))
        if runtime == "auto":
            runtime = self.runtime_for()
        if not self._traces:
            raise OpregError("this program has no record of what each node became: export it again with opreg.export")
        return _locate.locate(
            program=self.exported_program, traces=self._traces, model=self.model, user_leaves=leaves, feeds=feeds,
            run=self._run_exposed(runtime), runtime=runtime, rtol=rtol, atol=atol, outputs=self._output_nodes(),
            inside=lambda module, inputs: self._locate_body(module, inputs, runtime, rtol, atol),
        )  # fmt: skip

    def _locate_body(self, module: torch.fx.GraphModule, inputs: tuple, runtime: str, rtol: float, atol: float):
        """A control-flow body exported on its own, with this export's registry and target, and located."""
        if self.exporter is None:
            raise OpregError("this program does not know the exporter that made it")
        body = self.exporter(module, inputs, target=self.target, registry=self.registry)
        return body.locate(*inputs, rtol=rtol, atol=atol, runtime=runtime)

    def _output_nodes(self) -> dict[str, str]:
        """The FX nodes the model returns (by name) -> the ONNX outputs they became."""
        from torch.export.graph_signature import OutputKind

        output = next(n for n in self.exported_program.graph.nodes if n.op == "output")
        results = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        specs = self.exported_program.graph_signature.output_specs
        user = [r for r, s in zip(results, specs, strict=True) if s.kind == OutputKind.USER_OUTPUT]
        return {
            r.name: slot.name
            for r, slot in zip(user, self._outputs, strict=True)
            if isinstance(r, torch.fx.Node) and slot.name is not None
        }

    def _run_exposed(self, runtime: str) -> Any:
        """``run(model, names, feeds)``: a copy of the model (with extra outputs) run in ``runtime``."""
        from opreg.exporter import _runtime

        def run(model: ir.Model, names: list[str], feeds: dict[str, np.ndarray]) -> list[torch.Tensor]:
            if runtime == ONNXRUNTIME:
                session = _runtime.onnxruntime_session(model, self.registry.packs)
                if self._has_bfloat16(feeds) or any(v.dtype == ir.DataType.BFLOAT16 for v in model.graph.outputs):
                    results = _run_with_ort_values(session, names, feeds)
                else:
                    results = session.run(names, feeds)
            else:
                results = _runtime.reference_evaluator(model, self.registry.packs).run(names, feeds)
            return [_to_torch(r) for r in results]

        return run

    def _saturation_hint(self, runtime: str) -> str:
        """Why a QDQ model can differ in ONNX Runtime on this CPU (its int8 kernels saturate), if they do."""
        from opreg import _intkernels

        if runtime != ONNXRUNTIME or not _intkernels.has_int8_weights(self.model):
            return ""
        return _intkernels.saturation_hint(self.model, _intkernels.integer_products_saturate())

    def _random_hint(self) -> str:
        """What to do when a model that draws random numbers does not match value by value."""
        from opreg.exporter._recorder import is_random

        drawn = sorted({n.op_type for n in ir.traversal.RecursiveGraphIterator(self.model.graph) if is_random(n)})
        if not drawn:
            return ""
        return (
            f"\nThe model draws random numbers ({', '.join(drawn)}) from the runtime's generator, not torch's: "
            "its outputs can only match eager PyTorch in distribution. Check them with "
            "opreg.testing.check_samples(..., compare=opreg.testing.Distribution())."
        )


def _check_tolerances(rtol: Any, atol: Any) -> None:
    """verify's and locate's tolerances: finite numbers >= 0, checked before anything runs."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
            raise InvalidArgumentError(f"{name}= takes a tolerance: a finite number >= 0 such as 1e-4, got {value!r}")


def _check_runtime(runtime: Any, *more: str) -> None:
    if not isinstance(runtime, str) or runtime not in (ONNXRUNTIME, REFERENCE, *more):
        names = ", ".join(repr(n) for n in (ONNXRUNTIME, REFERENCE, *more))
        raise InvalidArgumentError(f"runtime= takes {names}, got {runtime!r}")


@contextlib.contextmanager
def _buffers_kept(module: torch.nn.Module) -> Iterator[None]:
    """Every buffer of ``module`` as it was before, after the block (the user's module, even
    when its ``forward`` updates buffers in place or assigns new ones)."""
    kept = [(name, buffer, buffer.clone()) for name, buffer in module.named_buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for name, buffer, value in kept:
                owner, _, leaf = name.rpartition(".")
                buffer.copy_(value)
                setattr(module.get_submodule(owner), leaf, buffer)


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


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """numpy has no bfloat16: those go through ml_dtypes, as onnx and onnxruntime read them."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _run_with_ort_values(session: Any, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``session.run`` for models with bfloat16 inputs or outputs, which numpy cannot hold: bfloat16
    goes in as an OrtValue of its bits (``ortvalue_from_numpy_with_onnx_type``) and comes out copied
    from the OrtValue's buffer into an ml_dtypes array."""
    import ctypes

    import ml_dtypes
    import onnxruntime

    values = {}
    for name, array in feeds.items():
        if array.dtype.name == "bfloat16":
            values[name] = onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.array(array, order="C").view(np.uint16), onnx_element_type=int(ir.DataType.BFLOAT16)
            )
        else:
            values[name] = onnxruntime.OrtValue.ortvalue_from_numpy(np.array(array, order="C"))  # 0-d stays 0-d
    results = []
    for value in session.run_with_ort_values(names, values):
        if value.data_type() != "tensor(bfloat16)":
            results.append(value.numpy())
            continue
        shape = value.shape()
        count = int(np.prod(shape, dtype=np.int64))
        bits = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(value.data_ptr())) if count else []
        results.append(np.array(bits, dtype=np.uint16).reshape(shape).view(ml_dtypes.bfloat16))
    return results


def _to_torch(array: Any, complex: bool = False) -> torch.Tensor:
    """A runtime's output as torch; ``complex``: a real pair (trailing dimension of 2) made complex again."""
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    tensor = torch.from_numpy(array)
    if not complex:
        return tensor
    if tensor.numel() == 0:  # view_as_complex wants a unit last stride, which numpy gives no empty array
        return torch.empty(tensor.shape[:-1], dtype=tensor.dtype.to_complex())
    return torch.view_as_complex(tensor.contiguous())


def _as_pair(tensor: torch.Tensor) -> torch.Tensor:
    """A complex tensor as the real tensor with a trailing dimension of 2 the model takes (others as they are)."""
    return torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor


def compare_output(name: str, got: Any, expected: Any, rtol: float, atol: float) -> OutputCheck:
    """How one output ``got`` compares with the eager value ``expected``."""
    if not isinstance(expected, torch.Tensor):
        same = got == expected
        return OutputCheck(name, 0.0, 0.0, bool(same), "" if same else f"{got!r} != {expected!r}")
    expected = expected.detach().cpu()
    if not isinstance(got, torch.Tensor):
        return OutputCheck(name, float("inf"), float("inf"), False, f"got {type(got).__name__}, expected a tensor")
    if tuple(got.shape) != tuple(expected.shape):
        return OutputCheck(
            name, float("inf"), float("inf"), False, f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
        )
    if got.dtype != expected.dtype:
        return OutputCheck(name, float("inf"), float("inf"), False, f"dtype {got.dtype} != {expected.dtype}")
    if got.numel() == 0:
        return OutputCheck(name, 0.0, 0.0, True)
    if expected.dtype == torch.bool or (not expected.dtype.is_floating_point and not expected.is_complex()):
        diff = (got.to(torch.float64) - expected.to(torch.float64)).abs()
        ok = bool(torch.equal(got, expected)) if expected.dtype == torch.bool else bool((diff <= atol).all())
        return OutputCheck(name, float(diff.max()), 0.0, ok, "" if ok else "values differ")
    wide = torch.complex128 if expected.is_complex() else torch.float64  # complex: |got - eager| as torch measures it
    g, e = got.resolve_conj().to(wide), expected.resolve_conj().to(wide)
    close = torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    both = torch.isfinite(g) & torch.isfinite(e)
    diff = (g - e).abs()[both]
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / e.abs()[both].clamp_min(1e-12)).max()) if diff.numel() else 0.0
    ok = bool(close.all())
    detail = "" if ok else f"{int((~close).sum())} of {close.numel()} elements out of tolerance"
    return OutputCheck(name, max_abs, max_rel, ok, detail)
