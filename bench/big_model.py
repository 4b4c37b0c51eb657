"""A model whose weights exceed what one protobuf holds (2 GB): torch.onnx.export(dynamo=True)
and opreg.export side by side, each in a process of its own.

Run: python bench/big_model.py [--hidden 2048 --layers 12 ...]
     python bench/big_model.py --streaming [--sizes 0.5B,1B,3B,8B] [--folder /tmp/bigmodels]

``--streaming``: language models larger than memory (issue 42). For each size it writes a
random-init checkpoint as bf16 safetensors, tensor by tensor (Qwen2.5-0.5B's shape at 0.5B,
Llama-3's at 1B, 3B and 8B), then exports it with ``opreg.llm.export_decoder(folder, out,
target="onnxruntime")`` (the weights streamed from the checkpoint) at int4 (MatMulNBits, the
builder's defaults) and fp32, and with ONNX Runtime GenAI's builder (``-p int4|fp32 -e cpu``)
under a hard address-space cap (``prlimit --as``), one process at a time; it reports each
process's peak resident memory, CPU time, the folder's size and the decode-step latency of the
result in ONNX Runtime GenAI (16 tokens after a 16-token prompt; random weights, so a smoke
test of loading and generating). Checkpoints and outputs are deleted as soon as they are measured.

A Llama-shaped model (transformers' LlamaForCausalLM, random init, nothing
downloaded) with about 1.1B parameters by default, 4.4 GB of float32 weights.
Each exporter exports it and saves it with external data; the saved model is
loaded in ONNX Runtime and run on a short input against eager PyTorch. The
table gives time, each process's peak resident memory, the files written, and
the largest difference from eager.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(args: argparse.Namespace):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=256,
        use_cache=False,
    )
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, args.vocab, (1, 8))
    return model, ids


def child(exporter: str, args: argparse.Namespace) -> dict:
    import contextlib
    import io
    import logging
    import warnings

    import numpy as np
    import onnxruntime
    import torch

    logging.disable(logging.WARNING)
    model, ids = build(args)
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        expected = model(input_ids=ids).logits.numpy()
    folder = Path(tempfile.mkdtemp(prefix=f"big-{exporter}-", dir=args.folder))
    path = folder / "model.onnx"
    start = time.perf_counter()
    if exporter == "opreg":
        import opreg

        program = opreg.export(model, (), {"input_ids": ids}, target=args.opset)
        program.save(path)  # over 2 GB of weights: external data without being asked
    else:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, (), kwargs={"input_ids": ids}, dynamo=True, opset_version=args.opset)
            program.save(str(path), external_data=True)
    seconds = time.perf_counter() - start
    peak_export = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    del program
    written = {p.name: p.stat().st_size for p in folder.iterdir()}
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: ids.numpy()}
    got = session.run(None, feed)[0]
    return {
        "params": params,
        "seconds": seconds,
        "peak_mb": peak_export,
        "files": written,
        "max_abs": float(np.abs(got - expected).max()),
    }


def main() -> None:
    if "--streaming" in sys.argv:
        from bench import big_streaming

        big_streaming.main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--opset", type=int, default=18)
    parser.add_argument("--folder", default=None, help="where the models are written (default: a temp folder)")
    parser.add_argument("--only", choices=["opreg", "torch"], help="run one exporter")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    print(f"Llama-shaped model: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, ai.onnx {args.opset}")
    print(f"{'exporter':<8} {'params':>8} {'export s':>9} {'peak MB':>8} {'max abs':>9}  files")
    for exporter in [args.only] if args.only else ["opreg", "torch"]:
        command = [sys.executable, __file__, "--child", exporter, *sys.argv[1:]]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
        if done.returncode:
            print(f"{exporter:<8} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        files = ", ".join(f"{name} {size / 1e9:.2f} GB" for name, size in sorted(r["files"].items()))
        print(
            f"{exporter:<8} {r['params'] / 1e9:>7.2f}B {r['seconds']:>9.1f} {r['peak_mb']:>8.0f} "
            f"{r['max_abs']:>9.2e}  {files}"
        )
    print("peak MB: the exporting process's peak resident memory (model, eager reference and export together)")


if __name__ == "__main__":
    main()
