"""A batch of one captured again at two (:func:`opreg.exporter._dynamic.capture` calls it).

From an example of size 1 on a dim marked dynamic, a guard in torch's own code (a convolution's
choice of memory format, a view's strides) may narrow the dim to the example's size, after which
torch gives an op's output the example's size where its input has the dim (a diffusers UNet from
one image with its image size dynamic: the division after an attention's residual has batch 1).
The model's code took no branch on the size, so the capture's other path is torch's alone: the
example is grown along those dims to 2 (each input repeated along the dim, its rows equal) and
captured again, size-obliviously as before (torch's checks of strides then leave no guard on the
sizes), where torch keeps the dim general. Where torch's checks narrowed the dim with no op
holding it at 1 (a view's strides before a convolution: diffusers' VAEs), the first capture could
stand, yet its graph may still hold the example's batch where no pointwise op shows it (a VQModel's
output had batch 1), so it is captured again too, and the first stands only if that fails. Each
dim captured so is a :class:`GrownDim`, logged and left on the program (``grown_dims``) and in the
model's metadata.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from opreg.exporter import _guards

logger = logging.getLogger(__name__)

SIZE = 2
"""The size a dim of example size 1 is grown to."""

GROWN_DIMS_KEY = "opreg.grown_dims"
"""The model's metadata: the dims captured from a grown example, a JSON list of
``{input, dim, size, captured_at, guard, source}`` (:class:`GrownDim`)."""


@dataclasses.dataclass(frozen=True)
class GrownDim:
    """A dim marked dynamic that was captured from an example grown along it, and why.

    Fields:
        input: the input as ``forward`` takes it (``sample``, ``pair[0]``).
        dim: the dim's index.
        size: its size in the user's example (1).
        captured_at: its size in the example captured (:data:`SIZE`), the input repeated along it.
        guard: torch's guard that fixed it at ``size`` in the first capture, and where the graph then
            had it at that size.
        source: where the guard was added (the model's line that called torch's code).
    """

    input: str
    dim: int
    size: int
    captured_at: int
    guard: str
    source: str = ""

    def __str__(self) -> str:
        return _guards.located(
            f"{self.input}.shape[{self.dim}]: captured from an example with it at {self.captured_at}, not "
            f"{self.size}: {self.guard}",
            self.source,
        )


def grown(
    args: tuple, kwargs: Mapping[str, Any] | None, dims: Sequence[tuple[torch.Tensor, int]]
) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` with each ``(tensor, dim)`` of ``dims`` (a leaf of them, of size 1 there)
    repeated along the dim to :data:`SIZE`; the other leaves as they are."""
    by_leaf: dict[int, list[int]] = {}
    for tensor, dim in dims:
        by_leaf.setdefault(id(tensor), []).append(dim)

    def grow(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor) or id(leaf) not in by_leaf:
            return leaf
        for dim in sorted(set(by_leaf[id(leaf)])):
            leaf = torch.cat([leaf] * SIZE, dim=dim)
        return leaf

    new_args, new_kwargs = torch.utils._pytree.tree_map(grow, (tuple(args), dict(kwargs or {})))
    return tuple(new_args), new_kwargs


def record(program: Any, dims: Sequence[GrownDim]) -> None:
    """Leave ``dims`` on the ``OnnxProgram`` (``grown_dims``) and in its model's metadata."""
    import json

    program.grown_dims = tuple(dims)
    if dims:
        program.model.metadata_props[GROWN_DIMS_KEY] = json.dumps([dataclasses.asdict(d) for d in dims])


def holds_grown(expr: Any, symbol: Any, env: Any) -> bool:
    """Whether the guard ``expr`` holds with ``symbol`` at :data:`SIZE` and every other size at the
    example's: a guard of the model's code that does (diffusers' ``numel() * scale > 2**31``) did not
    narrow the dim to its example's size."""
    import sympy

    hints = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", None) or {}  # torch 2.13's name
    values = {s: sympy.Integer(v) for s, v in hints.items()}
    try:
        return bool(expr.xreplace({**values, symbol: sympy.Integer(SIZE)}) is sympy.true)
    except (TypeError, ValueError):
        return False
