"""A model at an ai.onnx older than its impls' opset (``target=17``, torch.onnx's ``opset_version=17``):
each node emitted against a newer opset (``op18.Gemm``) is read at the model's, and means the same
there when its op's schema is the same (:func:`opreg.registry.versions.since`). The registry chooses
impls that visibly reach the target (:mod:`opreg.registry.reach`); every emitted node is judged here,
helpers' and functions' nodes included, and the ops that need a newer opset are named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opreg.exporter._recorder import Use
from opreg.registry.versions import since


def reaches(use: Use, version: int) -> bool:
    """Whether ``use``, emitted at a newer ai.onnx, means the same read at ``version``. A kept
    function's use is judged by its nodes' (the recorder records each)."""
    if use.what.startswith("function "):
        return True
    op = use.what.removeprefix("ai.onnx::")
    found = since(op, use.version) if use.version is not None else None
    return found is not None and found == since(op, version)


def refusal(below: Mapping[str, Sequence[Use]], version: int) -> str:
    """What an export at ai.onnx ``version`` says of the ops it cannot hold (``below``: each op's uses):
    each op with the version its schema needs and who emitted it."""
    parts, newest = [], version + 1
    for what, found in sorted(below.items()):
        op, emitted = what.removeprefix("ai.onnx::"), max(u.version or 0 for u in found)
        needs = since(op, emitted) or emitted
        newest = max(newest, needs)
        emitters = ", ".join(sorted({u.emitter for u in found}))
        parts.append(f"{op} needs ai.onnx {needs} (its schema at {version} differs; emitted by {emitters})")
    return (
        f"target ai.onnx {version} cannot hold the model: {'; '.join(parts)}. Export at target={newest} or newer, "
        f"or register impls of those ops written against ai.onnx opset {version}"
    )
