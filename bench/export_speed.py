"""Export time and graph size: opreg.export vs torch.onnx.export(dynamo=True).

Run: python bench/export_speed.py [--repeat N]

Both exporters run in this one process on the same models, each model
exported once to warm up, then N times; the table shows the median time of
each, their ratio, and the node counts of both graphs. Timings on shared
machines are noisy: read the ratios, not the seconds.
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from tests.models import Nested, Sequence, TutorialCNN


def models():
    torch.manual_seed(0)
    yield "tutorial CNN", TutorialCNN().eval(), (torch.randn(1, 1, 32, 32),), {}, None
    yield (
        "nested kwargs",
        Nested().eval(),
        (torch.randn(2, 4),),
        {"extra": {"shift": torch.randn(3), "bias": torch.randn(5)}},
        None,
    )
    dims = {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
    yield "dynamic seq", Sequence().eval(), (torch.randn(2, 5, 8),), {}, dims


def _time(fn, repeat: int, *call_args) -> tuple[float, object]:
    result = fn(*call_args)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(*call_args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _opreg_export(model, args, kwargs, dynamic):
    return opreg.export(model, args, kwargs, target=18, dynamic_shapes=dynamic)


def _torch_export(model, args, kwargs, dynamic):
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(
            model, args, kwargs=kwargs, dynamo=True, opset_version=18, dynamic_shapes=dynamic, verbose=False
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    header = f"{'model':<16} {'opreg s':>8} {'torch s':>8} {'ratio':>6} {'opreg nodes':>12} {'torch nodes':>12}"
    print(header)
    print("-" * len(header))
    for name, model, inputs, kwargs, dynamic in models():
        ours, program = _time(_opreg_export, args.repeat, model, inputs, kwargs, dynamic)
        program.verify(*inputs, **kwargs)
        theirs, onnx_program = _time(_torch_export, args.repeat, model, inputs, kwargs, dynamic)
        our_nodes = len(program.model_proto.graph.node)
        their_nodes = len(onnx_program.model_proto.graph.node)
        print(f"{name:<16} {ours:>8.3f} {theirs:>8.3f} {theirs / ours:>5.1f}x {our_nodes:>12} {their_nodes:>12}")
    print("ratio = torch time / opreg time (higher is better for opreg)")


if __name__ == "__main__":
    main()
