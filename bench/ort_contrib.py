"""Do ONNX Runtime's com.microsoft kernels beat the standard-ONNX forms on CPU?

Run: python bench/ort_contrib.py [--repeat N]

Part 1 times single ops in ONNX Runtime (default optimisation level, which
already fuses some standard patterns): each candidate contrib kernel against
the standard-ONNX form opreg's core pack emits, on the same input, in one
process. Part 2 exports a small BERT-like and GPT-2-like model with
target="onnx" and target="onnxruntime" and compares their latency.
Timings are noisy: read the ratios (standard / contrib, > 1 means the contrib
kernel is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime
import torch
from onnx import TensorProto, helper

FLOAT = TensorProto.FLOAT


def _session(nodes, inputs, outputs, opsets, initializers=()):
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()], ir_version=10
    )
    onnx.checker.check_model(model)
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _latency(session, feeds, repeat: int) -> float:
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _io(name, shape):
    return helper.make_tensor_value_info(name, FLOAT, shape)


def candidates(opset: int):
    """(name, standard session, contrib session, feeds) for each candidate."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 128, 768), dtype=np.float32)
    std, ms = {"": opset}, {"": opset, "com.microsoft": 1}
    feeds = {"x": x}
    io_in, io_out = [_io("x", list(x.shape))], [_io("y", list(x.shape))]

    # Gelu: standard Gelu (opset 20) vs com.microsoft::Gelu
    yield (
        "Gelu (erf)",
        _session([helper.make_node("Gelu", ["x"], ["y"])], io_in, io_out, std),
        _session([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")], io_in, io_out, ms),
        feeds,
    )
    yield (
        "FastGelu (tanh)",
        _session([helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], io_in, io_out, std),
        _session([helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")], io_in, io_out, ms),
        feeds,
    )
    # QuickGelu: x * sigmoid(1.702 x)
    alpha = helper.make_tensor("alpha", FLOAT, [], [1.702])
    yield (
        "QuickGelu",
        _session(
            [
                helper.make_node("Mul", ["x", "alpha"], ["ax"]),
                helper.make_node("Sigmoid", ["ax"], ["s"]),
                helper.make_node("Mul", ["x", "s"], ["y"]),
            ],
            io_in, io_out, std, [alpha],
        ),
        _session([helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft", alpha=1.702)], io_in, io_out, ms),
        feeds,
    )  # fmt: skip
    # SkipLayerNormalization: Add + LayerNormalization
    gamma = helper.make_tensor("gamma", FLOAT, [768], np.ones(768, np.float32))
    beta = helper.make_tensor("beta", FLOAT, [768], np.zeros(768, np.float32))
    skip_in = [*io_in, _io("skip", list(x.shape))]
    yield (
        "SkipLayerNormalization",
        _session(
            [
                helper.make_node("Add", ["x", "skip"], ["s"]),
                helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
            ],
            skip_in, io_out, std, [gamma, beta],
        ),
        _session(
            [
                helper.make_node(
                    "SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"],
                    domain="com.microsoft", epsilon=1e-5,
                )
            ],
            skip_in, io_out, ms, [gamma, beta],
        ),
        {"x": x, "skip": rng.standard_normal(x.shape, dtype=np.float32)},
    )  # fmt: skip
    # FusedMatMul: MatMul with a transposed operand
    a = rng.standard_normal((64, 128, 64), dtype=np.float32)
    b = rng.standard_normal((64, 128, 64), dtype=np.float32)
    mm_in = [_io("a", list(a.shape)), _io("b", list(b.shape))]
    mm_out = [_io("y", [64, 128, 128])]
    yield (
        "FusedMatMul (A @ B^T)",
        _session(
            [
                helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]),
                helper.make_node("MatMul", ["a", "bt"], ["y"]),
            ],
            mm_in, mm_out, std,
        ),
        _session(
            [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transB=1)], mm_in, mm_out, ms
        ),
        {"a": a, "b": b},
    )  # fmt: skip


class Block(torch.nn.Module):
    """A transformer block: pre- or post-norm, causal or not, erf or tanh GELU."""

    def __init__(self, width: int, heads: int, causal: bool, approximate: str) -> None:
        super().__init__()
        self.heads, self.causal, self.approximate = heads, causal, approximate
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.norm1 = torch.nn.LayerNorm(width)
        self.norm2 = torch.nn.LayerNorm(width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, seq, width))
        hidden = torch.nn.functional.gelu(self.up(self.norm2(x)), approximate=self.approximate)
        return x + self.down(hidden)


class TinyTransformer(torch.nn.Module):
    def __init__(self, causal: bool, approximate: str, width: int = 256, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads, causal, approximate) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def models(repeat: int) -> None:
    import opreg

    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (8, 128))
    print(f"{'model':<14} {'onnx ms':>8} {'onnxruntime ms':>15} {'ratio':>6}  contrib nodes")
    for name, model in (
        ("BERT-like", TinyTransformer(causal=False, approximate="none")),
        ("GPT-2-like", TinyTransformer(causal=True, approximate="tanh")),
    ):
        model.eval()
        timings = {}
        for target in ("onnx", "onnxruntime"):
            program = opreg.export(model, (ids,), target=target)
            program.verify(ids, atol=1e-4)
            session = onnxruntime.InferenceSession(
                program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
            )
            timings[target] = _latency(session, {program.input_names[0]: ids.numpy()}, repeat)
            contrib = sorted({n.op_type for n in program.model_proto.graph.node if n.domain == "com.microsoft"})
        ratio = timings["onnx"] / timings["onnxruntime"]
        print(
            f"{name:<14} {timings['onnx'] * 1e3:>8.2f} {timings['onnxruntime'] * 1e3:>15.2f} {ratio:>5.2f}x"
            f"  {', '.join(contrib)}"
        )
    print("ratio = onnx / onnxruntime target latency: above 1 the onnxruntime target is faster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--opset", type=int, default=23)
    args = parser.parse_args()
    print(f"onnxruntime {onnxruntime.__version__}, ai.onnx {args.opset}, median of {args.repeat} runs")
    print(f"{'candidate':<26} {'standard ms':>12} {'contrib ms':>11} {'ratio':>6}")
    for name, standard, contrib, feeds in candidates(args.opset):
        s = _latency(standard, feeds, args.repeat)
        c = _latency(contrib, feeds, args.repeat)
        print(f"{name:<26} {s * 1e3:>12.2f} {c * 1e3:>11.2f} {s / c:>5.2f}x")
    print("ratio = standard / contrib: above 1 the contrib kernel is faster")
    print()
    models(args.repeat)


if __name__ == "__main__":
    main()
