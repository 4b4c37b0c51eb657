"""torch.onnx's argument forms (docs/torch-onnx.md, "torch.onnx.export's arguments"): ``dynamic_axes``
made into ``dynamic_shapes``, dim names given as strings, and ``input_names``/``output_names``.

As torch.onnx 2.13 does (``torch/onnx/_internal/exporter/_dynamic_shapes.py``):

- ``dynamic_axes={"x": {0: "batch"}}`` or ``{"x": [0]}`` names dims by input: ``input_names`` name
  the tensors among the inputs in order (nested ones flattened, as torch.export flattens them), and
  without ``input_names`` the keys are forward's parameter names. A key among ``output_names`` is
  ignored. Each named dim becomes ``Dim.DYNAMIC``, a string keeping its name for the ONNX model.
  (torch.onnx pairs the keys with the inputs in the dict's order; opreg pairs them by name, and
  refuses a key that names no input.)
- A string in ``dynamic_shapes`` (``{0: "batch"}``) is ``Dim.DYNAMIC`` named so.
- ``input_names`` and ``output_names`` rename the ONNX model's first inputs and outputs.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from opreg.errors import InvalidArgumentError


def is_axes(value: Any) -> bool:
    """Whether ``value`` is one tensor's dims in ``dynamic_shapes``: ``{index: spec}`` or ``[spec, ...]``."""
    dims = torch.export.Dim
    kinds = (str, int, type(dims.DYNAMIC), type(dims("probe")))
    if isinstance(value, Mapping):
        return all(isinstance(k, int) and (v is None or isinstance(v, kinds)) for k, v in value.items())
    return isinstance(value, (list, tuple)) and all(v is None or isinstance(v, kinds) for v in value)


def for_torch(spec: Any) -> Any:
    """``spec`` with every string dim name as ``Dim.DYNAMIC`` (what torch.export takes); ``spec``
    itself when it names none."""
    if spec is None or isinstance(spec, str):
        return spec
    leaves, tree = torch.utils._pytree.tree_flatten(spec, is_leaf=is_axes)
    if not any(isinstance(d, str) for axes in leaves if is_axes(axes) for d in _values(axes)):
        return spec
    dynamic = torch.export.Dim.DYNAMIC

    def convert(axes: Any) -> Any:
        if isinstance(axes, Mapping):
            return {k: dynamic if isinstance(v, str) else v for k, v in axes.items()}
        if isinstance(axes, (list, tuple)):
            return type(axes)(dynamic if isinstance(v, str) else v for v in axes)
        return axes

    return torch.utils._pytree.tree_unflatten([convert(a) if is_axes(a) else a for a in leaves], tree)


def _values(axes: Any) -> list[Any]:
    return list(axes.values()) if isinstance(axes, Mapping) else list(axes)


def dynamic_shapes(model: Any, args: tuple, kwargs: Mapping[str, Any] | None, settings: Any) -> Any:
    """The ``dynamic_shapes`` an export's ``settings`` ask for: theirs, or made from ``dynamic_axes``.
    Checks ``input_names`` against the model's tensor inputs first (a model already captured: against
    its user inputs)."""
    if settings.input_names is not None:
        leaves = torch.utils._pytree.tree_leaves((args, dict(kwargs or {})))
        count = sum(isinstance(leaf, torch.Tensor) for leaf in leaves)
        if isinstance(model, torch.export.ExportedProgram):
            count = len(model.graph_signature.user_inputs)
        if len(settings.input_names) > count:
            raise InvalidArgumentError(
                f"input_names= gives {len(settings.input_names)} names, but the model has {count} tensor input(s): "
                "give at most one name per tensor (nested inputs flattened, in forward's order)"
            )
    if settings.dynamic_axes is None:
        return settings.dynamic_shapes
    if isinstance(model, torch.export.ExportedProgram):
        raise InvalidArgumentError("dynamic_axes= is for a torch.nn.Module: an ExportedProgram's dims are already set")
    return from_dynamic_axes(model, args, kwargs, settings.dynamic_axes, settings.input_names, settings.output_names)


def from_dynamic_axes(
    model: Any,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    dynamic_axes: Mapping[str, Any],
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
) -> dict[str, Any]:
    """``dynamic_shapes`` by forward's parameter names for ``dynamic_axes`` (see the module docstring);
    :class:`InvalidArgumentError` for a key that names no input, or input names more than the inputs."""
    bound = _bound(model, args, kwargs)
    tensors = [
        (param, i)
        for param, value in bound.items()
        for i, leaf in enumerate(torch.utils._pytree.tree_leaves(value))
        if isinstance(leaf, torch.Tensor)
    ]
    names = list(input_names) if input_names is not None else [p for p in bound if _is_tensor(bound[p])]
    where = dict(zip(names, tensors, strict=False)) if input_names is not None else {p: (p, 0) for p in names}
    ignored = set(output_names or ())
    unknown = [key for key in dynamic_axes if key not in where and key not in ignored]
    if unknown:
        by = "input_names" if input_names is not None else "forward's tensor parameters (pass input_names= for others)"
        raise InvalidArgumentError(
            f"dynamic_axes names {', '.join(map(repr, unknown))}, which is no input: the inputs are {names} ({by})"
        )
    chosen: dict[tuple[str, int], dict[int, Any]] = {}
    for key, dims in dynamic_axes.items():
        if key in where:
            chosen[where[key]] = (
                dict(dims) if isinstance(dims, Mapping) else dict.fromkeys(dims, torch.export.Dim.DYNAMIC)
            )
    shapes: dict[str, Any] = {}  # torch.export wants every parameter, in its input's structure
    for param, value in bound.items():
        leaves, tree = torch.utils._pytree.tree_flatten(value)
        shapes[param] = torch.utils._pytree.tree_unflatten([chosen.get((param, i)) for i in range(len(leaves))], tree)
    return shapes


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _bound(model: Any, args: tuple, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """forward's parameters, in order, bound to the example inputs."""
    try:
        signature = inspect.signature(model.forward)
        return dict(signature.bind_partial(*args, **dict(kwargs or {})).arguments)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"dynamic_axes= needs the inputs bound to forward's parameters: {e}") from e


def rename(program: Any, input_names: Sequence[str] | None, output_names: Sequence[str] | None) -> None:
    """Rename ``program``'s first inputs and outputs as torch.onnx does; more names than the model has
    inputs (outputs) is an :class:`InvalidArgumentError` naming both counts."""
    names: dict[str, str] = {}
    ends = (("input", input_names, program.input_names), ("output", output_names, program.output_names))
    for what, given, have in ends:
        if given is None:
            continue
        if len(given) > len(have):
            raise InvalidArgumentError(
                f"{what}_names= gives {len(given)} names, but the model has {len(have)} {what}(s): {list(have)}"
            )
        names.update((old, new) for old, new in zip(have, given, strict=False) if old != new)
    if names:
        program.rename(names)
