"""opreg's Whisper folder against ONNX Runtime GenAI's model builder, in one run.

Run: python bench/whisper.py [--rounds N] [--export-rounds N] [--work DIR] [--no-ablation]

The checkpoint is a random-init Whisper of whisper-tiny's shape (d_model 384, 4 encoder and 4
decoder layers of 6 heads, FFN 1536, 80 mel bins, vocab 51865: 38M parameters; weights of std
0.3, so that greedy tokens vary), saved with a
local byte-level BPE tokenizer with Whisper's task tokens (tests/speech_models.py), and Whisper's
feature extractor (nothing is downloaded). From it, in this run:

1. Builds, each in a fresh process: ``python -m onnxruntime_genai.models.builder -p fp32|int4 -e
   cpu`` and ``opreg llm export`` (at its defaults, ``-t onnxruntime``, and ``-t onnxruntime
   --precision int4``): CPU time (user + system of the child) and peak resident memory, the
   median over ``--export-rounds`` interleaved rounds (each round's CPU s in brackets); the
   ratios opreg / builder are the median of the rounds' ratios (each pair built in one round,
   under the same load); files' size.
2. Latency in plain ONNX Runtime sessions (CPU, 1 thread, thread CPU time, interleaved rounds):
   the encoder on one 30 s clip, a decode step (one token) after a past of 4 and of 64 tokens;
   ratio opreg / builder at each precision (below 1.0 opreg is faster). The rounds are split
   between one fresh process per folder, each loading the folders in a rotated order, and pooled
   (bench/rotated.py: in one process the session loaded first can run slower, the same folder
   too). The control: ``opreg`` and ``opreg -t onnxruntime`` are the same folder (the default
   target is onnxruntime), so their ratio reads 1.00x when the order favours neither.
3. ONNX Runtime GenAI: each folder transcribes a synthetic sound with its own audio processing
   (greedy, 64 tokens): whether the tokens equal eager ``generate``'s (fp32) or the builder's
   folder's at the same precision.
4. Ablation: opreg at ``target="onnxruntime"`` without each of the pack's rewrites that fired,
   timed beside the full export (ratio above 1: the rewrite pays), in two fresh processes (the
   full export loaded first in one, last in the other).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.big_streaming import measured
from bench.llm import Build, _fired, _without
from bench.ort_contrib import _quiet, round_times
from bench.rotated import Timing, rotated
from tests import speech_models
from tests.speech_models import PROMPT, PROMPT_TEXT

CONFIG = {"vocab_size": 51865, "d_model": 384, "encoder_layers": 4, "decoder_layers": 4,
          "encoder_attention_heads": 6, "decoder_attention_heads": 6, "encoder_ffn_dim": 1536,
          "decoder_ffn_dim": 1536, "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448,
          "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1, "decoder_start_token_id": 300,
          "init_std": 0.3}  # fmt: skip
GREEDY = 64
PASTS = (4, 64)
CASES = ("encoder, one 30 s clip", *(f"decode step, past {past}" for past in PASTS))
BUILDS = {
    "builder fp32": ["builder", "fp32"],
    "builder int4": ["builder", "int4"],
    "opreg": ["opreg"],
    "opreg -t onnxruntime": ["opreg", "-t", "onnxruntime"],
    "opreg int4": ["opreg", "-t", "onnxruntime", "--precision", "int4"],
}
PAIRS = (("opreg", "builder fp32"), ("opreg -t onnxruntime", "builder fp32"), ("opreg int4", "builder int4"))
CONTROL = ("opreg", "opreg -t onnxruntime")
"""Two builds of the same folder (the default target is onnxruntime): their ratio shows what the order costs."""


def checkpoint(folder: Path) -> Path:
    """The random-init Whisper, the tests' tokenizer and Whisper's feature extractor, saved once."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    with _quiet():
        model = WhisperForConditionalGeneration(WhisperConfig(**CONFIG)).eval()
        model.generation_config.begin_suppress_tokens = None
        model.generation_config.suppress_tokens = None
        speech_models.checkpoint(model, folder)
    return folder


def command(source: Path, folder: Path, spec: list[str], work: Path, *builder_options: str) -> list[str]:
    """The command line of one of :data:`BUILDS`, as its users run it."""
    if spec[0] == "builder":
        return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(folder),
                "-p", spec[1], "-e", "cpu", "-c", str(work / "cache"), *builder_options]  # fmt: skip
    return [str(Path(sys.executable).parent / "opreg"), "llm", "export", str(source), "-o", str(folder), *spec[1:]]


def timed_builds(commands: dict[str, tuple[Path, list[str]]], rounds: int) -> dict[str, Build | str]:
    """Each ``name: (folder, command)`` run ``rounds`` times in interleaved order, each in a fresh
    process (its CPU time and peak memory); the last round's folder is kept. A build that fails
    is its error's last line instead."""
    made: dict[str, Build | str] = {name: Build(name, folder, [], []) for name, (folder, _) in commands.items()}
    names = list(commands)
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            build = made[name]
            if isinstance(build, str):
                continue
            shutil.rmtree(build.folder, ignore_errors=True)
            done = measured(commands[name][1], None)
            if "error" in done:
                made[name] = done["error"].strip().splitlines()[-1]
                continue
            build.cpu.append(done["cpu"])
            build.peak_gb.append(done["peak_gb"])
    return made


def print_builds(made: dict[str, Build], pairs) -> None:
    print("| build | CPU s | peak GB | MB |\n|---|---|---|---|")
    for build in made.values():
        rounds = ", ".join(f"{c:.1f}" for c in build.cpu)
        print(f"| {build.name} | {np.median(build.cpu):.1f} [{rounds}] | {np.median(build.peak_gb):.2f} | "
              f"{megabytes(build.folder):.1f} |")  # fmt: skip
    for mine, theirs in pairs:
        cpu = np.median(np.array(made[mine].cpu) / np.array(made[theirs].cpu))
        peak = np.median(np.array(made[mine].peak_gb) / np.array(made[theirs].peak_gb))
        print(f"| {mine} / {theirs} | {cpu:.2f}x | {peak:.2f}x | |")


def best_ms(timing: Timing) -> float:
    """The best round's milliseconds per run."""
    return min(timing.rounds) * 1e3


def ratio(mine: Timing, theirs: Timing) -> float:
    """The median over the interleaved rounds of ``mine / theirs`` in the round."""
    return float(np.median(mine.ratios(theirs)))


def builds(source: Path, work: Path, rounds: int) -> dict[str, Build]:
    commands = {}
    for name, spec in BUILDS.items():
        folder = work / name.replace(" ", "_")
        commands[name] = (folder, command(source, folder, spec, work))
    made = timed_builds(commands, rounds)
    for name, build in made.items():
        if isinstance(build, str):
            raise SystemExit(f"{name} failed: {build}")
    return made


def megabytes(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("*.onnx*")) / 1e6


class Runner:
    """A folder's encoder and decoder in ONNX Runtime sessions (1 thread), fed by its genai_config's names."""

    def __init__(self, folder: Path) -> None:
        config = json.loads((folder / "genai_config.json").read_text())["model"]
        self.encoder_config, self.decoder_config = config["encoder"], config["decoder"]
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
        providers = ["CPUExecutionProvider"]
        self.encoder = onnxruntime.InferenceSession(
            str(folder / self.encoder_config["filename"]), options, providers=providers
        )
        self.decoder = onnxruntime.InferenceSession(
            str(folder / self.decoder_config["filename"]), options, providers=providers
        )
        types = {i.name: i.type for i in self.decoder.get_inputs()}
        self.ids_type = np.int32 if types[self.decoder_config["inputs"]["input_ids"]] == "tensor(int32)" else np.int64
        self.layers = self.decoder_config["num_hidden_layers"]
        self.heads, self.size = self.decoder_config["num_attention_heads"], self.decoder_config["head_size"]

    def encoder_feeds(self, features: np.ndarray) -> dict:
        return {self.encoder_config["inputs"]["audio_features"]: features}

    def cross(self, features: np.ndarray) -> list[np.ndarray]:
        outputs = self.encoder_config["outputs"]
        names = []
        for layer in range(self.layers):
            names += [outputs["cross_present_key_names"] % layer, outputs["cross_present_value_names"] % layer]
        return self.encoder.run(names, self.encoder_feeds(features))

    def decoder_feeds(self, ids: np.ndarray, past: list[np.ndarray], cross: list[np.ndarray]) -> dict:
        inputs = self.decoder_config["inputs"]
        feeds = {inputs["input_ids"]: ids.astype(self.ids_type)}
        for layer in range(self.layers):
            feeds[inputs["past_key_names"] % layer], feeds[inputs["past_value_names"] % layer] = past[
                2 * layer : 2 * layer + 2
            ]
            feeds[inputs["cross_past_key_names"] % layer] = cross[2 * layer]
            feeds[inputs["cross_past_value_names"] % layer] = cross[2 * layer + 1]
        return feeds


def latency(runners: dict[str, Runner], rounds: int) -> dict[str, dict[str, Timing]]:
    rng = np.random.default_rng(0)
    features = rng.standard_normal((1, CONFIG["num_mel_bins"], 3000), dtype=np.float32)
    cross = runners[min(runners)].cross(features)  # the same folder's, whatever the load order
    result = {}
    sessions = {name: r.encoder for name, r in runners.items()}
    feeds = {name: r.encoder_feeds(features) for name, r in runners.items()}
    result[CASES[0]] = {n: Timing(t) for n, t in round_times(sessions, feeds, rounds, 1).items()}
    for past in PASTS:
        heads, size = CONFIG["decoder_attention_heads"], CONFIG["d_model"] // CONFIG["decoder_attention_heads"]
        cache = [
            rng.standard_normal((1, heads, past, size), dtype=np.float32) for _ in range(2 * CONFIG["decoder_layers"])
        ]
        ids = np.array([[PROMPT[-1]]])
        sessions = {name: r.decoder for name, r in runners.items()}
        feeds = {name: r.decoder_feeds(ids, cache, cross) for name, r in runners.items()}
        times = round_times(sessions, feeds, rounds, 10)
        result[CASES[1 + PASTS.index(past)]] = {n: Timing(t) for n, t in times.items()}
    return result


def folder_latency(folders: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """:func:`latency` of ``folders``' runners, loaded in their order (the timer :func:`bench.rotated.rotated` runs)."""
    return latency({name: Runner(folder) for name, folder in folders.items()}, rounds)


def print_latency(result: dict[str, dict[str, Timing]], pairs=PAIRS, control=CONTROL) -> None:
    """Part 2's table: each pair's best round's ms and the median of the rounds' ratios; then the control."""
    print("| case | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |\n" + "|---" * (len(pairs) + 1) + "|")
    for label, times in result.items():
        cells = [f"{best_ms(times[a]):.2f} / {best_ms(times[b]):.2f} ms: {ratio(times[a], times[b]):.2f}x"
                 for a, b in pairs]  # fmt: skip
        print(f"| {label} | " + " | ".join(cells) + " |")
    a, b = control
    cells = "; ".join(f"{label}: {ratio(times[a], times[b]):.2f}x" for label, times in result.items())
    print(f"\nControl, the same folder twice, {a} / {b}: {cells}")


def genai_tokens(folder: Path, sound_file: Path) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    processor = model.create_multimodal_processor()
    inputs = processor(PROMPT_TEXT, audios=og.Audios.open(str(sound_file)))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + GREEDY)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(PROMPT) :]


def eager_tokens(source: Path, samples: np.ndarray) -> list[int]:
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    with _quiet():
        model = WhisperForConditionalGeneration.from_pretrained(source).eval()
    extractor = WhisperFeatureExtractor.from_pretrained(source)
    features = extractor(samples.astype(np.float32) / 32768, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad(), _quiet():
        out = model.generate(features, decoder_input_ids=torch.tensor([PROMPT]), max_new_tokens=GREEDY, do_sample=False)
    return out[0].tolist()[:GREEDY]


def ablation(source: Path, work: Path, full: Path, rounds: int) -> None:
    """opreg at ``target="onnxruntime"`` without each rewrite that fired, beside the full export."""
    fired = sorted({*_fired(full / "encoder.onnx"), *_fired(full / "decoder.onnx")})
    print("\n4. Ablation: opreg -t onnxruntime without each rewrite that fired; ratio to the full export in the same "
          "rounds (above 1: the rewrite pays)\n")  # fmt: skip
    print("| left out | " + " | ".join(CASES) + " |\n" + "|---" * (len(CASES) + 1) + "|")
    for rule in fired:
        folder = work / f"opreg_without_{rule}"
        command = [sys.executable, __file__, "--export", str(source), str(folder), "--without", rule]
        subprocess.run(command, check=True, capture_output=True)
        result = rotated(folder_latency, {"full": full, rule: folder}, rounds)
        print(f"| {rule} | " + " | ".join(f"{ratio(result[case][rule], result[case]['full']):.2f}x" for case in CASES)
              + " |")  # fmt: skip


def export(source: Path, folder: Path) -> None:
    """opreg's export at ``target="onnxruntime"`` (the ablation's, in its own process)."""
    import opreg

    with _quiet():
        opreg.llm.export_whisper(source, folder, target="onnxruntime")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("build/whisper-bench"))
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    parser.add_argument("--export-rounds", type=int, default=3, help="interleaved rounds of the builds")
    parser.add_argument("--no-ablation", action="store_true")
    parser.add_argument("--export", nargs=2, type=Path, metavar=("CHECKPOINT", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--without", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        with _without(args.without):
            export(*args.export)
        return
    import onnxruntime_genai
    import torch

    print(f"onnxruntime {onnxruntime.__version__}, onnxruntime-genai {onnxruntime_genai.__version__}, "
          f"torch {torch.__version__}, CPU x{os.cpu_count()}, load average {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    args.work.mkdir(parents=True, exist_ok=True)
    source = checkpoint(args.work / "whisper")
    made = builds(source, args.work, args.export_rounds)
    print(f"1. Builds (each in a fresh process; the median of {args.export_rounds} interleaved rounds)\n")
    print_builds(made, PAIRS)
    result = rotated(folder_latency, {name: build.folder for name, build in made.items()}, args.rounds)
    rounds = len(next(iter(result.values()))["opreg"].rounds)  # at least one per process
    print(f"\n2. Latency at 1 thread (thread CPU time: the best round's ms; ratio: the median over {rounds} "
          f"interleaved rounds of opreg / builder in the round; the rounds split between {len(made)} fresh processes, "
          "each loading the folders in a rotated order)\n")  # fmt: skip
    print_latency(result)
    samples = speech_models.sound()
    sound_file = speech_models.write_sound(args.work / "sound.wav", samples)
    tokens = {name: genai_tokens(build.folder, sound_file) for name, build in made.items()}
    eager = eager_tokens(source, samples)
    print(f"\n3. ONNX Runtime GenAI: {GREEDY} greedy tokens of a transcription with GenAI's audio processing\n")
    for name, got in tokens.items():
        reference = "eager" if "int4" not in name else "builder int4"
        expected = eager if reference == "eager" else tokens["builder int4"]
        same = sum(a == b for a, b in zip(got, expected, strict=False))
        print(f"- {name}: {same}/{GREEDY} equal to {reference}'s" + (" (itself)" if name == reference else ""))
    if not args.no_ablation:
        ablation(source, args.work, made["opreg -t onnxruntime"].folder, args.rounds)


if __name__ == "__main__":
    main()
