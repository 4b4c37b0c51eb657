"""The conformance kit: check that an installed op pack does what opreg expects.

:func:`check_pack` loads the pack (beside the core pack only) and runs these
checks, each giving :class:`CheckResult` rows:

- ``load``: the pack loads, and opreg rejected none of its impls (an impl
  whose signature does not match the torch op's schema is rejected here);
- ``import``: importing its entry point in a fresh interpreter does not
  import onnxruntime and takes under ``opreg.plugins.slow_import_seconds()`` (torch is reported);
- ``hooks``: every hook it implements returns what ``opreg.hookspecs`` says;
- ``conflicts``: none of its impls ties with a core impl (or with another of
  its own) at the targets its impls are checked at;
- ``kernels``: every custom domain its impls emit can run somewhere: a
  reference kernel, a session configuration or function definitions;
- ``samples``: each impl, forced to be chosen, is exported for the lowest and
  highest targets it claims, run, and compared with eager PyTorch on
  PyTorch's OpInfo samples (ATen ops) or the pack's ``opreg_samples``; random
  results of the OpInfos in ``opinfo.RANDOM`` by distribution. An
  impl whose samples could only be compared by shape and dtype (random or
  uninitialized results) is ``skipped``, saying so, not ``passed``;
- ``rewrites``: each rewrite rule the pack offers (``opreg_rewrite_rules``) at
  its profiles and the targets its impls are checked at is driven with the
  pack's ``opreg_rewrite_samples``: each model is exported at that target, the
  rule must fire (a node records ``opreg.rewrite = pack:rule``), and the model
  must match eager PyTorch;
- ``patches``: each capture patch the pack offers (``opreg_capture_patches``)
  must name a module and function that exist in the installed library (a
  library that is missing, or at a version the patch was not written for, is
  ``skipped``), and on each of the pack's ``opreg_capture_samples`` models the
  eager outputs with the patch installed must equal those without it, the
  patch having been called.

:meth:`PackCheck.assert_ok` fails on any failed row, and also (unless
``allow_unsampled=True``) when no impl of the pack could be driven with a
sample at all, or when a rewrite rule or a capture patch has no sample: a pack
with no samples has not been checked.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from packaging.utils import canonicalize_name

from opreg import plugins
from opreg._inspect import short_source
from opreg.errors import PluginNotFoundError
from opreg.pluginapi import HookError, ModelSample, Sample
from opreg.registrar import Registrar
from opreg.registry import Impl, Registry
from opreg.testing._samples import (
    DISTRIBUTION,
    FAILED,
    PASSED,
    SHAPE_ONLY,
    SKIPPED,
    Compare,
    SampleCheck,
)

LOAD = "load"
IMPORT = "import"
HOOKS = "hooks"
CONFLICTS = "conflicts"
KERNELS = "kernels"
SAMPLES = "samples"
REWRITES = "rewrites"
PATCHES = "patches"
CHECKS = (LOAD, IMPORT, HOOKS, CONFLICTS, KERNELS, SAMPLES, REWRITES, PATCHES)
"""The checks, in the order they run and are reported."""

OPINFO_LIMIT = 8
"""OpInfo samples per OpInfo (float32) an ATen impl is driven with."""
LOWEST_CHECKED_OPSET = 18
"""The lowest ai.onnx version an impl is exported for (opreg's oldest default target)."""
NO_SAMPLES = "no samples: provide them with opreg_samples"
NO_REWRITE_SAMPLES = "no samples: provide models in which the rule fires with opreg_rewrite_samples"
REWRITE_SUBJECT = "rewrite "
"""How a rewrite rule is named among the :attr:`PackCheck.unsampled` (``rewrite pack:rule``)."""
NO_PATCH_SAMPLES = "no samples: provide models that call the patched code with opreg_capture_samples"
PATCH_SUBJECT = "patch "
"""How a capture patch is named among the :attr:`PackCheck.unsampled` (``patch pack:name``)."""
IMPORT_TIMEOUT = 300.0

_STATUSES = (PASSED, FAILED, SKIPPED)


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    """One row of a :class:`PackCheck`.

    Fields:
        check: which check (``load``, ``import``, ``hooks``, ``conflicts``,
            ``kernels``, ``samples``).
        subject: what was checked: the pack, a hook, a domain, an impl
            (``pack:function for op``).
        target: the target it was checked at (``""`` when none applies).
        status: ``passed``, ``failed`` or ``skipped``.
        detail: what was found, or the error.
    """

    check: str
    subject: str
    target: str
    status: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise ValueError(f"status must be one of {', '.join(_STATUSES)}, got {self.status!r}")

    def __str__(self) -> str:
        where = f" at {self.target}" if self.target else ""
        text = f"[{self.check}] {self.subject}{where}: {self.status}"
        return f"{text}: {self.detail}" if self.detail else text


@dataclasses.dataclass(frozen=True, slots=True)
class PackCheck:
    """What :func:`check_pack` found for one pack.

    Fields:
        pack: the pack's entry-point name.
        distribution: the distribution that declares it.
        version: that distribution's version.
        results: every check's rows, in :data:`CHECKS` order.
        seconds: how long the kit ran.
        unsampled: the impls (``samples`` subjects) no sample went through: the kit
            had none for them, torch rejected every one, or none reached the impl;
            the rewrite rules without samples (``rewrite pack:rule``); and the
            capture patches without samples (``patch pack:name``).
    """

    pack: str
    distribution: str
    version: str
    results: tuple[CheckResult, ...]
    seconds: float = 0.0
    unsampled: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No result failed."""
        return not self.failures()

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAILED]

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def summary(self) -> str:
        return (
            f"pack {self.pack!r} ({self.distribution} {self.version}): {self.count(PASSED)} passed, "
            f"{self.count(FAILED)} failed, {self.count(SKIPPED)} skipped in {self.seconds:.1f} s"
        )

    def assert_ok(self, *, allow_unsampled: bool = False) -> None:
        """Raise :class:`AssertionError` listing every failure (check, subject, target, detail),
        or, unless ``allow_unsampled``, saying that no impl of the pack was driven with a sample."""
        failures = self.failures()
        if failures:
            lines = [f"{self.summary()}; failures:", *(f"  - {r}" for r in failures)]
            raise AssertionError("\n".join(lines))
        unchecked = {
            PATCH_SUBJECT: (
                "capture patches",
                "never compared a model run through them with the same model run without them",
                "Return models that call the patched code from opreg_capture_samples",
                "patch_name",
                "patches",
            ),
            REWRITE_SUBJECT: (
                "rewrite rules",
                "never saw them fire nor compared their models with eager PyTorch",
                "Return models holding their patterns from opreg_rewrite_samples",
                "rule_name",
                "rules",
            ),
        }
        for prefix, (what, missed, fix, key, plural) in unchecked.items():
            names = [u.removeprefix(prefix) for u in self.unsampled if u.startswith(prefix)]
            if names and not allow_unsampled:
                raise AssertionError(
                    f"{self.summary()}; these {what} have no sample, so the kit {missed}: {', '.join(names)}. "
                    f"{fix} ({{{key}: [opreg.testing.ModelSample.of(module, *inputs)]}}), or call "
                    f"assert_ok(allow_unsampled=True) to accept unchecked {plural}"
                )
        impls = {r.subject for r in self.results if r.check == SAMPLES and r.subject != self.pack}
        if impls and set(self.unsampled) >= impls and not allow_unsampled:
            why = [r for r in self.results if r.check == SAMPLES]
            lines = [
                f"{self.summary()}; none of its {len(impls)} impl(s) was driven with a sample, so the kit "
                "compared nothing with eager PyTorch. Provide sample inputs with the opreg_samples hook "
                "(return {torch_op: [opreg.testing.Sample.of(...), ...]}), or call "
                "assert_ok(allow_unsampled=True) to accept an unchecked pack:",
                *(f"  - {r}" for r in why),
            ]
            raise AssertionError("\n".join(lines))

    def as_dict(self) -> dict[str, Any]:
        return {
            "pack": self.pack,
            "distribution": self.distribution,
            "version": self.version,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "results": [dataclasses.asdict(r) for r in self.results],
            "unsampled": list(self.unsampled),
        }

    def __str__(self) -> str:
        columns = ("check", "subject", "target", "status", "detail")
        rows = [columns, *((r.check, r.subject, r.target, r.status, r.detail) for r in self.results)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(columns) - 1)]
        lines = [self.summary()]
        for n, row in enumerate(rows):
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            lines.append("  ".join([*cells, row[-1]]).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in [*widths, len(columns[-1])]))
        return "\n".join(lines)


# -- finding the pack -------------------------------------------------------------


def find_pack(name: str) -> plugins.DiscoveredPack:
    """The installed pack called ``name``: its entry-point name, its distribution's
    name, or the module its entry point names. Raises :class:`PluginNotFoundError`
    listing the installed packs."""
    found = plugins.discovered()
    for f in found:
        if f.name == name:
            return f
    for f in found:
        if canonicalize_name(name) == canonicalize_name(f.distribution) or name in (f.module, f.module.split(".")[0]):
            return f
    installed = ", ".join(f"{f.name} ({f.distribution})" for f in found) or "none"
    raise PluginNotFoundError(
        f"no installed pack named {name!r} (by pack, distribution or module name); installed packs: "
        f"{installed}. pip install the pack, or check `opreg plugins`"
    )


# -- the kit ------------------------------------------------------------------------


def check_pack(name: str, *, opinfo_limit: int = OPINFO_LIMIT) -> PackCheck:
    """Run the conformance kit on the installed pack ``name`` (pack, distribution
    or module name); see the module docstring for the checks.

    The pack's impls are checked beside the core pack's only, so other installed
    packs' impls cannot hide or cause its problems; what the other installed
    packs declare for every export to use, the ONNX schemas of their custom
    ops and their target profiles, is there, as an export with the installed
    packs sees it (an impl may call ``com.microsoft::Gelu`` by name when
    ``opreg-ort-contrib`` is installed, and be for its ``onnxruntime`` profile).
    Raises :class:`PluginNotFoundError` if no installed pack has that name.
    """
    started = time.perf_counter()
    unsampled: list[str] = []
    found = find_pack(name)
    pack = found.name
    registry = _as_exported(plugins.default_registry(plugins=[pack]))
    report = next(r for r in registry.packs if r.name == pack)
    results: list[CheckResult] = []
    results += _check_load(report)
    results += _check_import(found)
    if report.status == plugins.LOADED:
        impls = [i for i in registry.impls() if i.pack == pack]
        hook_results = _HookResults()
        results += _check_hooks(registry, pack, impls, hook_results)
        targets = {id(impl): impl_targets(impl, registry.profiles) for impl in impls}
        results += _check_conflicts(registry, pack, impls, targets)
        results += _check_kernels(impls, hook_results)
        rows, unsampled = _check_samples(registry, impls, targets, hook_results.samples, opinfo_limit)
        results += rows
        rows, unchecked = _check_rewrites(registry, pack, rewrite_targets(registry, pack, impls), hook_results)
        results += rows
        unsampled += unchecked
        rows, unchecked = _check_patches(registry, pack, hook_results)
        results += rows
        unsampled += unchecked
    else:
        why = "the pack did not load (see the load check)"
        checks = (HOOKS, CONFLICTS, KERNELS, SAMPLES, REWRITES, PATCHES)
        results += [CheckResult(check, pack, "", SKIPPED, why) for check in checks]
    seconds = time.perf_counter() - started
    return PackCheck(pack, found.distribution, found.version, tuple(results), seconds, tuple(unsampled))


def _as_exported(registry: Registry) -> Registry:
    """``registry`` (the pack beside the core pack) with what every installed pack declares for an
    export: loading them all registers their ONNX schemas, and their target profiles are added."""
    everything = plugins.default_registry(plugins=pack_names())
    owners = {name: pack for name, _, pack in everything.data().profiles}
    extended = registry.copy()
    for name, versions in everything.profiles.items():
        if name not in registry.profiles:
            extended.add_profile(name, versions, pack=owners[name])
    return extended.freeze()


# -- load -----------------------------------------------------------------------------


def _check_load(report: plugins.PackReport) -> list[CheckResult]:
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


def _check_import(found: plugins.DiscoveredPack) -> list[CheckResult]:
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
class _HookResults:
    """What the pack's runtime hooks returned, for the later checks."""

    kernels: list[Any] = dataclasses.field(default_factory=list)
    functions: list[Any] = dataclasses.field(default_factory=list)
    samples: dict[Any, list[Sample]] = dataclasses.field(default_factory=dict)
    rewrite_samples: dict[str, list[ModelSample]] = dataclasses.field(default_factory=dict)
    patch_samples: dict[str, list[ModelSample]] = dataclasses.field(default_factory=dict)
    configures_session: bool = False


def _record(hook: str, value: Any, found: _HookResults, impls: Sequence[Impl]) -> list[str]:
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


def _check_hooks(registry: Registry, pack: str, impls: Sequence[Impl], found: _HookResults) -> list[CheckResult]:
    hooks = plugins.host_of(registry).packs
    rows = []
    for hook in hooks.implemented(pack):
        try:  # the hook's contract (opreg.hookspecs.CONTRACTS), as the loader and the exporter check it
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
    from opreg.targets import newest_supported_opset

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


def _target_text(registry: Registry, target: Mapping[str, int]) -> str:
    return str(registry.target(dict(target)))


def _check_conflicts(
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
    if not rows:
        rows.append(CheckResult(CONFLICTS, pack, "", PASSED, f"no ties with the core pack at {len(seen)} target(s)"))
    return rows


def _check_kernels(impls: Sequence[Impl], found: _HookResults) -> list[CheckResult]:
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


def _check_samples(
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
        subject = f"{impl.label} for {impl.op}"
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


def _check_rewrites(
    registry: Registry, pack: str, targets: Sequence[Any], found: _HookResults
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


def _check_patches(registry: Registry, pack: str, found: _HookResults) -> tuple[list[CheckResult], list[str]]:
    """The rows, and the patches (``patch pack:name``) with no sample."""
    from opreg import patching

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

    from opreg import patching
    from opreg.exporter.diagnosis.compare import compare_output

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


def pack_names() -> Iterable[str]:
    """Entry-point names of the installed packs, in load order."""
    return [f.name for f in plugins.discovered()]
