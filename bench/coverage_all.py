"""``python bench/coverage.py --all``: every OpInfo of PyTorch's ``op_db`` through opreg
and through ``torch.onnx.export(dynamo=True)``, side by side (see coverage.py's docstring).

Both exporters get the same samples, captured by the same ``torch.export`` call shape,
run in ONNX Runtime and compared with eager PyTorch by the same rules
(``opreg.testing.check_samples``; torch.onnx is plugged in as an ``opreg.testing.Exporter``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import multiprocessing
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OPREG, TORCH_ONNX = "opreg", "torch.onnx"
EXPORTERS = (OPREG, TORCH_ONNX)
PASS, FAIL, SKIP = "pass", "fail", "skipped"
_SOURCES = (ROOT / "registry" / "opreg", ROOT / "core_ops" / "opreg_core_ops")
_DTYPES = ("float32", "int64", "int32", "int16", "int8", "uint8", "bool")
"""The dtype an OpInfo is driven at: float32, else the first of these it supports."""


def fingerprint(exporter: str) -> str:
    """What a cached result of ``exporter`` depends on: opreg's sources, or torch.onnx's versions."""
    if exporter == OPREG:
        digest = hashlib.sha256()
        for folder in _SOURCES:
            for path in sorted(folder.rglob("*.py")):
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
        return digest.hexdigest()[:12]
    import onnxruntime
    import onnxscript
    import torch

    return f"torch {torch.__version__}, onnxscript {onnxscript.__version__}, onnxruntime {onnxruntime.__version__}"


def pick_dtype(info: Any) -> str | None:
    import torch

    supported = info.supported_dtypes("cpu")
    for name in _DTYPES:
        if getattr(torch, name) in supported:
            return name
    return None


_BUILT: dict[int, tuple[Any, Any]] = {}
"""id(captured program) -> (program, its ONNX model at torch.onnx's own opset, before conversion)."""


def torch_onnx(program: Any, target: Any) -> Any:
    """An ``opreg.testing.Exporter``: ``torch.onnx.export(dynamo=True, opset_version=...)``, run by its
    own ``ONNXProgram.__call__`` (ONNX Runtime, CPU).

    torch.onnx translates at its opset (18), then converts the model to ``opset_version`` and
    optimizes it (``torch/onnx/_internal/exporter/_core.py``). The same steps are taken here with
    the translation made once per captured program, not once per opset: the slowest step,
    whose result does not depend on the opset."""
    import onnx_ir as ir
    import torch
    from torch.onnx._internal._lazy_import import onnxscript_apis
    from torch.onnx._internal.exporter import _onnx_program

    built = _BUILT.get(id(program))
    if built is None or built[0] is not program:
        _BUILT.clear()  # one program at a time: a batch, then its single samples
        with contextlib.redirect_stdout(io.StringIO()):
            onnx_program = torch.onnx.export(program, (), dynamo=True, optimize=False, verbose=False)
        built = _BUILT[id(program)] = (program, onnx_program)
    onnx_program = built[1]
    model = ir.serde.deserialize_model(ir.serde.serialize_model(onnx_program.model))  # a copy per opset
    converted = _onnx_program.ONNXProgram(
        onnxscript_apis.convert_version(model, target.onnx), onnx_program.exported_program
    )
    with contextlib.redirect_stdout(io.StringIO()):
        converted.optimize()

    def run(*tensors: Any) -> Any:
        with contextlib.redirect_stdout(io.StringIO()):
            return converted(*tensors)

    return run


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def _setup() -> None:
    import functools

    import torch
    from torch.onnx._internal.exporter import _registration

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)
    # torch.onnx builds its registry from torchlib at every export (2 of its 3 seconds for one op);
    # it depends only on the installed torchlib and no custom table is passed here: build it once
    registry = _registration.ONNXRegistry
    registry.from_torchlib = staticmethod(functools.cache(registry.from_torchlib))


def work(task: tuple[str, str, list[tuple[str, list[int]]], int, int]) -> list[dict[str, Any]]:
    """Drive one OpInfo: ``(name, dtype, [(exporter, opsets)], limit, timeout)`` -> result records."""
    import torch

    from opreg.testing import PASSED, SHAPE_ONLY
    from opreg.testing import opinfo as oi

    name, dtype, wanted, limit, timeout = task
    info = {oi.full_name(i): i for i in oi.op_db()}[name]
    records = []
    for exporter, opsets in wanted:
        started = time.perf_counter()
        signal.alarm(timeout)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                checks = oi.check_opinfo(
                    info,
                    getattr(torch, dtype),
                    targets=opsets,
                    limit=limit,
                    exporter=torch_onnx if exporter == TORCH_ONNX else None,
                )
        except _Timeout:
            outcome = [(FAIL, f"timed out after {timeout} s")] * len(opsets)
        except Exception as e:  # the harness itself failed: count it against the exporter, say why
            outcome = [(FAIL, f"harness error: {type(e).__name__}: {str(e)[:200]}")] * len(opsets)
        else:
            outcome = []
            for check in checks:
                failures = check.failures()
                if failures:
                    outcome.append((FAIL, f"sample {failures[0].index}: {failures[0].detail}"))
                elif check.count(PASSED) or check.count(SHAPE_ONLY):
                    outcome.append((PASS, ""))
                else:
                    skipped = [r.detail for r in check.results]
                    outcome.append((SKIP, skipped[0] if skipped else "no samples"))
        finally:
            signal.alarm(0)
        seconds = round((time.perf_counter() - started) / len(opsets), 1)
        for opset, (status, detail) in zip(opsets, outcome, strict=True):
            records.append(
                {"name": name, "dtype": dtype, "exporter": exporter, "opset": opset, "limit": limit}
                | {"status": status, "detail": detail, "seconds": seconds}
            )
    return records


def _key(record: dict[str, Any], prints: dict[str, str]) -> tuple:
    return (record["exporter"], prints[record["exporter"]], record["opset"], record["limit"], record["name"])


def run_all(options: Any) -> int:
    import opreg
    from opreg.testing import opinfo as oi

    opsets = options.opset or [18, opreg.newest_supported_opset()]
    limit = options.limit or 3
    prints = {e: fingerprint(e) for e in EXPORTERS}
    cache: dict[tuple, dict[str, Any]] = {}
    if options.cache.exists():
        for line in options.cache.read_text().splitlines():
            record = json.loads(line)
            if record.get("print") == prints.get(record["exporter"]):
                cache[_key(record, prints)] = record
    infos = {oi.full_name(i): i for i in oi.op_db()}
    if options.only:
        infos = {n: i for n, i in infos.items() if options.only in n}
    driven = {name: dtype for name, info in sorted(infos.items()) if (dtype := pick_dtype(info))}
    tasks = []
    for name, dtype in driven.items():
        wanted = []
        for exporter in options.exporter or EXPORTERS:
            missing = [o for o in opsets if (exporter, prints[exporter], o, limit, name) not in cache]
            if missing:
                wanted.append((exporter, missing))
        if wanted:
            tasks.append((name, dtype, wanted, limit, options.timeout))
    print(f"{len(driven)} OpInfos, {limit} samples each; {len(tasks)} to run ({len(cache)} results cached)")

    options.cache.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with options.cache.open("a") as out:

        def keep(records: list[dict[str, Any]], done: int) -> None:
            for record in records:
                record["print"] = prints[record["exporter"]]
                cache[_key(record, prints)] = record
                out.write(json.dumps(record) + "\n")
            out.flush()
            summary = ", ".join(f"{r['exporter']}@{r['opset']} {r['status']}" for r in records)
            elapsed = time.perf_counter() - started
            print(f"[{done}/{len(tasks)} {elapsed:.0f}s] {records[0]['name']}: {summary}", file=sys.stderr, flush=True)

        if options.jobs > 1:
            context = multiprocessing.get_context("spawn")
            with context.Pool(options.jobs, initializer=_setup, maxtasksperchild=50) as pool:
                for done, records in enumerate(pool.imap_unordered(work, tasks), 1):
                    keep(records, done)
        else:
            _setup()
            for done, task in enumerate(tasks, 1):
                keep(work(task), done)
    return report(driven, opsets, limit, cache, prints, options.failures)


def report(
    driven: dict[str, str],
    opsets: list[int],
    limit: int,
    cache: dict[tuple, dict[str, Any]],
    prints: dict[str, str],
    failures: bool,
) -> int:
    dtypes: dict[str, int] = {}
    for dtype in driven.values():
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
    print(f"\n## op_db: opreg vs torch.onnx.export(dynamo=True), {limit} samples per OpInfo")
    print(f"OpInfos: {len(driven)} ({', '.join(f'{d} {n}' for d, n in sorted(dtypes.items()))})\n")
    print("| opset | both pass | opreg only | torch only | neither | torch rejects every sample |")
    print("|---|---|---|---|---|---|")
    lists = {}
    for opset in opsets:
        groups: dict[str, list[str]] = {"both": [], "opreg": [], "torch": [], "neither": [], "skipped": []}
        for name in driven:
            mine = cache.get((OPREG, prints[OPREG], opset, limit, name))
            theirs = cache.get((TORCH_ONNX, prints[TORCH_ONNX], opset, limit, name))
            if mine is None or theirs is None:
                continue
            if SKIP in (mine["status"], theirs["status"]):
                groups["skipped"].append(name)
            elif mine["status"] == PASS:
                groups["both" if theirs["status"] == PASS else "opreg"].append(name)
            else:
                groups["torch" if theirs["status"] == PASS else "neither"].append(name)
        lists[opset] = groups
        counts = " | ".join(str(len(groups[g])) for g in ("both", "opreg", "torch", "neither", "skipped"))
        print(f"| {opset} | {counts} |")
    for opset in opsets:
        torch_only = lists[opset]["torch"]
        print(f"\nTorch only at opset {opset} ({len(torch_only)}):")
        for name in torch_only:
            print(f"  {name} [{driven[name]}]: {cache[(OPREG, prints[OPREG], opset, limit, name)]['detail'][:300]}")
        if failures:
            for group, title in (("opreg", "opreg only"), ("neither", "neither")):
                print(f"\n{title} at opset {opset} ({len(lists[opset][group])}):")
                for name in lists[opset][group]:
                    theirs = cache[(TORCH_ONNX, prints[TORCH_ONNX], opset, limit, name)]
                    mine = cache[(OPREG, prints[OPREG], opset, limit, name)]
                    print(f"  {name}: torch.onnx: {theirs['detail'][:200]}")
                    if group == "neither":
                        print(f"  {' ' * len(name)}  opreg: {mine['detail'][:200]}")
    return 0 if all(not lists[o]["torch"] for o in opsets) else 1
