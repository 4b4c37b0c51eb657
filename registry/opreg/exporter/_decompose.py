"""Decomposition: torch's default table, minus every op the registry covers.

So a pack that registers ``aten::gelu.default`` sees gelu nodes, not the erf
and multiplications torch would break them into. Decomposition retraces the
whole graph, the most expensive step of an export, and its cost grows faster
than the graph; it is skipped when the captured graph can be translated as it
is (:func:`covered_as_captured`).
"""

from __future__ import annotations

import logging
import warnings

import torch

from opreg.errors import ExportError
from opreg.exporter import _nodes
from opreg.exporter._capture import TRACING_LOCK, first_lines
from opreg.opname import OpName
from opreg.registry import Registry
from opreg.targets import Target

logger = logging.getLogger(__name__)

_DECOMPOSED_WITH = "_opreg_decomposed_with"
"""Set on a program :func:`decompose` made: the table it used, so exporting it again
for a target that keeps the same ops does not decompose it again."""


def decompose(
    program: torch.export.ExportedProgram, registry: Registry, target: Target
) -> torch.export.ExportedProgram:
    """``program`` decomposed for ``target`` (or as it is, when nothing needs it)."""
    reasons = decomposition_reasons(program, registry, target)
    if not reasons:
        return program
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if registry.candidates(OpName.of(op), target):
            del table[op]
    kept = frozenset(table)
    if getattr(program, _DECOMPOSED_WITH, None) == kept:  # already decomposed with this very table
        return program
    logger.info("running torch's decomposition for: %s", ", ".join(reasons))
    try:
        with TRACING_LOCK, warnings.catch_warnings():
            # torch deep-copies its own pytree specs here and warns about its own deprecated API
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            decomposed = program.run_decompositions(table)
    except Exception as e:
        raise ExportError(f"torch could not decompose the captured graph: {first_lines(e)}") from e
    setattr(decomposed, _DECOMPOSED_WITH, kept)
    return decomposed


def covered_as_captured(program: torch.export.ExportedProgram, registry: Registry, target: Target) -> bool:
    """Whether the captured graph (and every subgraph of its higher-order ops) mutates no
    input or buffer and every node in it translates at ``target`` as it is."""
    return not decomposition_reasons(program, registry, target)


def decomposition_reasons(program: torch.export.ExportedProgram, registry: Registry, target: Target) -> list[str]:
    """Why the captured graph needs torch's decomposition at ``target`` (``[]``: it does not):
    each op without an impl as captured, each call opreg cannot translate, a higher-order op
    whose meaning the decomposition spells out, a mutated input or buffer. Logged when it runs."""
    signature = program.graph_signature
    reasons: dict[str, None] = {}
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        reasons["a mutated input or buffer"] = None
    for node in _nodes.walk(program.graph):
        kind = _nodes.classify(node)
        if kind is _nodes.Kind.UNSUPPORTED:
            reasons[f"{node.target} (untranslatable as captured)"] = None
        elif kind is _nodes.Kind.HOP:
            check = _nodes.HOPS[node.target].needs_decomposition
            if check is not None and check(node):
                reasons[_nodes.HOPS[node.target].name] = None
        elif (
            kind in (_nodes.Kind.OP, _nodes.Kind.INPLACE)
            and registry.resolve(_nodes.torch_op(node), target, node) is None
        ):
            reasons[str(_nodes.torch_op(node))] = None
    return list(reasons)
