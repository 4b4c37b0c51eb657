"""opreg-diffusers: ``opreg export`` on diffusers pipeline folders (Stable Diffusion, SDXL, SD3, Flux).

Tiny random pipelines (:mod:`tests.diffusion_pipelines`) are saved once per session and each is
exported once (its models verified against PyTorch at two shapes, then the denoising loop run on
the written folder); the tests read those results. The refusals need no export.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

import opreg
from opreg import cli
from opreg_diffusers import loaders, loop
from tests import diffusion_pipelines

SLOW = pytest.mark.slow(reason="exports a whole pipeline (4 to 6 models, each verified at two shapes) and runs four "
                        "denoising loops: 20-30 s of CPU")  # fmt: skip
FAMILIES = [pytest.param(name, marks=SLOW) for name in diffusion_pipelines.PIPELINES]

CLIP = {"input_ids": ["batch_size", "sequence_length"]}
UNET = {
    "sample": ["batch_size", 4, "height", "width"],
    "timestep": [],
    "encoder_hidden_states": ["batch_size", "sequence_length", None],
}
VAE = {
    "vae_encoder": ({"sample": ["batch_size", 3, "sample_height", "sample_width"]}, ["latent_parameters"]),
    "vae_decoder": ({"latent_sample": ["batch_size", None, "latent_height", "latent_width"]}, ["sample"]),
}
SD3 = {
    "hidden_states": ["batch_size", 16, "height", "width"],
    "encoder_hidden_states": ["batch_size", "sequence_length", None],
    "pooled_projections": ["batch_size", None],
    "timestep": ["batch_size"],
}
FLUX = {
    "hidden_states": ["batch_size", "packed_height_width", 4],
    "encoder_hidden_states": ["batch_size", "sequence_length", None],
    "pooled_projections": ["batch_size", None],
    "timestep": ["batch_size"],
    "img_ids": ["packed_height_width", 3],
    "txt_ids": ["sequence_length", 3],
}
LAYERS = tuple(f"hidden_states.{i}" for i in range(3))  # the embeddings and each of the 2 layers
CLIP_TEXT, CLIP_PROJECTED = ("last_hidden_state", "pooler_output"), ("text_embeds", "last_hidden_state")
LAYOUTS = {
    "stable-diffusion": {
        "text_encoder": (CLIP, CLIP_TEXT),
        "unet": (UNET, ("out_sample",)),
    },
    "stable-diffusion-xl": {
        "text_encoder": (CLIP, CLIP_TEXT + LAYERS),
        "text_encoder_2": (CLIP, CLIP_PROJECTED + LAYERS),
        "unet": ({**UNET, "text_embeds": ["batch_size", 32], "time_ids": ["batch_size", 6]}, ("out_sample",)),
    },
    "stable-diffusion-3": {
        "text_encoder": (CLIP, CLIP_PROJECTED + LAYERS),
        "text_encoder_2": (CLIP, CLIP_PROJECTED + LAYERS),
        "text_encoder_3": (CLIP, ("last_hidden_state",)),
        "transformer": (SD3, ("out_hidden_states",)),
    },
    "flux": {
        "text_encoder": (CLIP, CLIP_TEXT),
        "text_encoder_2": (CLIP, ("last_hidden_state",)),
        "transformer": (FLUX, ("out_hidden_states",)),
    },
}
"""Each family's models as optimum-onnx 0.1.0 lays them out (``UNetOnnxConfig``, ...): the inputs in
order with their dims (``None``: a size of the config, not checked here), the outputs in order."""
PIPELINE_CLASSES = {
    "stable-diffusion": "StableDiffusion",
    "stable-diffusion-xl": "StableDiffusionXL",
    "stable-diffusion-3": "StableDiffusion3",
    "flux": "Flux",
}


@pytest.fixture(scope="session")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("diffusers")
    return {family: diffusion_pipelines.save(family, root / family) for family in diffusion_pipelines.PIPELINES}


def _ends(values: list[onnx.ValueInfoProto]) -> dict[str, list[str | int | None]]:
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def _matches(got: list[str | int], want: list[str | int | None]) -> bool:
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pipeline_is_exported_as_optimum_lays_it_out_and_its_loop_gives_diffusers_image(family, pipelines, tmp_path):
    """One export per family (the longest part of this module), then everything read from it: the
    layout, each model verified at two shapes, the denoising loop of the export and those of the other
    two tasks on the same folder, and a loop that fails once the folder's denoiser is changed."""
    result = opreg.export_checkpoint(pipelines[family], tmp_path / "onnx")
    assert (result.library, result.loader, result.task, result.inferred) == (
        "diffusers", "diffusers:diffusers", "text-to-image", True,
    )  # fmt: skip
    assert f"_class_name '{PIPELINE_CLASSES[family]}Pipeline'" in result.evidence
    check_layout(result, pipelines[family], {**LAYOUTS[family], **VAE})
    (summary,) = result.checks
    assert summary.startswith(f"denoising: {PIPELINE_CLASSES[family]}Pipeline, 2 steps at ")
    assert "ONNX Runtime within" in summary and "tolerance 2.0e-03" in summary
    check_other_tasks(family, opreg.Checkpoint(pipelines[family]), result.folder)
    check_a_changed_folder_fails(opreg.Checkpoint(pipelines[family]), result.folder, tmp_path / "changed")


def check_layout(result: opreg.CheckpointExport, source: Path, layout: dict[str, tuple[dict, tuple]]) -> None:
    assert [m.file for m in result.models] == [f"{name}/model.onnx" for name in layout]
    names = {p.relative_to(source).as_posix() for p in source.rglob("*.json")}
    copied = {f for f in names if f.split("/")[0] in ("scheduler", "tokenizer", "tokenizer_2", "tokenizer_3")}
    configs = {f"{name}/config.json" for name in layout}
    assert set(result.files) == {"model_index.json", *copied, *configs, *(m.file for m in result.models)}
    vae = (source / "vae" / "config.json").read_bytes()
    assert (result.folder / "vae_decoder" / "config.json").read_bytes() == vae  # the VAE's config, twice
    for name, (inputs, outputs) in layout.items():
        model = onnx.load(result.folder / name / "model.onnx")
        onnx.checker.check_model(model, full_check=True)
        assert {o.domain for o in model.opset_import} == {""}, name
        got = _ends(list(model.graph.input))
        assert list(got) == list(inputs) and all(_matches(got[k], v) for k, v in inputs.items()), (name, got)
        assert [o.name for o in model.graph.output] == list(outputs), name
    for model in result.models:
        assert len(model.verified) == 2, model.file  # at the example and the second sizes


def check_other_tasks(family: str, checkpoint: opreg.Checkpoint, folder: Path) -> None:
    """Image-to-image and inpainting run on the folder written for text-to-image (the same models):
    the VAE's encoder joins the loop. The stand-ins pass the models nothing they do not take."""
    for task, kind in (("image-to-image", "Img2ImgPipeline"), ("inpainting", "InpaintPipeline")):
        plan = loaders.plan(checkpoint, task)
        (check,) = plan.checks
        said = check.run(opreg.CheckContext(checkpoint, plan, {}, {}, folder))
        assert said.startswith(f"{PIPELINE_CLASSES[family]}{kind}, 4 steps at "), said
    session = loop.Session(folder / "text_encoder" / "model.onnx")
    ids = torch.zeros((1, 4), dtype=torch.int64)
    assert session(input_ids=ids, attention_mask=None)["last_hidden_state"].shape == (1, 4, 32)
    with pytest.raises(opreg.VerificationError, match="passed attention_mask to .* which takes input_ids"):
        session(input_ids=ids, attention_mask=torch.ones(1, 4))


def check_a_changed_folder_fails(checkpoint: opreg.Checkpoint, folder: Path, changed: Path) -> None:
    """The denoiser's output layer 20 % off: each model of the folder still loads and the pipeline
    runs, but the image differs, and the check says so. (On the tiny SD, 5 % off moves the image by
    8e-3, 1 % by 1.6e-3, within the tolerance: small errors are for each model's own verification,
    at 1e-4, to catch.)"""
    shutil.copytree(folder, changed)
    denoiser = next(changed / name / "model.onnx" for name in ("unet", "transformer") if (changed / name).is_dir())
    model = onnx.load(denoiser)
    outputs = [t for t in model.graph.initializer if t.name.endswith(("conv_out.weight", "proj_out.weight"))]
    weight = min(outputs, key=lambda t: len(t.name))  # the model's own, not a block's
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * 1.2, weight.name))
    onnx.save(model, denoiser)
    plan = loaders.plan(checkpoint, "text-to-image")
    with pytest.raises(opreg.VerificationError, match=r"image in ONNX Runtime NOT within .* of diffusers'"):
        plan.checks[0].run(opreg.CheckContext(checkpoint, plan, {}, {}, changed))
    shutil.rmtree(changed / "tokenizer")  # what the runtime reads beside the models
    with pytest.raises(opreg.VerificationError, match="Pipeline fails on the folder .* where it runs on the checkpo"):
        plan.checks[0].run(opreg.CheckContext(checkpoint, plan, {}, {}, changed))


# -- refused before any export ---------------------------------------------------------------------


def _copy(pipelines: dict[str, Path], family: str, tmp_path: Path) -> Path:
    folder = tmp_path / family
    shutil.copytree(pipelines[family], folder)
    return folder


def _edit_index(folder: Path, **entries: object) -> None:
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, **entries}))


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(["export", *argv]) == 2
    return capsys.readouterr().err


def test_a_missing_pipeline_component_is_refused_before_any_export_naming_it(pipelines, tmp_path, capsys):
    out = tmp_path / "out"
    no_unet = _copy(pipelines, "stable-diffusion", tmp_path)
    shutil.rmtree(no_unet / "unet")
    err = refused(capsys, str(no_unet), "-o", str(out))
    assert "has no unet/: the pipeline's component unet (diffusers.UNet2DConditionModel" in err
    assert "download the complete pipeline" in err
    no_weights = _copy(pipelines, "flux", tmp_path)
    (no_weights / "text_encoder_2" / "model.safetensors").unlink()
    assert "has no text_encoder_2/ weights" in refused(capsys, str(no_weights), "-o", str(out))
    no_scheduler = _copy(pipelines, "stable-diffusion-3", tmp_path)
    (no_scheduler / "scheduler" / "scheduler_config.json").unlink()
    assert "has no scheduler/scheduler_config.json: the pipeline's component scheduler" in refused(
        capsys, str(no_scheduler), "-o", str(out)
    )
    unnamed = _copy(pipelines, "stable-diffusion-xl", tmp_path)
    _edit_index(unnamed, text_encoder_2=[None, None])
    err = refused(capsys, str(unnamed), "-o", str(out))
    assert "names no text_encoder_2 (it has [None, None]), which a stable-diffusion-xl pipeline needs" in err
    assert not out.exists()  # nothing was written


def test_what_the_pack_does_not_export_is_refused_naming_it(pipelines, tmp_path, capsys):
    out = tmp_path / "out"
    other = _copy(pipelines, "stable-diffusion", tmp_path)
    _edit_index(other, _class_name="KandinskyPipeline")
    err = refused(capsys, str(other), "-o", str(out))
    assert "pipeline 'KandinskyPipeline'" in err and "is not one opreg-diffusers exports yet" in err
    _edit_index(other, _class_name="StableDiffusionPipeline", unet=["diffusers", "UNet2DModel"])
    (other / "unet" / "config.json").write_text("{}")
    err = refused(capsys, str(other), "-o", str(out))
    assert "unet is a diffusers.UNet2DModel, which opreg-diffusers does not export" in err
    broken = _copy(pipelines, "flux", tmp_path)
    (broken / "text_encoder" / "config.json").write_text('{"model_type": "clip_text_model", "hidden_size": "wide"}')
    assert "text_encoder/config.json cannot be built by transformers" in refused(capsys, str(broken), "-o", str(out))
    err = refused(capsys, str(pipelines["flux"]), "-o", str(out), "--task", "fill-mask")
    assert "cannot be exported for task 'fill-mask'" in err and "text-to-image, image-to-image, inpainting" in err
    assert not out.exists()


def test_the_inferred_task_follows_the_pipeline_class(pipelines, tmp_path):
    folder = _copy(pipelines, "stable-diffusion-xl", tmp_path)
    for class_name, task in (("StableDiffusionXLImg2ImgPipeline", "image-to-image"),
                             ("StableDiffusionXLInpaintPipeline", "inpainting")):  # fmt: skip
        _edit_index(folder, _class_name=class_name)
        recognition = loaders.recognise(opreg.Checkpoint(folder))
        assert recognition is not None and recognition.task == task
    assert loaders.recognise(opreg.Checkpoint(folder / "unet")) is None  # a component's folder is not a pipeline


def test_planning_reads_configs_only_and_each_dim_keeps_what_the_model_needs(pipelines):
    """The plan (no weights loaded) bounds what torch.export cannot keep dynamic: the UNet's batch
    below diffusers' ``.contiguous()`` branch at 64, its sides multiples of its upsampling, SD3's
    sides even patches fewer than its position table's."""
    sd = loaders.plan(opreg.Checkpoint(pipelines["stable-diffusion"]), "text-to-image")
    unet = next(c for c in sd.components if c.name == "unet")
    assert (unet.dim("batch_size").max, unet.dim("height").multiple, unet.dim("width").multiple) == (63, 2, 2)
    sd3 = loaders.plan(opreg.Checkpoint(pipelines["stable-diffusion-3"]), "text-to-image")
    transformer = next(c for c in sd3.components if c.name == "transformer")
    assert (transformer.dim("height").multiple, transformer.dim("height").max) == (2, 94)  # pos_embed_max_size 96
    assert transformer.dim("batch_size").max is None
    text = next(c for c in sd3.components if c.name == "text_encoder")
    assert text.dim("sequence_length").max == diffusion_pipelines.PROMPT_TOKENS
    assert sd.files[0] == opreg.FileCopy("model_index.json", required=True)


def test_importing_the_pack_and_its_loaders_imports_neither_torch_nor_diffusers():
    code = (
        "import sys, opreg_diffusers; from opreg_diffusers import loaders; "
        "print(sorted(m for m in ('torch', 'diffusers', 'transformers', 'onnxruntime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
