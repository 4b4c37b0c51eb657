"""ONNX's type and shape inference for one ``onnx_ir`` node at a time.

opreg's recorder gives every node it records the types ONNX infers for it, so
an impl may branch on the dtype or shape of a value it made itself; the
translation table handed to torch.onnx does the same for torch's recorder.
"""

from __future__ import annotations

import functools
import logging

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


def _type_proto(value: ir.Value) -> onnx.TypeProto | None:
    if value.dtype is None:
        return None
    shape = None
    if value.shape is not None:
        shape = [d if isinstance(d, int) else (d.value if isinstance(d.value, str) else None) for d in value.shape]
    return onnx.helper.make_tensor_type_proto(int(value.dtype), shape)


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


def infer_node(node: ir.Node, version: int, small_constant: int = 64) -> None:
    """Set the dtype and shape of ``node``'s outputs from ONNX's inference for its op at
    ``version``; constant inputs of up to ``small_constant`` elements are handed to it as
    data. Nothing is set when an input's type is unknown or onnx has no inference for the op."""
    schema = op_schema(node.op_type, version, node.domain)
    if schema is None or not schema.has_type_and_shape_inference_function:
        return
    proto = _serialize(node)
    types: dict[str, onnx.TypeProto] = {}
    data: dict[str, onnx.TensorProto] = {}
    for index, value in enumerate(node.inputs):  # named by position: values may have no name yet
        name = f"input_{index}"
        proto.input[index] = name if value is not None else ""
        if value is None:
            continue
        known = _type_proto(value)
        if known is None:
            return  # an input of unknown type: nothing to infer from
        types[name] = known
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
        return
    for index, output in enumerate(node.outputs):
        result = inferred.get(f"output_{index}")
        if result is None or not result.HasField("tensor_type"):
            continue
        tensor_type = result.tensor_type
        if tensor_type.elem_type:
            output.dtype = ir.DataType(tensor_type.elem_type)
        if tensor_type.HasField("shape"):
            output.shape = ir.Shape(
                [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]
            )
