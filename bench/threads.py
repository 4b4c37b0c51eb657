"""Exports from several threads at once: opreg vs torch.onnx.export(dynamo=True) vs plain torch.export.

Run: python bench/threads.py [--threads 8] [--rounds 3]

Each round starts ``--threads`` threads, each exporting its own small module (a Linear,
a LayerNorm, a GELU) at the same instant, and counts the exports that fail, for each
exporter in the same run. torch.export keeps its tracing state in globals, so plain
captures and torch.onnx's exports fail in threads; opreg captures one model at a time
(``opreg.exporter._capture.TRACING_LOCK``). The last table compares opreg's wall time
for the same exports from threads and one after another (a ratio within this run):
what the lock costs, and what translating in parallel gains back.
"""

from __future__ import annotations

import argparse
import collections
import io
import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.norm(self.fc(x))) * 2


def plain_capture(model: torch.nn.Module, x: torch.Tensor) -> None:
    torch.export.export(model, (x,), strict=False)


def torch_onnx(model: torch.nn.Module, x: torch.Tensor) -> None:
    torch.onnx.export(model, (x,), dynamo=True, opset_version=18, verbose=False)


def with_opreg(model: torch.nn.Module, x: torch.Tensor) -> None:
    opreg.export(model, (x,), target=18)


EXPORTERS: dict[str, Callable[[torch.nn.Module, torch.Tensor], None]] = {
    "torch.export.export": plain_capture,
    "torch.onnx.export(dynamo=True)": torch_onnx,
    "opreg.export": with_opreg,
}


def in_threads(export: Callable[[torch.nn.Module, torch.Tensor], None], threads: int) -> list[str]:
    """Run ``threads`` exports at once; the error of each that failed (first line)."""
    start = threading.Barrier(threads)
    errors: list[str] = []

    def one() -> None:
        model, x = Block().eval(), torch.randn(2, 16)
        start.wait()
        try:
            export(model, x)
        except Exception as e:
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # torch.onnx colours its messages
            errors.append(f"{type(e).__name__}: {text.splitlines()[0][:90]}")

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # torch logs the errors it raises; they are counted here
    warnings.simplefilter("ignore")
    total = args.threads * args.rounds
    rows = []
    with redirect_stdout(io.StringIO()):  # torch.onnx prints its progress (sys.stdout is global: not per thread)
        for export in EXPORTERS.values():  # warm up: first imports and caches, in one thread
            export(Block().eval(), torch.randn(2, 16))
        for name, export in EXPORTERS.items():
            errors = [e for _ in range(args.rounds) for e in in_threads(export, args.threads)]
            common = collections.Counter(errors).most_common(1)
            rows.append(f"{name:32} {len(errors):>4}/{total:<3}  {common[0][0] if common else ''}")
    print(f"{args.threads} threads x {args.rounds} rounds = {total} exports per exporter")
    print(f"{'exporter':32} {'failed':>8}  most frequent error")
    print("\n".join(rows))

    started = time.perf_counter()
    for _ in range(args.rounds):
        assert not in_threads(with_opreg, args.threads)
    threaded = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(total):
        with_opreg(Block().eval(), torch.randn(2, 16))
    sequential = time.perf_counter() - started
    print(f"\nopreg.export, {total} exports: {threaded:.2f} s in threads, {sequential:.2f} s one after another")
    print(f"threads / sequential: {threaded / sequential:.2f}x")


if __name__ == "__main__":
    main()
