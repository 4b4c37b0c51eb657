"""Capture: ``torch.export`` of the user's module, and the names of its symbolic dimensions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from opreg.errors import ExportError


def capture(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    dynamic_shapes: Any,
) -> torch.export.ExportedProgram:
    """``torch.export.export`` in non-strict mode, with errors that say what failed.

    An ``ExportedProgram`` is taken as already captured."""
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise ExportError(
            f"opreg.export needs a torch.nn.Module, got {type(model).__name__}: wrap a function in a Module"
        )
    if not isinstance(args, tuple):
        args = (args,)
    try:
        with onnx_exporting():
            return torch.export.export(model, args, dict(kwargs or {}), dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:
        raise ExportError(
            f"torch.export could not capture {type(model).__name__}: {first_lines(e)}\n"
            "opreg exports what torch.export captures; see the error above and "
            "https://pytorch.org/docs/stable/export.html for what it supports."
        ) from e


@contextlib.contextmanager
def onnx_exporting() -> Iterator[None]:
    """``torch.onnx.is_in_onnx_export()`` is true inside, as during ``torch.onnx.export``:
    models take their ONNX path there (``torch.onnx.ops.symbolic`` in place of eager code).
    torch keeps the flag in a private module; without it, nothing is set."""
    try:
        from torch.onnx._internal.exporter import _flags
    except ImportError:  # another torch: the flag lives elsewhere
        yield
        return
    previous = getattr(_flags, "_is_onnx_exporting", False)
    _flags._is_onnx_exporting = True
    try:
        yield
    finally:
        _flags._is_onnx_exporting = previous


def first_lines(error: BaseException, lines: int = 12) -> str:
    """The start of a torch error: enough for its own advice (suggested fixes to
    dynamic shapes run a few lines), not its whole report."""
    text = str(error).strip().splitlines()
    shown = "\n".join(text[:lines]) + ("\n..." if len(text) > lines else "")
    return f"{type(error).__name__}: {shown}"


# -- names of symbolic dimensions ----------------------------------------------------


def dim_names(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    program: torch.export.ExportedProgram,
    spec: Any,
) -> dict[str, str]:
    """Map torch's symbols (``s77``) to the names users gave their ``Dim``s (``batch``).

    Walks ``dynamic_shapes`` beside the example inputs, so any spelling
    torch accepts (by name, by position, nested) is understood; dims with no
    name (``Dim.AUTO``) keep a readable ``<input>_dim<i>``.
    """
    if spec is None:
        return {}
    import inspect

    named: dict[int, dict[int, str]] = {}  # id(example tensor) -> dim index -> name

    def walk(value: Any, shapes: Any) -> None:
        if shapes is None:
            return
        if isinstance(value, torch.Tensor):
            items = shapes.items() if isinstance(shapes, Mapping) else enumerate(shapes)
            for index, dim in items:
                name = getattr(dim, "__name__", None)
                if name and dim is not None and not str(name).startswith(("AUTO", "DYNAMIC", "STATIC")):
                    named.setdefault(id(value), {})[int(index)] = str(name)
            return
        if isinstance(value, Mapping) and isinstance(shapes, Mapping):
            for key, item in value.items():
                if key in shapes:
                    walk(item, shapes[key])
        elif isinstance(value, (list, tuple)) and isinstance(shapes, (list, tuple)):
            for item, sub in zip(value, shapes, strict=False):
                walk(item, sub)
        else:  # dataclasses, ModelOutputs: match their flattened leaves
            leaves = torch.utils._pytree.tree_leaves(value)
            sub_leaves = torch.utils._pytree.tree_leaves(shapes, is_leaf=lambda x: isinstance(x, Mapping))
            for item, sub in zip(leaves, sub_leaves, strict=False):
                walk(item, sub)

    kwargs = dict(kwargs or {})
    try:  # forward's parameters in order, a *args parameter holding its tuple
        bound = dict(inspect.signature(model.forward).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        bound = {**{str(i): a for i, a in enumerate(args)}, **kwargs}
    if isinstance(spec, Mapping):
        for key, value in bound.items():
            walk(value, spec.get(key))
    else:
        for value, shapes in zip(bound.values(), spec, strict=False):
            walk(value, shapes)

    symbols: dict[str, str] = {}
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    user_inputs = [
        s for s in program.graph_signature.input_specs if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for leaf, input_spec in zip(leaves, user_inputs, strict=False):
        names = named.get(id(leaf))
        node = placeholders.get(getattr(input_spec.arg, "name", ""))
        if not names or node is None:
            continue
        value = node.meta.get("val")
        for index, name in names.items():
            if isinstance(value, torch.Tensor) and index < value.dim():
                dim = value.shape[index]
                if isinstance(dim, torch.SymInt):
                    symbols.setdefault(str(dim.node.expr), name)
    return symbols


def input_leaves(program: torch.export.ExportedProgram) -> list[int]:
    """Which leaves of the flattened ``(args, kwargs)`` are the ONNX inputs, in order."""
    from torch.export.graph_signature import InputKind, TensorArgument

    user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return [i for i, spec in enumerate(user) if isinstance(spec.arg, TensorArgument)]
