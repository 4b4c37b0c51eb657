"""LoRA adapters (issue 51): the decode cost of an adapter given as the decoder's inputs against the
same adapter merged into the weights, fp32 and int4 (int4 base weights, float32 LoRA inputs).

Run: python bench/llm.py --models 55M --lora --genai-rounds 5   (part 11, with the others)
     python bench/llm_lora.py [--rounds 5] [--checkpoint build/llm-bench/checkpoint_55M]   (part 11 alone)

On bench/llm.py's 55M Llama, one random LoRA adapter made by PEFT (rank 16 on every projection:
q, k, v, o, gate, up, down; B drawn non-zero, alpha 32), then four folders, each exported by
``opreg llm export`` in a fresh process:

- ``merged``: ``--adapter ADAPTER``; ``inputs``: ``--adapters ADAPTER``;
- the same two with ``--precision int4``.

Each folder runs in ONNX Runtime GenAI (``og.Adapters`` loading the ``.onnx_adapter`` and
``set_active_adapter`` for the ``inputs`` folders; 1 thread), each in a fresh process per round, the
pair of a precision back to back, each first in turn: a 128-token prompt, then 128 greedy tokens;
prefill and decode timed apart (CPU time of the process), the median of 3 generations after an
untimed one, then the median of the rounds and of the ratios in a round (inputs / merged time per
token, [p10, p90]). The ``inputs`` folder with no adapter active (the base model, empty inputs) is a
third row. The greedy tokens of a pair are compared (fp32: equal).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPREG = str(Path(sys.executable).with_name("opreg"))
PROMPT, NEW, GENERATIONS = 128, 128, 3
RANK, ALPHA = 16, 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ROWS = {
    # row: (flags, the adapter active in GenAI)
    "merged": (["--adapter", "{adapter}"], None),
    "inputs": (["--adapters", "{adapter}"], "adapter"),
    "inputs, none active": (["--adapters", "{adapter}"], None),
    "merged int4": (["--adapter", "{adapter}", "--precision", "int4"], None),
    "inputs int4": (["--adapters", "{adapter}", "--precision", "int4"], "adapter"),
}
PAIRS = (("inputs", "merged"), ("inputs, none active", "merged"), ("inputs int4", "merged int4"))


def make_adapter(source: Path, folder: Path) -> Path:
    """A PEFT LoRA adapter of the checkpoint ``source`` (rank :data:`RANK` on :data:`TARGETS`, B drawn
    non-zero), saved as ``folder / "adapter"`` once."""
    adapter = folder / "adapter"
    if (adapter / "adapter_model.safetensors").is_file():
        return adapter
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in peft.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    peft.save_pretrained(adapter)
    return adapter


def export(source: Path, adapter: Path, work: Path) -> dict[str, tuple[Path, str | None]]:
    """Each row's folder (exported once; ``inputs, none active`` shares ``inputs``'), with the CPU time
    of its export printed."""
    made: dict[str, tuple[Path, str | None]] = {}
    for row, (flags, active) in ROWS.items():
        folder = work / f"lora-{row.replace(', none active', '').replace(' ', '-')}"
        if not (folder / "model.onnx").is_file():
            command = [OPREG, "llm", "export", str(source), "-o", str(folder)]
            command += [flag.format(adapter=adapter) for flag in flags]
            start = os.times()
            subprocess.run(command, check=True, capture_output=True, text=True)
            end = os.times()
            cpu = end.children_user + end.children_system - start.children_user - start.children_system
            size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
            print(f"   export {row:<22} {cpu:6.1f} s CPU, folder {size:6.1f} MiB")
        made[row] = (folder, "adapter" if active else None)
    return made


def child(folder: Path, active: str | None) -> None:
    """One folder's generations (see the module's docstring); prints ``[prefill ms, decode ms per token,
    the new tokens]`` as JSON."""
    import onnxruntime_genai as og

    config_path = folder / "genai_config.json"
    config = json.loads(config_path.read_text())
    config["model"]["decoder"].setdefault("session_options", {}).update(intra_op_num_threads=1, inter_op_num_threads=1)
    config_path.write_text(json.dumps(config, indent=4))
    model = og.Model(str(folder))
    adapters = og.Adapters(model)
    for file in folder.glob("*.onnx_adapter"):
        adapters.load(str(file), file.name.removesuffix(".onnx_adapter"))
    prompt = np.random.default_rng(4).integers(3, 1000, PROMPT).tolist()
    prefills, decodes = [], []
    for _ in range(1 + GENERATIONS):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=PROMPT + NEW, min_length=PROMPT + NEW, do_sample=False)
        generator = og.Generator(model, params)
        if active is not None:
            generator.set_active_adapter(adapters, active)
        start = time.process_time()
        generator.append_tokens(prompt)
        middle = time.process_time()
        while not generator.is_done():
            generator.generate_next_token()
        end = time.process_time()
        tokens = [int(token) for token in generator.get_sequence(0)][PROMPT:]
        prefills.append(1e3 * (middle - start))
        decodes.append(1e3 * (end - middle) / max(1, len(tokens) - 1))
    print(json.dumps([float(np.median(prefills[1:])), float(np.median(decodes[1:])), tokens]))


def lora(source: Path, work: Path, rounds: int) -> None:
    """Part 10 of bench/llm.py: the rows' exports, then their generations in GenAI."""
    print(f"10. LoRA adapters: one PEFT adapter (rank {RANK} on {', '.join(TARGETS)}) merged (--adapter) or as "
          f"inputs (--adapters), fp32 and int4; ONNX Runtime GenAI, 1 thread, a {PROMPT}-token prompt then {NEW} "
          f"greedy tokens, each folder in a fresh process per round (the median of {GENERATIONS} generations after "
          f"an untimed one; the median of {rounds} rounds, each pair back to back, first in turn)")  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    made = export(source, make_adapter(source, work), work)
    times: dict[str, list[tuple[float, float]]] = {row: [] for row in made}
    tokens: dict[str, list[int]] = {}
    order = list(dict.fromkeys(row for pair in PAIRS for row in pair))
    for index in range(rounds):
        for row in order if index % 2 == 0 else order[::-1]:
            folder, active = made[row]
            command = [sys.executable, __file__, "--child", str(folder), active or ""]
            done = subprocess.run(command, check=False, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"GenAI on {folder} failed:\n{done.stderr}")
            prefill, decode, tokens[row] = json.loads(done.stdout.splitlines()[-1])
            times[row].append((prefill, decode))
    for row, measured in times.items():
        prefill, decode = np.median(np.array(measured), axis=0)
        print(f"   {row:<22} prefill {prefill:7.1f} ms, decode {decode:6.2f} ms/token")
    for a, b in PAIRS:
        ratios = np.array([x[1] / y[1] for x, y in zip(times[a], times[b], strict=True)])
        p10, p50, p90 = np.percentile(ratios, [10, 50, 90])
        same = sum(x == y for x, y in zip(tokens[a], tokens[b], strict=False))
        print(f"   decode {a:<22} / {b:<12} {p50:.2f}x [{p10:.2f}, {p90:.2f}]; same tokens {same}/{len(tokens[b])}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("build/llm-bench"))
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=Path("build/llm-bench/checkpoint_55M"),
        help="the 55M checkpoint bench/llm.py writes (python bench/llm.py --models 55M --lora makes it)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), args.child[1] or None)
        return
    if not (args.checkpoint / "config.json").is_file():
        raise SystemExit(f"{args.checkpoint} is not a checkpoint: python bench/llm.py --models 55M --lora writes it")
    lora(args.checkpoint, args.work / "55M", args.rounds)


if __name__ == "__main__":
    main()
