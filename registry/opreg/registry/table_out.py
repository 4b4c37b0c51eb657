"""opreg's packs as a ``custom_translation_table`` for ``torch.onnx.export(dynamo=True)``.

:meth:`opreg.Registry.translation_table` builds it: for every op the registry
resolves at a target (:meth:`~opreg.Registry.resolve` without a node, as
torch.onnx gives none), the impl opreg would choose, in a form torch.onnx takes.
What torch.onnx cannot take is left out, and one :class:`TranslationTableWarning`
says what and why (docs/torch-onnx.md, "Moving between torch.onnx and opreg", lists these
limits with the errors torch.onnx gives):

- an impl with a predicate: torch.onnx calls a translation function with the
  node's ONNX values, never the FX node a predicate reads (the op then gets
  the best unconditional impl, if the registry has one);
- an op torch has not loaded, and ``onnx::``/``onnx_symbolic::`` ops
  (torch.onnx translates ``torch.onnx.ops`` itself);
- a script impl without a return annotation (torch.onnx counts a function's
  outputs from it);
- a trace-only impl that calls an op onnx has no schema for (torch.onnx's
  recorder needs one; a pack's ``opreg_schemas`` register theirs when the
  registry is built).

Script impls go into the table as they are. A trace-only impl goes in wrapped
(:func:`torch_callable`): torch.onnx passes a node's arguments its own way
(devices as strings, ``dtype=None`` as ``-1``, symbolic sizes in a list as
values), and its recorder leaves the values an impl makes untyped; the
wrapper maps the call onto the impl's parameters as opreg's exporter does, and
records through :class:`TypingRecorder`, which brings what opreg's recorder
does and torch's does not (types from ONNX's inference, numpy constants,
``Split`` by sizes).

The table's ai.onnx version is the target's: pass ``opset_version=table.opset_version``
to ``torch.onnx.export``; a custom domain's version is the one the impls emit. Above
:func:`torch_onnx_newest_opset`, torch.onnx builds the model at ai.onnx 18 and
converts it, which fails on newer ops (leaving an invalid model): for such a target
the impls are chosen at ai.onnx 18 (``table.target``).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opreg.registry import _inspect, _opsets
from opreg.registry.opname import OpName
from opreg.registry.targets import Target

# The registry builds its table here (Registry.translation_table), so this module imports nothing
# of the registry: its impls and the registry itself are passed in (``Impl``/``Registry`` below name
# opreg.Impl and opreg.Registry for the reader).
Impl = Any
Registry = Any

TORCH_TRANSLATED_NAMESPACES = ("onnx", "onnx_symbolic")
"""Namespaces of ``torch.onnx.ops``: torch.onnx translates their ops itself."""


class TranslationTableWarning(UserWarning):
    """Some impls could not go into a translation table for torch.onnx (the message says which and why)."""


class TranslationTable(dict):
    """``{torch op overload: function}`` as ``torch.onnx.export(dynamo=True,
    custom_translation_table=...)`` takes it.

    Attributes:
        target: the :class:`opreg.Target` its impls were chosen at (the asked one, with
            ai.onnx 18 when that is above :func:`torch_onnx_newest_opset`).
        opset_version: the asked target's ai.onnx version: pass it to ``torch.onnx.export``.
        impls: ``torch op name -> opreg.Impl`` of every entry.
        left_out: ``torch op name -> reason`` of every op (or impl) left out.
    """

    def __init__(self, target: Target, opset_version: int | None = None) -> None:
        super().__init__()
        self.target = target
        self.opset_version = target.onnx if opset_version is None else opset_version
        self.impls: dict[str, Impl] = {}
        self.left_out: dict[str, str] = {}


TORCH_ONNX_BUILD_OPSET = 18
"""The ai.onnx version torch.onnx.export builds a model at when ``opset_version`` is above
:func:`torch_onnx_newest_opset`, converting it afterwards with onnx's converter."""


def torch_onnx_newest_opset() -> int:
    """The newest ai.onnx version torch.onnx.export builds a model at directly: what
    onnxscript's version converter, which torch.onnx uses, supports. Above it, torch.onnx
    builds at :data:`TORCH_ONNX_BUILD_OPSET` and converts with onnx's converter, which fails
    on ops newer than that (leaving, e.g., a ``Gelu`` of opset 20 in an opset-18 model)."""
    try:
        from onnxscript.version_converter import _version_converter
    except ImportError:  # pragma: no cover - onnxscript moved it: ai.onnx 23 is safe since 0.5
        return 23
    return int(getattr(_version_converter, "SUPPORTED_MAX_ONNX_OPSET", 23))


def build(registry: Registry, target: Any) -> TranslationTable:
    """See :meth:`opreg.Registry.translation_table`."""
    wanted = registry.target(target)
    target = wanted
    if wanted.onnx > torch_onnx_newest_opset():
        versions = dict(wanted.versions)
        versions[""] = TORCH_ONNX_BUILD_OPSET
        target = Target(tuple(sorted(versions.items())), name=wanted.name)
    table = TranslationTable(target, opset_version=wanted.onnx)
    for op in registry.ops():
        candidates = registry.candidates(op, target)
        if not candidates:
            continue
        if op.namespace in TORCH_TRANSLATED_NAMESPACES:
            table.left_out[str(op)] = "torch.onnx translates torch.onnx.ops itself"
            continue
        chosen = registry.resolve(op, target)
        passed_over = [i for i in candidates[: candidates.index(chosen) if chosen else None] if i.predicate]
        reasons = [
            f"{i.label} has a predicate, which torch.onnx cannot evaluate (it calls a translation function "
            "with the node's ONNX values, not the FX node)"
            for i in passed_over
        ]
        if chosen is not None:
            overload = torch_overload(op)
            problem = _problem(op, chosen, overload)
            if problem is None:
                table[overload] = torch_callable(chosen, overload)
                table.impls[str(op)] = chosen
                if reasons:
                    reasons.append(f"{chosen.label} is in the table for every node")
            else:
                reasons.append(f"{chosen.label}: {problem}")
        if reasons:
            table.left_out[str(op)] = "; ".join(reasons)
    built_at = ""
    if target is not wanted:
        built_at = (
            f" (impls chosen at ai.onnx {target.onnx}: for opset_version {wanted.onnx}, above"
            f" {torch_onnx_newest_opset()}, torch.onnx builds at {target.onnx} and converts)"
        )
    if table.left_out:
        lines = "\n".join(f"  - {op}: {why}" for op, why in sorted(table.left_out.items()))
        warnings.warn(
            f"{len(table.left_out)} op(s) of the registry are not (or not fully) in the translation table for "
            f"target {wanted}{built_at}; what is not in it, torch.onnx translates its own way:\n{lines}",
            TranslationTableWarning,
            stacklevel=3,
        )
    return table


def torch_overload(op: OpName) -> Any:
    """The ``torch.ops`` overload of ``op``, or ``None`` if torch has not loaded it."""
    import torch

    try:
        return getattr(getattr(getattr(torch.ops, op.namespace), op.name), op.overload)
    except (AttributeError, RuntimeError):
        return None


def _problem(op: OpName, impl: Impl, overload: Any) -> str | None:
    """Why torch.onnx cannot take ``impl``, or ``None``."""
    if overload is None:
        return f"torch has no op {op} loaded (import the library that defines it before building the table)"
    function = impl.function
    if impl.kind == _inspect.SCRIPT and _no_return_annotation(function):
        return (
            "a script function needs a return annotation in torch.onnx, which counts its outputs from it "
            "(without one torch.onnx.export fails with 'ValueError: The number of values and replacements "
            "must match.')"
        )
    if impl.kind == _inspect.SCRIPT:
        return None  # torch.onnx records a call of the function and inlines its body
    for domain, version, op_type in sorted(_opsets.emitted_ops(function), key=str):
        if not _has_schema(op_type, version, domain):
            return (
                f"it calls {domain or 'ai.onnx'}::{op_type}, which onnx has no schema for at version {version}; "
                f"torch.onnx's recorder needs one (\"SchemaError: No schema registered for '{op_type}' version "
                f"'{version}' and domain '{domain}'!\"): a pack's opreg_schemas hook registers them"
            )
    return None


def _no_return_annotation(function: Any) -> bool:
    import inspect

    signature = inspect.signature(_inspect.python_function(function))
    return signature.return_annotation is inspect.Signature.empty


def _has_schema(op_type: str, version: int | None, domain: str) -> bool:
    import onnx.defs

    if version is None:
        return onnx.defs.has(op_type, domain)
    return onnx.defs.has(op_type, version, domain)


# -- calling an impl from torch.onnx ----------------------------------------------------------


def torch_callable(impl: Impl, overload: Any) -> Callable[..., Any]:
    """What the table holds for ``impl``: a script function as it is; a trace-only function
    wrapped to be called as opreg's exporter calls it (see the module's docstring)."""
    if impl.kind == _inspect.SCRIPT:
        return impl.function
    schema = overload._schema
    function = impl.function

    @functools.wraps(_inspect.python_function(function))
    def translate(*args: Any, **kwargs: Any) -> Any:
        import onnxscript.evaluator

        recorder = onnxscript.evaluator.default()
        with onnxscript.evaluator.default_as(TypingRecorder(recorder)):
            args, kwargs = _opreg_convention(args, kwargs)
            mapped, named, int_lists = _inspect.map_arguments(schema, args, kwargs, impl.params)
            mapped = [_int_list(a) if i in int_lists else a for i, a in enumerate(mapped)]
            named = {k: _int_list(v) if k in int_lists else v for k, v in named.items()}
            if impl.convention == _inspect.TORCH_ONNX:
                mapped, named = _inspect.torch_convention(mapped, named)
            result = function(*mapped, **named, **impl.keywords)
            if isinstance(result, (list, tuple)):
                return type(result)(_as_value(r) for r in result)
            return _as_value(result)

    translate.opreg_impl = impl  # type: ignore[attr-defined]
    return translate


def _opreg_convention(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """torch.onnx's arguments as opreg passes them: a ``dtype`` keyword of ``-1`` is ``None``
    (torch.onnx's spelling of "not given"); devices, layouts and memory formats (strings
    here) are ``None``."""
    named = dict(kwargs)
    if named.get("dtype") == -1:
        named["dtype"] = None
    for key in ("device", "layout", "memory_format"):
        if isinstance(named.get(key), str):
            named[key] = None
    return list(args), named


def _int_list(value: Any) -> Any:
    """An ``int[]`` holding symbolic sizes (ONNX values) as one 1-D INT64 value, as opreg passes it."""
    if not isinstance(value, (list, tuple)) or not any(_is_value(v) for v in value):
        return value
    import onnx_ir as ir
    from onnxscript.onnx_opset import opset18 as op18

    parts = []
    for item in value:
        if _is_value(item):
            rank = len(item.shape) if item.shape is not None else 0
            parts.append(op18.Reshape(item, [-1]) if rank == 0 else item)
        else:
            parts.append(op18.Constant(value=ir.tensor([int(item)], dtype=ir.DataType.INT64)))
    return op18.Concat(*parts, axis=0)


def _as_value(value: Any) -> Any:
    """A result opreg's exporter would make a constant (a numpy array, a Python number) as a
    ``Constant`` node: torch.onnx takes only values."""
    import numpy as np

    if value is None or _is_value(value):
        return value
    from onnxscript.onnx_opset import opset18 as op18

    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
    else:  # Python numbers as onnxscript types them
        array = np.asarray(value, dtype=np.bool_ if isinstance(value, bool) else None)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
    return op18.Constant(value=_ir_tensor(array))


def _ir_tensor(array: Any) -> Any:
    import onnx_ir as ir

    return ir.tensor(array)


def _is_value(value: Any) -> bool:
    import onnx_ir as ir

    return isinstance(value, ir.Value)


def _split_sizes(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[int] | None:
    """The static sizes of an ai.onnx ``Split`` given sizes (not ``num_outputs``), else ``None``."""
    if op.name != "Split" or op.opset.domain or kwargs.get("num_outputs") is not None or len(args) < 2:
        return None
    sizes = args[1]
    if sizes is None:
        return None
    if _is_value(sizes):
        sizes = None if sizes.const_value is None else sizes.const_value.numpy().tolist()
    if isinstance(sizes, (list, tuple)) and all(isinstance(s, int) for s in sizes):
        return list(sizes)
    return None


def _slices(value: Any, sizes: list[int], axis: int) -> tuple[Any, ...]:
    """``Split(value, sizes, axis)`` as one ``Slice`` per part."""
    from onnxscript.onnx_opset import opset18 as op18

    parts, start = [], 0
    for size in sizes:
        parts.append(op18.Slice(value, [start], [start + size], [axis]))
        start += size
    return tuple(parts)


def _is_array(value: Any) -> bool:
    import numpy as np

    return isinstance(value, (np.ndarray, np.generic))


class TypingRecorder:
    """An onnxscript evaluator that has torch.onnx's recorder record each op call, then
    gives the node's outputs the types ONNX infers for them (torch.onnx's recorder leaves
    them unknown; opreg's impls may read them). It also drops opreg's ``_outputs=``, makes
    numpy arguments constants (as opreg's recorder does), emits a ``Split`` by static sizes
    as ``Slice`` s (torch.onnx's recorder counts Split's outputs only from ``num_outputs``),
    and gives ``BatchNormalization`` in inference mode the optional outputs torch.onnx's
    recorder leaves off, as ``None``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def eval_op(self, op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        from opreg.node_types import infer_node

        kwargs = {k: v for k, v in kwargs.items() if k != "_outputs"}
        args = [_as_value(a) if _is_array(a) else a for a in args]  # torch.onnx's recorder takes no numpy
        sizes = _split_sizes(op, args, kwargs)
        if sizes is not None:  # torch.onnx's recorder counts Split's outputs only from num_outputs
            return _slices(args[0], sizes, kwargs.get("axis", 0))
        if hasattr(self.inner, "eval"):  # torch.onnx's recorder speaks onnxscript's older interface
            result = self.inner.eval(op.op_schema, args, kwargs)
        else:
            result = self.inner.eval_op(op, args, kwargs)
        outputs = list(result) if isinstance(result, Sequence) else [result]
        producer = outputs[0].producer() if outputs and _is_value(outputs[0]) else None
        if producer is not None and op.opset.version is not None:
            infer_node(producer, op.opset.version)
        schema = op.op_schema
        if schema is not None and op.name == "BatchNormalization" and len(outputs) < len(schema.outputs):
            return (*outputs, *[None] * (len(schema.outputs) - len(outputs)))
        return result

    def eval_function(self, function: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return self.inner.eval_function(function, args, kwargs)
