"""The structures a model takes and returns: names of their leaves, and the classes
``torch.export`` must know as pytree nodes before it can return them.

Every output of an exported model is named from its path in the returned structure
(``logits``, ``past_key_values.3.value``, ``output_1.sample``): :func:`leaf_paths` reads
the path from a ``TreeSpec`` alone, so a class registered without key functions
(diffusers registers its output dataclasses that way) is named from its fields too.

``torch.export`` refuses to return an object of a class pytree does not know
("Found <class ...> in output, which is not a known type"). :func:`register_known_types`
registers transformers' cache classes (``DynamicCache``: one node per layer, with a
``key`` and a ``value``) before a capture; :func:`register_refused_type` registers the
class a failed capture names (a dataclass through ``torch.export.register_dataclass``,
another class by its attributes), so the capture can be tried again. Both registrations
stay in place for the rest of the process, as a user's own would: ``OnnxProgram.run``
rebuilds the structure through them.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

logger = logging.getLogger(__name__)

_REFUSED = re.compile(r"Found <class '(?P<path>[^']+)'> in (?:output|input)s?, which is not a known type")
"""What torch says when a model returns (or takes) an object of a class pytree does not know."""

_PATH_NAMES: dict[str, dict[str, str]] = {
    # the layers of a cache are its children: past_key_values.0.key, not past_key_values.layers.0.keys
    "transformers.cache_utils.Cache": {"layers": ""},
    "transformers.cache_utils.CacheLayerMixin": {"keys": "key", "values": "value"},
}
"""How the attributes of a class registered by attributes appear in paths, by the qualified
name of the class or of one of its bases (``""``: the attribute adds nothing to the path)."""


# -- paths -------------------------------------------------------------------------------


def leaf_paths(spec: pytree.TreeSpec) -> list[tuple[str, ...]]:
    """The path of every leaf of ``spec``, in flattening order, as the text of each key:
    dict keys and dataclass, ``ModelOutput`` and NamedTuple fields by name, sequence items by
    index. Read from the spec alone, so classes registered without a ``flatten_with_keys_fn``
    are named too (from their context or fields; by index when neither names them)."""
    if spec.is_leaf():
        return [()]
    paths = []
    for key, child in zip(_child_keys(spec), spec.children(), strict=True):
        paths.extend(((key, *path) if key else path) for path in leaf_paths(child))
    return paths


def _child_keys(spec: pytree.TreeSpec) -> list[str]:
    count = spec.num_children
    if isinstance(spec.context, _Attributes):
        return [key.label for key in spec.context.keys]
    keys = _keys_from_handler(spec)
    if keys is None:
        keys = _keys_from_context(spec.context, count)
    if keys is None and dataclasses.is_dataclass(spec.type):
        fields = [f.name for f in dataclasses.fields(spec.type)]
        keys = fields if len(fields) == count else None
    return keys if keys is not None else [str(i) for i in range(count)]


class _Slot:
    """Stands for one child while a node is rebuilt to read its keys."""

    def __init__(self, index: int) -> None:
        self.index = index


def _keys_from_handler(spec: pytree.TreeSpec) -> list[str] | None:
    """The keys the node's ``flatten_with_keys_fn`` gives, read from a copy of the node rebuilt
    with stand-ins for its children (``None`` when it has no such function or cannot be rebuilt)."""
    handler = pytree.SUPPORTED_NODES.get(spec.type)
    if handler is None or handler.flatten_with_keys_fn is None:
        return None
    slots = [_Slot(i) for i in range(spec.num_children)]
    try:
        node = handler.unflatten_fn(slots, spec.context)
        pairs, _ = handler.flatten_with_keys_fn(node)
    except Exception:  # an unflatten that computes with its children (a cache built by update())
        return None
    if len(pairs) != len(slots):
        return None
    keys: list[str | None] = [None] * len(slots)
    for order, (key, child) in enumerate(pairs):
        keys[child.index if isinstance(child, _Slot) else order] = key_text(key)
    return None if any(k is None for k in keys) else keys  # type: ignore[return-value]


def _keys_from_context(context: Any, count: int) -> list[str] | None:
    """Names a keyless node's context holds: a list of ``count`` strings (dict-like nodes, as
    diffusers' ``BaseOutput`` is registered), or such a list first in it (dataclass nodes)."""

    def names(value: Any) -> list[str] | None:
        if isinstance(value, (list, tuple)) and len(value) == count and all(isinstance(v, str) for v in value):
            return list(value)
        return None

    found = names(context)
    if found is None and isinstance(context, (list, tuple)) and context:
        found = names(context[0])
    return found


def key_text(key: Any) -> str:
    """The text of one pytree key: a dict key, a field or attribute name, an index."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def clean(text: str) -> str:
    """``text`` as a name part: runs of characters other than letters, digits and ``_`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")


# -- classes torch.export must know --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AttrKey(pytree.GetAttrKey):
    """A pytree key of a node registered by its attributes: torch's ``GetAttrKey`` of the
    attribute ``name`` (so torch.export can say where an input it reaches comes from, and name
    it), shown in output paths as ``label`` (``""``: it adds nothing to the path)."""

    label: str = ""

    @property
    def attr(self) -> str:
        return self.name


def register_known_types() -> None:
    """Register transformers' cache classes (``DynamicCache``, ``StaticCache``, their layers...)
    as pytree nodes, when transformers' caches are loaded and a class is not registered yet."""
    module = sys.modules.get("transformers.cache_utils")
    if module is None:
        return
    for base in ("Cache", "CacheLayerMixin"):
        root = getattr(module, base, None)
        if isinstance(root, type):
            for cls in (root, *_subclasses(root)):
                _register_by_attributes(cls)


def register_refused_type(error: BaseException) -> type | None:
    """The class a failed capture could not return (or take), now registered as a pytree node;
    ``None`` when the error is another, or the class cannot be found or registered."""
    text = "\n".join(str(e) for e in _chain(error))
    match = _REFUSED.search(text)
    if match is None:
        return None
    registered = [cls for cls in _find_classes(match.group("path")) if _register(cls)]
    if registered:
        logger.info("registered %s as a pytree node so torch.export can return it", match.group("path"))
    return registered[-1] if registered else None


def _chain(error: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _subclasses(cls: type) -> Iterable[type]:
    seen: set[type] = set()
    stack = [cls]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


def _register(cls: type) -> bool:
    """Register ``cls`` as a pytree node (a dataclass as ``torch.export.register_dataclass`` does,
    another class by its attributes); False if it is registered already or cannot be."""
    if cls in pytree.SUPPORTED_NODES:
        return False
    if dataclasses.is_dataclass(cls):
        try:
            torch.export.register_dataclass(cls)
        except ValueError:  # registered meanwhile
            return False
        return True
    return _register_by_attributes(cls)


def _find_classes(path: str) -> list[type]:
    """The loaded classes whose ``module.qualname`` is ``path`` (several when a function that
    defines a class ran more than once)."""
    return [cls for cls in _subclasses(object) if f"{cls.__module__}.{cls.__qualname__}" == path]


def _path_names(cls: type) -> Mapping[str, str]:
    for base in cls.__mro__:
        names = _PATH_NAMES.get(f"{base.__module__}.{base.__qualname__}")
        if names is not None:
            return names
    return {}


def _register_by_attributes(cls: type) -> bool:
    """Register ``cls`` as a pytree node whose children are its attributes that hold tensors
    or symbolic numbers, rebuilt without calling ``__init__``. False if it cannot be (already
    registered, or its instances have no ``__dict__``)."""
    if cls in pytree.SUPPORTED_NODES or pytree.is_namedtuple_class(cls) or cls.__dict__.get("__slots__") is not None:
        return False
    names = _path_names(cls)

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[AttrKey, Any]], _Attributes]:
        children, rest = [], {}
        for attr, value in vars(obj).items():
            if _holds_tensors(value):
                children.append((AttrKey(attr, names.get(attr, attr)), value))
            else:
                rest[attr] = value
        return children, _Attributes(type(obj), tuple(key for key, _ in children), rest)

    def flatten(obj: Any) -> tuple[list[Any], _Attributes]:
        children, context = flatten_with_keys(obj)
        return [value for _, value in children], context

    def unflatten(values: Iterable[Any], context: _Attributes) -> Any:
        obj = context.kind.__new__(context.kind)
        obj.__dict__.update(context.rest)
        obj.__dict__.update(zip((key.attr for key in context.keys), values, strict=True))
        return obj

    try:
        pytree.register_pytree_node(
            cls, flatten, unflatten, flatten_with_keys_fn=flatten_with_keys,
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        )  # fmt: skip
    except ValueError:  # registered meanwhile
        return False
    return True


@dataclasses.dataclass(frozen=True, eq=False)
class _Attributes:
    """The context of an object registered by its attributes: its class, the keys of its children
    and its other attributes. Two are equal when class, keys and the other attributes' names are
    (their values are not compared: a cache's device or dtype need not compare equal to be the
    same structure)."""

    kind: type
    keys: tuple[AttrKey, ...]
    rest: Mapping[str, Any]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Attributes)
            and (self.kind, self.keys) == (other.kind, other.keys)
            and self.rest.keys() == other.rest.keys()
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.keys, tuple(self.rest)))

    def __repr__(self) -> str:
        return f"{self.kind.__name__}({', '.join(key.attr for key in self.keys)})"


def _holds_tensors(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` holds a tensor or a symbolic number, directly or in containers and
    objects of classes pytree knows or opreg registers on the way (nested caches, layers)."""
    if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if depth > 8 or value is None or isinstance(value, (str, bytes, int, float, bool, enum.Enum, type)):
        return False
    if isinstance(value, Mapping):
        return any(_holds_tensors(v, depth + 1) for v in value.values())
    if isinstance(value, Sequence):
        return any(_holds_tensors(v, depth + 1) for v in value)
    if type(value) in pytree.SUPPORTED_NODES:
        return any(_holds_tensors(v, depth + 1) for v in pytree.tree_leaves(value))
    attributes = getattr(value, "__dict__", None)
    if (
        isinstance(attributes, dict)
        and not isinstance(value, torch.nn.Module)
        and any(_holds_tensors(v, depth + 1) for v in attributes.values())
    ):
        _register(type(value))  # so flattening the object that holds it descends into it
        return True
    return False
