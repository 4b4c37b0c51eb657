"""A model's repeated layers captured once: the capture traces the first layers, and the
translated graph of each later layer is a copy of an earlier layer of the same kind, on its own
weights and its own inputs and outputs (a decoder layer's cache; a Whisper decoder layer's
cross-attention keys and values; none for an encoder's or a vision tower's layer).

torch.export's capture costs about a third of a second of CPU per decoder layer (the fake-tensor
and symbolic-shape bookkeeping of each op), most of an export of a deep model; translating and
finishing cost far less. The layers of a decoder are mostly alike, so:

1. :func:`plan_layers` finds the model's layer list (the ``ModuleList`` of ``num_layers``
   modules of one class, or the one at the path given) and sorts its layers into kinds by a
   fingerprint of their structure: classes, parameter and buffer shapes, and every plain
   attribute but the layer's own index (an attention type, a sliding window, a MoE or dense MLP
   differ by these), and what the caller says the model's own code does differently by index
   (a vision tower's full-attention blocks). The captured
   prefix is the shortest run of first layers in which every kind of a later layer occurs at
   a position of 1 or more (so that its input from the layer before is known): one or two layers
   for most models. Where the caller knows that a layer reads nothing of the layers before it
   but the hidden state (Whisper's, a transformers class opreg lays out itself), layer 0 may be
   the template: one layer is captured.
2. :func:`prefix_only` gives the model that prefix as its layer list for the capture.
3. :func:`repeat_layers` (a rework of :func:`opreg.exporter.run_export`, between translation
   and finishing) copies, for each later layer, the nodes of its kind's captured layer: the
   hidden state from the layer before, its own graph inputs and outputs (its cache), its own
   weights, the values all layers share (mask, rotary tables, sizes) as they are. Fusions and every finishing
   pass then run on the whole graph.
4. Where the caller can call the model with the prefix's own inputs only (a decoder: the cache of
   the captured layers, :class:`Trimmed`), torch.export sees only those, and
   :func:`repeat_layers` adds the other layers' graph inputs and outputs (copies of their
   template's) and the whole call's specs, which the finished program takes
   (``Translation.call``): each uncaptured layer's cache would cost the capture about 0.02 s.

Where the translated graph is not of that shape (nodes with subgraphs, more than one value
carried from layer to layer, a layer's value read beyond the next layer, two captured layers of
one kind that translate differently) the copy is refused, and the model is captured whole.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch
from onnx_ir import tensor_adapters

from opreg.exporter._nodes import MODULE_KEY

logger = logging.getLogger(__name__)

ROOT = "model"
"""The attribute of the captured module (``opreg.llm._decoder.DecoderStep``) holding the causal LM."""
INDEX_ATTRIBUTES = frozenset({"layer_idx", "layer_id", "layer_number", "layer_index"})
"""A layer's own index, which differs from layer to layer by definition (it picks the cache entry)."""
_PLAIN = (int, float, str, bool, type(None))
_SHAPE_OPS = frozenset({("", "Shape"), ("", "Size")})


class NotRepeatable(Exception):
    """The translated layers are not copies of each other in a way :func:`repeat_layers` can use."""


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """Which layers are captured and which are copied.

    Fields:
        path: the layer list's attribute path in the model (``"model.layers"``), the captured
            module's :data:`ROOT` attribute.
        layers: the layer modules, all of them, in order.
        prefix: how many first layers are captured.
        templates: for each layer from ``prefix`` on, the captured layer (at 1 or more) of its kind.
        inputs: each layer's own graph inputs, by index (a decoder layer's past key and value).
        outputs: each layer's own graph outputs, by index (its present key and value).
        kinds: each layer's kind (layers of one kind translate alike).
        first_template: the first layer that may be a template (1, or 0 where layers read
            nothing of the layers before them but the hidden state).
    """

    path: str
    layers: tuple[torch.nn.Module, ...]
    prefix: int
    templates: tuple[int, ...]
    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]
    kinds: tuple[str, ...]
    first_template: int = 1

    def template(self, layer: int) -> int:
        return self.templates[layer - self.prefix]

    def scope(self, layer: int) -> str:
        """The module path of layer ``layer`` in the captured module, as node provenance spells it."""
        return f"{ROOT}.{self.path}.{layer}"


def plan_layers(
    model: torch.nn.Module,
    num_layers: int,
    first_past: int | None = None,
    *,
    path: str | None = None,
    own: Callable[[int], tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
    differs: Callable[[int], object] | None = None,
    hidden_only: bool = False,
) -> LayerPlan | None:
    """The plan for ``model``'s ``num_layers`` layers, or ``None`` when capturing them all costs
    no more (no layer list found, or no layer after the prefix).

    ``path``: the layer list's attribute path (default: the largest list of ``num_layers``).
    Each layer's own graph inputs and outputs, by index: a decoder's past key and value from
    ``first_past`` (layer ``i``'s at ``first_past + 2 * i`` and ``+ 1``; its present key and
    value are outputs ``1 + 2 * i`` and ``2 + 2 * i``), else ``own(i)`` returns ``(inputs,
    outputs)`` (default: none). ``differs(i)``: what the model's own code does differently for
    layer ``i`` beyond the layer's structure (layers it tells apart are of different kinds).
    ``hidden_only``: each layer reads nothing of the layers before it but the hidden state, so
    layer 0 may be a template (one layer of a kind is captured, not two)."""
    found = _layer_list(model, num_layers, path)
    if found is None:
        return None
    path, layers = found
    if first_past is not None:
        own = functools.partial(_keys_and_values, first_past)
    slots = [own(index) if own is not None else ((), ()) for index in range(num_layers)]
    kinds = [_fingerprint(layer) + (f"|{differs(index)!r}" if differs else "") for index, layer in enumerate(layers)]
    first = 0 if hidden_only else 1
    for prefix in range(first + 1, num_layers):
        seen = set(kinds[first:prefix])
        if all(kind in seen for kind in kinds[prefix:]):
            last = {kind: index for index, kind in enumerate(kinds[:prefix]) if index >= first}
            templates = tuple(last[kind] for kind in kinds[prefix:])
            inputs, outputs = (tuple(tuple(slot[k]) for slot in slots) for k in (0, 1))
            return LayerPlan(path, tuple(layers), prefix, templates, inputs, outputs, tuple(kinds), first)
    return None


def _keys_and_values(first_past: int, layer: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A decoder layer's own inputs (its past key and value) and outputs (its present ones)."""
    return (first_past + 2 * layer, first_past + 2 * layer + 1), (1 + 2 * layer, 2 + 2 * layer)


def _layer_list(
    model: torch.nn.Module, num_layers: int, path: str | None = None
) -> tuple[str, list[torch.nn.Module]] | None:
    """The ``ModuleList`` of ``num_layers`` modules of one class at ``path``, else the one holding
    the most parameters."""
    best = None
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) != num_layers or not name:
            continue
        if path is not None and name != path:
            continue
        if len({type(layer) for layer in module}) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[0]:
            best = (size, name, list(module))
    return None if best is None else (best[1], best[2])


def _fingerprint(module: torch.nn.Module) -> str:
    """What the layer's traced graph depends on besides its weights' values and its index."""
    parts = []
    for name, sub in module.named_modules():
        attributes = []
        for key, value in sorted(vars(sub).items()):
            if key in INDEX_ATTRIBUTES or key in ("_parameters", "_buffers", "_modules"):
                continue
            attributes.append(f"{key}={_describe(value)}")
        parts.append(f"{name}:{type(sub).__qualname__}({','.join(attributes)})")
    tensors = [(n, tuple(t.shape), t.dtype) for n, t in (*module.named_parameters(), *module.named_buffers())]
    return "|".join(parts) + repr(tensors)


def _describe(value: Any) -> str:
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value):
        return repr(value)
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}{value.dtype}"
    return type(value).__qualname__  # a config, an activation, hooks: by kind


@contextlib.contextmanager
def prefix_only(model: torch.nn.Module, plan: LayerPlan) -> Iterator[None]:
    """``model`` with only the captured prefix in its layer list, for the ``with`` block."""
    parent_path, _, name = plan.path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    full = getattr(parent, name)
    setattr(parent, name, torch.nn.ModuleList(plan.layers[: plan.prefix]))
    try:
        yield
    finally:
        setattr(parent, name, full)


@dataclasses.dataclass(frozen=True)
class Trimmed:
    """A call of the captured module with the prefix's own inputs only, and the whole call's specs.

    Fields:
        kwargs: the capture's example keyword inputs (the other layers' own inputs left out).
        settings: the capture's export settings (their dynamic shapes trimmed alike).
        in_spec, out_spec: the pytree specs of the capture's call, ``(args, kwargs)`` and
            outputs, as torch.export must find them (else the copy is refused).
        whole: the whole call's ``(in_spec, out_spec)``.
        extra: the whole call's input leaves beyond the capture's (tensors, all after them).
    """

    kwargs: dict[str, Any]
    settings: Any
    in_spec: Any
    out_spec: Any
    whole: tuple[Any, Any]
    extra: range


Trim = Callable[[LayerPlan], contextlib.AbstractContextManager["Trimmed | None"]]
"""The caller's trimming of the call for a plan (``None``: it cannot), the module's own state
set for the prefix's inputs while the ``with`` block runs (:class:`Trimmed`)."""


def export_repeated(module: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any] | None, settings: Any,
                    plan: LayerPlan | Sequence[LayerPlan | None] | None, what: str,
                    lazy: Mapping[str, Any] | None = None, trim: Trim | None = None) -> Any:  # fmt: skip
    """The :class:`opreg.OnnxProgram` of ``module`` (its :data:`ROOT` attribute holding the layers
    of ``plan``), with the repeated layers captured once; all of them where ``plan`` is ``None`` or
    the copy would not do (``what``: the model, in the log). Several plans are tried in order, each
    one that differs from those before (the fewest layers captured first). ``lazy``: see
    :func:`repeat_layers`; ``trim``: the capture's call with the prefix's own inputs only
    (:data:`Trim`). What :func:`opreg.export` does, pack faults reported."""
    from opreg.errors import ExportError
    from opreg.exporter import faults_reported, run_export

    export = faults_reported(run_export)
    tried: set[tuple] = set()
    for candidate in plan if isinstance(plan, Sequence) else [plan]:
        if candidate is None or (candidate.prefix, candidate.templates) in tried:
            continue
        tried.add((candidate.prefix, candidate.templates))
        try:
            with prefix_only(getattr(module, ROOT), candidate), _trimmed(trim, candidate) as trimmed:
                rework = functools.partial(_rework, plan=candidate, lazy=lazy, trimmed=trimmed)
                if trimmed is not None:
                    return export(module, args, trimmed.kwargs, trimmed.settings, rework=rework)
                return export(module, args, kwargs, settings, rework=rework)
        except (NotRepeatable, ExportError) as e:
            logger.info("%s: the first %d of %d layers as templates would not do: %s", what, candidate.prefix,
                        len(candidate.layers), e)  # fmt: skip
    return export(module, args, kwargs, settings)


@contextlib.contextmanager
def _trimmed(trim: Trim | None, plan: LayerPlan) -> Iterator[Trimmed | None]:
    """``trim(plan)``'s trimmed call while the block runs; ``None`` without ``trim``."""
    if trim is None:
        yield None
        return
    with trim(plan) as trimmed:
        yield trimmed


def _rework(translation: Any, program: Any, *, plan: LayerPlan, lazy: Mapping[str, Any] | None,
            trimmed: Trimmed | None) -> Any:  # fmt: skip
    if trimmed is None:
        return repeat_layers(translation, plan, lazy)
    from opreg.exporter._capture import input_leaves

    if (program.call_spec.in_spec, program.call_spec.out_spec) != (trimmed.in_spec, trimmed.out_spec):
        raise NotRepeatable("torch.export took the trimmed call in another structure than expected")
    call = (*trimmed.whole, (*input_leaves(program), *trimmed.extra))
    return repeat_layers(_widened(translation, plan), plan, lazy, call)


# -- copying translated layers ----------------------------------------------------------------


@dataclasses.dataclass
class _Layer:
    """A captured layer's nodes and how they connect: the value carried in from the layer
    before (``None`` for layer 0), the one it passes on, its own graph outputs (its present
    key and value)."""

    nodes: list[ir.Node]
    carried_in: ir.Value | None
    carried_out: ir.Value | None
    present: tuple[ir.Value, ...]


def repeat_layers(
    translation: Any, plan: LayerPlan, lazy: Mapping[str, Any] | None = None, call: tuple | None = None
) -> Any:
    """``translation`` of the prefix, with every later layer's nodes, weights, cache inputs and
    outputs added as copies of its template (:class:`NotRepeatable` where the graph is not of
    the shape this needs). ``lazy``: the lazy value of each ``meta``-device weight by its name in
    the captured module (:func:`opreg.weights.bind`), for a model streamed from its checkpoint.
    ``call``: the whole call's ``(in_spec, out_spec, input leaves)``, for a translation :func:`_widened`."""
    graph = translation.graph
    hidden = _hidden_dependent(graph)
    captured = _captured_layers(translation, plan, hidden)
    kinds: dict[str, list[int]] = collections.defaultdict(list)
    for index in range(plan.first_template, plan.prefix):
        kinds[plan.kinds[index]].append(index)
    for first, *others in kinds.values():
        expected = _signature(captured[first], plan, first)
        for other in others:
            if _signature(captured[other], plan, other) != expected:
                raise NotRepeatable(f"captured layers {first} and {other}, of one kind, translate differently")
    last = captured[plan.prefix - 1]
    inside = set(last.nodes)
    uses = [(node, index) for node, index in last.carried_out.uses() if node not in inside]  # the final norm's
    weights = set(translation.weights)
    carried = last.carried_out
    made: list[ir.Node] = []
    outputs = list(translation.outputs)
    for layer in range(plan.prefix, len(plan.layers)):
        template = plan.template(layer)
        nodes, carried, present = _copy(
            graph, captured[template], plan, (template, layer), carried, weights, lazy or {}
        )
        made += nodes
        for index, value in zip(plan.outputs[layer], present, strict=True):
            outputs[index] = value
    graph.insert_after(last.nodes[-1], made)
    for node, index in uses:  # the final norm reads the last layer's output
        node.replace_input_with(index, carried)
    logger.info("captured the first %d of %d layers; the others are copies (%s)", plan.prefix, len(plan.layers),
                plan.path)  # fmt: skip
    return dataclasses.replace(translation, outputs=outputs, weights=frozenset(weights), call=call)


def _widened(translation: Any, plan: LayerPlan) -> Any:
    """``translation`` of a call with the prefix's own inputs only, given the other layers' own
    graph inputs (typed as their template's) and room for their own outputs (filled by
    :func:`repeat_layers`): both must follow the capture's, in order."""
    graph = translation.graph
    later = range(plan.prefix, len(plan.layers))
    wanted = sorted(index for layer in later for index in plan.inputs[layer])
    if translation.state or wanted != list(range(len(graph.inputs), len(graph.inputs) + len(wanted))):
        raise NotRepeatable("the uncaptured layers' own inputs do not follow the captured call's")
    outputs = sorted(index for layer in later for index in plan.outputs[layer])
    if outputs != list(range(len(translation.outputs), len(translation.outputs) + len(outputs))):
        raise NotRepeatable("the uncaptured layers' own outputs do not follow the captured call's")
    sources = {}
    for layer in later:
        template = plan.inputs[plan.template(layer)]
        pairs = zip(template, plan.inputs[layer], strict=True)
        sources.update({mine: (graph.inputs[theirs], layer) for theirs, mine in pairs})
    names = list(translation.input_names)
    for index in wanted:
        source, layer = sources[index]
        value = ir.Value(name=f"{source.name}__{layer}", type=source.type, shape=source.shape)
        graph.inputs.append(value)
        names.append(value.name)
    return dataclasses.replace(translation, input_names=names, outputs=[*translation.outputs, *[None] * len(outputs)])


def _hidden_dependent(graph: ir.Graph) -> set[ir.Value]:
    """The values that depend on the token ids' values (not only on shapes): the hidden state
    and what is computed from it, as opposed to masks, positions, sizes and tables."""
    ids = graph.inputs[0]
    marked = {ids}
    for node in graph:
        if (node.domain, node.op_type) in _SHAPE_OPS:
            continue
        if any(value in marked for value in node.inputs if value is not None):
            marked.update(node.outputs)
    return marked


def _captured_layers(translation: Any, plan: LayerPlan, hidden: set[ir.Value]) -> list[_Layer]:
    graph = translation.graph
    members: dict[int, list[ir.Node]] = collections.defaultdict(list)
    for node in graph:
        module = node.metadata_props.get(MODULE_KEY, "")
        for layer in range(plan.prefix):
            scope = plan.scope(layer)
            if module == scope or module.startswith(scope + "."):
                members[layer].append(node)
                break
    layers = []
    for layer in range(plan.prefix):
        nodes = members.get(layer)
        if not nodes:
            raise NotRepeatable(f"no node of layer {layer} found")
        inside = set(nodes)
        for node in nodes:
            for attribute in node.attributes.values():
                if attribute.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                    raise NotRepeatable(f"layer {layer} holds a {node.op_type} with a subgraph")
        carried_in = _carried_in(nodes, inside, layers[-1] if layers else None, hidden, layer, plan.first_template)
        present = tuple(translation.outputs[index] for index in plan.outputs[layer])
        if any(not isinstance(v, ir.Value) or v.producer() not in inside for v in present):
            raise NotRepeatable(f"layer {layer}'s own outputs (its present key and value) are not made by its nodes")
        leaving = {
            value for node in nodes for value in node.outputs
            if value in hidden and value not in present and any(user not in inside for user, _ in value.uses())
        }  # fmt: skip
        if len(leaving) != 1:
            raise NotRepeatable(f"layer {layer} passes on {len(leaving)} values computed from the tokens, not 1")
        layers.append(_Layer(nodes, carried_in, leaving.pop(), present))
    return layers


def _carried_in(
    nodes: Sequence[ir.Node],
    inside: set[ir.Node],
    before: _Layer | None,
    hidden: set[ir.Value],
    layer: int,
    first_template: int,
) -> ir.Value | None:
    """The value layer ``layer`` reads from the layer before (the hidden state); layer 0's, the
    hidden state it reads, only where it may be a template (``first_template`` 0)."""
    entering = {
        value for node in nodes for value in node.inputs
        if value is not None and value in hidden and value.producer() not in inside
    }  # fmt: skip
    if before is None:
        if first_template > 0:
            return None
        if len(entering) != 1:
            raise NotRepeatable(f"layer 0 reads {len(entering)} values computed from the inputs, not 1")
        return next(iter(entering))
    if entering != {before.carried_out}:
        raise NotRepeatable(f"layer {layer} reads {len(entering)} values computed from the tokens besides its own")
    return before.carried_out


def _signature(layer: _Layer, plan: LayerPlan, index: int) -> list[tuple]:
    """A captured layer's nodes as ops, attributes and where each input comes from, without
    names: two layers of one kind must give the same."""
    position = {value: (n, k) for n, node in enumerate(layer.nodes) for k, value in enumerate(node.outputs)}
    prefix = plan.scope(index) + "."
    rows = []
    for node in layer.nodes:
        sources = []
        for value in node.inputs:
            if value is None:
                sources.append(None)
            elif value in position:
                sources.append(position[value])
            elif value is layer.carried_in:
                sources.append("carried")
            elif value.is_initializer() and (value.name or "").startswith(prefix):
                sources.append(("weight", value.name[len(prefix) :], value.dtype, str(value.shape)))
            elif value.is_graph_input():
                sources.append(("input", _input_slot(plan, value, index)))
            else:
                sources.append(("shared", id(value)))
        attributes = sorted((a.name, repr(a.value)) for a in node.attributes.values())
        rows.append((node.domain, node.op_type, tuple(sources), tuple(attributes)))
    return rows


def _input_slot(plan: LayerPlan, value: ir.Value, layer: int) -> Any:
    """``("own", k)`` for the layer's own ``k``-th input (its past key, value), else the input
    itself (shared)."""
    index = list(value.graph.inputs).index(value)
    own = plan.inputs[layer]
    return ("own", own.index(index)) if index in own else ("shared", index)


def _copy(
    graph: ir.Graph,
    template: _Layer,
    plan: LayerPlan,
    layers: tuple[int, int],
    carried: ir.Value,
    weights: set[str],
    lazy: Mapping[str, Any],
) -> tuple[list[ir.Node], ir.Value, tuple[ir.Value, ...]]:
    """Layer ``layer``'s nodes, copied from captured layer ``source`` (``layers``): the nodes, the
    value it passes on, its own outputs (present key and value)."""
    source, layer = layers
    inputs = list(graph.inputs)
    mapping: dict[ir.Value, ir.Value] = {template.carried_in: carried}
    for theirs, mine in zip(plan.inputs[source], plan.inputs[layer], strict=True):
        mapping[inputs[theirs]] = inputs[mine]
    old_scope, new_scope = plan.scope(source), plan.scope(layer)
    made = []
    for node in template.nodes:
        new_inputs = []
        for value in node.inputs:
            if value is not None and value not in mapping and value.is_initializer():
                name = value.name or ""
                if name.startswith(old_scope + "."):
                    own = _weight(graph, plan, value, name[len(old_scope) + 1 :], layer, lazy)
                    if own is None and name in weights:
                        raise NotRepeatable(f"layer {layer} has no {name[len(old_scope) + 1 :]}")
                    mapping[value] = own or value  # a constant lifted from the layer's code: the same for all
                    if own is not None and name in weights:
                        weights.add(own.name)
            new_inputs.append(mapping.get(value, value) if value is not None else None)
        module = node.metadata_props.get(MODULE_KEY, "")
        metadata = dict(node.metadata_props)
        metadata[MODULE_KEY] = new_scope + module[len(old_scope) :]
        copy = ir.Node(
            node.domain, node.op_type, new_inputs, list(node.attributes.values()), overload=node.overload,
            num_outputs=len(node.outputs), version=node.version, metadata_props=metadata,
        )  # fmt: skip
        for old, new in zip(node.outputs, copy.outputs, strict=True):
            new.name = None if old.name is None else f"{old.name}__{layer}"
            new.type, new.shape = old.type, old.shape
            mapping[old] = new
        made.append(copy)
    return made, mapping[template.carried_out], tuple(mapping[value] for value in template.present)


def _weight(
    graph: ir.Graph, plan: LayerPlan, template: ir.Value, relative: str, layer: int, lazy: Mapping[str, Any]
) -> ir.Value | None:
    """Layer ``layer``'s own tensor for the template's initializer (``relative`` to the layer), or
    ``None`` if the layer has no such parameter or buffer (a constant its code made). A weight on
    the ``meta`` device is its lazy value from ``lazy``, read when the model is written."""
    module = plan.layers[layer]
    try:
        tensor = module.get_parameter(relative)
    except AttributeError:
        try:
            tensor = module.get_buffer(relative)
        except AttributeError:
            return None
    name = f"{plan.scope(layer)}.{relative}"
    value = ir.Value(name=name, const_value=_tensor(tensor.detach(), name, lazy, layer, relative))
    value.type, value.shape = template.type, template.shape
    graph.register_initializer(value)
    return value


def _tensor(stored: torch.Tensor, name: str, lazy: Mapping[str, Any], layer: int, relative: str) -> Any:
    """The initializer value of a layer's tensor ``stored``: its lazy value where it is on ``meta``."""
    if stored.device.type == "meta":
        if name not in lazy:
            raise NotRepeatable(f"layer {layer}'s {relative} is on the meta device without a lazy value")
        return lazy[name].named(name)
    if stored.is_complex():
        raise NotRepeatable(f"layer {layer}'s {relative} is complex")
    if not stored.is_contiguous():
        stored = stored.contiguous()
    return tensor_adapters.TorchTensor(stored, name=name)
