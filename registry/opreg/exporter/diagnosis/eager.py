"""Eager PyTorch's side of a comparison: the exported program's graph run with every value kept."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
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


def run_eager(
    module: torch.nn.Module, state: dict[str, torch.Tensor], args: tuple, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, torch.Tensor]]:
    """``module`` called in eager PyTorch from ``state`` (the buffers the model is fed): what it returns,
    and the new value of each of those buffers (the module's own buffers are left as they were)."""
    # Behind the capture lock: while another thread captures, torch marks the whole process as
    # exporting, and the functions it keeps from dynamo (a custom op's Python kernel,
    # torch.manual_seed) then edit its global trace metadata, which is not thread-safe.
    with TRACING_LOCK, torch.no_grad(), buffers_kept(module):  # the call may update buffers (batch-norm statistics)
        for key, value in state.items():  # eager starts from the state the model is fed
            module.get_buffer(key).copy_(value)
        expected = module(*args, **kwargs)
        updated = {key: module.get_buffer(key).clone() for key in state}
    return expected, updated


@contextlib.contextmanager
def buffers_kept(module: torch.nn.Module) -> Iterator[None]:
    """Every buffer of ``module`` as it was before, after the block (the user's module, even
    when its ``forward`` updates buffers in place or assigns new ones)."""
    kept = [(name, buffer, buffer.clone()) for name, buffer in module.named_buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for name, buffer, value in kept:
                owner, _, leaf = name.rpartition(".")
                buffer.copy_(value)
                setattr(module.get_submodule(owner), leaf, buffer)
