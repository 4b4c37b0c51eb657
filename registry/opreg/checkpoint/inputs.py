"""A component as torch.export takes it: its module behind a ``forward`` whose parameters are the
inputs' names (:func:`named_module`; a name that is no Python identifier, such as optimum's
``past_key_values.0.decoder.key``, gets one there, and :func:`onnx_names` gives the ONNX model its
own name back), example tensors at the example or the second sizes (:func:`example_inputs`), and
its dims as ``torch.export.Dim`` s (:func:`dynamic_shapes`).

Imports torch: it is imported when a checkpoint's export reaches its first component.
"""

from __future__ import annotations

import inspect
import json
import keyword
import re
from collections.abc import Mapping
from typing import Any

import torch

from opreg.errors import CheckpointError, ExportError
from opreg.exporter._finish import DIM_BOUNDS_KEY
from opreg.loaderapi import Component, DynamicDim, ModelInput

__all__ = [
    "EXAMPLE",
    "OTHER",
    "dynamic_shapes",
    "example_inputs",
    "name_dims",
    "named_module",
    "onnx_names",
    "parameter_names",
]

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


def parameter_names(component: Component) -> tuple[str, ...]:
    """The ``forward`` parameter of each input: its name, or for a name that is no Python
    identifier (``past_key_values.0.decoder.key``, a keyword) the name with ``_`` for what an
    identifier cannot hold, made unique."""
    names = [i.name for i in component.inputs]
    taken = {n for n in names if n.isidentifier() and not keyword.iskeyword(n)}
    parameters = []
    for name in names:
        parameter = name
        if name not in taken:
            base = re.sub(r"\W", "_", name) + ("_" if keyword.iskeyword(name) else "")
            parameter, count = base, 1
            while parameter in taken:
                parameter, count = f"{base}_{count}", count + 1
            taken.add(parameter)
        parameters.append(parameter)
    return tuple(parameters)


def onnx_names(component: Component, program: Any) -> dict[str, str]:
    """``{name opreg gave: the component's name}`` for the inputs and outputs of ``program`` (the
    component's export) whose names differ: a parameter of :func:`parameter_names`, an output whose
    name is no identifier (opreg names outputs after identifiers)."""
    given = (*program.input_names, *program.output_names)
    wanted = (*(i.name for i in component.inputs), *component.outputs)
    return {have: want for have, want in zip(given, wanted, strict=True) if have != want}


def named_module(component: Component, module: torch.nn.Module) -> torch.nn.Module:
    """``module`` as the component's ONNX model: its ``forward`` parameters are the inputs' names
    (so torch.export and opreg name the ONNX inputs after them; :func:`parameter_names`), its
    outputs a dict by their names."""
    names = tuple(i.name for i in component.inputs)
    parameters = [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("self", *parameter_names(component))
    ]

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
    if item.fill == "bbox":  # each box's two corners, sorted per coordinate: (x0, y0) <= (x1, y1)
        assert item.high is not None
        corners = torch.randint(0, item.high, [*shape[:-1], 2, 2], generator=generator).sort(dim=-2).values
        return corners.flatten(-2).to(dtype)
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
    """``torch.export.Dim`` of ``dim``; a multiple as ``multiple * Dim(NAME_divM)``, the range divided;
    an ``auto`` one as ``Dim.AUTO`` within its range."""
    if dim.auto:
        return torch.export.Dim.AUTO(min=dim.min, **({} if dim.max is None else {"max": dim.max}))
    if dim.multiple == 1:
        return torch.export.Dim(dim.name, min=dim.min, **({} if dim.max is None else {"max": dim.max}))
    low = -(-dim.min // dim.multiple)
    bound = {} if dim.max is None else {"max": dim.max // dim.multiple}
    return dim.multiple * torch.export.Dim(f"{dim.name}_div{dim.multiple}", min=low, **bound)


def dynamic_shapes(component: Component) -> tuple[dict[int, Any], ...]:
    """The component's dims as torch.export's ``dynamic_shapes``, by input position."""
    dims = {d.name: _dim(d) for d in component.dims}
    return tuple({i: dims[d] for i, d in enumerate(item.shape) if isinstance(d, str)} for item in component.inputs)


def name_dims(component: Component, program: Any) -> None:
    """Give the component's dims their names in ``program``'s model where torch.export's do not:
    opreg names a ``Dim.AUTO`` dim ``<input>_dim<i>``, a multiple ``M*NAME_divM`` (and torch's
    own symbol, ``s87``, inside the expressions of other sizes); each becomes ``NAME``
    (``(NAME//M)`` inside an expression), in every shape and in the dims' bounds. An
    :class:`opreg.ExportError` when torch fixed one."""
    from torch.export.graph_signature import InputKind

    exported = program.exported_program
    users = [s.arg.name for s in exported.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    values = {n.name: n.meta.get("val") for n in exported.graph.nodes if n.op == "placeholder"}
    onnx_inputs = {v.name: v for v in program.model.graph.inputs}
    symbols: dict[str, tuple[str, int]] = {}  # a symbol as the model writes it -> (the dim's name, its multiple)
    for item, placeholder in zip(component.inputs, users, strict=True):
        for index, name in enumerate(item.shape):
            if not isinstance(name, str):
                continue
            dim, size = component.dim(name), values[placeholder].shape[index]
            expr = size.node.expr if isinstance(size, torch.SymInt) else None
            if expr is None or not expr.free_symbols:
                raise ExportError(
                    f"component {component.name!r}: torch.export fixed {name} (dim {index} of {item.name}) at {size}: "
                    "the model's code branches on that size, so the model would only run at it"
                )
            (symbol,) = expr.free_symbols
            symbols[str(symbol)] = (name, dim.multiple)
            if dim.auto:
                symbols[str(onnx_inputs[item.name].shape[index].value)] = (name, 1)
            elif dim.multiple != 1:
                symbols[f"{name}_div{dim.multiple}"] = (name, dim.multiple)
    _rename_dims(program.model, {k: v for k, v in symbols.items() if k != v[0]})


def _rename_dims(model: Any, symbols: Mapping[str, tuple[str, int]]) -> None:
    """Every symbolic dim of ``model``'s values, and its dims' bounds, with torch's ``symbols``
    renamed; ``M*(NAME//M)`` whole, a multiple's own dim, becomes ``NAME``."""
    import onnx_ir as ir

    if not symbols:
        return
    texts = {symbol: name if multiple == 1 else f"({name}//{multiple})" for symbol, (name, multiple) in symbols.items()}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, texts)) + r")\b")
    whole = re.compile(r"^(\d+)\*\((\w+)//\1\)$")

    def renamed(dim: Any) -> Any:
        if not (isinstance(dim, ir.SymbolicDim) and dim.value):
            return dim
        text = pattern.sub(lambda m: texts[m.group(1)], dim.value)
        multiple = whole.match(text)
        return ir.SymbolicDim(multiple.group(2) if multiple else text)

    graph = model.graph
    for value in [*graph.inputs, *(v for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs)]:
        if value.shape is not None:
            value.shape = ir.Shape([renamed(d) for d in value.shape])
    bounds = model.metadata_props.get(DIM_BOUNDS_KEY)
    if bounds:
        named = {}
        for key, (low, high) in json.loads(bounds).items():
            name, multiple = symbols.get(key, (key, 1))
            named[name] = [low * multiple, high * multiple]
        model.metadata_props[DIM_BOUNDS_KEY] = json.dumps(dict(sorted(named.items())))
