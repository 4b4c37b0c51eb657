"""Recording ONNX Script calls into an ``onnx_ir`` graph.

While an impl runs, onnxscript hands every op call (``op18.Add(x, y)``) and
every script-function call to the *default evaluator*. :class:`Recorder` is
that evaluator during an export: it turns each call into an ``ir.Node`` in the
graph being built, with Python scalars and lists made into constants typed
like their neighbours (as onnxscript's own autocast does), attributes typed by
the op's schema, and output types inferred by ONNX's per-node inference.

Script functions are not executed: a call becomes a call node to the
function, which is kept as a model-local function (and inlined later if the
export inlines).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from opreg.errors import ExportError
from opreg.exporter import _axes, _older
from opreg.node_types import infer_node, op_schema
from opreg.registry.targets import ONNX_DOMAIN, domain_label

logger = logging.getLogger(__name__)

OUTPUTS_KWARG = "_outputs"
"""onnxscript's way to say how many outputs a call has; never reaches the model."""

SMALL_CONSTANT = 64
"""Constants up to this many elements are handed to shape inference as data."""

RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout"}
)
"""The ai.onnx ops that draw random numbers (Dropout in training mode), each with a ``seed`` attribute.
onnxscript's folder and onnx_ir's CSE know the first four (and Multinomial), not Bernoulli or Dropout."""


def missing_schema(error: BaseException) -> tuple[str, int, str] | None:
    """``(domain, version, op_type)`` when ``error`` is onnxscript's ``AttributeError: Attribute NAME
    not found.``: an impl wrote ``opset.NAME(...)`` on an ``onnxscript.values.Opset`` whose domain has
    no ONNX schema for ``NAME`` in this process (onnxscript looks the op up by its schema); else ``None``."""
    if not isinstance(error, AttributeError):
        return None
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    if trace is None or trace.tb_frame.f_code.co_name != "__getattr__":
        return None
    import onnxscript.values

    opset, name = trace.tb_frame.f_locals.get("self"), trace.tb_frame.f_locals.get("attr")
    if not isinstance(opset, onnxscript.values.Opset) or not isinstance(name, str):
        return None
    return opset.domain, opset.version, name


def schema_hint(domain: str, version: int, name: str) -> str:
    """What to do about a call of ``domain::name`` that has no ONNX schema here (:func:`missing_schema`):
    load the installed pack that registers it, or spell the call so that it needs none."""
    import onnx.defs

    op = f"{domain_label(domain)}::{name}"
    spelling = f'onnxscript.values.Op(opset, "{name}")(...), which needs no schema'
    if onnx.defs.has(name, domain):
        since = onnx.defs.get_schema(name, onnx.defs.onnx_opset_version(), domain).since_version
        return f"{op} has no ONNX schema at version {version} (its schema starts at {since}): use that, or {spelling}"
    owners = _schema_owners(f"{domain}::{name}")
    if owners:
        return (
            f"{op} has no ONNX schema in this export: pack {', '.join(owners)} registers it and is not loaded "
            f"(load it with -p, plugins=), or write the call {spelling}"
        )
    return f"{op} has no ONNX schema here, and no installed pack registers one: write the call {spelling}"


def _schema_owners(op: str) -> list[str]:
    """``pack (distribution)`` of each installed pack whose ``opreg_schemas`` registers ``op``, as
    ``opreg plugins`` lists them in another process (from its cache of what the packs declare, when
    nothing changed): loading the packs here would register their schemas in this process and change
    what its later exports do."""
    import json
    import os
    import subprocess
    import sys

    from opreg.packs import plugins

    names = [f"-p{found.name}" for found in plugins.discovered()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the packs this process sees
    try:
        done = subprocess.run(
            [sys.executable, "-m", "opreg", "plugins", "--json", *names],
            capture_output=True, text=True, timeout=300, check=True, env=env,
        )  # fmt: skip
        reports = json.loads(done.stdout)
    except Exception:  # a hint must not hide the error it explains
        logger.debug("could not list what the installed packs declare", exc_info=True)
        return []
    return [f"{r['name']} ({r['distribution']})" for r in reports if op in r.get("schemas", ())]


def is_random(node: ir.Node) -> bool:
    """Whether ``node`` draws random numbers (see :data:`RANDOM_OPS`)."""
    return node.domain in ("", "ai.onnx") and node.op_type in RANDOM_OPS


_NO_NUMPY_FOLD = frozenset({ir.DataType.BFLOAT16, ir.DataType.STRING, ir.DataType.UNDEFINED})


@dataclasses.dataclass(frozen=True)
class Use:
    """One (domain, version) an emitted node or kept function needs, and who emitted it."""

    domain: str
    version: int | None
    emitter: str
    what: str


@functools.lru_cache(maxsize=4096)
def _signature(op_type: str, version: int, domain: str) -> ir.schemas.OpSignature | None:
    schema = op_schema(op_type, version, domain)
    return None if schema is None else ir.schemas.OpSignature.from_op_schema(schema)


def _python_dtype(value: Any) -> ir.DataType:
    """The ONNX type of a Python scalar or (nested) list, as onnxscript picks it."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    if isinstance(value, (bool, np.bool_)):
        return ir.DataType.BOOL
    if isinstance(value, (int, np.integer)):
        return ir.DataType.INT64
    if isinstance(value, str):
        return ir.DataType.STRING
    return ir.DataType.FLOAT


def _single_type(constraint: ir.schemas.TypeConstraintParam) -> ir.DataType | None:
    tensor_types = [t for t in constraint.allowed_types if isinstance(t, ir.TensorType)]
    if len(tensor_types) == 1 and len(constraint.allowed_types) == 1:
        return tensor_types[0].dtype
    return None


_TENSOR_CLASSES: dict[type, bool] = {}


def _is_tensor(value: Any) -> bool:
    """Whether ``value`` is an ONNX tensor, answered once per class: ``isinstance`` against
    the runtime-checkable ``ir.TensorProtocol`` is slow enough to show in big exports."""
    cls = type(value)
    known = _TENSOR_CLASSES.get(cls)
    if known is None:
        known = _TENSOR_CLASSES[cls] = isinstance(value, ir.TensorProtocol)
    return known


def _to_tensor(value: Any, dtype: ir.DataType | None) -> ir.TensorProtocol:
    """An ONNX tensor from a Python number or list, numpy array or torch tensor,
    as ``dtype`` when given (else as numpy or onnxscript would type it)."""
    if _is_tensor(value):
        return value
    if type(value).__module__.startswith("torch"):
        value = value.detach().cpu().numpy()
    if dtype is None:
        if isinstance(value, np.ndarray | np.generic) and value.dtype != object:
            return ir.Tensor(np.asarray(value))
        dtype = _python_dtype(value)
    if dtype == ir.DataType.STRING:
        return ir.tensor(value, dtype=dtype)
    # ir.Tensor, not ir.tensor: the latter's protocol checks cost more than the constant
    return ir.Tensor(np.asarray(value, dtype=dtype.numpy()), dtype=dtype)


@dataclasses.dataclass
class _Model:
    """What every graph of one model shares: value names are unique across all of them."""

    uses: list[Use] = dataclasses.field(default_factory=list)
    functions: dict[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]] = dataclasses.field(default_factory=dict)
    counter: int = 0
    names: set[str] = dataclasses.field(default_factory=set)


class GraphRecorder:
    """Builds the nodes of one graph from onnxscript calls.

    Implements onnxscript's evaluator protocol (``eval_op`` and
    ``eval_function``); install it with ``onnxscript.evaluator.default_as``.
    ``emitter`` names who is being traced now (``pack:function``) and
    ``metadata`` is stamped on every node made, both set by the translator
    around each impl call.

    :meth:`subgraph` gives the recorder of a graph nested in this one (an If
    branch, a Loop body): it shares the model's names, uses and functions, and
    may use this graph's values and constants (ONNX's outer scope).
    """

    def __init__(self, graph: ir.Graph, onnx_version: int, parent: GraphRecorder | None = None) -> None:
        self.graph = graph
        self.onnx_version = onnx_version
        self.parent = parent
        self.emitter = "<exporter>"
        self.metadata: dict[str, str] = {}
        self.name_prefix = "n"
        self._model: _Model = parent._model if parent is not None else _Model()
        self._constants: dict[tuple, ir.Value] = {}
        self.added: list[ir.Node] = []
        """Every node this recorder appended to its graph, in order (``len(added)`` marks a point)."""

    @property
    def uses(self) -> list[Use]:
        """Every (domain, version) an emitted node or kept function needs, in all graphs."""
        return self._model.uses

    @property
    def functions(self) -> dict[ir.OperatorIdentifier, tuple[onnx.FunctionProto, str]]:
        """The script functions called, kept as model-local functions (with their emitter)."""
        return self._model.functions

    def subgraph(self, graph: ir.Graph) -> GraphRecorder:
        """A recorder for ``graph``, nested in this recorder's graph."""
        child = GraphRecorder(graph, self.onnx_version, parent=self)
        child.emitter, child.metadata, child.name_prefix = self.emitter, dict(self.metadata), self.name_prefix
        return child

    def shared_constants(self) -> set[int]:
        """The ids of the values :meth:`constant` hands out (one per distinct constant, of this
        graph and the graphs it is nested in): every call that asks for one gets the same value."""
        ids: set[int] = set()
        scope: GraphRecorder | None = self
        while scope is not None:
            ids.update(id(value) for value in scope._constants.values())
            scope = scope.parent
        return ids

    def fresh_name(self, stem: str) -> str:
        """A value or node name no other graph of the model uses."""
        names = self._model.names
        while True:
            self._model.counter += 1
            name = f"{stem}_{self._model.counter}"
            if name not in names:
                names.add(name)
                return name

    def claim(self, name: str) -> str:
        """``name`` if no graph of the model uses it yet, else a fresh name built from it
        (FX names repeat across the subgraphs of higher-order ops; ONNX names may not)."""
        if name in self._model.names:
            return self.fresh_name(name)
        self._model.names.add(name)
        return name

    # -- onnxscript's evaluator protocol -------------------------------------

    def eval_op(self, op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        domain, version, op_type = op.opset.domain, op.opset.version, op.name
        kwargs = dict(kwargs)
        wanted_outputs = kwargs.pop(OUTPUTS_KWARG, None)
        signature = _signature(op_type, version, domain) if op.op_schema is not None else None
        if signature is None:
            # No schema: positional arguments are inputs, keywords attributes.
            inputs = [self.constant(a, None) if _needs_constant(a) else a for a in args]
            attributes = [_attribute(k, v, None) for k, v in kwargs.items() if v is not None]
            n_outputs = wanted_outputs or 1
        else:
            inputs, attributes = self._bind(signature, args, kwargs, f"{domain_label(domain)}::{op_type}")
            if domain in ("", "ai.onnx"):
                inputs, attributes = _axes.normalize(op_type, inputs, attributes, self.constant)
            if domain in ("", "ai.onnx") and version > self.onnx_version:  # a target older than the impl
                older = _older.older_spelling(op_type, version, self.onnx_version, inputs, attributes)
                if older is not None:
                    version, inputs, attributes = older
            folded = self._fold(domain, op_type, inputs, attributes)
            if folded is not None:
                return folded
            if wanted_outputs is not None:
                n_outputs = wanted_outputs
            elif signature.outputs and signature.outputs[-1].variadic:
                n_outputs = _variadic_outputs(op_type, attributes, inputs)
            else:
                n_outputs = len(signature.outputs)
        node = self.add_node(domain, op_type, inputs, attributes, n_outputs, version)
        self.uses.append(Use(domain, version, self.emitter, f"{domain_label(domain)}::{op_type}"))
        outputs = list(node.outputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def eval_function(self, function: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        proto = _function_proto(function)
        domain, name = proto.domain, proto.name
        key = (domain, name, proto.overload)
        self.functions.setdefault(key, (proto, self.emitter))
        for nested in _called_functions(function):
            nested_proto = _function_proto(nested)
            self.functions.setdefault(
                (nested_proto.domain, nested_proto.name, nested_proto.overload), (nested_proto, self.emitter)
            )
        signature = function.op_signature
        if signature is None:
            raise ExportError(f"script function {domain}::{name} has no signature onnxscript can read")
        inputs, attributes = self._bind(signature, args, kwargs, f"function {domain}::{name}")
        version = function.opset.version
        node = self.add_node(domain, name, inputs, attributes, len(proto.output), None)
        self.uses.append(Use(domain, version, self.emitter, f"function {domain}::{name}"))
        for opset in proto.opset_import:
            self.uses.append(Use(opset.domain, opset.version, self.emitter, f"function {domain}::{name}"))
        for body in (proto, *(_function_proto(f) for f in _called_functions(function))):  # judged op by op
            imports = {o.domain: o.version for o in body.opset_import}
            self.uses.extend(
                Use(ONNX_DOMAIN, imports.get(n.domain), self.emitter, f"ai.onnx::{n.op_type}")
                for n in body.node
                if n.domain in (ONNX_DOMAIN, "ai.onnx")
            )
        outputs = list(node.outputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # -- building blocks -------------------------------------------------------

    def _fold(self, domain: str, op_type: str, inputs: Sequence[Any], attributes: Sequence[ir.Attr]) -> ir.Value | None:
        """Fold a cast of a constant (``CastLike(0.5, x)``, ``Cast(c, to=...)``) into a constant."""
        if domain != "" or op_type not in ("CastLike", "Cast") or not inputs or inputs[0] is None:
            return None
        source = inputs[0].const_value
        if source is None or source.size > SMALL_CONSTANT or source.dtype == ir.DataType.STRING:
            return None
        if op_type == "CastLike":
            dtype = inputs[1].dtype if len(inputs) > 1 and inputs[1] is not None else None
        else:
            to = next((a for a in attributes if a.name == "to"), None)
            dtype = ir.DataType(to.value) if to is not None and len(attributes) == 1 else None
        if dtype is None or dtype in _NO_NUMPY_FOLD:
            return None
        return self.constant(source.numpy().astype(dtype.numpy()), dtype)

    def add_node(
        self,
        domain: str,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Sequence[ir.Attr],
        n_outputs: int,
        version: int | None,
        *,
        infer: bool = True,
    ) -> ir.Node:
        """Append a node named after the op being translated, stamped with its provenance; with
        ``infer``, its outputs typed by ONNX's per-node inference (a replayed call types them itself)."""
        while inputs and inputs[-1] is None:
            inputs = inputs[:-1]
        name = self.fresh_name(f"{self.name_prefix}_{op_type}")
        node = ir.Node(
            domain,
            op_type,
            inputs,
            attributes,
            num_outputs=n_outputs,
            version=version,
            name=name,
        )
        for i, output in enumerate(node.outputs):
            output.name = name + (f"_{i}" if n_outputs > 1 else "")
        self.graph.append(node)
        self.added.append(node)
        if infer and version is not None:  # what ONNX confirms here, the export's check need not check again
            infer_node(node, version, SMALL_CONSTANT)
        node.metadata_props.update(self.metadata)  # after inference, which serialises the node
        return node

    def constant(self, value: Any, dtype: ir.DataType | None) -> ir.Value:
        """A ``Constant`` node holding ``value`` (cached: one node per distinct constant)."""
        tensor = _to_tensor(value, dtype)
        array = tensor.numpy()
        key = (tensor.dtype, array.shape, array.tobytes()) if tensor.dtype != ir.DataType.STRING else None
        if key is not None:
            scope: GraphRecorder | None = self
            while scope is not None:  # a constant of an enclosing graph is visible here
                if key in scope._constants:
                    return scope._constants[key]
                scope = scope.parent
        name = self.fresh_name("const")
        node = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)], num_outputs=1, name=name)
        node.metadata_props.update(self.metadata)
        out = node.outputs[0]
        out.name = name
        out.dtype = tensor.dtype
        out.shape = ir.Shape(array.shape)
        out.const_value = tensor
        self.graph.append(node)
        self.added.append(node)
        if key is not None:
            self._constants[key] = out
        return out

    def _bind(
        self, signature: ir.schemas.OpSignature, args: Sequence[Any], kwargs: Mapping[str, Any], what: str
    ) -> tuple[list[ir.Value | None], list[ir.Attr]]:
        """Match a call's arguments to ``signature``; constants for Python inputs."""
        params = list(signature.params)
        bound: list[tuple[Any, Any]] = []  # (param, value)
        position = 0
        for param in params:
            if position >= len(args):
                break
            if isinstance(param, ir.schemas.Parameter) and param.variadic:
                bound.extend((param, a) for a in args[position:])
                position = len(args)
                break
            bound.append((param, args[position]))
            position += 1
        if position < len(args):
            raise ExportError(f"{what} takes at most {len(params)} arguments, got {len(args)}")
        by_name = {p.name: p for p in params}
        for key, value in kwargs.items():
            if key not in by_name:
                raise ExportError(f"{what} has no input or attribute {key!r}; it has {', '.join(by_name)}")
            bound.append((by_name[key], value))

        # Type variables bound by the tensor inputs that have a known type.
        known: dict[str, ir.DataType] = {}
        for param, value in bound:
            if isinstance(param, ir.schemas.Parameter) and isinstance(value, ir.Value) and value.dtype is not None:
                known.setdefault(param.type_constraint.name, value.dtype)

        inputs: list[ir.Value | None] = []
        attributes: list[ir.Attr] = []
        for param, value in bound:
            if isinstance(param, ir.schemas.AttributeParameter):
                if value is not None:
                    attributes.append(_attribute(param.name, value, param.type))
                continue
            if _needs_constant(value):
                dtype = _single_type(param.type_constraint) or known.get(param.type_constraint.name)
                inputs.append(self.constant(value, dtype))
            else:
                inputs.append(value)
        return inputs, attributes


def _needs_constant(value: Any) -> bool:
    return value is not None and not isinstance(value, ir.Value)


def _attribute(name: str, value: Any, attr_type: ir.AttributeType | None) -> ir.Attr:
    if isinstance(value, ir.Attr):
        return value
    if isinstance(value, ir.Graph | ir.Function) or type(value).__name__ == "OnnxClosure":
        raise ExportError(
            f"attribute {name!r}: graph attributes cannot be traced; write the impl as an "
            "@onnxscript.script function to use control flow"
        )
    if attr_type == ir.AttributeType.TENSOR or (
        attr_type is None and (isinstance(value, np.ndarray) or type(value).__module__.startswith("torch"))
    ):
        return ir.AttrTensor(name, _to_tensor(value, None))
    if isinstance(value, np.generic):
        value = value.item()
    if attr_type == ir.AttributeType.INT and isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        return ir.convenience.convert_attribute(name, value, attr_type)
    except (TypeError, ValueError) as e:
        raise ExportError(f"attribute {name!r}={value!r} cannot be an ONNX {attr_type} attribute: {e}") from e


def _variadic_outputs(op_type: str, attributes: Sequence[ir.Attr], inputs: Sequence[Any]) -> int:
    for attr in attributes:
        if attr.name == "num_outputs":
            return int(attr.value)
    if op_type == "Split" and len(inputs) > 1 and inputs[1] is not None and inputs[1].const_value is not None:
        return int(inputs[1].const_value.numpy().size)
    raise ExportError(
        f"cannot tell how many outputs {op_type} has: pass num_outputs=N where the op has that attribute, "
        f"or call it as onnxscript.values.Op(opset, {op_type!r}, schema)(..., _outputs=N)"
    )


@functools.lru_cache(maxsize=1024)
def _function_proto_cached(function: Any) -> onnx.FunctionProto:
    return function.to_function_proto()


def _function_proto(function: Any) -> onnx.FunctionProto:
    try:
        return _function_proto_cached(function)
    except TypeError:  # unhashable
        return function.to_function_proto()


def _called_functions(function: Any) -> list[Any]:
    try:
        return list(function.function_ir.get_called_functions().values())
    except AttributeError:
        return []
