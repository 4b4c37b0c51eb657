"""LLaVA, a vision-language architecture GenAI's builder does not build: ``opreg.llm.export_vision``
writes it in GenAI's three-model layout; GenAI 0.18 has no pipeline for it (it names the model
type), and a plain ONNX Runtime loop over the three models generates eager ``generate``'s tokens.

A tiny random-init model and a PNG image (tests/vision_models.py): nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

import opreg
from tests import vision_models as vm
from tests.test_llm_vision import LENGTH, dims, files


def test_llava_exports_matches_transformers_and_runs_in_plain_onnxruntime(tmp_path):
    import onnxruntime_genai as og
    from PIL import Image

    model = vm.llava()
    folder = tmp_path / "genai"
    exported = opreg.llm.export_vision(
        model, folder, tokenizer=vm.tokenizer(("<image>",)), image_processor=vm.llava_processor()
    )
    vision, embedding = exported.vision.model.graph, exported.embedding.model.graph
    assert [(v.name, dims(v)) for v in vision.inputs] == [("pixel_values", ["num_images", 3, 32, 32])]
    assert [(v.name, dims(v)) for v in vision.outputs] == [("image_features", ["num_images", 16, 64])]
    assert dims(embedding.inputs[1]) == ["num_images", "num_image_tokens", 64]
    checks = exported.verify()
    assert all(c.ok for c in checks) and {"image_features (2 images)", "logits (batch 3, sequence 7, past 5)"} <= {
        c.name for c in checks
    }
    assert "processor_config.json" not in files(p.name for p in folder.iterdir())  # GenAI has no LLaVA recipe
    assert json.loads((folder / "genai_config.json").read_text())["model"]["type"] == "llava"
    with pytest.raises(RuntimeError, match="Unsupported model_type in config.json: llava"):
        og.Model(str(folder))  # ONNX Runtime GenAI 0.18 runs the builder's multimodal types only

    image = vm.image(tmp_path / "image.png", vm.LLAVA_IMAGE, vm.LLAVA_IMAGE)
    pixels = vm.llava_processor()(Image.open(image), return_tensors="pt").pixel_values
    ids = torch.tensor([[5, 6, *[model.config.image_token_id] * 16, 7, 8]])
    expected = vm.greedy(model, LENGTH, input_ids=ids, pixel_values=pixels, attention_mask=torch.ones_like(ids))
    assert exported.generate(ids, (pixels,), len(expected)) == expected and len(set(expected[ids.shape[1] :])) > 2
