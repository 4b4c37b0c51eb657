"""``python bench/big_model.py --streaming``: checkpoints larger than memory, exported by
streaming their weights (opreg) and by ONNX Runtime GenAI's builder (see big_model.py)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9
INT4 = {"bits": 4, "block_size": 32, "symmetric": True, "accuracy_level": 4}
"""The builder's defaults for ``-p int4 -e cpu``."""
SHAPES = {
    "0.5B": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                           num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                           max_position_embeddings=32768, rope_theta=1000000.0)),
    "1B": ("llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                         max_position_embeddings=131072, rope_theta=500000.0)),
    "3B": ("llama", dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                         max_position_embeddings=131072, rope_theta=500000.0)),
    "8B": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
                         max_position_embeddings=8192, rope_theta=500000.0)),
}  # fmt: skip
"""Qwen2.5-0.5B's shape, Llama-3.2-1B's, Llama-3.2-3B's and Llama-3-8B's (context lengths capped where
the GenAI config would otherwise size a cache table by 128k positions)."""
CHUNK = 1 << 24
"""Values generated and written at a time while making a checkpoint."""


def _config(size: str):
    from transformers import AutoConfig

    kind, fields = SHAPES[size]
    return AutoConfig.for_model(kind, eos_token_id=0, bos_token_id=1, **fields)


def write_checkpoint(size: str, folder: Path) -> int:
    """A random-init bf16 safetensors checkpoint of ``size``, written tensor by tensor and chunk by
    chunk (the bench never holds a whole model); returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(size)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tensors = list(model.named_parameters())  # a tied weight once, as save_pretrained writes it
    header, offset = {}, 0
    for name, p in tensors:
        header[name] = {"dtype": "BF16", "shape": list(p.shape), "data_offsets": [offset, offset + 2 * p.numel()]}
        offset += 2 * p.numel()
    folder.mkdir(parents=True, exist_ok=True)
    config.architectures = [type(model).__name__]  # the builder picks its writer by it
    config.save_pretrained(folder)
    _tokenizer(folder)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    generator = torch.Generator().manual_seed(0)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for name, p in tensors:
            for start in range(0, p.numel(), CHUNK):
                count = min(CHUNK, p.numel() - start)
                if name.endswith("norm.weight"):
                    values = torch.ones(count)
                else:
                    values = torch.randn(count, generator=generator) * 0.02
                f.write(values.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    return sum(p.numel() for _, p in tensors)


def _tokenizer(folder: Path) -> None:
    """A word-level fast tokenizer (the builder saves one beside its model, and would otherwise
    convert Llama's slow one, which needs sentencepiece)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(1000)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=words, bos_token="t1", eos_token="t0", pad_token="t0")
    fast.save_pretrained(folder)


def _run(command: list[str], cap_gb: float | None) -> dict:
    """``command`` in a child process (under ``prlimit --as`` when ``cap_gb``: prlimit execs it, so
    the child is the command): its output, exit code, wall time and its own resource usage
    (``wait4``: the peak of this process alone, not of every child so far)."""
    import tempfile

    if cap_gb:
        command = ["prlimit", f"--as={int(cap_gb * GB)}", "--", *command]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    return {"out": text, "err": errors, "code": child.returncode, "wall": time.perf_counter() - start, "usage": usage}


def measured(command: list[str], cap_gb: float | None) -> dict:
    """Peak RSS (GB), CPU s and wall s of ``command`` alone, or its error."""
    done = _run(command, cap_gb)
    usage = done["usage"]
    result = {"cpu": usage.ru_utime + usage.ru_stime, "wall": done["wall"], "peak_gb": usage.ru_maxrss * 1024 / GB}
    if done["code"]:
        lines = [line for line in done["err"].strip().splitlines() if line.strip()]
        result["error"] = lines[-1][:200] if lines else f"exit code {done['code']}"
    return result


def folder_gb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / GB


def export_opreg(source: Path, out: Path, precision: str) -> None:
    """The child of an opreg export: the public call, at the onnxruntime target."""
    import opreg

    passes = []
    if precision == "int4":
        from opreg_ort_contrib import MatMulNBitsQuantization

        passes = [MatMulNBitsQuantization(**INT4)]
    opreg.llm.export_decoder(source, out, target="onnxruntime", passes=passes)


def decode(folder: Path) -> dict:
    """The child of a decode measurement: load ``folder`` in ONNX Runtime GenAI and time 16 greedy
    steps after a 16-token prompt (median seconds per step)."""
    import statistics

    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens([list(range(2, 18))])
    steps = []
    for _ in range(16):
        start = time.perf_counter()
        generator.generate_next_token()
        steps.append(time.perf_counter() - start)
    return {"step_s": statistics.median(steps), "tokens": len(generator.get_sequence(0))}


def run_size(size: str, work: Path, args: argparse.Namespace) -> list[dict]:
    rows = []
    source = work / f"checkpoint-{size}"
    start = time.process_time()
    params = write_checkpoint(size, source)
    print(f"{size}: wrote {folder_gb(source):.1f} GB of bf16 in {time.process_time() - start:.0f} s CPU", flush=True)
    for exporter in ("opreg", "builder"):
        for precision in ("int4", "fp32"):
            if precision == "fp32" and params * 4 / GB > args.fp32_max_gb:
                rows.append({"size": size, "params": params, "exporter": exporter, "precision": precision,
                             "error": f"not run: {params * 4 / GB:.0f} GB of fp32 output"})  # fmt: skip
                continue
            out = work / f"{exporter}-{size}-{precision}"
            shutil.rmtree(out, ignore_errors=True)
            if exporter == "opreg":
                command = [sys.executable, __file__, "--export", str(source), str(out), precision]
                cap = args.opreg_cap_gb
            else:
                command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
                           "-p", precision, "-e", "cpu", "-c", str(work / "cache")]  # fmt: skip
                cap = args.builder_cap_gb
            row = {"size": size, "params": params, "exporter": exporter, "precision": precision}
            row.update(measured(command, cap))
            if "error" not in row:
                row["folder_gb"] = folder_gb(out)
                if row["folder_gb"] <= args.decode_max_gb:
                    done = _run([sys.executable, __file__, "--decode", str(out)], args.decode_cap_gb)
                    row.update(json.loads(done["out"].strip().splitlines()[-1]) if not done["code"] else
                               {"decode_error": (done["err"].strip().splitlines() or ["?"])[-1][:200]})  # fmt: skip
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(work / "cache", ignore_errors=True)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if not args.keep:
        shutil.rmtree(source, ignore_errors=True)
    return rows


def same_files(a: Path, b: Path) -> bool:
    """Whether two saved decoders are byte for byte the same (their data files' random names aside);
    the data files compared a chunk at a time (a 0.5B model's are 2 GB each)."""
    import filecmp

    def model(folder: Path, data: list[Path]) -> bytes:
        text = (folder / "model.onnx").read_bytes()
        for d in data:
            text = text.replace(d.name.encode(), b"DATA")
        return text

    data_a, data_b = sorted(a.glob("model.onnx.*.data")), sorted(b.glob("model.onnx.*.data"))
    if len(data_a) != len(data_b) or model(a, data_a) != model(b, data_b):
        return False
    return all(filecmp.cmp(x, y, shallow=False) for x, y in zip(data_a, data_b, strict=True))


def check(work: Path) -> None:
    """Correctness where it can be checked: the 0.5B-class checkpoint streamed and in memory (the same
    bytes), the streamed decoder against transformers (fp32); and int4 as issue 22 measured it, on a
    briefly trained small Llama (bench/llm.py's), streamed against its fp32."""
    import numpy as np
    import torch

    import opreg
    from bench.trained import trained_checkpoint
    from opreg_ort_contrib import MatMulNBitsQuantization

    source = work / "checkpoint-0.5B"
    write_checkpoint("0.5B", source)
    folders = {}
    for streaming in (True, False):
        folders[streaming] = work / f"check-{streaming}"
        decoder = opreg.llm.export_decoder(source, folders[streaming], streaming=streaming, external_data=True)
        if streaming:
            checks = decoder.verify()
            worst = max(c.max_abs for c in checks)
            print(f"0.5B fp32 streamed against transformers: {len(checks)} outputs within rtol=atol=1e-4 "
                  f"(max abs {worst:.1e})")  # fmt: skip
        del decoder
    print(f"0.5B fp32 streamed = in memory, byte for byte: {same_files(folders[True], folders[False])}")
    for folder in [source, *folders.values()]:
        shutil.rmtree(folder, ignore_errors=True)

    trained, held_out = trained_checkpoint(work / "trained", 300)
    int4 = {"target": "onnxruntime", "passes": [MatMulNBitsQuantization(**INT4)]}
    logits, made = {}, {}
    for name, options, streaming in (("fp32", {}, True), ("int4", int4, True), ("int4 in memory", int4, False)):
        made[name] = work / f"trained-{name.replace(' ', '-')}"
        decoder = opreg.llm.export_decoder(trained, made[name], streaming=streaming, external_data=True, **options)
        logits[name] = decoder.run(decoder.inputs(torch.from_numpy(held_out)))["logits"].numpy()
        if name == "fp32":
            eager = decoder.eager(decoder.inputs(torch.from_numpy(held_out)))["logits"].numpy()
    truth = held_out[:, 1:]

    def perplexity(values: np.ndarray) -> float:
        shifted = values[:, :-1] - values[:, :-1].max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        return float(np.exp(-np.take_along_axis(log_probs, truth[..., None], -1).mean()))

    spread = float(logits["fp32"].std())
    worst = np.abs(logits["fp32"] - eager).max()
    print(f"trained Llama, streamed fp32 against eager: max abs logit difference {worst:.1e}")
    for name in ("fp32", "int4"):
        agree = float((logits[name].argmax(-1) == logits["fp32"].argmax(-1)).mean())
        error = float(np.abs(logits[name] - logits["fp32"]).mean()) / spread
        print(f"trained Llama, streamed {name}: top-1 = fp32 {agree:.1%}, logit error / spread {error:.4f}, "
              f"perplexity {perplexity(logits[name]):.2f}")  # fmt: skip
    print(f"trained Llama int4 streamed = in memory, byte for byte: {same_files(made['int4'], made['int4 in memory'])}")
    for folder in made.values():
        shutil.rmtree(folder, ignore_errors=True)


def defaults(work: Path, rounds: int) -> None:
    """``opreg llm export`` (streaming, the default) against ``--no-streaming`` on the 0.5B checkpoint,
    each in a fresh process, interleaved: peak RSS and CPU time of each, medians of ``rounds``."""
    import statistics

    source = work / "checkpoint-0.5B"
    write_checkpoint("0.5B", source)
    results: dict[str, list[dict]] = {"streamed (default)": [], "--no-streaming": []}
    for _ in range(rounds):
        for name, extra in (("streamed (default)", []), ("--no-streaming", ["--no-streaming"])):
            out = work / "defaults-out"
            command = [sys.executable, "-m", "opreg", "llm", "export", str(source), "-o", str(out), *extra]
            results[name].append(measured(command, 12.0))
            shutil.rmtree(out, ignore_errors=True)
    for name, runs in results.items():
        cpu = statistics.median(r["cpu"] for r in runs)
        peak = statistics.median(r["peak_gb"] for r in runs)
        print(f"opreg llm export, {name}: {cpu:.1f} s CPU, peak {peak:.2f} GB (median of {rounds})", flush=True)
    shutil.rmtree(source, ignore_errors=True)


def table(rows: list[dict]) -> str:
    lines = [
        "| size | params | exporter | precision | peak RSS GB | CPU s | CPU s / B params | folder GB | decode ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r and "cpu" not in r:
            lines.append(f"| {r['size']} | {r['params'] / 1e9:.2f}B | {r['exporter']} | {r['precision']} | "
                         f"{r['error']} | | | | |")  # fmt: skip
            continue
        if "error" in r:
            result = f"fails at {r['peak_gb']:.2f} GB: {r['error']}"
            lines.append(f"| {r['size']} | {r['params'] / 1e9:.2f}B | {r['exporter']} | {r['precision']} | "
                         f"{result} | {r['cpu']:.0f} | | | |")  # fmt: skip
            continue
        step = f"{r['step_s'] * 1000:.0f}" if "step_s" in r else r.get("decode_error", "not run")
        lines.append(
            f"| {r['size']} | {r['params'] / 1e9:.2f}B | {r['exporter']} | {r['precision']} | {r['peak_gb']:.2f} | "
            f"{r['cpu']:.0f} | {r['cpu'] / (r['params'] / 1e9):.0f} | {r['folder_gb']:.2f} | {step} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="big_model.py --streaming")
    parser.add_argument("--streaming", action="store_true")
    parser.add_argument("--sizes", default="0.5B,1B,3B,8B")
    parser.add_argument("--folder", default="/tmp/bigmodels", help="checkpoints and outputs (outside the repository)")
    parser.add_argument("--builder-cap-gb", type=float, default=18.0, help="the builder's address-space cap")
    parser.add_argument("--opreg-cap-gb", type=float, default=12.0, help="opreg's address-space cap")
    parser.add_argument("--decode-cap-gb", type=float, default=16.0)
    parser.add_argument("--decode-max-gb", type=float, default=7.0, help="decode only folders up to this size")
    parser.add_argument("--fp32-max-gb", type=float, default=14.0, help="skip fp32 exports of more weights than this")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints")
    parser.add_argument("--check", action="store_true", help="the correctness checks instead (see check())")
    parser.add_argument("--defaults", type=int, metavar="ROUNDS", help="streamed against --no-streaming instead")
    parser.add_argument("--export", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--decode", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.export:
        export_opreg(Path(args.export[0]), Path(args.export[1]), args.export[2])
        return
    if args.decode:
        print(json.dumps(decode(Path(args.decode))))
        return
    work = Path(args.folder)
    work.mkdir(parents=True, exist_ok=True)
    if args.check:
        check(work)
        return
    if args.defaults:
        defaults(work, args.defaults)
        return
    rows = []
    for size in args.sizes.split(","):
        rows += run_size(size, work, args)
    print(table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
