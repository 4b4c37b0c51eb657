"""Random ops: does the exported model draw from eager PyTorch's distribution? opreg vs torch.onnx.

Run: python bench/distributions.py [--draws 400] [--opset 18]

Each case is a small module calling one random op. It is exported by opreg and by
``torch.onnx.export(dynamo=True)``, each model is run ``--draws`` times in ONNX Runtime
(a fresh draw per run) and eager PyTorch as many times, and the draws are compared with
``opreg.testing.Distribution`` (moments, the shape of the distribution, each element's; a
false-alarm rate of 1e-6 per output). A row says ``ok``, what differs,
or why the exporter could not export or run it.

Then ONNX Runtime's own kernels, which explain the differences: Bernoulli's frequency of
ones against p, and how often Dropout in training mode keeps each element.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from opreg.testing import Distribution

CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "rand_like": (torch.rand_like, (torch.zeros(64),)),
    "randn_like": (torch.randn_like, (torch.zeros(64),)),
    "randint": (lambda x: torch.randint(0, 5, (64,)) + x, (torch.zeros(64, dtype=torch.int64),)),
    "randint_like": (lambda x: torch.randint_like(x, 3, 9), (torch.zeros(64),)),
    "normal(mean, std)": (torch.normal, (torch.linspace(-2, 2, 64), torch.linspace(0.1, 2, 64))),
    "uniform_": (lambda x: x.clone().uniform_(-1.0, 3.0), (torch.zeros(64),)),
    "bernoulli(p)": (torch.bernoulli, (torch.linspace(0, 1, 64),)),
    "bernoulli(x, 0.2)": (lambda x: torch.bernoulli(x, 0.2), (torch.zeros(64),)),
    "multinomial (no replacement)": (lambda w: torch.multinomial(w, 3), (torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 4),)),
    "multinomial (replacement)": (
        lambda w: torch.multinomial(w, 8, replacement=True),
        (torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 4),),
    ),
    "dropout(p=0.3, training)": (lambda x: F.dropout(x, 0.3, training=True), (torch.ones(64),)),
    "dropout of a scalar": (lambda x: F.dropout(x, 0.5, training=True), (torch.tensor(1.0),)),
    "randperm": (lambda x: torch.randperm(8) + x, (torch.zeros(8, dtype=torch.int64),)),
}


class Call(torch.nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fn(*args)


def _session(proto: onnx.ModelProto):
    import onnxruntime

    return onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _draws(proto: onnx.ModelProto, args: tuple[torch.Tensor, ...], count: int) -> list[list[torch.Tensor]]:
    session = _session(proto)
    names = [i.name for i in session.get_inputs()]
    feeds = dict(zip(names, (a.numpy() for a in args), strict=True))
    return [[torch.from_numpy(o) for o in session.run(None, feeds)] for _ in range(count)]


def _eager(fn: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...], count: int) -> list[list[torch.Tensor]]:
    found = []
    for k in range(count):
        torch.manual_seed(k)
        found.append([fn(*args)])
    return found


def _opreg(fn, args, opset: int) -> onnx.ModelProto:
    return opreg.export(Call(fn), args, target=opset).model_proto


def _torch_onnx(fn, args, opset: int) -> onnx.ModelProto:
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(Call(fn), args, dynamo=True, opset_version=opset, verbose=False)
    return program.model_proto


class _quiet:
    """torch.onnx prints its progress: keep it off the table."""

    def __enter__(self):
        self.saved = sys.stdout
        sys.stdout = io.StringIO()

    def __exit__(self, *exc):
        sys.stdout = self.saved


def _verdict(export, fn, args, opset: int, expected, compare: Distribution) -> str:
    try:
        proto = export(fn, args, opset)
    except Exception as e:
        return f"export fails: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
    ops = sorted({n.op_type for n in proto.graph.node if "Random" in n.op_type or n.op_type in _RANDOM})
    try:
        got = _draws(proto, args, compare.draws)
    except Exception as e:
        return f"[{', '.join(ops)}] run fails: {str(e).splitlines()[0][:90]}"
    problems, _ = compare.judge(got, expected, 1e-5, 1e-5)
    return f"[{', '.join(ops)}] " + ("ok" if not problems else "WRONG: " + "; ".join(problems)[:300])


_RANDOM = {"Bernoulli", "Multinomial", "Dropout"}


def onnx_runtime_kernels(runs: int) -> None:
    """ONNX Runtime's Bernoulli and training-mode Dropout, measured on their own."""
    from onnx import TensorProto, helper

    def model(node, inputs, initializers=()):
        outs = [onnx.ValueInfoProto(name=o) for o in node.output]
        graph = helper.make_graph([node], "g", inputs, outs, list(initializers))
        return _session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))

    p = np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32)
    session = model(helper.make_node("Bernoulli", ["p"], ["y"]), [helper.make_tensor_value_info("p", 1, [5])])
    ones = np.mean([session.run(None, {"p": p})[0] for _ in range(runs)], axis=0)
    print(f"\nONNX Runtime Bernoulli, frequency of 1 over {runs} runs (should be p):")
    print("  p:    " + "  ".join(f"{v:5.2f}" for v in p))
    print("  ones: " + "  ".join(f"{v:5.2f}" for v in ones))
    for attributes in ({}, {"seed": 3}):
        node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], **attributes)
        session = model(
            node,
            [helper.make_tensor_value_info("x", 1, [6])],
            [helper.make_tensor("r", 1, [], [0.3]), helper.make_tensor("t", TensorProto.BOOL, [], [True])],
        )
        kept = np.mean([session.run(None, {"x": np.ones(6, np.float32)})[1] for _ in range(runs)], axis=0)
        seeded = f"seed={attributes['seed']}" if attributes else "unseeded"
        print(f"ONNX Runtime Dropout(ratio=0.3, training), {seeded}: frequency each element is kept (should be 0.70):")
        print("  " + "  ".join(f"{v:4.2f}" for v in kept))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=400, help="runs of each model and of eager PyTorch")
    parser.add_argument("--opset", type=int, default=18, help="ai.onnx opset (ONNX Runtime 1.32 runs random ops <= 21)")
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    compare = Distribution(draws=options.draws)
    print(f"## Random ops at ai.onnx {options.opset}: {options.draws} draws each, ONNX Runtime vs eager PyTorch\n")
    print("| op | opreg | torch.onnx |")
    print("|---|---|---|")
    for name, (fn, args) in CASES.items():
        expected = _eager(fn, args, compare.draws)
        mine = _verdict(_opreg, fn, args, options.opset, expected, compare)
        theirs = _verdict(_torch_onnx, fn, args, options.opset, expected, compare)
        print(f"| {name} | {mine} | {theirs} |", flush=True)
    onnx_runtime_kernels(options.draws * 5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
