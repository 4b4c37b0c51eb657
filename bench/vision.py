"""opreg's vision-language folders against ONNX Runtime GenAI's model builder, in one run.

Run: python bench/vision.py [--rounds N] [--export-rounds N] [--work DIR] [--no-ablation]

GenAI 0.18's builder (``python -m onnxruntime_genai.models.builder``) builds the language model of
a vision-language checkpoint, on embeddings with ``--extra_options exclude_embeds=true`` (the
decoder of GenAI's multimodal pipeline); it builds no vision encoder or embedding model (the
pipeline's other two models come from per-model scripts). So:

1. Builds, each in a fresh process, of a random-init Qwen2.5-VL (text: hidden 512, 8 layers, 8
   query and 2 key/value heads, vocab 32000; vision: 4 blocks of hidden 256, patches of 14 merged
   2x2, windows of 112 pixels; 69M parameters) saved with the tests' tokenizer and image processor:
   the builder's decoder (``-p fp32|int4 -e cpu``) and ``opreg llm export`` (at its defaults,
   ``-t onnxruntime``, ``-t onnxruntime --precision int4``): CPU time and peak memory, the median
   over ``--export-rounds`` interleaved rounds, and the median of the rounds' ratios opreg /
   builder; files' size. A Gemma-3 of the same text size: the builder's error, opreg's export.
2. Latency (ONNX Runtime, 1 thread, thread CPU time, interleaved rounds) of the decoder: a prefill
   of 80 tokens of which 64 image tokens (a 224x224 image) with 3-D positions, a decode step after
   it; ratio opreg / builder at each precision. The vision encoder on that image: opreg's against
   ``torch.onnx.export(dynamo=True)`` of the same module. The rounds are split between one fresh
   process per model, each loading the models in a rotated order, and pooled (bench/rotated.py: in
   one process the session loaded first can run slower, the same folder too). The control:
   ``opreg`` and ``opreg -t onnxruntime`` are the same folder (the default target is onnxruntime),
   so their ratio reads 1.00x when the order favours neither.
3. Correctness: both decoders against eager PyTorch on the prefill (max abs difference of logits);
   ONNX Runtime GenAI on opreg's folder, an image and a prompt, its tokens against eager ``generate``'s.
4. Ablation: opreg at ``target="onnxruntime"`` without each of the pack's rewrites that fired in the
   decoder, timed beside the full export (ratio above 1: the rewrite pays), in two fresh processes
   (the full export loaded first in one, last in the other).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llm import Build, _fired, _without
from bench.ort_contrib import _quiet, round_times
from bench.rotated import Timing, rotated
from bench.whisper import BUILDS, PAIRS, best_ms, command, print_builds, print_latency, ratio, timed_builds
from tests import vision_models as vm

TEXT = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8,
        "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096}  # fmt: skip
VISION = {"depth": 4, "hidden_size": 256, "num_heads": 4, "intermediate_size": 512, "out_hidden_size": 512,
          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
          "fullatt_block_indexes": [3]}  # fmt: skip
GRID = (1, 16, 16)
"""A 224x224 image: 256 patches, 64 image tokens."""
TEXT_TOKENS, GREEDY = 16, 32


def qwen_checkpoint(folder: Path) -> Path:
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    rope = {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 10000.0}
    start, end, image, video = (300 + i for i in range(4))
    config = Qwen2_5_VLConfig(text_config={**TEXT, "rope_parameters": rope}, vision_config=VISION,
                              image_token_id=image, video_token_id=video, vision_start_token_id=start,
                              vision_end_token_id=end, bos_token_id=0, eos_token_id=0, pad_token_id=1)  # fmt: skip
    torch.manual_seed(0)
    with _quiet():
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
        model.generation_config.eos_token_id, model.generation_config.pad_token_id = 0, 1
        model.save_pretrained(folder)
    vm.tokenizer(vm.QWEN_TOKENS).save_pretrained(folder)
    from transformers import Qwen2VLImageProcessor

    Qwen2VLImageProcessor(patch_size=14, temporal_patch_size=2, merge_size=2).save_pretrained(folder)
    return folder


def gemma_checkpoint(folder: Path) -> Path:
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {**TEXT, "head_dim": 64, "sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]
            + ["sliding_attention"] * 2}  # fmt: skip
    vision = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
              "image_size": 224, "patch_size": 14}  # fmt: skip
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=256, boi_token_index=300,
                          eoi_token_index=301, image_token_index=302)  # fmt: skip
    torch.manual_seed(0)
    with _quiet():
        Gemma3ForConditionalGeneration(config).eval().save_pretrained(folder)
    vm.tokenizer(vm.GEMMA3_TOKENS).save_pretrained(folder)
    return folder


def builds(source: Path, work: Path, names: list[str], rounds: int, prefix: str = "") -> dict[str, Build | str]:
    """The :data:`BUILDS` rows ``names`` of ``source``, in interleaved rounds (the builder's: the
    decoder on embeddings, as GenAI's multimodal pipeline runs it)."""
    commands = {}
    for name in names:
        folder = work / f"{prefix}{name.replace(' ', '_')}"
        commands[name] = (folder, command(source, folder, BUILDS[name], work, "--extra_options", "exclude_embeds=true"))
    return timed_builds(commands, rounds)


def session(path: Path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def decoder_feeds(sess: onnxruntime.InferenceSession, embeds: np.ndarray, positions: np.ndarray, past: int) -> dict:
    layers, kv, size = TEXT["num_hidden_layers"], TEXT["num_key_value_heads"], 64
    rng = np.random.default_rng(1)
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((1, past + embeds.shape[1]), np.int64),
             "position_ids": positions}  # fmt: skip
    for layer in range(layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = rng.standard_normal((1, kv, past, size), dtype=np.float32)
    names = {i.name for i in sess.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names}


def prompt_positions() -> np.ndarray:
    """3-D positions of 8 text tokens, a 16x16 image (8x8 merged) and 8 more, as get_rope_index makes them."""
    text = np.arange(8)
    rows, columns = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    image = np.stack([np.full(64, 8), 8 + rows.reshape(-1), 8 + columns.reshape(-1)])
    after = 16 + np.arange(8)
    return np.concatenate([np.stack([text] * 3), image, np.stack([after] * 3)], 1)[:, None].astype(np.int64)


def latency(folders: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """Each folder's decoder, loaded in their order, timed on the prefill and a decode step (the timer
    :func:`bench.rotated.rotated` runs)."""
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((1, 80, TEXT["hidden_size"]), dtype=np.float32)
    positions = prompt_positions()
    sessions = {name: session(folder / "model.onnx") for name, folder in folders.items()}
    result = {}
    feeds = {name: decoder_feeds(s, embeds, positions, 0) for name, s in sessions.items()}
    result["prefill, 80 tokens (64 image)"] = {n: Timing(t) for n, t in round_times(sessions, feeds, rounds, 1).items()}
    step = np.full((3, 1, 1), 81, np.int64)
    feeds = {name: decoder_feeds(s, embeds[:, :1], step, 80) for name, s in sessions.items()}
    result["decode step, past 80"] = {n: Timing(t) for n, t in round_times(sessions, feeds, rounds, 10).items()}
    return result


def vision_latency(source: Path, folder: Path, work: Path, rounds: int) -> str:
    """opreg's vision encoder against torch.onnx.export(dynamo=True) of the module opreg captured."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from opreg.llm._vision import VisionStep, architecture_of

    with _quiet():
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(source).eval()
    pixels, grid = vision_inputs()
    models = {"opreg": folder / "vision.onnx"}
    try:
        with _quiet():
            dims = {"pixel_values": {0: 4 * torch.export.Dim("tokens", min=2)}, "image_grid_thw": None}
            module = VisionStep(model, architecture_of(model)).eval()
            example = (torch.from_numpy(pixels), torch.from_numpy(grid))
            program = torch.onnx.export(module, example, dynamo=True, dynamic_shapes=dims)
        program.save(str(work / "torch_onnx_vision.onnx"))
        models["torch.onnx"] = work / "torch_onnx_vision.onnx"
    except Exception as e:  # time opreg's alone, and say why the peer has no number
        cause = e.__cause__ or e
        failure = f"torch.onnx.export fails: {type(cause).__name__}: {str(cause).strip().splitlines()[0][:200]}"
    else:
        failure = ""
    times = rotated(vision_encoder_latency, models, rounds)["vision encoder"]
    if failure:
        return f"opreg {best_ms(times['opreg']):.1f} ms; {failure}"
    return (f"opreg {best_ms(times['opreg']):.1f} ms / torch.onnx {best_ms(times['torch.onnx']):.1f} ms: "
            f"{ratio(times['opreg'], times['torch.onnx']):.2f}x")  # fmt: skip


def vision_inputs() -> tuple[np.ndarray, np.ndarray]:
    """The vision encoder's ``pixel_values`` (random, of a 224x224 image's patches) and ``image_grid_thw``."""
    pixels = np.random.default_rng(3).standard_normal((int(np.prod(GRID)), 3 * 2 * 14 * 14), dtype=np.float32)
    return pixels, np.array([GRID], np.int64)


def vision_encoder_latency(files: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """Each vision encoder of ``files``, loaded in their order, on :func:`vision_inputs` (the timer
    :func:`bench.rotated.rotated` runs)."""
    sessions = {name: session(path) for name, path in files.items()}
    feeds = {
        name: dict(zip((i.name for i in s.get_inputs()), vision_inputs(), strict=True)) for name, s in sessions.items()
    }
    return {"vision encoder": {n: Timing(t) for n, t in round_times(sessions, feeds, rounds, 1).items()}}


def correctness(source: Path, folders: dict[str, Path]) -> None:
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    with _quiet():
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(source).eval()
    rng = np.random.default_rng(2)
    embeds = rng.standard_normal((1, 80, TEXT["hidden_size"]), dtype=np.float32)
    positions = prompt_positions()
    with torch.no_grad():
        expected = model(inputs_embeds=torch.from_numpy(embeds), position_ids=torch.from_numpy(positions)).logits
    print("\n3. Correctness\n")
    for name in ("builder fp32", "opreg", "opreg -t onnxruntime"):
        sess = session(folders[name] / "model.onnx")
        logits = sess.run(["logits"], decoder_feeds(sess, embeds, positions, 0))[0]
        print(f"- {name}: prefill logits within {np.abs(logits - expected.numpy()).max():.1e} of eager")


def genai_tokens(source: Path, folder: Path, work: Path) -> str:
    import torch
    from PIL import Image
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor

    image = vm.image(work / "image.png", 224, 224)
    tokens, made = vm.genai_generate(folder, "<|vision_start|><|image_pad|><|vision_end|>the quick", image, GREEDY)
    processed = Qwen2VLImageProcessor.from_pretrained(source)(Image.open(image), return_tensors="pt")
    with _quiet():
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(source).eval()
    ids = torch.from_numpy(made["input_ids"].astype(np.int64))
    expected = vm.greedy(model, GREEDY, input_ids=ids, pixel_values=processed.pixel_values,
                         image_grid_thw=processed.image_grid_thw, mm_token_type_ids=(ids == 302).int(),
                         attention_mask=torch.ones_like(ids))  # fmt: skip
    same = sum(a == b for a, b in zip(tokens[ids.shape[1] :], expected[ids.shape[1] :], strict=False))
    pixels = np.abs(made["pixel_values"] - processed.pixel_values.numpy()).max()
    return f"{same}/{GREEDY} of eager's greedy tokens (GenAI's pixels within {pixels:.1e} of transformers')"


def ablation(source: Path, work: Path, full: Path, rounds: int) -> None:
    fired = _fired(full / "model.onnx")
    print("\n4. Ablation: opreg -t onnxruntime without each rewrite that fired in the decoder; ratio to the full "
          "export in the same rounds (above 1: the rewrite pays)\n")  # fmt: skip
    print("| left out | prefill | decode step |\n|---|---|---|")
    for rule in fired:
        folder = work / f"opreg_without_{rule}"
        subprocess.run([sys.executable, __file__, "--export", str(source), str(folder), "--without", rule],
                       check=True, capture_output=True)  # fmt: skip
        result = rotated(latency, {"full": full, rule: folder}, rounds)
        print(
            f"| {rule} | " + " | ".join(f"{ratio(times[rule], times['full']):.2f}x" for times in result.values()) + " |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("build/vision-bench"))
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    parser.add_argument("--export-rounds", type=int, default=3, help="interleaved rounds of the builds")
    parser.add_argument("--no-ablation", action="store_true")
    parser.add_argument("--export", nargs=2, type=Path, metavar=("CHECKPOINT", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--without", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        import opreg

        with _without(args.without), _quiet():
            opreg.llm.export_vision(args.export[0], args.export[1], target="onnxruntime")
        return
    import onnxruntime_genai
    import torch

    print(f"onnxruntime {onnxruntime.__version__}, onnxruntime-genai {onnxruntime_genai.__version__}, "
          f"torch {torch.__version__}, CPU x{os.cpu_count()}, load average {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    args.work.mkdir(parents=True, exist_ok=True)
    source = qwen_checkpoint(args.work / "qwen")
    made = builds(source, args.work, list(BUILDS), args.export_rounds)
    for name, b in made.items():
        if isinstance(b, str):
            raise SystemExit(f"{name} failed: {b}")
    print(f"1. Builds of Qwen2.5-VL (each in a fresh process, the median of {args.export_rounds} interleaved rounds; "
          "the builder's: the decoder alone)\n")  # fmt: skip
    print_builds(made, PAIRS)
    gemma = gemma_checkpoint(args.work / "gemma3")
    for name, result in builds(gemma, args.work, ["builder fp32", "opreg"], 1, "gemma3_").items():
        text = result if isinstance(result, str) else f"CPU {result.cpu[0]:.1f} s, peak {result.peak_gb[0]:.2f} GB"
        print(f"\nGemma-3, {name}: {text}")
    folders = {name: b.folder for name, b in made.items()}
    result = rotated(latency, folders, args.rounds)
    rounds = len(next(iter(result.values()))["opreg"].rounds)  # at least one per process
    print(f"\n2. Decoder latency at 1 thread (thread CPU time: the best round's ms; ratio: median over {rounds} "
          f"interleaved rounds of opreg / builder; the rounds split between {len(folders)} fresh processes, each "
          "loading the folders in a rotated order)\n")  # fmt: skip
    print_latency(result)
    print(f"\nVision encoder, one 224x224 image: {vision_latency(source, folders['opreg'], args.work, args.rounds)}")
    correctness(source, folders)
    print(f"- GenAI on opreg's folder: {genai_tokens(source, folders['opreg'], args.work)}")
    if not args.no_ablation:
        ablation(source, args.work, folders["opreg -t onnxruntime"], args.rounds)


if __name__ == "__main__":
    main()
