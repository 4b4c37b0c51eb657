"""Translation: from the planned FX graph to an ``onnx_ir`` graph.

The translator walks a graph in order and calls each node's impl under a
:class:`GraphRecorder`; parameters and buffers become initializers named by
their ``state_dict`` keys, and inputs keep the placeholders' names (torch
names them after ``forward``'s parameters and their pytree paths).

It is re-entrant: the subgraphs of higher-order ops are translated by the
same code, with the same plan, registry and target, each in a scope of its
own (:mod:`opreg.exporter._control_flow`, the translator's base); what an impl
returns is checked against torch's meta value (:mod:`opreg.exporter._results`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx_ir as ir
import onnxscript.evaluator
import torch
from onnx_ir import tensor_adapters
from torch._subclasses.fake_tensor import FakeTensor
from torch.export.graph_signature import InputKind, OutputKind

from opreg.errors import ExportError, WeightsError
from opreg.exporter import _nodes, _state
from opreg.exporter._control_flow import ControlFlow, Scope
from opreg.exporter._memo import MEMO_PACKS, Memo
from opreg.exporter._nodes import Trace, trace_of
from opreg.exporter._plan import Call, Plan
from opreg.exporter._recorder import GraphRecorder, missing_schema, schema_hint
from opreg.exporter._results import call_site, check_result, check_returned, dtype_of, scalar_dtype
from opreg.registry.registry import Impl
from opreg.registry.targets import Target
from opreg.values import COMPLEX_KEY

if TYPE_CHECKING:
    from opreg.weights import LazyWeight


@dataclasses.dataclass
class Translation:
    """The translated main graph and what finishing it needs.

    Fields:
        graph: the main graph (subgraphs hang off its control-flow nodes).
        recorder: the main graph's recorder (uses and functions of all graphs).
        input_names: the ONNX inputs, in order.
        outputs: the values of the module's outputs, in order: ``ir.Value`` s,
            or Python values torch baked in.
        used_impls: ``pack:function`` -> impl, of every impl called.
        state: with ``state_io``, ``(kind, key, input name, value after the call)`` of each
            mutated buffer and input (:mod:`opreg.exporter._state`); the buffers' inputs
            follow ``input_names`` in the graph.
        weights: the initializers that are ``state_dict`` entries (parameters and persistent
            buffers), whose names users look weights up by; other initializers (lifted
            constants, non-persistent buffers) may be folded away.
        traces: FX node name -> what each node of the main graph became (the locator's map).
        call: ``None``, or where a rework gave the graph inputs and outputs the captured program
            does not have (``opreg.llm`` copies a decoder's uncaptured layers, their cache
            included): the whole call's ``(in_spec, out_spec, input leaves)``, which the
            finished :class:`opreg.OnnxProgram` takes instead of the captured program's.
    """

    graph: ir.Graph
    recorder: GraphRecorder
    input_names: list[str]
    outputs: list[Any]
    used_impls: dict[str, Impl]
    state: list[tuple[str, str, str, ir.Value]] = dataclasses.field(default_factory=list)
    weights: frozenset[str] = frozenset()
    traces: dict[str, Trace] = dataclasses.field(default_factory=dict)
    call: tuple[Any, Any, tuple[int, ...]] | None = None


class Translator(ControlFlow):
    """Translates one planned ``ExportedProgram``, subgraphs included."""

    def __init__(
        self,
        program: torch.export.ExportedProgram,
        plan: Plan,
        target: Target,
        symbols: dict[str, str],
        state_io: bool = False,
        lazy_weights: Mapping[str, LazyWeight] | None = None,
    ):
        self.program = program
        self.plan = plan
        self.target = target
        self.symbols = symbols
        self.state_io = state_io
        """Mutated buffers become inputs, and mutated buffers and inputs outputs (``state="io"``)."""
        self.lazy_weights = dict(lazy_weights or {})
        """The lazy value of each ``meta``-device parameter and buffer, by name (``opreg.export(weights=...)``)."""
        self.used_impls: dict[str, Impl] = {}
        self._dims: dict[Any, int | str] = {}
        self.weights: set[str] = set()
        self.traces: dict[str, Trace] = {}
        self.main_graph: ir.Graph | None = None
        self._memo = Memo()
        """Repeated calls of the main graph, translated once (:mod:`opreg.exporter._memo`)."""

    def run(self) -> Translation:
        graph = self.main_graph = ir.Graph([], [], nodes=[], name="main_graph")
        scope = Scope(GraphRecorder(graph, self.target.onnx))
        input_names, state_inputs = self._inputs(scope)
        results = self._walk(scope, self.program.graph)
        specs = self.program.graph_signature.output_specs
        outputs = [value for spec, value in zip(specs, results, strict=True) if spec.kind == OutputKind.USER_OUTPUT]
        state = []
        if self.state_io:  # else the updates are left out: _state.check refused them or was told to drop them
            for spec, value in zip(specs, results, strict=True):
                if spec.kind == OutputKind.BUFFER_MUTATION:
                    state.append((_state.BUFFER, spec.target, state_inputs[spec.target], value))
                elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                    state.append((_state.INPUT, spec.target, spec.target, value))
        for trace in self.traces.values():
            trace.snapshot()
        return Translation(
            graph, scope.recorder, input_names, outputs, self.used_impls,
            state=state, weights=frozenset(self.weights), traces=self.traces,
        )  # fmt: skip

    # -- values ------------------------------------------------------------------------

    def _shape(self, value: torch.Tensor) -> ir.Shape:
        dims: list[int | ir.SymbolicDim] = []
        for dim in value.shape:
            if isinstance(dim, torch.SymInt):
                size = self._dim(dim.node.expr)
                dims.append(size if isinstance(size, int) else ir.SymbolicDim(size))
            else:
                dims.append(int(dim))
        return ir.Shape(dims)

    def _dim(self, expr: Any) -> int | str:
        """A symbolic size as an int or a dim name, torch's symbols renamed to the user's
        (memoised: printing and rewriting sympy expressions is slow, and few are distinct)."""
        found = self._dims.get(expr)
        if found is None:
            if getattr(expr, "is_number", False):
                found = int(expr)
            elif str(expr) in self.symbols:
                found = self.symbols[str(expr)]
            else:
                found = str(expr.xreplace({s: type(s)(self.symbols.get(str(s), str(s))) for s in expr.free_symbols}))
            self._dims[expr] = found
        return found

    def _describe(self, value: ir.Value, meta: Any) -> None:
        """Type and shape ``value`` from its FX metadata; a complex tensor is a real one with a
        trailing dimension of 2 (real, imaginary), marked for impls (:func:`opreg.values.is_complex`)."""
        if isinstance(meta, torch.Tensor) and meta.dtype.is_complex:
            value.dtype = tensor_adapters.from_torch_dtype(meta.dtype.to_real())
            value.shape = ir.Shape([*self._shape(meta), 2])
            value.meta[COMPLEX_KEY] = True
        elif isinstance(meta, torch.Tensor):
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

    def _typed(self, name: str, meta: Any) -> ir.Value:
        value = ir.Value(name=name)
        self._describe(value, meta)
        return value

    # -- inputs ------------------------------------------------------------------------

    def _inputs(self, scope: Scope) -> tuple[list[str], dict[str, str]]:
        """Bind the placeholders; returns the user inputs' names and, with ``state_io``, the
        input name of each mutated buffer (graph inputs after the user's)."""
        specs = {s.arg.name: s for s in self.program.graph_signature.input_specs if hasattr(s.arg, "name")}
        state = self.program.state_dict
        constants = self.program.constants
        graph = scope.recorder.graph
        names = []
        mutated = set(_state.mutations(self.program).buffers) if self.state_io else set()
        state_inputs: dict[str, ir.Value] = {}
        for node in self.program.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs.get(node.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            meta = node.meta.get("val")
            if kind == InputKind.USER_INPUT:
                if not isinstance(meta, (torch.Tensor, torch.SymInt)):
                    if isinstance(meta, (torch.SymFloat, torch.SymBool)):
                        raise ExportError(
                            f"input {node.name!r} is a symbolic {type(meta).__name__[3:].lower()}: opreg exports "
                            "tensors and symbolic ints (Dim.DYNAMIC) as inputs; pass it as a tensor"
                        )
                    scope.values[node] = meta  # a constant of the capture (bool, int, str, None, ...)
                    continue
                value = self._typed(scope.recorder.claim(node.name), meta)  # a tensor, or a dynamic int (0-d INT64)
                graph.inputs.append(value)
                names.append(node.name)
            elif kind == InputKind.TOKEN:
                value = None  # effect tokens order side effects; ONNX has none
            elif kind == InputKind.BUFFER and spec.target in mutated:
                value = self._typed(scope.recorder.claim(spec.target), meta)
                state_inputs[spec.target] = value
            elif kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                name = spec.target
                tensor = state[name] if name in state else constants[name]
                if not isinstance(tensor, torch.Tensor):
                    raise ExportError(f"{kind.name.lower()} {name!r} is a {type(tensor).__name__}, not a tensor")
                scope.recorder.claim(name)
                if kind == InputKind.PARAMETER or (kind == InputKind.BUFFER and spec.persistent is not False):
                    self.weights.add(name)
                value = ir.Value(name=name, const_value=self._initializer(kind, name, tensor.detach()))
                self._describe(value, tensor)
                graph.register_initializer(value)
            else:
                raise ExportError(f"input {node.name!r} of kind {kind.name} cannot be exported to ONNX")
            scope.values[node] = value
        graph.inputs.extend(state_inputs.values())
        return names, {key: value.name for key, value in state_inputs.items()}

    def _initializer(self, kind: InputKind, name: str, tensor: torch.Tensor) -> ir.TensorProtocol:
        """A parameter's, buffer's or constant's value: the tensor itself, or for one without data
        (``meta``, or fake while a meta model was captured) its lazy value from the checkpoint
        (``weights=``), read only when the model is written."""
        lazy = self.lazy_weights.get(name)
        if lazy is not None:
            return lazy.named(name)
        if tensor.device.type == "meta" or isinstance(tensor, FakeTensor):
            raise WeightsError(
                f"{kind.name.lower().replace('_', ' ')} {name!r} is on the meta device and "
                + ("no weights= were given" if not self.lazy_weights else "the checkpoint has no such tensor")
                + ": give it in weights=, or create it on the CPU (a buffer computed at init)"
            )
        stored = torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor
        if not stored.is_contiguous():
            stored = stored.contiguous()
        return tensor_adapters.TorchTensor(stored, name=name)

    # -- walking a graph ------------------------------------------------------------------

    def _walk(self, scope: Scope, graph: torch.fx.Graph) -> list[Any]:
        """Translate ``graph``'s nodes into ``scope`` (its placeholders already bound);
        returns the values of its outputs."""
        with onnxscript.evaluator.default_as(scope.recorder):
            for node in graph.nodes:
                if node.op == "call_function":
                    self._call(scope, node)
                elif node.op == "output":
                    results = node.args[0]
                    results = results if isinstance(results, (list, tuple)) else [results]
                    return [self._value(scope, value) for value in results]
        raise ExportError(f"graph {graph} has no output node")

    def _value(self, scope: Scope, value: Any) -> Any:
        return scope.values[value] if isinstance(value, torch.fx.Node) else value

    def _call(self, scope: Scope, node: torch.fx.Node) -> None:
        step = self.plan.steps[node]
        kind = step.kind
        if kind is _nodes.Kind.GETITEM:
            container, index = node.args
            scope.values[node] = scope.values[container][index]
        elif kind is _nodes.Kind.SYMBOLIC:
            self._symbolic(scope, node)
        elif kind is _nodes.Kind.SKIPPED:
            scope.values[node] = (None,)  # a check; with_effects' only result is the effect token
        elif kind is _nodes.Kind.HOP:
            self._hop(scope, node)
        else:
            assert step.call is not None
            self._op(scope, node, step.call, kind)

    def _op(self, scope: Scope, node: torch.fx.Node, call: Call, kind: _nodes.Kind) -> None:
        impl = call.impl
        self.used_impls[impl.label] = impl
        recorder = scope.recorder
        self._stamp(recorder, node, str(impl.op), impl.pack, impl.name, impl.label, scope.outer)
        first = len(recorder.added)
        args = [self._argument(scope, a, i in call.int_lists) for i, a in enumerate(call.args)]
        kwargs = {k: self._argument(scope, v, k in call.int_lists) for k, v in call.kwargs.items()}
        memoized = scope.outer is None and recorder.graph is self.main_graph and impl.pack in MEMO_PACKS
        described = Memo.describe(impl, args, kwargs) if memoized else None
        replayed, result = self._memo.replay(recorder, *described) if described is not None else (False, None)
        if not replayed:
            start = len(recorder.added)
            try:
                result = impl.function(*args, **kwargs)
            except ExportError as e:
                raise ExportError(f"{call_site(node, impl)}: {e}") from e
            except Exception as e:
                missing = missing_schema(e)  # onnxscript's "Attribute X not found.": an op without a schema
                if missing is not None:
                    raise ExportError(f"{call_site(node, impl)}: {schema_hint(*missing)}") from e
                raise ExportError(f"{call_site(node, impl)} raised {type(e).__name__}: {e}") from e
            if described is not None:
                self._memo.record(recorder, *described, recorder.added[start:], result)
        made = {id(n) for n in recorder.added[first:]}
        scope.values[node] = self._results(scope, node, impl, result, made)
        if scope.outer is None and scope.recorder.graph is self.main_graph:
            self.traces[node.name] = trace_of(scope.values[node], impl)
        if kind is _nodes.Kind.INPLACE:
            scope.values[node.args[0]] = scope.values[node]  # later reads of self see the mutation

    @staticmethod
    def _stamp(
        recorder: GraphRecorder,
        node: torch.fx.Node,
        torch_op: str,
        pack: str,
        impl: str,
        label: str,
        outer: torch.fx.Node | None = None,
    ) -> None:
        recorder.emitter = label
        recorder.name_prefix = node.name
        recorder.metadata = _nodes.provenance(node, torch_op, pack, impl, outer)

    def _results(self, scope: Scope, node: torch.fx.Node, impl: Impl, result: Any, made: set[int]) -> Any:
        meta = node.meta.get("val")
        site = call_site(node, impl)
        if isinstance(meta, (list, tuple)):
            if not isinstance(result, (list, tuple)) or len(result) != len(meta):
                got = len(result) if isinstance(result, (list, tuple)) else 1
                raise ExportError(f"{site} returned {got} value(s); the op has {len(meta)} outputs")
            read = self._outputs_read(node)  # an output nothing reads may be a placeholder: not checked
            return tuple(
                self._result(scope, f"{node.name}_{i}", r, m, made, f"{site}, output {i}")
                if m is not None and (read is None or i in read)
                else None
                for i, (r, m) in enumerate(zip(result, meta, strict=True))
            )
        if isinstance(result, (list, tuple)):
            if len(result) != 1:
                raise ExportError(f"{site} returned {len(result)} values; the op has one output")
            result = result[0]
        return self._result(scope, node.name, result, meta, made, site)

    def _result(self, scope: Scope, name: str, value: Any, meta: Any, made: set[int], site: str) -> ir.Value:
        """The impl's result ``value`` for the op output ``meta`` describes, checked against it
        (a missing result, or a dtype or rank torch's meta result contradicts, is the impl's
        error, named with its pack), then named and typed from ``meta``."""
        check_returned(value, meta, name, site)
        if not isinstance(value, ir.Value):
            value = scope.recorder.constant(value, None if meta is None else dtype_of(meta))
        check_result(value, meta, site)
        producer = value.producer()
        if producer is not None and id(producer) in made and producer.op_type != "Constant":
            value.name = scope.recorder.claim(name)
        self._describe(value, meta)
        return value

    def _outputs_read(self, node: torch.fx.Node) -> set[int] | None:
        """The indices of ``node``'s outputs its users read (``None``: a user takes the whole tuple)."""
        read = set()
        for user in node.users:
            step = self.plan.steps.get(user)
            if step is None or step.kind is not _nodes.Kind.GETITEM:
                return None
            read.add(user.args[1])
        return read

    def _argument(self, scope: Scope, value: Any, int_list: bool) -> Any:
        if isinstance(value, torch.fx.Node):
            return scope.values[value]
        if isinstance(value, (list, tuple)):
            items = [self._argument(scope, v, False) for v in value]
            if int_list and any(isinstance(v, ir.Value) for v in items):
                return self._int_list(scope.recorder, items)
            return items
        if isinstance(value, torch.dtype):
            return int(tensor_adapters.from_torch_dtype(value))
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            return None
        if isinstance(value, torch.Tensor) and value.is_complex():
            constant = scope.recorder.constant(torch.view_as_real(value.detach().cpu().resolve_conj()).numpy(), None)
            constant.meta[COMPLEX_KEY] = True
            return constant
        if isinstance(value, torch.Tensor):
            return scope.recorder.constant(value.detach().cpu().numpy(), None)
        return value

    def _int_list(self, recorder: GraphRecorder, items: Sequence[Any]) -> ir.Value:
        """A 1-D INT64 tensor from a list mixing ints and symbolic (scalar INT64) sizes: one
        Concat of the sizes (each as ``[n]``) and the runs of ints between them (one constant each)."""
        parts: list[ir.Value] = []
        ints: list[int] = []
        for item in items:
            if not isinstance(item, ir.Value):
                ints.append(int(item))
                continue
            if ints:
                parts.append(recorder.constant(ints, ir.DataType.INT64))
                ints = []
            parts.append(self._as_vector(recorder, item))
        if ints:
            parts.append(recorder.constant(ints, ir.DataType.INT64))
        node = recorder.add_node("", "Concat", parts, [ir.AttrInt64("axis", 0)], 1, self.target.onnx)
        return node.outputs[0]

    def _as_vector(self, recorder: GraphRecorder, size: ir.Value) -> ir.Value:
        """A symbolic size as a 1-element vector: the ``[n]`` it was squeezed from when there is
        one (``sym_size`` is ``Squeeze(Shape(x, start, end))``), else an Unsqueeze of it."""
        if size.shape is None or len(size.shape) != 0:
            return size
        producer = size.producer()
        if producer is not None and producer.op_type == "Squeeze" and producer.domain == "":
            source = producer.inputs[0]
            if source is not None and source.shape is not None and list(source.shape) == [1]:
                return source
        axes = recorder.constant([0], ir.DataType.INT64)
        return recorder.add_node("", "Unsqueeze", [size, axes], [], 1, self.target.onnx).outputs[0]

    # -- symbolic sizes ------------------------------------------------------------------------

    def _symbolic(self, scope: Scope, node: torch.fx.Node) -> None:
        meta = node.meta.get("val")
        if isinstance(meta, (int, float, bool)) and not isinstance(meta, torch.SymInt):
            scope.values[node] = meta  # torch specialised it
            return
        recorder = scope.recorder
        name = getattr(node.target, "__name__", str(node.target))
        self._stamp(recorder, node, name, _nodes.EXPORTER, name, "<exporter>", scope.outer)
        operands = [self._value(scope, a) for a in node.args]
        operands = [recorder.constant(v, scalar_dtype(v)) if not isinstance(v, ir.Value) else v for v in operands]
        op_type, cast = _nodes.SYMBOLIC_OPS[node.target]
        if cast is not None:
            operands = [self._cast(recorder, v, cast) for v in operands]
        elif len(operands) == 2 and operands[0].dtype != operands[1].dtype:
            operands = [self._cast(recorder, v, ir.DataType.FLOAT) for v in operands]
        result = recorder.add_node("", op_type, operands, [], 1, self.target.onnx).outputs[0]
        if isinstance(meta, torch.SymInt) and result.dtype == ir.DataType.FLOAT:  # math.floor/ceil of a float
            result = self._cast(recorder, result, ir.DataType.INT64)
        result.name = recorder.claim(node.name)
        self._describe(result, meta)
        scope.values[node] = result

    def _cast(self, recorder: GraphRecorder, value: ir.Value, dtype: ir.DataType) -> ir.Value:
        if value.dtype == dtype:
            return value
        node = recorder.add_node("", "Cast", [value], [ir.AttrInt64("to", int(dtype))], 1, self.target.onnx)
        return node.outputs[0]
