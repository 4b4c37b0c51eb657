"""What an ONNX file holds, and whether it is usable, as a JSON-ready dict (``opreg inspect``)."""

from __future__ import annotations

import collections
import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opreg.errors import OpregError
from opreg.packs import packfaults
from opreg.packs.patching import METADATA_KEY as PATCHES_KEY
from opreg.packs.patching import read_metadata
from opreg.registry.targets import domain_label
from opreg.registry.versions import floors_of

PACK_KEY = "opreg.pack"
TORCH_OP_KEY = "opreg.torch_op"
CONSTANT_INPUTS_KEY = "opreg.constant_inputs"
"""The arguments ``torch.export`` made constants (bools, ints, strings...): a JSON object, name -> value."""
FIXED_DIMS_KEY = "opreg.fixed_dims"
"""The dims ``dynamic_shapes`` asked to be dynamic that the export fixed: a JSON list of
``{input, dim, size, guard, source}`` (:class:`opreg.FixedDim`; written by ``opreg.exporter._dynamic``)."""
SHAPE_GUARDS_KEY = "opreg.shape_guards"
"""The guards torch.export kept on the dims marked dynamic that the model does not check: a JSON
list of ``{guard, dims, source}`` (:class:`opreg.exporter.ShapeGuard`)."""
GROWN_DIMS_KEY = "opreg.grown_dims"
"""The dims of example size 1 that only torch's code fixed, captured again from the example grown
along them: a JSON list of ``{input, dim, size, captured_at, guard, source}``
(:class:`opreg.exporter.GrownDim`)."""


class InspectionError(OpregError):
    """A file could not be read as an ONNX model at all."""


def inspect_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``path`` (with its external data, if any), summarise it, and list what makes it
    unusable under ``"problems"`` (empty when ``onnx.checker`` accepts it with its data)."""
    import onnx
    import onnx_ir as ir

    path = Path(path)
    if path.is_dir():
        raise InspectionError(f"{path} is a directory; give the .onnx file in it")
    if not path.exists():
        raise InspectionError(f"no such file: {path}")
    kind = _special_kind(path)
    if kind:  # never opened: a FIFO would block, /dev/zero never ends
        raise InspectionError(f"{path} is {kind}, not a regular file: give an .onnx file")
    size = path.stat().st_size
    if size == 0:
        raise InspectionError(f"{path} is empty (0 bytes): not an ONNX model")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise InspectionError(
            f"{path} is not a readable ONNX model (truncated or not ONNX): {type(e).__name__}: {e}"
        ) from e
    problems = _type_problems(proto)  # (these make the proto readable for the summary)
    problems += _data_problems(proto, path.parent)
    problems += _opset_problems(proto)
    if not problems:
        problems += _checker_problems(path)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:
        cause = e.__cause__ or e
        raise InspectionError(f"{path} cannot be read as an ONNX model: {type(cause).__name__}: {cause}") from e
    report = summarize(model, path)
    report["problems"] = problems
    report["usable"] = not problems
    return report


def _special_kind(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file (``None`` when it is one)."""
    mode = path.stat().st_mode
    kinds = {
        stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device", stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a directory",
    }  # fmt: skip
    return next((kind for test, kind in kinds.items() if test(mode)), None)


def _type_problems(proto: Any) -> list[str]:
    """Tensors and values of a data type no ONNX version defines; each is set to UNDEFINED in
    ``proto`` so the rest of the model can still be summarised."""
    import onnx

    from opreg.exporter._save import iter_tensors

    known = set(onnx.TensorProto.DataType.values())
    problems = []
    for tensor in iter_tensors(proto.graph):
        if tensor.data_type not in known:
            problems.append(f"tensor {tensor.name!r} has data type {tensor.data_type}, which no ONNX version defines")
            tensor.data_type = onnx.TensorProto.UNDEFINED
    for info in _value_infos(proto.graph):
        tensor_type = info.type.tensor_type if info.type.HasField("tensor_type") else None
        if tensor_type is not None and tensor_type.elem_type not in known:
            problems.append(f"value {info.name!r} has data type {tensor_type.elem_type}, which no ONNX version defines")
            tensor_type.elem_type = onnx.TensorProto.UNDEFINED
    return problems


def _value_infos(graph: Any) -> Iterator[Any]:
    """Every value info of ``graph``: inputs, outputs and value_info, subgraphs included."""
    yield from graph.input
    yield from graph.output
    yield from graph.value_info
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _value_infos(attr.g)
            for sub in attr.graphs:
                yield from _value_infos(sub)


def _data_problems(proto: Any, folder: Path) -> list[str]:
    """Every external data file the model names must lie in its folder, be a regular file and
    hold the bytes it points at. An entry with a bad offset or length is dropped from ``proto``
    (after its problem is noted) so the rest can still be summarised."""
    import onnx

    from opreg.exporter._save import iter_tensors

    problems = []
    needed: dict[str, int] = collections.defaultdict(int)
    for tensor in iter_tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        numbers = {}
        for key in ("offset", "length"):
            text = info.get(key, "0") or "0"
            if not text.isdigit():
                problems.append(
                    f"tensor {tensor.name!r} has external data {key} {text!r}: it must be a whole number >= 0"
                )
                _drop_entry(tensor, key)
            numbers[key] = int(text) if text.isdigit() else 0
        outside = _outside(location, folder)
        if outside:
            problems.append(f"external data location {location!r} of tensor {tensor.name!r} {outside}")
            continue
        needed[location] = max(needed[location], numbers["offset"] + numbers["length"])
    for location, end in sorted(needed.items()):
        data = folder / location
        kind = _special_kind(data) if data.exists() else None
        if not data.exists():
            problems.append(f"external data file {location} is missing (expected beside the model in {folder})")
        elif kind:
            problems.append(f"external data file {location} is {kind}, not a regular file")
        elif data.stat().st_size < end:
            problems.append(
                f"external data file {location} is truncated: {data.stat().st_size:,} bytes, the weights need {end:,}"
            )
    return problems


def _drop_entry(tensor: Any, key: str) -> None:
    kept = [(e.key, e.value) for e in tensor.external_data if e.key != key]
    del tensor.external_data[:]
    for k, v in kept:
        tensor.external_data.add(key=k, value=v)


def _outside(location: str, folder: Path) -> str | None:
    """Why an external data ``location`` is not a file in ``folder`` (``None`` when it is):
    runtimes refuse absolute paths, ``..`` and links that leave the model's folder."""
    if not location:
        return "is empty: it names no file"
    if "\0" in location:
        return "holds a NUL character: no file can have that name"
    relative = Path(location)
    if relative.is_absolute():
        return "is an absolute path: runtimes read external data only from the model's folder"
    if ".." in relative.parts:
        return "goes up with '..': runtimes read external data only from the model's folder"
    try:
        real = (folder / relative).resolve()
        inside = real.is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return "is a symbolic link that cannot be followed"
    if not inside:
        return f"is a link to {real}, outside the model's folder: runtimes read external data only from the folder"
    return None


def _opset_problems(proto: Any) -> list[str]:
    import onnx
    import onnx.defs

    problems = []
    if not proto.opset_import:
        problems.append("the model imports no opset (truncated or not written by an ONNX exporter)")
    newest = onnx.defs.onnx_opset_version()
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > newest:
            problems.append(
                f"it uses ai.onnx opset {opset.version}, newer than the installed onnx {onnx.__version__} "
                f"knows ({newest}): upgrade onnx to read it"
            )
    if not proto.HasField("graph"):
        problems.append("the model has no graph (truncated or not an ONNX model)")
    return problems


def _checker_problems(path: Path) -> list[str]:
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [f"onnx.checker rejects it: {first}"]
    return []


def _value(value: Any) -> dict[str, Any]:
    shape = None if value.shape is None else [d if isinstance(d, int) else str(d) for d in value.shape]
    return {"name": value.name, "dtype": value.dtype.name if value.dtype is not None else "?", "shape": shape}


def _subgraphs(model: Any) -> list[dict[str, Any]]:
    """Each subgraph (If branch, Loop or Scan body): its owner, node count and where it came from."""
    import onnx_ir as ir

    found = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                graphs = [attr.as_graph()]
            elif attr.type == ir.AttributeType.GRAPHS:
                graphs = list(attr.as_graphs())
            else:
                continue
            for graph in graphs:
                inner = list(ir.traversal.RecursiveGraphIterator(graph))
                found.append({
                    "owner": node.name or "",
                    "op": node.op_type,
                    "attribute": attr.name,
                    "nodes": len(inner),
                    "torch_op": node.metadata_props.get(TORCH_OP_KEY, ""),
                    "module": node.metadata_props.get("opreg.module", ""),
                    "source": node.metadata_props.get("opreg.source", ""),
                    "packs": dict(collections.Counter(n.metadata_props.get(PACK_KEY, "?") for n in inner)),
                })  # fmt: skip
    return found


def _constant_inputs(metadata: Any) -> dict[str, Any]:
    """The arguments the export made constants of the model (``opreg.constant_inputs``), by name."""
    import json

    text = metadata.get(CONSTANT_INPUTS_KEY)
    if not text:
        return {}
    try:
        found = json.loads(text)
    except ValueError:
        return {"?": text}
    return found if isinstance(found, dict) else {"?": found}


def _json_list(text: str | None) -> list[Any]:
    """A JSON list of the model's metadata (``[]`` when absent or not a list)."""
    import json

    try:
        found = json.loads(text) if text else []
    except ValueError:
        return [text]
    return found if isinstance(found, list) else [found]


def summarize(model: Any, path: Path | None = None) -> dict[str, Any]:
    import onnx_ir as ir

    ops: collections.Counter[tuple[str, str]] = collections.Counter()
    by_pack: collections.Counter[str] = collections.Counter()
    by_torch_op: collections.Counter[tuple[str, str]] = collections.Counter()
    count = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        count += 1
        ops[(domain_label(node.domain), node.op_type)] += 1
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
        with contextlib.suppress(TypeError, ValueError):  # an unknown data type (a problem already listed)
            total += tensor.nbytes
        external = external or isinstance(tensor, ir.ExternalTensor)
    return {
        "file": str(path) if path is not None else None,
        "file_bytes": path.stat().st_size if path is not None else None,
        "ir_version": model.ir_version,
        "producer": " ".join(p for p in (model.producer_name, model.producer_version) if p),
        "opset_imports": {domain_label(d): v for d, v in sorted(model.opset_imports.items())},
        "opset_floors": floors_of(model.metadata_props),
        "inputs": [_value(v) for v in model.graph.inputs],
        "constant_inputs": _constant_inputs(model.metadata_props),
        "fixed_dims": _json_list(model.metadata_props.get(FIXED_DIMS_KEY)),
        "shape_guards": _json_list(model.metadata_props.get(SHAPE_GUARDS_KEY)),
        "grown_dims": _json_list(model.metadata_props.get(GROWN_DIMS_KEY)),
        "outputs": [_value(v) for v in model.graph.outputs],
        "node_count": count,
        "ops": [
            {"domain": d, "op": o, "count": c} for (d, o), c in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "functions": [f"{f.domain}::{f.name}" for f in model.functions.values()],
        "subgraphs": _subgraphs(model),
        "initializers": {"count": len(model.graph.initializers), "bytes": total, "external": external},
        "metadata": dict(model.metadata_props),
        "capture_patches": read_metadata(model.metadata_props.get(PATCHES_KEY)),
        "pack_faults": packfaults.read_metadata(model.metadata_props.get(packfaults.METADATA_KEY)),
        "provenance": {
            "packs": dict(sorted(by_pack.items())),
            "torch_ops": [
                {"pack": p, "torch_op": op, "nodes": c}
                for (p, op), c in sorted(by_torch_op.items(), key=lambda kv: kv[0])
            ],
        },
    }
