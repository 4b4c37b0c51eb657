"""A torch call of the exported module, and the ONNX model's inputs and outputs: which leaves of
``(args, kwargs)`` the model takes, checked and converted (a complex tensor as its real pair, a dynamic
int as a 0-d tensor, an argument the export made a constant checked against its value then), and the
model's outputs put back in the structure the module returns. :class:`opreg.exporter.OnnxProgram`
holds one (``program.calls``); running, verifying and locating the model use it.
"""

from __future__ import annotations

import enum
import inspect
import math
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
import torch

from opreg.errors import ExportError, InvalidArgumentError, InvalidInputError
from opreg.exporter._capture import TRACING_LOCK, constant_inputs, symbolic_int_inputs
from opreg.exporter.diagnosis.compare import as_pair
from opreg.exporter.diagnosis.run import to_torch
from opreg.values import is_complex


class Calls:
    """How a call of the module, as the export's example called it, maps onto the ONNX model.

    Built from the module (or ``ExportedProgram``) exported, its ``ExportedProgram``, the structures of
    its inputs and outputs (``in_spec``, ``out_spec``: torch's pytree specs) and ``input_leaves``: the
    index, among the flattened ``(args, kwargs)``, of the leaf each ONNX input takes.
    """

    def __init__(
        self,
        module: torch.nn.Module | torch.export.ExportedProgram,
        exported_program: torch.export.ExportedProgram,
        in_spec: Any,
        out_spec: Any,
        input_leaves: Sequence[int],
    ) -> None:
        self._module = module
        self.in_spec = in_spec
        self.out_spec = out_spec
        self.input_leaves = tuple(input_leaves)
        self._constants = constant_inputs(exported_program, module)
        self._int_inputs = frozenset(symbolic_int_inputs(exported_program))

    def onnx_inputs(
        self, args: tuple, kwargs: dict[str, Any], names: Sequence[str], inputs: Sequence[ir.Value]
    ) -> list[torch.Tensor]:
        """The tensors among ``module(*args, **kwargs)``'s inputs for the model's inputs (``names``,
        their values ``inputs``), in their order (:meth:`opreg.exporter.OnnxProgram.adapt_torch_inputs_to_onnx`)."""
        leaves = self.leaves(args, kwargs)
        for index, (name, exported) in self._constants.items():
            _check_constant(name, leaves[index], exported)
        tensors = []
        for index, name, value_info in zip(self.input_leaves, names, inputs, strict=False):
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
        leaves = self.leaves(args, kwargs)
        return [leaves[index] for index in self.input_leaves]

    def _flat(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
        pytree = torch.utils._pytree
        kwarg_spec = self.in_spec.child(1) if self.in_spec.num_children == 2 else None
        if kwarg_spec is not None and kwarg_spec.context and set(kwargs) == set(kwarg_spec.context):
            kwargs = {key: kwargs[key] for key in kwarg_spec.context}  # the export's keyword order
        return pytree.tree_flatten((args, kwargs))

    def leaves(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        """The leaves of ``(args, kwargs)`` in the export's structure: a call that spells the
        arguments otherwise (a keyword given by position, a default left out) is bound to the
        module's ``forward`` first."""
        leaves, spec = self._flat(args, kwargs)
        if spec != self.in_spec:
            rebound = _rebind(self._module, self.in_spec, args, kwargs)
            if rebound is not None:
                leaves, spec = self._flat(*rebound)
        if spec != self.in_spec:
            raise InvalidInputError(
                f"the inputs do not have the structure of the export's example inputs: expected "
                f"{_describe_inputs(self.in_spec)}, got {_describe_inputs(spec)}"
            )
        return leaves

    def onnx_outputs(self, outputs: Any, slots: Sequence[Any]) -> list[torch.Tensor]:
        """The tensors among the module's ``outputs`` for the model's output ``slots`` (an
        :class:`opreg.exporter._program.OutputSlot` per leaf), in the ONNX outputs' order (a complex
        tensor as the real pair the model returns)."""
        leaves = torch.utils._pytree.tree_leaves(outputs)
        if len(leaves) != len(slots):
            raise ExportError(f"expected {len(slots)} output values like the export's, got {len(leaves)}")
        return [as_pair(leaf) for leaf, slot in zip(leaves, slots, strict=True) if slot.name is not None]

    def torch_outputs(self, results: Sequence[Any], names: Sequence[str], slots: Sequence[Any]) -> Any:
        """The model's output values (in ``names``' order) in the structure the module returns, as
        torch (a complex output made complex again; a constant torch baked in put back)."""
        by_name = dict(zip(names, results, strict=True))
        leaves = [to_torch(by_name[s.name], s.complex) if s.name is not None else s.value for s in slots]
        return torch.utils._pytree.tree_unflatten(leaves, self.out_spec)

    def eager(self, what: str, streamed: bool) -> torch.nn.Module:
        """The module to compare with in eager PyTorch (made from an ``ExportedProgram`` when first
        needed); ``what`` (``verify``, ``locate``) names the caller in the error for a module whose
        weights are on the ``meta`` device (no values to compare with; ``streamed``: the export read
        them from a checkpoint)."""
        module = self._module
        if (
            streamed
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
