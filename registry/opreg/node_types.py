"""ONNX's type and shape inference for one ``onnx_ir`` node at a time.

opreg's recorder gives every node it records the types ONNX infers for it, so
an impl may branch on the dtype or shape of a value it made itself; the
translation table handed to torch.onnx does the same for torch's recorder.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import onnx
import onnx_ir as ir

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4096)
def op_schema(op_type: str, version: int, domain: str) -> onnx.defs.OpSchema | None:
    """The ``onnx.defs`` schema of ``domain::op_type`` at ``version``, or ``None`` if onnx has none."""
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


def _dims(shape: ir.Shape | None) -> tuple[int | str | None, ...] | None:
    if shape is None:
        return None
    return tuple(d if isinstance(d, int) else (d.value if isinstance(d.value, str) else None) for d in shape)


@functools.lru_cache(maxsize=4096)
def _type_proto(dtype: ir.DataType, dims: tuple[int | str | None, ...] | None) -> onnx.TypeProto:
    """The TypeProto of a tensor value (one per distinct type: building them shows in big exports)."""
    return onnx.helper.make_tensor_type_proto(int(dtype), None if dims is None else list(dims))


def _serialize(node: ir.Node) -> onnx.NodeProto:
    """``node`` as a NodeProto, even when it or its values have no name yet (torch.onnx's
    recorder names them later); the names are restored."""
    values = [v for v in (*node.inputs, *node.outputs) if v is not None]
    names = [v.name for v in values]
    node_name = node.name
    try:
        if node_name is None:
            node.name = ""
        for index, value in enumerate(values):
            if value.name is None:
                value.name = f"value_{index}"
        return ir.serde.serialize_node(node)
    finally:
        node.name = node_name
        for value, name in zip(values, names, strict=True):
            value.name = name


Inferred = list[tuple[ir.DataType | None, tuple[int | str | None, ...] | None]]
"""``(dtype, dims)`` per output of a node, ``None`` where ONNX inferred nothing."""

_INFERRED: dict[tuple, Inferred] = {}
"""Per-node inference results by what determines them (op, version, input types and small
constant inputs, attributes): layers repeat, and each repeat would pay ONNX's inference again."""
_INFERRED_LIMIT = 100_000


def _attribute_key(attr: ir.Attr) -> Any:
    kind = attr.type
    if kind in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS, ir.AttributeType.TENSORS) or attr.is_ref():
        raise TypeError("not cached")
    value = attr.value
    if kind == ir.AttributeType.TENSOR:
        return (value.dtype, tuple(value.shape), value.tobytes())
    return tuple(value) if isinstance(value, list) else value


def _inference_key(node: ir.Node, version: int, small_constant: int) -> tuple | None:
    inputs = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        const = value.const_value
        data = const.tobytes() if const is not None and const.size <= small_constant else None
        inputs.append((value.dtype, _dims(value.shape), data))
    try:
        attributes = tuple((name, attr.type, _attribute_key(attr)) for name, attr in node.attributes.items())
        key = (node.domain, node.op_type, version, len(node.outputs), tuple(inputs), attributes)
        hash(key)
    except TypeError:
        return None
    return key


def infer_node(node: ir.Node, version: int, small_constant: int = 64) -> None:
    """Set the dtype and shape of ``node``'s outputs from ONNX's inference for its op at
    ``version``; constant inputs of up to ``small_constant`` elements are handed to it as
    data. Nothing is set when an input's type is unknown or onnx has no inference for the op.
    Results are remembered by what determines them, and each output gets a shape of its own."""
    key = _inference_key(node, version, small_constant)
    known = _INFERRED.get(key) if key is not None else None
    if known is None:
        known = _run_inference(node, version, small_constant)
        if known is None:
            return
        if key is not None and len(_INFERRED) < _INFERRED_LIMIT:
            _INFERRED[key] = known
    for output, (dtype, dims) in zip(node.outputs, known, strict=True):
        if dtype is not None:
            output.dtype = dtype
        if dims is not None:
            output.shape = ir.Shape(dims)


def _run_inference(node: ir.Node, version: int, small_constant: int) -> Inferred | None:
    """ONNX's type and shape inference for ``node``: ``(dtype, dims)`` per output, or ``None``."""
    schema = op_schema(node.op_type, version, node.domain)
    if schema is None or not schema.has_type_and_shape_inference_function:
        return None
    types: dict[str, onnx.TypeProto] = {}
    data: dict[str, onnx.TensorProto] = {}
    for value in node.inputs:
        if value is not None and value.dtype is None:
            return None  # an input of unknown type: nothing to infer from
    proto = _serialize(node)
    for index, value in enumerate(node.inputs):  # named by position: values may have no name yet
        name = f"input_{index}"
        proto.input[index] = name if value is not None else ""
        if value is None:
            continue
        assert value.dtype is not None
        types[name] = _type_proto(value.dtype, _dims(value.shape))
        const = value.const_value
        if const is not None and const.size <= small_constant:
            data[name] = ir.serde.serialize_tensor(const)
    for index in range(len(proto.output)):
        proto.output[index] = f"output_{index}"
    try:
        inferred = onnx.shape_inference.infer_node_outputs(
            schema, proto, types, data, opset_imports=[onnx.helper.make_opsetid(node.domain, version)]
        )
    except Exception as e:  # inference is a help for autocast, not a check: the checker runs at the end
        logger.debug("shape inference failed for %s: %s", node.name, e)
        return None
    found: Inferred = []
    for index in range(len(node.outputs)):
        result = inferred.get(f"output_{index}")
        if result is None or not result.HasField("tensor_type"):
            found.append((None, None))
            continue
        tensor_type = result.tensor_type
        dims = None
        if tensor_type.HasField("shape"):
            dims = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim
            )
        found.append((ir.DataType(tensor_type.elem_type) if tensor_type.elem_type else None, dims))
    return found
