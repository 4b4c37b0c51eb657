"""Eager PyTorch's side of a comparison: the exported program's graph run with every value kept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.export.graph_signature import InputKind

from opreg.exporter._capture import TRACING_LOCK


def lifted_inputs(program: torch.export.ExportedProgram, user_leaves: Sequence[Any]) -> list[Any]:
    """The flat arguments of ``program.graph_module``: weights, buffers and constants by their
    specs, the user's leaves in order."""
    users = iter(user_leaves)
    state, constants = program.state_dict, program.constants
    flat = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(users))
        elif spec.kind == InputKind.TOKEN:
            flat.append(torch.empty(0))
        else:
            flat.append(state[spec.target] if spec.target in state else constants[spec.target])
    return flat


class _Keeper(torch.fx.Interpreter):
    """Runs a graph and keeps every node's value as it was made (an in-place op's result is
    copied: a later in-place op would change it under the report)."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=False)

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
            return torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, result)
        return result


def eager_values(program: torch.export.ExportedProgram, user_leaves: Sequence[Any]) -> dict[torch.fx.Node, Any]:
    """Every node's value when ``program``'s graph runs in eager PyTorch on ``user_leaves``."""
    recorder = _Keeper(program.graph_module)
    with TRACING_LOCK, torch.no_grad():  # as verify's eager run: no other thread is capturing
        recorder.run(*lifted_inputs(program, user_leaves), enable_io_processing=False)
    return recorder.env
