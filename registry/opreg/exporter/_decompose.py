"""Decomposition: torch's default table, minus every op the registry covers (an op whose impls'
predicates reject one of its nodes stays in the table).

So a pack that registers ``aten::gelu.default`` sees gelu nodes, not the erf
and multiplications torch would break them into. Decomposition retraces the
whole graph, the most expensive step of an export, and its cost grows faster
than the graph; planning (:func:`opreg.exporter._plan.prepare`) calls it only
when the captured graph cannot be translated as it is.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Collection, Sequence

import torch

from opreg.errors import ExportError
from opreg.exporter._capture import TRACING_LOCK, first_lines
from opreg.exporter._guards import captured_size_oblivious, size_oblivious
from opreg.registry.opname import OpName
from opreg.registry.registry import Registry
from opreg.registry.targets import Target

logger = logging.getLogger(__name__)


def decompose(
    program: torch.export.ExportedProgram,
    registry: Registry,
    target: Target,
    reasons: Sequence[str] = (),
    *,
    rejected: Collection[OpName] = (),
) -> torch.export.ExportedProgram:
    """``program`` decomposed with torch's default table minus the ops the registry has
    impls of at ``target``, except the ``rejected`` ones (whose impls refuse a node of the
    graph: torch decomposes those where it can); ``reasons`` (why it is needed) are logged."""
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        name = OpName.of(op)
        if registry.candidates(name, target) and name not in rejected:
            del table[op]
    logger.info("running torch's decomposition for: %s", ", ".join(reasons) or "(no reason given)")
    try:
        # torch retraces here: reason about sizes as the capture did
        with TRACING_LOCK, size_oblivious(captured_size_oblivious(program)), warnings.catch_warnings():
            # torch deep-copies its own pytree specs here and warns about its own deprecated API
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            return program.run_decompositions(table)
    except Exception as e:
        raise ExportError(f"torch could not decompose the captured graph: {first_lines(e)}") from e
