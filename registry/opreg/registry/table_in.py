"""Functions written for torch.onnx, and whole ``custom_translation_table`` s, as opreg impls.

``torch.onnx.export(..., dynamo=True, custom_translation_table={op: function})``
takes ONNX Script functions keyed by torch op. What libraries ship in that
form works in opreg unchanged through this module:

- :func:`torch_impl` turns one such function into an :class:`opreg.Impl`. It is
  the one path for "a function written for torch.onnx": the tutorials'
  ``OnnxRegistry.register_op`` (:mod:`opreg.interop.compat`), a table handed to
  :func:`opreg.pack_from_translation_table` or to
  :meth:`opreg.Registrar.register_translation_table`, and a table an installed
  pack exposes through its entry point all use it. The function's opset
  requirement is read from the function (the ``opsetNN`` modules and ``Opset``
  objects it uses); it is called as torch.onnx calls it
  (:func:`opreg.registry._inspect.torch_convention`), and held to what torch.onnx needs
  of it: a trace-only function's attributes need no annotations.
- :func:`entries` reads a table the way torch.onnx does, and more: keys are
  op overloads (``torch.ops.aten.gelu.default``), op packets
  (``torch.ops.mylib.roi_align``, covering each overload whose schema the
  function fits; torch 2.13 refuses packets) or op names
  (``"mylib::roi_align.default"``; torch ignores strings); values are a
  function or a list of functions (torch 2.6 and 2.7 took lists and called
  the first whose annotated input types accept the node's; 2.13 refuses
  them; opreg makes a list one impl that chooses the same way).

A script function in onnxscript's default domain (``@onnxscript.script()``,
domain ``"this"``) is accepted (torch.onnx always inlines it): it is compiled
again into domain :data:`FUNCTION_DOMAIN`, so a model that keeps functions
never holds a ``"this"`` domain.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from opreg.errors import InvalidOpNameError, RegistrationError
from opreg.registry import _inspect, _opsets
from opreg.registry.opname import OpName
from opreg.registry.registry import Impl, build_impl, impl_name
from opreg.registry.targets import ONNX_DOMAIN, VersionRangeLike, normalize_domain, onnx_opset_range

FUNCTION_DOMAIN = "pkg.opreg.functions"
"""The domain a script function written in onnxscript's default domain (``"this"``) is compiled into."""

OpsetsLike = int | Mapping[str, VersionRangeLike] | None
"""``opsets=`` of the table functions: ``None`` (read from each function), an ai.onnx
version, or ``{domain: version or (min, max)}`` with ``""`` for ai.onnx."""


# -- one function ---------------------------------------------------------------------------


def torch_impl(
    op: Any,
    function: Any,
    *,
    opsets: OpsetsLike = None,
    priority: int = 0,
    pack: str,
    override: bool,
) -> Impl:
    """``function`` (or a list of functions), written for torch.onnx, as the impl of ``op``.

    ``opsets`` declares what every function needs instead of reading it from
    the function (see :data:`OpsetsLike`). Raises :class:`RegistrationError`
    naming the function and what to fix.
    """
    opset, domains = _split_opsets(opsets)
    if isinstance(function, (list, tuple)):
        if not function:
            raise RegistrationError(f"the table's value for {op} is an empty list: give at least one function")
        functions = [_own_domain(f) for f in function]
        if len(functions) > 1:
            if opsets is None:
                opset, domains = _union_requirement(functions)
            function = first_accepting(functions)
        else:
            function = functions[0]
    else:
        function = _own_domain(function)
    return build_impl(
        op, function, opset=opset, domains=domains, priority=priority,
        predicate=None, pack=pack, override=override, torch_function=True,
    )  # fmt: skip


def _split_opsets(opsets: OpsetsLike) -> tuple[VersionRangeLike | None, dict[str, VersionRangeLike] | None]:
    if opsets is None:
        return None, None
    if isinstance(opsets, int) and not isinstance(opsets, bool):
        return opsets, {}
    if not isinstance(opsets, Mapping):
        raise RegistrationError(
            f"opsets= takes an ai.onnx version or a {{domain: version}} dict such as "
            f"{{'': 18, 'com.microsoft': 1}}, got {opsets!r}"
        )
    opset = None
    domains: dict[str, VersionRangeLike] = {}
    for domain, version in opsets.items():
        if normalize_domain(domain) == ONNX_DOMAIN:
            opset = version
        else:
            domains[domain] = version
    return opset, domains


def _own_domain(function: Any) -> Any:
    """A script function in onnxscript's default domain, compiled again into :data:`FUNCTION_DOMAIN`."""
    if not callable(function):
        raise RegistrationError(f"a translation table's values are functions, got {function!r}")
    if _inspect.impl_kind(function) != _inspect.SCRIPT or function.function_ir.domain not in ("this", ""):
        return function
    import onnxscript

    try:
        return onnxscript.script(onnxscript.values.Opset(FUNCTION_DOMAIN, 1))(function.function)
    except Exception as e:
        raise RegistrationError(
            f"script function {function.name!r} has no domain of its own and could not be compiled again into "
            f"{FUNCTION_DOMAIN}: {type(e).__name__}: {e}. Give it one: "
            "@onnxscript.script(onnxscript.values.Opset('your.domain', 1))"
        ) from e


def _union_requirement(functions: Sequence[Any]) -> tuple[int, dict[str, int]]:
    """What a list of functions needs together: the newest ai.onnx and custom-domain versions any uses."""
    onnx_min = onnx_opset_range()[0]
    domains: dict[str, int] = {}
    for function in functions:
        used = _opsets.used_opsets(function)
        onnx_min = max([onnx_min, *_opsets.onnx_module_versions(used)])
        for domain, versions in used.items():
            known = [v for v in versions if v is not None]
            if domain != ONNX_DOMAIN and known:
                domains[domain] = max(domains.get(domain, 0), *known)
    return onnx_min, domains


# -- a list of functions: the first whose annotated input types accept the call -------------------------


def first_accepting(functions: Sequence[Any]) -> Callable[..., Any]:
    """One trace-only function that calls the first of ``functions`` whose annotated tensor
    types accept the call's inputs (the first of all when none does), as torch.onnx 2.6-2.7
    chose among a list. It has the first function's signature."""
    functions = tuple(functions)

    def call_first_accepting(*args: Any, **kwargs: Any) -> Any:
        for function in functions:
            if _accepts(function, args, kwargs):
                return function(*args, **kwargs)
        return functions[0](*args, **kwargs)

    first = _inspect.python_function(functions[0])
    functools.update_wrapper(call_first_accepting, first)
    call_first_accepting.__name__ = f"{impl_name(functions[0])}_or_{len(functions) - 1}_more"
    call_first_accepting.__qualname__ = call_first_accepting.__name__
    call_first_accepting.opreg_functions = functions  # type: ignore[attr-defined]
    return call_first_accepting


def _accepts(function: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    python = _inspect.python_function(function)
    try:
        bound = inspect.signature(python).bind(*args, **kwargs)
        hints = typing.get_type_hints(python)
    except Exception:
        return False
    for name, value in bound.arguments.items():
        allowed = _allowed_dtypes(hints.get(name))
        dtype = getattr(value, "dtype", None)  # an onnx_ir.Value's is an ir.DataType, an int
        if allowed is not None and isinstance(dtype, int) and int(dtype) not in allowed:
            return False
    return True


def _allowed_dtypes(annotation: Any) -> set[int] | None:
    """ONNX data types an ONNX Script tensor annotation allows (``FLOAT``, a ``TypeVar`` of
    them, ``Optional``/``Union`` of them); ``None`` for anything else (no constraint)."""
    if annotation is None:
        return None
    dtype = getattr(annotation, "dtype", None)
    if isinstance(dtype, int):
        return {dtype}
    if isinstance(annotation, typing.TypeVar):
        options = list(annotation.__constraints__) or ([annotation.__bound__] if annotation.__bound__ else [])
    else:
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
            return None
    found: set[int] = set()
    for option in options:
        allowed = _allowed_dtypes(option)
        if allowed is None:
            return None
        found |= allowed
    return found or None


# -- a whole table --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
    """One op a table covers.

    Fields:
        op: the torch op (``None`` when the key names none).
        function: the table's value (a function, or a list of them).
        key: the table's key, as shown in reports.
        from_packet: the key was an ``OpOverloadPacket``: an overload whose schema
            the function does not fit is skipped, not reported.
        error: why the key cannot be used, if it cannot.
    """

    op: OpName | None
    function: Any
    key: str
    from_packet: bool = False
    error: str | None = None


def entries(table: Any) -> Iterator[Entry]:
    """The ops of a ``custom_translation_table``, one :class:`Entry` per op (an op packet
    gives one per overload, its ``out=`` overloads excepted)."""
    if not isinstance(table, Mapping):
        raise RegistrationError(
            f"a custom_translation_table is a dict {{torch op: function}}, got {type(table).__name__}"
        )
    for key, function in table.items():
        shown = _key_text(key)
        if type(key).__name__ == "OpOverloadPacket":
            for overload in key.overloads():
                if overload != "out" and not overload.endswith("_out"):
                    yield Entry(OpName.of(getattr(key, overload)), function, shown, from_packet=True)
            continue
        try:
            op = OpName.of(key)
        except InvalidOpNameError as e:
            yield Entry(None, function, shown, error=f"keys are torch ops (torch.ops.ns.op.overload): {e}")
            continue
        yield Entry(op, function, shown)


def _key_text(key: Any) -> str:
    schema = getattr(key, "_schema", None)
    if schema is not None:
        return str(OpName.of(key))
    return str(key) if type(key).__name__ == "OpOverloadPacket" else repr(key)
