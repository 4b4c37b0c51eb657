"""opreg's exporter (DESIGN.md §5), a pipeline of stages whose imports run one way:
capture -> decompose -> plan -> translate -> finish -> program.

``opreg.export`` is the entry point; this package imports torch, so
``import opreg`` reaches it only when ``opreg.export`` is first called.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from opreg import _heap
from opreg.errors import InvalidArgumentError, UnsupportedOpsError
from opreg.exporter import _capture, _dynamic, _finish, _plan, _state, _translate
from opreg.exporter._dynamic import FixedDim
from opreg.exporter._locate import Divergence, Location, Step
from opreg.exporter._nodes import PROVENANCE_KEYS, SKIPPED_OPS
from opreg.exporter._plan import MissingOp
from opreg.exporter._program import OnnxProgram, OutputCheck, Verification
from opreg.exporter._state import StateSlot
from opreg.patching import PatchedCapture
from opreg.plugins import default_registry
from opreg.registry import Registry
from opreg.targets import TargetLike

logger = logging.getLogger(__name__)

STAGES = ("capture", "plan", "translate", "finish")
"""The export stages, in order, as reported to a ``progress`` callback."""

__all__ = [
    "PROVENANCE_KEYS",
    "SKIPPED_OPS",
    "STAGES",
    "Divergence",
    "FixedDim",
    "Location",
    "MissingOp",
    "OnnxProgram",
    "OutputCheck",
    "StateSlot",
    "Step",
    "Verification",
    "export",
    "plan_export",
]


def _registry(registry: Registry | None, plugins: Iterable[str] | None, exclude: Iterable[str] | None) -> Registry:
    if registry is not None:
        if not isinstance(registry, Registry):
            raise InvalidArgumentError(
                f"registry= takes an opreg.Registry (e.g. opreg.default_registry().copy()), got "
                f"{type(registry).__name__} {registry!r}; to choose packs by name use plugins=[...]"
            )
        if plugins is not None or exclude is not None:
            raise InvalidArgumentError("pass either registry= or plugins=/exclude=, not both")
        return registry
    return default_registry(plugins=plugins, exclude=exclude)


def _patches(model: Any, registry: Registry, patches: bool, exclude: Iterable[str]) -> PatchedCapture | None:
    """The capture patches for ``model`` (``None`` for an ``ExportedProgram``: it is already captured)."""
    if isinstance(exclude, str):
        raise InvalidArgumentError(f"exclude_patches= takes a list of patch names, got the string {exclude!r}")
    if isinstance(model, torch.export.ExportedProgram):
        return None
    return PatchedCapture.of(registry, enabled=patches, exclude=exclude)


@_heap.quiet()
def plan_export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    target: TargetLike = "onnx",
    dynamic_shapes: Any = None,
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    registry: Registry | None = None,
    patches: bool = True,
    exclude_patches: Iterable[str] = (),
) -> list[MissingOp]:
    """Capture (with the packs' capture patches, as :func:`export` does) and plan ``model``
    (decomposing it where needed) and return every op no impl covers at ``target``, in the main
    graph and in every subgraph (``[]`` when the model can be exported). What ``opreg check`` prints."""
    args = _check_inputs(model, args, kwargs)
    _dynamic.check(dynamic_shapes)
    reg = _registry(registry, plugins, exclude)
    resolved = reg.target(target)
    patched = _patches(model, reg, patches, exclude_patches)
    captured = _dynamic.capture(model, args, kwargs, dynamic_shapes, patched).program
    try:
        _plan.prepare(captured, reg, resolved)
    except UnsupportedOpsError as e:
        return list(e.missing)
    return []


@_heap.quiet()
def export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    target: TargetLike = "onnx",
    dynamic_shapes: Any = None,
    plugins: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    registry: Registry | None = None,
    inline: bool | int = True,
    embed_functions: bool = False,
    optimize: bool = True,
    fold_weights: bool = True,
    rewrite: bool = True,
    seed: int | None = None,
    strict: bool = False,
    state: str = "error",
    passes: Iterable[Any] = (),
    patches: bool = True,
    exclude_patches: Iterable[str] = (),
    progress: Callable[[str], None] | None = None,
) -> OnnxProgram:
    """Export ``model`` to ONNX through the registry.

    Args:
        model: the ``torch.nn.Module`` (put it in ``eval()`` mode first if it
            has dropout or batch norm), or a ``torch.export.ExportedProgram``
            already captured (then ``args``, ``kwargs`` and ``dynamic_shapes``
            are not needed, and its symbolic dims keep torch's names).
        args, kwargs: example inputs, as ``model(*args, **kwargs)`` takes them.
        target: what the model must run on: a profile name (``"onnx"``,
            ``"onnxruntime"``), an ai.onnx version, a ``{domain: version}``
            dict, or a :class:`opreg.Target`.
        dynamic_shapes: as ``torch.export.export`` takes them, or ``"auto"``: every
            dim of every tensor input ``Dim.AUTO``. A dim marked dynamic stays so when its
            example size is 1 (torch's size-oblivious capture); the dims torch.export fixes
            are in the result's ``fixed_dims`` with the guard that fixed them. The names of
            ``torch.export.Dim``s become the ONNX dim names, other dynamic dims are named
            ``<input>_dim<i>``, and dims torch proves equal share a name.
        plugins, exclude: which installed packs to use (see
            :func:`opreg.default_registry`).
        registry: a registry to use instead (e.g. a ``default_registry().copy()``
            with your own impls registered); excludes ``plugins``/``exclude``.
        inline: inline impls written as script functions (default); ``False``
            keeps them as model-local ONNX functions; an int N inlines those of
            at most N nodes and keeps the rest.
        embed_functions: add the packs' ONNX function definitions
            (``opreg_functions``) of the custom-domain ops the model uses, so
            runtimes without the packs' kernels can run it.
        optimize: fold constants (weights only as ``fold_weights`` says), remove no-op and
            duplicate nodes, and turn constants into initializers (default);
            ``False`` keeps every node the impls emitted.
        fold_weights: with ``optimize``, fold batch norm into the convolution
            (or Gemm) before it, and store a weight read only through a
            Transpose transposed; the folded weight keeps the replaced weight's
            name and the model's ``opreg.folded_weights`` metadata says how each
            folded tensor was computed (default). ``False`` keeps every
            initializer exactly as the ``state_dict`` has it.
        rewrite: apply the graph-level rewrites the packs contribute for
            ``target`` (``opreg_rewrite_rules``: fused kernels for patterns that
            span several ops) after the lean pass (default); ``False`` leaves
            them out.
        seed: give every random node (RandomNormal, RandomUniform and their
            ``Like`` forms, Bernoulli, Multinomial, Dropout) a ``seed``
            attribute: ``seed``, ``seed + 1``, ... in graph order. Each
            session of the model then draws the same numbers, run after run;
            ``None`` (default) leaves them unseeded: ONNX Runtime seeds them
            from its process-wide seed (``onnxruntime.set_seed``).
        strict: a pack's rewrite that raises or leaves an invalid graph fails the export
            (:class:`PluginError` naming the pack and the rule or pass); by default it is
            undone and left out with a warning, and the export goes on without it.
        state: what to do when ``forward`` updates a buffer (batch-norm statistics in
            training, a counter, a static KV cache) or an input in place, which an ONNX graph
            cannot hold: ``"error"`` (default) raises :class:`opreg.StateError` naming them;
            ``"io"`` makes each mutated buffer an input (named by its ``state_dict`` key) and
            each mutated buffer and input an output (``<input>_out``), listed in the program's
            ``state_slots`` (``run`` feeds and keeps the buffers' values in ``program.state``);
            ``"drop"`` leaves the updates out (the model reads the exported values each call).
        passes: more graph rewrites to apply after the packs' (``onnx_ir`` passes that
            change the model in place, onnxscript rewrite rules or rule sets), each
            recorded as ``export:<name>`` like a pack's rewrite and gated by the target
            the same way (e.g. ``opreg_ort_contrib.MatMulNBitsQuantization(bits=4)``,
            which quantizes the float weights of linear layers). They run even with
            ``rewrite=False``.
        patches: install the packs' capture patches (``opreg_capture_patches``)
            that apply to ``model`` while capturing it (default); ``False``
            captures the model's own code. What happened to each patch is in
            the result's ``capture_patches``; the applied ones are also in the
            model's ``opreg.capture_patches`` metadata.
        exclude_patches: names of patches to leave out (``"pack:name"``, a
            patch's name, or what it patches, ``"module.function"``).
        progress: called with each stage's name (:data:`STAGES`) as it starts.

    Threads: ``export`` may be called from several threads at once. torch.export's
    tracing state is global, so capture and decomposition run one model at a time
    (a process-wide lock); translation and the later stages run in parallel. Code of
    your own that calls ``torch.export`` in another thread at the same time is not
    covered by that lock.

    Garbage collection: while ``export`` runs, the objects that were alive before it
    (and the modules, registry and captured program it makes) sit in the collector's
    permanent generation (``gc.freeze``), handed back when it returns; this saves a
    quarter to a third of a cold export's time. A process with frozen objects of its own,
    or with the collector off, is left as it is (``opreg/_heap.py``).

    Raises:
        InvalidArgumentError: an argument of the wrong type (``args`` not a
            tuple, ``kwargs`` not a dict, ``seed`` not an int, ...), before
            anything is captured.
        UnsupportedOpsError: some ops have no impl for the target; lists all.
        StateError: the model updates buffers or inputs, and ``state`` is ``"error"``.
        OpsetConflictError: impls need incompatible versions of one domain.
        ExportError: capture, translation or validation failed.
        PluginError: with ``strict``, a pack's rewrite failed.
    """
    args = _check_inputs(model, args, kwargs)
    _check_options(inline=inline, seed=seed, embed_functions=embed_functions, optimize=optimize,
                   fold_weights=fold_weights, rewrite=rewrite)  # fmt: skip
    _dynamic.check(dynamic_shapes)
    reg = _registry(registry, plugins, exclude)
    _state.check_mode(state)
    extra = _finish.export_passes(passes)
    tick = _Ticker(progress)
    tick("capture")
    resolved = reg.target(target)
    patched = _patches(model, reg, patches, exclude_patches)
    _heap.settle()  # the modules imported and the registry outlive the export
    capture = _dynamic.capture(model, args, kwargs, dynamic_shapes, patched)
    captured = capture.program
    _heap.settle()  # so does the captured program
    tick("plan")
    program, plan = _plan.prepare(captured, reg, resolved)  # decomposed only where needed
    _state.check(program, state, _model_name(model))
    tick("translate")
    symbols: dict[str, str] = {}
    eager = captured  # what verify() compares with: an ExportedProgram's module is made when first needed
    if isinstance(model, torch.nn.Module):
        symbols = _capture.dim_names(model, args, kwargs, program, capture.dynamic_shapes)
        eager = model
    translation = _translate.Translator(program, plan, resolved, symbols, state_io=state == "io").run()
    tick("finish")
    result = _finish.finish(
        translation, exported_program=program, module=eager, target=resolved, registry=reg,
        input_leaves=_capture.input_leaves(program), inline=inline, embed_functions=embed_functions,
        optimize=optimize, fold_weights=fold_weights, rewrite=rewrite, seed=seed, strict=strict, passes=extra,
        dim_bounds=_capture.dim_bounds(program, symbols),
        capture_patches=patched.outcomes if patched is not None else (),
    )  # fmt: skip
    tick.done()
    result.exporter = export
    _dynamic.record(result, capture.fixed)
    return result


def _model_name(model: Any) -> str:
    if isinstance(model, torch.export.ExportedProgram):
        return "the exported program"
    return type(model).__name__


def _check_inputs(model: Any, args: Any, kwargs: Any) -> tuple:
    """Refuse a model, ``args`` or ``kwargs`` torch.export would refuse later in its own words;
    returns ``args`` as a tuple (a lone tensor is one positional input)."""
    if not isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        hint = (
            ": wrap it in a torch.nn.Module whose forward calls it"
            if callable(model) and not isinstance(model, type)
            else (": pass an instance, e.g. Model()" if isinstance(model, type) else "")
        )
        raise InvalidArgumentError(
            f"the model to export is a torch.nn.Module or a torch.export.ExportedProgram, got {_describe(model)}{hint}"
        )
    if isinstance(args, torch.Tensor):
        args = (args,)
    elif args is None:
        args = ()
    elif isinstance(args, list):
        raise InvalidArgumentError(
            f"args= takes a tuple of the model's positional inputs, got a list of {len(args)}: write tuple(args) "
            "for that many inputs, or (args,) if the model takes one list"
        )
    elif isinstance(args, Mapping):
        raise InvalidArgumentError(
            "args= takes a tuple of the model's positional inputs, got a dict: pass keyword inputs as kwargs="
        )
    elif not isinstance(args, tuple):
        raise InvalidArgumentError(
            f"args= takes a tuple of the model's positional inputs, got {_describe(args)}: write (value,) for one"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidArgumentError(
            f"kwargs= takes a dict of the model's keyword inputs ({{'name': tensor}}), got {_describe(kwargs)}"
        )
    if kwargs is not None and any(not isinstance(k, str) for k in kwargs):
        raise InvalidArgumentError(f"kwargs= keys are forward's parameter names (strings), got {list(kwargs)!r}")
    return args


def _check_options(*, inline: Any, seed: Any, **flags: Any) -> None:
    """Refuse options of the wrong type before the export starts (not after it, or never)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{name}= takes True or False, got {_describe(value)}")
    if not isinstance(inline, (bool, int)) or (not isinstance(inline, bool) and inline < 0):
        raise InvalidArgumentError(
            f"inline= takes True, False or a node count N >= 0 (inline functions of at most N nodes), "
            f"got {_describe(inline)}"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidArgumentError(f"seed= takes an int (or None for unseeded random nodes), got {_describe(seed)}")


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


class _Ticker:
    """Reports stages to ``progress`` and logs their durations."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.progress = progress
        self.stage: str | None = None
        self.started = time.perf_counter()

    def __call__(self, stage: str) -> None:
        self.done()
        self.stage = stage
        self.started = time.perf_counter()
        if self.progress is not None:
            self.progress(stage)

    def done(self) -> None:
        if self.stage is not None:
            logger.info("%s took %.3f s", self.stage, time.perf_counter() - self.started)
        self.stage = None
