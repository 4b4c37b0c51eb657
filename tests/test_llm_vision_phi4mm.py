"""Phi-4-multimodal: ``opreg.llm.export_vision`` on a checkpoint folder writes its vision encoder
(the crops' layout computed with tensor ops, every crop count dynamic), the embedding model and the
Phi-3 decoder; the plain ONNX Runtime loop generates eager ``generate``'s greedy tokens from the
transformers image processor's crops. Audio is not exported.

A tiny random-init model (weights drawn wider than transformers' default, so that greedy tokens
vary; a 1-block audio encoder, which the model always holds) and a PNG image: nothing is
downloaded. Numerics against transformers at rtol=atol=1e-4.
"""

from __future__ import annotations

import json

import pytest
import torch

import opreg
from tests import vision_models as vm
from tests.test_llm_vision import LENGTH, dims

IMAGE_TOKEN, AUDIO_TOKEN = 302, 303


def phi4mm(seed: int = 0, **vision_options):
    """A tiny ``Phi4MultimodalForCausalLM``: 2 Phi-3 layers, a 2-layer SigLIP on 56-pixel crops in
    patches of 14 (4x4 patches, pooled to 2x2 features a crop)."""
    from transformers import Phi4MultimodalConfig, Phi4MultimodalForCausalLM

    text = {k: v for k, v in vm.TEXT.items() if k != "head_dim"}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 56, "crop_size": 56, "patch_size": 14, "image_token_id": IMAGE_TOKEN,
              **vision_options}  # fmt: skip
    audio = {"hidden_size": 32, "intermediate_size": 64, "num_blocks": 1, "num_attention_heads": 2,
             "ext_pw_out_channel": 32, "depthwise_separable_out_channel": 32, "nemo_conv_channels": 32,
             "input_size": 16, "audio_token_id": AUDIO_TOKEN}  # fmt: skip
    config = Phi4MultimodalConfig(**text, vision_config=vision, audio_config=audio, initializer_range=0.3,
                                  bos_token_id=0, pad_token_id=0)  # fmt: skip
    torch.manual_seed(seed)
    model = Phi4MultimodalForCausalLM(config)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() > 1:
                weight.normal_(std=0.3)
    return vm._finish(model)


def processor(**options):
    from transformers import Phi4MultimodalImageProcessor

    return Phi4MultimodalImageProcessor(**{"size": {"height": 56, "width": 56}, "patch_size": 14, **options})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Phi-4-multimodal exported from a checkpoint folder, the folder, and a 56x80 image (1x2 crops,
    the right one padded by 2 columns of patches)."""
    root = tmp_path_factory.mktemp("phi4mm")
    model = phi4mm()
    checkpoint = root / "checkpoint"
    model.save_pretrained(checkpoint)
    vm.tokenizer(("<|image|>", "<|audio|>")).save_pretrained(checkpoint)
    processor().save_pretrained(checkpoint)
    result = opreg.llm.export_vision(checkpoint, root / "folder")
    return model, result, root / "folder", vm.image(root / "image.png", 56, 80)


def test_phi4mm_folder_takes_one_image_of_any_crop_count(exported):
    _, result, folder, _ = exported
    vision = result.vision.model.graph
    assert {v.name: dims(v) for v in vision.inputs} == {
        "pixel_values": [1, "num_crops", 3, 56, 56], "image_sizes": [1, 2],
        "image_attention_mask": [1, "num_crops", 4, 4],
    }  # fmt: skip
    assert dims(vision.outputs[0]) == ["num_image_tokens", 64]
    assert "NonZero" in {n.op_type for n in vision}  # the unpadded positions: a data-dependent count
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "phi4_multimodal" and config["decoder"]["inputs"]["inputs_embeds"] == "inputs_embeds"


def test_phi4mm_generates_eager_tokens_from_the_image_processors_crops(exported):
    from PIL import Image

    model, result, _, image = exported
    inputs = processor()(Image.open(image), return_tensors="pt")
    pixels = (inputs.image_pixel_values, inputs.image_sizes, inputs.image_attention_mask)
    assert inputs.image_sizes.tolist() == [[56, 112]] and inputs.image_attention_mask[0, 2, :, 2:].sum() == 0
    count = result.architecture.token_count(model, inputs.image_sizes, inputs.image_attention_mask)
    assert count == 2 * 4 + 1 + 2 * 3  # 2 rows of 3 unpadded features and a separator, then the whole image's
    ids = torch.tensor([[5, 6, *[IMAGE_TOKEN] * count, 7, 8]])
    expected = vm.greedy(model, LENGTH, input_ids=ids, attention_mask=torch.ones_like(ids),
                         image_pixel_values=pixels[0],
                         image_sizes=pixels[1], image_attention_mask=pixels[2])  # fmt: skip
    assert result.generate(ids, pixels, len(expected)) == expected and len(set(expected[ids.shape[1] :])) > 2


def test_phi4mm_verify_compares_padded_and_unpadded_crop_grids(exported):
    checks = exported[1].verify()
    names = {c.name for c in checks}
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4
    assert {"image_features (1x1 crops, padding 0x0)", "image_features (2x2 crops, padding 1x1)"} <= names


def test_transformers_vision_attention_is_causal_when_no_crop_is_padded(exported):
    """Why the eager reference makes the vision attention bidirectional: transformers 5.17's SDPA
    path drops an all-ones mask and then applies the attention's ``is_causal = True``."""
    from opreg.llm._vision_phi4mm import bidirectional

    model, result, _, _ = exported
    pixels = result.architecture.pixels(model, 1, 2)
    embed = result.architecture.embedder(model)
    with torch.no_grad():
        causal = embed.get_img_features(pixels[0][0], pixels[2][0].bool())
        with bidirectional(model):
            both_ways = embed.get_img_features(pixels[0][0], pixels[2][0].bool())
    assert not torch.allclose(causal, both_ways, atol=1e-2)
    got = result.vision.run(*pixels)
    torch.testing.assert_close(got, result.eager_vision(*pixels), rtol=1e-4, atol=1e-4)


def test_a_mismatched_image_processor_or_crop_layout_is_refused_before_the_export(tmp_path):
    with pytest.raises(opreg.ExportError, match="patch_size is 16, the model's 14"):
        opreg.llm.export_vision(phi4mm(), tmp_path / "out", image_processor=processor(patch_size=16))
    with pytest.raises(opreg.ExportError, match="56-pixel images in patches of 14 and crops of 42"):
        opreg.llm.export_vision(phi4mm(crop_size=42), tmp_path / "out")
    assert not (tmp_path / "out").exists()
