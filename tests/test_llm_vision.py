"""Vision-language models for ONNX Runtime GenAI: ``opreg.llm.export_vision`` and ``opreg llm export``
write the vision encoder, the embedding model, the decoder on embeddings, ``genai_config.json``,
GenAI's image recipe and the tokenizer; with GenAI's own image processing an image-plus-text
prompt generates eager ``generate``'s greedy tokens.

Tiny random-init models and PNG images at the image processors' sizes (tests/vision_models.py):
nothing is downloaded. Numerics are compared with transformers (rtol=atol=1e-4, float32).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
import torch

import opreg
from tests import vision_models as vm
from tests.test_cli import run

LENGTH = 12
FILES = [
    "embedding.onnx", "embedding.onnx.*.data", "genai_config.json", "model.onnx", "model.onnx.*.data",
    "preprocessor_config.json", "processor_config.json", "tokenizer.json", "tokenizer_config.json", "vision.onnx",
    "vision.onnx.*.data",
]  # fmt: skip


def files(names) -> list[str]:
    return sorted(re.sub(r"\.onnx\.[0-9a-f]+\.data$", ".onnx.*.data", name) for name in names)


def dims(value):
    return [d if isinstance(d, int) else d.value for d in value.shape]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """A Gemma-3 exported through ``opreg llm export`` from a checkpoint folder, and an image."""
    root = tmp_path_factory.mktemp("gemma3")
    model = vm.gemma3()
    checkpoint = root / "checkpoint"
    model.save_pretrained(checkpoint)
    vm.tokenizer(vm.GEMMA3_TOKENS).save_pretrained(checkpoint)
    vm.gemma3_processor().save_pretrained(checkpoint)
    exported = opreg.llm.export_vision(checkpoint, root / "genai")
    return model, exported, root / "genai", vm.image(root / "image.png", vm.GEMMA3_IMAGE, vm.GEMMA3_IMAGE)


def test_gemma3_has_genai_names_and_every_length_dynamic(gemma3):
    _, exported, folder, _ = gemma3
    vision, embedding, decoder = (p.model.graph for p in (exported.vision, exported.embedding, exported.decoder))
    assert [(v.name, dims(v)) for v in vision.inputs] == [("pixel_values", ["num_images", 3, 64, 64])]
    assert [(v.name, dims(v)) for v in vision.outputs] == [("image_features", ["num_images", 256, 64])]
    assert [(v.name, dims(v)) for v in embedding.inputs] == [
        ("input_ids", ["batch_size", "sequence_length"]), ("image_features", ["num_images", "num_image_tokens", 64])
    ]  # fmt: skip
    assert [(v.name, dims(v)) for v in embedding.outputs] == [("inputs_embeds", ["batch_size", "sequence_length", 64])]
    by_name = {v.name: dims(v) for v in [*decoder.inputs, *decoder.outputs]}
    assert by_name["inputs_embeds"] == ["batch_size", "sequence_length", 64]
    assert by_name["input_ids"] == ["batch_size", "sequence_length"]  # an image's tokens see each other: read here
    assert by_name["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert by_name["position_ids"] == ["batch_size", "sequence_length"]
    assert by_name["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 16]
    assert by_name["present.0.key"] == ["batch_size", 2, "total_sequence_length", 16]
    assert by_name["logits"] == ["batch_size", "sequence_length", vm.VOCAB]
    assert files(p.name for p in folder.iterdir()) == FILES
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "gemma3" and config["vision"]["config_filename"] == "processor_config.json"
    assert (
        config["decoder"]["inputs"]["inputs_embeds"] == "inputs_embeds"
        and config["decoder"]["filename"] == "model.onnx"
    )
    assert config["embedding"]["inputs"] == {"input_ids": "input_ids", "image_features": "image_features"}
    recipe = json.loads((folder / "processor_config.json").read_text())["processor"]["transforms"]
    assert [step["operation"]["type"] for step in recipe] == [
        "DecodeImage",
        "Resize",
        "Rescale",
        "Normalize",
        "Permute3D",
    ]


def test_gemma3_matches_transformers(gemma3):
    _, exported, _, _ = gemma3
    checks = exported.verify()  # vision at 1 and 2 images, embedding with and without images, decoder, all three
    labels = {c.name for c in checks}
    assert {
        "image_features (2 images)", "inputs_embeds (batch 2, 0 image tokens)", "logits (batch 3, sequence 7, past 5)",
        "present.1.value (batch 1, sequence 7, past 0)",
    } <= labels  # fmt: skip
    assert any(name.startswith("logits (an image and a prompt") for name in labels)
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4


def test_verify_fails_when_the_models_do_not_match(gemma3):
    _, exported, _, _ = gemma3
    original = exported.model
    exported.model = vm.gemma3(seed=1)
    try:
        with pytest.raises(opreg.VerificationError, match="model outputs differ from transformers'"):
            exported.verify()
    finally:
        exported.model = original


def test_genai_runs_gemma3_with_its_image_processing_and_generates_eager_greedy_tokens(gemma3):
    from PIL import Image

    model, exported, folder, image = gemma3
    tokens, made = vm.genai_generate(folder, "<start_of_image>the quick", image, LENGTH)
    pixels = vm.gemma3_processor()(Image.open(image), return_tensors="pt").pixel_values
    np.testing.assert_allclose(made["pixel_values"], pixels.numpy(), rtol=0, atol=1e-6)  # GenAI's recipe
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    image_token = model.config.image_token_id
    assert (ids == image_token).sum() == 256  # GenAI expanded <start_of_image> as Gemma-3's processor does
    expected = vm.greedy(model, LENGTH, input_ids=ids, pixel_values=pixels, attention_mask=torch.ones_like(ids),
                         token_type_ids=(ids == image_token).long())  # fmt: skip
    assert tokens == expected and len(set(expected[ids.shape[1] :])) > 2
    assert exported.generate(ids, (pixels,), len(expected)) == expected  # the same, in plain ONNX Runtime


def test_cli_llm_export_picks_the_vision_export_for_a_vision_language_checkpoint(gemma3, tmp_path, capsys):
    model, _, _, _ = gemma3
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    vm.tokenizer(vm.GEMMA3_TOKENS).save_pretrained(checkpoint)
    out = tmp_path / "out"
    code, stdout, _ = run(capsys, "llm", "export", str(checkpoint), "-o", str(out), "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert list(summary["models"]) == ["vision.onnx", "embedding.onnx", "model.onnx"]
    assert files(summary["files"]) == FILES  # the image processor: Gemma-3's default at the model's size


def test_a_failed_save_leaves_no_folder_and_an_existing_one_without_a_genai_config(gemma3, tmp_path):
    """The three models' folder is written as the text decoder's: a new folder is removed again if
    writing fails; ``genai_config.json``, which makes a folder a GenAI model, is written last."""
    _, exported, _, _ = gemma3
    tokenizer, exported.tokenizer = exported.tokenizer, object()
    try:
        with pytest.raises(opreg.ExportError, match="tokenizer= takes a transformers tokenizer"):
            exported.save(tmp_path / "new")
        assert not (tmp_path / "new").exists()
        (tmp_path / "old").mkdir()
        with pytest.raises(opreg.ExportError, match="tokenizer= takes a transformers tokenizer"):
            exported.save(tmp_path / "old")
        assert not (tmp_path / "old" / "genai_config.json").exists()
    finally:
        exported.tokenizer = tokenizer
    with pytest.raises(opreg.SaveError, match="does not exist; create it first"):
        exported.save(tmp_path / "missing" / "folder")


def test_a_vision_language_model_genai_cannot_run_is_refused_and_so_is_an_unknown_architecture():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    model = vm.gemma3()
    config = Gemma3Config(
        text_config=dict(vm.TEXT), vision_config=model.config.vision_config.to_dict(), mm_tokens_per_image=64
    )
    with pytest.raises(opreg.ExportError, match="makes 64 tokens an image: ONNX Runtime GenAI's gemma3 pipeline"):
        opreg.llm.export_vision(Gemma3ForConditionalGeneration(config))
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}  # fmt: skip
    config = PaliGemmaConfig(text_config=dict(vm.TEXT), vision_config=vision)  # it sets model_type in the dict given
    paligemma = PaliGemmaForConditionalGeneration(config)
    with pytest.raises(opreg.ExportError, match="is a vision-language model export_vision has no architecture for"):
        opreg.llm.export_vision(paligemma)


def test_repeated_siglip_and_decoder_layers_are_captured_once(caplog):
    """Gemma-3's SigLIP layers are all alike: one layer after the first is captured, the third is
    a copy; its decoder's sliding and full layers alternate, a kind each. Each copy reads its own
    weights and cache (random: a mix-up shows); the three models match transformers."""
    model = vm.gemma3(text_layers=4, vision_layers=3)
    with caplog.at_level("INFO", logger="opreg.llm"):
        exported = opreg.llm.export_vision(model)
    assert "captured the first 2 of 3 layers; the others are copies (model.vision_tower.encoder.layers)" in caplog.text
    assert "captured the first 3 of 4 layers; the others are copies (model.language_model.layers)" in caplog.text
    exported.verify()


def _qwen_processor(patch: int) -> Any:
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor(patch_size=patch, temporal_patch_size=2, merge_size=2, min_pixels=64,
                                 max_pixels=64 * 64)  # fmt: skip


def _clip_processor(size: int) -> Any:
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})


@pytest.mark.parametrize(
    ("model", "processor", "message"),
    [
        (
            vm.qwen2_5_vl,
            lambda: _qwen_processor(2 * vm.QWEN_PATCH),
            "the image processor's patch_size is 8, the model's",
        ),
        (vm.llava, lambda: _clip_processor(2 * vm.LLAVA_IMAGE), "the image processor makes 64x64 images, the model's"),
    ],
    ids=["qwen-patch", "llava-size"],
)
def test_an_image_processor_that_contradicts_the_model_is_refused_before_the_export(
    model, processor, message, tmp_path
):
    """Issue 53: a processor whose patch size contradicts the model was written into the folder unchecked
    (Whisper's feature extractor's mel bins are checked). Refused before the models are captured, given or in
    a folder, and nothing is written."""
    given = processor()
    given.save_pretrained(tmp_path / "processor")
    for where in (given, tmp_path / "processor"):
        with pytest.raises(opreg.ExportError, match=re.escape(message)):
            opreg.llm.export_vision(model(), tmp_path / "genai", image_processor=where)
    assert not (tmp_path / "genai").exists()


@pytest.mark.parametrize(
    ("model", "processor"),
    [(vm.qwen2_5_vl, vm.qwen_processor), (vm.llava, vm.llava_processor), (vm.gemma3, vm.gemma3_processor)],
    ids=["qwen", "llava", "gemma3"],
)
def test_the_models_own_image_processor_passes_the_check(model, processor):
    from opreg.llm._vision_models import architecture_of

    built = model()
    architecture = architecture_of(built)
    architecture.check_processor(built, processor())  # the one the model's tests run GenAI with
    architecture.check_processor(built, architecture.default_image_processor(built))  # what opreg writes without one
