"""What an export costs beyond its capture: opreg.export and torch.onnx.export(dynamo=True), each
divided by torch.export.export alone, model by model.

Run: python bench/capture_overhead.py [--repeat 3] [--models NAME ...] [--skip-torch-onnx] [--no-big]

``torch.export``'s capture is the floor of any dynamo-based export. For every model this runs
three kinds of process, each a fresh interpreter that builds the model (torch and the model's
library already imported, the model made and in ``eval()``) and then times one call:

- ``capture``: ``torch.export.export(model, args, kwargs, dynamic_shapes=..., strict=False)``;
- ``opreg``: ``import opreg`` then ``opreg.export(model, args, kwargs, dynamic_shapes=...)`` (the
  import, the registry build from the installed packs, capture and everything after it);
- ``torch.onnx``: ``torch.onnx.export(model, args, kwargs=..., dynamic_shapes=..., dynamo=True)``;
- ``capture*``: the capture again, with Python's collector kept off the objects alive before it,
  as ``opreg.export`` runs (``opreg/_heap.py``). At the default thresholds a quarter of the
  capture's CPU time goes to the collector, which opreg saves for its own capture too:
  ``opreg/capture*`` is what opreg adds to a capture run as opreg runs it.

Each kind's processes start the timed call at depths spread over one chunk of Python's frame
stack (``--repeat 3``: 0, 53 and 106 frames of :func:`_deeper` deeper), the same depths for every
kind. CPython 3.11 keeps frames in 16 KB chunks and unmaps a chunk as soon as the frame that opened
it returns (python/cpython#142183, fixed in 3.13): a loop whose calls cross a chunk's end maps and
unmaps 16 KB on every call. Where that happens depends on how deep the call starts, so one depth
alone moved the same opreg export by -0.17 to +0.08 s of CPU against another version of opreg.

Same inputs, same dynamic shapes, non-strict capture in all three (torch.onnx captures non-strict
first too), ai.onnx 18, torch on one thread. The time is the process's CPU time over the call
(``time.process_time``: a shared machine disturbs it far less than wall time), the median of
``--repeat`` processes; the ratios divide medians taken in this one run. Peak memory is each
process's maximum resident set, model included. The processes run from compiled bytecode, as an
installed opreg does (``PYTHONDONTWRITEBYTECODE`` is dropped for them: a checkout's modules would
otherwise be compiled again in every process).

Models: the zoo (tests/real_models.py), the stacked transformer blocks of bench/scale.py at
N=64 and N=256, and a 1.1B-parameter Llama (bench/big_model.py's default shape; weights are
not saved: ``--no-big`` leaves it out, it needs about 10 GB of memory for torch.onnx's side).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KINDS = ("capture", "opreg", "torch.onnx", "capture*")
OPSET = 18


def _zoo():
    from tests.real_models import FACTORIES

    return {name: factory for name, factory in FACTORIES.items()}


def models() -> list[str]:
    return [*_zoo(), "blocks64", "blocks256", "llama1b"]


def build(name: str):
    """``(model, args, kwargs, dynamic_shapes)`` of the named model."""
    import torch

    torch.set_num_threads(1)
    if name.startswith("blocks"):
        from bench.scale import stack

        model, args = stack(int(name.removeprefix("blocks")))
        return model, args, {}, None
    if name == "llama1b":
        from bench.big_model import build as build_llama

        defaults = argparse.Namespace(
            vocab=32000, hidden=2048, intermediate=5632, layers=20, heads=16, kv_heads=8
        )  # bench/big_model.py's defaults: 1.1B parameters
        model, ids = build_llama(defaults)
        return model, (), {"input_ids": ids}, None
    case = _zoo()[name]()
    return case.model, case.args, case.kwargs, case.dynamic_shapes


SPAN = 160
"""Frames of :func:`_deeper` the depths of a model's processes are spread over: at least one 16 KB
chunk of CPython 3.11's frame stack (a frame of it takes about 15 words)."""


def _deeper(frames: int, call):
    """``call()``, ``frames`` Python frames deeper than here."""
    return _deeper(frames - 1, call) if frames else call()


def child(kind: str, name: str, depth: int = 0) -> dict:
    import contextlib
    import logging

    logging.disable(logging.WARNING)
    with contextlib.suppress(ImportError):
        import transformers

        transformers.logging.set_verbosity_error()
    model, args, kwargs, dynamic = build(name)
    return _deeper(depth, lambda: _timed(kind, model, args, kwargs, dynamic))


def _timed(kind: str, model, args, kwargs, dynamic) -> dict:
    import contextlib
    import io
    import warnings

    import torch

    wall, cpu = time.perf_counter(), time.process_time()
    if kind in ("capture", "capture*"):
        from opreg import _heap  # imports nothing more

        with _heap.quiet() if kind == "capture*" else contextlib.nullcontext():
            program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic, strict=False)
        nodes = len(program.graph.nodes)
    elif kind == "opreg":
        import opreg

        program = opreg.export(model, args, kwargs, target=OPSET, dynamic_shapes=dynamic)
        nodes = len(program.model.graph)
    else:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model, args, kwargs=kwargs, dynamic_shapes=dynamic, dynamo=True, opset_version=OPSET, verbose=False
            )
        nodes = len(program.model.graph)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"cpu": cpu, "wall": wall, "nodes": nodes, "peak_mb": peak}


def run_child(kind: str, name: str, timeout: float, depth: int = 0) -> dict | None:
    command = [sys.executable, __file__, "--child", kind, name, "--depth", str(depth)]
    # as an installed opreg runs: from compiled bytecode (pip compiles a wheel's modules at install)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False, env=env)
    except subprocess.TimeoutExpired:
        print(f"{kind} {name}: timed out after {timeout:.0f} s", file=sys.stderr)
        return None
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["?"]
        print(f"{kind} {name} failed: {tail[0]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(name: str, kinds: tuple[str, ...], repeat: int, timeout: float) -> dict[str, dict]:
    """The median CPU and wall time and the peak memory of each kind, in turns (capture, opreg,
    torch.onnx, capture, ...) so that load on a shared machine falls on all alike; the ``i``-th
    process of each kind starts its call ``i * SPAN // repeat`` frames deeper."""
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for turn in range(repeat):
        for kind in kinds:
            result = run_child(kind, name, timeout, turn * SPAN // repeat)
            if result is not None:
                runs[kind].append(result)
    summary = {}
    for kind, results in runs.items():
        if results:
            summary[kind] = {
                "cpu": statistics.median(r["cpu"] for r in results),
                "wall": statistics.median(r["wall"] for r in results),
                "peak_mb": max(r["peak_mb"] for r in results),
                "nodes": results[-1]["nodes"],
            }
    return summary


def _get(part: dict, key: str) -> float:
    return part.get(key, float("nan"))


def _ratio(part: dict, capture: dict) -> float:
    return _get(part, "cpu") / capture["cpu"] if capture else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="processes per model and kind (median)")
    parser.add_argument("--models", nargs="*", help=f"only these (of {', '.join(models())})")
    parser.add_argument("--skip-torch-onnx", action="store_true", help="time capture and opreg only")
    parser.add_argument("--no-big", action="store_true", help="leave the 1.1B-parameter model out")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "MODEL"), help=argparse.SUPPRESS)
    parser.add_argument("--depth", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, depth=args.depth)))
        return
    names = args.models or [m for m in models() if not (args.no_big and m == "llama1b")]
    kinds = tuple(k for k in KINDS if not (args.skip_torch_onnx and k == "torch.onnx"))
    header = (
        f"{'model':<15} {'capture s':>9} {'opreg s':>8} {'opreg/cap':>9} {'torch.onnx s':>12} {'onnx/cap':>8}"
        f" {'opreg/cap*':>10} {'cap MB':>7} {'opreg MB':>8} {'onnx MB':>7}"
    )
    print(f"CPU seconds of one call in a fresh process, median of {args.repeat}; ai.onnx {OPSET}")
    print(header)
    print("-" * len(header))
    results = {}
    zoo = set(_zoo())
    for name in names:
        # the big model once: each of its processes holds 4.4 GB of weights and runs for minutes
        summary = measure(name, kinds, 1 if name == "llama1b" else args.repeat, args.timeout)
        results[name] = summary
        cap, ours, theirs, quiet = (summary.get(k, {}) for k in KINDS)
        print(
            f"{name:<15} {_get(cap, 'cpu'):>9.2f} {_get(ours, 'cpu'):>8.2f} {_ratio(ours, cap):>8.2f}x"
            f" {_get(theirs, 'cpu'):>12.2f} {_ratio(theirs, cap):>7.2f}x {_ratio(ours, quiet):>9.2f}x"
            f" {_get(cap, 'peak_mb'):>7.0f}"
            f" {_get(ours, 'peak_mb'):>8.0f} {_get(theirs, 'peak_mb'):>7.0f}",
            flush=True,
        )
    for label, group in (("zoo", [n for n in results if n in zoo]), ("all", list(results))):
        for kind, floor in (("opreg", "capture"), ("torch.onnx", "capture"), ("opreg", "capture*")):
            ratios = [
                results[n][kind]["cpu"] / results[n][floor]["cpu"]
                for n in group
                if kind in results[n] and floor in results[n]
            ]
            if ratios:
                print(f"median {kind}/{floor} over {label} ({len(ratios)} models): {statistics.median(ratios):.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
