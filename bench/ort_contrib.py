"""opreg's `onnxruntime` target against torch.onnx and ONNX Runtime's own fusion tools.

Run: python bench/ort_contrib.py [--models bert,gpt2,llama,llama_decode,vit] [--repeat N] [--skip-kernels]

Three parts, all in this one process, so every number is a ratio measured in one run
(the machine is shared: absolute times drift between runs, ratios far less):

1. Kernels: each kernel (or form) the onnxruntime target may emit against what it
   replaces, at the models' sizes, at 1 thread (ratio = baseline / candidate: above 1
   the candidate is faster), after checking both compute the same. What the pack keeps
   and drops follows from these and from the ablation in part 3.
2. Fused ops: for each model, the fused ONNX Runtime ops that onnxscript's
   ``optimize_for_ort`` and ORT's ``onnxruntime.transformers.optimizer`` find in
   torch.onnx's export (opset 18) and in opreg's (target 18 and ``onnx``), side by side.
3. Latency: ONNX Runtime (CPU, default graph optimisations) at 1 thread and at all
   threads for five exports of each model: torch.onnx; torch.onnx + optimize_for_ort;
   opreg target onnx; opreg target onnx + optimize_for_ort; opreg target onnxruntime;
   plus opreg target onnxruntime with each of the pack's rewrite rules that fired left
   out, to show what each is worth. Ratios are to torch.onnx + optimize_for_ort (below
   1 is faster), or to torch.onnx where optimize_for_ort makes an invalid model (GPT-2:
   its MultiHeadAttention fusion replaces a 2-D Reshape by a 3-D output). Sessions are
   timed in interleaved rounds, the best round counting; at 1 thread on the thread's CPU
   clock (see :func:`timings`). Each export is first checked against eager PyTorch.

The models are transformers configs at hidden 256, 4 layers, sequence 128 (random
init, nothing downloaded): BERT, GPT-2 and Llama (GQA: 8 query heads, 2 key/value
heads) with an attention mask and dynamic batch/sequence dims; one Llama decode step
with a static KV cache (transformers' ``TorchExportableModuleWithStaticCache``,
captured once with ``torch.export(strict=True)`` and given to both exporters); and a
ViT (fused-op counts only).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import torch
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FLOAT = TensorProto.FLOAT
HIDDEN, LAYERS, SEQ, VOCAB = 256, 4, 128, 1000
FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "RotaryEmbedding",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "EmbedLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "QuickGelu",
    "GemmFastGelu",
    "FusedMatMul",
    "BiasSplitGelu",
)
"""The com.microsoft ops counted as fused (what ORT's get_fused_operator_statistics lists, and more)."""

# -- models -------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """A model to export: the module (or a captured program), its inputs, what ORT's optimizer calls it."""

    name: str
    model: Any
    kwargs: dict[str, torch.Tensor]
    dynamic_shapes: Any
    ort_type: str
    heads: int
    hidden: int
    eager: Callable[..., Any]
    latency: bool = True
    run_kwargs: dict[str, torch.Tensor] | None = None
    """The inputs latency is measured (and the export checked) with; default ``kwargs``."""

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        return self.kwargs if self.run_kwargs is None else self.run_kwargs


def _text_inputs(batch: int = 1, seq: int = SEQ) -> dict[str, torch.Tensor]:
    """Token ids and an attention mask; with a batch of 2, the first row padded on the right."""
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if batch > 1:
        mask[0, -3:] = 0
    return {"input_ids": torch.randint(1, VOCAB, (batch, seq)), "attention_mask": mask}


def _text_case(name: str, model: Any, ort_type: str, heads: int) -> Case:
    """Exported with a batch of 2 and 16 tokens (dynamic dims), timed with 1 x 128."""
    return Case(name, model, _text_inputs(2, 16), _text_dims(), ort_type, heads, HIDDEN, model, True, _text_inputs())


def _text_dims() -> dict[str, Any]:
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=512)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}


def bert() -> Case:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
        intermediate_size=4 * HIDDEN, max_position_embeddings=512,
    )  # fmt: skip
    model = BertModel(config).eval()
    return _text_case("bert", model, "bert", 4)


def gpt2() -> Case:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4, n_positions=512, use_cache=False,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    return _text_case("gpt2", model, "gpt2", 4)


def _llama_config(**extra: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=688, num_hidden_layers=LAYERS,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512, **extra,
    )  # fmt: skip


def llama() -> Case:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_llama_config(use_cache=False)).eval()
    return _text_case("llama", model, "gpt2", 8)


def llama_decode(cache: int = 256, position: int = SEQ) -> Case:
    """One decode step of a Llama with a static KV cache of ``cache`` slots, at ``position``."""
    from transformers import GenerationConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    torch.manual_seed(0)
    model = LlamaForCausalLM(_llama_config()).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": cache}
    )
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=cache).eval()
    kwargs = {"input_ids": torch.tensor([[7]]), "cache_position": torch.tensor([position])}
    # torch.export's non-strict capture of the static cache cannot be decomposed (torch 2.13); strict can
    program = torch.export.export(wrapper, (), kwargs, strict=True)
    return Case("llama_decode", program, kwargs, None, "gpt2", 8, HIDDEN, program.module())


def vit() -> Case:
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=64, patch_size=8, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
        intermediate_size=4 * HIDDEN,
    )  # fmt: skip
    model = ViTModel(config).eval()
    dims = {"pixel_values": {0: torch.export.Dim("batch", max=64)}}
    return Case("vit", model, {"pixel_values": torch.randn(2, 3, 64, 64)}, dims, "vit", 4, HIDDEN, model, False)


MODELS: dict[str, Callable[[], Case]] = {
    "bert": bert,
    "gpt2": gpt2,
    "llama": llama,
    "llama_decode": llama_decode,
    "vit": vit,
}

# -- exports -----------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet():
    """torch.onnx and the fusion tools print and warn a lot; keep the tables readable."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


def torch_onnx(case: Case, opset: int = 18) -> onnx.ModelProto:
    with _quiet():
        program = torch.onnx.export(
            case.model, (), kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes, dynamo=True, opset_version=opset
        )
    return program.model_proto


def opreg_export(case: Case, target: Any, **options: Any) -> onnx.ModelProto:
    import opreg

    # llama_decode's static cache is state: timed as torch.onnx exports it, reading the cache it
    # was exported with (opreg.llm.export_decoder makes the cache inputs and outputs)
    options.setdefault("state", "drop")
    with _quiet():
        program = opreg.export(
            case.model, (), case.kwargs, target=target, dynamic_shapes=case.dynamic_shapes, **options
        )
    return program.model_proto


def optimize_for_ort(proto: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort as fuse

    with _quiet():
        model, _ = fuse(ir.serde.deserialize_model(onnx.ModelProto.FromString(proto.SerializeToString())))
    return ir.serde.serialize_model(model)


def ort_optimizer(proto: onnx.ModelProto, case: Case) -> onnx.ModelProto | str:
    """ORT's onnxruntime.transformers.optimizer on ``proto`` (given as a file: as a
    ModelProto it moves every initializer out, which breaks its shape inference)."""
    from onnxruntime.transformers import optimizer

    with tempfile.TemporaryDirectory() as folder, _quiet():
        path = os.path.join(folder, "model.onnx")
        onnx.save(proto, path)
        try:
            optimized = optimizer.optimize_model(
                path, model_type=case.ort_type, num_heads=case.heads, hidden_size=case.hidden
            )
        except Exception as e:
            return f"fails: {type(e).__name__}: {str(e)[:60]}"
    return optimized.model


def fused_counts(proto: onnx.ModelProto | str) -> dict[str, int] | str:
    if isinstance(proto, str):
        return proto
    counts = collections.Counter(n.op_type for n in proto.graph.node if n.domain == "com.microsoft")
    return {op: counts[op] for op in FUSED_OPS if counts[op]}


def _counts_text(counts: dict[str, int] | str) -> str:
    if isinstance(counts, str):
        return counts
    short = {"SkipLayerNormalization": "SkipLN", "SkipSimplifiedLayerNormalization": "SkipSLN",
             "SimplifiedLayerNormalization": "SLN", "MultiHeadAttention": "MHA", "GroupQueryAttention": "GQA",
             "RotaryEmbedding": "Rotary", "EmbedLayerNormalization": "EmbedLN"}  # fmt: skip
    return " ".join(f"{short.get(op, op)}={n}" for op, n in counts.items()) or "-"


# -- running -----------------------------------------------------------------------------------


def session(proto: onnx.ModelProto, threads: int) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def feeds(proto: onnx.ModelProto, case: Case) -> dict[str, np.ndarray]:
    names = [i.name for i in proto.graph.input]
    values = [v.numpy() for v in case.inputs.values()]
    return dict(zip(names, values, strict=True))


def check(proto: onnx.ModelProto, case: Case, atol: float = 1e-3) -> float:
    """Max abs difference of the first output from eager PyTorch; raises beyond ``atol``."""
    with torch.no_grad():
        expected = torch.utils._pytree.tree_leaves(case.eager(**case.inputs))[0]
    got = session(proto, 1).run(None, feeds(proto, case))[0]
    diff = float(np.abs(got - expected.numpy()).max())
    if not diff <= atol:
        raise AssertionError(f"{case.name}: output differs from eager PyTorch by {diff:.3g}")
    return diff


def timings(
    sessions: dict[str, onnxruntime.InferenceSession], inputs: dict[str, dict], rounds: int, runs: int, threads: int = 1
):
    """Seconds per run of each session: the best of ``rounds`` interleaved rounds of ``runs`` runs
    (every round runs every session once), so each session meets the same load from other
    processes, and the least disturbed round speaks for it.

    At 1 thread ONNX Runtime runs every kernel on the calling thread, and the clock is that
    thread's CPU time: time other processes take from this core is not counted, which keeps
    the ratios steady on a shared machine. With more threads the kernels run on a pool, and
    the clock is the wall clock (read those numbers with the machine's load in mind)."""
    return {name: min(values) for name, values in round_times(sessions, inputs, rounds, runs, threads).items()}


def round_times(
    sessions: dict[str, onnxruntime.InferenceSession], inputs: dict[str, dict], rounds: int, runs: int, threads: int = 1
) -> dict[str, list[float]]:
    """Seconds per run of each session in each of ``rounds`` interleaved rounds (see :func:`timings`);
    each round starts with the next session, so none always runs right after the same other."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    for name, s in sessions.items():
        for _ in range(3):
            s.run(None, inputs[name])
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    names = list(sessions)
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:  # each round starts elsewhere
            s = sessions[name]
            start = clock()
            for _ in range(runs):
                s.run(None, inputs[name])
            samples[name].append((clock() - start) / runs)
    return samples


# -- part 1: kernels ----------------------------------------------------------------------------


def _model(nodes, inputs, outputs, initializers=None, onnx_opset: int = 23) -> onnx.ModelProto:
    """A one-purpose model: ``inputs``/``outputs`` map names to float32 shapes, ``initializers``
    names to arrays; nodes are ``(op, inputs, outputs, attributes)`` (``ms.Op`` for com.microsoft)."""
    made = []
    for op, ins, outs, attrs in nodes:
        domain, _, name = op.rpartition(".")
        made.append(helper.make_node(name, ins, outs, domain="com.microsoft" if domain == "ms" else "", **attrs))
    dtype = {np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}
    graph = helper.make_graph(
        made, "kernel",
        [helper.make_tensor_value_info(n, dtype.get(np.dtype(getattr(s, "dtype", "f")), FLOAT), getattr(s, "shape", s))
         for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, FLOAT, s) for n, s in outputs.items()],
        initializer=[onnx.numpy_helper.from_array(a, n) for n, a in (initializers or {}).items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", onnx_opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


@dataclasses.dataclass
class Kernel:
    """A contrib kernel (or form) ``candidate`` against the ``baseline`` it replaces, on ``feeds``."""

    name: str
    baseline: onnx.ModelProto
    candidate: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    decision: str
    compare: bool = True
    """Check first that both forms give the same first output (not for forms whose outputs differ in layout)."""


def kernels(seq: int = SEQ):
    """Every kernel decision of the onnxruntime target, at the benchmark's model sizes."""
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    h, inner, heads, kv_heads = HIDDEN, 4 * HIDDEN, 8, 2
    size = h // heads
    x, wide = rand(1, seq, h), rand(1, seq, inner)
    wide_io = ({"x": wide.shape}, {"y": wide.shape})
    io = ({"x": x.shape, "skip": x.shape}, {"y": x.shape})
    gamma, beta, bias = np.ones(h, np.float32), np.zeros(h, np.float32), rand(inner)
    tanh_gelu = [
        ("Pow", ["x", "three"], ["p"], {}), ("Mul", ["p", "k"], ["pk"], {}), ("Add", ["x", "pk"], ["a"], {}),
        ("Mul", ["a", "c"], ["ac"], {}), ("Tanh", ["ac"], ["t"], {}), ("Add", ["t", "one"], ["t1"], {}),
        ("Mul", ["x", "half"], ["xh"], {}), ("Mul", ["xh", "t1"], ["y"], {}),
    ]  # fmt: skip
    tanh_values = (("three", 3.0), ("k", 0.044715), ("c", math.sqrt(2 / math.pi)), ("one", 1.0), ("half", 0.5))
    tanh_constants = {n: np.array(v, np.float32) for n, v in tanh_values}
    yield Kernel(
        "Gelu: com.microsoft vs ai.onnx Gelu-20",
        _model([("Gelu", ["x"], ["y"], {})], *wide_io), _model([("ms.Gelu", ["x"], ["y"], {})], *wide_io),
        {"x": wide}, "kept (at par)",
    )  # fmt: skip
    yield Kernel(
        "FastGelu vs the tanh formula",
        _model(tanh_gelu, *wide_io, tanh_constants), _model([("ms.FastGelu", ["x"], ["y"], {})], *wide_io),
        {"x": wide}, "kept",
    )  # fmt: skip
    yield Kernel(
        "BiasGelu vs Add + Gelu",
        _model([("Add", ["x", "b"], ["s"], {}), ("ms.Gelu", ["s"], ["y"], {})], *wide_io, {"b": bias}),
        _model([("ms.BiasGelu", ["x", "b"], ["y"], {})], *wide_io, {"b": bias}),
        {"x": wide}, "kept (at par: ORT fuses the pair the same way)",
    )  # fmt: skip
    yield Kernel(
        "QuickGelu vs x * Sigmoid(x) (SiLU)",
        _model([("Sigmoid", ["x"], ["s"], {}), ("Mul", ["x", "s"], ["y"], {})], *wide_io),
        _model([("ms.QuickGelu", ["x"], ["y"], {"alpha": 1.0})], *wide_io),
        {"x": wide}, "kept (at par: ORT fuses the pair the same way)",
    )  # fmt: skip
    skip_feeds = {"x": x, "skip": rand(1, seq, h)}
    norm = {"gamma": gamma, "beta": beta}
    unfused_ln = [("Sum", ["x", "skip"], ["s"], {}), ("LayerNormalization", ["s", "gamma", "beta"], ["y"], {})]
    yield Kernel(
        "Sum + LayerNormalization vs SkipLayerNormalization",
        _model([("ms.SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"], {})], *io, norm),
        _model(unfused_ln, *io, norm),
        skip_feeds, "SkipLayerNormalization dropped; the exporter's ResidualSums keeps ORT from making it",
    )  # fmt: skip
    yield Kernel(
        "Sum + LayerNormalization vs Add + LayerNormalization",
        _model(
            [("Add", ["x", "skip"], ["s"], {}), ("LayerNormalization", ["s", "gamma", "beta"], ["y"], {})], *io, norm
        ),
        _model(unfused_ln, *io, norm),
        skip_feeds, "ResidualSums kept: ORT turns Add + LayerNormalization into SkipLayerNormalization",
    )  # fmt: skip
    rms = [("Add", ["x", "skip"], ["s"], {}), ("RMSNormalization", ["s", "gamma"], ["y"], {"epsilon": 1e-6})]
    yield Kernel(
        "Add + RMSNormalization-23 vs SkipSimplifiedLayerNormalization",
        _model([("ms.SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y"], {"epsilon": 1e-6})], *io,
               {"gamma": gamma}),
        _model(rms, *io, {"gamma": gamma}),
        skip_feeds, "RMSNormalization-23 kept, SkipSimplifiedLayerNormalization dropped",
    )  # fmt: skip
    decomposed_rms = [
        ("Pow", ["x", "two"], ["p"], {}), ("ReduceMean", ["p", "axes"], ["m"], {}), ("Add", ["m", "eps"], ["e"], {}),
        ("Sqrt", ["e"], ["r"], {}), ("Reciprocal", ["r"], ["ir"], {}), ("Mul", ["x", "ir"], ["n"], {}),
        ("Mul", ["gamma", "n"], ["y"], {}),
    ]  # fmt: skip
    rms_constants = {"two": np.array(2.0, np.float32), "axes": np.array([-1]), "eps": np.array(1e-6, np.float32),
                     "gamma": gamma}  # fmt: skip
    one_io = ({"x": x.shape}, {"y": x.shape})
    yield Kernel(
        "RMSNormalization-23 vs its decomposition",
        _model(decomposed_rms, *one_io, rms_constants),
        _model([("RMSNormalization", ["x", "gamma"], ["y"], {"epsilon": 1e-6})], *one_io, {"gamma": gamma}),
        {"x": x}, "kept",
    )  # fmt: skip
    yield Kernel(
        "RMSNormalization-23 vs com.microsoft SimplifiedLayerNormalization",
        _model([("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], {"epsilon": 1e-6})], *one_io, {"gamma": gamma}),
        _model([("RMSNormalization", ["x", "gamma"], ["y"], {"epsilon": 1e-6})], *one_io, {"gamma": gamma}),
        {"x": x}, "RMSNormalization-23 (standard) chosen",
    )  # fmt: skip
    yield from _rotary_kernels(rng, seq, heads, size)
    weight = rand(h, h)
    for rows in (seq, 1):
        a = rand(1, rows, h)
        linear_io = ({"x": a.shape}, {"y": [1, rows, h]})
        yield Kernel(
            f"FusedMatMul(x, W, transB) vs MatMul(x, Transpose(W)), {rows} row(s)",
            _model([("Transpose", ["w"], ["wt"], {"perm": [1, 0]}), ("MatMul", ["x", "wt"], ["y"], {})], *linear_io,
                   {"w": weight}),
            _model([("ms.FusedMatMul", ["x", "w"], ["y"], {"transB": 1})], *linear_io, {"w": weight}),
            {"x": a}, "kept (at par; the weight keeps its name and layout)",
        )  # fmt: skip
    yield from _attention_kernels(rng, seq, heads, kv_heads, size)
    yield _packed_attention_kernel(rng, 16, 2, 16, batch=2)  # bench/optimum_compare.py's tiny BERTs
    yield _packed_attention_kernel(rng, 128, 12, 64)  # BERT-base


def _rotary_kernels(rng, seq, heads, size):
    h, half = heads * size, size // 2
    x = rng.standard_normal((1, seq, h), dtype=np.float32)
    freqs = rng.standard_normal((1, seq, half), dtype=np.float32)
    cos, sin = np.cos(freqs), np.sin(freqs)
    full_cos, full_sin = np.concatenate([cos, cos], -1)[:, None], np.concatenate([sin, sin], -1)[:, None]
    shape4 = np.array([1, seq, heads, size])
    decomposed = [
        ("Reshape", ["x", "shape4"], ["x4"], {}), ("Transpose", ["x4"], ["xh"], {"perm": [0, 2, 1, 3]}),
        ("Mul", ["xh", "cos4"], ["a"], {}), ("Slice", ["xh", "zero", "half", "last"], ["x1"], {}),
        ("Slice", ["xh", "half", "end", "last"], ["x2"], {}), ("Neg", ["x2"], ["nx2"], {}),
        ("Concat", ["nx2", "x1"], ["r"], {"axis": -1}), ("Mul", ["r", "sin4"], ["b"], {}),
        ("Add", ["a", "b"], ["y4"], {}),
        ("Transpose", ["y4"], ["yt"], {"perm": [0, 2, 1, 3]}), ("Reshape", ["yt", "shape3"], ["y"], {}),
    ]  # fmt: skip
    constants = {
        "shape4": shape4, "shape3": np.array([1, seq, h]), "cos4": full_cos, "sin4": full_sin,
        "zero": np.array([0]), "half": np.array([half]), "end": np.array([size]), "last": np.array([-1]),
    }  # fmt: skip
    io = ({"x": x.shape}, {"y": x.shape})
    standard = _model([("RotaryEmbedding", ["x", "cos", "sin"], ["y"], {"num_heads": heads})], *io,
                      {"cos": cos, "sin": sin})  # fmt: skip
    yield Kernel(
        "RotaryEmbedding-23 vs rotate_half decomposition", _model(decomposed, *io, constants), standard, {"x": x},
        "RotaryEmbedding-23 kept",
    )  # fmt: skip
    contrib = _model(
        [("ms.RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], {"num_heads": heads})],
        {"x": x.shape, "pos": np.zeros((1, seq), np.int64)}, {"y": x.shape}, {"cos": cos[0], "sin": sin[0]},
    )  # fmt: skip
    yield Kernel(
        "com.microsoft RotaryEmbedding vs RotaryEmbedding-23", standard, contrib,
        {"x": x, "pos": np.arange(seq, dtype=np.int64)[None]},
        "RotaryEmbedding-23 chosen: the contrib op needs position ids and a precomputed cache",
    )  # fmt: skip


def _packed_attention_kernel(rng, seq, heads, size, batch=1):
    """PackedAttention: com.microsoft Attention on the input and the packed weights (a Concat of the
    stored ones, which ONNX Runtime folds at load) against three MatMul + Add and MultiHeadAttention."""
    h = heads * size
    x = rng.standard_normal((batch, seq, h), dtype=np.float32)
    bias = np.zeros((batch, 1, seq, seq), np.float32)
    weights = {f"w{n}": rng.standard_normal((h, h), dtype=np.float32) / h**0.5 for n in "qkv"}
    weights |= {f"b{n}": rng.standard_normal(h, dtype=np.float32) for n in "qkv"}
    io = ({"x": x.shape, "bias": bias.shape}, {"y": x.shape})
    projections = [node for n in "qkv" for node in (("MatMul", ["x", f"w{n}"], [f"{n}0"], {}),
                                                     ("Add", [f"{n}0", f"b{n}"], [n], {}))]  # fmt: skip
    mha = [*projections, ("ms.MultiHeadAttention", ["q", "k", "v", "", "", "bias"], ["y"], {"num_heads": heads})]
    packed = [
        ("Concat", ["wq", "wk", "wv"], ["w"], {"axis": 1}), ("Concat", ["bq", "bk", "bv"], ["b"], {"axis": 0}),
        ("ms.Attention", ["x", "w", "b", "", "", "bias"], ["y"], {"num_heads": heads}),
    ]  # fmt: skip
    return Kernel(
        f"Attention (q, k, v packed) vs 3 x (MatMul + Add) + MultiHeadAttention, batch {batch}, seq {seq}, hidden {h}",
        _model(mha, *io, weights),
        _model(packed, *io, weights),
        {"x": x, "bias": bias},
        "PackedAttention kept",
    )


def _attention_kernels(rng, seq, heads, kv_heads, size):
    h, kv = heads * size, kv_heads * size
    q, k, v = (rng.standard_normal((1, seq, n), dtype=np.float32) for n in (h, h, h))
    bias = np.zeros((1, 1, seq, seq), np.float32)
    feeds = {"q": q, "k": k, "v": v, "bias": bias}
    io = ({"q": q.shape, "k": k.shape, "v": v.shape, "bias": bias.shape}, {"y": q.shape})
    mha_node = ("ms.MultiHeadAttention", ["q", "k", "v", "", "", "bias"], ["y"], {"num_heads": heads})
    mha = _model([mha_node], *io)
    shapes = {
        "s4": np.array([1, seq, heads, size]),
        "s3": np.array([1, seq, h]),
        "scale": np.array(size**-0.5, np.float32),
    }

    def split(name):
        return [
            ("Reshape", [name, "s4"], [f"{name}4"], {}),
            ("Transpose", [f"{name}4"], [f"{name}h"], {"perm": [0, 2, 1, 3]}),
        ]

    merge = [("Transpose", ["o"], ["ot"], {"perm": [0, 2, 1, 3]}), ("Reshape", ["ot", "s3"], ["y"], {})]
    decomposed = [
        *split("q"), *split("k"), *split("v"), ("Transpose", ["kh"], ["kt"], {"perm": [0, 1, 3, 2]}),
        ("MatMul", ["qh", "kt"], ["sc"], {}), ("Mul", ["sc", "scale"], ["ss"], {}), ("Add", ["ss", "bias"], ["sb"], {}),
        ("Softmax", ["sb"], ["p"], {"axis": -1}), ("MatMul", ["p", "vh"], ["o"], {}), *merge,
    ]  # fmt: skip
    yield Kernel(
        "MultiHeadAttention vs MatMul/Softmax", _model(decomposed, *io, shapes), mha, feeds,
        "see the ablation (the kernel also saves the model's head split and merge)",
    )  # fmt: skip
    attention = [("Attention", ["q", "k", "v", "bias"], ["y"], {"q_num_heads": heads, "kv_num_heads": heads})]
    yield Kernel(
        "Attention-23 (3-D) vs MultiHeadAttention", mha, _model(attention, *io), feeds,
        "Attention-23 at ai.onnx 23-24",
    )  # fmt: skip
    yield Kernel(
        "MultiHeadAttention vs Attention at ai.onnx 27 (its function body)", _model(attention, *io, onnx_opset=27),
        _model([mha_node], *io, onnx_opset=27),
        feeds, "MultiHeadAttention at ai.onnx 25+ (the onnxruntime profile)",
    )  # fmt: skip
    yield _packed_attention_kernel(rng, seq, heads, size)
    kk, vv = (rng.standard_normal((1, seq, kv), dtype=np.float32) for _ in range(2))
    gqa_io = ({"q": q.shape, "k": kk.shape, "v": vv.shape, "bias": bias.shape}, {"y": q.shape})
    repeat = {"s5": np.array([1, kv_heads, heads // kv_heads, seq, size]), "sk": np.array([1, seq, kv_heads, size]),
              "sr": np.array([1, heads, seq, size]), "two": np.array([2]), "bsd": np.array([0, 0, -1])}  # fmt: skip

    def repeated(name):
        return [
            ("Reshape", [name, "sk"], [f"{name}4"], {}),
            ("Transpose", [f"{name}4"], [f"{name}h"], {"perm": [0, 2, 1, 3]}),
            ("Unsqueeze", [f"{name}h", "two"], [f"{name}u"], {}), ("Expand", [f"{name}u", "s5"], [f"{name}e"], {}),
            ("Reshape", [f"{name}e", "sr"], [f"{name}r"], {}),
            ("Transpose", [f"{name}r"], [f"{name}t"], {"perm": [0, 2, 1, 3]}),
            ("Reshape", [f"{name}t", "bsd"], [f"{name}3"], {}),
        ]  # fmt: skip

    repeated_node = ("ms.MultiHeadAttention", ["q", "k3", "v3", "", "", "bias"], ["y"], {"num_heads": heads})
    repeated_mha = [*repeated("k"), *repeated("v"), repeated_node]
    gqa = [("ms.GroupQueryAttention", ["q", "k", "v", "", "", "lens", "total", "", "", "", "bias"], ["y"],
            {"num_heads": heads, "kv_num_heads": kv_heads, "causal": 0})]  # fmt: skip
    lens = {"lens": np.full(1, seq - 1, np.int32), "total": np.array(seq, np.int32)}
    yield Kernel(
        f"GroupQueryAttention vs MultiHeadAttention on repeated heads ({heads}/{kv_heads})",
        _model(repeated_mha, *gqa_io, repeat), _model(gqa, *gqa_io, lens),
        {"q": q, "k": kk, "v": vv, "bias": bias}, "kept",
    )  # fmt: skip
    cache = 2 * seq
    kc, vc = (rng.standard_normal((1, heads, cache, size), dtype=np.float32) for _ in range(2))
    q1, mask1 = q[:, :1], np.zeros((1, 1, 1, cache), np.float32)
    cache_io = ({"q": q1.shape, "k": kc.shape, "v": vc.shape, "bias": mask1.shape}, {"y": q1.shape})
    moved = [("Transpose", ["k"], ["kt"], {"perm": [0, 2, 1, 3]}), ("Reshape", ["kt", "bsd"], ["k3"], {}),
             ("Transpose", ["v"], ["vt"], {"perm": [0, 2, 1, 3]}), ("Reshape", ["vt", "bsd"], ["v3"], {}),
             ("ms.MultiHeadAttention", ["q", "k3", "v3", "", "", "bias"], ["y"], {"num_heads": heads})]  # fmt: skip
    yield Kernel(
        f"MultiHeadAttention on a 4-D cache vs on the cache moved to 3-D (1 query, {cache} keys)",
        _model(moved, *cache_io, {"bsd": np.array([0, 0, -1])}),
        _model([("ms.MultiHeadAttention", ["q", "k", "v", "", "", "bias"], ["y"], {"num_heads": heads})], *cache_io),
        {"q": q1, "k": kc, "v": vc, "bias": mask1}, "kept (MultiHeadAttentionOnHeads)",
    )  # fmt: skip


def part_kernels(repeat: int, found=None, title: str = "1. Kernels at 1 thread, the model sizes") -> None:
    """Time each of ``found`` (default :func:`kernels`) and print its ratio and decision."""
    print(f"{title}: ratio = baseline / candidate (above 1: the candidate is faster)")
    rows = []
    for kernel in kernels() if found is None else found:
        sessions = {"baseline": session(kernel.baseline, 1), "candidate": session(kernel.candidate, 1)}
        inputs = {
            name: {i.name: kernel.feeds[i.name] for i in s.get_inputs()} for name, s in sessions.items()
        }  # each form takes the feeds it has inputs for
        outputs = [s.run(None, inputs[name])[0] for name, s in sessions.items()]
        if kernel.compare and not np.allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{kernel.name}: the two forms differ by {np.abs(outputs[0] - outputs[1]).max()}")
        t = timings(sessions, inputs, repeat, 20)
        rows.append((kernel.name, t["baseline"] / t["candidate"], kernel.decision))
    width = max(len(r[0]) for r in rows)
    for name, ratio, decision in rows:
        print(f"   {name:<{width}} {ratio:>5.2f}x  {decision}")
    print()


# -- parts 2 and 3: models ------------------------------------------------------------------------

STANDARD_FUSED = ("Attention", "RMSNormalization", "RotaryEmbedding", "LayerNormalization", "Gelu")
"""ai.onnx ops that are fused kernels in ONNX Runtime (counted for opreg's onnxruntime export)."""


def _fired(proto: onnx.ModelProto) -> list[str]:
    """The rewrite rules that fired in an opreg export (its ``opreg.rewrites`` metadata)."""
    fired = {p.key: p.value for p in proto.metadata_props}.get("opreg.rewrites", "")
    return [item.split("=")[0].split(":", 1)[1] for item in fired.split(",") if item]


def without(case: Case, left_out: set[str]) -> onnx.ModelProto:
    """opreg's onnxruntime export with the rewrite rules ``left_out`` (the others applied as
    the exporter does: after the lean pass, then the lean pass again)."""
    import onnx_ir as ir

    import opreg
    from opreg.exporter import _rewrite
    from opreg.exporter.passes import lean

    registry = opreg.default_registry()
    target = registry.target("onnxruntime")
    with _quiet():
        program = opreg.export(
            case.model, (), case.kwargs, target=target, dynamic_shapes=case.dynamic_shapes, rewrite=False
        )
    rewrites = _rewrite.collect(opreg.default_host().call(_rewrite.HOOK, target=target))
    weights = frozenset(program.model.graph.initializers)
    _rewrite.apply(program.model, [r for r in rewrites if not left_out & set(r.names)], target)
    lean.lean(program.model, weights)
    return ir.serde.serialize_model(program.model)


def part_models(cases: dict[str, Case], repeat: int, ablate: bool) -> None:
    threads = os.cpu_count() or 1
    print("2. Fused ops each tool finds (optimize_for_ort | ORT's transformers optimizer)")
    rows = []
    latency_rows = []
    for name, case in cases.items():
        torch18 = torch_onnx(case)
        exports = {"torch.onnx": torch18, "torch.onnx + optimize_for_ort": optimize_for_ort(torch18)}
        opreg18 = opreg_export(case, 18)
        opreg_onnx = opreg_export(case, "onnx")
        exports["opreg onnx"] = opreg_onnx
        exports["opreg onnx + optimize_for_ort"] = optimize_for_ort(opreg_onnx)
        exports["opreg onnxruntime"] = ours = opreg_export(case, "onnxruntime")
        for label, proto in (("torch.onnx 18", torch18), ("opreg 18", opreg18), ("opreg onnx", opreg_onnx)):
            ofo = fused_counts(optimize_for_ort(proto))
            ort = fused_counts(ort_optimizer(proto, case))
            rows.append((name, label, _counts_text(ofo), _counts_text(ort)))
        standard = collections.Counter(
            n.op_type for n in ours.graph.node if not n.domain and n.op_type in STANDARD_FUSED
        )
        emitted = _counts_text(fused_counts(ours)) + " + ai.onnx " + " ".join(f"{k}={v}" for k, v in standard.items())
        rows.append((name, "opreg onnxruntime", emitted, "(emitted by opreg)"))
        if not case.latency:
            continue
        if ablate:
            for rule in _fired(ours):
                exports[f"  without {rule}"] = without(case, {rule})
        diffs: dict[str, float | str] = {}
        for label, proto in list(exports.items()):
            try:
                diffs[label] = check(proto, case)
            except Exception as e:  # optimize_for_ort breaks some models (see the docstring)
                diffs[label] = f"{type(e).__name__}: {str(e).splitlines()[0][:110]}"
                del exports[label]
        latency_rows.append((case, exports, diffs))
    width = max(len(r[1]) for r in rows)
    for name, label, ofo, ort in rows:
        print(f"   {name:<13} {label:<{width}}  {ofo:<62} | {ort}")
    print()
    print("3. Latency, ratio to torch.onnx + optimize_for_ort (torch.onnx where that is invalid); below 1 is faster.")
    print(f"   1 thread (thread CPU time) | {threads} threads (wall clock)")
    for case, exports, diffs in latency_rows:
        result = {}
        for count in (1, threads):
            sessions = {label: session(proto, count) for label, proto in exports.items()}
            inputs = {label: feeds(proto, case) for label, proto in exports.items()}
            result[count] = timings(sessions, inputs, repeat, 5, count)
        base = "torch.onnx + optimize_for_ort" if "torch.onnx + optimize_for_ort" in exports else "torch.onnx"
        print(f"   {case.name}: ratios to {base} ({result[1][base] * 1e3:.2f} ms at 1 thread, "
              f"{result[threads][base] * 1e3:.2f} ms at {threads})")  # fmt: skip
        for label, diff in diffs.items():
            if isinstance(diff, str):
                print(f"     {label:<40} invalid model: {diff}")
                continue
            one, many = result[1][label] / result[1][base], result[threads][label] / result[threads][base]
            print(f"     {label:<40} {one:>5.2f}x | {many:>5.2f}x   (max abs diff from eager {diff:.1e})")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,gpt2,llama,llama_decode,vit")
    parser.add_argument("--repeat", type=int, default=15, help="timing rounds")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--no-ablation", action="store_true", help="do not time exports without each rule that fired")
    args = parser.parse_args()
    import opreg

    print(f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, opreg onnxruntime target = "
          f"{opreg.default_registry().target('onnxruntime')}, CPU x{os.cpu_count()}\n")  # fmt: skip
    if not args.skip_kernels:
        part_kernels(args.repeat)
    cases = {name: MODELS[name]() for name in (n.strip() for n in args.models.split(",")) if name}
    part_models(cases, args.repeat, not args.no_ablation)


if __name__ == "__main__":
    main()
