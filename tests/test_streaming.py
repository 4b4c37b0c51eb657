"""Models larger than memory: a ``meta``-device model exported with ``weights=`` (a checkpoint)
reads no weight while it is captured and translated, and streams each one from the checkpoint,
transformed, into the file as it is written; the file is the in-memory export's, byte for byte.

Tiny models and checkpoints written here (seconds); the sizes that matter are measured by
``python bench/big_model.py --streaming``.
"""

from __future__ import annotations

import errno
import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import safetensors.torch
import torch

import opreg
from opreg import weights as lazy_weights
from tests import language_models as lm

FRESH_ENV = "OPREG_TEST_IN_FRESH_PROCESS"


@pytest.fixture
def fresh_process(request) -> bool:
    """Whether to run the test's body here: no, once the test has run alone in a fresh interpreter
    (its failure there fails the test here). Under pytest-xdist these tests have failed after some
    other test in the same worker (a dtype mismatch not reported, a streamed model's bytes differing
    from the in-memory one's) and never alone: until the leaking state is found, they run where
    nothing ran before them."""
    if os.environ.get(FRESH_ENV):
        return True  # this is the fresh process: run the body
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", request.node.nodeid],
        cwd=root, env={**os.environ, FRESH_ENV: "1"}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return False  # it ran, and passed, there


class Block(torch.nn.Module):
    """Two linear layers on a 3-D input (each weight read through a Transpose: folded) and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) * self.scale


def make_block(seed: int = 0) -> Block:
    torch.manual_seed(seed)
    return Block().eval()


def meta_block() -> Block:
    with torch.device("meta"):
        return Block().eval()


def example() -> torch.Tensor:
    return torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "block.safetensors"
    safetensors.torch.save_file(make_block().state_dict(), path)
    return path


def saved_bytes(program, path, external_data):
    """The saved model's bytes (and its data file's, if any), the data file's random name left out."""
    program.save(path, external_data=external_data)
    data = sorted(path.parent.glob(f"{path.name}.*.data"))
    return (path.read_bytes().replace(data[0].name.encode(), b"DATA") if data else path.read_bytes()), [
        d.read_bytes() for d in data
    ]


@pytest.mark.parametrize("external_data", [False, True])
def test_a_meta_model_with_a_checkpoint_saves_the_in_memory_export_byte_for_byte(
    checkpoint, tmp_path, external_data, fresh_process
):
    if not fresh_process:
        return
    in_memory = opreg.export(make_block(), (example(),))
    streamed = opreg.export(meta_block(), (example(),), weights=checkpoint)
    assert {type(v.const_value) for v in streamed.model.graph.initializers.values()} == {lazy_weights.LazyWeight}
    a = saved_bytes(in_memory, tmp_path / "a.onnx", external_data)
    b = saved_bytes(streamed, tmp_path / "b.onnx", external_data)
    assert a == b
    torch.testing.assert_close(streamed.run(example()), make_block()(example()), rtol=1e-5, atol=1e-6)
    with pytest.raises(opreg.InvalidArgumentError, match="weights are on the meta device"):
        streamed.verify(example())


def test_opreg_export_takes_a_meta_model_and_its_checkpoint(checkpoint, tmp_path, capsys):
    import onnxruntime

    from tests.test_cli import run

    factory = tmp_path / "meta_block.py"
    factory.write_text(
        "import torch\n"
        "from tests.test_streaming import example, meta_block\n\n\n"
        "def make():\n"
        "    return meta_block(), (example(),)\n"
    )
    out = tmp_path / "block.onnx"
    code, _, err = run(capsys, "export", f"{factory}:make", "-o", str(out), "--weights", str(checkpoint))
    assert code == 0, err
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": example().numpy()})
    torch.testing.assert_close(torch.from_numpy(got), make_block()(example()), rtol=1e-5, atol=1e-6)
    code, _, err = run(capsys, "export", f"{factory}:make", "-o", str(tmp_path / "none.onnx"))
    assert code != 0 and "on the meta device" in err and "pass weights=" in err


def counted(source):
    """``source``'s tensors as lazy weights that count the rows they are asked for."""
    reads = {}

    def rows_of(name, tensor):
        def read(start, stop):
            reads[name] = reads.get(name, 0) + (stop - start)
            return tensor[start:stop] if tensor.dim() else tensor

        return read

    tensors = {
        name: lazy_weights.LazyWeight(rows_of(name, t), t.dtype, t.shape, name=name, how="counted")
        for name, t in source.items()
    }
    return tensors, reads


def test_capture_and_translation_read_no_weight_and_the_save_reads_each_once(tmp_path):
    """Only tensors of at most SMALL_CONSTANT elements are read before the save (shape inference and
    the translation memo take such constants as data, in memory too); each larger one is read once,
    when it is written."""
    from opreg.exporter._recorder import SMALL_CONSTANT

    state = make_block().state_dict()
    tensors, reads = counted(state)
    program = opreg.export(meta_block(), (example(),), weights=tensors)
    small = {name for name, t in state.items() if t.numel() <= SMALL_CONSTANT}
    assert small == {"up.bias", "down.bias", "scale"} and set(reads) <= small
    reads.clear()
    program.save(tmp_path / "m.onnx", external_data=True)
    assert reads == {name: t.shape[0] for name, t in state.items() if name not in small}


def test_a_checkpoint_that_does_not_fit_fails_before_anything_is_written_naming_each_tensor(tmp_path, fresh_process):
    if not fresh_process:
        return
    state = make_block().state_dict()
    broken = {**state, "up.weight": state["up.weight"][:, :8], "scale": state["scale"].long()}
    del broken["down.bias"]
    out = tmp_path / "out"
    with pytest.raises(opreg.WeightsError) as caught:
        opreg.export(meta_block(), (example(),), weights=broken).save(out / "m.onnx")
    message = str(caught.value)
    assert "up.weight: the checkpoint has shape [32, 8], the model [32, 16]" in message
    assert "down.bias: missing from the checkpoint (float32 [8])" in message
    assert "scale: the checkpoint has int64 [8], the model float32 [8]" in message
    assert len(caught.value.problems) == 3
    with pytest.raises(opreg.WeightsError, match="parameters or buffers on the meta device.*pass weights="):
        opreg.export(meta_block(), (example(),))
    assert not out.exists()
    assert opreg.exporter.plan_export(meta_block(), (example(),)) == []  # what `opreg check` runs: no weights needed


def test_a_bfloat16_checkpoint_is_cast_to_the_models_float32_as_transformers_loads_it(tmp_path, fresh_process):
    if not fresh_process:
        return
    path = tmp_path / "bf16.safetensors"
    safetensors.torch.save_file({k: v.to(torch.bfloat16) for k, v in make_block().state_dict().items()}, path)
    reference = make_block()
    reference.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in reference.state_dict().items()})
    in_memory = opreg.export(reference, (example(),))
    streamed = opreg.export(meta_block(), (example(),), weights=path)
    assert saved_bytes(in_memory, tmp_path / "a.onnx", True) == saved_bytes(streamed, tmp_path / "b.onnx", True)


def test_each_transform_written_a_run_of_rows_at_a_time_gives_the_whole_tensors_bytes(monkeypatch, tmp_path):
    """Casts, transposes, concatenations (the packed q/k/v projection) and MatMulNBits quantization
    written in runs of a few rows (as a weight larger than LazyWeight.chunk_bytes is) give the bytes the whole
    tensor, computed at once, has. A transpose of a transposed weight (MatMulNBits' (N, K) rows of a weight
    stored (K, N) for MatMul), or of a concatenation of them, reads the first weights' rows, in runs."""
    import io

    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    from opreg_ort_contrib.quantize import quantized_weights

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(96, 64, generator=g), torch.randn(32, 64, generator=g)
    quantizer = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, bits=4))
    names = {"B": "b", "scales": "s", "zero_points": "z"}
    made = [
        lazy_weights.cast(q.to(torch.bfloat16), torch.float32),
        lazy_weights.transpose(q, [1, 0]),
        lazy_weights.concat([q, k], 0, name="qk"),
        lazy_weights.concat([q.T, k.T], 1, name="qk_t"),
        lazy_weights.transpose(lazy_weights.transpose(q, [1, 0]), [1, 0]),  # q itself, read in runs again
        lazy_weights.transpose(  # the packed (in, out) projection back to (out, in): q over k, in runs
            lazy_weights.concat([lazy_weights.transpose(q, [1, 0]), lazy_weights.transpose(k, [1, 0])], 1), [1, 0]
        ),
        *quantized_weights(lazy_weights.concat([q, k], 0), quantizer, names, 4, 32).values(),
    ]
    whole = [t.tobytes() for t in made]
    expected = [
        q.to(torch.bfloat16).float(),
        q.T.contiguous(),
        torch.cat([q, k]),
        torch.cat([q.T, k.T], 1),
        q,
        torch.cat([q, k]),
    ]
    packed, scales, zeros = quantizer.qbits_block_quant(torch.cat([q, k]).T.contiguous().numpy())
    assert whole == [t.numpy().tobytes() for t in expected] + [packed.tobytes(), scales.tobytes(), zeros.tobytes()]
    assert [t.reads_whole for t in made] == [False, True, *[False] * 7]  # only the one transpose reads whole
    monkeypatch.setattr(lazy_weights.LazyWeight, "chunk_bytes", 100)  # a few rows at a time
    for tensor, data in zip(made, whole, strict=True):
        chunks = len(list(tensor.chunks()))
        assert chunks == 1 if tensor.reads_whole else chunks > 1  # a transpose reads its source whole: once
        written = io.BytesIO()
        tensor.tofile(written)
        assert written.getvalue() == data, tensor


class Normed(torch.nn.Module):
    """Batch norm after a convolution, a grouped transposed convolution and a linear layer (a Gemm)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)
        self.up, self.norm2 = torch.nn.ConvTranspose2d(8, 6, 3, groups=2), torch.nn.BatchNorm2d(6)
        self.fc, self.norm3 = torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5)

    def forward(self, x):
        y = self.norm2(self.up(self.norm(self.conv(x))))
        return self.norm3(self.fc(y.mean((2, 3))))


def test_batch_norm_folds_lazily_to_onnxscripts_bytes_and_streams_the_same(tmp_path):
    from onnxscript.rewriter import pattern
    from onnxscript.rewriter.rules import common as rules

    torch.manual_seed(0)
    model = Normed().eval()
    for norm in (model.norm, model.norm2, model.norm3):
        norm.running_mean.uniform_(-1, 1), norm.running_var.uniform_(0.5, 2), norm.weight.data.uniform_(0.5, 2)
    x = torch.randn(2, 3, 10, 10)
    folded = opreg.export(model, (x,))
    assert [n.op_type for n in folded.model.graph] == ["Conv", "ConvTranspose", "ReduceMean", "Gemm"]
    weights = {k: v.const_value for k, v in folded.model.graph.initializers.items() if k.endswith(".weight")}
    assert {type(w) for w in weights.values()} == {lazy_weights.LazyWeight}
    folded.verify(x)
    by_onnxscript = opreg.export(model, (x,), fold_weights=False)
    pattern.RewriteRuleSet([
        rules.fuse_batchnorm_into_conv_rule, rules.fuse_batchnorm_into_conv_transpose_rule,
        rules.fuse_batchnorm_into_gemm_rule,
    ]).apply_to_model(by_onnxscript.model)  # fmt: skip
    ours = {k: v.const_value.tobytes() for k, v in folded.model.graph.initializers.items()}
    theirs = by_onnxscript.model.graph.initializers  # with the batch norms' now unused parameters
    assert ours == {k: theirs[k].const_value.tobytes() for k in ours}
    safetensors.torch.save_file(model.state_dict(), tmp_path / "normed.safetensors")
    with torch.device("meta"):
        meta = Normed().eval()
    streamed = opreg.export(meta, (x,), weights=tmp_path / "normed.safetensors")
    assert saved_bytes(folded, tmp_path / "a.onnx", True) == saved_bytes(streamed, tmp_path / "b.onnx", True)


def test_rows_made_in_the_reused_buffer_are_each_weights_own_bytes():
    """A weight cast, transposed or packed as it is written is made in a buffer reused from one weight to the
    next (a fresh one costs page faults): a smaller weight after a bigger one writes its own bytes only,
    each its own values, and the buffer goes when freed memory is handed back."""
    import io

    from opreg.weights import _lazy

    g = torch.Generator().manual_seed(0)
    big, small = torch.randn(64, 48, generator=g).to(torch.bfloat16), torch.randn(8, 6, generator=g)
    made = [
        lazy_weights.transpose(lazy_weights.cast(big, torch.float32), [1, 0]),
        lazy_weights.cast(small.to(torch.bfloat16), torch.float32),
        lazy_weights.concat([lazy_weights.transpose(small, [1, 0]), lazy_weights.transpose(small[:2], [1, 0])], 1),
    ]
    expected = [big.float().T, small.to(torch.bfloat16).float(), torch.cat([small.T, small[:2].T], 1)]
    lazy_weights.release_freed_memory()  # no buffer left by an earlier write
    for tensor, values in zip(made, expected, strict=True):
        written = io.BytesIO()
        tensor.tofile(written)
        assert written.getvalue() == values.contiguous().numpy().tobytes()
        assert _lazy._scratch and _lazy._scratch[0].numel() == big.numel() * 4  # made there, kept
    lazy_weights.release_freed_memory()
    assert not _lazy._scratch


def test_packed_qkv_quantized_to_int4_streams_the_in_memory_bytes(tmp_path):
    """ONNX Runtime's packed q/k/v projection (a lazy concat) quantized to MatMulNBits (lazy blocks of
    the concat), on the pack's decoder-layer sample, whose rotary (before GroupQueryAttention at the
    default target: the packed result is split for it) needs its computed buffer."""
    from opreg_ort_contrib import MatMulNBitsQuantization, samples

    sample = samples._decoder_sample()
    model = sample.module
    options = {"target": "onnxruntime", "passes": [MatMulNBitsQuantization(bits=4)]}
    fp32 = opreg.export(model, sample.args, target="onnxruntime")  # the lazy concatenation computes the layer
    assert "ort_contrib:PackedQKV" in fp32.model.metadata_props["opreg.rewrites"]
    fp32.verify(*sample.args, rtol=sample.rtol, atol=sample.atol)
    in_memory = opreg.export(model, sample.args, **options)
    tensors = {**model.state_dict(), **dict(model.named_buffers())}  # its rotary frequencies too
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "layer.safetensors")
    with torch.device("meta"):
        meta = type(model)().eval()
    streamed = opreg.export(meta, sample.args, weights=tmp_path / "layer.safetensors", **options)
    packed = streamed.model.graph.initializers["qkv_packed_Q4"].const_value
    assert isinstance(packed, lazy_weights.LazyWeight) and packed.how == "int4 blocks of qkv_packed"
    assert saved_bytes(in_memory, tmp_path / "a.onnx", True) == saved_bytes(streamed, tmp_path / "b.onnx", True)


# -- language models -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory):
    model = lm.causal_lm("llama")
    folder = tmp_path_factory.mktemp("llama") / "checkpoint"
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_a_streamed_decoder_is_the_in_memory_one_byte_for_byte(llama_checkpoint, tmp_path, precision):
    options = {}
    if precision == "int4":
        from opreg_ort_contrib import MatMulNBitsQuantization

        options = {"target": "onnxruntime", "passes": [MatMulNBitsQuantization(bits=4, accuracy_level=4)]}
    files = []
    for streaming in (False, True):
        decoder = opreg.llm.export_decoder(llama_checkpoint, streaming=streaming, **options)
        assert lm_on_meta(decoder) is streaming
        path = tmp_path / f"{streaming}.onnx"
        decoder.program.save(path, external_data=False)
        files.append(path)
    assert filecmp.cmp(*files, shallow=False)
    ops = {(n.domain, n.op_type) for n in decoder.program.model.graph}
    if precision == "int4":
        assert ("com.microsoft", "MatMulNBits") in ops and ("com.microsoft", "GroupQueryAttention") in ops
    else:
        decoder.verify()  # the streamed decoder against transformers (which loads the checkpoint for it)


def lm_on_meta(decoder) -> bool:
    return decoder.model.model.embed_tokens.weight.device.type == "meta"


def test_int4_with_a_tied_embedding_streams_the_in_memory_bytes_and_stores_the_table_once(tmp_path, caplog):
    """``precision="int4"`` on a tied Qwen2 of 3 layers (the second and third copied from the first, their
    weights lazy): streamed and loaded give the same bytes; the embedding Gather reads the head's
    quantized rows, so the folder holds no float table."""
    checkpoint = tmp_path / "checkpoint"
    lm.causal_lm("qwen2", tie_word_embeddings=True, num_hidden_layers=3).to(torch.bfloat16).save_pretrained(checkpoint)
    files = []
    for streaming in (False, True):
        caplog.clear()
        with caplog.at_level("INFO", logger="opreg.llm"):
            decoder = opreg.llm.export_decoder(checkpoint, precision="int4", streaming=streaming, tokenizer=False)
        assert lm_on_meta(decoder) is streaming
        assert "captured the first 1 of 3 layers; the others are copies (model.layers)" in caplog.messages
        path = tmp_path / f"{streaming}.onnx"
        decoder.program.save(path, external_data=False)
        files.append(path)
    assert filecmp.cmp(*files, shallow=False)
    decoder.save(tmp_path / "genai")
    written = onnx.load(str(tmp_path / "genai" / "model.onnx"), load_external_data=False).graph
    assert [n.op_type for n in written.node if "Gather" in n.op_type] == ["GatherBlockQuantized"]
    tables = [t.name for t in written.initializer if lm.VOCAB in t.dims and t.data_type == onnx.TensorProto.FLOAT]
    assert tables == ["model.lm_head.weight_scales"]  # the head's scales (300 x 1), no float (300 x 64) table


def test_a_checkpoint_folder_streams_by_default_and_its_genai_folder_generates(llama_checkpoint, tmp_path):
    out = tmp_path / "genai"
    decoder = opreg.llm.export_decoder(llama_checkpoint, out)
    assert lm_on_meta(decoder)
    model = lm.causal_lm("llama").to(torch.bfloat16).float()
    tokens = [5, 17, 33]
    assert lm.genai_greedy(out, tokens, 12) == lm.greedy(model, tokens, 12)


def test_running_out_of_disk_while_streaming_leaves_no_model_that_looks_valid(llama_checkpoint, tmp_path):
    """A write that fails midway (the disk full while the weights stream) leaves a new folder
    removed, and an existing folder with its complete old model and config."""
    decoder = opreg.llm.export_decoder(llama_checkpoint)
    graph = decoder.program.model.graph
    victim = next(v for v in graph.initializers.values() if v.const_value.size > 1000)
    good = victim.const_value

    def full(start, stop):
        raise OSError(errno.ENOSPC, "No space left on device")

    victim.const_value = lazy_weights.LazyWeight(full, good.torch_dtype, good.shape, name=good.name, how="a full disk")
    with pytest.raises(opreg.SaveError, match="no space left on the device"):
        decoder.save(tmp_path / "new", external_data=True)
    assert not (tmp_path / "new").exists()
    old = tmp_path / "old"
    victim.const_value = good
    decoder.save(old, external_data=True)
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    victim.const_value = lazy_weights.LazyWeight(full, good.torch_dtype, good.shape, name=good.name, how="a full disk")
    with pytest.raises(opreg.SaveError, match="no space left on the device"):
        decoder.save(old, external_data=True)
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert json.loads((old / "genai_config.json").read_text())["model"]["decoder"]["filename"] == "model.onnx"
