"""Qwen3-VL for ONNX Runtime GenAI (``opreg.llm.export_vision``): Qwen2.5-VL's layout with
deepstack (the vision encoder's features after some blocks added to the first text layers'
outputs at the image tokens), carried through the three models as wider features and embeddings;
GenAI 0.18's ``qwen3_vl`` pipeline runs the folder with its own image processing and generates
eager ``generate``'s greedy tokens, and so does the plain ONNX Runtime loop.

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

PROMPT = "<|vision_start|><|image_pad|><|vision_end|>the quick"
WIDE = 64 * 3  # the features, then two deepstack features


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    return vm.exported_folder(root, vm.qwen3_vl(), vm.QWEN_TOKENS, vm.qwen3_vl_processor(), (32, 48))


def test_qwen3_vl_carries_deepstack_in_wider_features_and_every_length_is_dynamic(qwen3):
    _, exported, folder, _ = qwen3
    vision, embedding, decoder = (p.model.graph for p in (exported.vision, exported.embedding, exported.decoder))
    assert [(v.name, dims(v)) for v in vision.inputs] == [("pixel_values", ["num_patches", 96]),
                                                          ("image_grid_thw", [1, 3])]  # fmt: skip
    assert [(v.name, dims(v)) for v in vision.outputs] == [("image_features", ["num_image_tokens", WIDE])]
    assert dims(embedding.outputs[0]) == ["batch_size", "sequence_length", WIDE]
    by_name = {v.name: dims(v) for v in [*decoder.inputs, *decoder.outputs]}
    assert by_name["inputs_embeds"] == ["batch_size", "sequence_length", WIDE]
    assert by_name["position_ids"] == [3, "batch_size", "sequence_length"]
    assert files(p.name for p in folder.iterdir()) == FILES
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert (config["type"], config["decoder"]["hidden_size"]) == ("qwen3_vl", WIDE)  # GenAI's embeddings' width
    assert "window_size" not in config["vision"] and config["vision"]["patch_size"] == vm.QWEN3_VL_PATCH
    recipe = json.loads((folder / "processor_config.json").read_text())["processor"]
    assert recipe["name"] == "qwen3_vl_image_processor" and recipe["transforms"][4]["operation"]["attrs"]["qwen3_vl"]


def test_qwen3_vl_matches_transformers_with_deepstack(qwen3):
    _, exported, _, _ = qwen3
    checks = exported.verify()  # the encoder at grids 8x12, 6x10 and 4x4; the whole: the model's own forward
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4
    pixels, grid = torch.randn(96, 96), torch.tensor([[1, 8, 12]])
    deepstack = exported.vision.run(pixels, grid)[:, 64:]
    assert deepstack.abs().min() > 0  # the deepstack features are there, and verify's whole check adds them


def test_genai_runs_qwen3_vl_with_deepstack_and_generates_eager_greedy_tokens(qwen3):
    from PIL import Image

    model, exported, folder, image = qwen3
    tokens, made = vm.genai_generate(folder, PROMPT, image, LENGTH)
    inputs = vm.qwen3_vl_processor()(Image.open(image), return_tensors="pt")
    np.testing.assert_allclose(made["pixel_values"], inputs.pixel_values.numpy(), rtol=0, atol=1e-5)  # GenAI's recipe
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    kinds = (ids == model.config.image_token_id).int()
    assert kinds.sum() == 24
    expected = vm.greedy(model, LENGTH, input_ids=ids, pixel_values=inputs.pixel_values,
                         image_grid_thw=inputs.image_grid_thw, mm_token_type_ids=kinds,
                         attention_mask=torch.ones_like(ids))  # fmt: skip
    assert tokens == expected and len(set(expected[ids.shape[1] :])) > 2
    assert exported.generate(ids, (inputs.pixel_values, inputs.image_grid_thw), len(expected)) == expected


def test_blocks_up_to_the_last_a_deepstack_merger_reads_are_captured_and_the_others_copied(caplog):
    """Blocks 1 and 3 of 7 feed deepstack mergers: blocks 0-3 are captured (a copy's output reaches
    the next block only), block 4 after them, blocks 5 and 6 are copies; the models match transformers."""
    model = vm.qwen3_vl(depth=7, deepstack=(1, 3))
    with caplog.at_level("INFO", logger="opreg.llm"):
        exported = opreg.llm.export_vision(model)
    assert "captured the first 5 of 7 layers; the others are copies (model.visual.blocks)" in caplog.text
    checks = exported.verify()
    assert all(c.ok for c in checks)


def test_a_qwen3_vl_without_deepstack_has_features_of_the_hidden_size():
    exported = opreg.llm.export_vision(vm.qwen3_vl(deepstack=()))
    assert dims(exported.vision.model.graph.outputs[0]) == ["num_image_tokens", 64]
    assert exported.genai_config()["model"]["decoder"]["hidden_size"] == 64
    exported.verify()


def test_a_qwen3_vl_resampling_its_position_table_otherwise_is_refused_before_the_export(tmp_path):
    model = vm.qwen3_vl()
    model.model.visual.interpolation_mode = "bicubic"
    with pytest.raises(opreg.ExportError, match="resamples its position table bicubic .* bilinear, corners aligned"):
        opreg.llm.export_vision(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
