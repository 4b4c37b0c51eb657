"""The ops a new pack translates, read from their schemas (``opreg new-pack NAME --op SCHEMA``).

An :class:`OpSpec` is one torch op as ``torch.library`` defines it,
``swishlib::fused_swish(Tensor x, float beta) -> Tensor``, with what the scaffold
writes for it: the impl's parameters, the pack's ONNX op (its inputs and
attributes), the samples' values. :func:`parse` reads one with torch's schema
parser and refuses, in one line, what a pack cannot translate this way.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from typing import Any

from opreg.authoring._packtext import literal
from opreg.errors import OpregError

TENSOR = "tensor"
"""An argument's kind: a tensor input of the ONNX op (``Tensor``; ``Tensor?`` if optional)."""
ATTRIBUTES = {"int": "INT", "float": "FLOAT", "bool": "INT", "str": "STRING", "ints": "INTS", "floats": "FLOATS"}
"""The other kinds: an attribute of the ONNX op, by ``onnx.defs.OpSchema.AttrType`` name (ONNX has no
bool attribute: a bool is an int)."""
_ANNOTATIONS = {
    TENSOR: "Tensor", "int": "int", "float": "float", "bool": "bool", "str": "str",
    "ints": "Sequence[int]", "floats": "Sequence[float]",
}  # fmt: skip
_SAMPLE_VALUES = {"int": "1", "str": '""', "ints": "[1]", "floats": "[0.5, 1.5]"}
"""What a sample passes for an argument without a default: a starting point the author may change."""
_SAMPLE_FLOATS = ((0.75, 1.5, 0.25, 2.0, 0.125), (1.25, 0.375, 2.5, 0.625, 3.0))
"""The floats of the first and of the second sample, one per argument: never two arguments alike, so an impl
that swaps or ignores one of them fails."""
RESERVED_NAMESPACES = frozenset({"aten", "prim", "prims", "quantized", "quantized_decomposed", "onnx"})
"""torch's own namespaces: their ops are torch's, which a pack implements by writing impls, not by --op."""
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_OP_RE = re.compile(rf"^\s*({_NAME})::({_NAME})(?:\.({_NAME}))?\s*\((.*)\)\s*->\s*(.+?)\s*$", re.S)


class OpSpecError(OpregError, ValueError):
    """An ``--op`` schema the scaffold cannot write a pack for."""


@dataclasses.dataclass(frozen=True)
class Argument:
    """One argument of the torch op.

    Fields:
        name: its name in the schema (and, with ``_`` after a Python keyword, in the impl).
        kind: :data:`TENSOR`, or one of :data:`ATTRIBUTES`' keys.
        optional: the schema marks it optional (``Tensor?``, ``float?``).
        default: the default as Python source (``"1.0"``, ``"None"``), or ``None`` if it has none.
        keyword_only: it comes after ``*`` in the schema.
    """

    name: str
    kind: str
    optional: bool = False
    default: str | None = None
    keyword_only: bool = False

    @property
    def python_name(self) -> str:
        return f"{self.name}_" if keyword.iskeyword(self.name) else self.name

    @property
    def annotation(self) -> str:
        hint = _ANNOTATIONS[self.kind]
        return f"{hint} | None" if self.optional else hint

    @property
    def parameter(self) -> str:
        """The impl's parameter: ``beta: float``, ``w: Tensor | None = None``."""
        default = self.default if self.default is not None else ("None" if self.optional else None)
        return f"{self.python_name}: {self.annotation}" + (f" = {default}" if default is not None else "")

    @property
    def required(self) -> bool:
        """The ONNX op must be given it: not optional, and no default."""
        return not (self.optional or self.default is not None)

    def sample(self, which: int, position: int, shape: tuple[int, ...]) -> str:
        """What sample ``which`` (0 or 1) passes for it, the op's argument ``position``, whose first tensor
        has ``shape``. A tensor: random, of ``shape`` (a later tensor of the second sample: of its last dim,
        broadcast as a weight is); an optional one ``None`` in the first sample only. Else: the default in
        the first sample, another value in the second (a bool flipped, a float moved), so an impl that
        ignores the argument fails; without a default a plain value (floats distinct per argument)."""
        if self.kind == TENSOR:
            if self.optional and which == 0:
                return "None"
            dims = shape[-1:] if which == 1 and position > 0 else shape
            return f"torch.randn({', '.join(map(str, dims))}, generator=generator)"
        if self.default is not None and self.default != "None":
            if which == 0 or self.kind not in ("bool", "float"):
                return self.default
            return str(self.default != "True") if self.kind == "bool" else literal(float(self.default) + 0.25)
        if self.optional and which == 0:
            return "None"
        if self.kind == "float":
            return literal(_SAMPLE_FLOATS[which][position % len(_SAMPLE_FLOATS[which])])
        return str(which == 1) if self.kind == "bool" else _SAMPLE_VALUES[self.kind]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One torch op a new pack translates.

    Fields:
        namespace, name, overload: ``swishlib``, ``fused_swish``, ``""`` (for ``.default``).
        signature: the schema after the name: ``(Tensor x, float beta) -> Tensor``.
        arguments: its arguments, in order.
        outputs: how many tensors it returns.
    """

    namespace: str
    name: str
    overload: str
    signature: str
    arguments: tuple[Argument, ...]
    outputs: int

    @property
    def qualified(self) -> str:
        """``swishlib::fused_swish`` (``.overload`` when it has one)."""
        return f"{self.namespace}::{self.name}" + (f".{self.overload}" if self.overload else "")

    @property
    def schema(self) -> str:
        return f"{self.qualified}{self.signature}"

    @property
    def function(self) -> str:
        """The impl's name: ``swishlib_fused_swish``."""
        return "_".join(p for p in (self.namespace, self.name, self.overload) if p)

    @property
    def onnx_name(self) -> str:
        """The pack's ONNX op for it: ``FusedSwish``."""
        return "".join(part[:1].upper() + part[1:] for part in re.split(r"_+", f"{self.name}_{self.overload}") if part)

    @property
    def tensors(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.arguments if a.kind == TENSOR)

    @property
    def attributes(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.arguments if a.kind != TENSOR)

    def parameters(self) -> list[str]:
        """The impl's parameters, ``*`` before the keyword-only ones."""
        params: list[str] = []
        for argument in self.arguments:
            if argument.keyword_only and "*" not in params:
                params.append("*")
            params.append(argument.parameter)
        return params


def _kind(name: str, type_: Any) -> tuple[str, bool]:
    """An argument's kind and whether it is optional, from its ``torch._C`` type."""
    import torch

    optional = isinstance(type_, torch.OptionalType)
    inner = type_.getElementType() if optional else type_
    kinds = {
        torch.TensorType: TENSOR, torch.IntType: "int", torch.SymIntType: "int", torch.FloatType: "float",
        torch.NumberType: "float", torch.BoolType: "bool", torch.StringType: "str",
    }  # fmt: skip
    kind = kinds.get(type(inner))
    if isinstance(inner, torch.ListType):
        element = kinds.get(type(inner.getElementType()))
        kind = {"int": "ints", "float": "floats"}.get(element or "")
    if kind is None:
        raise OpSpecError(
            f"argument {name!r} is a {inner}, which a new pack cannot take as an ONNX input or attribute: give the "
            "op Tensor, Tensor?, int, SymInt, float, Scalar, bool, str, int[] or float[] arguments, or write its "
            "impl by hand (docs/writing-packs.md)"
        )
    return kind, optional


def parse(text: str) -> OpSpec:
    """Read ``--op`` ``ns::name(Tensor x, float beta) -> Tensor`` (``ns::name.overload(...)`` too).
    Raises :class:`OpSpecError` with what to write instead."""
    import torch

    found = _OP_RE.match(text)
    if found is None and re.match(r"^\s*\w+::\w+(?:\.\w+)?\s*\(", text) and not text.isascii():
        raise OpSpecError(
            f"--op {text!r} names the op with letters torch does not read: give the namespace, name and overload "
            "in ASCII letters, digits and '_' (e.g. 'mylib::fused_swish')"
        )
    if found is None:
        raise OpSpecError(
            f"--op {text!r} is not a torch op schema: write it as torch.library defines one, "
            "e.g. 'mylib::fused_swish(Tensor x, float beta) -> Tensor'"
        )
    namespace, name, overload = found.group(1), found.group(2), found.group(3) or ""
    if namespace in RESERVED_NAMESPACES:
        raise OpSpecError(
            f"--op {namespace}::{name}: {namespace} is torch's own namespace; --op is for ops a library defines "
            "(an impl of a torch op is written by hand: docs/writing-packs.md, 'Writing impls')"
        )
    try:
        schema = torch._C.parse_schema(text.strip())
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise OpSpecError(f"--op {text!r} is not a schema torch reads: {first}") from e
    except UnicodeDecodeError as e:  # torch's lexer reads names as ASCII and fails on others
        raise OpSpecError(
            f"--op {text!r} has a name torch does not read: name the arguments in ASCII letters, digits and '_'"
        ) from e
    if schema.is_mutable:
        raise OpSpecError(
            f"--op {text!r} writes to an argument ((a!)): opreg exports what torch.export captures, the functional "
            "form of an op; give that op's schema"
        )
    arguments = []
    for arg in schema.arguments:
        kind, optional = _kind(arg.name, arg.type)
        default = None if arg.default_value is None and not arg.has_default_value() else literal(arg.default_value)
        arguments.append(Argument(arg.name, kind, optional, default, arg.kwarg_only))
    returns = [str(r.type) for r in schema.returns]
    if not returns or any(r != "Tensor" for r in returns):
        raise OpSpecError(
            f"--op {text!r} returns {', '.join(returns) or 'nothing'}: a new pack translates ops that return "
            "one or more Tensors"
        )
    if not any(a.kind == TENSOR for a in arguments):
        raise OpSpecError(f"--op {text!r} takes no Tensor: its ONNX op would have no input")
    signature = f"({' '.join(found.group(4).split())}) -> {' '.join(found.group(5).split())}"
    return OpSpec(namespace, name, overload, signature, tuple(arguments), len(returns))


def parse_all(texts: list[str] | tuple[str, ...]) -> tuple[OpSpec, ...]:
    """Every ``--op``; two with one name, or with one ONNX op name, are an :class:`OpSpecError`."""
    ops = tuple(parse(text) for text in texts)
    for attribute, what in (("qualified", "op"), ("onnx_name", "ONNX op name")):
        seen: dict[str, str] = {}
        for op in ops:
            key = getattr(op, attribute)
            if key in seen:
                raise OpSpecError(f"--op {seen[key]} and --op {op.qualified} give one {what}, {key!r}: give each once")
            seen[key] = op.qualified
    return ops
