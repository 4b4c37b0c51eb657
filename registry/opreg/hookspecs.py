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
the conformance kit). Never at import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from opreg.pluginapi import CapturePatch, HookError, ModelSample, Sample

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import onnx
    import onnx.defs
    import onnx_ir.passes
    import onnxruntime
    import onnxscript
    from onnx.reference.op_run import OpRun
    from onnxscript.rewriter.pattern import RewriteRule, RewriteRuleSet

    from opreg.registrar import Registrar
    from opreg.targets import Target

PROJECT_NAME = "opreg"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
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
def opreg_targets() -> Mapping[str, Mapping[str, int]]:
    """Name the target profiles this pack contributes.

    :return: ``{profile_name: {domain: version}}``, ``""`` (or ``"ai.onnx"``)
        being the standard domain, e.g. ``{"onnxruntime": {"": 23,
        "com.microsoft": 1}}``. A name another pack (or opreg) already defines,
        or an invalid profile, is rejected and reported; the pack still loads.

    Called once per registry build.
    """


@hookspec
def opreg_reference_kernels() -> Sequence[type[OpRun]]:
    """Provide ``onnx.reference`` kernels for this pack's custom-domain ops.

    :return: ``onnx.reference.op_run.OpRun`` subclasses, each setting
        ``op_domain``; the reference evaluator uses them to run models that
        contain the pack's ops without a native runtime.

    Called when a model is run or verified with ``onnx.reference``.
    """


@hookspec
def opreg_configure_session(options: onnxruntime.SessionOptions) -> None:
    """Prepare an ONNX Runtime session for this pack's ops.

    :param options: the ``onnxruntime.SessionOptions`` of the session about to
        be created; a pack may call ``options.register_custom_ops_library(path)``.
        Import onnxruntime here, not at module level.
    :return: nothing.

    Called each time opreg creates an ONNX Runtime session.
    """


@hookspec
def opreg_schemas() -> Sequence[onnx.defs.OpSchema]:
    """Describe this pack's custom-domain ops to onnx.

    :return: ``onnx.defs.OpSchema`` objects; opreg registers each with onnx
        once, so the checker, shape inference and optimisers understand them.

    Called once per registry build, before :func:`opreg_register_ops`.
    """


@hookspec
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
def opreg_samples() -> Mapping[str, Sequence[Sample]]:
    """Provide sample inputs for this pack's custom torch ops, for the conformance kit.

    :return: ``{torch_op: [opreg.testing.Sample, ...]}`` (e.g.
        ``{"mylibrary::addandround_op": [Sample.of(torch.randn(3, 4))]}``).
        ``opreg.testing.check_pack`` exports each impl with these samples and
        compares with eager PyTorch; ATen ops get PyTorch's OpInfo samples
        instead, so a pack need not provide samples for them.

    Called only by the kit (``opreg pack-check``, the ``opreg`` pytest
    plugin), never on export.
    """


@hookspec
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
def opreg_rewrite_samples() -> Mapping[str, Sequence[ModelSample]]:
    """Provide small models in which this pack's rewrite rules fire, for the conformance kit.

    :return: ``{rule_name: [opreg.testing.ModelSample, ...]}``: for each rule (or
        pass) that :func:`opreg_rewrite_rules` returns, models holding its
        pattern, e.g. ``{"SkipLayerNorm": [ModelSample.of(Block(), torch.randn(2,
        8, 16))]}``. ``opreg.testing.check_pack`` exports each at every target
        the rule is offered for, checks that the rule fired (a node records
        ``opreg.rewrite = "pack:rule"``) and compares the model's outputs with
        eager PyTorch. A rule without samples fails ``PackCheck.assert_ok()``.

    Called only by the kit (``opreg pack-check``, the ``opreg`` pytest
    plugin), never on export.
    """


@hookspec
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

    Called once per export of a ``torch.nn.Module`` (not for an
    ``ExportedProgram``, which is already captured), unless the user turned
    patches off (``opreg.export(..., patches=False)``, ``--no-patches``); also
    by ``opreg explain`` and the conformance kit. Import the patched library
    inside the replacements, not at module level.
    """


@hookspec
def opreg_capture_samples() -> Mapping[str, Sequence[ModelSample]]:
    """Provide models whose eager run goes through this pack's capture patches, for the conformance kit.

    :return: ``{patch_name: [opreg.testing.ModelSample, ...]}``: for each patch
        :func:`opreg_capture_patches` offers, models that call the patched code,
        on inputs covering its edge cases (e.g. images giving no, one and many
        detections). ``opreg.testing.check_pack`` runs each model in eager mode
        without the patch and with it installed: the patch must be called and
        every output must match (within the sample's ``rtol``/``atol``). A patch
        without samples fails ``PackCheck.assert_ok()``.

    Called only by the kit (``opreg pack-check``, the ``opreg`` pytest
    plugin), never on export.
    """


# -- the contract of each hook: when it is called, and how its result is checked -----------------
#
# Every hook result goes through its contract's ``check`` wherever it is called: by the loader
# (registration hooks), the exporter (session, verification, export hooks) and the conformance kit
# (all of them), so one mistake reads the same everywhere (:class:`opreg.pluginapi.HookError`).

REGISTRY_BUILD = "once per registry build"
SESSION = "each time opreg creates an ONNX Runtime session"
REFERENCE = "when a model is run or verified with onnx.reference"
EMBED = "when a model is exported with embed_functions=True"
EXPORT = "once per export, after translation (unless rewrite=False)"
KIT = "only by the conformance kit, never on export"
CAPTURE = "once per export of a torch.nn.Module, before the capture (unless patches=False)"


@dataclasses.dataclass(frozen=True)
class Checked:
    """A hook result after its contract's check: the normalized ``value`` and the ``problems`` of
    the items left out of it (a wrong item costs only itself; a wrong result as a whole is a
    :class:`~opreg.pluginapi.HookError`)."""

    value: Any
    problems: tuple[str, ...] = ()


class Broken(Exception):
    """Raised by a contract's check when a result cannot be used at all; the caller turns it into a
    :class:`~opreg.pluginapi.HookError` naming the pack and the hook."""


@dataclasses.dataclass(frozen=True)
class Contract:
    """One hook's contract.

    Fields:
        hook: the hook's name (a spec of this module).
        when: when opreg calls it.
        check: ``check(result) -> Checked``; raises :class:`Broken` for a result it cannot use.
    """

    hook: str
    when: str
    check: Callable[[Any], Checked]

    def apply(self, pack: str, result: Any) -> Checked:
        """``check(result)``, its :class:`Broken` as a :class:`~opreg.pluginapi.HookError` of ``pack``."""
        try:
            return self.check(result)
        except Broken as e:
            raise HookError(pack, self.hook, str(e)) from None


def _type(value: Any) -> str:
    return type(value).__name__


def _items(result: Any, what: str) -> list[Any]:
    if result is None:
        return []
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, (list, tuple)):
        raise Broken(f"must return a list of {what}, got {_type(result)}")
    return list(result)


def _nothing(result: Any) -> Checked:
    if result is not None:
        raise Broken(f"must return None (it works through what it is given), got {_type(result)}")
    return Checked(None)


def _check_targets(result: Any) -> Checked:
    if result is None:
        return Checked({})
    if not isinstance(result, Mapping):
        raise Broken(f"must return a dict {{profile: {{domain: version}}}}, got {_type(result)}")
    profiles: dict[str, dict[str, int]] = {}
    problems = []
    for profile, versions in result.items():
        if not isinstance(profile, str) or not profile.isidentifier():
            problems.append(f"profile name must be an identifier string, got {profile!r}")
            continue
        if not isinstance(versions, Mapping):
            problems.append(f"profile {profile!r} must map domain -> version, got {_type(versions)}")
            continue
        bad = [
            f"profile {profile!r}: version of {domain!r} must be an int >= 1, got {version!r}"
            if isinstance(domain, str)
            else f"profile {profile!r}: domain must be a string, got {domain!r}"
            for domain, version in versions.items()
            if not isinstance(domain, str) or isinstance(version, bool) or not isinstance(version, int) or version < 1
        ]
        if bad:
            problems += bad
            continue
        profiles[profile] = dict(versions)
    return Checked(profiles, tuple(problems))


def _check_reference_kernels(result: Any) -> Checked:
    from onnx.reference.op_run import OpRun

    kernels, problems = [], []
    for kernel in _items(result, "onnx.reference OpRun subclasses"):
        if not (isinstance(kernel, type) and issubclass(kernel, OpRun)):
            problems.append(f"{kernel!r} is not an onnx.reference.op_run.OpRun subclass")
        elif not isinstance(getattr(kernel, "op_domain", None), str) or not kernel.op_domain:
            problems.append(f"{kernel.__name__} sets no op_domain (the custom domain of the op it runs)")
        else:
            kernels.append(kernel)
    return Checked(kernels, tuple(problems))


def _check_schemas(result: Any) -> Checked:
    import onnx.defs

    items = _items(result, "onnx.defs.OpSchema objects")
    schemas = [s for s in items if isinstance(s, onnx.defs.OpSchema)]
    return Checked(schemas, tuple(f"{s!r} is not an onnx.defs.OpSchema" for s in items if s not in schemas))


def _check_functions(result: Any) -> Checked:
    import onnx
    import onnxscript

    functions, problems = [], []
    for item in _items(result, "onnx.FunctionProto or @onnxscript.script functions"):
        if isinstance(item, onnxscript.OnnxFunction):
            try:
                proto = item.to_function_proto()
            except Exception as e:
                problems.append(f"{item.name}: cannot be turned into a FunctionProto: {type(e).__name__}: {e}")
                continue
        elif isinstance(item, onnx.FunctionProto):
            proto = item
        else:
            problems.append(f"{item!r} is neither an onnx.FunctionProto nor an @onnxscript.script function")
            continue
        if not proto.domain:
            problems.append(f"function {proto.name} has no domain (it must be the custom op's domain)")
        else:
            functions.append(proto)
    return Checked(functions, tuple(problems))


def _check_keyed(result: Any, key: Callable[[Any], Any], kind: type, what: str, example: str) -> Checked:
    if result is None:
        return Checked({})
    if not isinstance(result, Mapping):
        raise Broken(f"must return a dict {{{what}: [{kind.__name__}, ...]}}, got {_type(result)}")
    found: dict[Any, list[Any]] = {}
    problems = []
    for raw, samples in result.items():
        try:
            name = key(raw)
        except Exception as e:
            problems.append(f"key {raw!r}: {e}")
            continue
        if isinstance(samples, (str, bytes, Mapping)) or not isinstance(samples, (list, tuple)):
            problems.append(f"{name}: must be a list of opreg.testing.{kind.__name__}, got {_type(samples)}")
        elif not samples:
            problems.append(f"{name}: the list of samples is empty")
        elif bad := [s for s in samples if not isinstance(s, kind)]:
            problems.append(f"{name}: {bad[0]!r} is not an opreg.testing.{kind.__name__} (build one with {example})")
        else:
            found.setdefault(name, []).extend(samples)
    return Checked(found, tuple(problems))


def _rule_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("it is not a rule name")
    return name


def _check_samples(result: Any) -> Checked:
    from opreg.opname import OpName

    return _check_keyed(result, OpName.of, Sample, "torch_op", "Sample.of(*args)")


def _check_rewrite_samples(result: Any) -> Checked:
    return _check_keyed(result, _rule_name, ModelSample, "rule_name", "ModelSample.of(module, *args)")


def _check_capture_patches(result: Any) -> Checked:
    patches, problems, names = [], [], set()
    for item in _items(result, "opreg.CapturePatch"):
        if not isinstance(item, CapturePatch):
            problems.append(f"{item!r} is not an opreg.CapturePatch")
        elif item.name in names:
            problems.append(f"two patches are named {item.name!r}: names must be unique in a pack")
        else:
            names.add(item.name)
            patches.append(item)
    return Checked(patches, tuple(problems))


def _check_capture_samples(result: Any) -> Checked:
    return _check_keyed(result, _patch_name, ModelSample, "patch_name", "ModelSample.of(module, *args)")


def _patch_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("it is not a patch name")
    return name


def _check_rewrite_rules(result: Any) -> Checked:
    try:
        return Checked(rewrites_of(result))
    except ValueError as e:
        raise Broken(str(e)) from None


CONTRACTS: dict[str, Contract] = {
    contract.hook: contract
    for contract in (
        Contract("opreg_register_ops", REGISTRY_BUILD, _nothing),
        Contract("opreg_targets", REGISTRY_BUILD, _check_targets),
        Contract("opreg_schemas", REGISTRY_BUILD, _check_schemas),
        Contract("opreg_reference_kernels", REFERENCE, _check_reference_kernels),
        Contract("opreg_configure_session", SESSION, _nothing),
        Contract("opreg_functions", EMBED, _check_functions),
        Contract("opreg_samples", KIT, _check_samples),
        Contract("opreg_rewrite_rules", EXPORT, _check_rewrite_rules),
        Contract("opreg_rewrite_samples", KIT, _check_rewrite_samples),
        Contract("opreg_capture_patches", CAPTURE, _check_capture_patches),
        Contract("opreg_capture_samples", KIT, _check_capture_samples),
    )
}
"""Every hook's :class:`Contract`, by name: the one place that says when opreg calls it and how its
result is checked (``tests/test_hooks.py`` keeps it in step with the specs above)."""


def rewrites_of(result: Any) -> list[tuple[Any, tuple[str, ...]]]:
    """``(item, names)`` of each rewrite in what ``opreg_rewrite_rules`` returned: a rule's name, the
    names of a rule set's rules, a pass's class name. ``ValueError`` naming the first problem (a
    wrong type, a rule without a name, a name used twice)."""
    if result is None:
        return []
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, (list, tuple)):
        raise ValueError(f"must return a list of rewrite rules, rule sets and passes, got {_type(result)}")
    from onnx_ir.passes import PassBase
    from onnxscript.rewriter import pattern

    rewrites = []
    seen: set[str] = set()
    for item in result:
        if isinstance(item, pattern.RewriteRule):
            names: tuple[Any, ...] = (item.name,)
        elif isinstance(item, pattern.RewriteRuleSet):
            names = tuple(rule.name for rule in item.rules)
        elif isinstance(item, PassBase):
            names = (type(item).__name__,)
        else:
            raise ValueError(
                f"returned {item!r}, which is neither an onnxscript RewriteRule or RewriteRuleSet nor an "
                "onnx_ir.passes.PassBase"
            )
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError(
                f"returned a rule without a name ({item!r}): give each rule one, e.g. RewriteRule(pattern, "
                "replacement, check, name='MyFusion'); opreg records it on the nodes"
            )
        twice = sorted(seen.intersection(names)) or sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"returned two rewrites named {twice[0]!r}: names must be unique")
        seen.update(names)
        rewrites.append((item, names))
    return rewrites
