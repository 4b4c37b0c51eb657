"""Reading an impl: its kind, signature, the opsets it uses, and whether it
fits the torch op it is registered for.

Everything here runs at registration, once per impl; nothing runs per node.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import inspect
import keyword
import types
import typing
from collections.abc import Callable
from typing import Any

from opreg.errors import RegistrationError, SignatureMismatchError
from opreg.registry.opname import OpName
from opreg.registry.targets import ONNX_DOMAIN

SCRIPT = "script"
TRACE = "trace"
OPREG = "opreg"
"""Calling convention of impls written for opreg: see docs/writing-packs.md, "How the exporter calls an impl"."""
TORCH_ONNX = "torch.onnx"
"""Calling convention of functions written for torch.onnx (a ``custom_translation_table``, the
tutorials' ``register_op``): device, layout and memory format as strings, a ``dtype``
keyword left at ``None`` as ``-1``, as torch.onnx passes them (:func:`torch_convention`)."""

_ATTRIBUTE_TYPES = (int, float, str, bool)
_ONNXSCRIPT_DEFAULT_DOMAIN = "this"  # what onnxscript.script() names a function's domain unless told
# Namespaces torch loads in full at import: an unknown op there is a typo.
_CLOSED_NAMESPACES = ("aten", "prims")


@functools.cache
def type_kind(cls: type) -> str:
    """``script``, ``traced``, ``opset`` or ``other`` for a class, computed once per class:
    onnxscript's function classes are ``typing.Protocol`` subclasses, whose
    ``isinstance`` checks are slow enough to dominate a 1000-impl registry build."""
    from onnxscript.values import OnnxFunction, Opset, TracedOnnxFunction

    if issubclass(cls, OnnxFunction):
        return "script"
    if issubclass(cls, TracedOnnxFunction):
        return "traced"
    if issubclass(cls, Opset):
        return "opset"
    return "other"


def impl_kind(function: object) -> str:
    """``"script"`` for an ``onnxscript.script`` function, else ``"trace"``."""
    return SCRIPT if type_kind(type(function)) == "script" else TRACE


def python_function(function: Any) -> Callable[..., Any]:
    """The Python function behind a script or traced onnxscript function."""
    kind = type_kind(type(function))
    if kind == "script":
        return function.function
    if kind == "traced":
        return function.func
    return function


def source_location(function: Any) -> str:
    """``path/to/module.py:LINE`` of the impl's ``def`` (its first decorator's line), or ``""``."""
    code = getattr(python_function(function), "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""


def short_source(source: str) -> str:
    """``file:line`` relative to the ``sys.path`` entry it lies under (``opreg_core_ops/ops/activation.py:25``)."""
    import os
    import sys

    roots = sorted((os.path.join(os.path.abspath(p), "") for p in sys.path if p), key=len, reverse=True)
    for root in roots:
        if source.startswith(root):
            return source[len(root) :]
    return source


def display_signature(function: Any) -> str:
    inner = python_function(function)
    try:
        return f"{getattr(inner, '__name__', repr(inner))}{inspect.signature(inner)}"
    except (TypeError, ValueError):
        return repr(inner)


# -- parameters ---------------------------------------------------------------


class _Param(typing.NamedTuple):
    name: str
    annotated: bool
    attribute: bool
    has_default: bool
    keyword_only: bool
    text: str


def _is_attribute_annotation(annotation: Any) -> bool:
    """Whether an (evaluated) annotation is an attribute's: ``int``, ``float``, ``str`` or
    ``bool``, a sequence of them (``Sequence[int]``, ``list[float]``, ``tuple[int, ...]``),
    or one of these or ``None`` (``Sequence[int] | None``). Anything else, ``onnx_ir.Value``
    or an onnxscript tensor type, is a tensor's."""
    if annotation in _ATTRIBUTE_TYPES:
        return True
    if typing.get_origin(annotation) in (list, tuple, collections.abc.Sequence, typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None) and a is not Ellipsis]
        return bool(args) and all(_is_attribute_annotation(a) for a in args)
    return False


OPSET_PARAMETER = "opset"
"""A trace-only impl with a keyword-only parameter of this name is registered at one or more
opsets (``@opreg.impl(op, opset=18)`` and ``@opreg.impl(op, opset=20)`` on one ``def``) and is
passed, on every call, the ai.onnx version it was registered at: one body for every version."""


@dataclasses.dataclass(frozen=True)
class Params:
    """An impl's named parameters (the node's arguments map onto these), whether it also takes
    ``*args``/``**kwargs``, and whether it takes the opset it is registered at
    (:data:`OPSET_PARAMETER`, which is not among ``params``)."""

    params: list[_Param]
    variadic: bool
    takes_opset: bool = False

    def as_data(self) -> list[Any]:
        """``[variadic, takes_opset, [[name, annotated, attribute, has_default, keyword_only, text], ...]]``:
        JSON, which :meth:`of_data` reads back (:mod:`opreg.packs.packcache` stores it)."""
        return [self.variadic, self.takes_opset, [list(p) for p in self.params]]

    @classmethod
    def of_data(cls, data: list[Any]) -> Params:
        variadic, takes_opset, params = data
        return cls([_Param(*p) for p in params], variadic, takes_opset)


def read_params(function: Any) -> Params:
    """Read the impl's parameters once (``inspect.signature`` is the costly part)."""
    func = python_function(function)
    try:
        # annotations as the types they name, also when `from __future__ import annotations` made them strings
        signature = inspect.signature(func, eval_str=True)
    except (NameError, AttributeError, SyntaxError) as e:
        raise RegistrationError(
            f"impl {display_signature(function)}: its annotations cannot be evaluated ({type(e).__name__}: {e}). "
            "Import the names they use at run time (not only under `if TYPE_CHECKING:`)."
        ) from e
    params: list[_Param] = []
    variadic = takes_opset = False
    trace = impl_kind(function) == TRACE
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            variadic = True
            continue
        if trace and p.kind is p.KEYWORD_ONLY and p.name == OPSET_PARAMETER:
            takes_opset = True
            continue
        annotated = p.annotation is not p.empty
        params.append(
            _Param(
                name=p.name,
                annotated=annotated,
                attribute=annotated and _is_attribute_annotation(p.annotation),
                has_default=p.default is not p.empty,
                keyword_only=p.kind is p.KEYWORD_ONLY,
                text=str(p),
            )
        )
    return Params(params, variadic, takes_opset)


# -- torch schemas --------------------------------------------------------------


def torch_schema(op: OpName) -> Any | None:
    """The torch ``FunctionSchema`` of ``op``, or ``None`` if torch does not know it (yet: a
    library imported later defines its ops then, so only found schemas are cached).

    Raises for an unknown op in a namespace torch loads in full (``aten``),
    naming the closest known ops.
    """
    try:
        return _found_schema(op)
    except LookupError:
        return None


_TORCH_ONNX_NAMESPACES = frozenset({"onnx", "onnx_symbolic"})
"""The namespaces of the ops ``torch.onnx.ops`` defines when imported."""


@functools.lru_cache(maxsize=4096)
def _found_schema(op: OpName) -> Any:
    schema = _lookup_schema(op)
    if schema is None:
        raise LookupError(op)  # not cached
    return schema


def _lookup_schema(op: OpName) -> Any | None:
    import torch

    if op.namespace in _TORCH_ONNX_NAMESPACES:
        import torch.onnx.ops  # defines them (0.16 s: imported when an op of theirs is looked up)
    qualified = f"{op.namespace}::{op.name}"
    overload = "" if op.overload == "default" else op.overload
    try:
        return torch._C._get_schema(qualified, overload)
    except RuntimeError:
        pass
    if op.namespace not in _CLOSED_NAMESPACES:
        return None
    packet = getattr(getattr(torch.ops, op.namespace), op.name, None) if _has_op(op) else None
    if packet is not None:
        overloads = sorted(packet.overloads())
        raise RegistrationError(
            f"torch op {qualified} has no overload {op.overload!r}: its overloads are {', '.join(overloads)}"
        )
    known = [name for name in torch._C._dispatch_get_all_op_names() if name.startswith(f"{op.namespace}::")]
    close = difflib.get_close_matches(qualified, known, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise RegistrationError(f"torch has no op {qualified}.{hint}")


def _has_op(op: OpName) -> bool:
    import torch

    try:
        getattr(getattr(torch.ops, op.namespace), op.name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _schema_arg_kind(arg: Any) -> str:
    """``tensor`` for a Tensor argument (also ``Tensor?``, ``Tensor[]``, ``Tensor?[]``),
    ``scalar`` for a Scalar (``Scalar?`` too), else ``attribute``."""
    import torch

    if isinstance(_element_type(arg.type, torch.OptionalType, torch.ListType), torch.TensorType):
        return "tensor"
    if isinstance(_element_type(arg.type, torch.OptionalType), torch.NumberType):
        return "scalar"
    return "attribute"


def _element_type(jit_type: Any, *wrappers: type) -> Any:
    """``jit_type`` with its ``wrappers`` (``torch.OptionalType``, ``torch.ListType``) taken off:
    ``Tensor`` for ``Tensor?[]`` when both are given."""
    while isinstance(jit_type, wrappers):
        jit_type = jit_type.getElementType()
    return jit_type


def check_signature(op: OpName, function: Any, schema: Any, read: Params, *, torch_function: bool = False) -> None:
    """Raise :class:`SignatureMismatchError` if ``function`` cannot take ``op``'s arguments.

    Schema arguments map to impl parameters by position. Tensor inputs may be
    renamed (the tutorials call ``self`` ``input_x``); attributes keep the
    schema's names because nodes pass them by keyword, and need a type
    annotation so onnxscript treats them as attributes. Trailing schema
    arguments with defaults may be left out; extra impl parameters need defaults.

    A ``torch_function`` (written for torch.onnx) is held to what torch.onnx
    needs of it: a trace-only one is called with Python values, so its
    attributes need no annotation, and only keyword-only attributes must keep
    the schema's names (the others are passed by position).
    """
    trace_only = torch_function and impl_kind(function) == TRACE
    params, variadic = read.params, read.variadic
    arguments = [a for a in schema.arguments if not a.is_out]

    def fail(reason: str, fix: str) -> SignatureMismatchError:
        return SignatureMismatchError(
            f"impl {display_signature(function)} does not match torch op {op}: {reason}. "
            f"The op's schema is {schema}. {fix}"
        )

    extra = [p.name for p in params[len(arguments) :] if not p.has_default]
    if extra:
        raise fail(
            f"it has parameters the op does not have ({', '.join(extra)}), and nodes cannot pass them",
            "Remove them (or give them defaults), or register the impl for the overload that has them.",
        )
    for param, arg in zip(params, arguments, strict=False):
        kind = _schema_arg_kind(arg)
        if kind == "tensor" and param.attribute:
            raise fail(
                f"parameter {param.text!r} is annotated as an attribute but argument {arg.name!r} is a {arg.type}",
                "Annotate it with a tensor type (or leave it unannotated).",
            )
        if kind == "attribute" and not param.annotated and not trace_only:
            raise fail(
                f"attribute {param.name!r} has no type annotation, so onnxscript would take it as a tensor input",
                f"Annotate it, e.g. `{arg.name}: {_python_type_hint(arg)}`.",
            )
        if (
            kind != "tensor"
            and param.attribute
            and param.name != python_name(arg.name)
            and (arg.kwarg_only or not torch_function)
        ):
            raise fail(
                f"attribute {param.name!r} is in the place of argument {arg.name!r}",
                f"Name it {arg.name!r}: nodes pass attributes by the schema's names.",
            )
    if not variadic:
        missing = [a.name for a in arguments[len(params) :] if not a.has_default_value()]
        if missing:
            raise fail(
                f"it takes no parameter for required argument(s) {', '.join(missing)}",
                "Add them, in the schema's order.",
            )


def python_name(name: str) -> str:
    """A schema argument's name as a Python parameter: a keyword (``uniform``'s ``from``) gets a
    trailing underscore, as PEP 8 suggests (``from_``)."""
    return f"{name}_" if keyword.iskeyword(name) else name


def _python_type_hint(arg: Any) -> str:
    """The annotation to suggest for a schema argument: ``int``, ``float`` (``Scalar`` too),
    ``bool`` or ``str`` (``Device`` too; ``SymInt`` and ``ScalarType`` are ints),
    ``Sequence[...]`` of a list, ``| None`` if optional."""
    import torch

    names = {
        torch.FloatType: "float",
        torch.NumberType: "float",
        torch.BoolType: "bool",
        torch.StringType: "str",
        torch.DeviceObjType: "str",
    }
    unwrapped = _element_type(arg.type, torch.OptionalType)
    hint = names.get(type(_element_type(unwrapped, torch.OptionalType, torch.ListType)), "int")
    if isinstance(unwrapped, torch.ListType):
        hint = f"Sequence[{hint}]"
    return f"{hint} | None" if isinstance(arg.type, torch.OptionalType) else hint


# -- calling an impl ---------------------------------------------------------------

_PLACEMENT = frozenset({"device", "layout", "pin_memory", "memory_format"})
"""The arguments that say nothing about the result's values, only where and how it is stored
(torch's tensor options; its schemas type ``layout`` and ``memory_format`` as ``int?``, so they are
known by name); dropped when an impl has no parameter for them."""
_INT_KINDS = frozenset({"IntType", "SymIntType"})


class ArgumentsNotCovered(Exception):
    """A call passes an argument the impl has no parameter for (and that is not its default)."""


def _kind(arg_type: Any) -> str:
    """The kind of a schema argument's type, through ``Optional``."""
    kind = arg_type.kind()
    return arg_type.getElementType().kind() if kind == "OptionalType" else kind


def placement_only(arg: Any) -> bool:
    """Whether schema argument ``arg`` says only where or how the result is stored (device, layout,
    memory format, pinned memory), nothing of its values: an impl may have no parameter for it."""
    return arg.name in _PLACEMENT or _kind(arg.type) == "DeviceObjType"


def _is_int_list(arg_type: Any) -> bool:
    if arg_type.kind() == "OptionalType":
        arg_type = arg_type.getElementType()
    return arg_type.kind() == "ListType" and arg_type.getElementType().kind() in _INT_KINDS


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:
        return False


def map_arguments(
    schema: Any, given_args: Any, given_kwargs: Any, params: Params | None
) -> tuple[list[Any], dict[str, Any], set[int | str]]:
    """Map a call of a torch op (``given_args``/``given_kwargs``, as an FX node or torch.onnx
    holds them) onto an impl's parameters: ``(args, kwargs, int_lists)``, ``int_lists``
    being the positions (and keyword names) of ``int[]`` arguments.

    Schema arguments map to parameters by position (the registry checked the
    signature). Arguments the call leaves out are left out (the impl's
    defaults apply) unless a later one is given; arguments past the impl's
    parameters must be their defaults, or of a type that does not change the
    values (device, layout, memory format), else :class:`ArgumentsNotCovered`.
    """
    arguments = [a for a in schema.arguments if not a.is_out]
    given: dict[str, Any] = {}
    for arg, value in zip(arguments, given_args, strict=False):
        given[arg.name] = value
    given.update(given_kwargs)
    if params is None or params.variadic:
        width = len(arguments)
        keyword_only: set[int] = set()
        names = [a.name for a in arguments]
    else:
        width = min(len(params.params), len(arguments))
        keyword_only = {i for i, p in enumerate(params.params[:width]) if p.keyword_only}
        names = [p.name for p in params.params[:width]]

    for arg in arguments[width:]:
        if arg.name not in given:
            continue
        value = given[arg.name]
        if placement_only(arg):
            continue
        if arg.has_default_value() and _same(value, arg.default_value):
            continue
        raise ArgumentsNotCovered(f"it has no parameter for argument {arg.name}={value!r}")

    last = max((i for i, a in enumerate(arguments[:width]) if a.name in given), default=-1)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    int_lists: set[int | str] = set()
    for i, arg in enumerate(arguments[: last + 1]):
        if arg.name in given:
            value = given[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            raise ArgumentsNotCovered(f"argument {arg.name} is missing")
        if i in keyword_only or arg.kwarg_only:
            if arg.name not in given:
                continue
            kwargs[names[i]] = value
            if _is_int_list(arg.type):
                int_lists.add(names[i])
        else:
            if _is_int_list(arg.type):
                int_lists.add(len(args))
            args.append(value)
    return args, kwargs, int_lists


_STRING_VALUED = ("device", "layout", "memory_format")


def torch_convention(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Arguments as torch.onnx passes them to a translation function: torch devices, layouts
    and memory formats as their strings, and a ``dtype`` keyword left at ``None`` as ``-1``."""

    def convert(value: Any) -> Any:
        if type(value).__name__ in _STRING_VALUED and type(value).__module__ == "torch":
            return str(value)
        return value

    converted = {key: convert(value) for key, value in kwargs.items()}
    if "dtype" in converted and converted["dtype"] is None:
        converted["dtype"] = -1
    return [convert(a) for a in args], converted


def lint_unannotated_attributes(function: Any, read: Params) -> None:
    """Without a schema: a parameter with a default but no annotation is almost
    always a forgotten attribute annotation."""
    for param in read.params:
        if param.has_default and not param.annotated:
            raise RegistrationError(
                f"impl {display_signature(function)}: parameter {param.name!r} has a default but "
                f"no type annotation, so onnxscript takes it as a tensor input. Annotate attributes "
                f"(e.g. `{param.name}: float = 1.0`)."
            )


def lint_script_domain(function: Any) -> None:
    """Script functions must name their own domain, neither onnxscript's default (``"this"``) nor ai.onnx."""
    if impl_kind(function) == SCRIPT and function.function_ir.domain in (_ONNXSCRIPT_DEFAULT_DOMAIN, ONNX_DOMAIN):
        raise RegistrationError(
            f"script function {function.name!r} has no explicit domain (onnxscript's default "
            f"{function.function_ir.domain!r} would reach the model): decorate it with "
            f"@onnxscript.script(onnxscript.values.Opset('your.domain', 1))"
        )
