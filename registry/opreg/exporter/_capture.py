"""Capture: ``torch.export`` of the user's module, and the names of its symbolic dimensions.

``torch.export`` keeps its tracing state in globals (the proxy dispatch mode's slot, the
module-hierarchy and patcher globals of non-strict export): two captures in two threads at
once fail with assertions about that state (measured: 18 of 24 exports from 8 threads;
plain ``torch.export.export`` fails the same way). So opreg captures, and retraces to
decompose, one model at a time per process (:data:`TRACING_LOCK`); translation and
everything after it run in parallel.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.exporter import _pytrees
from opreg.exporter._guards import SIZE_OBLIVIOUS_KEY, GuardSites, size_oblivious
from opreg.packs.patching import FAILED, PatchedCapture

RETRIES = 4
"""How many classes a capture may register as pytree nodes (each costs a capture again)."""

TRACING_LOCK = threading.RLock()
"""Held while torch traces a model (capture, decomposition): torch's tracing state is global.
``torch.export`` called by other code at the same time does not take it."""


def capture(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    dynamic_shapes: Any,
    patches: PatchedCapture | None = None,
    *,
    oblivious: bool = False,
    sites: GuardSites | None = None,
) -> torch.export.ExportedProgram:
    """``torch.export.export`` in non-strict mode, with errors that say what failed.

    An ``ExportedProgram`` is taken as already captured. ``patches``: the packs'
    capture patches, installed around the capture where they apply to ``model``
    (what happened to each is left in ``patches.outcomes``). ``oblivious``: with torch's
    size-oblivious reasoning (:func:`opreg.exporter._guards.size_oblivious`); ``sites``:
    records where each shape guard is added (:mod:`opreg.exporter._dynamic` calls it so)."""
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise ExportError(
            f"opreg.export needs a torch.nn.Module, got {type(model).__name__}: wrap a function in a Module"
        )
    if not isinstance(args, tuple):
        args = (args,)
    check_dynamic_shapes(model, args, kwargs, dynamic_shapes)

    def run() -> torch.export.ExportedProgram:
        _pytrees.register_known_types()
        for attempt in range(RETRIES + 1):
            try:
                with onnx_exporting():
                    return torch.export.export(
                        model, args, dict(kwargs or {}), dynamic_shapes=dynamic_shapes, strict=False
                    )
            except Exception as e:
                # a returned object of a class pytree does not know: register it, and capture again
                if attempt < RETRIES and _pytrees.register_refused_type(e) is not None:
                    continue
                raise
        raise AssertionError("unreachable")

    watching = sites if sites is not None else contextlib.nullcontext()
    # torch's tracing state and settings, pytree's registry and the patched library modules are global
    with TRACING_LOCK, size_oblivious(oblivious), watching:
        try:
            program = run() if patches is None else patches.run(model, run)
        except Exception as e:
            failed = [str(o) for o in (patches.outcomes if patches is not None else ()) if o.status == FAILED]
            raise _capture_error(model, e, failed) from e
    if oblivious:
        program.graph_module.meta[SIZE_OBLIVIOUS_KEY] = True
    return program


def _capture_error(model: torch.nn.Module, e: Exception, failed_patches: list[str]) -> ExportError:
    hint = ""
    if "Unfamiliar meta val" in str(e):  # torch 2.13: an enum (or other object) argument beside dynamic_shapes
        hint = (
            "\nThat value is a non-tensor argument torch.export cannot keep as a constant when dynamic_shapes "
            "is given (it does without dynamic_shapes): fix it in a wrapper module's forward, or pass it as "
            "a bool, int, float or str."
        )
    if failed_patches:
        hint += f"\nCapture patches that failed: {'; '.join(failed_patches)}."
    return ExportError(
        f"torch.export could not capture {type(model).__name__}: {first_lines(e)}{hint}\n"
        "opreg exports what torch.export captures: fix the model or its example inputs, or install a pack "
        "whose capture patches make its library capturable (torch's own traceback is the chained exception, "
        "or `--debug` on the command line; what torch.export supports: https://pytorch.org/docs/stable/export.html)."
    )


@contextlib.contextmanager
def fake_weights(model: torch.nn.Module) -> Iterator[None]:
    """While the block runs, ``model``'s ``meta``-device parameters and buffers are fake CPU tensors
    (no data, as ``meta``; but CPU kernels' layouts, so the capture is the one of the model with its
    weights in memory, node for node: on ``meta`` some ops' results have other strides, and a
    ``contiguous()`` becomes a copy). A weight tied to another stays one tensor. Put back afterwards."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    made: dict[int, torch.Tensor] = {}
    swapped: list[tuple[dict, str, torch.Tensor]] = []

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in made:
            value = FakeTensor(mode, tensor, torch.device("cpu"))
            if isinstance(tensor, torch.nn.Parameter):
                value = torch.nn.Parameter(value, requires_grad=tensor.requires_grad)
            made[id(tensor)] = value
        return made[id(tensor)]

    for module in model.modules():
        for slots in (module._parameters, module._buffers):
            for name, tensor in list(slots.items()):
                if tensor is not None and tensor.device.type == "meta":
                    swapped.append((slots, name, tensor))
                    slots[name] = fake(tensor)
    try:
        yield
    finally:
        for slots, name, tensor in swapped:
            slots[name] = tensor


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


def dynamic_dims(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any] | None, spec: Any):
    """``(input path, example tensor, dim index, dim spec)`` for every dim ``spec`` names, walking
    ``dynamic_shapes`` beside the example inputs so any spelling torch accepts (by name, by
    position, nested) is understood."""
    import inspect

    def walk(path: str, value: Any, shapes: Any):
        if shapes is None:
            return
        if isinstance(value, torch.Tensor):
            items = shapes.items() if isinstance(shapes, Mapping) else enumerate(shapes)
            for index, dim in items:
                if dim is not None:
                    yield path, value, index, dim
            return
        if torch.utils._pytree.tree_is_leaf(value):
            return  # an int made dynamic (Dim.DYNAMIC), or a constant: no dims
        if isinstance(value, Mapping) and isinstance(shapes, Mapping):
            for key, item in value.items():
                if key in shapes:
                    yield from walk(f"{path}[{key!r}]", item, shapes[key])
        elif isinstance(value, (list, tuple)) and isinstance(shapes, (list, tuple)):
            for i, (item, sub) in enumerate(zip(value, shapes, strict=False)):
                yield from walk(f"{path}[{i}]", item, sub)
        else:  # dataclasses, ModelOutputs, caches: match their flattened leaves, named by their key paths
            leaves, _ = torch.utils._pytree.tree_flatten_with_path(value)
            sub_leaves = torch.utils._pytree.tree_leaves(shapes, is_leaf=lambda x: isinstance(x, Mapping))
            for (keys, item), sub in zip(leaves, sub_leaves, strict=False):
                yield from walk(path + "".join(map(_key_text, keys)), item, sub)

    kwargs = dict(kwargs or {})
    try:  # forward's parameters in order, a *args parameter holding its tuple
        bound = dict(inspect.signature(model.forward).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        bound = {**{str(i): a for i, a in enumerate(args)}, **kwargs}
    if isinstance(spec, Mapping):
        for key, value in bound.items():
            yield from walk(key, value, spec.get(key))
    else:
        for (key, value), shapes in zip(bound.items(), spec, strict=False):
            yield from walk(key, value, shapes)


def _key_text(key: Any) -> str:
    """A pytree key as Python spells the access (and torch.export the input's source)."""
    if isinstance(key, torch.utils._pytree.GetAttrKey):
        return f".{key.name}"
    if isinstance(key, torch.utils._pytree.MappingKey):
        return f"[{key.key!r}]"
    return f"[{getattr(key, 'idx', key)}]"


def check_dynamic_shapes(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any] | None, spec: Any) -> None:
    """Refuse a dim index past an input's rank, naming the input (torch says only ``IndexError``)."""
    if spec is None:
        return
    for path, value, index, _ in dynamic_dims(model, args, kwargs, spec):
        rank = value.dim()
        if not isinstance(index, int) or not -rank <= index < rank:
            raise ExportError(
                f"dynamic_shapes names dim {index!r} of input {path!r}, which has {rank} dim(s): "
                f"use 0 to {rank - 1} (or -{rank} to -1)"
            )


def dim_names(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    program: torch.export.ExportedProgram,
    spec: Any,
) -> dict[str, str]:
    """Map torch's symbols (``s77``) to dim names: the names users gave their ``Dim``s (``batch``),
    else ``<input>_dim<i>`` after the first input holding the dim (``Dim.AUTO``, ``Dim.DYNAMIC``,
    ``"auto"``), a dynamic int's sizes after the int. Dims torch proves equal are one symbol, so
    one name; so are the key and value lengths of an attention, which torch does not compare
    (:func:`attention_lengths`)."""
    if spec is None:
        return {}
    named: dict[int, dict[int, str]] = {}  # id(example tensor) -> dim index -> name
    for _, value, index, dim in dynamic_dims(model, args, kwargs, spec):
        name = dim if isinstance(dim, str) else getattr(dim, "__name__", None)  # a string: torch.onnx's name
        if name and not str(name).startswith(("AUTO", "DYNAMIC", "STATIC")):
            named.setdefault(id(value), {})[int(index) % max(value.dim(), 1)] = str(name)

    symbols: dict[str, str] = {}
    unnamed: dict[str, str] = {}
    leaves = torch.utils._pytree.tree_leaves((args, dict(kwargs or {})))
    user_inputs = [
        s for s in program.graph_signature.input_specs if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for leaf, input_spec in zip(leaves, user_inputs, strict=False):
        names = named.get(id(leaf), {})
        node = placeholders.get(getattr(input_spec.arg, "name", ""))
        value = None if node is None else node.meta.get("val")
        if isinstance(value, torch.SymInt) and not getattr(value.node.expr, "is_number", False):
            symbols.setdefault(str(value.node.expr), node.name)  # a dynamic int: sizes it sets are named after it
        if node is None or not isinstance(value, torch.Tensor):
            continue
        for index, dim in enumerate(value.shape):
            if not isinstance(dim, torch.SymInt) or dim.node.expr.is_number:
                continue
            if index in names:
                symbols.setdefault(str(dim.node.expr), names[index])
            elif dim.node.expr.is_Symbol:
                unnamed.setdefault(str(dim.node.expr), f"{node.name}_dim{index}")
    given = set(symbols)
    for symbol, name in unnamed.items():
        symbols.setdefault(symbol, name)
    for first, second in attention_lengths(program):
        kept, alias = (second, first) if str(second) in given and str(first) not in given else (first, second)
        if str(kept) in symbols:  # the user's name wins, else the first
            symbols[str(alias)] = symbols[str(kept)]
    return symbols


_ATTENTION_OPS = frozenset(
    {
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
    }
)  # fmt: skip


def attention_lengths(program: torch.export.ExportedProgram) -> list[tuple[Any, Any]]:
    """Pairs of symbols an attention proves equal: its key and value have one length (each query
    weighs every value by its key), which torch's attention does not check while it captures, so
    past keys and values keep two symbols. Found where the two lengths differ by two symbols
    (``past_k + n - (past_v + n)``): ``(kept, alias)``."""
    import sympy

    pairs = []
    for node in program.graph.nodes:
        name = str(node.target).split(".")
        if node.op != "call_function" or len(name) < 2 or name[1] not in _ATTENTION_OPS:
            continue
        values = [getattr(a, "meta", {}).get("val") for a in node.args[1:3]]
        if len(values) < 2 or not all(isinstance(v, torch.Tensor) and v.dim() >= 2 for v in values):
            continue
        key, value = (v.shape[-2] for v in values)
        if not (isinstance(key, torch.SymInt) and isinstance(value, torch.SymInt)):
            continue
        terms = sympy.expand(key.node.expr - value.node.expr).as_coefficients_dict()
        if sorted(terms.values()) == [-1, 1] and all(isinstance(s, sympy.Symbol) for s in terms):
            (kept,) = (s for s, c in terms.items() if c == 1)
            (alias,) = (s for s, c in terms.items() if c == -1)
            pairs.append((kept, alias))
    return pairs


def dim_bounds(program: torch.export.ExportedProgram, symbols: Mapping[str, str]) -> dict[str, list[int]]:
    """``{dim name: [min, max]}`` of the program's symbolic dims whose ``max`` is finite (a
    ``Dim(..., max=N)``), named as the ONNX model names them (:func:`dim_names`). A value the model
    reads with ``.item()`` (XLM's ``lengths.max()``) may have a finite ``max`` and no ``min``: not a dim."""
    import sympy

    bounds = {}
    for symbol, values in program.range_constraints.items():
        finite = isinstance(values.lower, sympy.Integer) and isinstance(values.upper, sympy.Integer)
        if isinstance(symbol, sympy.Symbol) and finite:
            bounds[symbols.get(str(symbol), str(symbol))] = [int(values.lower), int(values.upper)]
    return dict(sorted(bounds.items()))


def input_leaves(program: torch.export.ExportedProgram) -> list[int]:
    """Which leaves of the flattened ``(args, kwargs)`` are the ONNX inputs, in order: the tensors,
    and the ints captured as symbolic (``Dim.DYNAMIC``), which become 0-d INT64 inputs."""
    from torch.export.graph_signature import InputKind

    user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return [i for i, spec in enumerate(user) if isinstance(spec.arg, ONNX_INPUT_ARGUMENTS)]


def constant_inputs(program: torch.export.ExportedProgram, module: Any = None) -> dict[int, tuple[str, Any]]:
    """The leaves of the flattened ``(args, kwargs)`` that ``torch.export`` made constants of the
    capture (bools, ints, floats, strings, ``None``, enums): leaf index -> (path, value), the path
    as Python spells the argument (:func:`argument_paths`)."""
    from torch.export.graph_signature import ConstantArgument, CustomObjArgument, InputKind

    user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    paths = argument_paths(program.call_spec.in_spec, module)
    found = {}
    for i, spec in enumerate(user):
        if isinstance(spec.arg, ConstantArgument):
            found[i] = (paths[i], spec.arg.value)
        elif isinstance(spec.arg, CustomObjArgument) and not isinstance(spec.arg.fake_val, torch.ScriptObject):
            found[i] = (paths[i], spec.arg.fake_val)  # an enum member: torch keeps it as an opaque object
    return found


def argument_paths(in_spec: Any, module: Any = None) -> list[str]:
    """Each leaf of a call's ``(args, kwargs)`` as Python spells it: ``scale``, ``cfg['flag']``,
    ``pair[0]``; a positional argument by ``module.forward``'s parameter name (``args[2]`` past
    them, or when ``module`` is not a module)."""
    names: list[str] = []
    if isinstance(module, torch.nn.Module):
        import inspect

        try:
            parameters = inspect.signature(module.forward).parameters.values()
        except (TypeError, ValueError):
            parameters = []
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = [p.name for p in parameters if p.kind in kinds]
    paths = []
    for where, head, *rest in _pytrees.leaf_paths(in_spec):
        name = head
        if where == "0":
            index = int(head)
            name = names[index] if index < len(names) else f"args[{index}]"
        paths.append(name + "".join(f"[{part}]" if part.isdigit() else f"[{part!r}]" for part in rest))
    return paths


def symbolic_int_inputs(program: torch.export.ExportedProgram) -> list[int]:
    """The leaves of the flattened ``(args, kwargs)`` that are dynamic ints (``Dim.DYNAMIC``)."""
    from torch.export.graph_signature import InputKind, SymIntArgument

    user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return [i for i, spec in enumerate(user) if isinstance(spec.arg, SymIntArgument)]


def _onnx_input_arguments() -> tuple[type, ...]:
    from torch.export import graph_signature as gs

    return tuple(getattr(gs, name) for name in ("TensorArgument", "SymIntArgument") if hasattr(gs, name))


ONNX_INPUT_ARGUMENTS = _onnx_input_arguments()
"""The kinds of user input that become ONNX inputs (a tensor; a symbolic int as a 0-d INT64 tensor)."""
