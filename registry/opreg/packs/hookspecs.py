"""The hooks an op pack may implement: the plugin API.

A pack is a module (or object) named by an entry point in the group
``opreg.plugins``. It declares ``OPREG_API_VERSION = 1`` (the plugin API it
was written for) and may declare ``OPREG_REQUIRES_TORCH = ">=2.13"`` (a PEP
440 specifier). It implements any of the hooks below with ``@opreg.hookimpl``;
an ``@opreg.hookimpl`` function that is not one of them makes the pack fail
to load, naming it.

opreg calls each pack's hooks one pack at a time, so a pack that raises is
reported and left out without touching the others. The registration hooks
(``opreg_targets``, ``opreg_schemas``, ``opreg_register_ops``) run when a
registry is first built; the others when their moment comes (a session, a
verification, a capture, an export, an export with ``embed_functions=True``,
the conformance kit, an export of a checkpoint folder). Never at import.

Each spec carries its contract on its ``def``, ``@contract(when=..., check=...)``: when opreg
calls it (the phrase its docstring's "Called ..." paragraph begins with) and how its result is
checked (the checks live in :mod:`opreg.packs.hookchecks`); :data:`CONTRACTS` collects them.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pluggy

from opreg.loaderapi import CheckpointLoader
from opreg.packs.hookchecks import (
    CAPTURE,
    CHECKPOINT,
    EMBED,
    EXPORT,
    KIT,
    REFERENCE,
    REGISTRY_BUILD,
    SESSION,
    Contract,
    check_capture_patches,
    check_capture_samples,
    check_checkpoint_loaders,
    check_functions,
    check_reference_kernels,
    check_rewrite_rules,
    check_rewrite_samples,
    check_samples,
    check_schemas,
    check_targets,
    contract,
    contracts,
    returns_nothing,
)
from opreg.pluginapi import CapturePatch, ModelSample, Sample

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import onnx
    import onnx.defs
    import onnx_ir.passes
    import onnxruntime
    import onnxscript
    from onnx.reference.op_run import OpRun
    from onnxscript.rewriter.pattern import RewriteRule, RewriteRuleSet

    from opreg.registry.registrar import Registrar
    from opreg.registry.targets import Target

PROJECT_NAME = "opreg"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
@contract(when=REGISTRY_BUILD, check=returns_nothing)
def opreg_register_ops(registry: Registrar) -> None:
    """Register this pack's impls.

    :param registry: the pack's :class:`opreg.Registrar`: call
        ``registry.register_module(*modules)`` over the modules whose impls carry
        their registration on the ``def`` (``@opreg.impl(op, opset=...,
        domains=..., priority=..., predicate=...)``),
        ``registry.register(op, function, ...)`` for a function built at run time,
        ``registry.register_translation_table(table)`` for a
        ``custom_translation_table`` written for torch.onnx, and
        ``registry.mark_unsupported(op, reason)`` for ops the pack deliberately
        leaves out. opreg fills in the pack's name.
    :return: nothing. An impl that fails validation is rejected and reported
        (the rest of the pack still loads); if every impl is rejected, or the
        hook raises, the pack is left out.

    Called once per registry build, after :func:`opreg_targets` and
    :func:`opreg_schemas`.
    """


@hookspec
@contract(when=REGISTRY_BUILD, check=check_targets)
def opreg_targets() -> Mapping[str, Mapping[str, int]]:
    """Name the target profiles this pack contributes.

    :return: ``{profile_name: {domain: version}}``, ``""`` (or ``"ai.onnx"``)
        being the standard domain, e.g. ``{"onnxruntime": {"": 23,
        "com.microsoft": 1}}``. A name another pack (or opreg) already defines,
        or an invalid profile, is rejected and reported; the pack still loads.

    Called once per registry build.
    """


@hookspec
@contract(when=REFERENCE, check=check_reference_kernels)
def opreg_reference_kernels() -> Sequence[type[OpRun]]:
    """Provide ``onnx.reference`` kernels for this pack's custom-domain ops.

    :return: ``onnx.reference.op_run.OpRun`` subclasses, each setting
        ``op_domain``; the reference evaluator uses them to run models that
        contain the pack's ops without a native runtime.

    Called when a model is run or verified with ``onnx.reference``.
    """


@hookspec
@contract(when=SESSION, check=returns_nothing)
def opreg_configure_session(options: onnxruntime.SessionOptions) -> None:
    """Prepare an ONNX Runtime session for this pack's ops.

    :param options: the ``onnxruntime.SessionOptions`` of the session about to
        be created; a pack may call ``options.register_custom_ops_library(path)``.
        Import onnxruntime here, not at module level.
    :return: nothing.

    Called each time opreg creates an ONNX Runtime session.
    """


@hookspec
@contract(when=REGISTRY_BUILD, check=check_schemas)
def opreg_schemas() -> Sequence[onnx.defs.OpSchema]:
    """Describe this pack's custom-domain ops to onnx.

    :return: ``onnx.defs.OpSchema`` objects; opreg registers each with onnx
        once, so the checker, shape inference and optimisers understand them.

    Called once per registry build, before :func:`opreg_register_ops`.
    """


@hookspec
@contract(when=EMBED, check=check_functions)
def opreg_functions() -> Sequence[onnx.FunctionProto | onnxscript.OnnxFunction]:
    """Define this pack's custom-domain ops as ONNX functions.

    :return: ``onnx.FunctionProto`` objects or ``@onnxscript.script``
        functions whose domain and name are the op's
        (``test.customop::CustomOpOne``) and whose body uses standard ONNX.
        ``opreg.export(..., embed_functions=True)`` adds the definitions of the
        ops a model uses as model-local functions, so any ONNX runtime runs the
        model without the pack's native kernels.

    Called when a model is exported with ``embed_functions=True``.
    """


@hookspec
@contract(when=KIT, check=check_samples)
def opreg_samples() -> Mapping[str, Sequence[Sample]]:
    """Provide sample inputs for this pack's custom torch ops, for the conformance kit.

    :return: ``{torch_op: [opreg.testing.Sample, ...]}`` (e.g.
        ``{"mylibrary::addandround_op": [Sample.of(torch.randn(3, 4))]}``).
        ``opreg.testing.check_pack`` exports each impl with these samples and
        compares with eager PyTorch; ATen ops get PyTorch's OpInfo samples
        instead, so a pack need not provide samples for them.

    Called only by the conformance kit, never on export (``opreg pack-check``,
    the ``opreg`` pytest plugin).
    """


@hookspec
@contract(when=EXPORT, check=check_rewrite_rules)
def opreg_rewrite_rules(
    target: Target,
) -> Sequence[RewriteRule | RewriteRuleSet | onnx_ir.passes.PassBase] | None:
    """Contribute graph-level rewrites for patterns that span several ops, for one target.

    Per-op impls (:func:`opreg_register_ops`) stay the main mechanism; a rewrite
    is for what no single torch op shows, such as ``Add`` + ``LayerNormalization``
    becoming ``com.microsoft::SkipLayerNormalization``.

    :param target: the export's :class:`opreg.Target`, the version of every domain
        the model may use. The target gates the rewrites: return only those whose
        nodes it can run (``target.get("com.microsoft")`` is not ``None`` for a
        com.microsoft op, ``target.onnx >= 23`` for ai.onnx's RMSNormalization),
        and ``[]`` or ``None`` for the targets the pack does not serve. A rewrite
        that makes a node of a domain the target lacks, or an ai.onnx op newer
        than ``target.onnx``, fails the export naming it.
    :return: a list, applied in its order to the whole model (and to the model's
        functions and subgraphs): ``onnxscript.rewriter.pattern.RewriteRule``
        objects (each applied on its own), ``RewriteRuleSet`` objects (their
        rules tried together in one sweep over the graph), and ``onnx_ir``
        passes (``onnx_ir.passes.PassBase`` instances that change the model in
        place). Every rule needs a ``name``, unique within the pack (a pass is
        named by its class). Each node a rule makes carries the provenance of
        the nodes it replaced (``opreg.torch_op``, ``opreg.pack``, ``opreg.impl``,
        ``opreg.module``, ``opreg.source``, distinct values joined with ``+``)
        and ``opreg.rewrite = "pack:rule"``; a pass must copy the
        ``metadata_props`` of what it replaces itself (opreg adds
        ``opreg.rewrite`` and, where missing, ``opreg.pack``).

    Called once per export (unless ``opreg.export(..., rewrite=False)``), after
    translation and inlining, on the graph the lean pass made (constants
    folded, no-op nodes removed; with ``optimize=False``, on the inlined
    graph), packs in load order; the lean pass runs again after a rewrite
    changed the model.
    """


@hookspec
@contract(when=KIT, check=check_rewrite_samples)
def opreg_rewrite_samples() -> Mapping[str, Sequence[ModelSample]]:
    """Provide small models in which this pack's rewrite rules fire, for the conformance kit.

    :return: ``{rule_name: [opreg.testing.ModelSample, ...]}``: for each rule (or
        pass) that :func:`opreg_rewrite_rules` returns, models holding its
        pattern, e.g. ``{"SkipLayerNorm": [ModelSample.of(Block(), torch.randn(2,
        8, 16))]}``. ``opreg.testing.check_pack`` exports each at every target
        the rule is offered for, checks that the rule fired (a node records
        ``opreg.rewrite = "pack:rule"``) and compares the model's outputs with
        eager PyTorch. A rule without samples fails ``PackCheck.assert_ok()``.

    Called only by the conformance kit, never on export (``opreg pack-check``,
    the ``opreg`` pytest plugin).
    """


@hookspec
@contract(when=CAPTURE, check=check_capture_patches)
def opreg_capture_patches() -> Sequence[CapturePatch]:
    """Offer export-friendly replacements for library code that ``torch.export`` cannot capture.

    The pluggable form of optimum's model patchers: a library function that
    branches on a data-dependent size, calls ``len()`` on a tensor of
    data-dependent length or loops over detections gets an equivalent that
    captures, installed only while opreg captures a model that uses it.

    :return: :class:`opreg.CapturePatch` objects, each naming what it patches
        (``module``, ``function``), the library ``versions`` it was written for
        and its ``replacement`` (or a ``context`` that installs it), with a
        ``name`` unique within the pack (users turn one off as ``pack:name``).
        opreg installs a patch for a capture when its library is installed at a
        version it admits, the patched module is imported and the model holds a
        submodule from its ``used_by`` prefixes; it reverts the patch afterwards,
        also on error, and records the patches the capture called in the model's
        ``opreg.capture_patches`` metadata. A patch that raises (installing,
        during the capture, reverting) is reported against the pack and the
        capture runs again without it; a hook that raises or returns something
        else costs the pack its patches, not the export.

    Called once per export of a ``torch.nn.Module``, before the capture (unless
    ``patches=False``), not for an ``ExportedProgram``, which is already
    captured (``--no-patches`` turns patches off on the command line); also by
    ``opreg explain`` and the conformance kit. Import the patched library
    inside the replacements, not at module level.
    """


@hookspec
@contract(when=KIT, check=check_capture_samples)
def opreg_capture_samples() -> Mapping[str, Sequence[ModelSample]]:
    """Provide models whose eager run goes through this pack's capture patches, for the conformance kit.

    :return: ``{patch_name: [opreg.testing.ModelSample, ...]}``: for each patch
        :func:`opreg_capture_patches` offers, models that call the patched code,
        on inputs covering its edge cases (e.g. images giving no, one and many
        detections). ``opreg.testing.check_pack`` runs each model in eager mode
        without the patch and with it installed: the patch must be called and
        every output must match (within the sample's ``rtol``/``atol``). A patch
        without samples fails ``PackCheck.assert_ok()``.

    Called only by the conformance kit, never on export (``opreg pack-check``,
    the ``opreg`` pytest plugin).
    """


@hookspec
@contract(when=CHECKPOINT, check=check_checkpoint_loaders)
def opreg_checkpoint_loaders() -> Sequence[CheckpointLoader]:
    """Teach opreg a library's checkpoint folders: what ``opreg export FOLDER`` exports from them.

    :return: :class:`opreg.CheckpointLoader` objects, each with a ``name`` unique within the pack,
        the ``library`` it loads, what it ``looks_for`` in a folder, a ``priority``, and two
        functions. ``recognise(checkpoint)`` reads the folder's small files (an
        :class:`opreg.Checkpoint`; no torch, no library import) and returns an
        :class:`opreg.Recognition` (the library, the tasks it can export, the task it infers, the
        evidence; or a ``refusal`` for a folder of its library it cannot export) or ``None``.
        ``plan(checkpoint, task)`` returns the :class:`opreg.ExportPlan`: the components to
        export (:class:`opreg.Component`: a ``build`` step returning the module, its
        :class:`opreg.ModelInput` s and :class:`opreg.DynamicDim` s with the ranges the config
        allows, its output names and file), the files to copy, the post-steps that combine
        exported models, the loop checks run on the written folder; it raises
        :class:`opreg.CheckpointError` for a folder it refuses (no weights, a config its library
        cannot build), naming the file and what to do.

        Of the loaders that recognise a folder, the highest ``priority`` is used; a tie at the
        top is refused unless the user picks one (``library=``, ``--library``). A loader whose
        ``recognise`` or ``plan`` raises something else, or returns something else than its
        value, is reported against its pack and the next candidate is asked; a hook that raises
        costs the pack its loaders, not the export.

    Called once per export of a checkpoint (``opreg export FOLDER``, ``opreg.export_checkpoint``),
    before anything is built. Import the library inside ``plan`` and the ``build`` steps, not at
    module level.
    """


CONTRACTS: dict[str, Contract] = contracts(sys.modules[__name__])
"""Every hook's :class:`~opreg.packs.hookchecks.Contract`, by name, read from the specs above."""
