"""Facts of ONNX's operator schemas across opset versions: which version of an op's schema a model
importing an opset reads, and the lowest opset at which emitted nodes keep their meaning.

A node emitted against opset ``N`` (``op18.Add``) is read at the opset its model imports, ``M``. It
means the same there when its op's schema is the same at ``M`` as at ``N``: ``since(op, M) ==
since(op, N)`` (onnx.defs.get_schema's ``since_version``). For ``M <= N`` that holds exactly when
``M >= since(op, N)``, so the lowest opset that keeps every node's meaning is the largest
``since(op, N)`` over the nodes (:func:`floor`). Schemas come from the installed onnx, read once per
(op, version, domain); importing this module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable


@functools.cache
def since(op: str, version: int, domain: str = "") -> int | None:
    """The version of ``op``'s schema a model importing ``domain`` at ``version`` reads (its
    ``since_version``), or ``None`` if onnx defines no schema for it there."""
    import onnx.defs

    try:
        return onnx.defs.get_schema(op, version, "" if domain == "ai.onnx" else domain).since_version
    except onnx.defs.SchemaError:
        return None


@functools.cache
def is_function(op: str, version: int, domain: str = "") -> bool:
    """Whether onnx defines ``op`` at opset ``version`` as a function (Gelu, LayerNormalization): a
    runtime with no kernel for it expands the function's body instead."""
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op, version, "" if domain == "ai.onnx" else domain)
    except onnx.defs.SchemaError:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def same_schema(op: str, a: int, b: int, domain: str = "") -> bool:
    """Whether ``op`` has one schema at opsets ``a`` and ``b`` of ``domain`` (both defined)."""
    first = since(op, a, domain)
    return first is not None and first == since(op, b, domain)


def lowest_equivalent(op: str, emitted: int, domain: str = "", low: int = 1) -> int | None:
    """The lowest opset of at least ``low`` at which ``op`` means what it means at ``emitted``
    (``None`` if onnx has no schema for it at ``emitted``)."""
    found = since(op, emitted, domain)
    return None if found is None else max(found, low)


@dataclasses.dataclass(frozen=True)
class Floor:
    """The lowest version of one domain at which every node keeps its meaning.

    Fields:
        domain: the domain (``""`` for ai.onnx).
        version: that lowest version (at least the ``low`` it was asked with).
        set_by: the ops whose schema starts there (``LayerNormalization-17``), empty when no op
            needs ``low`` itself (``low`` alone set it).
        unknown: ops onnx defines no schema for in this domain (then the domain keeps its version).
    """

    domain: str
    version: int
    set_by: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


def floor(domain: str, nodes: Iterable[tuple[str, int]], low: int) -> Floor:
    """The :class:`Floor` of ``domain`` for ``nodes``: ``(op, emitted version)`` pairs, the version
    being the opset the node was emitted against (the model's own when not known)."""
    needed: dict[str, int] = {}
    unknown: set[str] = set()
    for op, emitted in nodes:
        found = since(op, emitted, domain)
        if found is None:
            unknown.add(op)
        else:
            needed[op] = max(needed.get(op, 0), found)
    version = max([low, *needed.values()])
    set_by = tuple(sorted(f"{op}-{v}" for op, v in needed.items() if v == version))
    return Floor(domain, version, set_by, tuple(sorted(unknown)))
