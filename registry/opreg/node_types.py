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


def shape_dims(shape: ir.Shape | None) -> tuple[int | str | None, ...] | None:
    """``shape`` as a hashable tuple: sizes, names of symbolic dims, ``None`` for unnamed ones."""
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

_INFERRED: dict[tuple, tuple[bool, Inferred | None]] = {}
"""Per-node results by what determines them (op, version, input types and small constant
inputs, attributes): whether ONNX confirmed the node, and what it inferred. Layers repeat,
and each repeat would pay ONNX's checks and inference again: they run once per distinct node."""
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
        inputs.append((value.dtype, shape_dims(value.shape), data))
    try:
        attributes = tuple((name, attr.type, _attribute_key(attr)) for name, attr in node.attributes.items())
        key = (node.domain, node.op_type, version, len(node.outputs), tuple(inputs), attributes)
        hash(key)
    except TypeError:
        return None
    return key


def infer_node(node: ir.Node, version: int, small_constant: int = 64) -> bool:
    """Set the dtype and shape of ``node``'s outputs from ONNX's inference for its op at
    ``version``; constant inputs of up to ``small_constant`` elements are handed to it as
    data. Nothing is set when an input's type is unknown or onnx has no inference for the op.

    Returns whether ONNX confirmed the node: its schema accepts it
    (``onnx.checker.check_node``: attributes, input and output counts) and its inference ran
    on typed inputs without finding a type error, so the whole-model checker has nothing to
    add about it. Results are remembered by what determines them (one check and inference
    per distinct node), and each output gets a shape of its own."""
    confirmed, inferred = _known(node, version, small_constant)
    for output, (dtype, dims) in zip(node.outputs, inferred or (), strict=False):
        if dtype is not None:
            output.dtype = dtype
        if dims is not None:
            output.shape = ir.Shape(dims)
    return confirmed


def confirms(node: ir.Node, version: int, small_constant: int = 64) -> bool:
    """Whether ONNX confirms ``node`` as it stands now, as :func:`infer_node` would (its schema
    accepts it and its inference ran on typed inputs), and the types its outputs carry agree with
    what that inference computes: the same dtype, the same rank, the same size wherever both
    know it. Nothing is changed; remembered results are used (see :func:`infer_node`)."""
    confirmed, inferred = _known(node, version, small_constant)
    if not confirmed:
        return False
    for output, (dtype, dims) in zip(node.outputs, inferred or (), strict=False):
        if dtype is not None and output.dtype is not None and output.dtype != dtype:
            return False
        shape = output.shape
        if dims is None or shape is None:
            continue
        if len(dims) != len(shape):
            return False
        for inferred_dim, dim in zip(dims, shape, strict=True):
            if isinstance(inferred_dim, int) and isinstance(dim, int) and inferred_dim != dim:
                return False
    return True


def _known(node: ir.Node, version: int, small_constant: int) -> tuple[bool, Inferred | None]:
    """ONNX's confirmation and inference of ``node``, remembered by what determines them."""
    key = _inference_key(node, version, small_constant)
    known = _INFERRED.get(key) if key is not None else None
    if known is None:
        known = _run_inference(node, version, small_constant)
        if key is not None and len(_INFERRED) < _INFERRED_LIMIT:
            _INFERRED[key] = known
    return known


def node_problem(node: ir.Node, version: int) -> str | None:
    """What ONNX finds wrong with ``node`` at ``version`` of its domain (unknown attributes,
    missing inputs, inconsistent input types, outputs typed otherwise than inference says),
    or ``None``; also ``None`` when onnx has no schema for the op or an input's type is
    unknown (there is nothing to check it against)."""
    schema = op_schema(node.op_type, version, node.domain)
    if schema is None or any(v is not None and v.dtype is None for v in node.inputs):
        return None
    problem, inferred = _check_and_infer(node, version, 0, schema)
    if problem is not None:
        return problem
    for index, (output, (dtype, _)) in enumerate(zip(node.outputs, inferred or (), strict=False)):
        if dtype is not None and output.dtype is not None and output.dtype != dtype:
            return f"output {index} is typed {output.dtype.name}, but the op computes {dtype.name}"
    return None


def _run_inference(node: ir.Node, version: int, small_constant: int) -> tuple[bool, Inferred | None]:
    """Whether ONNX confirms ``node``, and its inference: ``(dtype, dims)`` per output, or ``None``."""
    schema = op_schema(node.op_type, version, node.domain)
    if schema is None or any(value is not None and value.dtype is None for value in node.inputs):
        return False, None  # no schema, or an input of unknown type: nothing to infer from
    problem, inferred = _check_and_infer(node, version, small_constant, schema)
    if problem is not None:  # inference is a help for autocast, not a check: the checker reports it
        logger.debug("ONNX's check of %s failed: %s", node.name, problem)
    return problem is None and inferred is not None, inferred


def _check_and_infer(
    node: ir.Node, version: int, small_constant: int, schema: onnx.defs.OpSchema
) -> tuple[str | None, Inferred | None]:
    """``onnx.checker.check_node`` and ONNX's inference for ``node`` (inputs typed): what
    either found wrong (or ``None``), and what inference found (``None`` where it has no
    inference function or failed)."""
    types: dict[str, onnx.TypeProto] = {}
    data: dict[str, onnx.TensorProto] = {}
    proto = _serialize(node)
    for index, value in enumerate(node.inputs):  # named by position: values may have no name yet
        name = f"input_{index}"
        proto.input[index] = name if value is not None else ""
        if value is None:
            continue
        assert value.dtype is not None
        types[name] = _type_proto(value.dtype, shape_dims(value.shape))
        const = value.const_value
        if const is not None and const.size <= small_constant:
            data[name] = ir.serde.serialize_tensor(const)
    for index in range(len(proto.output)):
        proto.output[index] = f"output_{index}"
    try:
        onnx.checker.check_node(proto, _checker_context(node.domain, version))
    except onnx.checker.ValidationError as e:
        return str(e).strip(), None
    if not schema.has_type_and_shape_inference_function:
        return None, None
    try:
        inferred = onnx.shape_inference.infer_node_outputs(
            schema, proto, types, data, opset_imports=[onnx.helper.make_opsetid(node.domain, version)]
        )
    except Exception as e:
        return str(e).strip() or type(e).__name__, None
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
    return None, found


@functools.lru_cache(maxsize=64)
def _checker_context(domain: str, version: int) -> Any:
    context = onnx.checker.C.CheckerContext()
    context.ir_version = onnx.IR_VERSION
    context.opset_imports = {domain: version} if domain in ("", "ai.onnx") else {"": 18, domain: version}
    return context
