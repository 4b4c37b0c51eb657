"""The conformance kit: check that an installed op pack does what opreg expects.

:func:`check_pack` loads the pack (beside the core pack only) and runs these
checks, each giving :class:`CheckResult` rows:

- ``load``: the pack loads, and opreg rejected none of its impls (an impl
  whose signature does not match the torch op's schema is rejected here);
- ``import``: importing its entry point in a fresh interpreter does not
  import onnxruntime and takes under ``opreg.packs.plugins.slow_import_seconds()`` (torch is reported);
- ``hooks``: every hook it implements returns what ``opreg.packs.hookspecs`` says;
- ``conflicts``: none of its impls ties with a core impl (or with another of
  its own) at the targets its impls are checked at;
- ``kernels``: every custom domain its impls emit can run somewhere: a
  reference kernel, a session configuration or function definitions; and
  every op each impl emits (ai.onnx, com.microsoft) has a CPU kernel in the
  installed ONNX Runtime release at the targets the impl is checked at (a
  failed row names the impl, the op, the release and the releases that have it);
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

import time
from collections.abc import Iterable

from packaging.utils import canonicalize_name

from opreg.errors import PluginNotFoundError
from opreg.packs import plugins
from opreg.registry.registry import Registry
from opreg.testing._kit_pack import (
    HookResults,
    check_conflicts,
    check_hooks,
    check_import,
    check_kernels,
    check_load,
    check_runtime_kernels,
    impl_targets,
)
from opreg.testing._kit_report import (
    CHECKS,
    CONFLICTS,
    HOOKS,
    KERNELS,
    PATCHES,
    REWRITES,
    SAMPLES,
    CheckResult,
    PackCheck,
)
from opreg.testing._kit_samples import check_impl_samples, check_patches, check_rewrites, rewrite_targets
from opreg.testing._samples import SKIPPED

__all__ = ["CHECKS", "CheckResult", "PackCheck", "check_pack", "find_pack", "impl_targets", "pack_names"]

OPINFO_LIMIT = 8
"""OpInfo samples per OpInfo (float32) an ATen impl is driven with."""


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
    results += check_load(report)
    results += check_import(found)
    if report.status == plugins.LOADED:
        impls = [i for i in registry.impls() if i.pack == pack]
        hook_results = HookResults()
        results += check_hooks(registry, pack, impls, hook_results)
        targets = {id(impl): impl_targets(impl, registry.profiles) for impl in impls}
        results += check_conflicts(registry, pack, impls, targets)
        results += check_kernels(impls, hook_results)
        results += check_runtime_kernels(impls, targets)
        rows, unsampled = check_impl_samples(registry, impls, targets, hook_results.samples, opinfo_limit)
        results += rows
        rows, unchecked = check_rewrites(registry, pack, rewrite_targets(registry, pack, impls), hook_results)
        results += rows
        unsampled += unchecked
        rows, unchecked = check_patches(registry, pack, hook_results)
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


def pack_names() -> Iterable[str]:
    """Entry-point names of the installed packs, in load order."""
    return [f.name for f in plugins.discovered()]
