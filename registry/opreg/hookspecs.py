"""The hooks an op pack may implement.

A pack is a module (or object) named by an entry point in the group
``opreg.plugins``. It declares ``OPREG_API_VERSION = 1`` (the plugin API it
was written for) and may declare ``OPREG_REQUIRES_TORCH = ">=2.6"`` (a PEP 440
specifier). It implements any of the hooks below with ``@opreg.hookimpl``.

opreg calls each pack's hooks one pack at a time, so a pack that raises is
reported and left out without touching the others. Hooks are called when a
registry is first built, never at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from opreg.plugins import Registrar

PROJECT_NAME = "opreg"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def opreg_register_ops(registry: Registrar) -> None:
    """Register this pack's impls.

    Receives a :class:`opreg.Registrar`; call ``registry.register(op,
    function, opset=..., domains=..., priority=..., predicate=...)`` once per
    impl. opreg fills in the pack's name. An impl that fails validation is
    rejected and reported (the rest of the pack still loads); if every impl is
    rejected, or the hook raises, the pack is left out. Returns nothing.
    Called once per registry build.
    """


@hookspec
def opreg_targets() -> Mapping[str, Mapping[str, int]]:
    """Return named target profiles this pack contributes.

    A dict ``{profile_name: {domain: version}}``, ``""`` (or ``"ai.onnx"``)
    being the standard domain, e.g. ``{"onnxruntime": {"": 23,
    "com.microsoft": 1}}``. A name another pack (or opreg) already defines is
    rejected and reported. Called once per registry build.
    """


@hookspec
def opreg_reference_kernels() -> Sequence[Any]:
    """Return ``onnx.reference.op_run.OpRun`` subclasses for this pack's custom-domain ops.

    Each class sets ``op_domain``; the reference evaluator uses them to run
    models that contain the pack's ops without a native runtime. Called when
    a model is verified with ``onnx.reference``.
    """


@hookspec
def opreg_configure_session(options: Any) -> None:
    """Prepare an ``onnxruntime.SessionOptions`` for this pack's ops.

    Receives the options before the session is created; a pack may call
    ``options.register_custom_ops_library(path)``. Returns nothing. Called each
    time opreg creates an ONNX Runtime session. Import onnxruntime here, not at
    module level.
    """


@hookspec
def opreg_schemas() -> Sequence[Any]:
    """Return ``onnx.defs.OpSchema`` objects for this pack's custom-domain ops.

    opreg registers them with onnx once, so the checker, shape inference and
    optimisers understand the ops. Called when a registry is built.
    """


@hookspec
def opreg_functions() -> Sequence[Any]:
    """Return ONNX function definitions of this pack's custom-domain ops.

    Each is an ``onnx.FunctionProto`` or an ``@onnxscript.script`` function
    whose domain and name are the op's (``test.customop::CustomOpOne``) and
    whose body uses standard ONNX. ``opreg.export(..., embed_functions=True)``
    adds the definitions of the ops a model uses as model-local functions, so
    any ONNX runtime runs the model without the pack's native kernels.
    Called when a model is exported with ``embed_functions=True``.
    """


@hookspec
def opreg_samples() -> Mapping[str, Sequence[Any]]:
    """Return sample inputs for this pack's custom torch ops, for the conformance kit.

    A dict ``{torch_op: [opreg.testing.Sample, ...]}`` (e.g.
    ``{"mylibrary::addandround_op": [Sample.of(torch.randn(3, 4))]}``).
    ``opreg.testing.check_pack`` exports each impl with these samples and
    compares with eager PyTorch; ATen ops get PyTorch's OpInfo samples
    instead, so a pack need not provide samples for them. Called only by the
    kit (``opreg pack-check``, the ``opreg`` pytest plugin), never on export.
    """


HOOK_NAMES: tuple[str, ...] = (
    "opreg_register_ops",
    "opreg_targets",
    "opreg_reference_kernels",
    "opreg_configure_session",
    "opreg_schemas",
    "opreg_functions",
    "opreg_samples",
)
