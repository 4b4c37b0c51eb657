"""Dynamic shapes as users write them (docs/design.md, "An export"): a dimension marked dynamic stays dynamic when
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
from opreg.exporter import _capture, _grown, _guards, _pytrees, _refine, _torch_args
from opreg.exporter._narrowing import (
    Asked,
    FixedDim,
    Narrowed,
    ShapeGuard,
    dim_of,
    fixed_by_guards,
    narrowed_dims,
    narrowed_error,
    squeeze_guards,
    symbolic,
    unchecked_guards,
    where_guards,
)
from opreg.packs.patching import PatchedCapture
from opreg.settings import AUTO_SHAPES

logger = logging.getLogger(__name__)

AUTO = AUTO_SHAPES
"""``dynamic_shapes=AUTO``: every dim of every tensor input ``Dim.AUTO``."""


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
        refined: the named dims whose range torch.export's suggested fixes refined
            (:mod:`opreg.exporter._refine`).
    """

    program: torch.export.ExportedProgram
    dynamic_shapes: Any
    fixed: tuple[FixedDim, ...] = ()
    guards: tuple[ShapeGuard, ...] = ()
    grown: tuple[_grown.GrownDim, ...] = ()
    refined: tuple[_refine.RefinedDim, ...] = ()


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


def _asked(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any] | None, spec: Any) -> list[Asked]:
    asked = []
    for path, value, index, dim in _capture.dynamic_dims(model, args, kwargs, spec):
        kind = getattr(getattr(dim, "type", None), "name", None)  # a Dim.AUTO / DYNAMIC / STATIC hint
        if isinstance(dim, int) or kind == "STATIC" or not isinstance(value, torch.Tensor):
            continue
        upper = getattr(dim, "max", None)
        asked.append(Asked(path, value, int(index) % max(value.dim(), 1), kind == "AUTO", upper))
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
    named = auto_shapes(model, args, kwargs) if auto else dynamic_shapes  # dim names as strings kept, for the model
    spec = _torch_args.for_torch(named)
    _capture.check_dynamic_shapes(model, args, kwargs, spec)
    asked = _asked(model, args, kwargs, spec)
    leaves = torch.utils._pytree.tree_leaves((args, dict(kwargs or {})))
    fixed: list[FixedDim] = []
    grown: list[_grown.GrownDim] = []
    refined: list[_refine.RefinedDim] = []  # by torch's suggested fixes, once
    before: _Before | None = None  # the capture before the example was grown
    oblivious = any(a.size <= 1 for a in asked)  # else torch's own reasoning: it keeps every such dim
    for _ in range(4):  # size-oblivious; again grown, or with the dims found to take the example's path fixed
        sites = _guards.GuardSites()
        watched = sites if oblivious or any(a.auto for a in asked) else None  # else no guard is reported
        try:
            program, spec = _refined_capture(model, args, kwargs, spec, patches, refined, oblivious, watched)
            if grown and not all(symbolic(dim_of(program, a, leaves)) for a in asked if _is_grown(a, grown)):
                raise ExportError("torch.export fixed them")
        except ExportError as e:
            if before is not None and not before.kept:
                refused = narrowed_error([item for item in before.narrowed if not item.kept])
                raise ExportError(f"{refused}\nCaptured again from an example grown to 2 there: {e}") from e
            if before is not None:  # the first capture's graph holds torch's ops, as general as ONNX's
                program, sites, args, kwargs, asked, leaves = before.restored()
                grown = []
                break
            small = [a for a in asked if a.size <= 1 and not _done(a, fixed)]
            if not oblivious or not small or not all(a.auto for a in small):
                raise ExportError(f"{e}{where_guards(sites, asked)}") from e.__cause__
            cause = e.__cause__ or e
            why = f"kept dynamic, torch.export fails: {_capture.first_lines(cause, 1)}"
            fixed += [FixedDim(a.path, a.index, a.size, why, _guards.user_line(cause)) for a in small]
            oblivious = False  # torch fixes a size 0 or 1 itself
            continue
        narrowed = narrowed_dims(program, asked, sites, leaves)
        strict = [item for item in narrowed if not item.asked.auto]
        if strict and before is None and all(item.in_torch and item.asked.size == 1 for item in strict):
            # torch's code alone took the example's path: capture from an example grown there
            before = _Before(program, sites, args, kwargs, asked, leaves, tuple(strict))
            grown = [item.grown() for item in strict]
            args, kwargs = _grown.grown(args, kwargs, [(item.asked.tensor, item.asked.index) for item in strict])
            asked, leaves = _asked(model, args, kwargs, spec), torch.utils._pytree.tree_leaves((args, dict(kwargs)))
            continue
        if any(not item.kept for item in strict):
            raise ExportError(narrowed_error([item for item in strict if not item.kept]))
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
    fixed += [item for item in fixed_by_guards(program, asked, sites, leaves) if not _done_at(item, fixed)]
    order = {(a.path, a.index): i for i, a in enumerate(asked)}
    fixed.sort(key=lambda f: order.get((f.input, f.dim), len(order)))
    for item in fixed:
        logger.info("dim asked to be dynamic, fixed: %s", item)
    guards = _final_guards(program, sites, before, grown)
    return Captured(program, spec if auto or refined else named, tuple(fixed), guards, tuple(grown), tuple(refined))


@dataclasses.dataclass(frozen=True)
class _Before:
    """A capture whose dims marked dynamic torch's code narrowed, before the example was grown."""

    program: torch.export.ExportedProgram
    sites: _guards.GuardSites
    args: tuple
    kwargs: Any
    asked: list[Asked]
    leaves: list[Any]
    narrowed: tuple[Narrowed, ...]

    @property
    def kept(self) -> bool:
        """Whether the capture may stand when the grown one fails: no op of it has the dims at 1."""
        return all(item.kept for item in self.narrowed)

    def restored(self) -> tuple:
        _warn_kept(self.narrowed)
        return self.program, self.sites, self.args, self.kwargs, self.asked, self.leaves


def _refined_capture(
    model: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    spec: Any,
    patches: PatchedCapture | None,
    refined: list[_refine.RefinedDim],
    oblivious: bool,
    sites: _guards.GuardSites | None,
) -> tuple[torch.export.ExportedProgram, Any]:
    """A capture (:func:`opreg.exporter._capture.capture`), and ``spec``; where it fails with torch's
    suggested fixes for named dims, once, the capture again with them applied, and the refined spec
    (each refined dim added to ``refined`` and logged)."""
    try:
        return _capture.capture(model, args, kwargs, spec, patches, oblivious=oblivious, sites=sites), spec
    except ExportError as e:
        found = None if refined else _refine.refine(e, spec)
        if found is None:
            raise
        spec, dims = found
        refined.extend(dims)
        for dim in dims:
            logger.warning("dim refined: %s", dim)
        return _capture.capture(model, args, kwargs, spec, patches, oblivious=oblivious, sites=sites), spec


def _final_guards(
    program: torch.export.ExportedProgram,
    sites: _guards.GuardSites,
    before: _Before | None,
    grown: Sequence[_grown.GrownDim],
) -> tuple[ShapeGuard, ...]:
    """The guards the model does not check: the capture's, and where a grown capture stood, the first
    capture's too (:func:`_kept_guards`)."""
    guards = unchecked_guards(program, sites)
    return _kept_guards(before, grown, guards) if grown and before is not None else guards


def _kept_guards(
    before: _Before, grown: Sequence[_grown.GrownDim], guards: tuple[ShapeGuard, ...]
) -> tuple[ShapeGuard, ...]:
    """``guards`` and the first capture's (issue 53, defect 7): from the example grown to 2, torch
    sees no guard at size 1, yet the model's code has not changed. A squeeze that kept a grown dim is
    an :class:`ExportError`: at the example's own size eager PyTorch removes the dim and the ONNX
    model keeps it, so it is wrong where it was exported from."""
    dims = {f"{g.input}.shape[{g.dim}]": g for g in grown}
    squeezed = [g for g in squeeze_guards(before.program) if dims.keys() & set(g.dims)]
    if squeezed:
        lines = "\n".join(f"- {g}" for g in squeezed)
        raise ExportError(
            f"a squeeze keeps a dim marked dynamic that eager PyTorch removes at the example's size 1, so the ONNX "
            f"model would be wrong at the example itself:\n{lines}\n(the dim was captured again from an example "
            f"grown to 2: {dims[squeezed[0].dims[0]]}). Export from an example with the dim at 2 or more, index the "
            "dim (x[0]) if it is always 1, or leave it static"
        )
    return guards + tuple(g for g in unchecked_guards(before.program, before.sites) if g not in guards)


def _warn_kept(narrowed: Sequence[Narrowed]) -> None:
    for message in filter(None, (item.kept for item in narrowed)):
        logger.warning("%s", message)


def _is_grown(asked: Asked, grown: Sequence[_grown.GrownDim]) -> bool:
    return any(g.input == asked.path and g.dim == asked.index for g in grown)


def _done(asked: Asked, fixed: Sequence[FixedDim]) -> bool:
    return any(f.input == asked.path and f.dim == asked.index for f in fixed)


def _done_at(item: FixedDim, fixed: Sequence[FixedDim]) -> bool:
    return any(f.input == item.input and f.dim == item.dim for f in fixed)


def _fixed_ids(asked: Sequence[Asked], fixed: Sequence[FixedDim]) -> frozenset[tuple[int, int]]:
    return frozenset((id(a.tensor), a.index) for a in asked if _done(a, fixed))


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
    _refine.report(program, captured.refined)
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
