"""What the selected packs declare, as data (:class:`Declared`), and as the JSON an entry of the
packs' cache holds (:mod:`opreg.packs.packcache`): written by :func:`as_data`, read back by
:func:`from_data`, which checks every value against :data:`SHAPE` first, so an entry edited by hand
or written by another version is refused with the first value out of place, never an internal error.
Impls read back carry :class:`Declaration` s for their functions and predicates: names that cannot run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from opreg.errors import OpregError
from opreg.pluginapi import PackReport, Rejection
from opreg.registry._inspect import Params
from opreg.registry.impls import Impl
from opreg.registry.opname import OpName
from opreg.registry.targets import OpsetRequirement, VersionRange


@dataclasses.dataclass(frozen=True)
class Declared:
    """What the selected packs declare, as data: what a registry is built from besides the packs' hooks
    (:func:`opreg.packs.plugins.load_packs` gives it, and this cache stores it).

    Fields:
        reports: every discovered pack's :class:`~opreg.pluginapi.PackReport`, in load order.
        impls: the loaded packs' impls, in registration order.
        profiles: ``(name, {domain: version}, pack)`` for each target profile a loaded pack adds.
        unsupported: ``(op, pack, reason)`` for each op a loaded pack declares unsupported.
    """

    reports: tuple[PackReport, ...]
    impls: tuple[Impl, ...]
    profiles: tuple[tuple[str, Mapping[str, int], str], ...] = ()
    unsupported: tuple[tuple[OpName, str, str], ...] = ()


class Declaration:
    """Stands for an impl's function or predicate in a registry read from the cache: it has the
    name, and calling it is an :class:`~opreg.OpregError` (build the registry to run impls)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise OpregError(
            f"{self.name} was read from opreg's cache of what packs declare and cannot run: "
            "use opreg.build_registry() or opreg.default_registry() to export"
        )

    def __repr__(self) -> str:
        return f"<declared {self.name}>"

    def __eq__(self, other: object) -> bool:  # impls read from two entries alike compare equal
        return isinstance(other, Declaration) and other.name == self.name

    def __hash__(self) -> int:
        return hash((Declaration, self.name))


def impl_data(impl: Impl) -> dict[str, Any]:
    requirement = impl.requirement
    return {
        "op": str(impl.op),
        "name": impl.name,
        "pack": impl.pack,
        "onnx": [requirement.onnx.min, requirement.onnx.max],
        "domains": [[d, r.min, r.max] for d, r in requirement.domains],
        "priority": impl.priority,
        "predicate": impl.predicate is not None,
        "override": impl.override,
        "complex": impl.complex,
        "kind": impl.kind,
        "schema_checked": impl.schema_checked,
        "convention": impl.convention,
        "source": impl.source,
        "profiles": list(impl.profiles),
        "params": None if impl.params is None else impl.params.as_data(),
    }


def impl_of(data: Mapping[str, Any]) -> Impl:
    domains = tuple((d, VersionRange(low, high)) for d, low, high in data["domains"])
    name = data["name"]
    return Impl(
        op=OpName.of(data["op"]),
        function=Declaration(name),
        requirement=OpsetRequirement(VersionRange(*data["onnx"]), domains),
        priority=data["priority"],
        predicate=Declaration(f"the predicate of {name}") if data["predicate"] else None,
        pack=data["pack"],
        override=data["override"],
        complex=data["complex"],
        kind=data["kind"],
        name=name,
        schema_checked=data["schema_checked"],
        convention=data["convention"],
        source=data["source"],
        profiles=tuple(data["profiles"]),
        params=None if data["params"] is None else Params.of_data(data["params"]),
    )


def _report_of(data: Mapping[str, Any]) -> PackReport:
    fields = dict(data)
    fields["rejected"] = tuple(Rejection(**r) for r in data["rejected"])
    for name in ("domains", "profiles", "hooks", "schemas"):
        fields[name] = tuple(data[name])
    return PackReport(**fields)


def as_data(declared: Declared) -> dict[str, Any]:
    return {
        "reports": [dataclasses.asdict(r) for r in declared.reports],
        "impls": [impl_data(i) for i in declared.impls],
        "profiles": [[name, dict(versions), pack] for name, versions, pack in declared.profiles],
        "unsupported": [[str(op), pack, reason] for op, pack, reason in declared.unsupported],
    }


@dataclasses.dataclass(frozen=True)
class _Row:
    """A JSON list of fixed length, one shape per position."""

    shapes: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class _Map:
    """A JSON object of any keys (strings) whose values all have ``values``' shape."""

    values: Any


_OPTIONAL_VERSION = (int, None)
"""A type (JSON's: ``type(value) is`` it; ``float`` takes an int too), or a tuple of them (``None`` for null;
a tuple may hold one nested shape beside ``None``, for a value of that shape or null)."""


_REPORT = {
    "name": str, "distribution": str, "version": str, "value": str, "status": str, "reason": str,
    "hook": (str, None), "impls": int, "domains": [str], "profiles": [str], "schemas": [str],
    "rejected": [{"op": str, "function": str, "error": str}], "seconds": (float, int), "hooks": [str],
}  # fmt: skip


_IMPL = {
    "op": str, "name": str, "pack": str, "onnx": _Row((int, _OPTIONAL_VERSION)),
    "domains": [_Row((str, int, _OPTIONAL_VERSION))], "priority": int, "predicate": bool, "override": bool,
    "complex": bool, "kind": str, "schema_checked": bool, "convention": str, "source": str, "profiles": [str],
    "params": (_Row((bool, bool, [_Row((str, bool, bool, bool, bool, str))])), None),
}  # fmt: skip


SHAPE = {
    "reports": [_REPORT],
    "impls": [_IMPL],
    "profiles": [_Row((str, _Map(int), str))],
    "unsupported": [_Row((str, str, str))],
}
"""The shape :func:`as_data` writes: a type (or a tuple of them, ``None`` for null), ``[shape]``
for a list of items of that shape, ``{key: shape}`` for an object with exactly those keys."""


def shape_problem(value: Any, shape: Any, where: str) -> str | None:
    """Where ``value`` (read from JSON) is not of ``shape`` (see :data:`SHAPE`), or ``None``."""
    found = _mismatch(value, shape)
    if found is None:
        return None
    path, problem = found
    return f"{where}{''.join(f'[{p}]' if isinstance(p, int) else f'.{p}' for p in reversed(path))} {problem}"


def _mismatch(value: Any, shape: Any) -> tuple[list[int | str], str] | None:
    """``(path to the first value not of shape, reversed; what is wrong)``, or ``None`` (no string is
    made while everything fits: an entry of a few hundred impls is read on every cached command)."""
    if isinstance(shape, type):  # the most common shape first
        if type(value) is shape or (shape is float and type(value) is int):
            return None
        return [], f"is {type(value).__name__} {value!r:.40}, not {shape.__name__}"
    if isinstance(shape, tuple):
        if (value is None and None in shape) or any(type(value) is t for t in shape):
            return None
        nested = [t for t in shape if t is not None and not isinstance(t, type)]
        if nested and value is not None:  # a shape or null: one nested shape beside None
            return _mismatch(value, nested[0])
        names = " or ".join("null" if t is None else t.__name__ for t in shape)
        return [], f"is {type(value).__name__} {value!r:.40}, not {names}"
    pairs: list[tuple[int | str, Any, Any]]
    if isinstance(shape, list):
        if type(value) is not list:
            return [], "is not a list"
        pairs = [(i, v, shape[0]) for i, v in enumerate(value)]
    elif isinstance(shape, dict):
        if type(value) is not dict or value.keys() != shape.keys():
            return [], f"is not an object with the keys {sorted(shape)}"
        pairs = [(k, value[k], s) for k, s in shape.items()]
    elif isinstance(shape, _Row):
        if type(value) is not list or len(value) != len(shape.shapes):
            return [], f"is not a list of {len(shape.shapes)}"
        pairs = [(i, v, s) for i, (v, s) in enumerate(zip(value, shape.shapes, strict=True))]
    else:
        if type(value) is not dict:
            return [], "is not an object"
        pairs = [(k, v, shape.values) for k, v in value.items()]
    for key, item, item_shape in pairs:
        found = _mismatch(item, item_shape)
        if found is not None:
            found[0].append(key)
            return found
    return None


def from_data(data: Mapping[str, Any]) -> Declared:
    """What :func:`as_data` wrote, read back; ``ValueError`` naming the first value of another
    shape (an entry edited, or written by another version, is rebuilt, never an internal error)."""
    problem = shape_problem(data, SHAPE, "declared")
    if problem is not None:
        raise ValueError(problem)
    return Declared(
        reports=tuple(_report_of(r) for r in data["reports"]),
        impls=tuple(impl_of(i) for i in data["impls"]),
        profiles=tuple((name, versions, pack) for name, versions, pack in data["profiles"]),
        unsupported=tuple((OpName.of(op), pack, reason) for op, pack, reason in data["unsupported"]),
    )
