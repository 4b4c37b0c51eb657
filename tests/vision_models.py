"""Tiny vision-language models, their tokenizers, image processors and images, built here (nothing
downloaded): for ``tests/test_llm_vision.py`` and ``bench/vision.py``.

Each model is random-init (seeded) with the text tests' byte-level BPE tokenizer
(``tests/language_models.py``) plus the architecture's image tokens after its 300 text tokens.
Images are written at the image processor's size, so that its resizing (PIL's in transformers,
ONNX Runtime Extensions' in GenAI) leaves the pixels as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests import language_models as lm

VOCAB = 320
GEMMA3_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
GEMMA3_IMAGE = 64
TEXT = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 1024}  # fmt: skip


def _finish(model: Any) -> Any:
    model.generation_config.eos_token_id = lm.EOS
    model.generation_config.pad_token_id = lm.PAD
    model.generation_config.bos_token_id = lm.EOS
    model.generation_config.do_sample = False
    return model.eval()


def tokenizer(specials: tuple[str, ...]) -> Any:
    """The text tests' tokenizer with ``specials`` added (ids 300, 301, ...)."""
    words = lm.tokenizer()
    words.add_special_tokens({"additional_special_tokens": list(specials)})
    return words


def gemma3(seed: int = 0, text_layers: int = 2, vision_layers: int = 1) -> Any:
    """A tiny ``Gemma3ForConditionalGeneration``: 2 text layers (sliding window 4, then full, in
    turn), a 1-layer SigLIP on 64x64 images in patches of 4, pooled to 256 tokens an image (GenAI's count)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    kinds = ("sliding_attention", "full_attention")
    text = {**TEXT, "sliding_window": 4, "num_hidden_layers": text_layers,
            "layer_types": [kinds[i % 2] for i in range(text_layers)]}  # fmt: skip
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": vision_layers, "num_attention_heads": 2,
              "image_size": GEMMA3_IMAGE, "patch_size": 4}  # fmt: skip
    boi, eoi, image = (lm.VOCAB + i for i in range(3))
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=256, image_token_index=image,
                          boi_token_index=boi, eoi_token_index=eoi)  # fmt: skip
    torch.manual_seed(seed)
    return _finish(Gemma3ForConditionalGeneration(config))


def gemma3_processor() -> Any:
    from transformers import Gemma3ImageProcessor

    return Gemma3ImageProcessor(size={"height": GEMMA3_IMAGE, "width": GEMMA3_IMAGE}, do_pan_and_scan=False)


QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_PATCH = 4


def qwen2_5_vl(seed: int = 0, text_layers: int = 2, depth: int = 2) -> Any:
    """A tiny ``Qwen2_5_VLForConditionalGeneration``: 2 text layers with 3-D rotary positions, a
    2-block vision encoder (block 1 on the whole image, the others on windows of 2x2 merged
    patches) on patches of 4 pixels, merged 2x2."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    text = {**{k: v for k, v in TEXT.items() if k != "head_dim"}, "rope_parameters": rope,
            "num_hidden_layers": text_layers}  # fmt: skip
    vision = {"depth": depth, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 64,
              "patch_size": QWEN_PATCH, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16,
              "fullatt_block_indexes": [1]}  # fmt: skip
    start, end, image, video = (lm.VOCAB + i for i in range(4))
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=image, video_token_id=video,
                              vision_start_token_id=start, vision_end_token_id=end)  # fmt: skip
    torch.manual_seed(seed)
    return _finish(Qwen2_5_VLForConditionalGeneration(config))


def qwen_processor() -> Any:
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor(patch_size=QWEN_PATCH, temporal_patch_size=2, merge_size=2, min_pixels=64,
                                 max_pixels=64 * 64)  # fmt: skip


LLAVA_IMAGE = 32


def llava(seed: int = 0) -> Any:
    """A tiny ``LlavaForConditionalGeneration``: a 2-layer CLIP on 32x32 images in patches of 8 (16
    tokens an image, its second-to-last layer's features), a 2-layer Llama."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    vision = {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": LLAVA_IMAGE, "patch_size": 8, "projection_dim": 32}  # fmt: skip
    text = {**TEXT, "model_type": "llama"}
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=lm.VOCAB, image_seq_length=16)
    torch.manual_seed(seed)
    return _finish(LlavaForConditionalGeneration(config))


def llava_processor() -> Any:
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(
        size={"shortest_edge": LLAVA_IMAGE}, crop_size={"height": LLAVA_IMAGE, "width": LLAVA_IMAGE}
    )


def image(path: Path, height: int, width: int, seed: int = 0) -> Path:
    """A PNG of random colours (smooth blocks, so that neither processor's rounding matters)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (height // 4 + 1, width // 4 + 1, 3), dtype=np.uint8)
    pixels = np.repeat(np.repeat(blocks, 4, 0), 4, 1)[:height, :width]
    Image.fromarray(pixels).save(path)
    return path


def exported_folder(root: Path, model: Any, specials: tuple[str, ...], processor: Any, size: tuple[int, int],
                    **options: Any) -> tuple[Any, Any, Path, Path]:  # fmt: skip
    """``model`` exported to ``root / "genai"`` with the tokenizer of ``specials`` and ``processor``, and
    an image of ``size`` (height, width) in ``root``: the model, the export, the folder and the image."""
    import opreg

    exported = opreg.llm.export_vision(model, root / "genai", tokenizer=tokenizer(specials), image_processor=processor,
                                       **options)  # fmt: skip
    return model, exported, root / "genai", image(root / "image.png", *size)


def genai_generate(folder: Path, prompt: str, image_file: Path, length: int) -> tuple[list[int], dict[str, np.ndarray]]:
    """ONNX Runtime GenAI's greedy generation from ``prompt`` and an image, with its own processor:
    the tokens, and the tensors its processor made (``input_ids``, ``pixel_values``, ...)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    processor = model.create_multimodal_processor()
    inputs = processor(prompt, images=og.Images.open(str(image_file)))
    made = {name: inputs[name].as_numpy().copy() for name in ("input_ids", "pixel_values", "image_grid_thw")
            if _has(inputs, name)}  # fmt: skip
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=made["input_ids"].shape[1] + length)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(token) for token in generator.get_sequence(0)], made


def _has(inputs: Any, name: str) -> bool:
    try:
        inputs[name].as_numpy()
    except Exception:
        return False
    return True


def greedy(model: Any, length: int, **inputs: Any) -> list[int]:
    """transformers' greedy ``generate``: the prompt and ``length`` new tokens."""
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=length, do_sample=False)
    return out[0].tolist()


MISTRAL3_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]")
MISTRAL3_PATCH = 4


def mistral3(seed: int = 0, vision_layers: int = 2, text_layers: int = 2) -> Any:
    """A tiny ``Mistral3ForConditionalGeneration``: a 2-layer Pixtral on patches of 4 pixels (any image
    size, 2-D rotary positions), its patches merged 2x2 and projected, a 2-layer Mistral."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": vision_layers,
              "num_attention_heads": 2, "head_dim": 16, "image_size": 64, "patch_size": MISTRAL3_PATCH}  # fmt: skip
    text = {**TEXT, "model_type": "mistral", "num_hidden_layers": text_layers}
    image = lm.VOCAB
    config = Mistral3Config(
        vision_config=vision, text_config=text, image_token_index=image, spatial_merge_size=2, tie_word_embeddings=False
    )  # tied, random-init logits repeat the last token
    torch.manual_seed(seed)
    return _finish(Mistral3ForConditionalGeneration(config))


def mistral3_processor() -> Any:
    from transformers import PixtralImageProcessor

    return PixtralImageProcessor(patch_size=MISTRAL3_PATCH * 2, size={"longest_edge": 64})


QWEN3_VL_PATCH = 4


def qwen3_vl(seed: int = 0, text_layers: int = 3, depth: int = 3, deepstack: tuple[int, ...] = (0, 1)) -> Any:
    """A tiny ``Qwen3VLForConditionalGeneration``: 3 text layers with interleaved 3-D rotary
    positions and query/key norms, a 3-block vision encoder on patches of 4 pixels merged 2x2 (a
    learned 4x4 position table resampled to each image's grid), the features after blocks
    ``deepstack`` added to the first text layers' outputs at the image tokens (deepstack)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True, "rope_theta": 10000.0}
    text = {**TEXT, "rope_parameters": rope, "num_hidden_layers": text_layers}
    vision = {"depth": depth, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 64,
              "patch_size": QWEN3_VL_PATCH, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "num_position_embeddings": 16, "deepstack_visual_indexes": list(deepstack)}  # fmt: skip
    start, end, image, video = (lm.VOCAB + i for i in range(4))
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=image, video_token_id=video,
                           vision_start_token_id=start, vision_end_token_id=end,
                           tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(seed)
    return _finish(Qwen3VLForConditionalGeneration(config))


def qwen3_vl_processor() -> Any:
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor(patch_size=QWEN3_VL_PATCH, temporal_patch_size=2, merge_size=2, min_pixels=64,
                                 max_pixels=64 * 64, image_mean=[0.5] * 3, image_std=[0.5] * 3)  # fmt: skip
