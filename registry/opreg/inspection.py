"""What an ONNX file holds, as a JSON-ready dict (``opreg inspect``)."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from opreg.errors import OpregError

PACK_KEY = "opreg.pack"
TORCH_OP_KEY = "opreg.torch_op"


def inspect_file(path: str | Path) -> dict[str, Any]:
    """Read ``path`` (with its external data, if any) and summarise it."""
    import onnx_ir as ir

    path = Path(path)
    if not path.is_file():
        raise OpregError(f"no such file: {path}")
    try:
        model = ir.load(path)
    except Exception as e:
        raise OpregError(f"{path} is not a readable ONNX model: {type(e).__name__}: {e}") from e
    return summarize(model, path)


def _value(value: Any) -> dict[str, Any]:
    shape = None if value.shape is None else [d if isinstance(d, int) else str(d) for d in value.shape]
    return {"name": value.name, "dtype": value.dtype.name if value.dtype is not None else "?", "shape": shape}


def summarize(model: Any, path: Path | None = None) -> dict[str, Any]:
    import onnx_ir as ir

    ops: collections.Counter[tuple[str, str]] = collections.Counter()
    by_pack: collections.Counter[str] = collections.Counter()
    by_torch_op: collections.Counter[tuple[str, str]] = collections.Counter()
    count = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        count += 1
        ops[(node.domain or "ai.onnx", node.op_type)] += 1
        pack = node.metadata_props.get(PACK_KEY)
        if pack is not None:
            by_pack[pack] += 1
            by_torch_op[(pack, node.metadata_props.get(TORCH_OP_KEY, "?"))] += 1
    external = False
    total = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None:
            continue
        total += tensor.nbytes
        external = external or isinstance(tensor, ir.ExternalTensor)
    return {
        "file": str(path) if path is not None else None,
        "file_bytes": path.stat().st_size if path is not None else None,
        "ir_version": model.ir_version,
        "producer": " ".join(p for p in (model.producer_name, model.producer_version) if p),
        "opset_imports": {(d or "ai.onnx"): v for d, v in sorted(model.opset_imports.items())},
        "inputs": [_value(v) for v in model.graph.inputs],
        "outputs": [_value(v) for v in model.graph.outputs],
        "node_count": count,
        "ops": [
            {"domain": d, "op": o, "count": c} for (d, o), c in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "functions": [f"{f.domain}::{f.name}" for f in model.functions.values()],
        "initializers": {"count": len(model.graph.initializers), "bytes": total, "external": external},
        "metadata": dict(model.metadata_props),
        "provenance": {
            "packs": dict(sorted(by_pack.items())),
            "torch_ops": [
                {"pack": p, "torch_op": op, "nodes": c}
                for (p, op), c in sorted(by_torch_op.items(), key=lambda kv: kv[0])
            ],
        },
    }
