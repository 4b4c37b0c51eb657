"""Torch op names: ``namespace::name.overload``."""

from __future__ import annotations

import dataclasses
import functools
import re

from opreg.errors import InvalidOpNameError

_PART = r"[A-Za-z_][A-Za-z0-9_]*"
_QUALIFIED = re.compile(rf"^(?P<ns>{_PART})(?:::|\.)(?P<name>{_PART})(?:\.(?P<overload>{_PART}))?$")


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class OpName:
    """A torch operator overload.

    Fields:
        namespace: ``aten``, ``prims`` or a custom library such as ``mylibrary``.
        name: the operator's name (``add``).
        overload: the overload (``Tensor``); ``default`` for the unnamed one.
    """

    namespace: str
    name: str
    overload: str = "default"

    def __post_init__(self) -> None:
        for field in ("namespace", "name", "overload"):
            value = getattr(self, field)
            if not isinstance(value, str) or not re.fullmatch(_PART, value):
                raise InvalidOpNameError(
                    f"{field} {value!r} of a torch op name must be an identifier (letters, digits, underscores)"
                )

    @classmethod
    def of(cls, op: OpNameLike) -> OpName:
        """Parse ``aten::add.Tensor``, ``aten.add.Tensor``, ``aten::gelu`` (= ``.default``),
        or take a ``torch.ops`` overload object such as ``torch.ops.aten.add.Tensor``."""
        if isinstance(op, OpName):
            return op
        if isinstance(op, str):
            return _parse(op)
        schema = getattr(op, "_schema", None)
        if schema is not None:
            namespace, _, name = schema.name.partition("::")
            return cls(namespace, name, schema.overload_name or "default")
        raise InvalidOpNameError(
            f"expected a torch op name such as 'aten::add.Tensor' or a torch.ops overload, got {op!r}"
        )

    def __str__(self) -> str:
        return f"{self.namespace}::{self.name}.{self.overload}"


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> OpName:
    match = _QUALIFIED.match(text.strip())
    if not match:
        raise InvalidOpNameError(
            f"{text!r} is not a torch op name: write namespace::name.overload, "
            "e.g. 'aten::add.Tensor' (the overload defaults to 'default')"
        )
    return OpName(match["ns"], match["name"], match["overload"] or "default")


OpNameLike = "OpName | str | object"
