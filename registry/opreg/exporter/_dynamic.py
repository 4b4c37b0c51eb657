"""Dynamic shapes as users write them (DESIGN.md §5): a dimension marked dynamic stays dynamic when
its example size is 1, ``dynamic_shapes="auto"`` makes every input dimension dynamic that
torch.export can keep so, and the export says which ones it had to fix and why.

:func:`capture` captures with torch's size-oblivious reasoning when a dim marked dynamic has
example size 0 or 1 (:func:`opreg.exporter._guards.size_oblivious`, as torch.onnx does; other
exports capture as before), then reviews what torch made of each dim asked to be dynamic:

- A dim of example size 0 or 1 whose range torch narrowed below 3 by a guard in the model's code
  (``if x.shape[0] == 1``): the graph follows the example's path and would be wrong at other
  sizes. A ``Dim.DYNAMIC`` or named ``Dim`` there is an :class:`ExportError` naming the guard and
  its line; a ``Dim.AUTO`` (``"auto"``) one is fixed at its example size, captured again, and
  reported. Where only guards in torch's own code narrowed a ``Dim.DYNAMIC`` or named ``Dim`` (an
  ``expand``'s check, a convolution's memory format, a view's strides), the example is grown to 2
  along it and captured again (:mod:`opreg.exporter._grown`), and reported. When that capture
  fails, the first stands, the dim dynamic with a warning: its graph holds torch's ops, as general
  as ONNX's; unless the graph has the dim at a fixed size after an op that keeps its input's sizes
  (:func:`_baked`: a diffusers UNet from one image, image size dynamic): then an error naming
  torch's guard and the model's line. A ``Dim.AUTO`` dim is fixed there.
- A ``Dim.AUTO`` dim whose size torch fixed (a guard equating it with a constant, as a weight's
  size does) is reported with that guard.
- When the size-oblivious capture fails and only ``Dim.AUTO`` dims have example size 0 or 1, the
  capture runs again without it (torch then fixes those dims itself) and they are reported with
  the error; any other failure lists where the model's code guards the dims marked dynamic.

Each report is a :class:`FixedDim`: the input, the dim, its size, the guard with the sizes named
after the inputs (``x.shape[1] == 3``) and where it was added (the model's line, found by
:class:`opreg.exporter._guards.GuardSites`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.exporter import _capture, _grown, _guards, _pytrees
from opreg.exporter._guards import input_of, names_in, render
from opreg.packs.patching import PatchedCapture
from opreg.settings import AUTO_SHAPES

logger = logging.getLogger(__name__)

AUTO = AUTO_SHAPES
"""``dynamic_shapes=AUTO``: every dim of every tensor input ``Dim.AUTO``."""

NARROW = 3
"""A dim of example size 0 or 1 whose range torch ends below this size took the example's path."""


@dataclasses.dataclass(frozen=True)
class FixedDim:
    """A dimension asked to be dynamic that the exported model has at a fixed size, and why.

    Fields:
        input: the input as ``forward`` takes it (``x``, ``pair[0]``, ``cache.layers[0].keys``).
        dim: the dim's index.
        size: its size in the model (the example's).
        guard: what fixed it: the guard, sizes named after the inputs (``x.shape[1] == 3``),
            or the error a dynamic capture of it raised.
        source: where the guard was added or the error raised (``model.py:12 in forward``);
            ``""`` when no code of the model's was running.
    """

    input: str
    dim: int
    size: int
    guard: str
    source: str = ""

    def __str__(self) -> str:
        return _guards.located(f"{self.input}.shape[{self.dim}] fixed at {self.size}: {self.guard}", self.source)


@dataclasses.dataclass(frozen=True)
class ShapeGuard:
    """A guard torch.export kept on dims marked dynamic that narrows them beyond their range, and
    that the ONNX model does not check (ONNX has no assert): where it fails, the model computes
    what the example's sizes computed, which may be wrong.

    Fields:
        guard: the guard as Python reads it, sizes named after the inputs
            (``4.0*((-1.0 + x.shape[2] / 32) / 2.0) < 3.0``).
        dims: the input dims it constrains (``("x.shape[2]",)``).
        source: where it was added (``model.py:12 in forward``); ``""`` when torch recorded none.
    """

    guard: str
    dims: tuple[str, ...]
    source: str = ""

    def __str__(self) -> str:
        return _guards.located(f"{', '.join(self.dims)}: {self.guard}", self.source)


@dataclasses.dataclass(frozen=True)
class Captured:
    """A capture and what it made of the dims asked to be dynamic.

    Fields:
        program: the ``ExportedProgram``.
        dynamic_shapes: the ``dynamic_shapes`` it was captured with (``"auto"`` spelled out).
        fixed: the dims asked to be dynamic that it fixed, in input order.
        guards: the guards on its dynamic dims beyond their range (:func:`unchecked_guards`).
        grown: the dims marked dynamic it was captured at 2 for, not at the example's 1
            (:mod:`opreg.exporter._grown`).
    """

    program: torch.export.ExportedProgram
    dynamic_shapes: Any
    fixed: tuple[FixedDim, ...] = ()
    guards: tuple[ShapeGuard, ...] = ()
    grown: tuple[_grown.GrownDim, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Asked:
    """One dim ``dynamic_shapes`` asks to be dynamic."""

    path: str
    tensor: torch.Tensor
    index: int
    auto: bool  # Dim.AUTO: torch may fix it; else Dim.DYNAMIC or a named Dim, which it must not
    upper: int | None  # the user's max

    @property
    def size(self) -> int:
        return int(self.tensor.shape[self.index])


def is_auto(dynamic_shapes: Any) -> bool:
    return isinstance(dynamic_shapes, str) and dynamic_shapes == AUTO


def auto_shapes(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    static: frozenset[tuple[int, int]] = frozenset(),
) -> Any:
    """``Dim.AUTO`` for every dim of every tensor input (``Dim.STATIC`` for the ``(id(tensor), dim)``
    in ``static``), in the structure torch.export wants (``torch.export.ShapesCollection``)."""
    Dim = torch.export.Dim
    shapes = torch.export.ShapesCollection()
    for leaf in torch.utils._pytree.tree_leaves((args, dict(kwargs or {}))):
        if isinstance(leaf, torch.Tensor):
            shapes[leaf] = {i: Dim.STATIC if (id(leaf), i) in static else Dim.AUTO for i in range(leaf.dim())}
    return shapes.dynamic_shapes(model, args, dict(kwargs or {}))


def _asked(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any] | None, spec: Any) -> list[_Asked]:
    asked = []
    for path, value, index, dim in _capture.dynamic_dims(model, args, kwargs, spec):
        kind = getattr(getattr(dim, "type", None), "name", None)  # a Dim.AUTO / DYNAMIC / STATIC hint
        if isinstance(dim, int) or kind == "STATIC" or not isinstance(value, torch.Tensor):
            continue
        upper = getattr(dim, "max", None)
        asked.append(_Asked(path, value, int(index) % max(value.dim(), 1), kind == "AUTO", upper))
    return asked


def capture(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    dynamic_shapes: Any,
    patches: PatchedCapture | None = None,
) -> Captured:
    """Capture ``model`` (:func:`opreg.exporter._capture.capture`); with dims marked dynamic, as the
    module docstring says."""
    if isinstance(model, torch.export.ExportedProgram) or dynamic_shapes is None:
        program = _capture.capture(model, args, kwargs, dynamic_shapes, patches)
        return Captured(program, dynamic_shapes, guards=unchecked_guards(program, _guards.GuardSites()))
    _pytrees.register_known_types()  # caches among the inputs flatten to their tensors
    auto = is_auto(dynamic_shapes)
    spec = auto_shapes(model, args, kwargs) if auto else dynamic_shapes
    _capture.check_dynamic_shapes(model, args, kwargs, spec)
    asked = _asked(model, args, kwargs, spec)
    leaves = torch.utils._pytree.tree_leaves((args, dict(kwargs or {})))
    fixed: list[FixedDim] = []
    grown: list[_grown.GrownDim] = []
    before: _Before | None = None  # the capture before the example was grown
    oblivious = any(a.size <= 1 for a in asked)  # else torch's own reasoning: it keeps every such dim
    for _ in range(4):  # size-oblivious; again grown, or with the dims found to take the example's path fixed
        sites = _guards.GuardSites()
        watched = sites if oblivious or any(a.auto for a in asked) else None  # else no guard is reported
        try:
            program = _capture.capture(model, args, kwargs, spec, patches, oblivious=oblivious, sites=watched)
            if grown and not all(_symbolic(_dim_of(program, a, leaves)) for a in asked if _is_grown(a, grown)):
                raise ExportError("torch.export fixed them")
        except ExportError as e:
            if before is not None and not before.kept:
                refused = _narrowed_error([item for item in before.narrowed if not item.kept])
                raise ExportError(f"{refused}\nCaptured again from an example grown to 2 there: {e}") from e
            if before is not None:  # the first capture's graph holds torch's ops, as general as ONNX's
                program, sites, args, kwargs, asked, leaves = before.restored()
                grown = []
                break
            small = [a for a in asked if a.size <= 1 and not _done(a, fixed)]
            if not oblivious or not small or not all(a.auto for a in small):
                raise ExportError(f"{e}{_where_guards(sites, asked)}") from e.__cause__
            cause = e.__cause__ or e
            why = f"kept dynamic, torch.export fails: {_capture.first_lines(cause, 1)}"
            fixed += [FixedDim(a.path, a.index, a.size, why, _guards.user_line(cause)) for a in small]
            oblivious = False  # torch fixes a size 0 or 1 itself
            continue
        narrowed = _narrowed(program, asked, sites, leaves)
        strict = [item for item in narrowed if not item.asked.auto]
        if strict and before is None and all(item.in_torch and item.asked.size == 1 for item in strict):
            # torch's code alone took the example's path: capture from an example grown there
            before = _Before(program, sites, args, kwargs, asked, leaves, tuple(strict))
            grown = [item.grown() for item in strict]
            args, kwargs = _grown.grown(args, kwargs, [(item.asked.tensor, item.asked.index) for item in strict])
            asked, leaves = _asked(model, args, kwargs, spec), torch.utils._pytree.tree_leaves((args, dict(kwargs)))
            continue
        if any(not item.kept for item in strict):
            raise ExportError(_narrowed_error([item for item in strict if not item.kept]))
        _warn_kept(strict)
        narrowed = [item for item in narrowed if item.asked.auto]
        if not narrowed:
            break
        fixed += [item.fixed() for item in narrowed]
        if auto:  # the spec is ours: fix those dims only
            static = frozenset((id(item.asked.tensor), item.asked.index) for item in narrowed)
            spec = auto_shapes(model, args, kwargs, static | _fixed_ids(asked, fixed))
        else:
            oblivious = False
    else:
        raise ExportError(f"torch.export kept taking the example's path on dims marked dynamic: {fixed[-1]}")
    for item in grown:
        logger.warning("%s", item)
    fixed += [item for item in _fixed_by_guards(program, asked, sites, leaves) if not _done_at(item, fixed)]
    order = {(a.path, a.index): i for i, a in enumerate(asked)}
    fixed.sort(key=lambda f: order.get((f.input, f.dim), len(order)))
    for item in fixed:
        logger.info("dim asked to be dynamic, fixed: %s", item)
    return Captured(program, spec, tuple(fixed), unchecked_guards(program, sites), tuple(grown))


@dataclasses.dataclass(frozen=True)
class _Before:
    """A capture whose dims marked dynamic torch's code narrowed, before the example was grown."""

    program: torch.export.ExportedProgram
    sites: _guards.GuardSites
    args: tuple
    kwargs: Any
    asked: list[_Asked]
    leaves: list[Any]
    narrowed: tuple[_Narrowed, ...]

    @property
    def kept(self) -> bool:
        """Whether the capture may stand when the grown one fails: no op of it has the dims at 1."""
        return all(item.kept for item in self.narrowed)

    def restored(self) -> tuple:
        _warn_kept(self.narrowed)
        return self.program, self.sites, self.args, self.kwargs, self.asked, self.leaves


def _warn_kept(narrowed: Sequence[_Narrowed]) -> None:
    for message in filter(None, (item.kept for item in narrowed)):
        logger.warning("%s", message)


def _is_grown(asked: _Asked, grown: Sequence[_grown.GrownDim]) -> bool:
    return any(g.input == asked.path and g.dim == asked.index for g in grown)


def _done(asked: _Asked, fixed: Sequence[FixedDim]) -> bool:
    return any(f.input == asked.path and f.dim == asked.index for f in fixed)


def _done_at(item: FixedDim, fixed: Sequence[FixedDim]) -> bool:
    return any(f.input == item.input and f.dim == item.dim for f in fixed)


def _fixed_ids(asked: Sequence[_Asked], fixed: Sequence[FixedDim]) -> frozenset[tuple[int, int]]:
    return frozenset((id(a.tensor), a.index) for a in asked if _done(a, fixed))


# -- what torch made of each dim ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Narrowed:
    asked: _Asked
    guard: str
    source: str
    in_torch: bool = False  # a guard in torch's code alone, no branch of the model's
    kept: str = ""  # torch's checks alone, no op has the dim at 1: why it may stay dynamic

    def fixed(self) -> FixedDim:
        return FixedDim(self.asked.path, self.asked.index, self.asked.size, self.guard, self.source)

    def grown(self) -> _grown.GrownDim:
        a = self.asked
        return _grown.GrownDim(a.path, a.index, a.size, _grown.SIZE, self.guard, self.source)


def _placeholders(program: torch.export.ExportedProgram) -> list[torch.fx.Node | None]:
    """The placeholder of each user input, in the order of the flattened ``(args, kwargs)``."""
    from torch.export.graph_signature import InputKind

    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return [nodes.get(getattr(s.arg, "name", "")) for s in user]


def _dim_of(program: torch.export.ExportedProgram, asked: _Asked, leaves: list[Any]) -> Any:
    """The size (an int or a ``SymInt``) the captured program gives ``asked``'s dim."""
    index = next((i for i, leaf in enumerate(leaves) if leaf is asked.tensor), None)
    nodes = _placeholders(program)
    node = nodes[index] if index is not None and index < len(nodes) else None
    value = None if node is None else node.meta.get("val")
    if not isinstance(value, torch.Tensor) or asked.index >= value.dim():
        return None
    return value.shape[asked.index]


def _symbolic(size: Any) -> bool:
    """Whether a size of the captured program is symbolic (torch keeps a fixed one as a ``SymInt``
    of a number too)."""
    return isinstance(size, torch.SymInt) and not size.node.expr.is_number


def _shape_env(program: torch.export.ExportedProgram) -> Any:
    for node in program.graph.nodes:
        value = node.meta.get("val")
        mode = getattr(value, "fake_mode", None)
        if mode is not None and mode.shape_env is not None:
            return mode.shape_env
    return None


def _narrowed(
    program: torch.export.ExportedProgram, asked: Sequence[_Asked], sites: _guards.GuardSites, leaves: list[Any]
) -> list[_Narrowed]:
    """The dims of example size 0 or 1 whose range the capture ended below :data:`NARROW`
    (``leaves``: the flattened ``(args, kwargs)``)."""
    import sympy

    env = _shape_env(program)
    found = []
    for item in asked:
        if item.size > 1 or (item.upper is not None and item.upper < NARROW):
            continue
        dim = _dim_of(program, item, leaves)
        if not _symbolic(dim):
            continue
        symbol = dim.node.expr
        bounds = program.range_constraints.get(symbol)
        if bounds is None or not isinstance(bounds.upper, sympy.Integer) or int(bounds.upper) >= NARROW:
            continue
        guards = [g for g in (getattr(env, "guards", None) or []) if symbol in g.expr.free_symbols]
        branches = [g for g in guards if not _in_torch(g) and not _grown.holds_grown(g.expr, symbol, env)]
        baked = _baked(program, symbol)
        guard, source = _reason(env, {symbol}, sites, branches or guards)
        kept = ""
        if not branches and not item.auto and baked is None:
            # torch's own checks (a stride, an expand of a size-1 dim): the graph holds the op, as
            # general as ONNX's; a dim the user marked dynamic stays so if a grown example fails
            kept = (
                f"{item.path}.shape[{item.index}]: torch.export narrowed its range to {bounds} at checks of its own "
                f"({'; '.join(_reason(env, {symbol}, sites, [g])[0] for g in guards)}); kept dynamic: the model's "
                "code does not branch on it"
            )
        elif not branches and baked is not None:
            guard += f" in torch's code, after which the graph has it at {baked}"
        found.append(_Narrowed(item, guard, source, in_torch=not branches, kept=kept))
    return found


def unchecked_guards(program: torch.export.ExportedProgram, sites: _guards.GuardSites) -> tuple[ShapeGuard, ...]:
    """The guards the shape environment kept on the program's dynamic input dims that their range
    constraints do not imply (``4.0*((-1.0 + h/32)/2.0) < 3.0``, true only for ``h < 80``): torch
    checks them when the captured program runs (its ``_guards_code``); the ONNX model cannot."""
    from torch.fx.experimental.symbolic_shapes import ShapeGuardPythonPrinter
    from torch.utils._sympy.value_ranges import ValueRanges

    env = _shape_env(program)
    if env is None:
        return ()
    names = names_in(env)
    # sizes of 2 or more: a size of 0 or 1, and a range ending below NARROW, are _narrowed's to judge
    constraints = program.range_constraints
    ranges = {s: ValueRanges(max(r.lower, 2), r.upper) for s, r in constraints.items() if r.upper >= NARROW}

    def named(source: Any) -> str:
        where = input_of(source)
        return f"{where[0]}.shape[{where[1]}]" if where is not None else str(source.name)

    printer = ShapeGuardPythonPrinter(env.var_to_sources, named, env.var_to_sources)
    found: list[ShapeGuard] = []
    for guard in getattr(env, "guards", None) or []:
        symbols = guard.expr.free_symbols
        if not symbols or not all(s in ranges and str(s) in names for s in symbols):
            continue
        if _guards.holds(guard.expr, ranges):
            continue
        text = printer.doprint(guard.expr)
        source = sites.first(str(guard.expr)) or _framework_line(guard)
        item = ShapeGuard(text, tuple(sorted(names[str(s)] for s in symbols)), source)
        if item not in found:
            found.append(item)
    return tuple(found) + tuple(ShapeGuard(*kept) for kept in _guards.kept_squeezes(program, names))


def _baked(program: torch.export.ExportedProgram, symbol: Any) -> str | None:
    """The first pointwise op (torch's ``pointwise`` tag: ``add``, ``div``...) whose output has
    ``symbol``'s dim at a fixed size where an input has it: after a guard in torch's code, torch
    took the example's size there, and the ONNX ops after it compute that size at every size (a
    reshape to it merges a batch into one row). ``None`` when no such op is in the graph."""
    for node in program.graph.nodes:
        out = node.meta.get("val")
        pointwise = torch.Tag.pointwise in getattr(node.target, "tags", ())
        if node.op != "call_function" or not pointwise or not isinstance(out, torch.Tensor):
            continue
        for arg in node.all_input_nodes:
            value = arg.meta.get("val")
            if not isinstance(value, torch.Tensor) or value.dim() != out.dim():
                continue
            for index, (before, after) in enumerate(zip(value.shape, out.shape, strict=True)):
                if isinstance(before, torch.SymInt) and before.node.expr == symbol and isinstance(after, int):
                    return f"size {after} (dim {index} of {node.target}'s output)"
    return None


def _in_torch(guard: Any) -> bool:
    """Whether ``guard`` was added by torch's own code (its kernels' checks), not the model's."""
    frame = getattr(getattr(guard, "sloc", None), "framework_loc", None)
    filename = frame if isinstance(frame, str) else getattr(frame, "filename", "")
    return _guards.in_torch(filename)


def _fixed_by_guards(
    program: torch.export.ExportedProgram, asked: Sequence[_Asked], sites: _guards.GuardSites, leaves: list[Any]
) -> list[FixedDim]:
    """The ``Dim.AUTO`` dims the program has at a fixed size, each with the guard that fixed it."""
    env = _shape_env(program)
    symbols = _symbols_by_source(env)
    found = []
    for item in asked:
        if not item.auto or _symbolic(_dim_of(program, item, leaves)):
            continue
        symbol = symbols.get((item.path, item.index))
        if symbol is None:
            guard, source = f"example size {item.size}: torch.export fixes a size of 0 or 1", ""
        else:
            guard, source = _reason(env, _replaced(env, symbol), sites)
        found.append(FixedDim(item.path, item.index, item.size, guard, source))
    return found


def _symbols_by_source(env: Any) -> dict[tuple[str, int], Any]:
    found: dict[tuple[str, int], Any] = {}
    for symbol, sources in (getattr(env, "var_to_sources", None) or {}).items():
        for source in sources:
            where = input_of(source)
            if where is not None:
                found.setdefault(where, symbol)
    return found


def _replaced(env: Any, symbol: Any) -> set[Any]:
    """``symbol`` and the symbols torch replaced it with, transitively."""
    seen, todo = set(), [symbol]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        target = (getattr(env, "replacements", None) or {}).get(current)
        if target is not None:
            todo.extend(target.free_symbols)
    return seen


def _reason(env: Any, symbols: set[Any], sites: _guards.GuardSites, guards: list[Any] | None = None) -> tuple[str, str]:
    """The guard on ``symbols`` (of ``guards``, else the shape environment's) that fixed them (an
    equation with a constant first), named after the inputs, and where it was added."""
    if guards is None:
        guards = [g for g in (getattr(env, "guards", None) or []) if g.expr.free_symbols & symbols]
    if not guards:
        return "torch.export fixed it (no guard recorded)", ""
    guard = sorted(guards, key=lambda g: not (_is_equation(g.expr) and len(g.expr.free_symbols) == 1))[0]
    source = sites.first(str(guard.expr)) or _framework_line(guard)
    return f"guard {render(guard.expr, names_in(env))}", source


def _is_equation(expr: Any) -> bool:
    return getattr(expr, "rel_op", None) == "=="


def _framework_line(guard: Any) -> str:
    """Where the shape environment says a guard was added (a line of torch's, often)."""
    frame = getattr(getattr(guard, "sloc", None), "framework_loc", None)
    if frame is None or isinstance(frame, str):
        return frame or ""
    return _guards.where(frame.filename, frame.lineno or 0, frame.name)


def _where_guards(sites: _guards.GuardSites, asked: Sequence[_Asked]) -> str:
    """Where the guards on the dims ``asked`` were added, for an error of the capture."""
    names = {s: f"{w[0]}.shape[{w[1]}]" for s, source in sites.sources.items() if (w := input_of(source))}
    wanted = {f"{a.path}.shape[{a.index}]" for a in asked}
    lines: list[str] = []
    for site in sites.sites:
        text = render(site.expression, names)
        line = f"- {text} ({site.user})" if site.user else f"- {text}"
        if site.user and any(name in text for name in wanted) and line not in lines:
            lines.append(line)
    if not lines:
        return ""
    return "\nWhere the model's code guards the dims marked dynamic:\n" + "\n".join(lines[:8])


def _narrowed_error(items: Sequence[_Narrowed]) -> str:
    lines = [
        f"- {item.asked.path}.shape[{item.asked.index}] (example size {item.asked.size}): {item.guard}"
        + (f" ({item.source})" if item.source else "")
        for item in items
    ]
    return (
        "dims marked dynamic can only have their example's size: the model's code, or torch's at a guard of the "
        "model's sizes, fixes them there (kept dynamic, the ONNX model would compute the example's case at every "
        "size):\n" + "\n".join(lines) + "\n"
        "If the model takes another path at other sizes, export from an example where these dims are 2 or more; "
        "else mark them Dim.AUTO (fixed and reported in program.fixed_dims) or leave them static."
    )


FIXED_DIMS_KEY = "opreg.fixed_dims"
"""The model's metadata: the dims asked to be dynamic that the export fixed, a JSON list of
``{input, dim, size, guard, source}`` (``opreg inspect`` reads it: :mod:`opreg.cli._inspection`)."""


SHAPE_GUARDS_KEY = "opreg.shape_guards"
"""The model's metadata: the guards on its dynamic dims it does not check, a JSON list of
``{guard, dims, source}`` (:class:`ShapeGuard`; ``opreg inspect`` reads it: :mod:`opreg.cli._inspection`)."""


def record(program: Any, captured: Captured) -> None:
    """Leave what ``captured`` fixed and its unchecked guards on the ``OnnxProgram``
    (``fixed_dims``, ``shape_guards``) and in its model's metadata; a :class:`opreg.ShapeGuardWarning`
    per guard, attributed to the user's ``opreg.export(...)`` line."""
    import json
    import warnings

    from opreg.errors import ShapeGuardWarning, user_stacklevel

    program.fixed_dims = tuple(captured.fixed)
    program.shape_guards = tuple(captured.guards)
    _grown.record(program, captured.grown)
    if captured.fixed:
        program.model.metadata_props[FIXED_DIMS_KEY] = json.dumps([dataclasses.asdict(f) for f in captured.fixed])
    if captured.guards:
        program.model.metadata_props[SHAPE_GUARDS_KEY] = json.dumps([dataclasses.asdict(g) for g in captured.guards])
    level = user_stacklevel()
    for guard in captured.guards:
        warnings.warn(
            f"torch.export kept a guard on dims marked dynamic that the ONNX model does not check, so where it is "
            f"false the model may be wrong or fail: {guard}. Export from an example of the sizes the model is used "
            "at, or bound the dims (Dim(name, min=, max=)) to where the guard holds",
            ShapeGuardWarning,
            stacklevel=level,
        )
