"""What torch.export made of each dimension asked to be dynamic (:func:`opreg.exporter._dynamic.capture`
reviews every capture with these), and what an export reports of them.

- :func:`narrowed_dims`: the dims of example size 0 or 1 whose range the capture ended below
  :data:`NARROW`, each with the guard that did it and where, whether only torch's own code did
  (:func:`baked`: and then whether an op after it has the dim at a fixed size);
- :func:`fixed_by_guards`: the ``Dim.AUTO`` dims the program has at a fixed size, each a
  :class:`FixedDim` with the guard that fixed it;
- :func:`unchecked_guards`: the guards on dynamic dims that their ranges do not imply, which the ONNX
  model cannot check (:class:`ShapeGuard`);
- :func:`where_guards` and :func:`narrowed_error`: the words of an export refused for them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from opreg.exporter import _grown, _guards
from opreg.exporter._guards import input_of, names_in, render

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
class Asked:
    """One dim ``dynamic_shapes`` asks to be dynamic."""

    path: str
    tensor: torch.Tensor
    index: int
    auto: bool  # Dim.AUTO: torch may fix it; else Dim.DYNAMIC or a named Dim, which it must not
    upper: int | None  # the user's max

    @property
    def size(self) -> int:
        return int(self.tensor.shape[self.index])


@dataclasses.dataclass(frozen=True)
class Narrowed:
    asked: Asked
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


def dim_of(program: torch.export.ExportedProgram, asked: Asked, leaves: list[Any]) -> Any:
    """The size (an int or a ``SymInt``) the captured program gives ``asked``'s dim."""
    index = next((i for i, leaf in enumerate(leaves) if leaf is asked.tensor), None)
    nodes = _placeholders(program)
    node = nodes[index] if index is not None and index < len(nodes) else None
    value = None if node is None else node.meta.get("val")
    if not isinstance(value, torch.Tensor) or asked.index >= value.dim():
        return None
    return value.shape[asked.index]


def symbolic(size: Any) -> bool:
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


def narrowed_dims(
    program: torch.export.ExportedProgram, asked: Sequence[Asked], sites: _guards.GuardSites, leaves: list[Any]
) -> list[Narrowed]:
    """The dims of example size 0 or 1 whose range the capture ended below :data:`NARROW`
    (``leaves``: the flattened ``(args, kwargs)``)."""
    import sympy

    env = _shape_env(program)
    found = []
    for item in asked:
        if item.size > 1 or (item.upper is not None and item.upper < NARROW):
            continue
        dim = dim_of(program, item, leaves)
        if not symbolic(dim):
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
        found.append(Narrowed(item, guard, source, in_torch=not branches, kept=kept))
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
    # sizes of 2 or more: a size of 0 or 1, and a range ending below NARROW, are narrowed's to judge
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
    return tuple(found) + squeeze_guards(program)


def squeeze_guards(program: torch.export.ExportedProgram) -> tuple[ShapeGuard, ...]:
    """The squeezes of the program that kept a dim marked dynamic eager PyTorch removes at its
    example size of 1 (:func:`opreg.exporter._guards.kept_squeezes`), as guards."""
    env = _shape_env(program)
    if env is None:
        return ()
    return tuple(ShapeGuard(*kept) for kept in _guards.kept_squeezes(program, names_in(env)))


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


def fixed_by_guards(
    program: torch.export.ExportedProgram, asked: Sequence[Asked], sites: _guards.GuardSites, leaves: list[Any]
) -> list[FixedDim]:
    """The ``Dim.AUTO`` dims the program has at a fixed size, each with the guard that fixed it."""
    env = _shape_env(program)
    symbols = _symbols_by_source(env)
    found = []
    for item in asked:
        if not item.auto or symbolic(dim_of(program, item, leaves)):
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


def where_guards(sites: _guards.GuardSites, asked: Sequence[Asked]) -> str:
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


def narrowed_error(items: Sequence[Narrowed]) -> str:
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
