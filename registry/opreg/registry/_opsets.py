"""Which opsets an impl uses, read from its code at registration: the opsets and script
functions it names (:func:`names_read`, its helpers followed), the ONNX ops it emits
(:func:`emitted_ops`), the ai.onnx versions they amount to (:func:`onnx_module_versions`).

A lint, not the proof: the exporter checks emitted nodes again. Nothing here runs per node.
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import types
from collections.abc import Iterator
from typing import Any

from opreg.registry._inspect import python_function, type_kind
from opreg.registry.targets import ONNX_DOMAIN


def used_opsets(function: Any) -> dict[str, set[int | None]]:
    """Every ``(domain, version)`` the impl visibly uses.

    Script functions report their own opset imports. For trace-only functions
    it is every ``Opset`` (``op20``, ``onnxscript.opset18``) and the opset
    imports of every script function that :func:`names_read` finds: the impl's
    own code and the helpers it calls. An opset built at call time is not
    found; the exporter checks emitted nodes again, so this is a lint, not the proof.
    """
    found: dict[str, set[int | None]] = collections.defaultdict(set)
    if type_kind(type(function)) == "script":
        for domain, version in function.function_ir.opset_imports.items():
            found[domain].add(version)
        return dict(found)
    for _name, value in names_read(function):
        kind = type_kind(type(value))
        if kind == "opset":
            found[value.domain].add(value.version)
        elif kind == "script":
            for domain, version in value.function_ir.opset_imports.items():
                found[domain].add(version)
    return dict(found)


PUBLIC_HELPERS = "opreg.ops"
"""The module of helpers every pack may use; :func:`names_read` follows them like a pack's own."""


def names_read(function: Any) -> list[tuple[str, Any]]:
    """``(name, value)`` for every global, closure variable and module attribute
    (``onnxscript.opset18``) that the impl's code reads, nested code included,
    and in turn that the helpers it reads read: Python functions (and traced
    onnxscript functions) defined in the impl's own top-level package
    (``opreg_core_ops.ops.spectral._r2c`` for an impl in
    ``opreg_core_ops.ops.spectral``) or in :data:`PUBLIC_HELPERS`, each followed
    once. Functions of other packages (onnxscript's, numpy's) are not followed.
    The values of a dict, tuple or list it reads count as read too, named ``NAME[]``
    (``{18: op18, 21: op21}``: the version-specific pieces of an impl registered at several opsets).
    """
    return [pair for _func, pairs in _followed(function) for pair in pairs]


def _followed(function: Any) -> Iterator[tuple[Any, list[tuple[str, Any]]]]:
    """``(function, what it reads)`` for the impl's own code and each helper :func:`names_read` follows."""
    start = python_function(function)
    package = _package(start)
    seen: set[int] = set()
    pending = [start]
    while pending:
        func = pending.pop()
        if id(func) in seen:
            continue
        seen.add(id(func))
        pairs, helpers = _read_by(func)
        yield func, pairs
        pending += [
            helper
            for helper in helpers
            if id(helper) not in seen and (_package(helper) == package or helper.__module__ == PUBLIC_HELPERS)
        ]


def _members(value: Any, depth: int = 2) -> list[Any]:
    """The values held by a dict, tuple or list (and by those it holds, ``depth`` levels down)."""
    if depth == 0 or not isinstance(value, (dict, tuple, list)):
        return []
    items = list(value.values()) if isinstance(value, dict) else list(value)
    return [m for item in items for m in (item, *_members(item, depth - 1))]


def _package(func: Any) -> str:
    """The top-level package ``func`` was defined in (``""`` if unknown)."""
    return (getattr(func, "__module__", None) or "").partition(".")[0]


_Reads = tuple[list[tuple[str, Any]], list[types.FunctionType]]
_READS: contextvars.ContextVar[dict[int, tuple[Any, _Reads]] | None] = contextvars.ContextVar(
    "opreg_reads", default=None
)


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """Within it, what each function reads is found once (:func:`names_read` follows the helpers
    that many impls share; a registry build reads them again and again). For one build only: a
    module's globals may be rebound between two builds."""
    token = _READS.set({})
    try:
        yield
    finally:
        _READS.reset(token)


def _read_by(func: Any) -> _Reads:
    """``(name, value)`` for the globals, closure variables and module attributes that ``func``'s
    code and its nested code (lambdas, inner functions) read, the values a dict, tuple or list of
    them holds named ``NAME[]``; and the Python functions among them (a traced function's own),
    the helpers :func:`names_read` may follow. Once per function within :func:`reading`."""
    memo = _READS.get()
    if memo is None:
        return _expand(_reads(func))
    found = memo.get(id(func))
    if found is None or found[0] is not func:
        found = memo[id(func)] = (func, _expand(_reads(func)))  # the function kept: its id stays its own
    return found[1]


def _expand(reads: list[tuple[str, Any]]) -> _Reads:
    pairs: list[tuple[str, Any]] = []
    helpers: list[types.FunctionType] = []
    for name, value in reads:
        for each, where in ((value, name), *((m, f"{name}[]") for m in _members(value))):
            pairs.append((where, each))
            helper = each.func if type_kind(type(each)) == "traced" else each
            if isinstance(helper, types.FunctionType):
                helpers.append(helper)
    return pairs, helpers


def _reads(func: Any) -> list[tuple[str, Any]]:
    code = getattr(func, "__code__", None)
    if code is None:
        return []
    namespace = getattr(func, "__globals__", {})
    cells = func.__closure__ or ()
    free = {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells, strict=True) if _cell_filled(cell)}
    found: list[tuple[str, Any]] = []
    codes = [code]
    while codes:
        code_obj = codes.pop()
        names = set(code_obj.co_names)
        values = [(n, namespace[n]) for n in sorted(names) if n in namespace]
        values += [(n, free[n]) for n in code_obj.co_freevars if n in free]
        for name, value in values:
            found.append((name, value))
            if isinstance(value, types.ModuleType):
                # ``module.attr``: only what the module already holds (no lazy ``__getattr__`` imports)
                attrs = vars(value)
                found.extend((f"{name}.{attr}", attrs[attr]) for attr in sorted(names) if attr in attrs)
        codes.extend(const for const in code_obj.co_consts if isinstance(const, types.CodeType))
    return found


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and every code object nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_FAST"})
_ATTRIBUTES = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def emitted_ops(function: Any) -> set[tuple[str, int | None, str]]:
    """Every ``(domain, version, op_type)`` the impl visibly calls.

    A script function's are the nodes of its body (and of the script functions
    it calls). A trace-only function's are, in its code (and nested code), the
    ``<opset>.<Op>`` expressions and ``Op(<opset>, "<Op>")`` calls whose
    ``<opset>`` is an ``Opset`` reached from its globals or closure
    (``op20.Gelu``, ``onnxscript.opset18.Add``); like :func:`used_opsets`, a
    lint, not the proof: ops called in helpers are not seen.
    """
    found: set[tuple[str, int | None, str]] = set()
    if type_kind(type(function)) == "script":
        protos = [function.to_function_proto()]
        protos += [f.to_function_proto() for f in function.function_ir.get_called_functions().values()]
        for proto in protos:
            versions = {o.domain: o.version for o in proto.opset_import}
            found.update((n.domain, versions.get(n.domain), n.op_type) for n in proto.node)
        return found
    func = python_function(function)
    code = getattr(func, "__code__", None)
    if code is None:
        return found
    namespace = dict(getattr(func, "__globals__", {}))
    cells = dict(zip(code.co_freevars, func.__closure__ or (), strict=False))
    namespace.update({name: cell.cell_contents for name, cell in cells.items() if _cell_filled(cell)})
    for each in _codes(code):
        found |= _ops_in(each, namespace)
    return found


def emitted_ops_deep(function: Any) -> set[tuple[str, int | None, str]]:
    """:func:`emitted_ops` of the impl and of every helper :func:`names_read` follows (its own
    package's functions and :data:`PUBLIC_HELPERS`): what a runtime must run for it. Still a lint:
    an op named at call time is not found, and the exporter's model is judged again."""
    if type_kind(type(function)) == "script":
        return emitted_ops(function)
    found: set[tuple[str, int | None, str]] = set()
    for func, pairs in _followed(function):
        found |= emitted_ops(func)
        found.update(op for _, value in pairs if type_kind(type(value)) == "script" for op in emitted_ops(value))
    return found


def _ops_in(code: types.CodeType, namespace: dict[str, Any]) -> set[tuple[str, int | None, str]]:
    import dis

    from onnxscript.values import Op

    found: set[tuple[str, int | None, str]] = set()
    current: Any = None  # the object the last loads reached
    op_class = False  # an Op(...) call is being built: its opset, then its name, come next
    opset: Any = None
    for instruction in dis.get_instructions(code):
        name, value = instruction.opname, instruction.argval
        if name in _LOADS:
            current = namespace.get(value)
            if op_class and type_kind(type(current)) == "opset":
                opset, op_class, current = current, False, None
            elif current is Op:
                op_class, current = True, None
        elif name in _ATTRIBUTES and current is not None:
            if type_kind(type(current)) == "opset":
                found.add((current.domain, current.version, value))
                current = None
            else:
                current = getattr(current, value, None)
                if current is Op:
                    op_class, current = True, None
        elif name == "LOAD_CONST" and opset is not None and isinstance(value, str):
            found.add((opset.domain, opset.version, value))
            opset = None
        elif name.startswith("CALL"):
            current, op_class, opset = None, False, None
        elif name not in ("PUSH_NULL", "PRECALL"):
            current = None
    return found


def passes_keyword(function: Any, keyword: str) -> bool:
    """Whether a trace-only impl's code (or nested code) passes ``keyword=`` to some call."""
    code = getattr(python_function(function), "__code__", None)
    if code is None:
        return False
    return any(isinstance(const, tuple) and keyword in const for each in _codes(code) for const in each.co_consts)


def _cell_filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - probing an empty cell raises
    except ValueError:
        return False
    return True


def onnx_module_versions(found: dict[str, set[int | None]]) -> set[int]:
    return {v for v in found.get(ONNX_DOMAIN, set()) if v is not None}
