"""What each FX node is, and where it came from: the one place planning reads a
captured graph from.

:func:`classify` sorts a ``call_function`` node into a :class:`Kind`; the
higher-order ops opreg translates are described by :data:`HOPS` (which of
their arguments are subgraphs and which operands); :func:`provenance` and
:func:`where` say which module and source line made a node.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import operator
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import onnx_ir as ir
import torch

from opreg.registry.opname import OpName

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

METADATA_ONLY = frozenset({"aten::detach_"})
"""In-place ops that change only autograd metadata: translated by their functional form (Identity)
wherever they sit, views included, since no value any node reads changes."""

SYMBOLIC_OPS: dict[Callable[..., Any], tuple[str, ir.DataType | None]] = {
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
    operator.and_: ("And", ir.DataType.BOOL),  # of symbolic bools (torch._check's conditions)
    operator.or_: ("Or", ir.DataType.BOOL),
    torch.sym_float: ("Identity", ir.DataType.FLOAT),
    torch.sym_int: ("Identity", ir.DataType.INT64),  # Cast to an integer truncates towards zero, as int() does
    math.trunc: ("Identity", ir.DataType.INT64),
    math.floor: ("Floor", ir.DataType.FLOAT),  # the float result is cast to the size's integer type
    math.ceil: ("Ceil", ir.DataType.FLOAT),
    torch.sym_max: ("Max", None),
    torch.sym_min: ("Min", None),
    torch.sym_not: ("Not", ir.DataType.BOOL),
    torch.sym_sum: ("Add", None),  # sym_sum(SymInt[] args): Add folded over the list (ONNX's Sum takes floats only)
    torch.sym_ite: ("Where", None),  # sym_ite(SymBool b, t, f): b is made BOOL, t and f as two operands
}
"""Python operators on symbolic sizes that torch.export leaves in the graph, as the
ONNX op that computes them and the type their operands are cast to first: every
``torch.sym_*`` function torch.onnx translates (``sym_float``, ``sym_max``, ``sym_min``,
``sym_not``, ``sym_sum``, ``sym_ite``), and ``sym_int``."""

WITH_EFFECTS = torch.ops.higher_order.with_effects
"""Wraps an op with side effects, threading a token; only skipped checks are supported."""

PROVENANCE_KEYS = ("opreg.torch_op", "opreg.pack", "opreg.impl", "opreg.module", "opreg.source")
"""``metadata_props`` every node carries: torch op, pack, impl, module path, source line."""
TORCH_OP_KEY, PACK_KEY, IMPL_KEY, MODULE_KEY, SOURCE_KEY = PROVENANCE_KEYS
REWRITE_KEY = "opreg.rewrite"
"""``metadata_props`` of a node a pack's rewrite rule made: ``pack:rule`` (``+``-joined when
rules rewrote what earlier rules made); its other keys join those of the nodes it replaced."""
EXPORTER = "opreg"
"""The pack name nodes the exporter itself makes carry (symbolic sizes, control flow)."""


class Kind(enum.Enum):
    """What a ``call_function`` node asks of the exporter."""

    OP = "a torch op: translated by the impl the registry resolves"
    INPLACE = "an in-place torch op: translated by its functional form's impl"
    HOP = "a higher-order op: its subgraphs are translated by the same registry"
    GETITEM = "an item of a multi-output node's result"
    SYMBOLIC = "Python arithmetic on symbolic sizes"
    SKIPPED = "a runtime check: nothing to translate"
    UNSUPPORTED = "a call opreg cannot translate"


# -- higher-order ops ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Hop:
    """How to read one higher-order op's node.

    Fields:
        name: the HOP's name (``cond``, ``while_loop``, ...).
        subgraphs: ``(role, argument index)`` of each subgraph argument.
        inline: the HOP only sets a context (no-grad, autocast off, a reused
            subgraph); its body is translated in place of the node, on the
            node's arguments from index ``operands`` on.
        needs_decomposition: ``predicate(node)`` for nodes whose meaning
            ``torch.export``'s decomposition must spell out first (autocast on).
    """

    name: str
    subgraphs: tuple[tuple[str, int], ...]
    inline: bool = False
    operands: int = 0
    needs_decomposition: Callable[[torch.fx.Node], bool] | None = None


def _autocast_on(node: torch.fx.Node) -> bool:
    # wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *args)
    return bool(node.args[2])


def _higher_order(name: str) -> Any:
    return getattr(torch.ops.higher_order, name, None)


HOPS: dict[Any, Hop] = {
    op: hop
    for op, hop in (
        (_higher_order("cond"), Hop("cond", (("true branch", 1), ("false branch", 2)))),
        (_higher_order("while_loop"), Hop("while_loop", (("condition", 0), ("body", 1)))),
        (_higher_order("scan"), Hop("scan", (("combine", 0),))),
        (_higher_order("map_impl"), Hop("map", (("body", 0),))),
        # invoke_subgraph(subgraph, identifier, *operands)
        (_higher_order("invoke_subgraph"), Hop("invoke_subgraph", (("subgraph", 0),), inline=True, operands=2)),
        # wrap_with_set_grad_enabled(enabled, body, *operands)
        (
            _higher_order("wrap_with_set_grad_enabled"),
            Hop("wrap_with_set_grad_enabled", (("body", 1),), inline=True, operands=2),
        ),
        # wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands)
        (
            _higher_order("wrap_with_autocast"),
            Hop("wrap_with_autocast", (("body", 4),), inline=True, operands=5, needs_decomposition=_autocast_on),
        ),
    )
    if op is not None
}
"""The higher-order ops opreg translates, by their operator."""


def subgraph_module(node: torch.fx.Node, index: int) -> torch.fx.GraphModule:
    """The ``GraphModule`` a HOP node's argument ``index`` names (a ``get_attr`` node)."""
    arg = node.args[index]
    if isinstance(arg, torch.fx.GraphModule):
        return arg
    owner = node.graph.owning_module
    assert isinstance(arg, torch.fx.Node) and arg.op == "get_attr" and owner is not None
    return operator.attrgetter(arg.target)(owner)


def subgraphs(node: torch.fx.Node) -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """``(role, module)`` of each subgraph of a HOP node opreg translates."""
    hop = HOPS[node.target]
    for role, index in hop.subgraphs:
        yield role, subgraph_module(node, index)


# -- classification -------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def op_name(op: torch._ops.OpOverload) -> OpName:
    """The :class:`OpName` of a torch op overload (parsed once per op)."""
    return OpName.of(op)


def draws_random(node: torch.fx.Node) -> bool:
    """Whether ``node`` draws random numbers: a seeded op whose dropout, if it has one, is on."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    schema = target._schema
    bound = {a.name: a.default_value if a.has_default_value() else None for a in schema.arguments}
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args):
            bound[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            bound[argument.name] = node.kwargs[argument.name]
    if "dropout_p" in bound:  # attention: random only while dropping
        return bound["dropout_p"] not in (0, 0.0, None)
    if "train" in bound:  # native_dropout(input, p, train)
        return bool(bound["train"]) and bound.get("p") not in (0, 0.0)
    return True


def classify(node: torch.fx.Node) -> Kind:
    """What a ``call_function`` node is (see :class:`Kind`)."""
    fn = node.target
    if fn is operator.getitem:
        return Kind.GETITEM
    if fn in SYMBOLIC_OPS:
        return Kind.SYMBOLIC
    if fn is WITH_EFFECTS:
        inner = node.args[1]
        if isinstance(inner, torch._ops.OpOverload) and str(op_name(inner)) in SKIPPED_OPS:
            return Kind.SKIPPED
        return Kind.UNSUPPORTED
    if fn in HOPS:
        return Kind.HOP
    if not isinstance(fn, torch._ops.OpOverload):
        return Kind.UNSUPPORTED
    if str(op_name(fn)) in SKIPPED_OPS:
        return Kind.SKIPPED
    if fn._schema.is_mutable:
        return Kind.INPLACE if functional_form(node) is not None else Kind.UNSUPPORTED
    return Kind.OP


def unsupported_reason(node: torch.fx.Node) -> str:
    """Why :func:`classify` says ``UNSUPPORTED``."""
    fn = node.target
    if fn is WITH_EFFECTS:
        return "opreg cannot translate ops with side effects (they thread an effect token)"
    if isinstance(fn, torch._ops.OpOverload):
        return (
            "it mutates an input the graph still reads elsewhere (or a view of one); torch's decomposition "
            "makes such graphs functional"
        )
    if isinstance(fn, torch._ops.HigherOrderOperator):
        return f"opreg has no translation of the higher-order op {fn.__name__}"
    return "opreg translates torch ops; this is a Python or higher-order call torch.export left in"


def functional_form(node: torch.fx.Node) -> OpName | None:
    """For an in-place op (``relu_``, ``add_.Tensor``) that only rebinds its first
    argument, the functional op that computes the same value (``relu``, ``add.Tensor``);
    ``None`` when translating it functionally would change what the graph reads.

    Safe when the op mutates only ``self``, returns it, ``self`` is made inside
    the graph (not an input, weight or buffer), and every other read of
    ``self`` comes after the mutation (the translator rebinds ``self`` to the
    result) and no view of ``self`` was taken before it.
    """
    schema = node.target._schema
    name = schema.name.partition("::")[2]
    if not name.endswith("_") or name.startswith("_") or not schema.arguments:
        return None
    if schema.name in METADATA_ONLY:  # the data is untouched: what reads self, through views or not, sees no change
        return OpName(schema.name.partition("::")[0], name[:-1], schema.overload_name or "default")
    functional = functional_op(node.target)
    if functional is None or not node.args:
        return None
    target = node.args[0]
    if not isinstance(target, torch.fx.Node) or target.op != "call_function":
        return None  # an input, a weight or a buffer: the mutation would reach past this graph's values
    if aliases(target) and not _unseen_view(target):
        return None  # a view of a tensor something else reads: it would see the mutation
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    for user in target.users:
        if user is node:
            continue
        if order[user] < order[node] and views(user, target):
            return None
    return functional


def functional_op(op: torch._ops.OpOverload) -> OpName | None:
    """The functional op of an in-place op that writes its first argument and nothing else
    (``copy_`` -> ``copy``, ``fill_.Tensor`` -> ``fill.Tensor``), when torch has it; else ``None``."""
    schema = op._schema
    namespace, _, name = schema.name.partition("::")
    if not name.endswith("_") or name.startswith("_") or not schema.arguments:
        return None
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(written) != 1 or written[0] is not schema.arguments[0]:
        return None
    try:
        torch._C._get_schema(f"{namespace}::{name[:-1]}", schema.overload_name)
    except RuntimeError:
        return None
    return OpName(namespace, name[:-1], schema.overload_name or "default")


def aliases(node: torch.fx.Node) -> bool:
    """Whether ``node``'s result may be a view of its inputs (so it would see a later mutation).
    ``to`` returns its input only when nothing changes: a ``to`` whose dtype differs copies (GPT-OSS
    reads its expert ids ``.float()`` before clamping them in place)."""
    fn = node.target
    if isinstance(fn, torch._ops.OpOverload):
        if fn.overloadpacket is torch.ops.aten.to and _converts(node):
            return False
        return any(r.alias_info is not None for r in fn._schema.returns)
    return fn is not operator.getitem and node.op == "call_function"


def _unseen_view(view: torch.fx.Node) -> bool:
    """Whether ``view`` views, through views of its first argument, a tensor the graph made that
    nothing else reads: each tensor on the way is read by the next view alone (DeBERTa divides its
    queries in place after ``permute(view(linear))``). A mutation through it is then seen only
    through ``view``."""
    node = view
    while aliases(node):
        base = node.args[0] if node.args else None
        if not isinstance(base, torch.fx.Node) or base.op != "call_function" or len(base.users) != 1:
            return False
        if not views(node, base) or any(views(node, a) for a in node.all_input_nodes if a is not base):
            return False
        node = base
    return True


def views(node: torch.fx.Node, base: torch.fx.Node) -> bool:
    """Whether ``node``'s result may be a view of ``base``: :func:`aliases`, and ``base`` is an
    argument its schema says the result may alias (``expand_as(mask, scores)`` is a view of the
    mask, never of the scores that give it its shape: XLM masks its scores in place after it)."""
    if not aliases(node):
        return False
    fn = node.target
    if not isinstance(fn, torch._ops.OpOverload):
        return True
    sets = {s for r in fn._schema.returns if r.alias_info is not None for s in r.alias_info.after_set}
    for index, argument in enumerate(fn._schema.arguments):
        if argument.alias_info is None or not sets & set(argument.alias_info.before_set):
            continue
        value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
        if value is base or (isinstance(value, (list, tuple)) and base in value):
            return True
    return False


def _converts(node: torch.fx.Node) -> bool:
    """Whether a ``to`` node's result has another dtype than its input (so it is a copy)."""
    source, result = node.args[0], node.meta.get("val")
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and isinstance(result, torch.Tensor) and value.dtype != result.dtype


def torch_op(node: torch.fx.Node, kind: Kind | None = None) -> OpName:
    """The op whose impl translates an ``OP`` or ``INPLACE`` node (``kind``: the node's, when known)."""
    if (kind or classify(node)) is Kind.INPLACE:
        functional = functional_form(node)
        assert functional is not None
        return functional
    return op_name(node.target)


# -- where a node came from -------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__)
_OPREG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def _meta(node: torch.fx.Node, key: str, outer: torch.fx.Node | None) -> Any:
    """``node.meta[key]``, or the enclosing higher-order op node's when the subgraph's node lacks it."""
    value = node.meta.get(key)
    if not value and outer is not None:
        value = outer.meta.get(key)
    return value


def module_path(node: torch.fx.Node, outer: torch.fx.Node | None = None) -> str:
    """The dotted path of the innermost module that made ``node`` (``""`` for the root);
    ``outer`` is the higher-order op node whose subgraph holds ``node``, if any."""
    stack = _meta(node, "nn_module_stack", outer) or {}
    path = ""
    for value in stack.values():
        if isinstance(value, tuple) and value and isinstance(value[0], str) and not value[0].startswith("_empty"):
            path = value[0]
    return _clean_path(path)


def module_type(node: torch.fx.Node, outer: torch.fx.Node | None = None) -> str:
    stack = _meta(node, "nn_module_stack", outer) or {}
    kind = ""
    for value in stack.values():
        if isinstance(value, tuple) and len(value) > 1 and not str(value[0]).startswith("_empty"):
            kind = value[1] if isinstance(value[1], str) else getattr(value[1], "__qualname__", str(value[1]))
    return kind.rsplit(".", 1)[-1]


def _clean_path(path: str) -> str:
    # Strict-mode captures spell paths as L['self'].layers[0]; normalise to layers.0
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return re.sub(r"\[(?:'([^']*)'|(\d+))\]", lambda m: "." + (m.group(1) or m.group(2)), path).strip(".")


def source_line(node: torch.fx.Node, outer: torch.fx.Node | None = None) -> str:
    """``file:line`` of the innermost frame of the user's code that made ``node`` (torch's
    and opreg's own frames, and generated code such as ``<eval_with_key>``, are passed over)."""
    trace = _meta(node, "stack_trace", outer) or ""
    best = ""
    for match in _FRAME.finditer(trace):
        path = match.group("file")
        if path.startswith((_TORCH_DIR, _OPREG_DIR, "<")):
            continue
        best = f"{path}:{match.group('line')}"
    return best


def where(node: torch.fx.Node, context: str = "", outer: torch.fx.Node | None = None) -> str:
    """How a node's location is shown to people: module path and source line, and the
    subgraph it sits in (``context``, e.g. ``in the true branch of cond``)."""
    path = module_path(node, outer)
    kind = module_type(node, outer)
    parts = [f"{path or '<root>'} ({kind})" if kind else (path or "<root>")]
    line = source_line(node, outer)
    if line:
        parts.append(line)
    text = " at ".join(parts)
    return f"{text}, {context}" if context else text


def provenance(
    node: torch.fx.Node, torch_op: str, pack: str, impl: str, outer: torch.fx.Node | None = None
) -> dict[str, str]:
    """The ``metadata_props`` of the ONNX nodes made for ``node``."""
    values = (torch_op, pack, impl, module_path(node, outer), source_line(node, outer))
    return dict(zip(PROVENANCE_KEYS, values, strict=True))


# -- what translation made of each node, and reading it back ------------------------------


@dataclasses.dataclass
class Trace:
    """What translation made of one FX node of the main graph.

    Fields:
        values: the ONNX value of each of the node's outputs (``None`` where it has none).
        names: their names when translation ended (a pass may replace a value by another
            of the same name).
        impl: the impl that translated it (``None`` for control flow, made by the exporter).
    """

    values: tuple[ir.Value | None, ...]
    names: tuple[str | None, ...] = ()
    impl: Any = None

    def snapshot(self) -> None:
        self.names = tuple(v.name if v is not None else None for v in self.values)


def trace_of(result: Any, impl: Any) -> Trace:
    """The :class:`Trace` of an FX node whose translated value is ``result`` (a value or a tuple)."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return Trace(tuple(v if isinstance(v, ir.Value) else None for v in items), impl=impl)


def read_provenance(node: ir.Node) -> dict[str, str]:
    """The provenance of an ONNX node (torch op, pack, impl, module, source, rewrite), whatever
    form the model stores it in: the one accessor the locator reads it through."""
    props = node.metadata_props
    keys = (*PROVENANCE_KEYS, REWRITE_KEY)
    return {key.removeprefix("opreg."): props[key] for key in keys if props.get(key)}
