"""Export cost as graphs grow: torch.onnx.export(dynamo=True) and opreg.export on a stack
of N small transformer blocks (Linear, LayerNorm, scaled_dot_product_attention, GELU).

Run: python bench/scale.py [--blocks 8 64 256] [--opset 18] [--skip-torch-above N]

Each export runs in a process of its own (so caches and memory do not carry over),
one after the other, with torch on one thread; times are the process's CPU time
(``time.process_time``), which other work on a shared machine disturbs far less
than wall time. For opreg the time is split into the stages its ``progress``
callback reports — setup (the registry), capture (torch.export), planning
(and decomposition, when the captured graph needs it), translation and
finishing (the pass pipeline and the check) — and the table says what share of
capture the rest costs. Peak memory is each process's maximum resident set, one
export per process. Timings on shared machines are noisy: read the ratios within
one run; ``bench/capture_overhead.py`` divides whole exports by capture alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, HEADS, SEQ, BATCH = 64, 4, 16, 2


def stack(blocks: int):
    import torch
    from torch import nn

    torch.set_num_threads(1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
            self.proj = nn.Linear(HIDDEN, HIDDEN)
            self.norm1 = nn.LayerNorm(HIDDEN)
            self.up = nn.Linear(HIDDEN, 4 * HIDDEN)
            self.down = nn.Linear(4 * HIDDEN, HIDDEN)
            self.norm2 = nn.LayerNorm(HIDDEN)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, HEADS, HIDDEN // HEADS).permute(2, 0, 3, 1, 4)
            attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = self.norm1(x + self.proj(attn.transpose(1, 2).reshape(b, s, HIDDEN)))
            return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    return Stack().eval(), (torch.randn(BATCH, SEQ, HIDDEN),)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_opreg(blocks: int, opset: int) -> dict:
    """One opreg export, timed stage by stage through its progress callback (``setup`` is
    what comes before capture: the registry built from the installed packs)."""
    import opreg

    model, args = stack(blocks)
    times: dict[str, float] = {}
    current = ["setup", time.process_time()]

    def progress(stage: str) -> None:
        now = time.process_time()
        times[current[0]] = now - current[1]
        current[:] = [stage, now]

    start = time.process_time()
    exported = opreg.export(model, args, target=opset, progress=progress)
    end = time.process_time()
    times[current[0]] = end - current[1]
    return {
        "times": times,
        "total": end - start,
        "nodes": len(exported.model.graph),
        "peak_mb": _peak_mb(),
    }


def child_torch(blocks: int, opset: int) -> dict:
    import contextlib
    import io
    import logging
    import warnings

    import torch

    logging.disable(logging.WARNING)
    model, args = stack(blocks)
    start = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, dynamo=True, opset_version=opset, verbose=False)
    total = time.process_time() - start
    return {"total": total, "nodes": len(program.model.graph), "peak_mb": _peak_mb()}


def run_child(exporter: str, blocks: int, opset: int, timeout: float) -> dict | None:
    command = [sys.executable, __file__, "--child", exporter, str(blocks), str(opset)]
    try:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # bytecode, as installed
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False, env=env)
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    if done.returncode:
        print(f"{exporter} N={blocks} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, nargs="*", default=[8, 64, 256])
    parser.add_argument("--opset", type=int, default=18)
    parser.add_argument("--skip-torch-above", type=int, default=None, help="do not run torch.onnx above N blocks")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per export process")
    parser.add_argument("--child", nargs=3, metavar=("EXPORTER", "N", "OPSET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        exporter, blocks, opset = args.child[0], int(args.child[1]), int(args.child[2])
        result = (child_opreg if exporter == "opreg" else child_torch)(blocks, opset)
        print(json.dumps(result))
        return

    stages = ("setup", "capture", "plan", "translate", "finish")
    print(f"stack of N transformer blocks (hidden {HIDDEN}, seq {SEQ}), ai.onnx {args.opset}; one process per export")
    header = (
        f"{'N':>4} {'torch s':>8} {'opreg s':>8} {'ratio':>6} {'torch nodes':>11} {'opreg nodes':>11}"
        f" {'torch MB':>9} {'opreg MB':>9} | " + " ".join(f"{s:>9}" for s in stages) + f" | {'rest/capture':>12}"
    )
    print(header)
    print("-" * len(header))
    for blocks in args.blocks:
        ours = run_child("opreg", blocks, args.opset, args.timeout)
        theirs = None
        if args.skip_torch_above is None or blocks <= args.skip_torch_above:
            theirs = run_child("torch", blocks, args.opset, args.timeout)
        if ours is None:
            continue
        times = ours["times"]
        rest = sum(v for k, v in times.items() if k != "capture")
        torch_s = theirs["total"] if theirs and "total" in theirs else float("nan")
        torch_nodes = theirs.get("nodes", 0) if theirs else 0
        torch_mb = theirs.get("peak_mb", float("nan")) if theirs else float("nan")
        print(
            f"{blocks:>4} {torch_s:>8.2f} {ours['total']:>8.2f} {ours['total'] / torch_s:>5.2f}x {torch_nodes:>11}"
            f" {ours['nodes']:>11} {torch_mb:>9.0f} {ours['peak_mb']:>9.0f} | "
            + " ".join(f"{times.get(s, 0.0):>9.3f}" for s in stages)
            + f" | {rest / times['capture']:>11.0%}"
        )
    print("ratio = opreg time / torch time (lower is better for opreg); stage columns are opreg's, in seconds")


if __name__ == "__main__":
    main()
