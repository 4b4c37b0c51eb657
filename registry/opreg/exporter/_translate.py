"""From the decomposed FX graph to an ``onnx_ir`` graph: coverage, then translation.

Coverage comes first and sees every node: each torch op gets its impl from
the registry, and the node's arguments are mapped onto the impl's parameters
(:func:`plan_call`). Anything that fails is collected, so one
:class:`UnsupportedOpsError` lists every missing op before any translation.

Translation then walks the graph in order and calls each impl under a
:class:`GraphRecorder`; parameters and buffers become initializers named by
their ``state_dict`` keys, and inputs keep the placeholders' names (torch
names them after ``forward``'s parameters and their pytree paths).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir
import onnxscript.evaluator
import torch
from onnx_ir import tensor_adapters
from torch.export.graph_signature import InputKind, OutputKind

from opreg.errors import ExportError, UnsupportedOpsError
from opreg.exporter import _capture
from opreg.exporter._recorder import GraphRecorder
from opreg.opname import OpName
from opreg.registry import Impl, Registry
from opreg.targets import Target

SKIPPED_OPS = frozenset(
    {
        "aten::_assert_scalar.default",
        "aten::_assert_tensor_metadata.default",
        "aten::sym_constrain_range.default",
        "aten::sym_constrain_range_for_size.default",
        "aten::_assert_async.msg",
        "aten::_linalg_check_errors.default",
    }
)
"""Runtime checks torch.export leaves in; they produce nothing ONNX needs."""

_WITH_EFFECTS = torch.ops.higher_order.with_effects
"""Wraps an op with side effects, threading a token; only skipped checks are supported."""

_IGNORABLE_TYPES = ("Device", "Layout", "MemoryFormat")
"""Argument types that say nothing about the result's values; dropped when an
impl has no parameter for them."""

_META_TORCH_OP = "opreg.torch_op"
_META_PACK = "opreg.pack"
_META_IMPL = "opreg.impl"
_META_MODULE = "opreg.module"
_META_SOURCE = "opreg.source"
PROVENANCE_KEYS = (_META_TORCH_OP, _META_PACK, _META_IMPL, _META_MODULE, _META_SOURCE)


@dataclasses.dataclass(frozen=True)
class MissingOp:
    """One op an export cannot translate.

    Fields:
        op: the torch op (``aten::foo.default``) or the FX target's name.
        count: how many nodes use it.
        locations: where (module path, source line), first few.
        reason: why it is not covered.
        elsewhere: ``pack:function (requirement)`` of installed impls that
            would cover it under another target.
    """

    op: str
    count: int
    locations: tuple[str, ...]
    reason: str
    elsewhere: tuple[str, ...] = ()

    def __str__(self) -> str:
        plural = "s" if self.count != 1 else ""
        text = f"{self.op}: {self.count} node{plural}, at {'; '.join(self.locations)}. {self.reason}"
        if self.elsewhere:
            text += f" Covered under another target by {', '.join(self.elsewhere)}."
        return text


@dataclasses.dataclass(frozen=True)
class Call:
    """How one node calls its impl: the arguments, still holding FX nodes."""

    impl: Impl
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    types: tuple[str, ...]
    kwarg_types: dict[str, str]


class _NotCovered(Exception):
    pass


# -- coverage ------------------------------------------------------------------------


def plan(graph: torch.fx.Graph, registry: Registry, target: Target) -> dict[torch.fx.Node, Call]:
    """Resolve every node's impl and map its arguments; raise with every missing op."""
    calls: dict[torch.fx.Node, Call] = {}
    missing: dict[str, list[tuple[torch.fx.Node, str]]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        fn = node.target
        if fn in _SYMBOLIC or fn is operator.getitem:
            continue
        if fn is _WITH_EFFECTS:
            inner = node.args[1]
            if isinstance(inner, torch._ops.OpOverload) and str(OpName.of(inner)) in SKIPPED_OPS:
                continue
            missing.setdefault(f"with_effects({inner})", []).append(
                (node, "opreg cannot translate ops with side effects (they thread an effect token)")
            )
            continue
        if not isinstance(fn, torch._ops.OpOverload):
            name = getattr(fn, "__name__", str(fn))
            missing.setdefault(name, []).append(
                (node, "opreg translates torch ops; this is a Python or higher-order call torch.export left in")
            )
            continue
        op = OpName.of(fn)
        if str(op) in SKIPPED_OPS:
            continue
        impl = registry.resolve(op, target, node)
        if impl is None:
            reason = "No installed pack implements it for this target."
            if registry.candidates(op, target):
                reason = "Its impls' predicates reject these nodes."
            for pack, why in registry.unsupported(op).values():
                reason = f"Unsupported ({pack}): {why}"
            missing.setdefault(str(op), []).append((node, reason))
            continue
        try:
            calls[node] = plan_call(node, impl)
        except _NotCovered as e:
            missing.setdefault(str(op), []).append((node, f"{impl.label} cannot take the call: {e}"))
    if missing:
        raise _unsupported(missing, registry, target)
    return calls


def _unsupported(
    found: dict[str, list[tuple[torch.fx.Node, str]]], registry: Registry, target: Target
) -> UnsupportedOpsError:
    entries = []
    for name, nodes in sorted(found.items()):
        locations = list(dict.fromkeys(_capture.where(n) for n, _ in nodes))
        shown = tuple(locations[:3]) + ((f"and {len(locations) - 3} more places",) if len(locations) > 3 else ())
        elsewhere: tuple[str, ...] = ()
        if "::" in name:
            elsewhere = tuple(
                f"{i.label} ({i.requirement})" for i in registry.impls(name) if target.unmet(i.requirement) is not None
            )
        entries.append(MissingOp(name, len(nodes), shown, nodes[0][1], elsewhere))
    lines = [f"{len(entries)} op(s) in the model have no impl for target {target}:"]
    lines += [f"  - {e}" for e in entries]
    lines.append(
        "Install a pack that implements them, choose a target one covers (see `opreg explain OP`), "
        "or register your own impl on a registry copy and pass it as registry=."
    )
    return UnsupportedOpsError("\n".join(lines), tuple(entries))


def plan_call(node: torch.fx.Node, impl: Impl) -> Call:
    """Map the node's arguments onto the impl's parameters.

    Schema arguments map to parameters by position (the registry checked the
    signature). Arguments the node leaves out are left out (the impl's
    defaults apply) unless a later one is given; arguments past the impl's
    parameters must be their defaults, or of a type that does not change the
    values (device, layout, memory format).
    """
    schema = node.target._schema
    arguments = [a for a in schema.arguments if not a.is_out]
    given: dict[str, Any] = {}
    for arg, value in zip(arguments, node.args, strict=False):
        given[arg.name] = value
    given.update(node.kwargs)
    params = impl.params
    if params is None or params.variadic:
        width = len(arguments)
        keyword_only: set[int] = set()
        names = [a.name for a in arguments]
    else:
        width = min(len(params.params), len(arguments))
        keyword_only = {i for i, p in enumerate(params.params[:width]) if p.keyword_only}
        names = [p.name for p in params.params[:width]]

    for arg in arguments[width:]:
        if arg.name not in given:
            continue
        value = given[arg.name]
        if str(arg.type).rstrip("?") in _IGNORABLE_TYPES or arg.name == "pin_memory":
            continue
        if arg.has_default_value() and _same(value, arg.default_value):
            continue
        raise _NotCovered(f"it has no parameter for argument {arg.name}={value!r}")

    last = max((i for i, a in enumerate(arguments[:width]) if a.name in given), default=-1)
    args: list[Any] = []
    types: list[str] = []
    kwargs: dict[str, Any] = {}
    kwarg_types: dict[str, str] = {}
    for i, arg in enumerate(arguments[: last + 1]):
        if arg.name in given:
            value = given[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            raise _NotCovered(f"argument {arg.name} is missing")
        if i in keyword_only or arg.kwarg_only:
            if arg.name not in given:
                continue
            kwargs[names[i]] = value
            kwarg_types[names[i]] = str(arg.type)
        else:
            args.append(value)
            types.append(str(arg.type))
    return Call(impl, tuple(args), kwargs, tuple(types), kwarg_types)


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:
        return False


# -- translation ------------------------------------------------------------------------


class Translator:
    """Walks one decomposed ``ExportedProgram`` and records its ONNX graph."""

    def __init__(
        self,
        program: torch.export.ExportedProgram,
        calls: dict[torch.fx.Node, Call],
        target: Target,
        symbols: dict[str, str],
    ) -> None:
        self.program = program
        self.calls = calls
        self.target = target
        self.symbols = symbols
        self.graph = ir.Graph([], [], nodes=[], name="main_graph")
        self.recorder = GraphRecorder(self.graph, target.onnx)
        self.values: dict[torch.fx.Node, Any] = {}
        self.input_names: list[str] = []
        self.used_impls: dict[str, Impl] = {}

    # values ------------------------------------------------------------------------

    def _shape(self, value: torch.Tensor) -> ir.Shape:
        dims: list[int | ir.SymbolicDim] = []
        for dim in value.shape:
            if isinstance(dim, torch.SymInt):
                expr = dim.node.expr
                if getattr(expr, "is_number", False):
                    dims.append(int(expr))
                    continue
                text = str(expr)
                if text in self.symbols:
                    dims.append(ir.SymbolicDim(self.symbols[text]))
                else:
                    renamed = expr.xreplace({s: type(s)(self.symbols.get(str(s), str(s))) for s in expr.free_symbols})
                    dims.append(ir.SymbolicDim(str(renamed)))
            else:
                dims.append(int(dim))
        return ir.Shape(dims)

    def _describe(self, value: ir.Value, meta: Any) -> None:
        if isinstance(meta, torch.Tensor):
            value.dtype = tensor_adapters.from_torch_dtype(meta.dtype)
            value.shape = self._shape(meta)
        elif isinstance(meta, torch.SymInt | int):
            value.dtype = ir.DataType.INT64
            value.shape = ir.Shape([])
        elif isinstance(meta, torch.SymFloat | float):
            value.dtype = ir.DataType.FLOAT
            value.shape = ir.Shape([])
        elif isinstance(meta, torch.SymBool | bool):
            value.dtype = ir.DataType.BOOL
            value.shape = ir.Shape([])

    # inputs --------------------------------------------------------------------------

    def inputs(self) -> None:
        specs = {s.arg.name: s for s in self.program.graph_signature.input_specs if hasattr(s.arg, "name")}
        state = self.program.state_dict
        constants = self.program.constants
        for node in self.program.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs.get(node.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            meta = node.meta.get("val")
            if kind == InputKind.USER_INPUT:
                if not isinstance(meta, torch.Tensor):
                    raise ExportError(
                        f"input {node.name!r} is a {type(meta).__name__}, not a tensor: ONNX inputs are tensors. "
                        "Pass it as a tensor, or leave it static (torch.export then bakes it in)."
                    )
                value = ir.Value(name=node.name)
                self._describe(value, meta)
                self.graph.inputs.append(value)
                self.input_names.append(node.name)
            elif kind == InputKind.TOKEN:
                value = None  # effect tokens order side effects; ONNX has none
            elif kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                name = spec.target
                tensor = state[name] if name in state else constants[name]
                if not isinstance(tensor, torch.Tensor):
                    raise ExportError(f"{kind.name.lower()} {name!r} is a {type(tensor).__name__}, not a tensor")
                tensor = tensor.detach()
                if not tensor.is_contiguous():
                    tensor = tensor.contiguous()
                value = ir.Value(name=name, const_value=tensor_adapters.TorchTensor(tensor, name=name))
                self._describe(value, tensor)
                self.graph.register_initializer(value)
            else:
                raise ExportError(f"input {node.name!r} of kind {kind.name} cannot be exported to ONNX")
            self.values[node] = value

    # nodes ---------------------------------------------------------------------------

    def run(self) -> None:
        self.inputs()
        with onnxscript.evaluator.default_as(self.recorder):
            for node in self.program.graph.nodes:
                if node.op == "call_function":
                    self._call(node)
                elif node.op == "output":
                    self._outputs(node)

    def _call(self, node: torch.fx.Node) -> None:
        fn = node.target
        if fn is operator.getitem:
            container, index = node.args
            self.values[node] = self.values[container][index]
            return
        if fn in _SYMBOLIC:
            self._symbolic(node)
            return
        if fn is _WITH_EFFECTS:  # a skipped check: its only result is the effect token
            self.values[node] = (None,)
            return
        call = self.calls.get(node)
        if call is None:  # a skipped assertion
            return
        impl = call.impl
        self.used_impls[impl.label] = impl
        recorder = self.recorder
        recorder.emitter = impl.label
        recorder.name_prefix = node.name
        recorder.metadata = {
            _META_TORCH_OP: str(impl.op),
            _META_PACK: impl.pack,
            _META_IMPL: impl.name,
            _META_MODULE: _capture.module_path(node),
            _META_SOURCE: _capture.source_line(node),
        }
        first = len(self.graph)
        args = [self._argument(a, t) for a, t in zip(call.args, call.types, strict=True)]
        kwargs = {k: self._argument(v, call.kwarg_types[k]) for k, v in call.kwargs.items()}
        try:
            result = impl.function(*args, **kwargs)
        except ExportError as e:
            raise ExportError(f"{_call_site(node, impl)}: {e}") from e
        except Exception as e:
            raise ExportError(f"{_call_site(node, impl)} raised {type(e).__name__}: {e}") from e
        made = {id(n) for n in list(self.graph)[first:]}
        self.values[node] = self._results(node, impl, result, made)

    def _results(self, node: torch.fx.Node, impl: Impl, result: Any, made: set[int]) -> Any:
        meta = node.meta.get("val")
        if isinstance(meta, (list, tuple)):
            if not isinstance(result, (list, tuple)) or len(result) != len(meta):
                got = len(result) if isinstance(result, (list, tuple)) else 1
                raise ExportError(f"{_call_site(node, impl)} returned {got} value(s); the op has {len(meta)} outputs")
            return tuple(
                self._result(f"{node.name}_{i}", r, m, made) if m is not None else None
                for i, (r, m) in enumerate(zip(result, meta, strict=True))
            )
        if isinstance(result, (list, tuple)):
            if len(result) != 1:
                raise ExportError(f"{_call_site(node, impl)} returned {len(result)} values; the op has one output")
            result = result[0]
        return self._result(node.name, result, meta, made)

    def _result(self, name: str, value: Any, meta: Any, made: set[int]) -> ir.Value:
        if isinstance(value, (list, tuple)) and any(isinstance(v, ir.Value) for v in value):
            raise ExportError(
                f"the impl returned {len(value)} values where the op has a single tensor ({name}): "
                "unpack multi-output ONNX ops (`y, _ = op.X(...)`) and return one value per op output"
            )
        if not isinstance(value, ir.Value):
            value = self.recorder.constant(value, None if meta is None else _dtype_of(meta))
        producer = value.producer()
        if producer is not None and id(producer) in made and producer.op_type != "Constant":
            value.name = name
        self._describe(value, meta)
        return value

    def _argument(self, value: Any, arg_type: str) -> Any:
        if isinstance(value, torch.fx.Node):
            return self.values[value]
        if isinstance(value, (list, tuple)):
            items = [self._argument(v, arg_type) for v in value]
            if "int" in arg_type.lower() and any(isinstance(v, ir.Value) for v in items):
                return self._int_list(items)
            return items
        if isinstance(value, torch.dtype):
            return int(tensor_adapters.from_torch_dtype(value))
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            return None
        if isinstance(value, torch.Tensor):
            return self.recorder.constant(value.detach().cpu().numpy(), None)
        return value

    def _int_list(self, items: Sequence[Any]) -> ir.Value:
        """A 1-D INT64 tensor from a list mixing ints and symbolic (scalar INT64) sizes."""
        parts = []
        axes = self.recorder.constant([0], ir.DataType.INT64)
        for item in items:
            if isinstance(item, ir.Value) and item.shape is not None and len(item.shape) == 0:
                parts.append(self.recorder.add_node("", "Unsqueeze", [item, axes], [], 1, self.target.onnx).outputs[0])
            elif isinstance(item, ir.Value):
                parts.append(item)
            else:
                parts.append(self.recorder.constant([int(item)], ir.DataType.INT64))
        node = self.recorder.add_node("", "Concat", parts, [ir.AttrInt64("axis", 0)], 1, self.target.onnx)
        return node.outputs[0]

    # symbolic sizes ------------------------------------------------------------------------

    def _symbolic(self, node: torch.fx.Node) -> None:
        meta = node.meta.get("val")
        if isinstance(meta, (int, float, bool)) and not isinstance(meta, torch.SymInt):
            self.values[node] = meta  # torch specialised it
            return
        recorder = self.recorder
        recorder.emitter = "<exporter>"
        recorder.name_prefix = node.name
        recorder.metadata = {_META_TORCH_OP: getattr(node.target, "__name__", str(node.target)), _META_PACK: "opreg"}
        operands = [self.values[a] if isinstance(a, torch.fx.Node) else a for a in node.args]
        operands = [recorder.constant(v, _scalar_dtype(v)) if not isinstance(v, ir.Value) else v for v in operands]
        op_type, cast = _SYMBOLIC[node.target]
        if cast is not None:
            operands = [self._cast(v, cast) for v in operands]
        elif len(operands) == 2 and operands[0].dtype != operands[1].dtype:
            operands = [self._cast(v, ir.DataType.FLOAT) for v in operands]
        result = recorder.add_node("", op_type, operands, [], 1, self.target.onnx).outputs[0]
        result.name = node.name
        self._describe(result, meta)
        self.values[node] = result

    def _cast(self, value: ir.Value, dtype: ir.DataType) -> ir.Value:
        if value.dtype == dtype:
            return value
        node = self.recorder.add_node("", "Cast", [value], [ir.AttrInt64("to", int(dtype))], 1, self.target.onnx)
        return node.outputs[0]

    # outputs -------------------------------------------------------------------------

    def _outputs(self, node: torch.fx.Node) -> None:
        specs = self.program.graph_signature.output_specs
        results = node.args[0]
        self.user_outputs: list[Any] = []
        for spec, value in zip(specs, results, strict=True):
            if spec.kind != OutputKind.USER_OUTPUT:
                continue  # buffer and input mutations: ONNX graphs are functional
            self.user_outputs.append(self.values[value] if isinstance(value, torch.fx.Node) else value)


def _call_site(node: torch.fx.Node, impl: Impl) -> str:
    return f"impl {impl.label} for {impl.op} (node {node.name}, {_capture.where(node)})"


def _dtype_of(meta: Any) -> ir.DataType | None:
    if isinstance(meta, torch.Tensor):
        return tensor_adapters.from_torch_dtype(meta.dtype)
    return _scalar_dtype(meta)


def _scalar_dtype(value: Any) -> ir.DataType | None:
    if isinstance(value, bool | torch.SymBool):
        return ir.DataType.BOOL
    if isinstance(value, int | torch.SymInt):
        return ir.DataType.INT64
    if isinstance(value, float | torch.SymFloat):
        return ir.DataType.FLOAT
    return None


_SYMBOLIC: dict[Callable[..., Any], tuple[str, ir.DataType | None]] = {
    operator.add: ("Add", None),
    operator.sub: ("Sub", None),
    operator.mul: ("Mul", None),
    operator.floordiv: ("Div", ir.DataType.INT64),
    operator.truediv: ("Div", ir.DataType.FLOAT),
    operator.mod: ("Mod", ir.DataType.INT64),
    operator.neg: ("Neg", None),
    operator.eq: ("Equal", None),
    operator.lt: ("Less", None),
    operator.le: ("LessOrEqual", None),
    operator.gt: ("Greater", None),
    operator.ge: ("GreaterOrEqual", None),
    torch.sym_float: ("Identity", ir.DataType.FLOAT),
    torch.sym_max: ("Max", None),
    torch.sym_min: ("Min", None),
}
"""Python operators on symbolic sizes that torch.export leaves in the graph."""
