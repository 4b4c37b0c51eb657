"""Export time of a language model: `opreg llm export` against ONNX Runtime GenAI's model builder.

Run: python bench/llm_export.py [--rounds N] [--keep DIR]

One checkpoint, saved once (random-init Llama of the issue: hidden 512, 8 layers, 8 query and 2
key/value heads, intermediate 1376, vocab 32000: 55M parameters; the tests' tiny tokenizer), then
in interleaved rounds, each command in a fresh process as a user runs it:

- opreg:   ``opreg llm export CHECKPOINT -o OUT`` (target onnx, fp32)
- builder: ``python -m onnxruntime_genai.models.builder -i CHECKPOINT -o OUT -p fp32 -e cpu``

Each row is the median over the rounds of the child's CPU time (user + system, all its threads)
and of its wall time; the ratio is opreg / builder within this run (the machine is shared:
absolute times drift between runs, ratios far less). Both processes get the same environment
(``OMP_NUM_THREADS=1``). Then opreg's stages, from one in-process export: loading the checkpoint,
the eager call that reads the cache layout, torch.export's capture, translation, finishing and
saving, so what dominates is visible. File sizes of both folders close the table.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 512, 8, 8, 2, 1376, 32000


def checkpoint(folder: Path) -> Path:
    """Save the issue's Llama (random init, seed 0) and a tokenizer to ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests import language_models as lm

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=2048,
        bos_token_id=lm.EOS, eos_token_id=lm.EOS, pad_token_id=lm.PAD,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    lm.tokenizer().save_pretrained(folder)
    return folder


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``command`` run to completion in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def interleaved(commands: dict[str, list[str]], env: dict[str, str], rounds: int) -> tuple[dict, dict]:
    """Each command run ``rounds`` times, the commands interleaved; the medians of each one's
    CPU seconds and of its wall seconds, by name."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            runs[name].append(timed(command, env))
    cpu = {name: statistics.median(c for c, _ in times) for name, times in runs.items()}
    wall = {name: statistics.median(w for _, w in times) for name, times in runs.items()}
    return cpu, wall


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def stages(ckpt: Path, out: Path) -> list[tuple[str, float]]:
    """opreg's stages in this process (CPU seconds), from one export of ``ckpt``."""
    import opreg.llm
    from opreg.llm import _checkpoint, _decoder

    times: list[tuple[str, float]] = []

    class Clock(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.msg == "%s took %.3f s":
                times.append((f"  {record.args[0]} (wall)", float(record.args[1])))

    exporter_log = logging.getLogger("opreg.exporter")
    exporter_log.setLevel(logging.INFO)
    exporter_log.addHandler(Clock())
    clock = time.process_time()
    model = _checkpoint.load_weights(ckpt)  # the model in memory (the command streams it)
    times.append(("load the checkpoint", time.process_time() - clock))
    clock = time.process_time()
    _decoder.layout_of(model)
    times.append(("eager call for the layout", time.process_time() - clock))
    clock = time.process_time()
    decoder = opreg.llm.export_decoder(model)
    times.append(("export_decoder (layout, capture, translate, finish)", time.process_time() - clock))
    clock = time.process_time()
    decoder.save(out)
    times.append(("save the folder", time.process_time() - clock))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep the checkpoint and both folders here")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        ckpt = checkpoint(root / "checkpoint")
        opreg_out, builder_out = root / "opreg", root / "builder"
        commands = {
            "opreg": [sys.executable, "-m", "opreg", "llm", "export", str(ckpt), "-o", str(opreg_out)],
            "builder": [
                sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt), "-o", str(builder_out),
                "-p", "fp32", "-e", "cpu", "-c", str(root / "cache"),
            ],
        }  # fmt: skip
        cpu, wall = interleaved(commands, env, args.rounds)
        print(f"export time, median of {args.rounds} interleaved rounds (fresh process each, OMP_NUM_THREADS=1)")
        print(f"{'':>10} {'CPU s':>8} {'wall s':>8} {'folder MB':>10}")
        for name, out in (("opreg", opreg_out), ("builder", builder_out)):
            print(f"{name:>10} {cpu[name]:8.2f} {wall[name]:8.2f} {folder_bytes(out) / 1e6:10.1f}")
        print(f"{'ratio':>10} {cpu['opreg'] / cpu['builder']:8.2f}x {wall['opreg'] / wall['builder']:7.2f}x")
        print("\nopreg's stages, one in-process export (CPU seconds unless marked):")
        for label, seconds in stages(ckpt, root / "stages"):
            print(f"  {label:<55} {seconds:6.2f}")


if __name__ == "__main__":
    main()
