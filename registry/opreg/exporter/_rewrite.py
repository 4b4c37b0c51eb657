"""The packs' graph-level rewrites (``opreg_rewrite_rules``), applied to a finished graph.

A pack gives, for the export's target, onnxscript rewrite rules, rule sets and
``onnx_ir`` passes (:func:`opreg.hookspecs.opreg_rewrite_rules`, whose contract checks
and names them). :func:`collect` takes every loaded pack's; :func:`apply` runs them in
order. A node a rule makes inherits the provenance of the nodes it replaced
(distinct values joined with ``+``) and records the rule in ``opreg.rewrite``;
afterwards every node must be one the target can run, and the domains the
rewrites brought in are imported at the target's versions.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import onnx_ir as ir

from opreg.errors import OpsetConflictError, PluginError
from opreg.exporter._nodes import PACK_KEY, PROVENANCE_KEYS, REWRITE_KEY
from opreg.node_types import op_schema
from opreg.targets import ONNX_DOMAIN, Target, domain_label

logger = logging.getLogger(__name__)

HOOK = "opreg_rewrite_rules"
JOIN = "+"
"""How the distinct provenance values of the nodes a rule replaced are joined."""
_ONNXSCRIPT_RULE_TAG = "pkg.onnxscript.rewriter.rule_name"
"""onnxscript's own record of the rule that made a node; ``opreg.rewrite`` says it with the pack."""


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """One item a pack's ``opreg_rewrite_rules`` returned for a target.

    Fields:
        pack: the pack that returned it.
        item: an onnxscript ``RewriteRule`` or ``RewriteRuleSet``, or an ``onnx_ir`` pass.
        names: the names its nodes are recorded under (``opreg.rewrite = pack:name``):
            the rule's, each rule's of a set, or the pass's class name.
    """

    pack: str
    item: Any
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.names or not all(isinstance(n, str) and n for n in self.names):
            raise ValueError(f"a rewrite needs non-empty names, got {self.names!r}")

    @property
    def is_pass(self) -> bool:
        return not _is_rule(self.item) and not _is_rule_set(self.item)

    def labels(self) -> tuple[str, ...]:
        return tuple(f"{self.pack}:{name}" for name in self.names)


def _is_rule(item: Any) -> bool:
    from onnxscript.rewriter import pattern

    return isinstance(item, pattern.RewriteRule)


def _is_rule_set(item: Any) -> bool:
    from onnxscript.rewriter import pattern

    return isinstance(item, pattern.RewriteRuleSet)


def collect(calls: Iterable[tuple[str, Any]]) -> list[Rewrite]:
    """The rewrites of every pack's checked hook result ``(pack, [(item, names), ...])``, in order
    (the host left out, and reported, a pack whose hook raised or broke its contract)."""
    return [Rewrite(pack, item, names) for pack, items in calls for item, names in items]


# -- provenance ------------------------------------------------------------------------


def merged_provenance(replaced: Sequence[ir.Node], label: str) -> dict[str, str]:
    """The provenance of a node that replaces ``replaced`` (in graph order): each key's
    distinct values joined with ``+``, and ``opreg.rewrite`` ending with ``label``."""
    merged: dict[str, str] = {}
    for key in (*PROVENANCE_KEYS, REWRITE_KEY):
        values: list[str] = []
        for node in replaced:
            for value in node.metadata_props.get(key, "").split(JOIN):
                if value and value not in values:
                    values.append(value)
        if key == REWRITE_KEY and label not in values:
            values.append(label)
        if values:
            merged[key] = JOIN.join(values)
    return merged


class _Stamping:
    """A rule that gives the nodes it makes the provenance of the nodes it matched.

    Everything but ``try_rewrite`` is the wrapped rule's; the stamp is written before
    onnxscript merges the matched nodes' metadata, so it wins there."""

    def __init__(self, rule: Any, label: str, order: Mapping[int, int]) -> None:
        self._rule = rule
        self._label = label
        self._order = order
        self.fired = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rule, name)

    def try_rewrite(self, model: ir.Model, graph_or_function: Any, node: ir.Node, **kwargs: Any) -> Any:
        delta = self._rule.try_rewrite(model, graph_or_function, node, **kwargs)
        if delta is None or kwargs.get("tracer") is not None:
            return delta
        matched = getattr(getattr(delta, "match", None), "nodes", None) or [node]
        replaced = sorted(matched, key=lambda n: self._order.get(id(n), len(self._order)))
        stamp = merged_provenance(replaced, self._label)
        for new in getattr(delta, "new_nodes", ()):
            new.metadata_props.update(stamp)
        self.fired += 1
        return delta


def _all_nodes(model: ir.Model) -> Iterator[ir.Node]:
    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from ir.traversal.RecursiveGraphIterator(function)


def _apply_rules(model: ir.Model, rewrite: Rewrite) -> dict[str, int]:
    from onnxscript.rewriter import pattern

    rules = list(rewrite.item.rules) if _is_rule_set(rewrite.item) else [rewrite.item]
    order = {id(node): index for index, node in enumerate(_all_nodes(model))}
    stamping = [_Stamping(rule, label, order) for rule, label in zip(rules, rewrite.labels(), strict=True)]
    pattern.RewriteRuleSet(stamping).apply_to_model(model)  # type: ignore[arg-type]
    return {s._label: s.fired for s in stamping if s.fired}


def _apply_pass(model: ir.Model, rewrite: Rewrite) -> dict[str, int]:
    (label,) = rewrite.labels()
    before = {id(node) for node in _all_nodes(model)}
    result = rewrite.item(model)
    if result.model is not model:
        raise PluginError(f"rewrite {label} returned a new model: opreg applies passes that change the model in place")
    made = [node for node in _all_nodes(model) if id(node) not in before]
    for node in made:  # after the rewrites recorded on what it replaced, if the pass copied them
        recorded = [value for value in node.metadata_props.get(REWRITE_KEY, "").split(JOIN) if value]
        node.metadata_props[REWRITE_KEY] = JOIN.join([*recorded, label] if label not in recorded else recorded)
        node.metadata_props.setdefault(PACK_KEY, rewrite.pack)
    return {label: len(made)} if result.modified else {}


def apply(model: ir.Model, rewrites: Sequence[Rewrite], target: Target) -> dict[str, int]:
    """Apply ``rewrites`` to ``model`` in order; how many nodes each rule (``pack:name``)
    made, for those that fired. Afterwards every node must be one ``target`` can run:
    a domain the rewrites brought in is imported at the target's version, and a node
    of a domain the target lacks, or an ai.onnx op newer than it, is an
    :class:`OpsetConflictError` naming the rewrite."""
    fired: dict[str, int] = {}
    for rewrite in rewrites:
        done = _apply_pass(model, rewrite) if rewrite.is_pass else _apply_rules(model, rewrite)
        for label, count in done.items():
            fired[label] = fired.get(label, 0) + count
    if fired:
        import_domains(model, target)
    for node in _all_nodes(model):
        node.metadata_props.pop(_ONNXSCRIPT_RULE_TAG, None)
    return fired


def import_domains(model: ir.Model, target: Target) -> None:
    """Import every domain the rewrites' nodes use at the target's version (onnxscript's
    rewriter imports them at whatever version a rule's builder used), checking that the
    target has the domain, and for ai.onnx, the op."""
    owners: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for owner in owners:
        imports = owner.opset_imports
        for node in ir.traversal.RecursiveGraphIterator(owner):
            label = node.metadata_props.get(REWRITE_KEY)
            if not label:
                continue
            what = f"{domain_label(node.domain)}::{node.op_type}"
            version = target.get(node.domain)
            if version is None:
                raise OpsetConflictError(
                    f"rewrite {label} made {what}, but the target {target} has no {domain_label(node.domain)}: "
                    "its pack's opreg_rewrite_rules must return it only for targets that name the domain"
                )
            if node.domain == ONNX_DOMAIN and op_schema(node.op_type, version, ONNX_DOMAIN) is None:
                raise OpsetConflictError(
                    f"rewrite {label} made {what}, which ai.onnx {version} (the target's) does not have: its "
                    "pack's opreg_rewrite_rules must return it only for targets with a new enough ai.onnx"
                )
            imports[node.domain] = version
