"""What transformers.js loads of the vision, vision-text and audio folders `opreg export` writes.

Each tiny checkpoint of tests/media_checkpoints.py is exported by ``opreg.export_checkpoint`` (flat:
``model.onnx`` beside ``config.json``), then loaded by transformers.js 4.3.1 (onnxruntime-node 1.30)
through the model class its pipelines use (``AutoModelForImageClassification``, ``CLIPModel``,
``AutoModelForCTC``... with ``subfolder: ''``), run on the inputs PyTorch gets, and compared with
eager transformers; the image-classification pipeline also runs end to end on a picture, against
transformers' own pipeline. Prints a table (a row per family: loads, max abs difference, or the
runtime's error).

    python bench/tjs_media.py [--tjs DIR] [--only NAME ...]

``--tjs`` is a folder holding ``node_modules/@huggingface/transformers`` (default
``build/tjs``, where the script installs transformers.js 4.3.1 with ``npm install
--ignore-scripts`` when it is missing; onnxruntime-node's CPU binary comes with the package).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import media_checkpoints  # noqa: E402

TJS = "@huggingface/transformers@4.3.1"
RUNNER = ROOT / "bench" / "tjs_media.mjs"
IMAGE = {"pixel_values": (1, 3, 32, 32)}
CHECKS: dict[str, tuple[str, dict[str, tuple[int, ...]]]] = {
    "vit": ("AutoModelForImageClassification", IMAGE),
    "convnext": ("AutoModelForImageClassification", {"pixel_values": (1, 3, 96, 64)}),
    "swin": ("AutoModelForImageClassification", IMAGE),
    "dinov2": ("AutoModelForImageClassification", {"pixel_values": (1, 3, 24, 40)}),
    "detr": ("AutoModelForObjectDetection", {"pixel_values": (1, 3, 50, 77)}),
    "yolos": ("AutoModelForObjectDetection", {"pixel_values": (1, 3, 24, 40)}),
    "segformer": ("AutoModelForSemanticSegmentation", {"pixel_values": (1, 3, 45, 38)}),
    "dpt": ("AutoModelForDepthEstimation", IMAGE),
    "glpn": ("AutoModelForDepthEstimation", {"pixel_values": (1, 3, 40, 24)}),
    "clip": ("CLIPModel", {"input_ids": (2, 7), "pixel_values": (1, 3, 32, 32), "attention_mask": (2, 7)}),
    "siglip": ("SiglipModel", {"input_ids": (2, 7), "pixel_values": (1, 3, 32, 32)}),
    "clip-vision": ("CLIPVisionModel", IMAGE),
    "wav2vec2-ctc": ("AutoModelForCTC", {"input_values": (1, 1601)}),
    "hubert-ctc": ("AutoModelForCTC", {"input_values": (1, 1601)}),
    "wav2vec2-classifier": ("AutoModelForAudioClassification", {"input_values": (1, 1601)}),
    "hubert-classifier": ("AutoModelForAudioClassification", {"input_values": (1, 1601)}),
}
"""``{checkpoint: (transformers.js class, inputs at a size the export did not verify)}``."""


def tjs_folder(given: Path | None) -> Path:
    folder = given or ROOT / "build" / "tjs"
    if not (folder / "node_modules" / "@huggingface" / "transformers").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", TJS], cwd=folder, check=True)
    return folder


def feeds(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    made = {}
    for name, shape in shapes.items():
        if name == "input_ids":
            made[name] = torch.randint(0, 99, shape, generator=generator)
        elif name == "attention_mask":
            made[name] = torch.ones(shape, dtype=torch.int64)
        else:
            made[name] = torch.randn(shape, generator=generator)
    return made


def node(tjs: Path, folder: Path, what: str, file: Path) -> object:
    done = subprocess.run(
        ["node", str(RUNNER), str(tjs), str(folder), what, str(file)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if "Error" in line] or done.stderr.splitlines()[-1:]
        raise RuntimeError(lines[0].strip() if lines else f"node exited {done.returncode}")
    return json.loads(done.stdout.splitlines()[-1])


def check(name: str, tjs: Path, work: Path) -> str:
    """One row: what transformers.js gave against eager transformers."""
    import transformers
    from opreg_transformers import media

    import opreg

    folder = media_checkpoints.save(name, work / "ckpt" / name)
    result = opreg.export_checkpoint(folder, work / "out" / name)
    klass, shapes = CHECKS[name]
    inputs = feeds(shapes)
    spec = {k: {"dtype": str(v.dtype).removeprefix("torch."), "dims": list(v.shape), "data": v.flatten().tolist()}
            for k, v in inputs.items()}  # fmt: skip
    (work / f"{name}.json").write_text(json.dumps(spec))
    got = node(tjs, result.folder, klass, work / f"{name}.json")
    eager = getattr(transformers, media.TASKS[result.task][0]).from_pretrained(folder).eval()
    with torch.no_grad():
        want = eager(**inputs)
    worst = 0.0
    for output in result.models[0].program.output_names:
        value = np.asarray(got[output]["data"], np.float32).reshape(got[output]["dims"])
        worst = max(worst, float(np.abs(value - want[output].numpy()).max()))
    return f"{result.task}: {klass} loads, {len(result.models[0].program.output_names)} outputs within {worst:.1e}"


def pipeline_check(tjs: Path, work: Path) -> str:
    """The image-classification pipeline end to end on a picture, against transformers'."""
    import transformers
    from PIL import Image

    out = work / "out" / "vit"
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    picture.save(work / "picture.png")
    got = node(tjs, out, "pipeline:image-classification", work / "picture.png")
    want = transformers.pipeline("image-classification", model=str(work / "ckpt" / "vit"))(picture, top_k=None)
    scores = {row["label"]: row["score"] for row in want}
    worst = max(abs(row["score"] - scores[row["label"]]) for row in got)
    return f"image-classification pipeline: {len(got)} labels, scores within {worst:.1e} of transformers'"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tjs", type=Path, help="a folder with node_modules/@huggingface/transformers")
    parser.add_argument("--only", nargs="*", choices=sorted(CHECKS), help="these checkpoints only")
    args = parser.parse_args(argv)
    tjs = tjs_folder(args.tjs)
    work = ROOT / "build" / "tjs_media"
    (work / "out").mkdir(parents=True, exist_ok=True)
    print("| checkpoint | transformers.js 4.3.1 |\n| --- | --- |")
    for name in args.only or CHECKS:
        try:
            row = check(name, tjs, work)
        except Exception as e:  # a runtime's refusal is a row of the table
            row = f"fails: {type(e).__name__}: {e}"
        print(f"| {name} | {row} |", flush=True)
    if not args.only or "vit" in args.only:
        try:
            row = pipeline_check(tjs, work)
        except Exception as e:
            row = f"fails: {type(e).__name__}: {e}"
        print(f"| vit | {row} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
