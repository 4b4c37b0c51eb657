"""Running an exported model: ONNX Runtime or the reference evaluator, on torch inputs, with its state."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import onnx_ir as ir
import torch

from opreg.errors import InvalidArgumentError, RuntimeUnavailableError
from opreg.exporter._state import BUFFER
from opreg.exporter.diagnosis.compare import as_pair

logger = logging.getLogger(__name__)

ONNXRUNTIME = "onnxruntime"
REFERENCE = "reference"


class Runner:
    """What runs an exported model: an ONNX Runtime session (every loaded pack's
    ``opreg_configure_session`` applied) or ``onnx.reference`` with the packs' reference kernels,
    each made once per runtime, and which of them ``runtime="auto"`` picks.

    ``host`` is the packs' host the model was exported with (an export's ``host``: their
    session configuration and reference kernels), not the registry.
    """

    def __init__(self, host: Any) -> None:
        self.host = host
        self._sessions: dict[str, Any] = {}
        self._choice: str | None = None  # what runtime="auto" runs, once found

    def forget(self) -> None:
        """Drop the sessions made so far (the model's inputs or outputs were renamed)."""
        self._sessions.clear()

    def session(self, model: ir.Model, runtime: str) -> Any:
        """The ONNX Runtime session or reference evaluator of ``model``, made once."""

        session = self._sessions.get(runtime)
        if session is None:
            session = self._open(model, runtime)
            self._sessions[runtime] = session
        return session

    def _open(self, model: ir.Model, runtime: str) -> Any:
        from opreg.exporter import _runtime

        if runtime == ONNXRUNTIME:
            return _runtime.onnxruntime_session(model, self.host)
        return _runtime.reference_evaluator(model, self.host)

    def choose(self, model: ir.Model) -> str:
        """``onnxruntime`` if it can run every op in ``model``, else ``reference`` (see
        :meth:`opreg.exporter.OnnxProgram.runtime_for`)."""
        from opreg.exporter import _runtime

        if self._choice is not None:
            return self._choice
        self._choice = ONNXRUNTIME
        try:
            self.session(model, ONNXRUNTIME)  # kept for run()
        except RuntimeUnavailableError as e:
            cause = e.__cause__ if e.__cause__ is not None else e
            if not _runtime.builtin_domains_only(model):
                self._choice = REFERENCE
            elif _runtime.missing_random_kernel(cause):
                logger.info("ONNX Runtime cannot run the model (%s); using the reference evaluator", cause)
                self._choice = REFERENCE
        return self._choice

    def run(self, model: ir.Model, runtime: str, names: list[str], feeds: dict[str, np.ndarray]) -> list[Any]:
        """The values ``names`` of ``model`` (the model the sessions were made for) on ``feeds``."""
        return _run(self.session(model, runtime), model, runtime, names, feeds)

    def run_copy(self, model: ir.Model, runtime: str, names: list[str], feeds: dict[str, Any]) -> list[torch.Tensor]:
        """As :meth:`run`, for a model made for one call (``locate``'s copy with extra outputs), as torch."""
        return [to_torch(r) for r in _run(self._open(model, runtime), model, runtime, names, feeds)]


class TorchCalls(Protocol):
    """How torch calls map to an exported program's ONNX inputs and outputs
    (:class:`opreg.exporter._calls.Calls` is one)."""

    def leaves(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]: ...
    def input_values(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]: ...
    def torch_outputs(self, results: Sequence[Any], names: Sequence[str], slots: Sequence[Any]) -> Any: ...
    def eager(self, what: str, streamed: bool) -> torch.nn.Module: ...


class Program(Protocol):
    """What diagnosis reads of an exported program (:class:`opreg.exporter.OnnxProgram` is one):
    the model and its names, the state it is fed, and how torch calls map to ONNX inputs and outputs."""

    model: ir.Model
    target: Any
    exporter: Any
    streamed: bool
    calls: TorchCalls
    exported_program: torch.export.ExportedProgram
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    output_slots: tuple[Any, ...]
    state_slots: tuple[Any, ...]
    state: dict[str, torch.Tensor]
    traces: dict[str, Any]
    runner: Runner

    def adapt_torch_inputs_to_onnx(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]: ...
    def runtime_for(self) -> str: ...
    def run(self, *args: Any, runtime: str = ONNXRUNTIME, **kwargs: Any) -> Any: ...
    def locate(
        self, *args: Any, rtol: float | None = ..., atol: float | None = ..., runtime: str = ..., **kwargs: Any
    ) -> Any: ...


NUMPY_LACKS = (
    ir.DataType.BFLOAT16,
    ir.DataType.FLOAT8E4M3FN,
    ir.DataType.FLOAT8E4M3FNUZ,
    ir.DataType.FLOAT8E5M2,
    ir.DataType.FLOAT8E5M2FNUZ,
)
"""Types numpy has no dtype for: they travel as ml_dtypes arrays (as onnx and onnxruntime read them),
into and out of ONNX Runtime as OrtValues of their bits."""


def _lacking() -> dict[str, tuple[ir.DataType, torch.dtype, type]]:
    """ml_dtypes' name of each of :data:`NUMPY_LACKS` -> the ONNX type, torch's, and the unsigned
    integer numpy type of its bits."""
    from onnx_ir import tensor_adapters

    return {
        np.dtype(dtype.numpy()).name: (
            dtype,
            tensor_adapters.to_torch_dtype(dtype),
            np.uint16 if dtype.itemsize == 2 else np.uint8,
        )
        for dtype in NUMPY_LACKS
    }


def _run(session: Any, model: ir.Model, runtime: str, names: list[str], feeds: dict[str, np.ndarray]) -> list[Any]:
    lacking = _lacking()
    outputs = any(v.dtype in NUMPY_LACKS for v in model.graph.outputs)
    if runtime == ONNXRUNTIME and (outputs or any(a.dtype.name in lacking for a in feeds.values())):
        return _run_with_ort_values(session, names, feeds)
    return session.run(names, feeds)


def check_runtime(runtime: Any, *more: str) -> None:
    """``runtime=`` is one this module runs (or one of ``more``, such as ``"auto"``)."""
    if not isinstance(runtime, str) or runtime not in (ONNXRUNTIME, REFERENCE, *more):
        names = ", ".join(repr(n) for n in (ONNXRUNTIME, REFERENCE, *more))
        raise InvalidArgumentError(f"runtime= takes {names}, got {runtime!r}")


def run_program(program: Program, args: tuple, kwargs: dict[str, Any], runtime: str) -> Any:
    """:meth:`opreg.exporter.OnnxProgram.run`: the model run on torch inputs, its state kept."""
    check_runtime(runtime, "auto")
    if runtime == "auto":
        runtime = program.runtime_for()
    inputs = [to_numpy(t) for t in program.adapt_torch_inputs_to_onnx(*args, **kwargs)]
    feeds = dict(zip(program.input_names, inputs, strict=True))
    feeds.update({s.input: to_numpy(as_pair(program.state[s.key])) for s in program.state_slots if s.kind == BUFFER})
    names = [*program.output_names, *(s.output for s in program.state_slots)]
    results = program.runner.run(program.model, runtime, names, feeds)
    _advance_state(program, results[len(program.output_names) :], args, kwargs)
    names = program.output_names
    return program.calls.torch_outputs(results[: len(names)], names, program.output_slots)


def _advance_state(program: Program, updates: Sequence[Any], args: tuple, kwargs: dict[str, Any]) -> None:
    """Keep the buffers' new values, and write the inputs' into the tensors given, as eager PyTorch does."""
    if not program.state_slots:
        return
    given = dict(zip(program.input_names, program.calls.input_values(args, kwargs), strict=True))
    for slot, update in zip(program.state_slots, updates, strict=True):
        if slot.kind == BUFFER:  # a complex buffer travels as its real pair
            program.state[slot.key] = to_torch(update, complex=program.state[slot.key].is_complex())
        else:
            with torch.no_grad():
                given[slot.input].copy_(to_torch(update, complex=given[slot.input].is_complex()))


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """numpy has no bfloat16 or float8 types: those go through ml_dtypes, as onnx and onnxruntime read them."""
    tensor = tensor.detach().cpu()
    for dtype, torch_dtype, bits in _lacking().values():
        if tensor.dtype == torch_dtype:
            return tensor.view(_TORCH_BITS[bits]).numpy().view(dtype.numpy())
    return tensor.numpy()


_TORCH_BITS = {np.uint8: torch.uint8, np.uint16: torch.uint16}


def _run_with_ort_values(session: Any, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``session.run`` for models with bfloat16 or float8 inputs or outputs, which numpy cannot hold:
    such a value goes in as an OrtValue of its bits (``ortvalue_from_numpy_with_onnx_type``) and comes
    out copied from the OrtValue's buffer into an ml_dtypes array."""

    import onnxruntime

    from opreg.exporter._kernels import type_string

    lacking = _lacking()
    by_type = {type_string(dtype): (dtype, bits) for dtype, _, bits in lacking.values()}
    values = {}
    for name, array in feeds.items():
        if array.dtype.name in lacking:
            dtype, _, bits = lacking[array.dtype.name]
            values[name] = onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.array(array, order="C").view(bits), onnx_element_type=int(dtype)
            )
        else:
            values[name] = onnxruntime.OrtValue.ortvalue_from_numpy(np.array(array, order="C"))  # 0-d stays 0-d
    results = []
    for value in session.run_with_ort_values(names, values):
        if value.data_type() not in by_type:
            results.append(value.numpy())
            continue
        dtype, bits = by_type[value.data_type()]
        shape = value.shape()
        count = int(np.prod(shape, dtype=np.int64))
        raw = np.ctypeslib.as_array((np.ctypeslib.as_ctypes_type(bits) * count).from_address(value.data_ptr()))
        results.append(np.array(raw if count else [], dtype=bits).reshape(shape).view(dtype.numpy()))
    return results


def to_torch(array: Any, complex: bool = False) -> torch.Tensor:
    """A runtime's output as torch (bfloat16 and float8 arrays, ml_dtypes', as torch's dtypes);
    ``complex``: a real pair (trailing dimension of 2) made complex again."""
    array = np.asarray(array)
    lacking = _lacking()
    if array.dtype.name in lacking:
        _, torch_dtype, bits = lacking[array.dtype.name]
        return torch.from_numpy(array.view(bits)).view(torch_dtype)
    tensor = torch.from_numpy(array)
    if not complex:
        return tensor
    if tensor.numel() == 0:  # view_as_complex wants a unit last stride, which numpy gives no empty array
        return torch.empty(tensor.shape[:-1], dtype=tensor.dtype.to_complex())
    return torch.view_as_complex(tensor.contiguous())
