"""opreg's language-model decoder against ONNX Runtime GenAI's model builder, in one run.

Run: python bench/llm.py [--rounds N] [--skip-kernels] [--no-ablation] [--work DIR]

The checkpoint is the one issue 22 measured: a random-init Llama (hidden 512, 8 layers, 8
query and 2 key/value heads, intermediate 1376, vocab 32000: 55M parameters), saved with a
local word-level tokenizer under ``--work`` (nothing is downloaded). From it, in this run:

1. Kernels: each com.microsoft kernel (or form) the decoder could use against what it would
   replace, at this model's sizes, for a decode step and a 128-token prompt (1 thread,
   ratio = baseline / candidate: above 1 the candidate is faster). What the pack emits
   follows from these and from the ablation (part 5).
2. Builds: ``python -m onnxruntime_genai.models.builder`` (fp32 and int4, CPU) and opreg
   (``target="onnxruntime"``; int4 with ``MatMulNBitsQuantization``, the builder's block size
   32, symmetric, accuracy level 4), each in a fresh process: CPU time, wall time, file size.
3. Correctness: every model against eager PyTorch on a batch of two left-padded prompts and a
   decode step (logits and cache); 64 greedy tokens from a plain ONNX Runtime loop (past in,
   present out) against eager ``generate`` (fp32) and between the two int4 models.
4. Latency: ONNX Runtime sessions (CPU, 1 thread, thread CPU time, the best of interleaved
   rounds) for a decode step at past 128 and 1024 and a 128-token prompt; ratio opreg /
   builder at each precision (below 1.0 opreg is faster).
5. Ablation: opreg with each of the pack's rewrites that fired left out, same timing.
6. ONNX Runtime GenAI: ``Model(folder)`` and a ``Generator`` (greedy, past and present sharing
   one buffer, 1 thread) on both folders: tokens per second for 128 new tokens after a
   128-token prompt, and whether the two folders generate the same tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ort_contrib import Kernel, _model, _quiet, part_kernels, round_times

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 512, 8, 8, 2, 1376, 32000
SIZE = HIDDEN // HEADS
PROMPT, GREEDY = 128, 64
CASES = (("decode, past 128", 128, 1), ("decode, past 1024", 1024, 1), ("prompt, 128 tokens", 0, PROMPT))
INT4 = {"bits": 4, "block_size": 32, "symmetric": True, "accuracy_level": 4}
"""The builder's defaults for ``-p int4 -e cpu``, so both quantize the same weights to the same bytes."""


# -- the checkpoint --------------------------------------------------------------------------


def checkpoint(folder: Path) -> Path:
    """The random-init Llama and a word-level tokenizer, saved once under ``folder``."""
    if (folder / "config.json").is_file():
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


# -- opreg's export (until opreg.llm lands: the cache as inputs and outputs, by hand) ----------


def decoder(model):
    """``model`` as a module taking the cache as inputs and returning it as outputs (the layout of
    opreg.llm: ``input_ids``, ``attention_mask``, ``position_ids``, the cache)."""
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class PastLayer(DynamicLayer):
        """A layer holding a given past; its length read from its shape (DynamicLayer says 0 for an
        empty one, a branch torch.export would specialise)."""

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


def opreg_export(source: Path, out: Path, bits: int | None, skip_norm: bool = False) -> None:
    """opreg's folder for ``source``: the decoder at ``target="onnxruntime"`` (with ``bits``: its linear
    layers' weights as MatMulNBits), the builder's genai_config with opreg's names, the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    import opreg
    import opreg_ort_contrib

    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(source).eval()
    config = model.config
    batch, seq, past = (
        torch.export.Dim("batch", max=64),
        torch.export.Dim("seq", max=2048),
        torch.export.Dim("past", max=2048),
    )
    kv_heads, size = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    cache = [
        (torch.randn(2, kv_heads, 3, size), torch.randn(2, kv_heads, 3, size)) for _ in range(config.num_hidden_layers)
    ]
    mask = np.ones((2, 7), np.int64)
    args = (torch.randint(3, VOCAB, (2, 4)), torch.from_numpy(mask), torch.from_numpy(positions(mask, 4)), cache)
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: torch.export.Dim.AUTO},
            "position_ids": {0: batch, 1: torch.export.Dim.AUTO},
            "past_key_values": [({0: batch, 2: past}, {0: batch, 2: past})] * config.num_hidden_layers}  # fmt: skip
    passes = [skip_norm_pass()] if skip_norm else []
    passes += [opreg_ort_contrib.MatMulNBitsQuantization(**{**INT4, "bits": bits})] if bits else []
    program = opreg.export(decoder(model), args, target="onnxruntime", dynamic_shapes=dims, passes=passes)
    out.mkdir(parents=True, exist_ok=True)
    program.save(out / "model.onnx", external_data=True)
    builder = out / "genai_config.json"  # written there first (part 7), else the builder's for this precision
    if not builder.is_file():
        builder = out.parent / f"builder_{'int4' if bits else 'fp32'}" / "genai_config.json"
    genai = json.loads(builder.read_text())
    names = genai["model"]["decoder"]
    names["inputs"].update(
        position_ids="position_ids", past_key_names="past_key_values_%d_0", past_value_names="past_key_values_%d_1"
    )
    names["outputs"].update(logits="output_0", present_key_names="output_1.%d.0", present_value_names="output_1.%d.1")
    (out / "genai_config.json").write_text(json.dumps(genai, indent=4))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)


# -- builds ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Build:
    name: str
    folder: Path
    cpu: float
    wall: float

    @property
    def megabytes(self) -> float:
        return sum(f.stat().st_size for f in self.folder.glob("model.onnx*")) / 1e6

    def nodes(self) -> str:
        """The graph's node count, and how many of them are the ops a decoder's speed turns on."""
        import collections

        import onnx

        graph = onnx.load(self.folder / "model.onnx", load_external_data=False).graph
        counts = collections.Counter(node.op_type for node in graph.node)
        shown = ", ".join(f"{op} {counts[op]}" for op in _SHOWN_OPS if counts[op])
        return f"{len(graph.node)} nodes ({shown})"


_SHOWN_OPS = ("GroupQueryAttention", "MatMulNBits", "MatMul", "FusedMatMul", "SkipSimplifiedLayerNormalization",
              "SimplifiedLayerNormalization", "RMSNormalization", "RotaryEmbedding", "Transpose")  # fmt: skip


def _timed(command: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``command`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def builds(source: Path, work: Path) -> dict[str, Build]:
    """The builder's and opreg's folders, fp32 and int4 (the builder's first: opreg's genai_config
    starts from it)."""
    made = {}
    for precision in ("fp32", "int4"):
        folder = work / f"builder_{precision}"
        shutil.rmtree(folder, ignore_errors=True)
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(folder),
                   "-p", precision, "-e", "cpu", "-c", str(work / "cache")]  # fmt: skip
        made[f"builder {precision}"] = Build(f"builder {precision}", folder, *_timed(command))
        folder = work / f"opreg_{precision}"
        shutil.rmtree(folder, ignore_errors=True)
        command = [sys.executable, __file__, "--export", str(source), str(folder)] + (
            ["--int4"] if precision == "int4" else []
        )
        made[f"opreg {precision}"] = Build(f"opreg {precision}", folder, *_timed(command))
    return made


# -- running a folder in plain ONNX Runtime ----------------------------------------------------


class Runner:
    """A folder's model in an ONNX Runtime session, fed by the names its genai_config gives."""

    def __init__(self, folder: Path, threads: int = 1) -> None:
        self.folder = folder
        config = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
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

    def greedy(self, prompt: np.ndarray, steps: int) -> list[int]:
        cache = [(np.zeros((1, self.kv_heads, 0, self.head_size), np.float32),) * 2 for _ in range(self.layers)]
        ids, mask, tokens = prompt, np.ones_like(prompt), []
        for _ in range(steps):
            logits, cache = self.run(self.feeds(ids, mask, cache))
            tokens.append(int(logits[0, -1].argmax()))
            ids = np.array([[tokens[-1]]], np.int64)
            mask = np.ones((1, mask.shape[1] + 1), np.int64)
        return tokens


def random_cache(batch: int, past: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        tuple(rng.standard_normal((batch, KV_HEADS, past, SIZE), dtype=np.float32) for _ in range(2))
        for _ in range(LAYERS)
    ]


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

    print("3. Correctness against eager PyTorch: max abs difference of the logits (of the rows' real tokens) and cache")
    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(source).eval()
    wrapped = decoder(model)
    rng = np.random.default_rng(1)
    for label, past, seq in CHECKS:
        ids = rng.integers(3, VOCAB, (2, seq))
        mask = np.ones((2, past + seq), np.int64)
        mask[1, :3] = 0
        cache = random_cache(2, past, seed=2)
        with torch.no_grad():
            logits, present = wrapped(
                torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(positions(mask, seq)),
                [tuple(map(torch.from_numpy, kv)) for kv in cache],
            )  # fmt: skip
        real = mask[:, past:] != 0
        cells = []
        for name, runner in runners.items():
            try:
                got, got_cache = runner.run(runner.feeds(ids, mask, cache))
            except Exception as e:
                cells.append(f"{name}: fails ({str(e).split('Status Message: ')[-1][:70]})")
                continue
            logit_diff = float(np.abs(got - logits.numpy())[real].max())
            cache_diff = max(
                float(np.abs(mine - theirs.numpy()).max())
                for ours, eager in zip(got_cache, present, strict=True)
                for mine, theirs in zip(ours, eager, strict=True)
            )
            cells.append(f"{name}: {logit_diff:.1e} / {cache_diff:.1e}")
        print(f"   {label}:")
        for cell in cells:
            print(f"     {cell}")
    prompt = rng.integers(3, VOCAB, (1, PROMPT))
    with torch.no_grad(), _quiet():
        eager = model.generate(torch.from_numpy(prompt), max_new_tokens=GREEDY, min_new_tokens=GREEDY, do_sample=False)
    tokens = {"eager": eager[0, PROMPT:].tolist()}
    tokens.update((name, runner.greedy(prompt, GREEDY)) for name, runner in runners.items())
    print(f"   {GREEDY} greedy tokens after a {PROMPT}-token prompt (plain loop: past in, present out), equal to:")
    for name in runners:
        reference = "builder int4" if name == "opreg int4" else "eager"
        same = sum(a == b for a, b in zip(tokens[name], tokens[reference], strict=True))
        print(f"     {name:<12} {same}/{GREEDY} of {reference}'s")
    print()


# -- part 4: latency ---------------------------------------------------------------------------


@dataclasses.dataclass
class Timing:
    """One session's seconds per run in each interleaved round of a case."""

    rounds: list[float]

    @property
    def best(self) -> float:
        return min(self.rounds)

    def ratio(self, other: Timing) -> float:
        """The median, over rounds, of this session's time over ``other``'s in the same round:
        each pair ran back to back, under the same load."""
        return float(np.median(np.array(self.rounds) / np.array(other.rounds)))


def latency(runners: dict[str, Runner], rounds: int) -> dict[str, dict[str, Timing]]:
    """Each runner's session timed in each of :data:`CASES`, in interleaved rounds."""
    result: dict[str, dict[str, Timing]] = {}
    for label, past, seq in CASES:
        rng = np.random.default_rng(3)
        ids = rng.integers(3, VOCAB, (1, seq))
        mask = np.ones((1, past + seq), np.int64)
        cache = random_cache(1, past)
        sessions = {name: r.session for name, r in runners.items()}
        inputs = {name: r.feeds(ids, mask, cache) for name, r in runners.items()}
        times = round_times(sessions, inputs, rounds, 10 if seq == 1 else 1)
        result[label] = {name: Timing(values) for name, values in times.items()}
    return result


def print_latency(title: str, result: dict[str, dict[str, Timing]], pairs: list[tuple[str, str]]) -> None:
    print(title)
    for label, times in result.items():
        cells = []
        for a, b in pairs:
            first, second = times[a], times[b]
            cells.append(
                f"{a} {first.best * 1e3:6.2f} ms / {b} {second.best * 1e3:6.2f} ms: {first.ratio(second):.2f}x"
            )
        print(f"   {label:<20} " + " | ".join(cells))
    print()


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
    import onnxruntime_genai as og

    print(f"6. ONNX Runtime GenAI: tokens/s for {PROMPT} new tokens after a {PROMPT}-token prompt "
          "(greedy, shared buffer, 1 thread; the best of interleaved rounds)")  # fmt: skip
    models = {}
    for name, build in made.items():
        config_path = build.folder / "genai_config.json"
        config = json.loads(config_path.read_text())
        config["model"]["decoder"]["session_options"].update(intra_op_num_threads=1, inter_op_num_threads=1)
        config_path.write_text(json.dumps(config, indent=4))
        models[name] = og.Model(str(build.folder))
    prompt = np.random.default_rng(4).integers(3, VOCAB, PROMPT).tolist()
    best = dict.fromkeys(models, 0.0)
    tokens: dict[str, list[int]] = {}
    for _ in range(rounds):
        for name, model in models.items():
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=2 * PROMPT, do_sample=False, past_present_share_buffer=True)
            generator = og.Generator(model, params)
            start = time.perf_counter()
            generator.append_tokens(prompt)
            while not generator.is_done():
                generator.generate_next_token()
            elapsed = time.perf_counter() - start
            tokens[name] = list(generator.get_sequence(0))[PROMPT:]
            best[name] = max(best[name], len(tokens[name]) / elapsed)
    for precision in ("fp32", "int4"):
        b, o = f"builder {precision}", f"opreg {precision}"
        if b in best and o in best:
            same = sum(x == y for x, y in zip(tokens[b], tokens[o], strict=False))
            print(f"   {precision}: builder {best[b]:6.1f} tokens/s, opreg {best[o]:6.1f} tokens/s "
                  f"(ratio {best[b] / best[o]:.2f}x); same tokens {same}/{len(tokens[b])}")  # fmt: skip
    print()


# -- part 5: ablation --------------------------------------------------------------------------


ABLATED = ("GroupQueryAttentionOnCache", "RotaryInsideAttention", "PackedQKV", "RMSNormalization", "QuickGelu",
           "FusedMatMul")  # fmt: skip
"""The pack's rewrites part 5 leaves out one at a time (each fires in this decoder)."""


def ablation(source: Path, work: Path, runners: dict[str, Runner], rounds: int) -> None:
    """opreg's fp32 and int4 exports with each of :data:`ABLATED` left out, and with
    SkipSimplifiedLayerNormalization added, timed beside the full ones."""
    print("5. Ablation: opreg without each rewrite (and with SkipSimplifiedLayerNormalization, which the pack leaves "
          "out), ratio to the full export (above 1: the rewrite pays)")  # fmt: skip
    variants = {}
    for precision in ("fp32", "int4"):
        fired = _fired(work / f"opreg_{precision}" / "model.onnx")
        options = [(f"without {rule}", ["--without", rule]) for rule in ABLATED if rule in fired]
        options.append(("with SkipSimplifiedLayerNormalization", ["--skip-norm"]))
        for label, option in options:
            folder = work / f"opreg_{precision}_{option[-1]}"
            command = [sys.executable, __file__, "--export", str(source), str(folder), *option]
            subprocess.run(command + (["--int4"] if precision == "int4" else []), check=True, capture_output=True)
            variants[f"{precision} {label}"] = (folder, f"opreg {precision}")
    print(f"   {'':<48} " + " ".join(f"{label[:18]:>18}" for label, _, _ in CASES))
    for name, (folder, full) in variants.items():  # each beside a fresh session of its full export, alone
        result = latency({full: Runner(runners[full].folder), name: Runner(folder)}, rounds)
        print(f"   {name:<48} " + " ".join(f"{result[label][name].ratio(result[label][full]):>17.2f}x"
                                             for label, _, _ in CASES))  # fmt: skip
    print()


def _fired(path: Path) -> list[str]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    fired = {p.key: p.value for p in proto.metadata_props}.get("opreg.rewrites", "")
    return [item.split("=")[0].split(":", 1)[1] for item in fired.split(",") if item.startswith("ort_contrib:")]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("build/llm-bench"))
    parser.add_argument("--rounds", type=int, default=40, help="interleaved timing rounds")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--no-ablation", action="store_true")
    parser.add_argument("--training-steps", type=int, default=300, help="steps of the model part 7 trains")
    parser.add_argument("--export", nargs=2, type=Path, metavar=("CHECKPOINT", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--int4", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--int8", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--without", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--skip-norm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        with _without(args.without):
            bits = 4 if args.int4 else 8 if args.int8 else None
            opreg_export(*args.export, bits=bits, skip_norm=args.skip_norm)
        return
    import onnxruntime_genai
    import torch

    print(f"onnxruntime {onnxruntime.__version__}, onnxruntime-genai {onnxruntime_genai.__version__}, "
          f"torch {torch.__version__}, CPU x{os.cpu_count()}\n")  # fmt: skip
    args.work.mkdir(parents=True, exist_ok=True)
    source = checkpoint(args.work / "llama")
    if not args.skip_kernels:
        part_kernels(args.rounds, kernels(), "1. Kernels at 1 thread, this model's sizes")
    made = builds(source, args.work)
    print("2. Builds (each in a fresh process)")
    for build in made.values():
        print(f"   {build.name:<14} CPU {build.cpu:5.1f} s, wall {build.wall:5.1f} s, files {build.megabytes:6.1f} MB, "
              f"{build.nodes()}")  # fmt: skip
    print()
    runners = {name: Runner(build.folder) for name, build in made.items()}
    correctness(source, runners)
    result = latency(runners, args.rounds)
    print_latency(
        "4. Latency at 1 thread (thread CPU time; the best round's ms, and the median over interleaved rounds of "
        "opreg / builder in the round)",
        result, [("opreg fp32", "builder fp32"), ("opreg int4", "builder int4")],
    )  # fmt: skip
    if not args.no_ablation:
        ablation(source, args.work, runners, args.rounds)
    genai(made, max(3, args.rounds // 10))
    accuracy(args.work, args.training_steps)


# -- part 7: accuracy on a trained model --------------------------------------------------------

TRAINED = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 512}  # fmt: skip
"""A small Llama trained on text from a random Markov chain: random-init logits are nearly flat (their
argmax says nothing about quantization), a trained model's are not."""


def _chain(rng, vocab: int) -> np.ndarray:
    """Each token's next-token probabilities: four likely successors (0.55, 0.25, 0.1, 0.05), the rest rare."""
    table = np.full((vocab, vocab), 0.05 / (vocab - 4))
    for token in range(vocab):
        table[token, rng.choice(vocab, 4, replace=False)] = (0.55, 0.25, 0.1, 0.05)
    return table / table.sum(1, keepdims=True)


def _text(rng, table: np.ndarray, rows: int, length: int) -> np.ndarray:
    tokens = np.empty((rows, length), np.int64)
    tokens[:, 0] = rng.integers(3, len(table), rows)
    cumulative = table.cumsum(1)
    for step in range(1, length):
        draws = rng.random(rows)[:, None]
        tokens[:, step] = np.minimum((draws > cumulative[tokens[:, step - 1]]).sum(1), len(table) - 1)
    return tokens


def trained_checkpoint(folder: Path, steps: int) -> tuple[Path, np.ndarray]:
    """The small Llama of :data:`TRAINED` after ``steps`` steps of AdamW on the chain's text, saved
    with a word-level tokenizer; and held-out text."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = np.random.default_rng(5)
    table = _chain(rng, TRAINED["vocab_size"])
    held_out = _text(np.random.default_rng(6), table, 16, 128)
    if (folder / "config.json").is_file():
        return folder, held_out
    torch.manual_seed(0)
    config = LlamaConfig(**TRAINED, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = torch.from_numpy(_text(rng, table, 32, 64))
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"   trained {steps} steps: loss {loss.item():.2f} (the chain's entropy is "
          f"{-(table * np.log(table)).sum(1).mean():.2f})")  # fmt: skip
    with _quiet():
        model.eval().save_pretrained(folder)
    vocab = TRAINED["vocab_size"]
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, bos_token="t1", eos_token="t2", pad_token="t0").save_pretrained(
        folder
    )
    return folder, held_out


def accuracy(work: Path, steps: int) -> None:
    """opreg's int4 and int8 against fp32 on the trained model, and the builder's int4 on the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    print("7. Accuracy on a trained model (next-token logits of 16 held-out texts of 128 tokens; greedy 32 tokens "
          "after 8 prompts of 16)")  # fmt: skip
    source, held_out = trained_checkpoint(work / "trained", steps)
    folders = {"builder int4": work / "trained_builder_int4"}  # first: opreg's folders take its genai_config
    shutil.rmtree(folders["builder int4"], ignore_errors=True)
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o",
                    str(folders["builder int4"]), "-p", "int4", "-e", "cpu", "-c", str(work / "cache")],
                   check=True, capture_output=True)  # fmt: skip
    for name, option in (("opreg fp32", []), ("opreg int4", ["--int4"]), ("opreg int8", ["--int8"])):
        folders[name] = work / f"trained_{name.replace(' ', '_')}"
        folders[name].mkdir(parents=True, exist_ok=True)
        shutil.copy(folders["builder int4"] / "genai_config.json", folders[name] / "genai_config.json")
        subprocess.run([sys.executable, __file__, "--export", str(source), str(folders[name]), *option],
                       check=True, capture_output=True)  # fmt: skip
    runners = {name: Runner(folder) for name, folder in folders.items()}
    mask = np.ones_like(held_out)
    logits = {}
    for name, runner in runners.items():
        empty = [(np.zeros((len(held_out), runner.kv_heads, 0, runner.head_size), np.float32),) * 2] * runner.layers
        logits[name] = runner.run(runner.feeds(held_out, mask, empty))[0]
    with torch.no_grad(), _quiet():
        eager = AutoModelForCausalLM.from_pretrained(source).eval()
        logits["eager"] = eager(input_ids=torch.from_numpy(held_out)).logits.numpy()
    reference, spread = logits["opreg fp32"], float(logits["opreg fp32"].std())
    truth = held_out[:, 1:]

    def perplexity(values: np.ndarray) -> float:
        shifted = values[:, :-1] - values[:, :-1].max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        return float(np.exp(-np.take_along_axis(log_probs, truth[..., None], -1).mean()))

    prompts = held_out[:8, :16]
    generated = {name: [runner.greedy(prompt[None], 32) for prompt in prompts] for name, runner in runners.items()}
    fp32_tokens = generated["opreg fp32"]
    print(
        f"   opreg fp32 against eager PyTorch: max abs logit difference {np.abs(reference - logits['eager']).max():.1e}"
    )
    print(f"   {'':<14} {'top-1 = fp32':>13} {'logit error / spread':>21} {'perplexity':>11} {'greedy = fp32':>14}")
    for name in runners:
        agree = float((logits[name].argmax(-1) == reference.argmax(-1)).mean())
        error = float(np.abs(logits[name] - reference).mean()) / spread
        same = np.mean([np.mean(np.array(a) == np.array(b)) for a, b in zip(generated[name], fp32_tokens, strict=True)])
        print(f"   {name:<14} {agree:>12.1%} {error:>21.4f} {perplexity(logits[name]):>11.2f} {same:>13.1%}")
    agree = float((logits["opreg int4"].argmax(-1) == logits["builder int4"].argmax(-1)).mean())
    difference = float(np.abs(logits["opreg int4"] - logits["builder int4"]).mean()) / spread
    print(f"   opreg int4 against builder int4 (same weights, same quantizer): top-1 equal {agree:.1%}, "
          f"mean logit difference / spread {difference:.4f}")  # fmt: skip
    print()


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


if __name__ == "__main__":
    main()
