"""LFM2 (short convolutions beside attention): opreg's decoder against ONNX Runtime GenAI's builder.

Run: python bench/llm_lfm2.py [--rounds N] [--keep DIR]

One random-init LFM2 checkpoint, saved once with the tests' tokenizer: hidden 512, 8 layers (3
attention layers, 2, 5 and 7, as LFM2 interleaves them; 5 short convolutions of kernel 3), 8
query and 2 key/value heads, feed-forward 1536, vocab 32000 (35M parameters). Then, in this run:

1. Export time: each command in a fresh process, as a user runs it, in interleaved rounds:
   ``opreg llm export CKPT -o OUT`` (the default target), the same with ``-t onnxruntime``, and
   ``python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p fp32 -e cpu``; the median of
   each child's CPU time (user + system) and wall time, ``OMP_NUM_THREADS=1`` for all.
2. Tokens: 32 greedy tokens from ONNX Runtime GenAI on each folder against transformers'
   ``generate`` (float32: they must be equal).
3. Latency: each folder's ``model.onnx`` in an ONNX Runtime session (CPU, 1 thread), fed by the
   names and shapes its inputs declare: a decode step after 128 and after 1024 tokens, and a
   128-token prompt; thread CPU time per run in interleaved rounds; the ratio is the median
   over rounds of opreg's time over the builder's in the same round (below 1.0 opreg is faster).
4. ONNX Runtime GenAI: a ``Generator`` (greedy, 1 thread) on each folder, 128 new tokens after a
   128-token prompt: tokens per CPU second of this process, the best of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llm_export import folder_bytes, interleaved
from bench.ort_contrib import round_times

HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB = 512, 8, 8, 2, 32000
ATTENTION = (2, 5, 7)
CASES = (("decode, past 128", 128, 1), ("decode, past 1024", 1024, 1), ("prompt, 128 tokens", 0, 128))


def checkpoint(folder: Path) -> Path:
    """Save the random-init LFM2 (seed 0) and the tests' tokenizer to ``folder``."""
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    from tests import language_models as lm

    torch.manual_seed(0)
    config = Lfm2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2048, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=2048,
        layer_types=["full_attention" if i in ATTENTION else "conv" for i in range(LAYERS)],
        bos_token_id=lm.EOS, eos_token_id=lm.EOS, pad_token_id=lm.PAD,
    )  # fmt: skip
    model = Lfm2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # generate every token asked for, as GenAI does below
    model.save_pretrained(folder)
    lm.tokenizer().save_pretrained(folder)
    return folder


def exports(ckpt: Path, root: Path, rounds: int, builder_options: tuple[str, ...] = ()) -> dict[str, Path]:
    """Part 1: the three folders, timed; returns them by name (``builder_options``: more of the builder's flags)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    opreg = [sys.executable, "-m", "opreg", "llm", "export", str(ckpt), "-o"]
    folders = {name: root / name.replace(" ", "-") for name in ("opreg", "opreg -t onnxruntime", "builder")}
    commands = {
        "opreg": [*opreg, str(folders["opreg"])],
        "opreg -t onnxruntime": [*opreg, str(folders["opreg -t onnxruntime"]), "-t", "onnxruntime"],
        "builder": [
            sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt), "-o", str(folders["builder"]),
            "-p", "fp32", "-e", "cpu", "-c", str(root / "cache"), *builder_options,
        ],
    }  # fmt: skip
    cpu, wall = interleaved(commands, env, rounds)
    print(f"1. export time, median of {rounds} interleaved rounds (fresh process each, OMP_NUM_THREADS=1)")
    print(f"   {'':<22} {'CPU s':>7} {'wall s':>7} {'/ builder CPU':>14} {'folder MB':>10}")
    for name, folder in folders.items():
        ratio = cpu[name] / cpu["builder"]
        mb = folder_bytes(folder) / 1e6
        print(f"   {name:<22} {cpu[name]:7.2f} {wall[name]:7.2f} {ratio:13.2f}x {mb:10.1f}")
    print()
    return folders


def tokens(ckpt: Path, folders: dict[str, Path]) -> None:
    """Part 2: GenAI's greedy tokens from each folder against transformers'."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests import language_models as lm

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    prompt = np.random.default_rng(4).integers(3, VOCAB, 16).tolist()
    expected = lm.greedy(model, prompt, 48)
    print("2. 32 greedy tokens from ONNX Runtime GenAI against transformers' generate")
    for name, folder in folders.items():
        got = lm.genai_greedy(folder, prompt, 48)
        print(f"   {name:<22} {'equal' if got == expected else 'DIFFERENT: ' + str(got[16:])}")
    print()


def session_feeds(session, seq: int, past: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs for one call with ``seq`` new tokens after ``past``, by the names and shapes the
    session declares (its cache inputs random)."""
    sizes = {"batch_size": 1, "sequence_length": seq, "past_sequence_length": past, "total_sequence_length": past + seq}
    feeds = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(3, VOCAB, (1, seq))
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones((1, past + seq), np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.arange(past, past + seq, dtype=np.int64)[None]
        else:  # a cache input; the builder's last dim of keys and values is symbolic (kv_cache_dim)
            shape = [sizes.get(dim, HIDDEN // HEADS) if isinstance(dim, str) else dim for dim in value.shape]
            feeds[value.name] = rng.standard_normal(shape, dtype=np.float32)
    return feeds


def latency(folders: dict[str, Path], rounds: int) -> None:
    """Part 3: each model's call, timed in interleaved rounds."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    sessions = {
        name: onnxruntime.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        for name, folder in folders.items()
    }
    print(f"3. ONNX Runtime, 1 thread, thread CPU ms per call (best of {rounds} interleaved rounds); ratio / builder")
    for label, past, seq in CASES:
        inputs = {name: session_feeds(s, seq, past, np.random.default_rng(3)) for name, s in sessions.items()}
        times = round_times(sessions, inputs, rounds, 10 if seq == 1 else 1)
        builder = np.array(times["builder"])
        cells = [f"builder {builder.min() * 1e3:6.2f}"]
        for name, values in times.items():
            if name != "builder":
                ratio = float(np.median(np.array(values) / builder))
                cells.append(f"{name} {min(values) * 1e3:6.2f} ({ratio:.2f}x)")
        print(f"   {label:<20} " + " | ".join(cells))
    print()


def generation(folders: dict[str, Path], rounds: int) -> None:
    """Part 4: GenAI's generator on each folder."""
    import onnxruntime_genai as og

    models = {}
    for name, folder in folders.items():
        config_path = folder / "genai_config.json"
        config = json.loads(config_path.read_text())
        config["model"]["decoder"]["session_options"].update(intra_op_num_threads=1, inter_op_num_threads=1)
        config_path.write_text(json.dumps(config, indent=4))
        models[name] = og.Model(str(folder))
    prompt = np.random.default_rng(5).integers(3, VOCAB, 128).tolist()
    best = dict.fromkeys(models, 0.0)
    for index in range(rounds):
        names = list(models)[index % len(models) :] + list(models)[: index % len(models)]
        for name in names:
            params = og.GeneratorParams(models[name])
            params.set_search_options(max_length=256, min_length=256, do_sample=False)
            generator = og.Generator(models[name], params)
            start = time.process_time()
            generator.append_tokens(prompt)
            while not generator.is_done():
                generator.generate_next_token()
            new = len(generator.get_sequence(0)) - len(prompt)
            best[name] = max(best[name], new / (time.process_time() - start))
    print(f"4. ONNX Runtime GenAI, 128 new tokens after a 128-token prompt, 1 thread: tokens per CPU second "
          f"(best of {rounds})")  # fmt: skip
    for name, rate in best.items():
        print(f"   {name:<22} {rate:7.1f}  ({rate / best['builder']:.2f}x the builder's)")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="export rounds (latency and GenAI: 10x as many)")
    parser.add_argument("--keep", type=Path, help="keep the checkpoint and the folders here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        ckpt = root / "checkpoint"
        if not (ckpt / "config.json").is_file():
            checkpoint(ckpt)
        folders = exports(ckpt, root, args.rounds)
        tokens(ckpt, folders)
        latency(folders, 10 * args.rounds)
        generation(folders, args.rounds)


if __name__ == "__main__":
    main()
