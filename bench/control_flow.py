"""Control flow: what torch.onnx.export(dynamo=True) and opreg.export make of torch's
higher-order ops, side by side, each export verified in ONNX Runtime against eager PyTorch.

Run: python bench/control_flow.py [--opset 18]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from tests import test_control_flow as cf
from tests.real_models import FACTORIES


def cases():
    yield "cond", cf.Branches(), (torch.randn(3), torch.randn(3))
    yield "nested cond", cf.Nested(), (torch.rand(3),)
    yield "while_loop (+cond)", cf.CondInLoop(), (torch.ones(3), torch.tensor(4))
    yield "scan", cf.Scanned(), (torch.randn(3), torch.randn(3), torch.randn(5, 3))
    yield "map", cf.Mapped(), (torch.randn(4, 3), torch.randn(3))
    yield "no_grad/autocast", cf.ContextOnly(), (torch.randn(3),)
    yield "invoke_subgraph", cf.Reused(), (torch.randn(2, 4),)
    for name in ("greedy_decoder", "early_exit"):
        case = FACTORIES[name]()
        yield name, case.model, case.args


def run_onnx(proto, inputs) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
    return session.run(None, feed)


def check(proto, model, args) -> str:
    """The ONNX ops that hold the control flow, and whether the model matches eager."""
    with torch.no_grad():
        expected = [t.numpy() for t in torch.utils._pytree.tree_leaves(model(*args))]
    got = run_onnx(proto, [a for a in args if isinstance(a, torch.Tensor)])
    worst = max(float(np.abs(g.astype(np.float64) - e).max()) for g, e in zip(got, expected, strict=True))
    kinds = sorted({n.op_type for n in proto.graph.node if n.op_type in ("If", "Loop", "Scan")})
    return f"{'+'.join(kinds) or 'inline':<10} max abs {worst:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opset", type=int, default=18)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"ai.onnx opset {args.opset}")
    print(f"{'model':<20} {'torch.onnx':<40} {'opreg':<40}")
    for name, model, inputs in cases():
        model.eval()
        cells = []
        for exporter in ("torch", "opreg"):
            try:
                if exporter == "torch":
                    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        proto = torch.onnx.export(model, inputs, dynamo=True, opset_version=args.opset).model_proto
                else:
                    proto = opreg.export(model, inputs, target=args.opset).model_proto
                cells.append(check(proto, model, inputs))
            except Exception as e:
                cells.append(f"fails: {type(e).__name__}")
        print(f"{name:<20} {cells[0]:<40} {cells[1]:<40}")


if __name__ == "__main__":
    main()
