"""The packs' graph-level rewrites (``opreg_rewrite_rules``), each a pass of the finishing pipeline.

A pack gives, for the export's target, onnxscript rewrite rules, rule sets and
``onnx_ir`` passes (:func:`opreg.packs.hookspecs.opreg_rewrite_rules`, whose contract checks
and names them). :func:`collect` takes every loaded pack's; :func:`passes` makes each item
a :class:`PackRewrite` pass. A node a rule makes inherits the provenance of the
nodes it replaced (distinct values joined with ``+``) and records the rule in
``opreg.rewrite``; the domains the rewrites bring in are imported at the target's
versions.

A fault is the pack's, and named with its rule or pass: a rule or pass that
raises, or leaves a graph that is not valid (a node reading a value nothing
defines, a node ONNX refuses, a domain or ai.onnx op the target lacks), is
undone, right after it ran, and left out with a warning; the export goes on
without it (``strict``: fails with a :class:`PluginError` naming it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.errors import ExportError, OpsetConflictError, PluginError
from opreg.exporter._nodes import PACK_KEY, PROVENANCE_KEYS, REWRITE_KEY
from opreg.exporter.passes.pipeline import (
    ONNXSCRIPT_RULE_TAG,
    Pipeline,
    RootGate,
    all_nodes,
    pattern_ops,
    subgraphs_of,
)
from opreg.node_types import node_problem, op_schema
from opreg.packs import packfaults
from opreg.registry.targets import ONNX_DOMAIN, Target, domain_label

logger = logging.getLogger(__name__)

HOOK = "opreg_rewrite_rules"
REWRITES_KEY = "opreg.rewrites"
"""Model ``metadata_props``: the rewrite rules that fired, ``pack:rule=nodes made``, comma-separated."""
JOIN = "+"
"""How the distinct provenance values of the nodes a rule replaced are joined."""


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """One item a pack's ``opreg_rewrite_rules`` returned for a target.

    Fields:
        pack: the pack that returned it.
        item: an onnxscript ``RewriteRule`` or ``RewriteRuleSet``, or an ``onnx_ir`` pass.
        names: the names its nodes are recorded under (``opreg.rewrite = pack:name``):
            the rule's, each rule's of a set, or the pass's class name.
        asked: the user asked for it (``opreg.export(passes=...)``): a fault fails the
            export (:class:`OpsetConflictError` when the target cannot run what it made,
            else :class:`ExportError`) instead of being left out.
    """

    pack: str
    item: Any
    names: tuple[str, ...]
    asked: bool = False

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


class _RuleRaised(Exception):
    """A pack's rule raised while it was tried or built its replacement."""

    def __init__(self, label: str, error: BaseException) -> None:
        super().__init__(label)
        self.label = label
        self.error = error


class _RuleLooped(Exception):
    """A pack's rule kept matching the nodes it made (its replacement matches its own pattern):
    onnxscript visits the nodes a rewrite inserts, so such a rule never stops by itself."""

    def __init__(self, label: str, fired: int, nodes: int) -> None:
        super().__init__(label)
        self.label = label
        self.what = (
            f"fired {fired} times on a graph of {nodes} nodes: it keeps matching the nodes it made "
            "(its replacement matches its own pattern)"
        )


class _Stamping:
    """A rule that gives the nodes it makes the provenance of the nodes it matched, and whose
    errors name it.

    Everything but ``try_rewrite`` is the wrapped rule's; the stamp is written before
    onnxscript merges the matched nodes' metadata, so it wins there. A rule may fire at most
    twice per node the model had (plus a few): each firing replaces a match of the graph it was
    given, so more means it matches its own replacements, and it is stopped (:class:`_RuleLooped`).
    ``undo.keep()`` is called before each replacement is returned, while onnxscript has not yet
    changed the graph (the undo snapshot is taken at the set's first firing)."""

    def __init__(self, rule: Any, label: str, order: Mapping[int, int], undo: _Undo) -> None:
        self._rule = rule
        self._label = label
        self._order = order
        self._limit = 2 * len(order) + 16
        self._undo = undo
        self.fired = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rule, name)

    def try_rewrite(self, model: ir.Model, graph_or_function: Any, node: ir.Node, **kwargs: Any) -> Any:
        if self.fired >= self._limit:
            raise _RuleLooped(self._label, self.fired, len(self._order))
        try:
            delta = self._rule.try_rewrite(model, graph_or_function, node, **kwargs)
        except Exception as e:  # the graph is untouched: onnxscript changes it after try_rewrite returns
            raise _RuleRaised(self._label, e) from e
        if delta is None or kwargs.get("tracer") is not None:
            return delta
        matched = getattr(getattr(delta, "match", None), "nodes", None) or [node]
        replaced = sorted(matched, key=lambda n: self._order.get(id(n), len(self._order)))
        stamp = merged_provenance(replaced, self._label)
        for new in getattr(delta, "new_nodes", ()):
            new.metadata_props.update(stamp)
        self._undo.keep()
        self.fired += 1
        return delta


# -- a pack's item as a pass ---------------------------------------------------------------------


class _Fault(Exception):
    """What went wrong with one rule or pass of a pack."""

    def __init__(self, label: str, what: str, conflict: bool = False) -> None:
        super().__init__(f"{label} {what}")
        self.label = label
        self.what = what
        self.conflict = conflict
        """The target cannot run a node it made (a domain it lacks, an op newer than it)."""


def _snapshot(model: ir.Model) -> ir.Model:
    return model.clone()  # the graphs; tensors are shared


def _restore(model: ir.Model, snapshot: ir.Model) -> None:
    """Put ``snapshot``'s graphs, functions and metadata back into ``model`` (in place: the
    pipeline holds ``model``)."""
    model.graph = snapshot.graph
    model.functions.clear()
    model.functions.update(snapshot.functions)
    model.metadata_props.clear()
    model.metadata_props.update(snapshot.metadata_props)


class _Undo:
    """The model as it was before a rewrite, to put back if the rewrite is faulty: a clone
    (:func:`_snapshot`) taken by :meth:`keep` before the first change (a pack's pass: before
    it runs; a rule set: at its first firing, so that a rule set that fires nowhere, most of
    them, costs no clone). Nothing taken means nothing changed."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.snapshot: ir.Model | None = None

    def keep(self) -> None:
        if self.snapshot is None:
            self.snapshot = _snapshot(self.model)

    def restore(self) -> None:
        if self.snapshot is not None:
            _restore(self.model, self.snapshot)


class PackRewrite(InPlacePass):
    """One item a pack's ``opreg_rewrite_rules`` returned, as a pass: a rule, a rule set (its
    rules tried together in one sweep) or the pack's own pass. The nodes it makes record
    ``opreg.rewrite = pack:name`` and the provenance of what they replaced, the model's
    :data:`REWRITES_KEY` metadata counts them, and their domains are imported at the
    target's versions.

    A rule or pass that raises, or leaves a graph that is not valid (:func:`graph_problem`,
    :func:`_made_problem`), is undone and left out with a warning naming the pack and the
    rule or pass (the other rules of a set still apply); under ``strict`` it is a
    :class:`PluginError`."""

    def __init__(self, rewrite: Rewrite, target: Target, strict: bool = False) -> None:
        self.rewrite = rewrite
        self.target = target
        self.strict = strict
        self.name = f"{rewrite.pack}: {', '.join(rewrite.names)}"

    def call(self, model: ir.Model) -> PassResult:
        rewrite = self.rewrite
        rules = [] if rewrite.is_pass else list(rewrite.item.rules if _is_rule_set(rewrite.item) else [rewrite.item])
        labels = list(rewrite.labels())
        while True:
            nodes = list(all_nodes(model))
            undo = _Undo(model)
            try:
                if rewrite.is_pass:
                    undo.keep()
                    fired = self._apply_pass(model, {id(node) for node in nodes})
                else:
                    fired = self._apply_rules(model, rules, labels, nodes, undo)
                if undo.snapshot is None:  # no rule fired: the graph is as it was
                    return PassResult(model, False)
                before = {id(node) for node in nodes}
                made = [node for node in all_nodes(model) if id(node) not in before]
                problem, conflict = graph_problem(model), False
                if problem is None:  # a sound graph: can the target run what was made?
                    problem = _made_problem(made, self.target)
                    conflict = problem is not None
                if problem is not None:
                    raise _Fault(problem[0] or ",".join(fired) or labels[0], problem[1], conflict)
            except _Fault as fault:
                undo.restore()
                self._report(fault)
                if rewrite.is_pass or fault.label not in labels or len(labels) == 1:
                    return PassResult(model, False)
                index = labels.index(fault.label)  # leave the rule out, try the set's others again
                del rules[index], labels[index]
                continue
            break
        if not fired:
            return PassResult(model, False)
        _import_domains({id(node) for node in made}, model, self.target)
        counts = _counts(model.metadata_props.get(REWRITES_KEY, ""))
        for label, count in fired.items():
            counts[label] = counts.get(label, 0) + count
        model.metadata_props[REWRITES_KEY] = ",".join(f"{label}={count}" for label, count in counts.items())
        return PassResult(model, True)

    def _apply_rules(
        self, model: ir.Model, rules: Sequence[Any], labels: Sequence[str], nodes: Sequence[ir.Node], undo: _Undo
    ) -> dict[str, int]:
        """Apply ``rules`` (named ``labels``) in one sweep over ``model`` (whose nodes are
        ``nodes``): only those whose ops all occur in it, each tried only on nodes of its root op
        (:class:`~opreg.exporter.passes.pipeline.RootGate`)."""
        from onnxscript.rewriter import pattern

        order = {id(node): index for index, node in enumerate(nodes)}
        present = {node.op_type for node in nodes}
        stamping = [
            _Stamping(RootGate(rule), label, order, undo)
            for rule, label in zip(rules, labels, strict=True)
            if pattern_ops(rule) <= present
        ]
        if not stamping:
            return {}
        try:
            pattern.RewriteRuleSet(stamping).apply_to_model(model)  # type: ignore[arg-type]
        except _RuleRaised as e:
            raise _Fault(e.label, f"raised {type(e.error).__name__}: {e.error}") from e
        except _RuleLooped as e:
            raise _Fault(e.label, e.what) from e
        except Exception as e:  # while onnxscript put a replacement in
            raise _Fault(labels[0] if len(labels) == 1 else "", f"raised {type(e).__name__}: {e}") from e
        if undo.snapshot is not None:
            for node in all_nodes(model):
                node.metadata_props.pop(ONNXSCRIPT_RULE_TAG, None)
        return {s._label: s.fired for s in stamping if s.fired}

    def _apply_pass(self, model: ir.Model, before: set[int]) -> dict[str, int]:
        (label,) = self.rewrite.labels()
        try:
            result = self.rewrite.item(model)
        except Exception as e:
            raise _Fault(label, f"raised {type(e).__name__}: {e}") from e
        if result.model is not model:
            raise _Fault(label, "returned a new model: opreg applies passes that change the model in place")
        made = [node for node in all_nodes(model) if id(node) not in before]
        for node in made:  # after the rewrites recorded on what it replaced, if the pass copied them
            recorded = [value for value in node.metadata_props.get(REWRITE_KEY, "").split(JOIN) if value]
            node.metadata_props[REWRITE_KEY] = JOIN.join([*recorded, label] if label not in recorded else recorded)
            node.metadata_props.setdefault(PACK_KEY, self.rewrite.pack)
        return {label: len(made)} if result.modified else {}

    def _report(self, fault: _Fault) -> None:
        pack = self.rewrite.pack
        label = fault.label or ", ".join(self.rewrite.labels())
        message = f"pack {pack!r}: rewrite {label} {fault.what}"
        if self.rewrite.asked:
            raise (OpsetConflictError if fault.conflict else ExportError)(
                f"opreg.export(passes=...): {label} {fault.what}"
            )
        if self.strict:
            raise PluginError(f"{message} (strict mode; without it the rewrite is left out and the export goes on)")
        packfaults.report(
            packfaults.PackFault(pack, packfaults.REWRITE, label, f"{fault.what}; it is left out, the export goes on")
        )


def passes(rewrites: Sequence[Rewrite], target: Target, strict: bool = False) -> Pipeline:
    """The packs' rewrites as one pipeline, in order."""
    return Pipeline("packs' rewrites", [PackRewrite(r, target, strict) for r in rewrites])


def _counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        label, _, count = item.rpartition("=")
        counts[label] = int(count)
    return counts


# -- what makes a rewritten graph invalid ------------------------------------------------------


def graph_problem(model: ir.Model) -> tuple[str, str] | None:
    """The first node (of every graph and function, subgraphs included) that reads a value
    nothing before it defines, or a graph output nothing defines: ``(the node's
    opreg.rewrite label or "", what is wrong)``, or ``None``."""
    for owner in (model.graph, *model.functions.values()):
        problem = _graph_problem(owner, set())
        if problem is not None:
            return problem
    return None


def _graph_problem(graph: ir.Graph | ir.Function, outer: set[int]) -> tuple[str, str] | None:
    defined = set(outer)
    defined.update(id(v) for v in graph.inputs)
    if isinstance(graph, ir.Graph):
        defined.update(id(v) for v in graph.initializers.values())
    for node in graph:
        for value in node.inputs:
            if value is not None and id(value) not in defined:
                what = f"{domain_label(node.domain)}::{node.op_type}"
                return node.metadata_props.get(REWRITE_KEY, ""), (
                    f"left node {node.name!r} ({what}) reading {_describe_value(value)}, which nothing in the "
                    "graph defines before it"
                )
        for sub in subgraphs_of(node):
            problem = _graph_problem(sub, defined)
            if problem is not None:
                return problem
        defined.update(id(out) for out in node.outputs)
    for value in graph.outputs:
        if id(value) not in defined:
            return "", f"left graph output {value.name!r} defined by nothing in the graph"
    return None


def _describe_value(value: ir.Value) -> str:
    text = repr(value.name) if value.name else "an unnamed value"
    producer = value.producer()
    if producer is not None:
        text += f" (made by {domain_label(producer.domain)}::{producer.op_type} node {producer.name!r})"
    return text


def _made_problem(made: Sequence[ir.Node], target: Target) -> tuple[str, str] | None:
    """The first node a rewrite made that the target cannot run (a domain it lacks, an ai.onnx
    op newer than it) or that ONNX refuses at the target's version of its domain."""
    for node in made:
        label = node.metadata_props.get(REWRITE_KEY, "")
        what = f"{domain_label(node.domain)}::{node.op_type}"
        version = target.get(node.domain)
        if version is None:
            return label, (
                f"made {what}, but the target {target} has no {domain_label(node.domain)}: its pack's "
                "opreg_rewrite_rules must return it only for targets that name the domain"
            )
        if node.domain == ONNX_DOMAIN and op_schema(node.op_type, version, ONNX_DOMAIN) is None:
            return label, (
                f"made {what}, which ai.onnx {version} (the target's) does not have: its pack's "
                "opreg_rewrite_rules must return it only for targets with a new enough ai.onnx"
            )
        problem = node_problem(node, version)
        if problem is not None:
            return label, f"made {what} ({node.name}), which ONNX refuses: {problem}"
    return None


def _import_domains(made: set[int], model: ir.Model, target: Target) -> None:
    """Import every domain the rewrites' nodes (``made``, by id) use at the target's version, in
    the graph or function holding them (onnxscript's rewriter imports them at whatever version
    a rule's builder used)."""
    for owner in (model.graph, *model.functions.values()):
        for node in ir.traversal.RecursiveGraphIterator(owner):
            if id(node) in made:
                version = target.get(node.domain)
                if version is not None:
                    owner.opset_imports[node.domain] = version
