"""Capture (``torch.export``), decomposition, and what the FX graph says about
where each node came from and what its symbolic dimensions are called."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.opname import OpName
from opreg.registry import Registry
from opreg.targets import Target

_TORCH_DIR = os.path.dirname(torch.__file__)
_OPREG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


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
        return torch.export.export(model, args, dict(kwargs or {}), dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:
        raise ExportError(
            f"torch.export could not capture {type(model).__name__}: {_first_line(e)}\n"
            "opreg exports what torch.export captures; see the error above and "
            "https://pytorch.org/docs/stable/export.html for what it supports."
        ) from e


def decompose(
    program: torch.export.ExportedProgram, registry: Registry, target: Target
) -> torch.export.ExportedProgram:
    """Run the default decompositions, except for every op the registry covers at ``target``.

    So a pack that registers ``aten::gelu.default`` sees gelu nodes, not the
    erf and multiplications torch would break them into. When every node of the
    captured graph already has an impl and nothing mutates, the graph is returned
    as it is: retracing it would change nothing and costs most of an export.
    """
    if _covered_as_captured(program, registry, target):
        return program
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if registry.candidates(OpName.of(op), target):
            del table[op]
    kept = frozenset(table)
    if getattr(program, _DECOMPOSED_WITH, None) == kept:  # already decomposed with this very table
        return program
    try:
        with warnings.catch_warnings():
            # torch deep-copies its own pytree specs here and warns about its own deprecated API
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            decomposed = program.run_decompositions(table)
    except Exception as e:
        raise ExportError(f"torch could not decompose the captured graph: {_first_line(e)}") from e
    setattr(decomposed, _DECOMPOSED_WITH, kept)
    return decomposed


_DECOMPOSED_WITH = "_opreg_decomposed_with"
"""Set on a program :func:`decompose` made: the table it used, so exporting it again
for a target that keeps the same ops does not decompose it again."""


def _covered_as_captured(program: torch.export.ExportedProgram, registry: Registry, target: Target) -> bool:
    """Whether the captured graph is functional and every op in it resolves at ``target``."""
    import operator

    from opreg.exporter._translate import _SYMBOLIC, SKIPPED_OPS

    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        return False
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem or node.target in _SYMBOLIC:
            continue
        fn = node.target
        if not isinstance(fn, torch._ops.OpOverload) or fn._schema.is_mutable:
            return False
        op = OpName.of(fn)
        if str(op) not in SKIPPED_OPS and registry.resolve(op, target, node) is None:
            return False
    return True


def _first_line(error: BaseException, lines: int = 12) -> str:
    """The start of a torch error: enough for its own advice (suggested fixes to
    dynamic shapes run a few lines), not its whole report."""
    text = str(error).strip().splitlines()
    shown = "\n".join(text[:lines]) + ("\n..." if len(text) > lines else "")
    return f"{type(error).__name__}: {shown}"


# -- where a node came from -------------------------------------------------------


def module_path(node: torch.fx.Node) -> str:
    """The dotted path of the innermost module that made ``node`` (``""`` for the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    path = ""
    for value in stack.values():
        if isinstance(value, tuple) and value and isinstance(value[0], str) and not value[0].startswith("_empty"):
            path = value[0]
    return _clean_path(path)


def module_type(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    kind = ""
    for value in stack.values():
        if isinstance(value, tuple) and len(value) > 1 and not str(value[0]).startswith("_empty"):
            kind = value[1] if isinstance(value[1], str) else getattr(value[1], "__qualname__", str(value[1]))
    return kind.rsplit(".", 1)[-1]


def _clean_path(path: str) -> str:
    # Strict-mode captures spell paths as L['self'].layers[0]; normalise to layers.0
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return re.sub(r"\[(?:'([^']*)'|(\d+))\]", lambda m: "." + (m.group(1) or m.group(2)), path).strip(".")


def source_line(node: torch.fx.Node) -> str:
    """``file:line`` of the innermost frame of the user's code that made ``node``."""
    trace = node.meta.get("stack_trace") or ""
    best = ""
    for match in _FRAME.finditer(trace):
        path = match.group("file")
        if path.startswith((_TORCH_DIR, _OPREG_DIR)):
            continue
        best = f"{path}:{match.group('line')}"
    return best


def where(node: torch.fx.Node) -> str:
    """How a node's location is shown to people: module path and source line."""
    path = module_path(node)
    kind = module_type(node)
    parts = [f"{path or '<root>'} ({kind})" if kind else (path or "<root>")]
    line = source_line(node)
    if line:
        parts.append(line)
    return " at ".join(parts)


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
