"""One scaled_dot_product_attention node in ONNX Runtime: ai.onnx ``Attention`` (opset 23) against
the MatMul/Softmax decomposition, across head sizes, head counts, sequence lengths, masks and batches.

Run: python bench/attention_kernel.py [--rounds N] [--work DIR] [--sizes 8 16 ...] [--heads 2 4 12]
     python bench/attention_kernel.py --audio NAME=MODEL.onnx NAME=MODEL.onnx ... [--rounds N]

What it measures
----------------
For each head size D and head count H, without a mask, with a bool mask and with an additive
float mask, each of shape (batch, 1, S, S) (transformers 5 gives encoders' sdpa a bool mask), opreg
exports one module calling ``torch.nn.functional.scaled_dot_product_attention`` on (batch, H, S, D)
tensors, batch and S dynamic, twice:

- ``attention``: at ``target=23``, the core pack's impl registered as a user override without its
  predicate, so the node is ai.onnx ``Attention`` whatever the predicate would choose;
- ``decomposed``: at ``target=22``, the MatMul/Softmax decomposition (the same nodes as at 23 where
  the predicate declines Attention).

The two files of a (D, H, mask) are timed by :func:`bench.rotated.rotated`: one fresh process per
file, each loading both in a rotated order, and in it each (S, batch) case is timed in interleaved
rounds (ONNX Runtime at 1 thread, default graph optimizations, the thread's CPU time; each round
runs each session enough times to take about 20 ms). The ratio of a case is the median over its
rounds of attention / decomposed in the round (both ran back to back, under the same load): above
1.00x the decomposition is faster; each cell also gives attention's best round in ms. The masks
are inputs, so the lean pass keeps them (opreg.exporter.passes.masks drops only masks the graph
proves true everywhere).

``--audio`` times whole audio models instead (ONNX files taking ``input_values``, 2 x 16000
samples, as bench/optimum_compare.py feeds them), the same way: one fresh process per file, each
loading all in a rotated order, interleaved rounds; each model's best round and its ratio to the
last one named (the median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ort_contrib import _quiet, round_times  # noqa: E402
from bench.rotated import Timing, rotated  # noqa: E402

SIZES = (8, 16, 32, 64, 128)
HEADS = (2, 4, 12)
SEQUENCES = (16, 128, 512, 1600)
BATCHES = (1, 2)
ROUND_SECONDS = 0.02
"""About how long one session runs in a round: the runs per round are chosen for it."""


MASKS = ("none", "bool", "float")
"""No mask; a bool mask (what transformers 5's mask functions give sdpa, all true where the model
has no padding); an additive float mask (-inf where masked)."""


def export_pair(size: int, heads: int, mask: str, folder: Path) -> dict[str, Path]:
    """The two ONNX files of one (head size, heads, mask kind), exported once into ``folder``."""
    paths = {"attention": folder / "attention.onnx", "decomposed": folder / "decomposed.onnx"}
    if all(p.is_file() for p in paths.values()):
        return paths
    import torch

    import opreg
    from opreg_core_ops.ops.attention import aten_scaled_dot_product_attention

    class Sdpa(torch.nn.Module):
        def forward(self, query, key, value, mask=None):
            return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)

    batch, sequence = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=4096)
    qkv = tuple(torch.randn(2, heads, 16, size) for _ in range(3))
    masks = {"bool": torch.rand(2, 1, 16, 16) > 0.2, "float": torch.randn(2, 1, 16, 16)}
    args = (*qkv, masks[mask]) if mask in masks else qkv
    dims = [{0: batch, 2: sequence}] * 3 + ([{0: batch, 2: sequence, 3: sequence}] if mask in masks else [])
    always = opreg.default_registry().copy()
    always.register("aten::scaled_dot_product_attention", aten_scaled_dot_product_attention, opset=23)
    folder.mkdir(parents=True, exist_ok=True)
    with _quiet():
        for name, options in (("attention", {"target": 23, "registry": always}), ("decomposed", {"target": 22})):
            program = opreg.export(Sdpa(), args, dynamic_shapes=dims, **options)
            kinds = {n.op_type for n in program.model_proto.graph.node}
            if ("Attention" in kinds) != (name == "attention"):
                raise SystemExit(f"{name} of head size {size}, {heads} heads: unexpected ops {sorted(kinds)}")
            program.save(paths[name])
    return paths


def _inputs(session, sequence: int, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        shape = [batch, *(d if isinstance(d, int) else sequence for d in arg.shape[1:])]
        kept = np.arange(sequence) < sequence - sequence // 4  # the last quarter of the keys masked out
        if arg.type == "tensor(bool)":
            feeds[arg.name] = np.ascontiguousarray(np.broadcast_to(kept, shape))
        elif len(shape) == 4 and shape[1] == 1:
            additive = np.where(kept, 0, -np.inf).astype(np.float32)
            feeds[arg.name] = np.ascontiguousarray(np.broadcast_to(additive, shape))
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def timer(paths: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """Each (sequence, batch) case of the files ``paths`` (loaded in their order): seconds per run in
    each of ``rounds`` interleaved rounds (the timer :func:`bench.rotated.rotated` runs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    sessions = {n: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for n, p in paths.items()}
    result: dict[str, dict[str, Timing]] = {}
    for sequence in SEQUENCES:
        for batch in BATCHES:
            inputs = {name: _inputs(s, sequence, batch) for name, s in sessions.items()}
            started = time.thread_time()
            for name, s in sessions.items():
                s.run(None, inputs[name])
            runs = max(1, math.ceil(ROUND_SECONDS * len(sessions) / max(time.thread_time() - started, 1e-6)))
            times = round_times(sessions, inputs, rounds, runs)
            result[f"{sequence}x{batch}"] = {name: Timing(values) for name, values in times.items()}
    return result


AUDIO = (2, 16000)
"""The audio models' ``input_values`` (``--audio``): 2 clips of a second at 16 kHz."""


def audio_timer(paths: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """The models ``paths`` (loaded in their order) on :data:`AUDIO`: seconds per run in each round."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    sessions = {n: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for n, p in paths.items()}
    samples = np.random.default_rng(0).standard_normal(AUDIO).astype(np.float32)
    times = round_times(sessions, {name: {"input_values": samples} for name in sessions}, rounds, 1)
    return {"audio": {name: Timing(values) for name, values in times.items()}}


def print_audio(models: list[str], rounds: int) -> None:
    """``--audio``: each model's best round in ms and its ratio to the last model named."""
    paths = {name: Path(path) for name, path in (model.split("=", 1) for model in models)}
    result = rotated(audio_timer, paths, rounds)["audio"]
    last = list(paths)[-1]
    print(f"| model | best ms | / {last} (median of {len(result[last].rounds)} rounds' ratios) |\n| --- | --- | --- |")
    for name, timing in result.items():
        print(f"| {name} | {1000 * min(timing.rounds):.2f} | {np.median(timing.ratios(result[last])):.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "attention_kernel")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds per case, split between 2 processes")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="head sizes")
    parser.add_argument("--heads", type=int, nargs="+", default=HEADS, help="head counts")
    parser.add_argument("--audio", nargs="+", metavar="NAME=MODEL", help="time these audio models instead")
    args = parser.parse_args()
    import onnxruntime

    if args.audio:
        print(f"ONNX Runtime {onnxruntime.__version__}, 1 thread, input_values {AUDIO}\n")
        print_audio(args.audio, args.rounds)
        return

    print(f"ONNX Runtime {onnxruntime.__version__}, 1 thread; attention / decomposed, the median of {args.rounds} "
          "rounds' ratios (above 1.00x the decomposition is faster); ms: attention's best round\n")  # fmt: skip
    cases = [f"{s}x{b}" for s in SEQUENCES for b in BATCHES]
    print("| head size | heads | mask | " + " | ".join(f"S={c.replace('x', ', B=')}" for c in cases) + " |")
    print("|---" * (3 + len(cases)) + "|")
    for size in args.sizes:
        for heads in args.heads:
            for mask in MASKS:
                folder = args.work / f"d{size}-h{heads}-{mask}"
                result = rotated(timer, export_pair(size, heads, mask, folder), args.rounds)
                cells = []
                for case in cases:
                    a, d = result[case]["attention"], result[case]["decomposed"]
                    cells.append(f"{np.median(a.ratios(d)):.2f}x ({1000 * min(a.rounds):.3g})")
                print(f"| {size} | {heads} | {mask} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
