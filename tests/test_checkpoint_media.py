"""``opreg export FOLDER`` on vision, vision-text and audio checkpoints (opreg-transformers'
loader, :mod:`opreg_transformers.media`): each family's folder, written by ``save_pretrained``
(tests/media_checkpoints.py), exported for the task its ``architectures`` say, laid out as
optimum-onnx 0.1.0 lays it out (``model.onnx``: input, output and dim names), verified against
PyTorch at two sizes by the export, and where its sides or its length vary, run by ONNX Runtime
at a third size from the file alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg
from opreg import cli
from tests import media_checkpoints

IMAGE = ["batch_size", 3, "height", "width"]
FIXED = ["batch_size", 3, 32, 32]  # the sides the config's image_size fixes


@dataclasses.dataclass(frozen=True)
class Case:
    """A checkpoint, the task inferred, and the model optimum lays out for it."""

    task: str
    inputs: dict[str, list]
    outputs: list[str]
    third: dict[str, tuple[int, ...]] | None = None  # a size the export did not verify, run from the file
    files: tuple[str, ...] = ("config.json", "model.onnx")


def pixels(height: int, width: int) -> dict[str, tuple[int, ...]]:
    return {"pixel_values": (1, 3, height, width)}


CLIP_INPUTS = {
    "input_ids": ["text_batch_size", "sequence_length"],
    "pixel_values": ["image_batch_size", 3, 32, 32],
    "attention_mask": ["text_batch_size", "sequence_length"],
}
ZERO_SHOT = ["logits_per_image", "logits_per_text", "text_embeds", "image_embeds"]
AUDIO = {"input_values": ["batch_size", "sequence_length"]}
WITH_PROCESSOR = ("config.json", "model.onnx", "preprocessor_config.json")

RT_DETR = Case(
    "object-detection",
    {"pixel_values": ["batch_size", 3, 64, 64]},
    ["logits", "pred_boxes"],
    pixels(64, 64),
    files=WITH_PROCESSOR,
)  # its sides are its processor's (64), only its batch varies: verified at 2 and 3, run here at 1

CASES = {
    "vit": Case("image-classification", {"pixel_values": ["batch_size", 3, 32, 32]}, ["logits"], files=WITH_PROCESSOR),
    "convnext": Case("image-classification", {"pixel_values": IMAGE}, ["logits"], pixels(160, 32)),
    "swin": Case("image-classification", {"pixel_values": ["batch_size", 3, 32, 32]}, ["logits"]),
    "vit-masked": Case("masked-im", {"pixel_values": ["batch_size", 3, 32, 32]}, ["reconstruction"]),
    "swin-masked": Case("masked-im", {"pixel_values": ["batch_size", 3, 32, 32]}, ["reconstruction"]),
    "dinov2": Case("image-classification", {"pixel_values": IMAGE}, ["logits"], pixels(32, 32)),  # its own size
    "detr": Case("object-detection", {"pixel_values": IMAGE}, ["logits", "pred_boxes"], pixels(50, 77)),
    "yolos": Case("object-detection", {"pixel_values": IMAGE}, ["logits", "pred_boxes"], pixels(32, 32)),
    "rt-detr": RT_DETR,
    "rt-detr-v2": RT_DETR,
    "segformer": Case("semantic-segmentation", {"pixel_values": IMAGE}, ["logits"], pixels(45, 38)),
    "dpt": Case("depth-estimation", {"pixel_values": ["batch_size", 3, 32, 32]}, ["predicted_depth"]),
    "dpt-segmenter": Case("semantic-segmentation", {"pixel_values": ["batch_size", 3, 32, 32]}, ["logits"]),
    "glpn": Case("depth-estimation", {"pixel_values": IMAGE}, ["predicted_depth"], pixels(40, 8)),
    "clip": Case("zero-shot-image-classification", CLIP_INPUTS, ZERO_SHOT),
    "clip-classifier": Case("image-classification", {"pixel_values": ["batch_size", 3, 32, 32]}, ["logits"]),
    "siglip": Case(
        "zero-shot-image-classification",
        {k: v for k, v in CLIP_INPUTS.items() if k != "attention_mask"},
        ZERO_SHOT,
        {"input_ids": (4, 20), "pixel_values": (1, 3, 32, 32)},
    ),
    "clip-vision": Case(
        "feature-extraction",
        {"pixel_values": ["batch_size", 3, 32, 32]},
        ["last_hidden_state", "pooler_output"],
        files=WITH_PROCESSOR,
    ),
    "wav2vec2-ctc": Case(
        "automatic-speech-recognition", AUDIO, ["logits"], {"input_values": (2, 16000)}, files=WITH_PROCESSOR
    ),
    "hubert-ctc": Case("automatic-speech-recognition", AUDIO, ["logits"], {"input_values": (1, 31)}, WITH_PROCESSOR),
    "wav2vec2-classifier": Case("audio-classification", AUDIO, ["logits"]),
    "hubert-classifier": Case("audio-classification", AUDIO, ["logits"], {"input_values": (3, 997)}),
    "wav2vec2-frames": Case("audio-frame-classification", AUDIO, ["logits"], {"input_values": (2, 997)}),
    "wav2vec2-xvector": Case("audio-xvector", AUDIO, ["logits", "embeddings"], {"input_values": (2, 997)}),
    "deit": Case("image-classification", {"pixel_values": FIXED}, ["logits"]),
    "beit": Case("image-classification", {"pixel_values": FIXED}, ["logits"]),
    "data2vec-vision": Case("feature-extraction", {"pixel_values": FIXED}, ["last_hidden_state"]),
    "vit-msn": Case("image-classification", {"pixel_values": FIXED}, ["logits"]),
    "convnextv2": Case("image-classification", {"pixel_values": IMAGE}, ["logits"], pixels(96, 64)),
    "resnet": Case("image-classification", {"pixel_values": IMAGE}, ["logits"], pixels(70, 99)),
    "regnet": Case("feature-extraction", {"pixel_values": IMAGE}, ["last_hidden_state"], pixels(99, 70)),
    "efficientnet": Case("image-classification", {"pixel_values": IMAGE}, ["logits"], pixels(70, 99)),
    "mobilenet-v1": Case("image-classification", {"pixel_values": FIXED}, ["logits"]),
    "mobilenet-v2": Case("feature-extraction", {"pixel_values": FIXED}, ["last_hidden_state"]),
    "levit": Case("image-classification", {"pixel_values": FIXED}, ["logits"]),
    "poolformer": Case("image-classification", {"pixel_values": IMAGE}, ["logits"], pixels(64, 131)),
    "pvt": Case("image-classification", {"pixel_values": FIXED}, ["logits"]),
    "cvt": Case("image-classification", {"pixel_values": IMAGE}, ["logits"], pixels(70, 99)),
    "swinv2-masked": Case("masked-im", {"pixel_values": FIXED}, ["reconstruction"]),
    "hiera": Case("image-classification", {"pixel_values": FIXED}, ["logits"]),
    "mobilevit-segmenter": Case("image-segmentation", {"pixel_values": ["batch_size", 3, 64, 64]}, ["logits"]),
    "table-transformer": Case("object-detection", {"pixel_values": IMAGE}, ["logits", "pred_boxes"], pixels(50, 77)),
    "wavlm-ctc": Case("automatic-speech-recognition", AUDIO, ["logits"], {"input_values": (2, 997)}),
    "unispeech-classifier": Case("audio-classification", AUDIO, ["logits"], {"input_values": (1, 31)}),
    "unispeech-sat-frames": Case("audio-frame-classification", AUDIO, ["logits"], {"input_values": (3, 500)}),
    "sew-ctc": Case("automatic-speech-recognition", AUDIO, ["logits"], {"input_values": (2, 997)}),
    "sew-d-classifier": Case("audio-classification", AUDIO, ["logits"], {"input_values": (2, 997)}),
    "data2vec-audio-xvector": Case("audio-xvector", AUDIO, ["logits", "embeddings"], {"input_values": (2, 997)}),
    "wav2vec2-conformer-ctc": Case("automatic-speech-recognition", AUDIO, ["logits"], {"input_values": (2, 997)}),
    "ast": Case("audio-classification", {"input_values": ["batch_size", 24, 16]}, ["logits"]),
}


def dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_family_is_exported_for_its_task_as_optimum_lays_it_out(name, tmp_path):
    case = CASES[name]
    folder = media_checkpoints.save(name, tmp_path / name)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.library, result.task, result.inferred) == ("transformers", case.task, True)
    assert result.files == case.files
    assert [len(m.verified) for m in result.models] == [2]  # at the example and the second size
    model = onnx.load(tmp_path / "out" / "model.onnx")
    assert {v.name: dims(v) for v in model.graph.input} == case.inputs
    assert list(case.inputs) == [v.name for v in model.graph.input]  # optimum's order
    assert [v.name for v in model.graph.output] == case.outputs
    if case.third is not None:
        run_at(tmp_path / "out" / "model.onnx", folder, case, result.models[0].program.output_names)


def run_at(path: Path, folder: Path, case: Case, outputs: tuple[str, ...]) -> None:
    """The file in ONNX Runtime at ``case.third``, against the checkpoint loaded by transformers."""
    import transformers
    from opreg_transformers import media

    generator = torch.Generator().manual_seed(1)
    feeds = {
        name: torch.randint(0, 99, shape, generator=generator) if name == "input_ids" else
        torch.randn(shape, generator=generator)
        for name, shape in case.third.items()
    }  # fmt: skip
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    eager = getattr(transformers, media.TASKS[case.task][0]).from_pretrained(folder).eval()
    with torch.no_grad():
        want = eager(**feeds)
    for name, value in zip(outputs, got, strict=True):
        np.testing.assert_allclose(value, want[name].numpy(), rtol=1e-4, atol=1e-4, err_msg=name)


def test_a_task_the_family_cannot_do_is_refused_and_one_it_can_is_exported_when_asked(tmp_path, capsys):
    folder = media_checkpoints.save("vit", tmp_path / "vit")
    out = tmp_path / "out"
    assert cli.main(["export", str(folder), "-o", str(out), "--task", "object-detection"]) == 2
    err = capsys.readouterr().err
    assert "cannot be exported for task 'object-detection'" in err and "feature-extraction, image-classification" in err
    assert not out.exists()
    result = opreg.export_checkpoint(folder, out, task="feature-extraction")
    model = onnx.load(out / "model.onnx")
    assert (result.task, result.inferred) == ("feature-extraction", False)
    assert {v.name: dims(v) for v in model.graph.output} == {"last_hidden_state": ["batch_size", 17, 32]}


def test_image_segmentation_is_optimums_other_name_of_semantic_segmentation(tmp_path):
    folder = media_checkpoints.save("dpt-segmenter", tmp_path / "dpt")
    result = opreg.export_checkpoint(folder, tmp_path / "out", task="image-segmentation")
    model = onnx.load(tmp_path / "out" / "model.onnx")
    assert (result.task, [len(m.verified) for m in result.models]) == ("image-segmentation", [2])
    assert {v.name: dims(v) for v in model.graph.input} == {"pixel_values": ["batch_size", 3, 32, 32]}
    assert [v.name for v in model.graph.output] == ["logits"]


def test_a_detr_config_written_by_transformers_4_is_read_with_its_nulls_as_the_defaults(tmp_path):
    """transformers 4.57 writes ``dilation`` and ``backbone_kwargs`` as ``null``; transformers 5's
    DetrConfig refuses ``dilation: null``. The export reads both as the defaults and says so."""
    import json

    import transformers

    folder = media_checkpoints.save("detr", tmp_path / "detr")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dilation": None, "backbone_kwargs": None}))
    with pytest.raises(Exception, match="'dilation'"):  # what transformers 5 does with the file
        transformers.AutoConfig.from_pretrained(folder)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, [len(m.verified) for m in result.models]) == ("object-detection", [2])
    assert any("read dilation: null and backbone_kwargs: null as DetrConfig's defaults" in n for n in result.notes)


STALE = {
    "beit": (
        {"stage_names": ["stem", *(f"stage{i}" for i in range(1, 13))], "out_features": ["stage12"],
         "out_indices": [12]},
        "out_features must be a subset of stage_names",
        "read stage_names, out_features, out_indices (not the stages of its 2 layers) as BeitConfig's defaults",
    ),
    "pvt": (
        {"num_labels": None, "id2label": {str(i): f"LABEL_{i}" for i in range(3)}},
        "ignore_mismatched_sizes",  # its classifier has 3 labels, not 1000
        None,
    ),
}  # fmt: skip
"""``{checkpoint: (config.json fields set (None: removed), what transformers 5 does with the file, the note)}``:
a BEiT's backbone stages left at 12 layers' when its layers were cut to 2 after the config was built,
a PVT's labels given by ``id2label`` only, as transformers 4.57 writes them."""


@pytest.mark.parametrize("name", sorted(STALE))
def test_a_config_transformers_4_wrote_is_read_as_it_meant(name, tmp_path):
    import json

    import transformers

    fields, refusal, note = STALE[name]
    folder = media_checkpoints.save(name, tmp_path / name)
    config = {**json.loads((folder / "config.json").read_text()), **fields}
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    with pytest.raises(Exception, match=refusal):  # what transformers 5 does with the file
        model_class = media_checkpoints.CHECKPOINTS[name][0]
        getattr(transformers, model_class).from_pretrained(folder)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.task, [len(m.verified) for m in result.models]) == ("image-classification", [2])
    assert note is None or any(note in n for n in result.notes)


def test_a_whisper_folder_is_refused_with_a_pointer_to_opreg_llm_export(tmp_path):
    folder = tmp_path / "whisper"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]}'
    )
    with pytest.raises(opreg.CheckpointError, match=r"model_type 'whisper' .*`opreg llm export`"):
        opreg.export_checkpoint(folder, tmp_path / "out")


@pytest.mark.parametrize(("name", "patch"), [("rt-detr", "rt_detr_batch_len"), ("rt-detr-v2", "rt_detr_v2_batch_len")])
def test_rt_detr_is_refused_a_task_other_than_detection_and_its_batch_len_patch_is_applied(
    name, patch, tmp_path, capsys
):
    """RT-DETR's (and RT-DETRv2's) sides are fixed at its processor's size and its task is object
    detection only; the export applies opreg-transformers' patch of its ``len()`` of the batch,
    without which torch.export fixes the batch."""
    folder = media_checkpoints.save(name, tmp_path / name)
    out = tmp_path / "out"
    assert cli.main(["export", str(folder), "-o", str(out), "--task", "feature-extraction"]) == 2
    assert "cannot be exported for task 'feature-extraction'" in capsys.readouterr().err
    assert not out.exists()
    result = opreg.export_checkpoint(folder, out)
    outcomes = {o.label: o.status for o in result.models[0].program.capture_patches}
    assert outcomes[f"transformers:{patch}"] == "applied"
    with pytest.raises(opreg.OpregError, match="batch_size"):
        opreg.export_checkpoint(folder, tmp_path / "unpatched", exclude_patches=[f"transformers:{patch}"])
