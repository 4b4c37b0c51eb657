"""Mistral3 for ONNX Runtime GenAI (``opreg.llm.export_vision``): a Pixtral vision encoder for
images of any size (2-D rotary positions, patches merged 2x2), a Mistral decoder; with GenAI's own
image processing (its ``mistral3`` pipeline: ``[IMG]`` expanded to rows of image tokens ended by
``[IMG_BREAK]`` and ``[IMG_END]``) an image-plus-text prompt generates eager ``generate``'s greedy
tokens, and so does the plain ONNX Runtime loop.

A tiny random-init model and a PNG image (tests/vision_models.py): nothing is downloaded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import opreg
from tests import vision_models as vm
from tests.test_llm_vision import FILES, LENGTH, dims, files

PROMPT = "[INST][IMG]the quick"


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistral3")
    return vm.exported_folder(root, vm.mistral3(), vm.MISTRAL3_TOKENS, vm.mistral3_processor(), (32, 48))


def test_mistral3_has_genai_names_and_every_length_dynamic(mistral3):
    _, exported, folder, _ = mistral3
    vision, embedding, decoder = (p.model.graph for p in (exported.vision, exported.embedding, exported.decoder))
    assert [(v.name, dims(v)) for v in vision.inputs] == [("pixel_values", [1, 3, "height", "width"])]
    assert [(v.name, dims(v)) for v in vision.outputs] == [("image_features", ["num_image_tokens", 64])]
    assert dims(embedding.inputs[1]) == ["num_image_tokens", 64]
    by_name = {v.name: dims(v) for v in [*decoder.inputs, *decoder.outputs]}
    assert "input_ids" not in by_name and by_name["position_ids"] == ["batch_size", "sequence_length"]
    assert by_name["present.1.value"] == ["batch_size", 2, "total_sequence_length", 16]
    assert files(p.name for p in folder.iterdir()) == FILES
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert (config["type"], config["image_token_id"]) == ("mistral3", 300)
    assert (config["vision"]["patch_size"], config["vision"]["spatial_merge_size"]) == (vm.MISTRAL3_PATCH, 2)
    recipe = json.loads((folder / "processor_config.json").read_text())["processor"]["transforms"]
    steps = [step["operation"]["type"] for step in recipe]
    assert steps == ["DecodeImage", "Resize", "Rescale", "Normalize", "Permute3D", "PixtralImageSizes"]


def test_mistral3_matches_transformers_at_several_image_sizes(mistral3):
    _, exported, _, _ = mistral3
    checks = exported.verify()  # the encoder on 24x40, 32x16 and 8x16 pixels
    assert {"image_features (32x16 pixels)", "logits (batch 3, sequence 7, past 5)"} <= {c.name for c in checks}
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4


def test_genai_runs_mistral3_with_its_image_processing_and_generates_eager_greedy_tokens(mistral3):
    from PIL import Image

    model, exported, folder, image = mistral3
    tokens, made = vm.genai_generate(folder, PROMPT, image, LENGTH)
    inputs = vm.mistral3_processor()(Image.open(image), return_tensors="pt")
    np.testing.assert_allclose(made["pixel_values"], inputs.pixel_values.numpy(), rtol=0, atol=1e-5)  # GenAI's recipe
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    image_token, row_break, image_end = 300, 301, 302
    assert (ids == image_token).sum() == 24 and (ids == row_break).sum() == 3 and (ids == image_end).sum() == 1
    expected = vm.greedy(model, LENGTH, input_ids=ids, pixel_values=inputs.pixel_values,
                         image_sizes=inputs.image_sizes, attention_mask=torch.ones_like(ids))  # fmt: skip
    assert tokens == expected and len(set(expected[ids.shape[1] :])) > 2
    assert exported.generate(ids, (inputs.pixel_values,), len(expected)) == expected  # plain ONNX Runtime


def test_repeated_pixtral_and_decoder_layers_are_captured_once(caplog):
    model = vm.mistral3(vision_layers=3, text_layers=3)
    with caplog.at_level("INFO", logger="opreg.llm"):
        exported = opreg.llm.export_vision(model)
    assert "captured the first 2 of 3 layers; the others are copies (model.vision_tower.transformer.layers)" in (
        caplog.text
    )
    assert "captured the first 2 of 3 layers; the others are copies (model.language_model.layers)" in caplog.text
    exported.verify()


def test_an_image_processor_of_other_blocks_and_a_several_layer_mistral3_are_refused():
    from transformers import PixtralImageProcessor

    model = vm.mistral3()
    with pytest.raises(opreg.ExportError, match="image processor's patch_size is 16, the model's patches merged 8x8"):
        opreg.llm.export_vision(model, image_processor=PixtralImageProcessor(patch_size=16))
    model.config.vision_feature_layer = [-1, -2]
    with pytest.raises(opreg.ExportError, match=r"concatenates the features of layers \[-1, -2\]"):
        opreg.llm.export_vision(model)
