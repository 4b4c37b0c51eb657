"""ONNX Runtime on opreg's exports and torch.onnx's, model by model: latency at one thread and
at all threads, and session creation time.

Run: python bench/latency.py [--runs 100] [--opset 18] [--models NAME ...] [--loads 20]
                             [--ort-disable OPTIMIZER ...]

Both exporters export each model of tests/real_models.py (and the small models of
tests/models.py) in this process; each model's two sessions are then timed in turns
(opreg, torch, opreg, ...) so that load on a shared machine falls on both alike. The table
gives medians and the ratio opreg / torch (below 1.0 opreg's model runs faster);
session creation is the CPU time of creating a one-thread session, median of ``--loads``.

``--ort-disable`` names ONNX Runtime graph optimizers (``MatmulTransposeFusion``, as its
verbose log names them) to leave out of every session, both exporters' alike: how much of a
difference one of them makes is how its cause was found (BENCHMARKS.md, session creation).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from bench.export_speed import models


def session(
    proto_bytes: bytes, threads: int, disabled: tuple[str, ...] = ()
) -> tuple[onnxruntime.InferenceSession, float]:
    """A session (without the ``disabled`` graph optimizers) and the CPU time its creation took
    (a shared machine disturbs CPU time far less than wall time; at one thread they agree)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    start = time.process_time()
    created = onnxruntime.InferenceSession(
        proto_bytes, options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
    )
    return created, time.process_time() - start


def feeds(sess: onnxruntime.InferenceSession, tensors: list[torch.Tensor]) -> dict:
    return {i.name: t.detach().numpy() for i, t in zip(sess.get_inputs(), tensors, strict=True)}


def interleaved(first, second, runs: int) -> tuple[float, float]:
    a, b = [], []
    for _ in range(3):  # warm-up
        first()
        second()
    for _ in range(runs):
        start = time.perf_counter()
        first()
        a.append(time.perf_counter() - start)
        start = time.perf_counter()
        second()
        b.append(time.perf_counter() - start)
    return statistics.median(a), statistics.median(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--opset", type=int, default=18)
    parser.add_argument("--models", nargs="*", help="only these models")
    parser.add_argument("--threads", type=int, default=0, help="'all threads' (default: ONNX Runtime's choice)")
    parser.add_argument("--loads", type=int, default=20, help="session creations per model and exporter (median)")
    parser.add_argument(
        "--ort-disable", nargs="*", default=[], metavar="OPTIMIZER", help="ONNX Runtime graph optimizers to leave out"
    )
    args = parser.parse_args()
    disabled = tuple(args.ort_disable)
    logging.disable(logging.WARNING)
    header = (
        f"{'model':<16} {'1 thread ms':>16} {'ratio':>6} {'all threads ms':>16} {'ratio':>6}"
        f" {'session ms':>16} {'ratio':>6}"
    )
    print(f"ai.onnx opset {args.opset}; ONNX Runtime {onnxruntime.__version__}; opreg / torch.onnx, medians")
    if disabled:
        print(f"ONNX Runtime optimizers left out: {', '.join(disabled)}")
    print(header)
    print("-" * len(header))
    for name, model, inputs, kwargs, dynamic in models():
        if args.models and name not in args.models:
            continue
        ours = opreg.export(model, inputs, kwargs, target=args.opset, dynamic_shapes=dynamic)
        tensors = ours.adapt_torch_inputs_to_onnx(*inputs, **kwargs)
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = torch.onnx.export(
                    model, inputs, kwargs=kwargs, dynamo=True, opset_version=args.opset, dynamic_shapes=dynamic
                )
        except Exception as e:
            print(f"{name:<16} torch.onnx could not export it ({type(e).__name__})")
            continue
        cells = []
        our_bytes, their_bytes = ours.model_proto.SerializeToString(), theirs.model_proto.SerializeToString()
        loads = [[], []]
        for _ in range(args.loads + 1):  # session creation at one thread, in turns; the first of each is a warm-up
            loads[0].append(session(our_bytes, 1, disabled)[1])
            loads[1].append(session(their_bytes, 1, disabled)[1])
        our_load, their_load = statistics.median(loads[0][1:]), statistics.median(loads[1][1:])
        for threads in (1, args.threads):
            our_session, _ = session(our_bytes, threads, disabled)
            their_session, _ = session(their_bytes, threads, disabled)
            our_feed, their_feed = feeds(our_session, tensors), feeds(their_session, tensors)
            mine, yours = interleaved(
                lambda s=our_session, f=our_feed: s.run(None, f),
                lambda s=their_session, f=their_feed: s.run(None, f),
                args.runs,
            )
            cells.append((mine, yours))
        text = " ".join(f"{m * 1e3:>7.3f}/{t * 1e3:<8.3f} {m / t:>5.2f}x" for m, t in cells)
        print(f"{name:<16} {text} {our_load * 1e3:>7.1f}/{their_load * 1e3:<8.1f} {our_load / their_load:>5.2f}x")


if __name__ == "__main__":
    main()
