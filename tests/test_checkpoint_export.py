"""``opreg export FOLDER`` and ``opreg.export_checkpoint``: a checkpoint folder exported as the
installed packs' loaders (``opreg_checkpoint_loaders``) plan it, into a folder written whole.

The transformers loader (opreg-transformers) on a tiny BERT written with ``save_pretrained``; the
contract (priority, ties, ``library=``, a broken loader, a dim of multiples, a post-step, a loop
check) on throwaway packs installed as real distributions; the refusals before any export."""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg
from opreg import cli
from opreg.checkpoint.source import checkpoint_of, is_factory

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", "the", "cat", "sat"]
OPTIMUM_BERT_FILES = ["config.json", "model.onnx", "tokenizer.json", "tokenizer_config.json"]
"""What optimum-cli 0.1.0 writes for a BERT feature-extraction folder of these files (it also re-saves
special_tokens_map.json and vocab.txt, which this folder's tokenizer does not have)."""


def save_bert(folder: Path, head: str = "BertModel", *, tokenizer: bool = True, **config) -> Path:
    """A tiny random BERT (``head``: its transformers class) saved with ``save_pretrained``."""
    import transformers

    settings = dict(vocab_size=len(TOKENS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=37, max_position_embeddings=40, num_labels=3)  # fmt: skip
    torch.manual_seed(0)
    getattr(transformers, head)(transformers.BertConfig(**{**settings, **config})).save_pretrained(folder)
    if tokenizer:
        vocab = {word: i for i, word in enumerate(TOKENS)}
        transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_bert(tmp_path_factory.mktemp("ckpt") / "tiny-bert")


@pytest.fixture(scope="module")
def exported(bert: Path, tmp_path_factory: pytest.TempPathFactory) -> opreg.CheckpointExport:
    return opreg.export_checkpoint(bert, tmp_path_factory.mktemp("out") / "bert-onnx")


def test_a_bert_folder_is_exported_for_feature_extraction_as_optimum_lays_it_out(exported, bert):
    assert (exported.library, exported.task, exported.inferred) == ("transformers", "feature-extraction", True)
    assert exported.loader == "transformers:transformers"
    assert "architectures ['BertModel']" in exported.evidence
    assert list(exported.files) == OPTIMUM_BERT_FILES
    assert (exported.folder / "config.json").read_bytes() == (bert / "config.json").read_bytes()  # copied as it is
    model = onnx.load(exported.folder / "model.onnx")
    onnx.checker.check_model(model, full_check=True)
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    assert shapes == {
        name: ["batch_size", "sequence_length"] for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    assert [o.name for o in model.graph.output] == ["last_hidden_state"]
    bounds = json.loads({p.key: p.value for p in model.metadata_props}["opreg.dim_bounds"])
    assert bounds["sequence_length"] == [1, 40]  # max_position_embeddings: a longer sequence has no position


def test_the_folder_runs_in_onnxruntime_at_a_third_shape_as_eager_bert(exported, bert):
    """Verified at the example (2 x 16) and second (3 x 7) sizes by the export; here at a third, with
    padding, through the file alone."""
    import transformers

    assert exported.verified and [len(m.verified) for m in exported.models] == [2]
    eager = transformers.AutoModel.from_pretrained(bert).eval()
    ids = torch.randint(0, len(TOKENS), (4, 40))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    types = torch.zeros_like(ids)
    session = onnxruntime.InferenceSession(exported.folder / "model.onnx", providers=["CPUExecutionProvider"])
    (got,) = session.run(
        None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
    )
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_command_exports_a_folder_and_says_what_it_inferred(bert, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["export", str(bert), "-o", str(out), "--task", "text-classification", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["task"], report["inferred"], report["verified"]) == ("text-classification", False, True)
    (model,) = report["models"]
    assert [c["name"] for c in model["verified"]] == ["logits", "logits"]  # two sizes
    assert [o.name for o in onnx.load(out / "model.onnx").graph.output] == ["logits"]
    assert cli.main(["export", str(bert), "-o", str(out), "--no-verify"]) == 0
    text = capsys.readouterr().out
    assert "task feature-extraction (inferred from config.json: model_type 'bert'" in text
    assert "verified" not in text


def refused(capsys, *argv: str) -> str:
    assert cli.main(["export", *argv]) == 2
    return capsys.readouterr().err


def test_bad_input_is_refused_before_any_export_naming_the_file_and_the_remedy(bert, tmp_path, capsys, caplog):
    out = tmp_path / "out"
    no_weights = save_bert(tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    assert "has no weights (model.safetensors" in refused(capsys, str(no_weights), "-o", str(out))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert", "num_attention_heads": "two"}')
    (broken / "model.safetensors").write_bytes(b"")
    assert "config.json cannot be built by transformers" in refused(capsys, str(broken), "-o", str(out))
    err = refused(capsys, str(bert), "-o", str(out), "--task", "text-generation")
    assert "cannot be exported for task 'text-generation'" in err and "fill-mask, text-classification" in err
    (tmp_path / "empty").mkdir()
    err = refused(capsys, str(tmp_path / "empty"), "-o", str(out))
    assert "no installed pack's loader recognises" in err and "config.json with a model_type" in err
    llava = tmp_path / "llava"
    llava.mkdir()
    (llava / "config.json").write_text(
        '{"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "vision_config": {}}'
    )
    assert "opreg llm export" in refused(capsys, str(llava), "-o", str(out))
    assert "--dynamic is for a factory" in refused(capsys, str(bert), "-o", str(out), "--dynamic", "auto")
    assert not out.exists()  # nothing was written


def test_a_folder_written_over_keeps_the_files_the_export_does_not_write(bert, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "model.onnx").write_text("old")
    result = opreg.export_checkpoint(bert, out, verify=False)
    assert (out / "notes.txt").read_text() == "mine" and "notes.txt" in result.files
    assert onnx.load(out / "model.onnx").graph.output[0].name == "last_hidden_state"
    assert not result.verified and result.models[0].verified == ()


def test_sources_are_told_apart_by_their_form(tmp_path, monkeypatch):
    assert is_factory("models.py:make") and is_factory("pkg.models:make") and is_factory("sub/dir/m.py:make")
    assert not is_factory("owner/name") and not is_factory("./ckpt") and not is_factory("models.py")
    (tmp_path / "models.py").write_text("")
    with pytest.raises(opreg.CheckpointError, match="is a file, not a checkpoint folder"):
        checkpoint_of(tmp_path / "models.py")
    with pytest.raises(opreg.CheckpointError, match="no such folder"):
        checkpoint_of("./no/such/../folder")


def test_a_hub_id_resolves_through_huggingface_hubs_cache_offline(bert, tmp_path, monkeypatch):
    """A hub id is what ``huggingface_hub.snapshot_download`` gives: here from a cache laid out as
    the library lays it, with HF_HUB_OFFLINE=1 (no network in tests)."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    snapshot = cache / "models--tiny--bert" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for name in (bert / "config.json", bert / "model.safetensors"):
        (snapshot / name.name).write_bytes(name.read_bytes())
    (cache / "models--tiny--bert" / "refs").mkdir()
    (cache / "models--tiny--bert" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    checkpoint = checkpoint_of("tiny/bert")
    assert checkpoint.path == snapshot and checkpoint.source == "tiny/bert" and checkpoint.has("config.json")
    with pytest.raises(opreg.CheckpointError, match="HF_HUB_OFFLINE is set") as caught:
        checkpoint_of("tiny/missing")
    assert "give the checkpoint's folder" in str(caught.value)


# -- the contract, on throwaway packs --------------------------------------------------------------

TOY = '''
import torch


class Patches(torch.nn.Module):
    """Cuts an image into 4 x 4 patches: its height and width must be multiples of 4."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 5)

    def forward(self, pixels):
        b, h, w = pixels.shape
        patches = pixels.reshape(b, h // 4, 4, w // 4, 4).permute(0, 1, 3, 2, 4).reshape(b, -1, 16)
        return {"embeddings": self.proj(patches), "patches.total": patches.sum(dim=(1, 2))}


def recognise(checkpoint):
    config = checkpoint.json("toy.json")
    if config is None:
        return None
    return opreg.Recognition("toy", ("embed",), "embed", f"toy.json: {sorted(config)}")


def plan(checkpoint, task):
    def build():
        torch.manual_seed(0)
        return Patches()

    side = opreg.DynamicDim("side", example=8, other=12, min=4, max=64, multiple=4)
    component = opreg.Component(
        "model", "model.onnx", build,
        (opreg.ModelInput("pixels", ("batch_size", "side", "side"), "float32", "normal"),),
        ("embeddings", "patches.total"), (opreg.DynamicDim("batch_size", 2, 1), side),
    )
    copy = opreg.CheckContext.__name__  # the values are opreg's public names
    assert copy == "CheckContext"
    return opreg.ExportPlan("toy", task, (component,), (opreg.FileCopy("toy.json", "config/toy.json"),), **EXTRA)


EXTRA = {}


@opreg.hookimpl
def opreg_checkpoint_loaders():
    return [opreg.CheckpointLoader(NAME, "toy", "toy.json", recognise, plan, priority=PRIORITY)]
'''


def toy_pack(make_pack, name: str, priority: int = 0, extra: str = "") -> str:
    return make_pack(name, f"NAME = {name!r}\nPRIORITY = {priority}\n" + TOY + extra)


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "toy.json").write_text('{"patch": 4}')
    return folder


def test_a_pack_teaches_a_library_and_its_dims_keep_the_multiple_the_model_needs(make_pack, toy, tmp_path):
    toy_pack(make_pack, "toy_a")
    result = opreg.export_checkpoint(toy, tmp_path / "out")
    assert (result.loader, result.library, result.task) == ("toy_a:toy_a", "toy", "embed")
    assert list(result.files) == ["config/toy.json", "model.onnx"]
    model = onnx.load(tmp_path / "out" / "model.onnx")
    # named as planned: the exporter alone would clean the dot away (patches_total)
    assert [i.name for i in model.graph.input] == ["pixels"] and [o.name for o in model.graph.output] == [
        "embeddings", "patches.total",
    ]  # fmt: skip
    sizes = [(v.outputs[0].max_abs, v.outputs[1].max_abs) for v in result.models[0].verified]
    assert len(sizes) == 2  # side 8 and 12, batch 2 and 1
    session = onnxruntime.InferenceSession(tmp_path / "out" / "model.onnx", providers=["CPUExecutionProvider"])
    (embeddings, _) = session.run(None, {"pixels": np.zeros((3, 20, 20), np.float32)})
    assert embeddings.shape == (3, 25, 5)  # a size neither verified: (20 / 4) ** 2 patches
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch_size", "side", "side"]  # a multiple named as planned, not torch.export's 4*side_div4


def test_the_higher_priority_wins_a_tie_is_refused_and_library_picks(make_pack, toy, tmp_path):
    toy_pack(make_pack, "toy_a")
    toy_pack(make_pack, "toy_b")
    with pytest.raises(opreg.CheckpointError, match=r"2 loaders of the same priority \(0\): toy_a:toy_a .*--library"):
        opreg.export_checkpoint(toy, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    picked = opreg.export_checkpoint(toy, tmp_path / "out", library="toy_b:toy_b", verify=False)
    assert picked.loader == "toy_b:toy_b" and picked.others == ("toy_a:toy_a",)
    toy_pack(make_pack, "toy_c", priority=5)
    assert opreg.export_checkpoint(toy, tmp_path / "out", verify=False).loader == "toy_c:toy_c"
    with pytest.raises(opreg.CheckpointError, match="--library nope: no loader of that library recognises"):
        opreg.export_checkpoint(toy, tmp_path / "out", library="nope")


BROKEN = """
import opreg


def recognise(checkpoint):
    raise RuntimeError("cannot read")


@opreg.hookimpl
def opreg_checkpoint_loaders():
    return [opreg.CheckpointLoader("bad", "toy", "anything", recognise, lambda c, t: None, priority=9),
            "not a loader"]
"""


def test_a_broken_loader_is_reported_against_its_pack_and_the_others_export(make_pack, toy, tmp_path, caplog):
    toy_pack(make_pack, "toy_a")
    make_pack("broken", BROKEN)
    with caplog.at_level(logging.WARNING, logger="opreg.packset"):
        result = opreg.export_checkpoint(toy, tmp_path / "out", verify=False)
    assert result.loader == "toy_a:toy_a"
    messages = [r.getMessage() for r in caplog.records]
    assert any("pack 'broken' failed in hook opreg_checkpoint_loaders: loader 'bad' recognising" in m
               and "raised RuntimeError: cannot read" in m for m in messages)  # fmt: skip
    assert any("'not a loader' is not an opreg.CheckpointLoader" in m for m in messages)
    with pytest.raises(opreg.PluginError, match="pack 'broken' failed in hook opreg_checkpoint_loaders"):
        opreg.export_checkpoint(toy, tmp_path / "out", registry=opreg.default_registry(strict=True),
                                host=opreg.default_host(strict=True))  # fmt: skip


POST_STEP = """
import onnxruntime


def combine(context):
    model = context.programs["model"].model
    assert context.folder is None and set(context.modules) == {"model"}
    return model


def loop(context):
    session = onnxruntime.InferenceSession(context.folder / "merged.onnx")
    (got, _) = session.run(None, {"pixels": np.ones((1, 8, 8), np.float32)})
    with torch.no_grad():
        want = context.modules["model"](torch.ones(1, 8, 8))["embeddings"].numpy()
    if not np.allclose(got, want, atol=1e-5):
        raise opreg.VerificationError("the loop differs")
    return f"{got.shape[1]} patches as eager"


import numpy as np

EXTRA.update(post_steps=(opreg.PostStep("merged", "merged.onnx", combine, drop=("model",)),),
             checks=(opreg.LoopCheck("loop", loop),), notes=("a note",))
"""


def test_a_post_step_combines_exported_models_and_a_loop_check_runs_the_written_folder(make_pack, toy, tmp_path):
    toy_pack(make_pack, "toy_a", extra=POST_STEP)
    result = opreg.export_checkpoint(toy, tmp_path / "out")
    assert list(result.files) == ["config/toy.json", "merged.onnx"]  # the dropped component's file is left out
    assert [m.name for m in result.models] == ["merged"] and result.checks == ("loop: 4 patches as eager",)
    assert result.notes == ("a note",)


DOTTED = """
import torch

import opreg


class Step(torch.nn.Module):
    def forward(self, **inputs):
        present = inputs["past.0.key"] + inputs["input_ids"].unsqueeze(-1)
        return {"present.0.key": present, "lambda.out": inputs["lambda"] * 2}


def recognise(checkpoint):
    return opreg.Recognition("dots", ("step",), "step", "dots.json") if checkpoint.has("dots.json") else None


def plan(checkpoint, task):
    inputs = (
        opreg.ModelInput("input_ids", ("batch", "length"), high=9),
        opreg.ModelInput("past.0.key", ("batch", "length", 4), "float32", "normal"),
        opreg.ModelInput("past_0_key", ("batch", "length", 4), "float32", "normal"),
        opreg.ModelInput("lambda", ("batch",), "float32", "normal"),
    )
    dims = (opreg.DynamicDim("batch", 2, 3), opreg.DynamicDim("length", 5, 2))
    model = opreg.Component("step", "step.onnx", Step, inputs, ("present.0.key", "lambda.out"), dims)
    return opreg.ExportPlan("dots", task, (model,))


@opreg.hookimpl
def opreg_checkpoint_loaders():
    return [opreg.CheckpointLoader("dots", "dots", "dots.json", recognise, plan)]
"""


def test_input_and_output_names_need_not_be_python_identifiers(make_pack, tmp_path):
    """optimum's names (``past_key_values.0.decoder.key``) are no identifiers, nor is a keyword: the
    forward parameters get identifiers (unique beside the inputs named so already), the ONNX
    model the component's names."""
    from opreg.checkpoint.inputs import parameter_names

    pack = importlib.import_module(make_pack("dots", DOTTED))
    (tmp_path / "dots").mkdir()
    (tmp_path / "dots" / "dots.json").write_text("{}")
    result = opreg.export_checkpoint(tmp_path / "dots", tmp_path / "out")
    model = onnx.load(tmp_path / "out" / "step.onnx")
    assert [i.name for i in model.graph.input] == ["input_ids", "past.0.key", "past_0_key", "lambda"]
    assert [o.name for o in model.graph.output] == ["present.0.key", "lambda.out"]
    assert len(result.models[0].verified) == 2
    component = pack.plan(opreg.Checkpoint(tmp_path / "dots"), "step").components[0]
    assert parameter_names(component) == ("input_ids", "past_0_key_1", "past_0_key", "lambda_")


def test_export_checkpoint_takes_the_export_options_but_those_the_loader_decides():
    import inspect

    parameters = inspect.signature(opreg.export_checkpoint).parameters
    assert {"task", "library", "verify", "target", "plugins", "settings"} <= set(parameters)
    assert "dynamic_shapes" not in parameters and "weights" not in parameters
    with pytest.raises(opreg.InvalidArgumentError, match="dynamic_shapes= is decided by the checkpoint's loader"):
        opreg.export_checkpoint(os.devnull, "out", dynamic_shapes="auto")


INVERSE = """
import torch


class Inverse(torch.nn.Module):
    def forward(self, matrix):
        return torch.linalg.inv(matrix)


def recognise(checkpoint):
    if checkpoint.has("inverse.json"):
        return opreg.Recognition("inverse", ("invert",), "invert", "inverse.json")
    return None


def plan(checkpoint, task):
    matrix = opreg.ModelInput("matrix", ("batch_size", 3, 3), "float32", "normal")
    batch = opreg.DynamicDim("batch_size", 2, 3)
    model = opreg.Component("model", "model.onnx", Inverse, (matrix,), ("inverse",), (batch,))
    return opreg.ExportPlan("inverse", task, (model,))


@opreg.hookimpl
def opreg_checkpoint_loaders():
    return [opreg.CheckpointLoader("inverse", "inverse", "inverse.json", recognise, plan)]
"""


def test_the_command_lists_every_op_without_an_impl_as_the_factory_form_does(make_pack, tmp_path, capsys):
    make_pack("inverse", INVERSE)
    folder = tmp_path / "inverse"
    folder.mkdir()
    (folder / "inverse.json").write_text("{}")
    assert cli.main(["export", str(folder), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "aten::linalg_inv_ex" in err and "export failed: 1 op(s) have no impl at target onnx" in err
    assert not (tmp_path / "out").exists()


def test_a_file_the_plan_requires_is_checked_before_anything_is_built(make_pack, tmp_path):
    """Here the model would also fail (no impl of linalg_inv): the missing file is what is said, first."""
    make_pack("inverse", INVERSE.replace("(model,))", '(model,), (opreg.FileCopy("weights.bin", required=True),))'))
    folder = tmp_path / "inverse"
    folder.mkdir()
    (folder / "inverse.json").write_text("{}")
    with pytest.raises(opreg.CheckpointError, match="has no weights.bin, which the inverse invert export needs"):
        opreg.export_checkpoint(folder, tmp_path / "out")


LEFT_OUT = ("scipy", "torchao", "torchvision")
"""What opreg-transformers keeps transformers from importing for a text checkpoint (``OPREG_LEAN_IMPORTS``)."""
IMPORTED = (
    "import json, sys; from opreg.cli import script; sys.argv = ['opreg', *sys.argv[1:]]; code = script(); "
    f"print(json.dumps([code, [name for name in {LEFT_OUT!r} if name in sys.modules]]))"
)


def _command_imports(bert: Path, out: Path, **env: str) -> tuple[int, list[str]]:
    """The ``opreg`` script's exit code exporting ``bert`` in a fresh process, and which of
    :data:`LEFT_OUT` it imported."""
    import subprocess
    import sys

    argv = [sys.executable, "-c", IMPORTED, "export", str(bert), "-o", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, check=False)
    code, imported = json.loads(proc.stdout.splitlines()[-1])
    return code, imported


def test_the_command_leaves_out_what_transformers_imports_for_other_uses_and_a_live_process_keeps_it(bert, tmp_path):
    """``opreg export`` (a process of one command) exports a text checkpoint without importing
    torchao, scipy or torchvision, verified as usual; ``OPREG_LEAN_IMPORTS=0`` imports them as
    transformers does when they are installed (the lock has them), as does the Python API."""
    installed = [name for name in LEFT_OUT if importlib.util.find_spec(name) is not None]
    assert installed, "the lock installs torchao, scipy and torchvision: nothing to leave out here"
    env = {name: value for name, value in os.environ.items() if name != "OPREG_LEAN_IMPORTS"}
    os.environ.pop("OPREG_LEAN_IMPORTS", None)
    try:
        assert _command_imports(bert, tmp_path / "lean") == (0, [])
        assert _command_imports(bert, tmp_path / "full", OPREG_LEAN_IMPORTS="0") == (0, installed)
    finally:
        os.environ.clear()
        os.environ.update(env)
    assert sorted(os.listdir(tmp_path / "lean")) == OPTIMUM_BERT_FILES


def test_what_an_export_leaves_out_depends_on_the_checkpoint():
    from opreg_transformers import lean

    assert lean.unused_packages({"model_type": "bert"}, vision=False) == ("scipy", "torchao", "torchvision")
    assert lean.unused_packages({"model_type": "vit"}, vision=True) == ("scipy", "torchao")
    quantized = {"model_type": "llama", "quantization_config": {"quant_method": "torchao"}}
    assert lean.unused_packages(quantized, vision=False) == ("scipy", "torchvision")
