"""Facts of ONNX's operator schemas across opset versions: which version of an op's schema a model
importing an opset reads, and the lowest opset at which emitted nodes keep their meaning.

A node emitted against opset ``N`` (``op18.Add``) is read at the opset its model imports, ``M``. It
means the same there when its op's schema is the same at ``M`` as at ``N``: ``since(op, M) ==
since(op, N)`` (onnx.defs.get_schema's ``since_version``). For ``M <= N`` that holds exactly when
``M >= since(op, N)``, so the lowest opset that keeps every node's meaning is the largest
``since(op, N)`` over the nodes (:func:`floor`), raised where a node's types are only in a newer
schema (a bfloat16 Conv emitted with ``op18`` needs Conv-22: :func:`needed`). Schemas come from
the installed onnx, read once per (op, version, domain); importing this module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping

FLOOR_KEY = "opreg.opset_floor"
"""Model ``metadata_props``: ``{domain: {"version": N, "set_by": ["Op-N", ...]}}`` (JSON) for each domain
a model imports lower than its target (:class:`opreg.exporter.passes.opsets.LowestOpsets`)."""


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


def history(op: str, domain: str = "") -> tuple[int, ...]:
    """Every since-version of ``op``'s schemas in ``domain``, oldest first."""
    return _histories().get((op, "" if domain == "ai.onnx" else domain), ())


@functools.cache
def _histories() -> dict[tuple[str, str], tuple[int, ...]]:
    """Every op's since-versions by ``(op, domain)``, from one walk of onnx's schemas (a walk builds
    all 659 of them: 5-20 ms, which once per op cost an export 0.2 s)."""
    import onnx.defs

    found: dict[tuple[str, str], list[int]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        found.setdefault((schema.name, schema.domain), []).append(schema.since_version)
    return {key: tuple(sorted(versions)) for key, versions in found.items()}


Types = tuple[str | None, ...]
"""A node's inputs' or outputs' types as ONNX spells them (``tensor(float)``), ``None`` where not known."""


@functools.cache
def accepts(op: str, version: int, domain: str, inputs: Types, outputs: Types) -> bool:
    """Whether ``op``'s schema at ``version`` takes these input and output types (a type not known,
    or bound to no constraint, passes)."""
    import onnx.defs

    schema = onnx.defs.get_schema(op, version, "" if domain == "ai.onnx" else domain)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for formals, types in ((schema.inputs, inputs), (schema.outputs, outputs)):
        for index, type_ in enumerate(types):
            if type_ is None or not formals:
                continue
            formal = formals[min(index, len(formals) - 1)]  # a variadic last formal takes the rest
            if formal.type_str in allowed and type_ not in allowed[formal.type_str]:
                return False
    return True


def needed(op: str, emitted: int, upto: int, domain: str = "", inputs: Types = (), outputs: Types = ()) -> int | None:
    """The lowest version a node of ``op`` emitted against ``emitted`` and read at ``upto`` needs: the
    first schema from ``since(op, emitted)`` on that takes its types (a schema newer than the one it
    was emitted with only adds types: what reading it at ``upto`` relied on), else ``since(op, upto)``;
    ``None`` if onnx has no schema for it."""
    first, last = since(op, emitted, domain), since(op, upto, domain)
    if first is None or last is None:
        return None
    for version in (v for v in history(op, domain) if first <= v <= last):
        if accepts(op, version, domain, inputs, outputs):
            return version
    return last


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


Node = tuple[str, int, Types, Types]
"""``(op, emitted version, input types, output types)``: what :func:`floor` reads of a node."""


def floor(domain: str, nodes: Iterable[Node], low: int, upto: int) -> Floor:
    """The :class:`Floor` of ``domain`` (imported at ``upto``) for ``nodes``, each emitted against a
    version (the model's own when not known): the largest version one of them :func:`needed`."""
    found: dict[str, int] = {}
    unknown: set[str] = set()
    for op, emitted, inputs, outputs in nodes:
        version = needed(op, min(emitted, upto), upto, domain, inputs, outputs)
        if version is None:
            unknown.add(op)
        else:
            found[op] = max(found.get(op, 0), version)
    version = max([low, *found.values()])
    set_by = tuple(sorted(f"{op}-{v}" for op, v in found.items() if v == version))
    return Floor(domain, version, set_by, tuple(sorted(unknown)))


def floors_of(metadata: Mapping[str, str]) -> dict[str, dict[str, object]]:
    """What :class:`opreg.exporter.passes.opsets.LowestOpsets` recorded in ``metadata_props`` (``{}`` if nothing)."""
    try:
        found = json.loads(metadata.get(FLOOR_KEY, "{}"))
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def opsets_text(opsets: Mapping[str, int], floors: Mapping[str, Mapping[str, object]]) -> str:
    """``ai.onnx=21 (set by Gelu-20), com.microsoft=1``: a model's opsets (by label), each lowered one
    with the ops that set it (``floors``: :func:`floors_of`)."""
    parts = []
    for label, version in opsets.items():
        floor_ = floors.get(label) or {}
        set_by = list(floor_.get("set_by") or ()) if isinstance(floor_, Mapping) else []
        parts.append(f"{label}={version}" + (f" (set by {', '.join(set_by)})" if set_by else ""))
    return ", ".join(parts)
