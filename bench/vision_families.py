"""Mistral3 and Qwen3-VL: opreg's decoder against the one GenAI's model builder builds, in one run.

Run: python bench/vision_families.py [--rounds N] [--work DIR] [--only mistral3|qwen3_vl]

GenAI 0.18's builder builds the language model of both (``--extra_options exclude_embeds=true``:
the decoder on embeddings of GenAI's multimodal pipeline), neither vision encoder nor embedding
model. For each, a random-init checkpoint with bench/vision.py's text size (hidden 512, 8 layers,
8 query and 2 key/value heads of 64, vocab 32000) and a small vision encoder (4 blocks of hidden
256; Qwen3-VL's deepstack after blocks 1, 2 and 3, as the real ones have three) is saved with the
tests' tokenizer and an image processor, then:

1. The builder's decoder (``-p fp32 -e cpu``) and ``opreg llm export`` (at its defaults and at ``-t
   onnxruntime``: the same folder, the control), each once in a fresh process (CPU time;
   bench/vision.py times Qwen2.5-VL's builds in rounds).
2. Latency (ONNX Runtime, 1 thread, thread CPU time, interleaved rounds split between one fresh
   process per folder, each loading them in a rotated order: bench/rotated.py) of the decoder: a
   prefill of 80 tokens of which 64 image tokens (Qwen3-VL: 3-D positions as get_rope_index makes
   them) and a decode step after it; ratio opreg / builder. opreg's Qwen3-VL decoder takes the
   embeddings with their deepstack parts (4x as wide) and adds them after layers 0-2; the builder's
   takes the embeddings alone and adds nothing (GenAI 0.18's ``qwen3_vl`` pipeline has no
   deepstack input: its decoder's logits differ from eager at image tokens).
3. Correctness: the prefill's logits of each decoder against eager PyTorch (the language model on
   the same embeddings, deepstack parts zero for the builder's), and GenAI on opreg's folder, an
   image and a prompt, its tokens against eager ``generate``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ort_contrib import _quiet, round_times
from bench.rotated import Timing, rotated
from bench.vision import TEXT, builds, prompt_positions, session
from bench.whisper import print_latency
from tests import vision_models as vm

PAIRS = (("opreg -t onnxruntime", "builder fp32"),)
CONTROL = ("opreg", "opreg -t onnxruntime")
"""Two builds of the same folder (the default target is onnxruntime): their ratio shows what the order costs."""
PROMPT, IMAGE_TOKENS, GREEDY = 80, 64, 32
FAMILIES = {
    "mistral3": ("[INST][IMG]the quick", (128, 128)),  # 16x16 patches of 8, merged 2x2: 64 image tokens
    "qwen3_vl": ("<|vision_start|><|image_pad|><|vision_end|>the quick", (256, 256)),  # 16x16 of 16, merged 2x2
}


def checkpoint(family: str, folder: Path) -> Path:
    """The random-init model of ``family``, the tests' tokenizer and its image processor, saved once."""
    if (folder / "config.json").is_file():
        return folder
    import torch

    torch.manual_seed(0)
    with _quiet():
        if family == "mistral3":
            from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessor

            vision = {"model_type": "pixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
                      "num_attention_heads": 4, "head_dim": 64, "image_size": 128, "patch_size": 8}  # fmt: skip
            text = {**TEXT, "model_type": "mistral", "head_dim": 64, "sliding_window": None}
            config = Mistral3Config(vision_config=vision, text_config=text, image_token_index=300,
                                    tie_word_embeddings=False)  # fmt: skip
            model, tokens = Mistral3ForConditionalGeneration(config), vm.MISTRAL3_TOKENS
            processor = PixtralImageProcessor(patch_size=16, size={"longest_edge": 128})
        else:
            from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration

            rope = {"rope_type": "default", "mrope_section": [8, 12, 12], "mrope_interleaved": True,
                    "rope_theta": 10000.0}  # fmt: skip
            vision = {"depth": 4, "hidden_size": 256, "num_heads": 4, "intermediate_size": 512, "out_hidden_size": 512,
                      "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "num_position_embeddings": 256, "deepstack_visual_indexes": [1, 2, 3]}  # fmt: skip
            config = Qwen3VLConfig(text_config={**TEXT, "head_dim": 64, "rope_parameters": rope}, vision_config=vision,
                                   image_token_id=302, video_token_id=303, vision_start_token_id=300,
                                   vision_end_token_id=301, tie_word_embeddings=False)  # fmt: skip
            model, tokens = Qwen3VLForConditionalGeneration(config), vm.QWEN_TOKENS
            model.generation_config.eos_token_id, model.generation_config.pad_token_id = 0, 1
            processor = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2,
                                              image_mean=[0.5] * 3, image_std=[0.5] * 3)  # fmt: skip
        model.eval().save_pretrained(folder)
    vm.tokenizer(tokens).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def decoder_inputs(folder: Path, past: int, length: int) -> dict[str, np.ndarray]:
    """A step of ``length`` tokens after ``past`` for the decoder of ``folder``: embeddings as wide as
    its ``genai_config.json`` says (the first 512 the same for every folder, the rest zeros but at the
    image tokens), its positions (3-D where it takes them), a random past."""
    config = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    rng = np.random.default_rng(1)
    hidden = TEXT["hidden_size"]
    embeds = np.zeros((1, length, config["hidden_size"]), np.float32)
    embeds[..., :hidden] = rng.standard_normal((1, length, hidden), dtype=np.float32)
    if length == PROMPT:
        image = slice(8, 8 + IMAGE_TOKENS)
        embeds[:, image, hidden:] = rng.standard_normal((1, IMAGE_TOKENS, embeds.shape[-1] - hidden), np.float32)
    inputs = {i.name: i for i in session(folder / "model.onnx").get_inputs()}
    positions = prompt_positions() if length == PROMPT else np.full((3, 1, 1), PROMPT + 1, np.int64)
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((1, past + length), np.int64)}
    if "position_ids" in inputs:  # the builder's Mistral3 decoder computes them from the mask
        rank = len(inputs["position_ids"].shape)
        feeds["position_ids"] = positions if rank == 3 else np.arange(past, past + length)[None]
    for layer in range(TEXT["num_hidden_layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = rng.standard_normal((1, 2, past, 64), dtype=np.float32)
    return {name: value for name, value in feeds.items() if name in inputs}


def latency(folders: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """Each folder's decoder, loaded in their order, on the prefill and a decode step (bench/rotated.py's timer)."""
    sessions = {name: session(folder / "model.onnx") for name, folder in folders.items()}
    result = {}
    for label, past, length, repeat in ((f"prefill, {PROMPT} tokens ({IMAGE_TOKENS} image)", 0, PROMPT, 1),
                                        (f"decode step, past {PROMPT}", PROMPT, 1, 10)):  # fmt: skip
        feeds = {name: decoder_inputs(folders[name], past, length) for name in sessions}
        result[label] = {n: Timing(t) for n, t in round_times(sessions, feeds, rounds, repeat).items()}
    return result


def correctness(family: str, source: Path, folders: dict[str, Path], work: Path) -> None:
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    with _quiet():
        model = AutoModelForImageTextToText.from_pretrained(source).eval()
    from opreg.llm._vision_models import architecture_of

    architecture = architecture_of(model)
    for name, folder in folders.items():
        feeds = decoder_inputs(folder, 0, PROMPT)
        wide = decoder_inputs(folders["opreg -t onnxruntime"], 0, PROMPT)["inputs_embeds"]
        positions = torch.arange(PROMPT)[None] if family == "mistral3" else torch.from_numpy(prompt_positions())
        with torch.no_grad():
            expected = architecture.decoder_logits(model, torch.from_numpy(wide), None, capturing=False,
                                                   position_ids=positions)  # fmt: skip
        logits = session(folder / "model.onnx").run(["logits"], feeds)[0]
        difference = np.abs(logits - expected.numpy()).max()
        print(f"- {name}: prefill logits within {difference:.1e} of eager's (deepstack in)")
    prompt, size = FAMILIES[family]
    image = vm.image(work / f"{family}.png", *size)
    tokens, made = vm.genai_generate(folders["opreg -t onnxruntime"], prompt, image, GREEDY)
    processed = AutoImageProcessor.from_pretrained(source)(Image.open(image), return_tensors="pt")
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    pixels = {"image_sizes": processed.image_sizes} if family == "mistral3" else {
        "image_grid_thw": processed.image_grid_thw, "mm_token_type_ids": (ids == 302).int()}  # fmt: skip
    expected = vm.greedy(model, GREEDY, input_ids=ids, pixel_values=processed.pixel_values,
                         attention_mask=torch.ones_like(ids), **pixels)  # fmt: skip
    same = sum(a == b for a, b in zip(tokens[ids.shape[1] :], expected[ids.shape[1] :], strict=False))
    print(f"- GenAI on opreg's folder: {same}/{GREEDY} of eager's greedy tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("build/vision-families-bench"))
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    parser.add_argument("--only", choices=list(FAMILIES), default=None)
    args = parser.parse_args()
    import onnxruntime
    import onnxruntime_genai
    import torch

    print(f"onnxruntime {onnxruntime.__version__}, onnxruntime-genai {onnxruntime_genai.__version__}, "
          f"torch {torch.__version__}, CPU x{os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    for family in [args.only] if args.only else list(FAMILIES):
        work = args.work / family
        work.mkdir(parents=True, exist_ok=True)
        source = checkpoint(family, work / "checkpoint")
        made = builds(source, work, ["builder fp32", "opreg", "opreg -t onnxruntime"], 1)
        print(f"\n## {family}\n")
        for name, build in made.items():
            if isinstance(build, str):
                raise SystemExit(f"{family}, {name} failed: {build}")
            print(f"- {name}: CPU {build.cpu[0]:.1f} s, peak {build.peak_gb[0]:.2f} GB")
        folders = {name: build.folder for name, build in made.items()}
        result = rotated(latency, folders, args.rounds)
        print(
            f"\nDecoder latency at 1 thread (the best round's ms; ratio: median over {args.rounds} interleaved "
            "rounds of opreg / builder, split between fresh processes loading the folders in rotated orders)\n"
        )
        print_latency(result, PAIRS, CONTROL)
        print()
        correctness(family, source, folders, work)


if __name__ == "__main__":
    main()
