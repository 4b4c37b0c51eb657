"""Export time and graph size: opreg.export vs torch.onnx.export(dynamo=True).

Run: python bench/export_speed.py [--repeat N]

Both exporters run in this one process on the same models, each model
exported once to warm up, then N times; the table shows the median time of
each, their ratio, and the node counts of both graphs (top-level graph; the
"fn" columns count model-local functions, whose nodes are not in the graph).
Timings on shared machines are noisy: read the ratios, not the seconds.

The models are the small ones of tests/models.py and the real architectures of
tests/real_models.py (CNNs, tiny random-init transformers), the latter with
their dynamic batch/sequence dims. ``--opset`` picks the ai.onnx version both
export to; ``--breakdown`` lists, for each model whose opreg graph has more
than 10% more nodes than torch's, the op types that make the difference.
"""

from __future__ import annotations

import argparse
import collections
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
from tests.real_models import FACTORIES


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
    for factory in FACTORIES.values():
        case = factory()
        yield case.name, case.model, case.args, case.kwargs, case.dynamic_shapes


def _time(fn, repeat: int, *call_args) -> tuple[float, object]:
    result = fn(*call_args)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(*call_args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _opreg_export(model, args, kwargs, dynamic, opset):
    return opreg.export(model, args, kwargs, target=opset, dynamic_shapes=dynamic)


def _torch_export(model, args, kwargs, dynamic, opset):
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(
            model, args, kwargs=kwargs, dynamo=True, opset_version=opset, dynamic_shapes=dynamic, verbose=False
        )


def _op_types(proto) -> collections.Counter:
    return collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n in proto.graph.node
    )


def _breakdown(ours: collections.Counter, theirs: collections.Counter) -> str:
    """The op types whose counts differ, most extra nodes in opreg's graph first."""
    diff = {op: ours[op] - theirs[op] for op in ours.keys() | theirs.keys() if ours[op] != theirs[op]}
    return ", ".join(f"{op} {ours[op]}/{theirs[op]} ({d:+d})" for op, d in sorted(diff.items(), key=lambda i: -i[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--opset", type=int, default=18, help="ai.onnx version both exporters target (default 18)")
    parser.add_argument("--models", nargs="*", help="only these models (names as in the table)")
    parser.add_argument("--breakdown", action="store_true", help="op types behind graphs >10%% larger than torch's")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with contextlib.suppress(ImportError):
        import transformers

        transformers.logging.set_verbosity_error()
    header = (
        f"{'model':<16} {'opreg s':>8} {'torch s':>8} {'ratio':>6} {'opreg nodes':>12} {'torch nodes':>12}"
        f" {'opreg fn':>9} {'torch fn':>9} {'max abs':>9}"
    )
    print(f"ai.onnx opset {args.opset}")
    print(header)
    print("-" * len(header))
    larger = []
    for name, model, inputs, kwargs, dynamic in models():
        if args.models and name not in args.models:
            continue
        ours, program = _time(_opreg_export, args.repeat, model, inputs, kwargs, dynamic, args.opset)
        max_abs = program.verify(*inputs, **kwargs).max_abs
        our_proto = program.model_proto
        our_nodes = len(our_proto.graph.node)
        try:
            theirs, onnx_program = _time(_torch_export, args.repeat, model, inputs, kwargs, dynamic, args.opset)
        except Exception as e:  # torch.onnx refuses some models opreg exports: a row of its own
            failed = f"torch.onnx: {type(e).__name__}"
            print(f"{name:<16} {ours:>8.3f} {'failed':>8} {'':>6} {our_nodes:>12} {'':>12}"
                  f" {len(our_proto.functions):>9} {'':>9} {max_abs:>9.1e}  {failed}")  # fmt: skip
            continue
        their_proto = onnx_program.model_proto
        their_nodes = len(their_proto.graph.node)
        print(
            f"{name:<16} {ours:>8.3f} {theirs:>8.3f} {theirs / ours:>5.1f}x {our_nodes:>12} {their_nodes:>12}"
            f" {len(our_proto.functions):>9} {len(their_proto.functions):>9} {max_abs:>9.1e}"
        )
        if our_nodes > 1.1 * their_nodes:
            larger.append((name, _op_types(our_proto), _op_types(their_proto)))
    print("ratio = torch time / opreg time (higher is better for opreg); fn = model-local functions")
    if args.breakdown:
        for name, ours, theirs in larger:
            print(f"\n{name}: opreg/torch nodes by op type: {_breakdown(ours, theirs)}")


if __name__ == "__main__":
    main()
