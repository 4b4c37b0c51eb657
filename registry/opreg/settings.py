"""What an export takes besides the model and its inputs: :class:`ExportSettings`, every keyword
option of :func:`opreg.export` written once, and :func:`takes_settings`, which gives a function
that takes them (``opreg.export``, ``plan_export``, ``opreg.llm.export_decoder``) its signature
from the fields.

torch-free: ``opreg.export`` (:mod:`opreg._export`) and ``opreg.llm`` import it, and ``import opreg``
only when ``opreg.export`` or ``opreg.ExportSettings`` is first used.
"""

import dataclasses
import difflib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opreg.errors import InvalidArgumentError
from opreg.registry.targets import Target, TargetLike

if TYPE_CHECKING:
    from opreg.packs.host import PackHost
    from opreg.registry.registry import Registry

__all__ = ["STATE_MODES", "ExportSettings", "describe", "takes_settings"]

STATE_MODES = ("error", "io", "drop")
"""What ``state=`` takes."""
_FLAGS = ("embed_functions", "optimize", "fold_weights", "rewrite", "strict", "patches", "keep_float32")
"""The fields that take True or False."""


AUTO_SHAPES = "auto"
"""``dynamic_shapes="auto"``: every dim of every tensor input ``Dim.AUTO``."""


@dataclasses.dataclass(frozen=True)
class ExportSettings:
    """How to export a model: the keyword options of :func:`opreg.export`, which
    :func:`opreg.exporter.plan_export`, :func:`opreg.llm.export_decoder` and ``opreg export``
    take too. Every value is checked when the settings are made: a wrong one is an
    :class:`opreg.InvalidArgumentError` naming the option and what it takes. docs/exporting.md
    ("Keyword options") says what each does in full.

    Attributes:
        target: what the model must run on: a profile name (``"onnx"``, ``"onnxruntime"``), an
            ai.onnx version, a ``{domain: version}`` dict or an :class:`opreg.Target`; default ``"onnx"``.
            A custom domain the model's ops need that only a pack covers joins it, at the version the
            pack declares (the result's ``target`` and ``joined_domains`` say so).
        dynamic_shapes: as ``torch.export.export`` takes them (``torch.export.Dim`` names become the
            ONNX dim names; a dim marked dynamic may have example size 1), or ``"auto"``: every dim
            of every tensor input dynamic where torch.export can keep it so, the ones it fixes
            reported in the result's ``fixed_dims``; default ``None``, every dim fixed.
        plugins: the names of the installed packs to use; default ``None``, every installed pack.
        exclude: the names of installed packs to leave out; default ``None``.
        registry: an :class:`opreg.Registry` to use instead of ``plugins``/``exclude``; default ``None``.
        host: the :class:`opreg.PackHost` whose packs' code the export asks (capture patches, rewrite
            rules, function definitions; the session configuration and reference kernels of ``run``
            and ``verify``); default ``None``, the host of the installed packs ``plugins``/``exclude``
            select (:func:`opreg.default_host`), or of those ``registry`` was built from (a copy's
            too; none for a registry built by hand: :func:`opreg.packs.plugins.host_of`).
        inline: ``True`` inlines impls written as script functions, ``False`` keeps them as
            model-local functions, an int N inlines those of at most N nodes; default ``True``.
        embed_functions: add the packs' ONNX function definitions of the custom-domain ops the
            model uses; default ``False``.
        optimize: fold constants, remove no-op and duplicate nodes, make constants initializers;
            default ``True``.
        fold_weights: with ``optimize``, fold batch norm into the layer before it and store a weight
            read only through a Transpose transposed; default ``True``.
        rewrite: apply the packs' rewrite rules for the target; default ``True``.
        seed: an int: seed every random node (``seed``, ``seed + 1``, ... in graph order); default
            ``None``, unseeded.
        strict: a pack's rewrite that raises or breaks the graph fails the export (instead of being
            left out with a warning); default ``False``.
        state: what to do with buffers and inputs ``forward`` updates in place: ``"error"``
            (default), ``"io"`` or ``"drop"``.
        passes: more rewrites (``onnx_ir`` passes, onnxscript rules or rule sets) applied after the
            packs'; default ``()``.
        patches: install the packs' capture patches that apply to the model while capturing it;
            default ``True``.
        exclude_patches: names of capture patches to leave out (``"pack:name"``); default ``()``.
        progress: called with each stage's name as it starts; default ``None``.
        weights: the values of the model's ``meta``-device parameters and buffers (a model larger
            than memory): a safetensors file, a folder of them, a list of files, or a mapping of
            names to tensors, read as the model is written (:mod:`opreg.weights`); default ``None``.
        keep_float32: compute in float32 the bfloat16 ops ONNX Runtime's CPU provider has no kernel
            for (MatMul, Gemm, Add, ...), each input cast from bfloat16 and each result back; default
            ``False``.
        input_names: names for the ONNX model's inputs, in order (the tensors among the inputs,
            nested ones flattened), as ``torch.onnx.export`` takes them; fewer names than inputs
            rename the first ones; default ``None``, the names of forward's parameters.
        output_names: names for the ONNX model's outputs, in order, likewise; default ``None``.
        dynamic_axes: ``torch.onnx.export``'s older spelling of dynamic dims, ``{input name: {dim: "name"}}``
            or ``{input name: [dim, ...]}`` by the names ``input_names`` gives (else forward's parameter
            names); a name of ``output_names`` is ignored, as torch.onnx ignores it. Made into
            ``dynamic_shapes`` as torch.onnx 2.13 makes it; default ``None``.
        opset_version: ``torch.onnx.export``'s spelling of ``target=N`` (an ai.onnx version); default
            ``None``.
    """

    target: TargetLike = "onnx"
    dynamic_shapes: Any = None
    plugins: Iterable[str] | None = None
    exclude: Iterable[str] | None = None
    registry: "Registry | None" = None
    host: "PackHost | None" = None
    inline: bool | int = True
    embed_functions: bool = False
    optimize: bool = True
    fold_weights: bool = True
    rewrite: bool = True
    seed: int | None = None
    strict: bool = False
    state: str = "error"
    passes: Iterable[Any] = ()
    patches: bool = True
    exclude_patches: Iterable[str] = ()
    progress: Callable[[str], None] | None = None
    weights: Any = None
    keep_float32: bool = False
    input_names: Sequence[str] | None = None
    output_names: Sequence[str] | None = None
    dynamic_axes: Mapping[str, Any] | None = None
    opset_version: int | None = None

    def __post_init__(self) -> None:
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"{name}= takes True or False, got {describe(getattr(self, name))}")
        inline = self.inline
        if not isinstance(inline, (bool, int)) or (not isinstance(inline, bool) and inline < 0):
            raise InvalidArgumentError(
                f"inline= takes True, False or a node count N >= 0 (inline functions of at most N nodes), "
                f"got {describe(inline)}"
            )
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidArgumentError(
                f"seed= takes an int (or None for unseeded random nodes), got {describe(self.seed)}"
            )
        if self.state not in STATE_MODES:
            raise InvalidArgumentError(
                f"state={self.state!r}: use 'error' (refuse a model that updates buffers or inputs), 'io' (export "
                "each as an input and an output) or 'drop' (leave the updates out)"
            )
        if isinstance(self.dynamic_shapes, str) and self.dynamic_shapes != AUTO_SHAPES:
            raise InvalidArgumentError(
                f"dynamic_shapes={self.dynamic_shapes!r}: give {AUTO_SHAPES!r} (every dim of every tensor input "
                "dynamic where torch.export can keep it so) or the dims as torch.export takes them, e.g. "
                "{'x': {0: Dim.DYNAMIC}}"
            )
        if isinstance(self.exclude_patches, str):
            raise InvalidArgumentError(
                f"exclude_patches= takes a list of patch names, got the string {self.exclude_patches!r}"
            )
        if not isinstance(self.dynamic_shapes, (dict, tuple, list, str, type(None))):  # a str: checked above
            raise InvalidArgumentError(
                f"dynamic_shapes= takes None, {AUTO_SHAPES!r}, or a dict by forward's parameter names (or a tuple by "
                f"position) of {{dim index: torch.export.Dim}}, as torch.export.export takes it, got "
                f"{describe(self.dynamic_shapes)}"
            )
        _check_torch_onnx_args(self)
        if isinstance(self.target, bool) or not isinstance(self.target, (str, int, Mapping, Target)):
            raise InvalidArgumentError(
                "target= takes a profile name ('onnx', 'onnxruntime'), an ai.onnx version (18), a {domain: version} "
                f"dict or an opreg.Target, got {describe(self.target)}"
            )
        weights = self.weights
        if weights is not None and (isinstance(weights, bytes) or not isinstance(weights, (os.PathLike, Iterable))):
            raise InvalidArgumentError(
                "weights= takes a safetensors file or folder, a list of files, or a mapping of names to tensors, "
                f"got {describe(weights)}"
            )  # checked here too: a model with no meta-device tensor never reads it
        if self.progress is not None and not callable(self.progress):
            raise InvalidArgumentError(
                f"progress= takes a function called with each stage's name, got {describe(self.progress)}"
            )
        from opreg.packs.host import PackHost
        from opreg.registry.registry import Registry

        hint = "; to choose packs by name use plugins=[...]"
        _check_type("registry", self.registry, Registry, "opreg.default_registry().copy()", hint)
        if self.registry is not None and (self.plugins is not None or self.exclude is not None):
            raise InvalidArgumentError("pass either registry= or plugins=/exclude=, not both")
        _check_type("host", self.host, PackHost, "opreg.default_host(exclude=['NAME'])")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options' names, in the order of the fields."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def of(cls, settings: "ExportSettings | None", options: Mapping[str, Any], caller: str) -> "ExportSettings":
        """The settings a call gave: ``settings`` (default: every default) with the keyword
        ``options`` replacing its fields. ``caller`` names the function in the error for a
        keyword that is no option."""
        unknown = [name for name in options if name not in cls.names()]
        if unknown:
            close = {m for name in unknown for m in difflib.get_close_matches(name, cls.names(), n=1)}
            hint = f" (did you mean {', '.join(sorted(close))}?)" if close else ""
            which = "it" if caller == "opreg.export" else "opreg.export"
            raise InvalidArgumentError(
                f"{caller} got {', '.join(unknown)}, which {which} does not take{hint}; its keyword options are "
                f"{', '.join(cls.names())} (docs/exporting.md, 'Keyword options')"
            )
        if settings is None:
            return cls(**options)
        if not isinstance(settings, cls):
            raise InvalidArgumentError(f"settings= takes an opreg.ExportSettings, got {describe(settings)}")
        return dataclasses.replace(settings, **options) if options else settings


F = TypeVar("F", bound=Callable[..., Any])


def takes_settings(*, leave_out: Iterable[str] = ()) -> Callable[[F], F]:
    """Give a function written ``f(..., *, ..., settings=None, **options)`` the signature
    ``inspect.signature`` shows: its own parameters, then every :class:`ExportSettings` field
    (but those in ``leave_out``) as a keyword-only parameter with its type and default, then
    ``settings``. The function itself turns ``options`` into settings
    (:meth:`ExportSettings.of`)."""
    left_out = set(leave_out)

    def decorate(function: F) -> F:
        own = inspect.signature(function)
        keep = [p for p in own.parameters.values() if p.kind != p.VAR_KEYWORD and p.name != "settings"]
        fields = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
            for f in dataclasses.fields(ExportSettings)
            if f.name not in left_out
        ]
        last = [own.parameters["settings"]] if "settings" in own.parameters else []
        function.__signature__ = own.replace(parameters=[*keep, *fields, *last])  # type: ignore[attr-defined]
        return function

    return decorate


def _check_torch_onnx_args(settings: ExportSettings) -> None:
    """Check torch.onnx's spellings (``input_names``, ``output_names``, ``dynamic_axes``,
    ``opset_version``); ``opset_version`` becomes ``target``."""
    for name in ("input_names", "output_names"):
        names = getattr(settings, name)
        if names is None:
            continue
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
            raise InvalidArgumentError(f"{name}= takes a list of names, e.g. ['x', 'y'], got {describe(names)}")
        bad = [n for n in names if not isinstance(n, str) or not n]
        if bad:
            raise InvalidArgumentError(f"{name}= takes non-empty strings, got {describe(bad[0])}")
        twice = sorted({n for n in names if list(names).count(n) > 1})
        if twice:
            raise InvalidArgumentError(f"{name}= names {', '.join(map(repr, twice))} twice: each name is one value's")
    axes = settings.dynamic_axes
    if axes is not None:
        if not isinstance(axes, Mapping):
            raise InvalidArgumentError(
                "dynamic_axes= takes {input name: {dim: 'name'}} or {input name: [dim, ...]}, "
                f"got {describe(axes)}"
            )
        for key, dims in axes.items():
            ok = isinstance(dims, Mapping) and all(_is_index(d) and isinstance(v, str) for d, v in dims.items())
            ok = ok or (isinstance(dims, (list, tuple)) and all(_is_index(d) for d in dims))
            if not isinstance(key, str) or not ok:
                raise InvalidArgumentError(
                    f"dynamic_axes[{key!r}] takes {{dim: 'name'}} or [dim, ...] (dims are ints), got {describe(dims)}"
                )
        if settings.dynamic_shapes is not None:
            raise InvalidArgumentError(
                "pass dynamic_shapes= or dynamic_axes=, not both (torch.onnx ignores dynamic_axes then): "
                "dynamic_shapes takes names too, e.g. {'x': {0: 'batch'}}"
            )
    version = settings.opset_version
    if version is None:
        return
    if not _is_index(version):
        raise InvalidArgumentError(
            f"opset_version= takes an ai.onnx version (an int, e.g. 17), got {describe(version)}"
        )
    if settings.target not in ("onnx", version):
        raise InvalidArgumentError(
            f"pass target= or opset_version=, not both: opset_version={version} is target={version}, and target= "
            f"is {describe(settings.target)}"
        )
    object.__setattr__(settings, "target", version)


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_type(name: str, value: Any, cls: type, example: str, hint: str = "") -> None:
    """``name=`` is ``None`` or a ``cls``, else an :class:`InvalidArgumentError` naming what it takes."""
    if value is not None and not isinstance(value, cls):
        raise InvalidArgumentError(
            f"{name}= takes an opreg.{cls.__name__} (e.g. {example}), got {describe(value)}{hint}"
        )


def describe(value: Any) -> str:
    """A value's type and short repr, for an error message (``str 'no'``, ``None``)."""
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
