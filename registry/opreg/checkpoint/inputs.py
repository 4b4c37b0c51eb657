"""A component as torch.export takes it: its module behind a ``forward`` whose parameters are the
inputs' names (:func:`named_module`), example tensors at the example or the second sizes
(:func:`example_inputs`), and its dims as ``torch.export.Dim`` s (:func:`dynamic_shapes`).

Imports torch: it is imported when a checkpoint's export reaches its first component.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from opreg.errors import CheckpointError
from opreg.loaderapi import Component, DynamicDim, ModelInput

__all__ = ["EXAMPLE", "OTHER", "dynamic_shapes", "example_inputs", "name_ends", "named_module"]

EXAMPLE = "example"
OTHER = "other"
_SEED = 0


class _Named(torch.nn.Module):
    """``module`` called with the inputs by name; the outputs picked by name (from a mapping, a
    ``ModelOutput``), by position (from a tuple) or alone (one tensor), returned as a dict so the
    ONNX outputs get their names."""

    def __init__(self, module: torch.nn.Module, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model = module
        self.input_names = inputs
        self.output_names = outputs

    def forward(self, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        result = self.model(**dict(zip(self.input_names, tensors, strict=True)))
        if isinstance(result, torch.Tensor):
            result = (result,)
        if isinstance(result, Mapping):
            missing = [n for n in self.output_names if n not in result]
            if missing:
                raise CheckpointError(
                    f"{type(self.model).__name__} returns no output {missing[0]!r} (it returns "
                    f"{', '.join(map(str, result.keys()))}): the loader named an output the model does not give"
                )
            return {name: result[name] for name in self.output_names}
        if len(result) != len(self.output_names):
            raise CheckpointError(
                f"{type(self.model).__name__} returns {len(result)} outputs, the loader names {len(self.output_names)}"
            )
        return dict(zip(self.output_names, result, strict=True))


def named_module(component: Component, module: torch.nn.Module) -> torch.nn.Module:
    """``module`` as the component's ONNX model: its ``forward`` parameters are the inputs' names
    (so torch.export and opreg name the ONNX inputs after them), its outputs a dict by their names."""
    names = tuple(i.name for i in component.inputs)
    parameters = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("self", *names)]

    class Named(_Named):
        def forward(self, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
            return super().forward(*tensors)

    Named.forward.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    Named.__name__ = Named.__qualname__ = type(module).__name__
    return Named(module.eval(), names, component.outputs).eval()


def _sizes(component: Component, which: str) -> dict[str, int]:
    return {d.name: getattr(d, which) for d in component.dims}


def _tensor(item: ModelInput, shape: list[int], generator: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, item.dtype)
    if item.fill == "ids":
        assert item.high is not None
        return torch.randint(0, item.high, shape, generator=generator).to(dtype)
    if item.fill == "normal":
        return torch.randn(shape, generator=generator).to(dtype)
    if item.fill == "uniform":
        return torch.rand(shape, generator=generator).to(dtype)
    value = torch.zeros(shape, dtype=dtype) if item.fill == "zeros" else torch.ones(shape, dtype=dtype)
    if item.fill == "mask" and len(shape) >= 2 and shape[0] > 1 and shape[-1] > 1:
        value[-1, ..., shape[-1] // 2 + 1 :] = 0  # the last row padded: a mask that is all ones hides wrong masking
    return value


def example_inputs(component: Component, which: str = EXAMPLE) -> tuple[torch.Tensor, ...]:
    """The component's inputs at its dims' ``example`` or ``other`` sizes (``which``), in order,
    made from a fixed seed."""
    sizes = _sizes(component, which)
    generator = torch.Generator().manual_seed(_SEED)
    return tuple(
        _tensor(item, [sizes[d] if isinstance(d, str) else d for d in item.shape], generator)
        for item in component.inputs
    )


def _dim(dim: DynamicDim) -> Any:
    """``torch.export.Dim`` of ``dim``; a multiple as ``multiple * Dim(NAME_divM)``, the range divided."""
    if dim.multiple == 1:
        return torch.export.Dim(dim.name, min=dim.min, **({} if dim.max is None else {"max": dim.max}))
    low = -(-dim.min // dim.multiple)
    bound = {} if dim.max is None else {"max": dim.max // dim.multiple}
    return dim.multiple * torch.export.Dim(f"{dim.name}_div{dim.multiple}", min=low, **bound)


def dynamic_shapes(component: Component) -> tuple[dict[int, Any], ...]:
    """The component's dims as torch.export's ``dynamic_shapes``, by input position."""
    dims = {d.name: _dim(d) for d in component.dims}
    return tuple({i: dims[d] for i, d in enumerate(item.shape) if isinstance(d, str)} for item in component.inputs)


def name_ends(program: Any, component: Component) -> None:
    """Name the exported model's inputs, outputs and their dims exactly as ``component`` declares
    them: an output name the exporter cleaned (``hidden_states.0`` became ``hidden_states_0``) back to
    the declared one, each input's dims to its :class:`ModelInput` shape's names, and a dim of
    multiples (``2*height_div2``, as :func:`dynamic_shapes` makes it) to its :class:`DynamicDim`'s name
    in the outputs too."""
    import onnx_ir as ir

    renames = {old: new for old, new in zip(program.output_names, component.outputs, strict=False) if old != new}
    if renames:
        program.rename(renames)
    graph = program.model.graph
    multiples = {f"{d.multiple}*{d.name}_div{d.multiple}": d.name for d in component.dims if d.multiple > 1}
    for item, value in zip(component.inputs, graph.inputs, strict=False):
        if value.shape is not None and len(value.shape) == len(item.shape):
            dims = zip(item.shape, value.shape.dims, strict=True)
            value.shape = ir.Shape([d if isinstance(d, str) else old for d, old in dims])
    for value in graph.outputs:
        if value.shape is not None:
            value.shape = ir.Shape([multiples.get(str(d), d) for d in value.shape.dims])
