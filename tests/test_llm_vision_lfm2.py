"""LFM2-VL: ``opreg.llm.export_vision`` on a checkpoint folder writes GenAI's ``lfm2_vl`` folder (a SigLIP2
encoder at the image's own size, the embedding model, an LFM2 decoder whose cache holds a short
convolution's state beside keys and values); ONNX Runtime GenAI 0.18 loads it, makes the image's
patches with its own processor and generates eager ``generate``'s greedy tokens, as the plain ONNX
Runtime loop does.

A tiny random-init model (weights drawn wider than transformers' default, so that greedy tokens
vary) and a PNG image: nothing is downloaded. Numerics against transformers at rtol=atol=1e-4.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import opreg
from tests import vision_models as vm
from tests.test_llm_vision import LENGTH, dims

TOKENS = ("<|image_start|>", "<|image_end|>", "<image>")
IMAGE_TOKEN = 302
PROMPT = "hello <image> world"


def lfm2_vl(seed: int = 0):
    """A tiny ``Lfm2VlForConditionalGeneration``: an LFM2 of a short-convolution layer then an
    attention layer, a 1-layer SigLIP2 on patches of 4 pixels (4x4 position embeddings), 2x2
    patches a token."""
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    text = {**vm.TEXT, "layer_types": ["conv", "full_attention"], "conv_L_cache": 3, "block_auto_adjust_ff_dim": False,
            "initializer_range": 0.3}  # fmt: skip
    del text["head_dim"]
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "patch_size": 4, "num_patches": 16}  # fmt: skip
    config = Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN, projector_hidden_size=48,
                          downsample_factor=2, initializer_range=0.3)  # fmt: skip
    torch.manual_seed(seed)
    return vm._finish(Lfm2VlForConditionalGeneration(config))


def processor(**options):
    """Images resized whole to 4 to 16 tokens (16 to 64 patches of 4 pixels)."""
    from transformers import Lfm2VlImageProcessor

    given = {"encoder_patch_size": 4, "downsample_factor": 2, "do_image_splitting": False, "min_image_tokens": 4,
             "max_image_tokens": 16, **options}  # fmt: skip
    return Lfm2VlImageProcessor(**given)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """LFM2-VL exported from a checkpoint folder, the folder, and a 24x32 image (6x8 patches)."""
    root = tmp_path_factory.mktemp("lfm2_vl")
    model = lfm2_vl()
    checkpoint = root / "checkpoint"
    model.save_pretrained(checkpoint)
    vm.tokenizer(TOKENS).save_pretrained(checkpoint)
    processor().save_pretrained(checkpoint)
    result = opreg.llm.export_vision(checkpoint, root / "genai")
    return model, result, root / "genai", vm.image(root / "image.png", 24, 32)


def test_lfm2_vl_folder_has_genai_names_a_convolution_state_and_every_length_dynamic(exported):
    import onnx

    _, _, folder, _ = exported

    vision, decoder = (
        onnx.load(folder / name, load_external_data=False).graph for name in ("vision.onnx", "model.onnx")
    )
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*vision.input, *vision.output, *decoder.input, *decoder.output]}  # fmt: skip
    assert shapes["pixel_values"] == [1, "num_patches", 48] and shapes["pixel_attention_mask"] == [1, "num_patches"]
    assert shapes["spatial_shapes"] == [1, 2] and shapes["image_features"] == ["num_image_tokens", 64]
    assert shapes["past.0.conv"] == shapes["present.0.conv"] == ["batch_size", 64, 2]
    assert shapes["present.1.key"] == ["batch_size", 2, "total_sequence_length", 16]
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "lfm2_vl" and config["decoder"]["layer_types"] == ["conv", "full_attention"]
    assert config["vision"]["inputs"] == {
        "pixel_values": "pixel_values", "attention_mask": "pixel_attention_mask", "image_sizes": "spatial_shapes"
    }  # fmt: skip
    resize = json.loads((folder / "processor_config.json").read_text())["processor"]["transforms"][1]["operation"]
    assert resize["attrs"]["min_pixels"] == 4 * 64 and resize["attrs"]["max_pixels"] == 16 * 64


def test_lfm2_vl_matches_transformers_and_genai_generates_eager_tokens(exported):
    """GenAI's processor resizes the image whole and cuts its patches; eager ``generate`` on the
    transformers processor's (padded) patches gives the same tokens, and so does the plain loop."""
    from PIL import Image

    model, result, folder, image = exported
    tokens, made = vm.genai_generate(folder, PROMPT, image, LENGTH)
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    assert (ids == IMAGE_TOKEN).sum() == 12  # GenAI expanded <image> to the image's 3x4 tokens
    inputs = processor()(Image.open(image), return_tensors="pt")
    assert inputs.spatial_shapes.tolist() == [[6, 8]]
    real = int(inputs.pixel_attention_mask.sum())
    np.testing.assert_allclose(made["pixel_values"][0], inputs.pixel_values[0, :real].numpy(), rtol=0, atol=1e-5)
    expected = vm.greedy(model, LENGTH, input_ids=ids, pixel_values=inputs.pixel_values,
                         pixel_attention_mask=inputs.pixel_attention_mask, spatial_shapes=inputs.spatial_shapes,
                         attention_mask=torch.ones_like(ids))  # fmt: skip
    assert tokens == expected and len(set(expected[ids.shape[1] :])) > 2
    pixels = (inputs.pixel_values[:, :real], torch.ones(1, real, dtype=torch.int64), inputs.spatial_shapes)
    assert result.generate(ids, pixels, len(expected)) == expected


def test_lfm2_vl_verify_compares_each_grid_and_the_convolution_state(exported):
    checks = exported[1].verify()
    names = {c.name for c in checks}
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4
    assert {
        "image_features (grid 6x8)",
        "image_features (grid 2x2)",
        "present.0.conv (batch 3, sequence 7, past 5)",
    } <= names
    assert dims(exported[1].vision.model.graph.outputs[0]) == ["num_image_tokens", 64]


@pytest.mark.parametrize(
    ("rows", "columns", "length"), [(6, 8, 48), (2, 2, 6), (16, 4, 64), (3, 5, 15)]
)  # fmt: skip
def test_the_position_embeddings_resize_is_transformers_antialiased_interpolation(rows, columns, length):
    """Shrinking (2x2 from 4x4), growing (6x8, 16x4), odd sizes and a padded patch: the product with
    the filter's weights is transformers' ``F.interpolate(..., antialias=True)``."""
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

    from opreg.llm._vision_lfm2 import resized_positions

    table = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(0))
    shapes = torch.tensor([[rows, columns]])
    expected = Siglip2VisionEmbeddings.resize_positional_embeddings(table, shapes, length)
    torch.testing.assert_close(resized_positions(table, shapes, length), expected, rtol=1e-6, atol=1e-6)


def test_a_tiling_or_mismatched_image_processor_is_refused_before_the_export(tmp_path):
    model = lfm2_vl()
    with pytest.raises(opreg.ExportError, match="splits large images into tiles"):
        opreg.llm.export_vision(model, tmp_path / "out", image_processor=processor(do_image_splitting=True))
    with pytest.raises(opreg.ExportError, match="encoder_patch_size is 8, the model's 4"):
        opreg.llm.export_vision(model, tmp_path / "out", image_processor=processor(encoder_patch_size=8))
    assert not (tmp_path / "out").exists()
