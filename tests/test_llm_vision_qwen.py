"""Qwen2.5-VL for ONNX Runtime GenAI (``opreg.llm.export_vision``): a vision encoder for images of
any size (GenAI runs it once per image), 3-D rotary positions in the decoder; with GenAI's own
image processing an image-plus-text prompt generates eager ``generate``'s greedy tokens.

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


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen")
    return vm.exported_folder(root, vm.qwen2_5_vl(), vm.QWEN_TOKENS, vm.qwen_processor(), (32, 48))


def test_qwen_has_genai_names_and_every_length_dynamic(qwen):
    _, exported, folder, _ = qwen
    vision, embedding, decoder = (p.model.graph for p in (exported.vision, exported.embedding, exported.decoder))
    assert [(v.name, dims(v)) for v in vision.inputs] == [("pixel_values", ["num_patches", 96]),
                                                          ("image_grid_thw", [1, 3])]  # fmt: skip
    assert [(v.name, dims(v)) for v in vision.outputs] == [("image_features", ["num_image_tokens", 64])]
    assert dims(embedding.inputs[1]) == ["num_image_tokens", 64]
    by_name = {v.name: dims(v) for v in [*decoder.inputs, *decoder.outputs]}
    assert by_name["position_ids"] == [3, "batch_size", "sequence_length"]  # temporal, height, width
    assert "input_ids" not in by_name and by_name["inputs_embeds"] == ["batch_size", "sequence_length", 64]
    assert by_name["present.1.value"] == ["batch_size", 2, "total_sequence_length", 16]
    assert files(p.name for p in folder.iterdir()) == FILES
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "qwen2_5_vl" and (config["image_token_id"], config["vision_start_token_id"]) == (302, 300)
    assert config["vision"]["inputs"] == {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}
    assert (config["vision"]["spatial_merge_size"], config["vision"]["patch_size"]) == (2, vm.QWEN_PATCH)
    recipe = json.loads((folder / "processor_config.json").read_text())["processor"]["transforms"]
    steps = [step["operation"]["type"] for step in recipe]
    assert steps == ["DecodeImage", "ConvertRGB", "Resize", "Rescale", "Normalize", "PatchImage"]


def test_qwen_matches_transformers_at_several_image_sizes(qwen):
    _, exported, _, _ = qwen
    checks = exported.verify()  # the encoder at grids 8x12, 6x10 (windows cut by the image's edge) and 4x4
    labels = {c.name for c in checks}
    assert {"image_features (grid 6x10)", "logits (batch 3, sequence 7, past 5)"} <= labels
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4


def test_genai_runs_qwen_with_its_image_processing_and_generates_eager_greedy_tokens(qwen):
    from PIL import Image

    model, exported, folder, image = qwen
    tokens, made = vm.genai_generate(folder, PROMPT, image, LENGTH)
    expected_inputs = vm.qwen_processor()(Image.open(image), return_tensors="pt")
    pixels, grid = expected_inputs.pixel_values, expected_inputs.image_grid_thw
    np.testing.assert_allclose(made["pixel_values"], pixels.numpy(), rtol=0, atol=1e-5)  # GenAI's recipe
    assert made["image_grid_thw"].tolist() == grid.tolist() == [[1, 8, 12]]
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    kinds = (ids == model.config.image_token_id).int()
    assert kinds.sum() == 24  # GenAI expanded <|image_pad|> to the image's merged patches
    expected = vm.greedy(model, LENGTH, input_ids=ids, pixel_values=pixels, image_grid_thw=grid,
                         mm_token_type_ids=kinds, attention_mask=torch.ones_like(ids))  # fmt: skip
    assert tokens == expected and len(set(expected[ids.shape[1] :])) > 2
    assert exported.generate(ids, (pixels, grid), len(expected)) == expected


def test_the_span_attention_is_in_transformers_attention_functions_during_the_capture_only(qwen):
    """The export leaves transformers' attention functions as they were (issue 41: no global state)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from opreg.llm._vision_qwen import SPAN_ATTENTION

    assert SPAN_ATTENTION not in ALL_ATTENTION_FUNCTIONS and SPAN_ATTENTION not in AttentionInterface()


def test_the_vision_encoder_of_another_size_matches_transformers(qwen):
    """One export serves every image size GenAI's processor makes (here 40x24 pixels: a 10x6 grid)."""
    _, exported, _, _ = qwen
    pixels = torch.randn(60, 96)
    grid = torch.tensor([[1, 10, 6]])
    expected = exported.eager_vision(pixels, grid)
    torch.testing.assert_close(exported.vision.run(pixels, grid), expected, rtol=1e-4, atol=1e-4)
    assert expected.shape == (15, 64)


def test_at_the_onnxruntime_target_the_3d_rotary_is_one_kernel_and_genai_generates_eager_tokens(qwen, tmp_path):
    """At ``target="onnxruntime"`` the pack's RotaryEmbedding rule takes Qwen's 3-D rotary (the
    per-section cos it picks from the three position streams) into RotaryEmbedding-23, the
    attention into GroupQueryAttention on the cache: the decode step the builder's
    MRotaryEmbedding makes (bench/vision.py), eager's numbers and GenAI's tokens kept."""
    from PIL import Image

    model, _, _, image = qwen
    folder = tmp_path / "genai"
    exported = opreg.llm.export_vision(model, folder, target="onnxruntime", tokenizer=vm.tokenizer(vm.QWEN_TOKENS),
                                       image_processor=vm.qwen_processor())  # fmt: skip
    ops = [(n.domain, n.op_type) for n in exported.decoder.model.graph]
    layers = model.config.text_config.num_hidden_layers
    assert ops.count(("", "RotaryEmbedding")) == 2 * layers and ("", "Neg") not in ops
    assert ops.count(("com.microsoft", "GroupQueryAttention")) == layers
    checks = exported.verify()
    assert all(c.ok for c in checks) and max(c.max_abs for c in checks) < 1e-4
    tokens, made = vm.genai_generate(folder, PROMPT, image, LENGTH)
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    inputs = vm.qwen_processor()(Image.open(image), return_tensors="pt")
    kinds = (ids == model.config.image_token_id).int()
    expected = vm.greedy(model, LENGTH, input_ids=ids, pixel_values=inputs.pixel_values,
                         image_grid_thw=inputs.image_grid_thw, mm_token_type_ids=kinds,
                         attention_mask=torch.ones_like(ids))  # fmt: skip
    assert tokens == expected


def test_repeated_blocks_and_layers_are_captured_once_the_full_attention_blocks_a_kind_of_their_own(caplog):
    """Vision blocks 0, 2 and 3 attend within windows, block 1 within the whole image (the encoder
    gives it other spans): blocks 0-2 are captured, block 3 is a copy of block 2 (a window block);
    the language model's layer 2 is a copy of layer 1. Each copy reads its own weights (random:
    a mix-up shows), and the three models match transformers at three image sizes."""
    model = vm.qwen2_5_vl(text_layers=3, depth=4)
    with caplog.at_level("INFO", logger="opreg.llm"):
        exported = opreg.llm.export_vision(model)
    assert "captured the first 3 of 4 layers; the others are copies (model.visual.blocks)" in caplog.text
    assert "captured the first 2 of 3 layers; the others are copies (model.language_model.layers)" in caplog.text
    exported.verify()


def test_int4_quantizes_the_decoder_and_the_embedding_table_and_genai_runs_the_folder(qwen, tmp_path):
    """``precision="int4"``: the decoder's linear layers as MatMulNBits, the embedding model's table as
    GatherBlockQuantized (blocks of 32: each text row within one quantization step of eager's, image
    rows exact), the vision encoder float32 (measured slower at int4: docs/language-models.md); GenAI
    loads the folder and generates the tokens the plain ONNX Runtime loop of the same models does."""
    model, _, _, image = qwen
    folder = tmp_path / "genai"
    exported = opreg.llm.export_vision(
        model, folder, target="onnxruntime", precision="int4", tokenizer=vm.tokenizer(vm.QWEN_TOKENS),
        image_processor=vm.qwen_processor(),
    )  # fmt: skip
    models = {"vision": exported.vision, "embedding": exported.embedding, "decoder": exported.decoder}
    ops = {name: [n.op_type for n in program.model.graph] for name, program in models.items()}
    assert "MatMulNBits" in ops["decoder"] and ops["embedding"].count("GatherBlockQuantized") == 1
    assert not [n for n in exported.embedding.model.graph if n.op_type == "Gather" and n.inputs[0].is_initializer()]
    assert not {"MatMulNBits", "GatherBlockQuantized"} & set(ops["vision"])
    ids = torch.randint(0, model.config.text_config.vocab_size, (1, 9))
    ids[0, 3:5] = exported.image_token_id
    features = torch.randn(2, model.config.text_config.hidden_size)
    got, expected = exported.embedding.run(ids, features).numpy(), exported.eager_embedding(ids, features).numpy()
    text = (ids[0] != exported.image_token_id).numpy()
    table = model.get_input_embeddings().weight.detach().numpy()
    assert 0 < np.abs(got[0, text] - expected[0, text]).max() < np.abs(table).max() / 7
    np.testing.assert_array_equal(got[0, ~text], expected[0, ~text])
    tokens, made = vm.genai_generate(folder, PROMPT, image, LENGTH)
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    pixels = (torch.from_numpy(made["pixel_values"]), torch.from_numpy(made["image_grid_thw"]))
    assert tokens == exported.generate(ids, pixels, len(tokens))
