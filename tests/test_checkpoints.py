"""Checkpoints are read as their format defines (issue 53): a safetensors header is checked by
safetensors' own rules, each file is pinned from the capture to the save, a folder's files are the
ones transformers reads there (and stay inside it), tensors the model does not declare are named,
and a NaN or an infinity never reaches block quantization.

Each rule is tried on both sides: the file safetensors reads is read, the one it refuses is refused
(``safe_open`` says so too), a value at a limit is taken and one past it is not. Small files and
tiny models written here; seconds each.
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

import opreg
from opreg import weights as lazy_weights
from tests import language_models as lm
from tests.test_streaming import example, make_block, meta_block

# -- a header checked by safetensors' rules ------------------------------------------------------------


def read_raw(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's header (parsed) and its data bytes."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def write_raw(path: Path, header: dict, data: bytes) -> Path:
    """A safetensors file of ``header`` (padded with spaces to 8 bytes, as safetensors pads it) and ``data``."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.fixture
def three(tmp_path) -> Path:
    """Three float32 tensors: ``a`` [4] at bytes 0-16 of the data, ``b`` [4] at 16-32, ``c`` [2, 2] at 32-48."""
    tensors = {"a": torch.arange(4.0), "b": torch.arange(4.0) + 10, "c": torch.arange(4.0).reshape(2, 2) + 20}
    path = tmp_path / "three.safetensors"
    safetensors.torch.save_file(tensors, path)
    header, _ = read_raw(path)
    assert [header[n]["data_offsets"] for n in "abc"] == [[0, 16], [16, 32], [32, 48]]
    return path


def edited(path: Path, tensor: str | None = None, data_extra: bytes = b"", **fields) -> Path:
    """``path`` written again with ``tensor``'s entry given ``fields`` (``None``: removed) and ``data_extra``
    after the data."""
    header, data = read_raw(path)
    if tensor is not None:
        if fields.get("remove"):
            del header[tensor]
        else:
            header[tensor] = {**header[tensor], **fields}
    return write_raw(path.with_name("edited.safetensors"), header, data + data_extra)


BROKEN = {
    # a tensor given another tensor's bytes: it would read b's values as a's (issue 53, defect 2)
    "another tensor's bytes": ({"tensor": "b", "data_offsets": [0, 16]}, "'b' in {file} starts at byte 0, inside 'a'"),
    # an offset before the data: the header's own bytes
    "into the header": ({"tensor": "a", "data_offsets": [-8, 8]}, "describes 'a' as"),
    "past the end": (
        {"tensor": "c", "shape": [2, 4], "data_offsets": [32, 64]},
        "take 64 bytes after its header, but the file holds 48",
    ),
    "bytes left unused": ({"tensor": "a", "remove": True}, "'b' in {file} starts at byte 16 of the data, not at 0"),
    "a gap at the end": ({"data_extra": b"\0" * 8}, "the file holds 56 there: a padded"),
    "a size its shape does not take": (
        {"tensor": "c", "shape": [3, 2]},
        "'c' in {file} is given 16 bytes for F32 [3, 2], which takes 24",
    ),
    "an end before its start": (
        {"tensor": "c", "data_offsets": [32, 16]},
        "'c' in {file} ends at byte 16, before it starts (32)",
    ),
    "a shape of floats": ({"tensor": "c", "shape": [2.0, 2]}, "describes 'c' as"),
    "no dtype": ({"tensor": "c", "dtype": None}, "'c' in {file} has the dtype None, which safetensors does not"),
    "an unknown dtype": (
        {"tensor": "c", "dtype": "F12"},
        "'c' in {file} has the dtype 'F12', which safetensors does not define",
    ),
}


@pytest.mark.parametrize("case", BROKEN, ids=str)
def test_a_header_safetensors_refuses_is_refused_naming_the_file_and_the_tensor(three, case):
    change, message = BROKEN[case]
    bad = edited(three, **change)
    with pytest.raises(safetensors.SafetensorError):  # safetensors' own reader refuses it
        safetensors.safe_open(bad, "pt")
    with pytest.raises(opreg.WeightsError) as caught:
        lazy_weights.open_weights(bad)
    assert message.format(file=bad) in str(caught.value)


def test_the_file_safetensors_reads_is_read_with_its_values(three, tmp_path):
    """The other side of each rule: a file as safetensors writes it, one whose tensors are listed out of
    order of their bytes, and one with an empty tensor sharing its offset with the next, are read."""
    shuffled, data = read_raw(three)
    reordered = write_raw(tmp_path / "reordered.safetensors", dict(reversed(list(shuffled.items()))), data)
    empty = {**shuffled, "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [16, 16]}}
    with_empty = write_raw(tmp_path / "empty.safetensors", empty, data)
    for path in (three, reordered, with_empty):
        with safetensors.safe_open(path, "pt") as f:
            expected = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
        got = {name: weight.torch() for name, weight in lazy_weights.open_weights(path).items()}
        assert got.keys() == expected.keys() and all(torch.equal(got[n], expected[n]) for n in got)


def test_a_streamed_export_refuses_a_header_that_gives_one_tensor_anothers_bytes(tmp_path):
    """Issue 53's case: ``scale`` pointed at ``down.bias``'s bytes exported with rc 0 and wrong values."""
    path = tmp_path / "block.safetensors"
    safetensors.torch.save_file(make_block().state_dict(), path)
    header, data = read_raw(path)
    header["scale"]["data_offsets"] = header["down.bias"]["data_offsets"]
    bad = write_raw(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(
        opreg.WeightsError, match=r"tensor 'scale' in .*bad\.safetensors starts at byte 0, inside 'down"
    ):
        opreg.export(meta_block(), (example(),), weights=bad)


MAX = 100_000_000
"""safetensors' limit on a header's length (its ``MAX_HEADER_SIZE``)."""


@pytest.mark.parametrize(
    ("length", "message"),
    [
        (2**63 - 1, "says its header is 9223372036854775807 bytes, more than the 100000000 safetensors reads"),
        (2**40, "more than the 100000000 safetensors reads"),
        (MAX + 1, "more than the 100000000 safetensors reads"),
        (MAX, "says its header is 100000000 bytes, but the file holds 16"),  # at the limit: the file is too short
        (9, "says its header is 9 bytes, but the file holds 16"),  # one past the file's end
    ],
    ids=["2**63-1", "2**40", "limit+1", "limit", "file+1"],
)
def test_a_header_length_past_the_limit_or_the_file_is_named_not_an_overflow(tmp_path, length, message):
    path = tmp_path / "header.safetensors"
    path.write_bytes(struct.pack("<Q", length) + b"{}      ")
    with pytest.raises(opreg.WeightsError, match=message):
        lazy_weights.open_weights(path)
    with pytest.raises(safetensors.SafetensorError, match="header too large" if length > MAX else "invalid header"):
        safetensors.safe_open(path, "pt")


def test_a_header_that_fills_the_file_exactly_is_read_and_a_file_shorter_than_a_length_is_not(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(struct.pack("<Q", 8) + b"{}      ")  # 8 + 8 == the file's 16 bytes: no tensors
    assert len(lazy_weights.open_weights(path)) == 0
    path.write_bytes(b"\x08\0\0\0\0\0\0")  # 7 bytes
    with pytest.raises(opreg.WeightsError, match="holds 7 bytes, fewer than the 8 of a safetensors header's length"):
        lazy_weights.open_weights(path)
    for text in (b"[1, 2]  ", b"{nope}  ", b"\xff{}     "):
        path.write_bytes(struct.pack("<Q", 8) + text)
        with pytest.raises(opreg.WeightsError, match="not a safetensors file"):
            lazy_weights.open_weights(path)


# -- a checkpoint pinned from capture to save ------------------------------------------------------------------


@pytest.fixture
def streamed(tmp_path):
    """A streamed export of the block (its small tensors read at capture, the rest at save) and its checkpoint,
    saved a while ago (its modification time an old one, as a checkpoint's is when it is exported)."""
    path = tmp_path / "checkpoint" / "block.safetensors"
    path.parent.mkdir()
    safetensors.torch.save_file(make_block().state_dict(), path)
    os.utime(path, ns=(10**18, 10**18))
    return opreg.export(meta_block(), (example(),), weights=path), path


def rewrite_in_place(path: Path, state: dict, metadata: dict | None = None) -> None:
    """Write ``state`` into ``path``'s own inode (as safetensors' ``save_file`` does: truncate, write)."""
    data = safetensors.torch.save({k: v.contiguous() for k, v in state.items()}, metadata=metadata)
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)


def replace_by_rename(path: Path, state: dict) -> None:
    """Write ``state`` to a new file renamed over ``path`` (another inode: an atomic re-save)."""
    other = path.with_name("new.safetensors")
    safetensors.torch.save_file(state, other)
    os.replace(other, path)


CHANGES = {
    # the same values, saved again with a longer header: every offset shifts (issue 53)
    "re-saved with a longer header": (
        lambda path: rewrite_in_place(path, make_block().state_dict(), {"note": "x" * 100}),
        "its size went from",
    ),
    # other values, the same size: the small tensors were read at capture, the others would be now
    "other values in place": (
        lambda path: rewrite_in_place(path, make_block(seed=1).state_dict()),
        "it was written to",
    ),
    "replaced by a rename": (
        lambda path: replace_by_rename(path, make_block().state_dict()),
        "another file took its name",
    ),
    "deleted": (lambda path: path.unlink(), "is gone (removed or renamed since the export read its header)"),
}


@pytest.mark.parametrize("change", CHANGES, ids=str)
def test_a_checkpoint_changed_between_capture_and_save_is_refused_naming_it(streamed, tmp_path, change):
    program, path = streamed
    alter, message = CHANGES[change]
    alter(path)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(opreg.WeightsError) as caught:
        program.save(out / "m.onnx", external_data=True)
    assert str(path) in str(caught.value) and message in str(caught.value)
    assert "cannot create files in" not in str(caught.value)  # not blamed on the output folder
    assert not isinstance(caught.value, opreg.SaveError)
    assert os.listdir(out) == []  # nothing half-written


def test_an_unchanged_checkpoint_saves_the_in_memory_bytes_and_one_only_opened_again_too(streamed, tmp_path):
    """The other side: an unchanged checkpoint (however often opened or read) saves the in-memory export."""
    program, path = streamed
    safetensors.safe_open(path, "pt")  # read by someone else meanwhile: nothing changes
    program.save(tmp_path / "a.onnx", external_data=False)
    in_memory = opreg.export(make_block(), (example(),))
    in_memory.save(tmp_path / "b.onnx", external_data=False)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


# -- which files of a folder: as transformers chooses them -------------------------------------------------------


def state_of(seed: int) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in lm.causal_lm("llama", seed=seed).state_dict().items()}


@pytest.fixture(scope="module")
def llama_config(tmp_path_factory) -> Path:
    """A folder holding the tiny Llama's config and generation config only."""
    folder = tmp_path_factory.mktemp("config")
    model = lm.causal_lm("llama")
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    return folder


def checkpoint_folder(config: Path, folder: Path, single: int | None, index: int | None, **config_extra) -> Path:
    """A checkpoint of the tiny Llama: ``model.safetensors`` of seed ``single``, and an index with two
    shards of seed ``index`` (each ``None``: none)."""
    folder.mkdir()
    settings = json.loads((config / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**settings, **config_extra}))
    (folder / "generation_config.json").write_text((config / "generation_config.json").read_text())
    if single is not None:
        safetensors.torch.save_file(state_of(single), folder / "model.safetensors", metadata={"format": "pt"})
    if index is not None:
        shard_index(folder, state_of(index), {"a": "model-00001-of-00002.safetensors"})
    return folder


def shard_index(folder: Path, state: dict, names: dict[str, str], index: str = "model.safetensors.index.json") -> None:
    """``state`` as two shards (the embedding in ``names["a"]``, the rest in ``names.get("b")``) and their index."""
    first = {k: v for k, v in state.items() if "embed" in k}
    shards = {names["a"]: first, names.get("b", "model-00002-of-00002.safetensors"): {
        k: v for k, v in state.items() if k not in first}}  # fmt: skip
    weight_map = {}
    for name, tensors in shards.items():
        target = folder / name if not os.path.isabs(name) else Path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file(tensors, target, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def transformers_reads(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict())


def opreg_reads(folder: Path) -> dict[str, torch.Tensor]:
    return {k: w.torch() for k, w in lazy_weights.open_weights(folder).items()}


@pytest.mark.parametrize(
    ("single", "index", "extra", "seed"),
    [
        (0, 1, {}, 0),  # both: model.safetensors, the index not read (issue 53, defect 4)
        (None, 1, {}, 1),  # the index alone: its shards
        (0, None, {}, 0),  # the file alone
        (0, 1, {"transformers_weights": "model.safetensors.index.json"}, 1),  # the config names the index
        (None, 0, {"transformers_weights": "model-00001-of-00002.safetensors"}, None),  # ... or one file
    ],
    ids=["file-and-index", "index", "file", "config-names-the-index", "config-names-a-file"],
)
def test_a_folders_weights_are_the_files_transformers_reads(llama_config, tmp_path, caplog, single, index, extra, seed):
    folder = checkpoint_folder(llama_config, tmp_path / "checkpoint", single, index, **extra)
    with caplog.at_level(logging.WARNING, logger="opreg.weights"):
        ours = opreg_reads(folder)
    theirs = transformers_reads(folder)
    assert ours.keys() <= theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    expected = state_of(0 if seed is None else seed)
    assert all(torch.equal(v, expected[k]) for k, v in ours.items())
    assert (ours.keys() == expected.keys()) is (seed is not None)  # a file named alone: its tensors only
    both = single is not None and index is not None and not extra
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opreg")] == (
        [f"{folder} holds both model.safetensors and model.safetensors.index.json: reading model.safetensors, as "
         "transformers does (the index and its shards are not read)"] if both else []
    )  # fmt: skip


def test_streamed_and_loaded_decoders_of_a_file_beside_an_index_are_the_same(llama_config, tmp_path):
    """Issue 53: streaming read the index's shards, transformers (``streaming=False``) the single file."""
    folder = checkpoint_folder(llama_config, tmp_path / "checkpoint", 0, 1)
    files = []
    for streaming in (True, False):
        decoder = opreg.llm.export_decoder(folder, target="onnx", tokenizer=False, streaming=streaming)
        files.append(tmp_path / f"{streaming}.onnx")
        decoder.program.save(files[-1], external_data=False)
    assert files[0].read_bytes() == files[1].read_bytes()


def test_a_folder_transformers_reads_no_safetensors_of_is_not_streamed(llama_config, tmp_path):
    """Safetensors of another name beside ``pytorch_model.bin``: transformers reads the ``.bin``, so the
    export does not stream the others; a folder of such files alone is read whole by ``open_weights``."""
    from opreg.llm import _meta

    folder = checkpoint_folder(llama_config, tmp_path / "checkpoint", None, None)
    safetensors.torch.save_file(state_of(1), folder / "other.safetensors")
    assert lazy_weights.checkpoint_files(folder) is None and not _meta.streamable(folder)
    assert all(torch.equal(opreg_reads(folder)[k], v) for k, v in state_of(1).items())
    safetensors.torch.save_file(state_of(0), folder / "model.safetensors")
    assert _meta.streamable(folder)


@pytest.mark.parametrize("where", ["../outside.safetensors", "absolute", "sub/../../outside.safetensors"])
def test_an_index_naming_a_shard_outside_the_folder_is_refused_streamed_or_not(llama_config, tmp_path, where):
    folder = tmp_path / "checkpoint"
    checkpoint_folder(llama_config, folder, None, None)
    name = str(tmp_path / "elsewhere" / "outside.safetensors") if where == "absolute" else where
    shard_index(folder, state_of(0), {"a": name})
    message = rf"the checkpoint index .*model\.safetensors\.index\.json names '{name}', outside the checkpoint folder"
    with pytest.raises(opreg.WeightsError, match=message):
        lazy_weights.open_weights(folder)
    for streaming in (True, False):
        with pytest.raises(opreg.WeightsError, match=message):
            opreg.llm.export_decoder(folder, target="onnx", tokenizer=False, streaming=streaming)


def test_shards_in_a_subfolder_or_linked_from_elsewhere_are_read(llama_config, tmp_path):
    """The other side: a shard in a subfolder, and one that is a symbolic link out of the folder (a Hugging
    Face cache's files are links into its blobs), are inside it by name."""
    folder = tmp_path / "checkpoint"
    checkpoint_folder(llama_config, folder, None, None)
    shard_index(folder, state_of(0), {"a": "sub/first.safetensors", "b": "second.safetensors"})
    blob = tmp_path / "blobs" / "1234"
    blob.parent.mkdir()
    os.replace(folder / "second.safetensors", blob)
    (folder / "second.safetensors").symlink_to(blob)
    assert all(torch.equal(opreg_reads(folder)[k], v) for k, v in state_of(0).items())
    assert transformers_reads(folder).keys() == opreg_reads(folder).keys()


@pytest.mark.parametrize(
    ("named", "message"),
    [
        ("../model.safetensors", "transformers_weights names '../model.safetensors', outside the checkpoint folder"),
        ("weights.bin", "names 'weights.bin' as its transformers_weights: transformers reads a \\*.safetensors file"),
    ],
)
def test_a_config_naming_weights_outside_the_folder_or_not_safetensors_is_refused(
    llama_config, tmp_path, named, message
):
    folder = checkpoint_folder(llama_config, tmp_path / "checkpoint", 0, None, transformers_weights=named)
    with pytest.raises(opreg.WeightsError, match=message):
        lazy_weights.open_weights(folder)


# -- tensors the model does not declare -------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
def test_tensors_the_model_does_not_declare_are_named_in_a_warning(llama_config, tmp_path, caplog, streaming):
    folder = tmp_path / "checkpoint"
    checkpoint_folder(llama_config, folder, None, None)
    extra = {"model.extra.weight": torch.ones(3), "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    safetensors.torch.save_file({**state_of(0), **extra}, folder / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING, logger="opreg"):
        opreg.llm.export_decoder(folder, target="onnx", tokenizer=False, streaming=streaming)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("opreg")]
    # the old per-layer rotary frequencies are left out of the report, as transformers leaves them out
    assert ours == [
        f"{folder} holds 1 tensor that LlamaForCausalLM does not declare: model.extra.weight; the export leaves it "
        "out, as transformers does (a checkpoint of another config or model class?)"
    ]


def test_a_checkpoint_of_exactly_the_models_tensors_says_nothing(llama_config, tmp_path, caplog):
    folder = checkpoint_folder(llama_config, tmp_path / "checkpoint", 0, None)
    with caplog.at_level(logging.WARNING, logger="opreg"):
        opreg.llm.export_decoder(folder, target="onnx", tokenizer=False)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opreg")] == []


# -- NaN and infinity before block quantization ------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_a_weight_holding_nan_or_inf_is_refused_before_it_is_quantized(tmp_path, bits, value):
    """Refused when its rows are read to be quantized: at the save, or, where a quantized tensor is small
    enough for the export's own checks to read (this block's scales), at the export."""
    from opreg_ort_contrib import MatMulNBitsQuantization

    model = make_block()
    with torch.no_grad():
        model.up.weight[3, 5] = value
    counts = "1 NaN and 0 infinite" if math.isnan(value) else "0 NaN and 1 infinite"
    message = rf"weight 'up\.weight' \(in memory\) holds {counts} values in rows 0 to 32: int{bits} blocks would"
    with pytest.raises(opreg.WeightsError, match=message):
        passes = [MatMulNBitsQuantization(bits=bits, block_size=16)]
        opreg.export(model, (example(),), target="onnxruntime", passes=passes).save(tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


def test_a_streamed_weight_holding_nan_is_refused_naming_its_file(streamed, tmp_path):
    from opreg_ort_contrib import MatMulNBitsQuantization

    _, path = streamed
    state = make_block().state_dict()
    state["down.weight"][7, 31] = float("nan")
    safetensors.torch.save_file(state, path)
    with pytest.raises(opreg.WeightsError, match=r"weight 'down\.weight' \(block\.safetensors\) holds 1 NaN"):
        passes = [MatMulNBitsQuantization(bits=4)]
        opreg.export(meta_block(), (example(),), weights=path, target="onnxruntime", passes=passes).save(
            tmp_path / "m.onnx"
        )
    assert not (tmp_path / "m.onnx").exists()


def test_a_weight_holding_nan_kept_float_by_exclude_is_exported(tmp_path):
    """The way out the refusal gives: the weight left out of the quantization stays float, NaN and all."""
    from opreg_ort_contrib import MatMulNBitsQuantization

    model = make_block()
    with torch.no_grad():
        model.up.weight[3, 5] = float("nan")
    passes = [MatMulNBitsQuantization(bits=4, block_size=16, exclude=["up.weight"])]
    program = opreg.export(model, (example(),), target="onnxruntime", passes=passes)
    program.save(tmp_path / "m.onnx")
    assert [n.op_type for n in program.model.graph if n.op_type in ("MatMul", "MatMulNBits")] == [
        "MatMul", "MatMulNBits"
    ]  # fmt: skip


def test_the_largest_finite_weights_are_quantized(tmp_path):
    """The other side: float32's largest values are finite, and quantized."""
    from opreg_ort_contrib import MatMulNBitsQuantization

    model = make_block()
    with torch.no_grad():
        model.up.weight[3, 5] = torch.finfo(torch.float32).max
        model.up.weight[4, 5] = torch.finfo(torch.float32).min
    program = opreg.export(model, (example(),), target="onnxruntime", passes=[MatMulNBitsQuantization(bits=4)])
    program.save(tmp_path / "m.onnx")
    assert "MatMulNBits" in {n.op_type for n in program.model.graph}
