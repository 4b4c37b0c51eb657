"""The conformance kit's checks of a pack as loaded: ``load``, ``import``, ``hooks``, ``conflicts`` and
``kernels`` (what each checks: :mod:`opreg.testing._kit`)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from opreg.packs import plugins
from opreg.pluginapi import HookError, ModelSample, Sample
from opreg.registry.impls import Impl
from opreg.registry.registrar import Registrar
from opreg.registry.registry import Registry
from opreg.testing._kit_report import CONFLICTS, HOOKS, IMPORT, KERNELS, LOAD, CheckResult
from opreg.testing._samples import FAILED, PASSED, SKIPPED

LOWEST_CHECKED_OPSET = 18
"""The lowest ai.onnx version an impl is exported for (opreg's oldest default target)."""
IMPORT_TIMEOUT = 300.0


# -- load -----------------------------------------------------------------------------


def check_load(report: plugins.PackReport) -> list[CheckResult]:
    subject = report.name
    if report.status != plugins.LOADED:
        return [CheckResult(LOAD, subject, "", FAILED, report.describe())]
    rows = [
        CheckResult(LOAD, f"{x.function} for {x.op}", "", FAILED, f"impl rejected: {x.error}") for x in report.rejected
    ]
    problems = [p for p in report.reason.split("; ") if p and not p.endswith("impl(s) rejected")]
    rows += [CheckResult(LOAD, subject, "", FAILED, p) for p in problems]
    if not rows:
        detail = f"{report.impls} impl(s); domains {', '.join(report.domains)}"
        if report.profiles:
            detail += f"; profiles {', '.join(report.profiles)}"
        rows.append(CheckResult(LOAD, subject, "", PASSED, detail))
    return rows


# -- import ----------------------------------------------------------------------------

_IMPORT_PROBE = """
import importlib.metadata, json, sys, time
path, group, name, value, watched = json.loads(sys.argv[1])
sys.path[:] = path
ep = next(e for e in importlib.metadata.entry_points(group=group) if e.name == name and e.value == value)
started = time.perf_counter()
try:
    ep.load()
    error = None
except BaseException as e:
    error = f"{type(e).__name__}: {e}"
seconds = time.perf_counter() - started
print(json.dumps({"error": error, "seconds": seconds, "modules": [m for m in watched if m in sys.modules]}))
"""

HEAVY_MODULES = ("onnxruntime", "torch")
"""Modules the import check looks for: onnxruntime fails it, torch is reported."""


def check_import(found: plugins.DiscoveredPack) -> list[CheckResult]:
    """Load the entry point in a fresh interpreter with this one's ``sys.path``."""
    ep = found.entry_point
    subject = f"{ep.name} = {ep.value}"
    payload = json.dumps([sys.path, plugins.ENTRY_POINT_GROUP, ep.name, ep.value, HEAVY_MODULES])
    try:
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE, payload],
            capture_output=True, text=True, timeout=IMPORT_TIMEOUT, check=False,
        )  # fmt: skip
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as e:
        return [CheckResult(IMPORT, subject, "", FAILED, f"could not run the import probe: {type(e).__name__}: {e}")]
    if outcome["error"]:
        return [CheckResult(IMPORT, subject, "", FAILED, f"the entry point does not import: {outcome['error']}")]
    modules = outcome["modules"]
    took = f"{outcome['seconds']:.2f} s"
    if "onnxruntime" in modules:
        detail = (
            f"importing the pack imports onnxruntime ({took}): import it inside the hooks that need it "
            "(opreg_configure_session), never at module level"
        )
        return [CheckResult(IMPORT, subject, "", FAILED, detail)]
    threshold = plugins.slow_import_seconds()
    if outcome["seconds"] > threshold:
        heavy = " (it imports torch)" if "torch" in modules else ""
        detail = (
            f"importing the pack takes {took}{heavy}, more than {threshold:g} s: every process "
            "that discovers packs pays it; import heavy modules inside the hooks that need them"
        )
        return [CheckResult(IMPORT, subject, "", FAILED, detail)]
    note = f"; it imports torch at import time ({took}): deferring it makes discovery cheaper" if modules else ""
    return [CheckResult(IMPORT, subject, "", PASSED, f"imports without onnxruntime in {took}{note}")]


# -- hooks -------------------------------------------------------------------------------


@dataclasses.dataclass
class HookResults:
    """What the pack's runtime hooks returned, for the later checks."""

    kernels: list[Any] = dataclasses.field(default_factory=list)
    functions: list[Any] = dataclasses.field(default_factory=list)
    samples: dict[Any, list[Sample]] = dataclasses.field(default_factory=dict)
    rewrite_samples: dict[str, list[ModelSample]] = dataclasses.field(default_factory=dict)
    patch_samples: dict[str, list[ModelSample]] = dataclasses.field(default_factory=dict)
    configures_session: bool = False


def _record(hook: str, value: Any, found: HookResults, impls: Sequence[Impl]) -> list[str]:
    """Keep what a pack's hook returned (already checked by its contract) for the later checks;
    the problems only the kit can see (samples for an op the pack has no impl of)."""
    if hook == "opreg_reference_kernels":
        found.kernels.extend(value)
    elif hook == "opreg_functions":
        found.functions.extend(value)
    elif hook == "opreg_configure_session":
        found.configures_session = True
    elif hook == "opreg_rewrite_samples":
        for name, samples in value.items():
            found.rewrite_samples.setdefault(name, []).extend(samples)
    elif hook == "opreg_capture_samples":
        for name, samples in value.items():
            found.patch_samples.setdefault(name, []).extend(samples)
    elif hook == "opreg_samples":
        ops = {i.op for i in impls}
        for op, samples in value.items():
            found.samples.setdefault(op, []).extend(samples)
        return [f"samples for {op}, which the pack registers no impl for" for op in value if op not in ops]
    return []


def _hook_arguments(hook: str, pack: str, registry: Registry) -> dict[str, Any]:
    if hook == "opreg_register_ops":
        return {"registry": Registrar(pack)}
    if hook == "opreg_rewrite_rules":  # the pack's own profile if it has one; the rewrites check tries them all
        profiles = registry.packs.report(pack).profiles
        return {"target": registry.target(profiles[0] if profiles else "onnx")}
    if hook == "opreg_configure_session":
        import onnxruntime

        return {"options": onnxruntime.SessionOptions()}
    return {}


def check_hooks(registry: Registry, pack: str, impls: Sequence[Impl], found: HookResults) -> list[CheckResult]:
    hooks = plugins.host_of(registry).packs
    rows = []
    for hook in hooks.implemented(pack):
        try:  # the hook's contract (opreg.packs.hookspecs.CONTRACTS), as the loader and the exporter check it
            checked = hooks.call_pack(pack, hook, **_hook_arguments(hook, pack, registry))
        except HookError as e:
            rows.append(CheckResult(HOOKS, hook, "", FAILED, e.problem))
            continue
        problems = [*checked.problems, *_record(hook, checked.value, found, impls)]
        rows += [CheckResult(HOOKS, hook, "", FAILED, p) for p in problems]
        if not problems:
            rows.append(CheckResult(HOOKS, hook, "", PASSED, "returns what the hookspec says"))
    if not rows:
        rows.append(CheckResult(HOOKS, pack, "", SKIPPED, "the pack implements no hook"))
    return rows


# -- targets, conflicts, kernels ----------------------------------------------------------


def impl_targets(impl: Impl, profiles: Mapping[str, Mapping[str, int]] | None = None) -> list[dict[str, int]]:
    """The targets ``impl`` is checked at: the lowest (at least
    :data:`LOWEST_CHECKED_OPSET`) and highest (at most the installed
    onnxruntime's newest) ai.onnx version it supports, each with every custom
    domain at the low and at the high end of its range; an impl for profiles
    (``profiles=``) with the custom domains of the first of them ``profiles``
    defines, so that it applies (none: it is checked nowhere)."""
    from opreg.registry.targets import newest_supported_opset

    gate: dict[str, int] = {}
    if impl.profiles:
        known = [profiles[name] for name in impl.profiles if profiles and name in profiles]
        if not known:
            return []
        gate = {d: v for d, v in known[0].items() if d}

    onnx = impl.requirement.onnx
    top = newest_supported_opset() if onnx.max is None else min(onnx.max, newest_supported_opset())
    low = max(LOWEST_CHECKED_OPSET, onnx.min)
    if onnx.max is not None:
        low = min(low, onnx.max)
    high = max(top, low)
    ranges = impl.requirement.domains
    ends = [
        {d: r.min for d, r in ranges},
        {d: r.min if r.max is None else r.max for d, r in ranges},
    ]
    targets: list[dict[str, int]] = []
    for version in (low, high):
        for domains in ends:
            target = {"": version, **gate, **domains}
            if target not in targets:
                targets.append(target)
    return targets


def check_conflicts(
    registry: Registry, pack: str, impls: Sequence[Impl], targets: Mapping[int, list[dict[str, int]]]
) -> list[CheckResult]:
    if pack == plugins.CORE_PACK:
        return [CheckResult(CONFLICTS, pack, "", SKIPPED, "this is the core pack")]
    ops = {i.op for i in impls}
    seen: list[dict[str, int]] = []
    for impl in impls:
        seen += [t for t in targets[id(impl)] if t not in seen]
    rows = []
    for target in seen:
        for conflict in registry.conflicts(dict(target)):
            if conflict.op not in ops:
                continue
            ours = [i for i in conflict.impls if i.pack == pack]
            others = [i for i in conflict.impls if i.pack != pack]
            if ours and (others or len(ours) > 1):
                rivals = ", ".join(i.label for i in conflict.impls if i is not ours[0])
                rows.append(CheckResult(
                    CONFLICTS, f"{ours[0].label} for {conflict.op}", str(conflict.target), FAILED,
                    f"ties with {rivals} (same priority, no predicate; {conflict.impls[0].label} wins by name): "
                    "raise priority or add a predicate",
                ))  # fmt: skip
    rows += never_chosen(registry, impls)
    if not rows:
        rows.append(CheckResult(CONFLICTS, pack, "", PASSED, f"no ties with the core pack at {len(seen)} target(s)"))
    return rows


def never_chosen(registry: Registry, impls: Sequence[Impl]) -> list[CheckResult]:
    """A failed row for each impl for profiles (``profiles=``, no predicate) that resolution does not choose
    at any of its profiles it applies at, nor another mark of its function: what an export at ``-t PROFILE``
    would not use, with ``explain``'s reason."""
    rows = []
    for impl in impls:
        if not impl.profiles or impl.conditional:
            continue
        profiles = [registry.target(name) for name in impl.profiles if name in registry.profiles]
        applies = [target for target in profiles if registry.unmet(impl, target) is None]
        winners = [registry.resolve(impl.op, target) for target in applies]
        if not applies or any(w is impl or (w is not None and w.label == impl.label) for w in winners):
            continue  # chosen, or another mark of the same function is (a newer opset's)
        (row,) = [c for c in registry.explain(impl.op, applies[0]).candidates if c.impl is impl]
        rows.append(CheckResult(
            CONFLICTS, f"{impl.label} for {impl.op}", str(applies[0]), FAILED,
            f"for profile {', '.join(impl.profiles)}, but never chosen there ({row.reason}): raise its priority, "
            "or remove the impl that wins",
        ))  # fmt: skip
    return rows


def check_runtime_kernels(impls: Sequence[Impl], targets: Mapping[int, list[dict[str, int]]]) -> list[CheckResult]:
    """Each impl at each target it is checked at, against the installed ONNX Runtime release's CPU
    kernel table (:func:`opreg.registry.resolution.unplaced`): a failed row names the impl, the op and the
    release, and the releases that have it. Skipped when no onnxruntime is installed."""
    from opreg.registry import runtimes
    from opreg.registry.resolution import unplaced
    from opreg.registry.targets import Target, newest_onnxruntime_opset

    if runtimes.installed_version() is None:
        return [CheckResult(KERNELS, "onnxruntime", "", SKIPPED, "onnxruntime is not installed")]
    release = runtimes.installed_release(newest_onnxruntime_opset)
    rows = []
    for impl in impls:
        for versions in targets.get(id(impl), ()):
            target = Target(tuple(sorted(versions.items())), runtime=release.version)
            why = unplaced(impl, target)
            if why is not None:
                rows.append(CheckResult(KERNELS, f"{impl.label} for {impl.op}", str(target), FAILED, why))
                break  # one target says it; the others would repeat it
    if not rows:
        rows.append(CheckResult(
            KERNELS, "onnxruntime", "", PASSED,
            f"every op the pack's impls emit has a CPU kernel in {release.label} at the targets they are checked at",
        ))  # fmt: skip
    return rows


def check_kernels(impls: Sequence[Impl], found: HookResults) -> list[CheckResult]:
    from opreg.exporter._runtime import ORT_BUILTIN_DOMAINS

    domains = sorted({d for i in impls for d, _ in i.requirement.domains})
    rows = []
    for domain in domains:
        ways = []
        if domain in ORT_BUILTIN_DOMAINS:
            ways.append("built into ONNX Runtime")
        kernels = sorted(k.__name__ for k in found.kernels if k.op_domain == domain)
        if kernels:
            ways.append(f"reference kernels {', '.join(kernels)}")
        functions = sorted(f.name for f in found.functions if f.domain == domain)
        if functions:
            ways.append(f"function definitions {', '.join(functions)}")
        if found.configures_session:
            ways.append("a session configuration (opreg_configure_session)")
        if ways:
            rows.append(CheckResult(KERNELS, domain, "", PASSED, "; ".join(ways)))
        else:
            rows.append(CheckResult(
                KERNELS, domain, "", FAILED,
                "nothing can run this domain's ops: provide reference kernels (opreg_reference_kernels), "
                "a session configuration (opreg_configure_session) or function definitions (opreg_functions)",
            ))  # fmt: skip
    if not rows:
        rows.append(CheckResult(KERNELS, "ai.onnx", "", PASSED, "the pack emits no custom domain"))
    return rows
