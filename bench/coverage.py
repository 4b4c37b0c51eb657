"""Core ATen coverage: which ops have impls, and how PyTorch's OpInfo samples fare.

Run: python bench/coverage.py [--dtype float32] [--limit 24] [--only NAME] [--failures]
     python bench/coverage.py --all [--limit 3] [--jobs 2] [--opset 18] [--only NAME] [--failures]

For each op tagged ``torch.Tag.core`` in this torch: implemented, declared
unsupported (with the core pack's reason), or missing; then the OpInfo
samples that reach it (``opreg.testing.opinfo``), exported one model per
OpInfo at the lowest and the newest supported opset, run in ONNX Runtime
and compared with eager PyTorch. Random results are compared by distribution
(``opreg.testing.Distribution``) and counted apart (distribution); results
that are uninitialized are compared by shape and dtype only and counted apart
(shape-only); neither counts as passed. ``--only`` drives just the OpInfos whose
name contains NAME (handy while fixing an impl).

``--all`` measures opreg against ``torch.onnx.export(dynamo=True)`` in one run:
every OpInfo of PyTorch's ``op_db`` (float32, or its first integer/bool dtype
when it has no float32), the same first ``--limit`` samples through both
exporters (``opreg.testing.Exporter``), at opset 18 and the newest supported
one (``--opset`` picks), each model run in ONNX Runtime and compared with eager
PyTorch by the same rules. An exporter passes an OpInfo when every sample that
eager PyTorch and torch.export accept exports, runs and matches (at least one
does); OpInfos whose every sample torch itself rejects are counted apart. It
prints the four counts (both, opreg only, torch only, neither) per opset and
the "torch only" list. torch.onnx is slow (about an hour for both opsets on two
cores): results are appended to ``--cache`` (``build/coverage-all.jsonl``) as
they come, keyed by what made them (torch.onnx's: the torch, onnxscript and
onnxruntime versions; opreg's: a hash of opreg's and the core pack's sources),
so an interrupted run resumes and a rerun after an opreg change redoes only
opreg's side. ``--jobs N`` runs N worker processes; each OpInfo has
``--timeout`` seconds per exporter.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from opreg.registry.opname import OpName
from opreg.testing import DISTRIBUTION, FAILED, PASSED, SHAPE_ONLY
from opreg.testing import opinfo as oi

LOWEST = 18


def core_ops() -> list[OpName]:
    """Every overload tagged ``torch.Tag.core`` in the installed torch."""
    found = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            if torch.Tag.core in getattr(packet, overload).tags:
                found.append(OpName.of(getattr(packet, overload)))
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", help="float32, int64, int32, bool, float16, or 'all'")
    parser.add_argument("--limit", type=int, default=None, help="samples per OpInfo (default 24; 3 with --all)")
    parser.add_argument("--only", default=None, help="drive only OpInfos whose name contains this")
    parser.add_argument("--failures", action="store_true", help="print every failing sample")
    parser.add_argument("--all", action="store_true", help="every OpInfo, opreg against torch.onnx (see above)")
    parser.add_argument("--opset", type=int, action="append", help="--all: an opset (default: 18 and newest)")
    parser.add_argument("--jobs", type=int, default=1, help="--all: worker processes (default 1)")
    parser.add_argument("--exporter", action="append", choices=("opreg", "torch.onnx"), help="--all: run one side only")
    parser.add_argument("--timeout", type=int, default=600, help="--all: seconds per OpInfo and exporter")
    cache = Path(__file__).resolve().parents[1] / "build" / "coverage-all.jsonl"
    parser.add_argument("--cache", type=Path, default=cache, help="--all: results, resumed from")
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    if options.all:
        from coverage_all import run_all  # the side-by-side mode, in its own module

        return run_all(options)

    registry = opreg.default_registry()
    newest = opreg.newest_supported_opset()
    targets = (LOWEST, newest)
    core = core_ops()
    ours = [op for op in registry.ops() if op.namespace == "aten" and any(i.pack == "core" for i in registry.impls(op))]
    infos = {oi.full_name(i): i for op in sorted(set(core) | set(ours)) for i in oi.opinfos_for(op)}
    if options.only:
        infos = {name: info for name, info in infos.items() if options.only in name}

    started = time.perf_counter()
    results: dict[tuple[str, str], list] = {}  # (opinfo, dtype) -> [SampleCheck per target]
    for name, info in sorted(infos.items()):
        dtypes = oi.dtypes_for(info) if options.dtype == "all" else [getattr(torch, options.dtype)]
        for dtype in dtypes:
            if dtype not in info.supported_dtypes("cpu"):
                continue
            checks = oi.check_opinfo(info, dtype, targets=targets, limit=options.limit or 24)
            results[(name, str(dtype).replace("torch.", ""))] = checks
            if options.failures:
                for check in checks:
                    if not check.ok:
                        print(check)
    elapsed = time.perf_counter() - started

    print(f"\n## Core ATen ops (torch {torch.__version__}), samples at ai.onnx {LOWEST} / {newest}\n")
    print(
        f"| op | status | OpInfos | passed@{LOWEST} | distribution@{LOWEST} | shape-only@{LOWEST} | failed@{LOWEST} "
        f"| passed@{newest} | distribution@{newest} | shape-only@{newest} | failed@{newest} |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    implemented = passing = unsupported = no_samples = shape_only_ops = 0
    for op in core:
        declared = registry.unsupported(op).get(op)
        has_impl = any(i.pack == "core" for i in registry.impls(op))
        status = "impl" if has_impl else ("unsupported" if declared else "MISSING")
        counts = {t: [0, 0, 0, 0] for t in targets}  # passed, distribution, shape-only, failed
        names = sorted(n for n in (oi.full_name(i) for i in oi.opinfos_for(op)) if n in infos)
        for (name, _), checks in results.items():
            if name in names:
                for target, check in zip(targets, checks, strict=True):
                    counts[target][0] += check.count(PASSED)
                    counts[target][1] += check.count(DISTRIBUTION)
                    counts[target][2] += check.count(SHAPE_ONLY)
                    counts[target][3] += check.count(FAILED)
        implemented += has_impl
        unsupported += bool(declared) and not has_impl
        compared = any(c[0] + c[1] for c in counts.values())
        sampled = any(sum(c) for c in counts.values())
        clean = all(c[3] == 0 for c in counts.values())
        if has_impl and compared and clean:
            passing += 1
        if has_impl and sampled and clean and not compared:
            shape_only_ops += 1
        if has_impl and not sampled:
            no_samples += 1
        if options.only and not names:
            continue
        cells = " | ".join(" | ".join(map(str, counts[t])) for t in targets)
        print(f"| {op} | {status} | {', '.join(names) or '-'} | {cells} |")

    total = len(core)
    print(f"\nCore ATen ops: {total}")
    print(f"  implemented:                 {implemented} ({implemented / total:.0%})")
    print(f"  implemented, all samples ok: {passing} ({passing / total:.0%}; random ones by distribution)")
    print(f"  implemented, samples compared by shape and dtype only: {shape_only_ops}")
    print(f"  implemented, no OpInfo samples reach them: {no_samples} (tested in tests/test_ops_*.py)")
    print(f"  declared unsupported:        {unsupported} (core_ops/opreg_core_ops/unsupported.py)")
    print(f"  missing:                     {total - implemented - unsupported}")
    passed = sum(c.count(PASSED) for checks in results.values() for c in checks)
    by_distribution = sum(c.count(DISTRIBUTION) for checks in results.values() for c in checks)
    shape_only = sum(c.count(SHAPE_ONLY) for checks in results.values() for c in checks)
    failed = sum(c.count(FAILED) for checks in results.values() for c in checks)
    bad = sorted({name for (name, dtype), checks in results.items() for c in checks if c.failures()})
    print(
        f"OpInfos driven: {len(results)} (OpInfo x dtype); samples passed {passed}, "
        f"by distribution {by_distribution} (random), shape-only {shape_only} (values not compared), failed {failed}"
    )
    print(f"OpInfos with failures: {len(bad)}: {', '.join(bad)}")
    print(f"took {elapsed:.0f} s")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
