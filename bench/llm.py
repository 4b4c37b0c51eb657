"""What a user runs, measured: ``opreg llm export`` against ONNX Runtime GenAI's model builder, in one run.

Run: python bench/llm.py [--models 55M,0.5B] [--rounds N] [--export-rounds N] [--kernels]
                         [--ablation] [--accuracy] [--breakdown] [--settings] [--int4-algos] [--lora]
                         [--work DIR]

Each folder is made the way its users make it, each command in a fresh process at its defaults,
plus one row per documented flag:

- ``opreg llm export CKPT -o OUT`` (the default: the fastest installed target, fp32, the weights
  streamed from the checkpoint), ``opreg llm export CKPT -o OUT --precision int4`` and
  ``opreg llm export CKPT -o OUT -t onnx`` (the portable decoder);
- ``python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p fp32|int4 -e cpu``.

Each folder is run with its own ``genai_config.json``. The checkpoints (nothing is downloaded):
``55M``, the random-init Llama issue 22 measured (hidden 512, 8 layers, 8 query and 2 key/value
heads, intermediate 1376, vocab 32000, float32 safetensors); ``0.5B``, a random-init checkpoint of
Qwen2.5-0.5B's shape (494M parameters, tied embeddings, bfloat16 safetensors, as published).

1. Kernels (``--kernels``): each com.microsoft kernel the decoder could use against what it would
   replace, at the 55M model's sizes (1 thread, ratio = baseline / candidate).
2. Exports: CPU time, peak resident memory (each process's own, ``wait4``) and folder size, the
   median over ``--export-rounds`` interleaved rounds.
3. Correctness: every folder against eager PyTorch on two left-padded prompts and a decode step
   (logits and cache); 64 greedy tokens from a plain ONNX Runtime loop against eager ``generate``
   (fp32) and opreg's int4 against the builder's int4.
4. Latency: ONNX Runtime sessions (CPU, 1 thread, thread CPU time, interleaved rounds) for a decode
   step at past 128 and 1024 and a 128-token prompt; the median over rounds of opreg / builder. The
   rounds are split between one fresh process per folder, each loading the folders in a rotated
   order (the session loaded first can run slower).
5. Ablation (``--ablation``, 55M): opreg without each of the pack's rewrites that fired, with
   SkipSimplifiedLayerNormalization, and without the inputs that make it exact on left padding
   (GroupQueryAttention's ``position_ids``, ``attention_bias``, ``head_sink``), each timed beside
   its full export as part 4 times (fresh processes, each loading the two folders in a rotated
   order): the median [p10, p90] of the ratios; a control row times opreg's folder beside itself.
6. ONNX Runtime GenAI: ``Model(folder)`` and a greedy ``Generator`` (1 thread), each folder in a
   fresh process: new tokens per CPU second of the process for 128 tokens after a 128-token prompt
   (the median of 3 generations after an untimed one), the median of rounds in which each compared
   pair runs back to back, each first in turn.
7. Accuracy (``--accuracy``; alone with ``--models ""``): a small Llama trained briefly; opreg's
   folders (``opreg llm export``, fp32 and ``--precision int4``/``int8`` at their defaults, and int4
   at the builder's settings, ``--block-size 32``) and the builder's int4: top-1 agreement with
   fp32, perplexity, greedy runs equal to eager PyTorch's and to the builder's int4, and whether
   opreg's weights at the builder's settings are the builder's byte for byte.
8. Export time (``--breakdown``): where an ``opreg llm export`` spends its CPU time (imports,
   building the model, capture, plan, translation, finishing passes, save with the streamed
   weights' casts and quantization), the median of ``--export-rounds`` interleaved rounds: with one
   layer of each kind captured (the default), for comparison with templates from layer 1 on (the
   plan before) and all layers captured, and with ``--no-streaming``.
9. Quantization settings (``--settings``, 55M): int4 and int8 with each default (blocks of 128,
   symmetric, accuracy level 4) changed, timed against the default as part 5 times; with
   ``--accuracy``, their accuracy on the trained model too.
10. int4 algorithms (``--int4-algos``, 55M): ``opreg llm export --precision int4 --int4-algo
   rtn|k_quant|hqq|gptq``: each folder's size against the builder's ``-p int4``, and its latency beside
   the builder's as part 5 times; with ``--accuracy``, their accuracy on the trained model too.
11. LoRA adapters (``--lora``, 55M; bench/llm_lora.py): one PEFT adapter merged (``--adapter``) and as
   the decoder's inputs (``--adapters``), fp32 and int4: GenAI's prefill and decode time per token with
   the adapter active, inputs / merged, over ``--genai-rounds`` rounds of fresh processes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.big_streaming import measured, write_checkpoint
from bench.ort_contrib import Kernel, _model, _quiet, part_kernels, round_times
from bench.rotated import Timing, rotated
from bench.trained import HELD_OUT, trained_checkpoint

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 512, 8, 8, 2, 1376, 32000
"""The 55M Llama's sizes (part 1's kernels are timed at these)."""
SIZE = HIDDEN // HEADS
PROMPT, GREEDY = 128, 64
CASES = (("decode, past 128", 128, 1), ("decode, past 1024", 1024, 1), ("prompt, 128 tokens", 0, PROMPT))
OPREG = str(Path(sys.executable).with_name("opreg"))
ROWS = {
    "opreg": [],
    "opreg --precision int4": ["--precision", "int4"],
    "opreg -t onnx": ["-t", "onnx"],
    "opreg -t onnxruntime==1.32": ["-t", "onnxruntime==1.32"],
    "opreg --precision int4 -t onnxruntime==1.32": ["--precision", "int4", "-t", "onnxruntime==1.32"],
    "builder -p fp32": ["-p", "fp32"],
    "builder -p int4": ["-p", "int4"],
}
"""Each row's command's flags beyond the checkpoint and the output folder (see :func:`command`)."""
PAIRS = (
    ("opreg", "builder -p fp32"),
    ("opreg --precision int4", "builder -p int4"),
    ("opreg -t onnx", "builder -p fp32"),
    ("opreg", "opreg -t onnxruntime==1.32"),
    ("opreg -t onnxruntime==1.32", "builder -p fp32"),
    ("opreg --precision int4", "opreg --precision int4 -t onnxruntime==1.32"),
)
"""The rows compared: opreg's at each precision beside the builder's, and the default (GroupQueryAttention
with the 16 inputs ONNX Runtime 1.30 loads) beside the 17-input form a target naming 1.32 writes."""


# -- the checkpoints ---------------------------------------------------------------------------


def checkpoint(name: str, work: Path) -> Path:
    """The checkpoint ``name`` (``55M`` or ``0.5B``), written once under ``work``."""
    folder = work / f"checkpoint_{name}"
    if (folder / "config.json").is_file():
        return folder
    if name == "0.5B":
        write_checkpoint("0.5B", folder)
        return folder
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    with _quiet():
        LlamaForCausalLM(config).eval().save_pretrained(folder)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, bos_token="t1", eos_token="t2", pad_token="t0")
    tokenizer.save_pretrained(folder)
    return folder


def eager_reference(model):
    """``model`` as a module taking the cache as inputs and returning it as outputs (the decoder
    layout), to compare each folder with."""
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class PastLayer(DynamicLayer):
        """A layer holding a given past; its length read from its shape."""

        def __init__(self, keys, values) -> None:
            super().__init__()
            self.keys, self.values, self.dtype, self.device = keys, values, keys.dtype, keys.device
            self.is_initialized = True

        def get_seq_length(self) -> int:
            return self.keys.shape[-2]

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, past_key_values):
            cache = DynamicCache()
            cache.layers = [PastLayer(key, value) for key, value in past_key_values]
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache,
                use_cache=True,
            )  # fmt: skip
            return out.logits, [(layer.keys, layer.values) for layer in cache.layers]

    return Decoder().eval()


def positions(mask: np.ndarray, seq: int) -> np.ndarray:
    """The position of each of the last ``seq`` tokens: the count of real tokens before it (left padding)."""
    return np.maximum(mask.cumsum(-1) - 1, 0)[:, -seq:]


# -- part 2: exports ---------------------------------------------------------------------------


def command(row: str, source: Path, out: Path, cache: Path) -> list[str]:
    """The command of ``row``: what its users type."""
    if row.startswith("builder"):
        return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
                *ROWS[row], "-e", "cpu", "-c", str(cache)]  # fmt: skip
    return [OPREG, "llm", "export", str(source), "-o", str(out), *ROWS[row]]


@dataclasses.dataclass
class Build:
    name: str
    folder: Path
    cpu: list[float]
    peak_gb: list[float]

    @property
    def megabytes(self) -> float:
        return sum(f.stat().st_size for f in self.folder.iterdir() if f.is_file()) / 1e6

    def nodes(self) -> str:
        """The graph's node count, and how many of them are the ops a decoder's speed turns on."""
        import collections

        import onnx

        graph = onnx.load(self.folder / "model.onnx", load_external_data=False).graph
        counts = collections.Counter(node.op_type for node in graph.node)
        shown = ", ".join(f"{op} {counts[op]}" for op in _SHOWN_OPS if counts[op])
        return f"{len(graph.node)} nodes ({shown})"


_SHOWN_OPS = ("GroupQueryAttention", "MatMulNBits", "GatherBlockQuantized", "MatMul", "FusedMatMul",
              "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
              "RotaryEmbedding", "Transpose")  # fmt: skip


def builds(source: Path, work: Path, rounds: int, cap_gb: float) -> dict[str, Build]:
    """Every row's folder, made ``rounds`` times in interleaved order (each in a fresh process, under
    an address-space cap of ``cap_gb``); the last round's folder is kept."""
    made = {row: Build(row, work / row.replace(" ", "_").replace("-", ""), [], []) for row in ROWS}
    for index in range(rounds):
        order = list(ROWS)[index % len(ROWS) :] + list(ROWS)[: index % len(ROWS)]
        for row in order:
            build = made[row]
            shutil.rmtree(build.folder, ignore_errors=True)
            done = measured(command(row, source, build.folder, work / "cache"), cap_gb)
            if "error" in done:
                raise RuntimeError(f"{row} failed: {done['error']}")
            build.cpu.append(done["cpu"])
            build.peak_gb.append(done["peak_gb"])
    return made


def print_builds(made: dict[str, Build]) -> None:
    print("2. Exports (fresh processes; CPU s and peak RSS GB: the median of the rounds, each round's in brackets)")
    for build in made.values():
        cpus = ", ".join(f"{c:.1f}" for c in build.cpu)
        cpu, peak = np.median(build.cpu), np.median(build.peak_gb)
        print(f"   {build.name:<24} CPU {cpu:6.1f} s [{cpus}], peak {peak:5.2f} GB, "
              f"folder {build.megabytes:7.1f} MB, {build.nodes()}")  # fmt: skip
    for a, b in PAIRS:
        ratio = np.median(made[a].cpu) / np.median(made[b].cpu)
        size = made[a].megabytes / made[b].megabytes
        print(f"   {a} / {b}: CPU {ratio:.2f}x, folder {size:.3f}x")
    print()


# -- running a folder in plain ONNX Runtime ----------------------------------------------------


class Runner:
    """A folder's model in an ONNX Runtime session, fed by the names its genai_config gives."""

    def __init__(self, folder: Path, threads: int = 1) -> None:
        self.folder = folder
        config = json.loads((folder / "genai_config.json").read_text())["model"]
        self.vocab = config["vocab_size"]
        config = config["decoder"]
        self.inputs, self.outputs = config["inputs"], config["outputs"]
        self.layers, self.kv_heads, self.head_size = (
            config["num_hidden_layers"],
            config["num_key_value_heads"],
            config["head_size"],
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = onnxruntime.InferenceSession(
            str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.names = {i.name for i in self.session.get_inputs()}

    def feeds(self, ids: np.ndarray, mask: np.ndarray, cache: list[tuple[np.ndarray, np.ndarray]]) -> dict:
        feeds = {self.inputs["input_ids"]: ids, self.inputs["attention_mask"]: mask}
        if "position_ids" in self.inputs and self.inputs["position_ids"] in self.names:
            feeds[self.inputs["position_ids"]] = positions(mask, ids.shape[1])
        for layer, (key, value) in enumerate(cache):
            feeds[self.inputs["past_key_names"] % layer] = key
            feeds[self.inputs["past_value_names"] % layer] = value
        return feeds

    def run(self, feeds: dict) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        names = [self.outputs["logits"]]
        for layer in range(self.layers):
            names += [self.outputs["present_key_names"] % layer, self.outputs["present_value_names"] % layer]
        results = self.session.run(names, feeds)
        return results[0], list(zip(results[1::2], results[2::2], strict=True))

    def cache(self, batch: int, past: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
        rng = np.random.default_rng(seed)
        shape = (batch, self.kv_heads, past, self.head_size)
        return [tuple(rng.standard_normal(shape, dtype=np.float32) for _ in range(2)) for _ in range(self.layers)]

    def greedy(self, prompt: np.ndarray, steps: int) -> list[int]:
        cache = self.cache(1, 0)
        ids, mask, tokens = prompt, np.ones_like(prompt), []
        for _ in range(steps):
            logits, cache = self.run(self.feeds(ids, mask, cache))
            tokens.append(int(logits[0, -1].argmax()))
            ids = np.array([[tokens[-1]]], np.int64)
            mask = np.ones((1, mask.shape[1] + 1), np.int64)
        return tokens


# -- part 3: correctness -----------------------------------------------------------------------


CHECKS = (
    ("2 prompts of 7 after a past of 5", 5, 7),
    ("2 prompts of 7, no past", 0, 7),
    ("a decode step of 2 rows after a past of 9", 9, 1),
)
"""What part 3 compares with eager PyTorch: (label, past, new tokens); the second row is left-padded by 3."""


def correctness(source: Path, runners: dict[str, Runner]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    print("3. Correctness against eager PyTorch (float32): max abs difference of the logits (of the rows' real "
          "tokens) / of the cache")  # fmt: skip
    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    wrapped = eager_reference(model)
    first = next(iter(runners.values()))
    rng = np.random.default_rng(1)
    for label, past, seq in CHECKS:
        ids = rng.integers(3, first.vocab, (2, seq))
        mask = np.ones((2, past + seq), np.int64)
        mask[1, :3] = 0
        cache = first.cache(2, past, seed=2)
        with torch.no_grad():
            logits, present = wrapped(
                torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(positions(mask, seq)),
                [tuple(map(torch.from_numpy, kv)) for kv in cache],
            )  # fmt: skip
        real = mask[:, past:] != 0
        print(f"   {label}:")
        for name, runner in runners.items():
            try:
                got, got_cache = runner.run(runner.feeds(ids, mask, cache))
            except Exception as e:
                print(f"     {name}: fails ({str(e).split('Status Message: ')[-1][:70]})")
                continue
            logit_diff = float(np.abs(got - logits.numpy())[real].max())
            cache_diff = max(
                float(np.abs(mine - theirs.numpy()).max())
                for ours, eager in zip(got_cache, present, strict=True)
                for mine, theirs in zip(ours, eager, strict=True)
            )
            print(f"     {name:<24} {logit_diff:.1e} / {cache_diff:.1e}")
    prompt = rng.integers(3, first.vocab, (1, PROMPT))
    with torch.no_grad(), _quiet():
        eager = model.generate(torch.from_numpy(prompt), max_new_tokens=GREEDY, min_new_tokens=GREEDY, do_sample=False)
    tokens = {"eager": eager[0, PROMPT:].tolist()}
    tokens.update((name, runner.greedy(prompt, GREEDY)) for name, runner in runners.items())
    print(f"   {GREEDY} greedy tokens after a {PROMPT}-token prompt (plain loop: past in, present out), equal to:")
    for name in runners:
        reference = "builder -p int4" if name.startswith("opreg --precision int4") else "eager"
        same = sum(a == b for a, b in zip(tokens[name], tokens[reference], strict=True))
        print(f"     {name:<24} {same}/{GREEDY} of {reference}'s")
    print()


# -- part 4: latency ---------------------------------------------------------------------------


def latency(runners: dict[str, Runner], rounds: int) -> dict[str, dict[str, Timing]]:
    """Each runner's session timed in each of :data:`CASES`, in interleaved rounds."""
    result: dict[str, dict[str, Timing]] = {}
    for label, past, seq in CASES:
        first = next(iter(runners.values()))
        rng = np.random.default_rng(3)
        ids = rng.integers(3, first.vocab, (1, seq))
        mask = np.ones((1, past + seq), np.int64)
        cache = first.cache(1, past)
        sessions = {name: r.session for name, r in runners.items()}
        inputs = {name: r.feeds(ids, mask, cache) for name, r in runners.items()}
        times = round_times(sessions, inputs, rounds, 5 if seq == 1 else 1)
        result[label] = {name: Timing(values) for name, values in times.items()}
    return result


def latency_rotated(folders: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """:func:`latency` in one fresh process per folder, each loading the folders in a rotated order, the rounds
    split between them and pooled (:func:`bench.rotated.rotated`): in one process holding several sessions the
    one loaded first can run slower, the same folder too (issue 36), so no folder is always loaded first."""
    return rotated(folder_latency, folders, rounds)


def folder_latency(folders: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """:func:`latency` of ``folders``' runners, loaded in their order (the timer of :func:`latency_rotated`)."""
    return latency({name: Runner(folder) for name, folder in folders.items()}, rounds)


def print_latency(title: str, result: dict[str, dict[str, Timing]], pairs) -> None:
    print(title)
    for label, times in result.items():
        print(f"   {label}:")
        for a, b in pairs:
            if a not in times or b not in times:
                continue
            ratios = times[a].ratios(times[b])
            p10, p50, p90 = np.percentile(ratios, [10, 50, 90])
            print(f"     {a:<24} {times[a].median * 1e3:7.2f} ms / {b:<16} {times[b].median * 1e3:7.2f} ms: "
                  f"{p50:.2f}x [{p10:.2f}, {p90:.2f}]")  # fmt: skip
    print()


def print_beside(rows: dict[str, tuple[Path, str, Path]], rounds: int) -> None:
    """Parts 5 and 9: each row's folder (``name: (folder, base name, base folder)``) timed beside its base as
    part 4 times (:func:`latency_rotated`: fresh processes, each loading the two in turn first), each case's
    ratio median [p10, p90] over the rounds."""
    width = max(map(len, rows))
    print(f"   {'':<{width}} " + " ".join(f"{label[:22]:>22}" for label, _, _ in CASES))
    for name, (folder, base, base_folder) in rows.items():
        result = latency_rotated({base: base_folder, name: folder}, rounds)
        cells = []
        for label, _, _ in CASES:
            p10, p50, p90 = np.percentile(result[label][name].ratios(result[label][base]), [10, 50, 90])
            cells.append(f"{p50:.2f}x [{p10:.2f}, {p90:.2f}]")
        print(f"   {name:<{width}} " + " ".join(f"{cell:>22}" for cell in cells))


# -- part 1: kernels ---------------------------------------------------------------------------


def kernels():
    """Every attention, projection and normalization form a decoder layer could take, at this model's
    sizes, for each of :data:`CASES`."""
    rng = np.random.default_rng(0)
    angles = np.arange(4096)[:, None] * (1.0 / 10000 ** (np.arange(0, SIZE, 2) / SIZE))[None]
    tables = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    for label, past, seq in CASES:
        yield from _attention_kernels(rng, label, past, seq, tables)
        yield from _layer_kernels(rng, label, seq)


_GQA_INPUTS = ("q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin", "pos", "bias", "sink", "", "", "", "",
               "lengths")  # fmt: skip
"""GroupQueryAttention's inputs, by the names the kernels below feed (in ONNX Runtime 1.32's order)."""


def _gqa(*used: str, **attributes) -> tuple:
    """A GroupQueryAttention node reading the inputs ``used`` of :data:`_GQA_INPUTS` (the others left out)."""
    inputs = [name if name in used else "" for name in _GQA_INPUTS]
    while not inputs[-1]:
        inputs.pop()
    return ("ms.GroupQueryAttention", inputs, ["y", "present_k", "present_v"],
            {"num_heads": HEADS, "kv_num_heads": KV_HEADS, **attributes})  # fmt: skip


def _attention_kernels(rng, label: str, past: int, seq: int, tables: dict):
    total = past + seq
    q, k, v = (rng.standard_normal((1, seq, n * SIZE), dtype=np.float32) for n in (HEADS, KV_HEADS, KV_HEADS))
    feeds = {
        "q": q, "k": k, "v": v, "q0": q, "k0": k, "pos": np.arange(past, total)[None],
        "pk": rng.standard_normal((1, KV_HEADS, past, SIZE), dtype=np.float32),
        "pv": rng.standard_normal((1, KV_HEADS, past, SIZE), dtype=np.float32),
        "seqlens": np.full(1, total - 1, np.int32), "total": np.array(total, np.int32),
        "bias": np.zeros((1, 1, seq, total), np.float32), "lengths": np.full(1, seq, np.int32),
    }  # fmt: skip
    outputs = {"y": [1, seq, HIDDEN], "present_k": [1, KV_HEADS, total, SIZE], "present_v": [1, KV_HEADS, total, SIZE]}

    def model(nodes, constants=None):
        """A model of ``nodes``: its inputs are what the nodes read that no node makes and no constant is."""
        made = {name for node in nodes for name in node[2]} | set(constants or {})
        read = [name for node in nodes for name in node[1] if name and name not in made]
        return _model(nodes, {name: feeds[name] for name in dict.fromkeys(read)}, outputs, constants)

    base = ("q", "k", "v", "pk", "pv", "seqlens", "total")
    masked = (*base, "bias", "lengths")
    yield Kernel(
        f"GroupQueryAttention + attention_bias, query_seqlens vs without, {label}", model([_gqa(*base)]),
        model([_gqa(*masked)]), feeds, "kept: exact for left padding and for batched prompts after a cache",
    )  # fmt: skip
    keep = [_gqa(*masked), ("Mul", ["y0", "keep"], ["y"], {})]
    keep[0] = (keep[0][0], keep[0][1], ["y0", "present_k", "present_v"], keep[0][3])
    sink = {"sink": np.full(HEADS, -1e30, np.float32)}
    yield Kernel(
        f"head_sink vs a Mul by the rows with keys, {label}", model(keep, {"keep": np.ones((1, seq, 1), np.float32)}),
        model([_gqa(*masked, "sink")], sink), feeds, "head_sink kept (a row with no key gives 0, as torch's)",
    )  # fmt: skip
    outside = [
        ("Gather", ["cos", "pos"], ["c"], {}), ("Gather", ["sin", "pos"], ["s"], {}),
        ("RotaryEmbedding", ["q0", "c", "s"], ["q"], {"num_heads": HEADS}),
        ("RotaryEmbedding", ["k0", "c", "s"], ["k"], {"num_heads": KV_HEADS}), _gqa(*masked, "sink"),
    ]  # fmt: skip
    inside = _gqa(*masked, "sink", "cos", "sin", "pos", do_rotary=1)
    yield Kernel(
        f"rotary inside GroupQueryAttention vs RotaryEmbedding-23 before it, {label}",
        model(outside, {**tables, **sink}), model([inside], {**tables, **sink}), feeds, "see the ablation",
    )  # fmt: skip


def _layer_kernels(rng, label: str, seq: int):
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    quantizer = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, bits=4))
    x = rng.standard_normal((1, seq, HIDDEN), dtype=np.float32)
    weights = [rng.standard_normal((HIDDEN, n * SIZE), dtype=np.float32) for n in (HEADS, KV_HEADS, KV_HEADS)]

    def nbits(name, weight):
        packed, scales, _ = quantizer.qbits_block_quant(weight)
        attributes = {"K": weight.shape[0], "N": weight.shape[1], "bits": 4, "block_size": 32, "accuracy_level": 4}
        return ("ms.MatMulNBits", ["x", f"{name}_q", f"{name}_s"], [name], attributes), {
            f"{name}_q": packed, f"{name}_s": scales,
        }  # fmt: skip

    three = [nbits(n, w) for n, w in zip("qkv", weights, strict=True)]
    packed = nbits("qkv", np.concatenate(weights, 1))
    shapes = {"q": [1, seq, HIDDEN], "k": [1, seq, KV_HEADS * SIZE], "v": [1, seq, KV_HEADS * SIZE]}
    yield Kernel(
        f"one int4 MatMulNBits for q, k, v vs three, {label}",
        _model([n for n, _ in three], {"x": x}, shapes, {k: v for _, i in three for k, v in i.items()}),
        _model([packed[0]], {"x": x}, {"qkv": [1, seq, (HEADS + 2 * KV_HEADS) * SIZE]}, packed[1]),
        {"x": x}, "see the ablation (the packed result is GroupQueryAttention's query)", compare=False,
    )  # fmt: skip
    skip, gamma = rng.standard_normal((1, seq, HIDDEN), dtype=np.float32), {"gamma": np.ones(HIDDEN, np.float32)}
    io = ({"x": x.shape, "skip": x.shape}, {"y": x.shape, "s": x.shape})
    fused = ("ms.SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y", "", "", "s"], {"epsilon": 1e-6})
    pair = [("Add", ["x", "skip"], ["s"], {}), ("RMSNormalization", ["s", "gamma"], ["y"], {"epsilon": 1e-6})]
    yield Kernel(
        f"Add + RMSNormalization-23 vs SkipSimplifiedLayerNormalization, {label}", _model([fused], *io, gamma),
        _model(pair, *io, gamma), {"x": x, "skip": skip}, "Add + RMSNormalization-23 kept: see the ablation",
    )  # fmt: skip


# -- part 6: ONNX Runtime GenAI ----------------------------------------------------------------


def genai(made: dict[str, Build], rounds: int) -> None:
    """Each folder's generator in a fresh process of its own per round (see :func:`genai_child`): in one
    process holding every folder, the folder loaded first ran 5-10% slower than the one loaded last, the
    same folder too (issue 36: opreg's fp32, loaded first, showed 0.69x)."""
    print(f"6. ONNX Runtime GenAI: new tokens per CPU second of the process, {PROMPT} new tokens after a "
          f"{PROMPT}-token prompt (greedy, each folder's own genai_config.json with 1 thread, each folder in a "
          f"fresh process: the median of {GENERATIONS} timed generations after an untimed one; the median of {rounds} "
          "rounds, each pair back to back and first in turn, and of the ratios to the builder's in the round "
          "[p10, p90])")  # fmt: skip
    for build in made.values():
        config_path = build.folder / "genai_config.json"
        config = json.loads(config_path.read_text())
        config["model"]["decoder"].setdefault("session_options", {}).update(
            intra_op_num_threads=1, inter_op_num_threads=1
        )
        config_path.write_text(json.dumps(config, indent=4))
    rates: dict[str, list[float]] = {name: [] for name in made}
    tokens: dict[str, list[int]] = {}
    names = sorted(made, key=lambda name: GENAI_ORDER.index(name) if name in GENAI_ORDER else len(GENAI_ORDER))
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            child = [sys.executable, __file__, "--genai-child", str(made[name].folder)]
            done = subprocess.run(child, check=False, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"GenAI on {made[name].folder} failed:\n{done.stderr}")
            rate, tokens[name] = json.loads(done.stdout.splitlines()[-1])
            rates[name].append(rate)
    for a, b in PAIRS:
        same = sum(x == y for x, y in zip(tokens[a], tokens[b], strict=False))
        p10, p50, p90 = np.percentile(np.array(rates[a]) / np.array(rates[b]), [10, 50, 90])
        print(f"   {a:<24} {np.median(rates[a]):7.1f} tokens/CPU s, {b:<16} {np.median(rates[b]):7.1f}: "
              f"{p50:.2f}x [{p10:.2f}, {p90:.2f}]; same tokens {same}/{len(tokens[b])}")  # fmt: skip
    print()


GENAI_ORDER = (
    "opreg", "opreg -t onnxruntime==1.32", "builder -p fp32", "opreg -t onnx", "opreg --precision int4",
    "opreg --precision int4 -t onnxruntime==1.32", "builder -p int4",
)  # fmt: skip
"""Part 6's order of the processes in a round, reversed every other round: each of :data:`PAIRS` back to back,
each first in turn (the machine's load drifts between processes further apart)."""
GENERATIONS = 3
"""Part 6's timed generations in each child: on a shared machine one generation's rate varied by 15% between
processes (issue 36), which a median of 3 rounds of one could not tell from a 5% difference."""


def genai_child(folder: Path) -> None:
    """Part 6's child: ``folder``'s greedy generator, one untimed generation and :data:`GENERATIONS` timed; prints
    ``[new tokens per CPU second (their median), the new tokens]`` as JSON."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    prompt = np.random.default_rng(4).integers(3, 1000, PROMPT).tolist()
    rates = []
    for _ in range(1 + GENERATIONS):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=2 * PROMPT, min_length=2 * PROMPT, do_sample=False)
        generator = og.Generator(model, params)
        start = time.process_time()
        generator.append_tokens(prompt)
        while not generator.is_done():
            generator.generate_next_token()
        tokens = [int(token) for token in generator.get_sequence(0)][PROMPT:]
        rates.append(len(tokens) / (time.process_time() - start))
    print(json.dumps([float(np.median(rates[1:])), tokens]))


# -- part 5: ablation --------------------------------------------------------------------------


ABLATED = ("GroupQueryAttentionOnCache", "RotaryInsideAttention", "PackedQKV", "RMSNormalization", "QuickGelu")
"""The pack's rewrites part 5 leaves out one at a time (each fires in this decoder; FusedMatMul does not:
the 55M's linear weights, its untied head too, are stored (in, out) for MatMul)."""


def ablation(source: Path, work: Path, made: dict[str, Build], rounds: int) -> None:
    """opreg's fp32 and int4 exports with each of :data:`ABLATED` left out, with SkipSimplifiedLayerNormalization
    added, and without :data:`PADDING_INPUTS`, timed beside the full ones."""
    print("5. Ablation: opreg without each rewrite (and with SkipSimplifiedLayerNormalization, which the pack leaves "
          "out), ratio to the full export (above 1: the rewrite pays), median [p10, p90] over rounds split between 2 "
          "fresh processes, each loading the two folders in a rotated order")  # fmt: skip
    variants = {"opreg beside its own folder (control)": (made["opreg"].folder, "opreg", made["opreg"].folder)}
    for row in ("opreg", "opreg --precision int4"):
        fired = _fired(made[row].folder / "model.onnx")
        options = [(f"without {rule}", ["--without", rule]) for rule in ABLATED if rule in fired]
        options.append(("with SkipSimplifiedLayerNormalization", ["--skip-norm"]))
        for label, option in options:
            folder = work / f"ablation_{row.replace(' ', '_')}_{option[-1]}"
            extra = ["--", *ROWS[row]]
            subprocess.run([sys.executable, __file__, "--export", str(source), str(folder), *option, *extra],
                           check=True, capture_output=True)  # fmt: skip
            variants[f"{row} {label}"] = (folder, row, made[row].folder)
        folder = work / f"ablation_{row.replace(' ', '_')}_unpadded"
        without_padding_inputs(made[row].folder, folder)
        variants[f"{row} without the left-padding inputs"] = (folder, row, made[row].folder)
    print_beside(variants, rounds)
    print()


PADDING_INPUTS = {9: "position_ids", 10: "attention_bias", 11: "head_sink"}
"""GroupQueryAttention's inputs (by slot) that make opreg's decoder exact on a left-padded batch, which the
builder's lacks (part 3); without them a row's positions and keys are counted from the mask's first column."""


def without_padding_inputs(folder: Path, out: Path) -> None:
    """A copy of ``folder`` (its weights hard-linked) whose GroupQueryAttentions read none of
    :data:`PADDING_INPUTS`, without the ``position_ids`` input: what the exactness on left padding costs (the
    copy is exact only on batches without padding)."""
    import onnx
    import onnx_ir as ir
    import onnx_ir.passes.common

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for file in folder.iterdir():
        (os.link if file.suffix == ".data" else shutil.copy)(file, out / file.name)
    config = json.loads((out / "genai_config.json").read_text())
    positions = config["model"]["decoder"]["inputs"].pop("position_ids", None)
    model = ir.load(out / "model.onnx")
    for node in model.graph:
        if node.op_type == "GroupQueryAttention":
            for slot in PADDING_INPUTS:
                if slot < len(node.inputs):
                    node.replace_input_with(slot, None)
    for value in [v for v in model.graph.inputs if v.name == positions]:
        model.graph.inputs.remove(value)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    onnx.save(ir.to_proto(model), out / "model.onnx")  # the weights' references kept, into the linked file
    (out / "genai_config.json").write_text(json.dumps(config, indent=4))


def _fired(path: Path) -> list[str]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    fired = {p.key: p.value for p in proto.metadata_props}.get("opreg.rewrites", "")
    return [item.split("=")[0].split(":", 1)[1] for item in fired.split(",") if item.startswith("ort_contrib:")]


def export_variant(source: Path, out: Path, without: str | None, skip_norm: bool, flags: list[str]) -> None:
    """The child of an ablation row: ``opreg llm export`` with ``flags``, in this process with a
    rewrite left out (``without``) or SkipSimplifiedLayerNormalization added (``skip_norm``)."""
    import opreg.cli

    if not skip_norm:
        with _without(without):
            code = opreg.cli.main(["llm", "export", str(source), "-o", str(out), *flags])
        if code:
            raise SystemExit(code)
        return
    import opreg

    precision = flags[flags.index("--precision") + 1] if "--precision" in flags else "fp32"
    opreg.llm.export_decoder(source, out, precision=precision, passes=[skip_norm_pass()])


def skip_norm_pass():
    """A pass making ``Add`` + ``RMSNormalization`` (the residual kept) one SkipSimplifiedLayerNormalization:
    what the builder emits and the pack leaves out, for the ablation."""
    import onnx_ir as ir

    class SkipSimplifiedNorm(ir.passes.InPlacePass):
        def call(self, model):
            modified = False
            for node in list(model.graph):
                if node.op_type != "RMSNormalization" or node.domain != "":
                    continue
                add = node.inputs[0].producer()
                if add is None or add.op_type != "Add" or add.domain != "" or len(node.inputs) != 2:
                    continue
                epsilon = node.attributes["epsilon"].as_float() if "epsilon" in node.attributes else 1e-5
                fused = ir.node("SkipSimplifiedLayerNormalization", [*add.inputs, node.inputs[1]],
                                {"epsilon": epsilon}, domain="com.microsoft", num_outputs=4)  # fmt: skip
                model.graph.insert_before(node, fused)
                for old, new in ((node.outputs[0], fused.outputs[0]), (add.outputs[0], fused.outputs[3])):
                    new.type, new.shape = old.type, old.shape
                    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
                modified = True
            ir.passes.common.RemoveUnusedNodesPass()(model)
            return ir.passes.PassResult(model, modified)

    return SkipSimplifiedNorm()


@contextlib.contextmanager
def _without(rule: str | None):
    """The pack's rewrites with ``rule`` left out, for this process (the ablation's exports)."""
    if rule is None:
        yield
        return
    from opreg_ort_contrib import fusions

    rules = fusions.rules
    fusions.rules = lambda target: [r for r in rules(target) if getattr(r, "name", type(r).__name__) != rule]
    try:
        yield
    finally:
        fusions.rules = rules


# -- part 7: accuracy on a trained model --------------------------------------------------------

PROMPTS, NEW_TOKENS = 16, 32
"""Part 7's greedy runs: prompts (the held-out texts' first 16 tokens), new tokens."""
BUILDER_INT4 = "builder -p int4"
BUILDER_SETTINGS = "opreg --precision int4 --block-size 32"
"""opreg at the builder's CPU int4 settings (blocks of 32, symmetric, accuracy level 4): its weights are
the builder's, byte for byte, so its tokens should be too."""


def accuracy(work: Path, steps: int, settings: bool = False, algorithms: bool = False) -> None:
    """opreg's folders (the CLI at its defaults: fp32, int4, int8; with ``settings``, each of
    :data:`SETTINGS` too; with ``algorithms``, each of :data:`ALGORITHMS`) against fp32 on the trained
    model, and the builder's int4 on the same weights."""
    print(f"7. Accuracy on a trained model (next-token logits of {HELD_OUT} held-out texts of 128 tokens; greedy "
          f"{NEW_TOKENS} tokens after {PROMPTS} prompts of 16)")  # fmt: skip
    source, held_out = trained_checkpoint(work / "trained", steps)
    variants = {"opreg": [], "opreg --precision int4": ["--precision", "int4"],
                "opreg --precision int8": ["--precision", "int8"], **(SETTINGS if settings else {}),
                **(ALGORITHMS if algorithms else {})}  # fmt: skip
    variants.setdefault(BUILDER_SETTINGS, SETTINGS[BUILDER_SETTINGS])
    folders = {name: work / f"trained_{name.replace(' ', '_').replace('-', '')}" for name in [*variants, BUILDER_INT4]}
    for name, folder in folders.items():
        shutil.rmtree(folder, ignore_errors=True)
        made = (command(name, source, folder, work / "cache") if name == BUILDER_INT4
                else [OPREG, "llm", "export", str(source), "-o", str(folder), *variants[name]])  # fmt: skip
        done = subprocess.run(made, check=False, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{name} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    runners = {name: Runner(folder) for name, folder in folders.items()}
    logits = {name: _logits(runner, held_out) for name, runner in runners.items()}
    prompts = held_out[:PROMPTS, :16]
    generated = {name: np.array([r.greedy(p[None], NEW_TOKENS) for p in prompts]) for name, r in runners.items()}
    logits["eager"], generated["eager"] = _eager(source, held_out, prompts)
    _print_accuracy(logits, generated, held_out[:, 1:], [*sorted(variants, key=_row_order), BUILDER_INT4])
    _same_weights(runners[BUILDER_SETTINGS].folder, runners[BUILDER_INT4].folder)
    print()


def _row_order(name: str) -> tuple:
    return ("int8" in name, "int4" in name, name != "opreg --precision int4", name)


def _logits(runner: Runner, texts: np.ndarray) -> np.ndarray:
    empty = [(np.zeros((len(texts), runner.kv_heads, 0, runner.head_size), np.float32),) * 2] * runner.layers
    return runner.run(runner.feeds(texts, np.ones_like(texts), empty))[0]


def _eager(source: Path, texts: np.ndarray, prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eager PyTorch's (float32) logits of ``texts``, and its greedy tokens after ``prompts`` (the whole
    sequence run again at each step: no cache to differ)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.no_grad(), _quiet():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        logits = model(input_ids=torch.from_numpy(texts)).logits.numpy()
        ids = torch.from_numpy(prompts)
        for _ in range(NEW_TOKENS):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], 1)
    return logits, ids[:, prompts.shape[1] :].numpy()


def _print_accuracy(logits: dict, generated: dict, truth: np.ndarray, rows: list[str]) -> None:
    """One row per folder: top-1 and logit error against opreg's fp32, perplexity of the held-out
    text, and greedy runs equal to eager's and to the builder's int4 (whole runs; tokens before the
    first difference)."""
    reference, spread = logits["opreg"], float(logits["opreg"].std())
    print(f"   opreg (fp32) against eager PyTorch: max abs logit difference "
          f"{np.abs(reference - logits['eager']).max():.1e}")  # fmt: skip

    def perplexity(values: np.ndarray) -> float:
        shifted = values[:, :-1] - values[:, :-1].max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        return float(np.exp(-np.take_along_axis(log_probs, truth[..., None], -1).mean()))

    def same(name: str, other: str) -> str:
        equal = generated[name] == generated[other]
        prefix = np.where(equal.all(1), equal.shape[1], equal.argmin(1)).sum()
        return f"{int(equal.all(1).sum())}/{len(equal)} ({prefix}/{equal.size})"

    print(f"   {'':<44} {'top-1 = fp32':>12} {'error/spread':>12} {'perplexity':>10} {'greedy = eager':>18} "
          f"{'greedy = builder int4':>21}")  # fmt: skip
    print(f"   {'eager PyTorch (fp32)':<44} {'':>12} {'':>12} {perplexity(logits['eager']):>10.3f}")
    for name in rows:
        agree = float((logits[name].argmax(-1) == reference.argmax(-1)).mean())
        error = float(np.abs(logits[name] - reference).mean()) / spread
        print(f"   {name:<44} {agree:>12.2%} {error:>12.4f} {perplexity(logits[name]):>10.3f} "
              f"{same(name, 'eager'):>18} {same(name, BUILDER_INT4):>21}")  # fmt: skip
    print(f"   ({truth.size} next tokens; greedy: whole runs equal of {len(generated['eager'])}, and tokens before "
          "the first difference)")  # fmt: skip


def _same_weights(ours: Path, builder: Path) -> None:
    """Whether the MatMulNBits weights of two folders are the same bytes (each weight by its shape and
    contents: the two name and pack their projections differently)."""
    import hashlib

    import onnx

    def digests(folder: Path) -> dict[str, int]:
        model = onnx.load(folder / "model.onnx")
        found: dict[str, int] = {}
        for init in model.graph.initializer:
            if init.data_type in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8) and len(init.dims) == 3:
                key = hashlib.sha256(onnx.numpy_helper.to_array(init).tobytes()).hexdigest()
                found[key] = found.get(key, 0) + 1
        return found

    a, b = digests(ours), digests(builder)
    shared = sum(min(count, b.get(key, 0)) for key, count in a.items())
    print(f"   {BUILDER_SETTINGS} against {BUILDER_INT4}: {shared} of {sum(a.values())} / {sum(b.values())} "
          "quantized weights byte for byte the same")  # fmt: skip


# -- part 9: quantization settings ----------------------------------------------------------------

SETTINGS = {
    "opreg --precision int4 --block-size 32": ["--precision", "int4", "--block-size", "32"],
    "opreg --precision int4 --block-size 64": ["--precision", "int4", "--block-size", "64"],
    "opreg --precision int4 --asymmetric": ["--precision", "int4", "--asymmetric"],
    "opreg --precision int4 --accuracy-level 0": ["--precision", "int4", "--accuracy-level", "0"],
    "opreg --precision int8 --accuracy-level 0": ["--precision", "int8", "--accuracy-level", "0"],
}
"""Each of the quantization defaults (blocks of 128, symmetric, accuracy level 4) changed, one at a time."""
CONTROL = {"opreg --precision int4 --symmetric (control)": ["--precision", "int4", "--symmetric"]}
"""The default's settings in a folder of their own: part 9's spread between two identical models."""


def settings(source: Path, work: Path, rounds: int) -> None:
    """The 55M model's int4 and int8 folders with each of :data:`SETTINGS`, timed beside the default's."""
    print(f"9. Quantization settings: each default changed, its time over the default's in the same round, the "
          f"median [p10, p90] over {rounds} interleaved rounds split between 2 fresh processes, each loading the two "
          "folders in a rotated order (above 1: the default is faster)")  # fmt: skip
    defaults = {"int4": ["--precision", "int4"], "int8": ["--precision", "int8"]}
    folders = {}
    rows = {**CONTROL, **SETTINGS}
    for name, flags in [*((f"opreg --precision {p}", f) for p, f in defaults.items()), *rows.items()]:
        folders[name] = work / f"settings_{name.split(' (')[0].replace(' ', '_').replace('-', '')}"
        shutil.rmtree(folders[name], ignore_errors=True)
        subprocess.run([OPREG, "llm", "export", str(source), "-o", str(folders[name]), *flags], check=True,
                       capture_output=True)  # fmt: skip
    base = {name: "opreg --precision int8" if "int8" in name else "opreg --precision int4" for name in rows}
    print_beside({name: (folders[name], base[name], folders[base[name]]) for name in rows}, rounds)
    print()


# -- part 10: int4 algorithms ----------------------------------------------------------------------

ALGORITHMS = {
    f"opreg --precision int4 --int4-algo {algo}": ["--precision", "int4", "--int4-algo", algo]
    for algo in ("rtn", "k_quant", "hqq", "gptq")
}
"""Each ``--int4-algo`` (``rtn`` is the default's weights, in a folder of its own)."""


def int4_algorithms(source: Path, work: Path, made: dict[str, Build], rounds: int) -> None:
    """The 55M model's int4 folder by each of :data:`ALGORITHMS`: its size and export CPU time, and
    its latency beside the builder's ``-p int4`` (as part 5 times)."""
    builder = made[BUILDER_INT4]
    print(f"10. int4 algorithms: each folder's size and export CPU time against the builder's -p int4 "
          f"({builder.megabytes:.1f} MB), and its time over the builder's in the same round, the median [p10, p90] "
          f"over {rounds} interleaved rounds split between 2 fresh processes (below 1: opreg is faster)")  # fmt: skip
    rows = {}
    for name, flags in ALGORITHMS.items():
        folder = work / f"algo_{name.rsplit(' ', 1)[1]}"
        shutil.rmtree(folder, ignore_errors=True)
        done = measured([OPREG, "llm", "export", str(source), "-o", str(folder), *flags], 18.0)
        if "error" in done:
            raise RuntimeError(f"{name} failed: {done['error']}")
        build = Build(name, folder, [done["cpu"]], [done["peak_gb"]])
        print(f"   {name:<44} folder {build.megabytes:6.1f} MB ({build.megabytes / builder.megabytes:.3f}x), export "
              f"CPU {done['cpu']:.1f} s ({done['cpu'] / np.median(builder.cpu):.2f}x), {build.nodes()}")  # fmt: skip
        rows[name] = (folder, BUILDER_INT4, builder.folder)
    print_beside(rows, rounds)
    print()


# -- part 8: where an export's time goes ---------------------------------------------------------


def breakdown_child(source: Path, out: Path, flags: list[str]) -> None:
    """The child of part 8: an ``opreg llm export`` by its public call, the CPU time of each stage printed as JSON."""
    stages: dict[str, float] = {}
    mark = [0.0, "interpreter"]  # the process's CPU time from its start: the interpreter and every import

    def tick(stage: str) -> None:
        now = time.process_time()
        stages[mark[1]] = stages.get(mark[1], 0.0) + now - mark[0]
        mark[:] = [now, stage]

    import torch  # noqa: F401
    import transformers  # noqa: F401

    import opreg
    import opreg.llm._decoder

    tick("load the model and lay out its cache")
    from opreg.llm import _layers

    if "--all-layers" in flags:
        _layers.plan_layers = lambda *args, **kwargs: None
    if "--templates-from-1" in flags:  # the plan before one layer of each kind was captured: from layer 1 on
        plan = _layers.plan_layers
        _layers.plan_layers = lambda *args, **kwargs: plan(*args, **{**kwargs, "hidden_only": False})
    precision = flags[flags.index("--precision") + 1] if "--precision" in flags else "fp32"
    streaming = False if "--no-streaming" in flags else None
    decoder = opreg.llm.export_decoder(source, precision=precision, streaming=streaming, progress=tick)
    tick("save (streamed weights read, cast, packed, quantized, written)")
    decoder.save(out)
    tick("done")
    stages["imports"] = stages.pop("interpreter")
    print(json.dumps(stages))


def breakdown(source: Path, work: Path, rounds: int) -> None:
    print(f"8. Where an export's CPU time goes ({source.name}; opreg.llm.export_decoder(folder).save(out) in a fresh "
          f"process, CPU s per stage, the median of {rounds} interleaved rounds; 'finish' holds the passes and the "
          "fusions; 'templates from layer 1': the capture before one layer of each kind was captured)")  # fmt: skip
    variants = {
        "fp32": [], "fp32, templates from layer 1": ["--templates-from-1"],
        "fp32, all layers captured": ["--all-layers"], "fp32 --no-streaming": ["--no-streaming"],
        "int4": ["--precision", "int4"],
        "int4, templates from layer 1": ["--precision", "int4", "--templates-from-1"],
        "int4, all layers captured": ["--precision", "int4", "--all-layers"],
        "int4 --no-streaming": ["--precision", "int4", "--no-streaming"],
    }  # fmt: skip
    measured: dict[str, list[dict[str, float]]] = {label: [] for label in variants}
    for _ in range(rounds):
        for label, flags in variants.items():
            out = work / "breakdown"
            shutil.rmtree(out, ignore_errors=True)
            done = subprocess.run([sys.executable, __file__, "--breakdown-child", str(source), str(out), "--", *flags],
                                  check=True, capture_output=True, text=True)  # fmt: skip
            measured[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for label, runs in measured.items():
        stages = {stage: float(np.median([run[stage] for run in runs])) for stage in runs[0] if stage != "done"}
        total = float(np.median([sum(run.values()) for run in runs]))
        cells = ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in stages.items())
        print(f"   {label:<30} total {total:5.2f}: {cells}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("build/llm-bench"))
    parser.add_argument("--models", default="55M,0.5B", help='checkpoints: 55M, 0.5B ("": none)')
    parser.add_argument("--rounds", type=int, default=40, help="interleaved timing rounds")
    parser.add_argument("--export-rounds", type=int, default=3, help="interleaved rounds of the exports")
    parser.add_argument("--genai-rounds", type=int, default=3, help="interleaved rounds of ONNX Runtime GenAI")
    parser.add_argument("--cap-gb", type=float, default=18.0, help="each export's address-space cap")
    parser.add_argument("--kernels", action="store_true", help="part 1")
    parser.add_argument("--ablation", action="store_true", help="part 5 (55M)")
    parser.add_argument("--accuracy", action="store_true", help="part 7")
    parser.add_argument("--breakdown", action="store_true", help="part 8")
    parser.add_argument("--settings", action="store_true", help="part 9 (55M; with --accuracy, their accuracy too)")
    parser.add_argument("--int4-algos", action="store_true",
                        help="part 10 (55M; with --accuracy, their accuracy too)")  # fmt: skip
    parser.add_argument("--lora", action="store_true", help="part 11 (55M): LoRA adapters, inputs against merged")
    parser.add_argument("--training-steps", type=int, default=300, help="steps of the model part 7 trains")
    parser.add_argument("--export", nargs=2, type=Path, metavar=("CHECKPOINT", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--breakdown-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--genai-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--without", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--skip-norm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("flags", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        export_variant(*args.export, args.without, args.skip_norm, args.flags)
        return
    if args.genai_child:
        genai_child(args.genai_child)
        return
    if args.breakdown_child:
        logging.disable(logging.WARNING)
        breakdown_child(*args.breakdown_child, args.flags)
        return
    import onnxruntime_genai
    import torch

    print(f"onnxruntime {onnxruntime.__version__}, onnxruntime-genai {onnxruntime_genai.__version__}, "
          f"torch {torch.__version__}, CPU x{os.cpu_count()}, load average {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    args.work.mkdir(parents=True, exist_ok=True)
    if args.kernels:
        part_kernels(args.rounds, kernels(), "1. Kernels at 1 thread, the 55M model's sizes")
    for name in filter(None, args.models.split(",")):  # --models "": no checkpoint's parts (part 7 alone)
        print(f"== {name} ==\n")
        source = checkpoint(name, args.work)
        work = args.work / name
        work.mkdir(parents=True, exist_ok=True)
        made = builds(source, work, args.export_rounds, args.cap_gb)
        print_builds(made)
        runners = {row: Runner(build.folder) for row, build in made.items()}
        correctness(source, runners)
        del runners
        result = latency_rotated({row: build.folder for row, build in made.items()}, args.rounds)
        print_latency(
            f"4. Latency at 1 thread (thread CPU time; the median ms over {args.rounds} interleaved rounds, and the "
            f"median [p10, p90] over rounds of opreg / builder in the round; the rounds split between {len(made)} "
            "fresh processes, each loading the folders in a rotated order)",
            result, PAIRS,
        )  # fmt: skip
        if args.ablation and name == "55M":
            ablation(source, work, made, args.rounds)
        if args.genai_rounds:
            genai(made, args.genai_rounds)
        if args.breakdown:
            breakdown(source, work, args.export_rounds)
        if args.settings and name == "55M":
            settings(source, work, args.rounds)
        if args.int4_algos and name == "55M":
            int4_algorithms(source, work, made, args.rounds)
        if args.lora and name == "55M":
            from bench.llm_lora import lora

            lora(source, work, max(args.genai_rounds, 1))
    if args.accuracy:
        accuracy(args.work, args.training_steps, args.settings, args.int4_algos)


if __name__ == "__main__":
    main()
