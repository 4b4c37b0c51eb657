"""The conformance kit's checks that drive a pack's code with samples: ``samples`` (each impl, on
OpInfo samples or the pack's own), ``rewrites`` (each rewrite rule, on models in which it fires) and
``patches`` (each capture patch, on models that call the patched code)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opreg.packs import plugins
from opreg.pluginapi import HookError, ModelSample, Sample
from opreg.registry._inspect import short_source
from opreg.registry.impls import Impl
from opreg.registry.registry import Registry
from opreg.testing._kit_pack import HookResults, impl_targets
from opreg.testing._kit_report import PATCH_SUBJECT, PATCHES, REWRITE_SUBJECT, REWRITES, SAMPLES, CheckResult
from opreg.testing._samples import (
    DISTRIBUTION,
    FAILED,
    PASSED,
    SHAPE_ONLY,
    SKIPPED,
    Compare,
    SampleCheck,
)

NO_SAMPLES = "no samples: provide them with opreg_samples"
NO_REWRITE_SAMPLES = "no samples: provide models in which the rule fires with opreg_rewrite_samples"
NO_PATCH_SAMPLES = "no samples: provide models that call the patched code with opreg_capture_samples"


# -- samples ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Drive:
    """One call of ``check_samples`` for an impl: what to call, with what, named how."""

    fn: Callable[..., Any]
    samples: list[Sample]
    source: str
    values: bool = True
    compare: Compare | None = None


def _torch_op(op: Any) -> Any:
    import torch

    return getattr(getattr(getattr(torch.ops, op.namespace), op.name), op.overload)


def _drives(impl: Impl, provided: Mapping[Any, list[Sample]], limit: int) -> tuple[list[_Drive], str]:
    """What to drive ``impl`` with, or ``([], why not)``."""
    if impl.op in provided:
        try:
            fn = _torch_op(impl.op)
        except Exception as e:
            return [], f"torch has no op {impl.op} to compare with: {type(e).__name__}: {e}"
        return [_Drive(fn, provided[impl.op], "opreg_samples")], ""
    if impl.op.namespace != "aten":
        return [], NO_SAMPLES
    import torch

    from opreg.testing import opinfo

    try:
        infos = opinfo.opinfos_for(impl.op)
    except ImportError as e:
        return [], f"PyTorch's OpInfo samples are unavailable ({e}); or {NO_SAMPLES}"
    drives = []
    for info in infos:
        supported = info.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in supported else next(iter(opinfo.dtypes_for(info)), None)
        if dtype is None:
            continue
        picked = opinfo.samples(info, dtype, limit)
        if picked:
            name = f"opinfo {opinfo.full_name(info)}"
            values = info.name not in opinfo.UNINITIALIZED
            drives.append(_Drive(opinfo.op_for(info), picked, name, values=values, compare=opinfo.compare_for(info)))
    return drives, "" if drives else f"PyTorch has no OpInfo for {impl.op}; {NO_SAMPLES}"


def _forced(registry: Registry, impl: Impl) -> Registry:
    """A copy of ``registry`` in which ``impl`` wins wherever it applies: an override, still named
    after its pack (``pack:function`` in every detail, as in the row's subject)."""
    forced = registry.copy()
    forced.add(dataclasses.replace(impl, override=True))
    return forced


def check_impl_samples(
    registry: Registry,
    impls: Sequence[Impl],
    targets: Mapping[int, list[dict[str, int]]],
    provided: Mapping[Any, list[Sample]],
    limit: int,
) -> tuple[list[CheckResult], list[str]]:
    """The rows, and the subjects of the impls no sample went through."""
    from opreg.testing._samples import check_samples

    rows: list[CheckResult] = []
    unsampled: list[str] = []
    for impl in impls:
        subject = subject_of(impl, impls)
        problem = _not_checkable(impl, registry, targets[id(impl)])
        if problem is not None:
            rows.append(CheckResult(SAMPLES, subject, "", FAILED, problem))
            continue
        drives, why_not = _drives(impl, provided, limit)
        if not drives:
            rows.append(CheckResult(SAMPLES, subject, "", SKIPPED, why_not))
            unsampled.append(subject)
            continue
        try:
            forced = _forced(registry, impl)
        except Exception as e:
            rows.append(CheckResult(SAMPLES, subject, "", FAILED, f"cannot be registered: {type(e).__name__}: {e}"))
            continue
        reached = False
        for drive in drives:
            checks = check_samples(
                drive.fn, drive.samples, targets=targets[id(impl)], name=drive.source, registry=forced,
                runtime="auto", values=drive.values, compare=drive.compare,
            )  # fmt: skip
            rows += [row for check in checks for row in _sample_rows(subject, impl, drive, check)]
            reached = reached or any(_reached(impl, check) for check in checks)
        if not reached:
            unsampled.append(subject)
    return rows, unsampled


def _not_checkable(impl: Impl, registry: Registry, targets: Sequence[Mapping[str, int]]) -> str | None:
    """Why driving ``impl`` with samples would check nothing: its body is still a stub that raises
    ``NotImplementedError`` (what ``opreg new-pack`` writes), or it is for profiles no installed pack
    defines, or for one that names no custom domain (every target serves it)."""
    if _unwritten(impl.function):
        where = f" ({short_source(impl.source)})" if impl.source else ""
        return f"not written yet: write the body of {impl.name}{where}"
    if impl.profiles and not targets:
        return (
            f"for profile {', '.join(impl.profiles)}, which no installed pack defines: it applies at no target "
            "(install the pack that contributes the profile, or fix the name)"
        )
    profiles = registry.profiles
    vacuous = [name for name in impl.profiles if name in profiles and set(profiles[name]) <= {""}]
    if vacuous:
        return (
            f"for profile {', '.join(vacuous)}, which names no custom domain: every target serves it, so "
            "profiles= keeps the impl from none (name a runtime's profile, such as onnxruntime, or drop it)"
        )
    return None


def _unwritten(function: Any) -> bool:
    """Whether ``function``'s body (its docstring aside) is one ``raise NotImplementedError(...)``."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(function, "function", function))))
    except (OSError, TypeError, SyntaxError):
        return False
    definition = tree.body[0] if tree.body else None
    if not isinstance(definition, ast.FunctionDef):
        return False
    body = definition.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def _reached(impl: Impl, check: SampleCheck) -> bool:
    """A sample went through ``impl``: it failed, or it ran (by value, distribution or shape) in a model made
    with the impl."""
    ran = check.count(PASSED) + check.count(DISTRIBUTION) + check.count(SHAPE_ONLY)
    return bool(check.failures()) or (ran > 0 and str(impl.op) in check.torch_ops)


def subject_of(impl: Impl, impls: Sequence[Impl]) -> str:
    """The row's subject for ``impl``: ``pack:function for op``, with its requirement where one function is
    marked more than once for the op (one mark per opset range), so each mark's rows are told apart."""
    marks = sum(1 for i in impls if i.label == impl.label and i.op == impl.op)
    return f"{impl.label} at {impl.requirement} for {impl.op}" if marks > 1 else f"{impl.label} for {impl.op}"


def _sample_rows(subject: str, impl: Impl, drive: _Drive, check: SampleCheck) -> list[CheckResult]:
    """One row per failed sample, or else one summary row for the impl, source and target."""
    failures = check.failures()
    if failures:
        return [
            CheckResult(
                SAMPLES, subject, check.target, FAILED, f"{drive.source} sample {r.index} ({r.label}): {r.detail}"
            )
            for r in failures
        ]
    return [_summary_row(subject, impl, drive, check)]


def _summary_row(subject: str, impl: Impl, drive: _Drive, check: SampleCheck) -> CheckResult:
    passed = check.count(PASSED) + check.count(DISTRIBUTION)
    shape_only = check.count(SHAPE_ONLY)
    skipped = [r for r in check.results if r.status == SKIPPED]
    if not passed and not shape_only:
        why = skipped[0].detail if skipped else "no sample ran"
        return CheckResult(SAMPLES, subject, check.target, SKIPPED, f"{drive.source}: every sample skipped ({why})")
    if str(impl.op) not in check.torch_ops:
        reached = ", ".join(sorted(check.torch_ops)) or "nothing"
        return CheckResult(
            SAMPLES, subject, check.target, SKIPPED,
            f"{drive.source}: the samples never reach {impl.op} (the model is made of {reached})",
        )  # fmt: skip
    by_torch = f", {len(skipped)} skipped by torch" if skipped else ""
    if not passed:
        return CheckResult(
            SAMPLES, subject, check.target, SKIPPED,
            f"{drive.source}: values not compared: {shape_only} sample(s) match by shape and dtype only "
            f"(random or uninitialized results){by_torch}",
        )  # fmt: skip
    more = f" ({check.count(DISTRIBUTION)} by distribution)" if check.count(DISTRIBUTION) else ""
    more += f", {shape_only} compared by shape and dtype only" if shape_only else ""
    return CheckResult(
        SAMPLES, subject, check.target, PASSED, f"{drive.source}: {passed} sample(s) match{more}{by_torch}"
    )


# -- rewrites ---------------------------------------------------------------------------------


def rewrite_targets(registry: Registry, pack: str, impls: Sequence[Impl]) -> list[Any]:
    """The targets a pack's rewrite rules are asked for: its own profiles, then the
    targets its impls are checked at (:func:`impl_targets`), each once."""
    targets = [registry.target(name) for name in registry.packs.report(pack).profiles]
    for impl in impls:
        targets += [registry.target(dict(t)) for t in impl_targets(impl, registry.profiles)]
    unique: list[Any] = []
    for target in targets:
        if all(target.versions != t.versions for t in unique):
            unique.append(target)
    return unique


def check_rewrites(
    registry: Registry, pack: str, targets: Sequence[Any], found: HookResults
) -> tuple[list[CheckResult], list[str]]:
    """The rows, and the rules (``rewrite pack:rule``) with no sample."""
    from opreg.exporter._rewrite import HOOK

    if HOOK not in plugins.host_of(registry).packs.implemented(pack):
        return [CheckResult(REWRITES, pack, "", PASSED, "the pack contributes no rewrite rules")], []
    rows: list[CheckResult] = []
    offered: dict[str, list[Any]] = {}
    for target in targets:
        try:
            for _item, names in plugins.host_of(registry).packs.call_pack(pack, HOOK, target=target).value:
                for name in names:
                    offered.setdefault(name, []).append(target)
        except HookError as e:
            rows.append(CheckResult(REWRITES, pack, str(target), FAILED, str(e)))
    unknown = sorted(set(found.rewrite_samples) - set(offered))
    for name in unknown:
        rows.append(CheckResult(
            REWRITES, f"{pack}:{name}", "", FAILED,
            f"opreg_rewrite_samples has samples for {name!r}, which {HOOK} offers at none of "
            f"{', '.join(map(str, targets))}",
        ))  # fmt: skip
    unsampled = []
    for name, where in offered.items():
        label = f"{pack}:{name}"
        samples = found.rewrite_samples.get(name)
        if not samples:
            rows.append(CheckResult(REWRITES, label, "", SKIPPED, NO_REWRITE_SAMPLES))
            unsampled.append(REWRITE_SUBJECT + label)
            continue
        for target in where:
            rows += [_drive_rewrite(registry, label, target, sample) for sample in samples]
    if not offered and not rows:
        rows.append(CheckResult(REWRITES, pack, "", PASSED, f"{HOOK} offers no rewrite at the targets checked"))
    return rows, unsampled


def _drive_rewrite(registry: Registry, label: str, target: Any, sample: ModelSample) -> CheckResult:
    """Export ``sample`` at ``target``: the rule ``label`` must fire and the model match eager PyTorch."""
    import copy

    from opreg.exporter import export
    from opreg.exporter._nodes import REWRITE_KEY

    where = str(target)
    module = sample.module.eval()
    try:
        args, kwargs = copy.deepcopy((sample.args, sample.kwargs))
        program = export(module, args, kwargs, target=target, registry=registry)
    except Exception as e:
        return CheckResult(REWRITES, label, where, FAILED, f"{sample.label}: export failed: {type(e).__name__}: {e}")
    import onnx_ir as ir

    nodes = list(ir.traversal.RecursiveGraphIterator(program.model.graph))
    made = sorted({
        f"{n.domain + '::' if n.domain else ''}{n.op_type}"
        for n in nodes
        if label in n.metadata_props.get(REWRITE_KEY, "").split("+")
    })  # fmt: skip
    if not made:
        ops = ", ".join(sorted({n.op_type for n in nodes}))
        return CheckResult(
            REWRITES, label, where, FAILED, f"{sample.label}: the rule did not fire (the exported model is {ops})"
        )
    rtol, atol = sample.tolerances()
    try:
        args, kwargs = copy.deepcopy((sample.args, sample.kwargs))
        verified = program.verify(*args, rtol=rtol, atol=atol, locate=True, **kwargs)
    except Exception as e:  # a mismatch's message ends with where it goes wrong (verify(locate=True))
        return CheckResult(REWRITES, label, where, FAILED, f"{sample.label}: fired ({', '.join(made)}), but {e}")
    return CheckResult(
        REWRITES, label, where, PASSED,
        f"{sample.label}: fired ({', '.join(made)}); matches eager PyTorch in {verified.runtime} "
        f"(max abs {verified.max_abs:.2g}, rtol {rtol:g}, atol {atol:g})",
    )  # fmt: skip


# -- capture patches ----------------------------------------------------------------------------


def check_patches(registry: Registry, pack: str, found: HookResults) -> tuple[list[CheckResult], list[str]]:
    """The rows, and the patches (``patch pack:name``) with no sample."""
    from opreg.packs import patching

    if patching.HOOK not in plugins.host_of(registry).packs.implemented(pack):
        return [CheckResult(PATCHES, pack, "", PASSED, "the pack offers no capture patches")], []
    offer = patching.offered(plugins.host_of(registry), registry.capture_patches())
    rows = [CheckResult(PATCHES, pack, "", FAILED, p.detail) for p in offer.problems if p.pack == pack]
    offered = [(p, patch) for p, patch in offer.patches if p == pack]
    names = {patch.name for _, patch in offered}
    for name in sorted(set(found.patch_samples) - names):
        rows.append(CheckResult(
            PATCHES, f"{pack}:{name}", "", FAILED,
            f"opreg_capture_samples has samples for {name!r}, which {patching.HOOK} does not offer",
        ))  # fmt: skip
    unsampled = []
    for _, patch in offered:
        label = f"{pack}:{patch.name}"
        version, fits = patching.installed_version(patch)
        if version is None or not fits:
            why = (
                f"{patching.requirement(patch).name} is not installed"
                if version is None
                else f"written for {patch.versions}, {version} is installed"
            )
            rows.append(CheckResult(PATCHES, label, "", SKIPPED, f"not checked: {why}"))
            continue
        try:
            patching.resolve(patch)
        except Exception as e:
            rows.append(CheckResult(PATCHES, label, "", FAILED, f"{patch.target} cannot be patched: {e}"))
            continue
        samples = found.patch_samples.get(patch.name)
        if not samples:
            rows.append(CheckResult(PATCHES, label, "", SKIPPED, NO_PATCH_SAMPLES))
            unsampled.append(PATCH_SUBJECT + label)
            continue
        rows += [_drive_patch(pack, patch, sample) for sample in samples]
    if not offered and not rows:
        rows.append(CheckResult(PATCHES, pack, "", PASSED, f"{patching.HOOK} offers no patch"))
    return rows, unsampled


def _drive_patch(pack: str, patch: Any, sample: ModelSample) -> CheckResult:
    """Run ``sample`` eagerly without the patch and with it installed: the patch must be called and the
    outputs must match."""
    import copy

    import torch

    from opreg.exporter.diagnosis.compare import compare_output
    from opreg.packs import patching

    label = f"{pack}:{patch.name}"
    module = sample.module.eval()
    rtol, atol = sample.tolerances()
    try:
        with torch.no_grad():
            args, kwargs = copy.deepcopy((sample.args, sample.kwargs))
            expected = module(*args, **kwargs)
            args, kwargs = copy.deepcopy((sample.args, sample.kwargs))
            with patching.PatchedCapture(patching.Offer(((pack, patch),))).installed(module) as outcomes:
                got = module(*args, **kwargs)
    except Exception as e:
        return CheckResult(PATCHES, label, "", FAILED, f"{sample.label}: raised {type(e).__name__}: {e}")
    outcome = outcomes[0] if outcomes else None
    if outcome is None or outcome.status != patching.APPLIED:
        why = outcome.detail if outcome is not None else "it was not installed"
        return CheckResult(PATCHES, label, "", FAILED, f"{sample.label}: the sample does not reach the patch ({why})")
    expected_leaves, expected_spec = torch.utils._pytree.tree_flatten(expected)
    got_leaves, got_spec = torch.utils._pytree.tree_flatten(got)
    if expected_spec != got_spec:
        return CheckResult(PATCHES, label, "", FAILED, f"{sample.label}: the outputs' structure differs")
    problems = []
    for index, (g, e) in enumerate(zip(got_leaves, expected_leaves, strict=True)):
        if isinstance(e, torch.Tensor):
            check = compare_output(f"output {index}", g, e, rtol, atol)
            if not check.ok:
                problems.append(f"{check.name}: {check.detail} (max abs {check.max_abs:.3g})")
        elif g != e:
            problems.append(f"output {index}: {g!r} where the unpatched model gives {e!r}")
    if problems:
        return CheckResult(PATCHES, label, "", FAILED, f"{sample.label}: with the patch, {'; '.join(problems)}")
    calls = f", called {outcome.calls} time(s)" if outcome.calls is not None else ""
    return CheckResult(
        PATCHES, label, "", PASSED,
        f"{sample.label}: {len(expected_leaves)} output(s) equal with and without the patch{calls} "
        f"(rtol {rtol:g}, atol {atol:g})",
    )  # fmt: skip
