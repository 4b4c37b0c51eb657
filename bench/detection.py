"""torchvision's detectors, opreg (with opreg-torchvision) against torch.onnx.export(dynamo=True), in one run:
export result, correctness against eager PyTorch, ONNX Runtime latency at one thread.

Run: python bench/detection.py [--size 320] [--runs 10] [--target onnx] [--models NAME ...]

Each model is a torchvision builder with random weights (no downloads), in eval mode, its transform resizing
to ``--size``. Its score threshold is calibrated first (``opreg_torchvision.samples``) so three images give
no, one and several detections; both exports are then run on all three in ONNX Runtime and compared with
eager PyTorch (detections matched in score order, ties in any order: boxes, labels, scores, masks,
keypoints). Where no threshold fits, the first three candidates are used with a threshold leaving five
detections on the third (the table shows the counts). Latency is the median of ``--runs`` ONNX Runtime runs
on the image with several detections at one thread, beside eager PyTorch at one thread; torch.onnx's
program, where it exports, is checked for correctness only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import re
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import onnxruntime
import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opreg_torchvision import samples

import opreg

MODELS = (
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "fasterrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn",
    "keypointrcnn_resnet50_fpn",
    "retinanet_resnet50_fpn",
    "fcos_resnet50_fpn",
    "ssd300_vgg16",
    "ssdlite320_mobilenet_v3_large",
)
OUTPUT_TOLERANCE = {"masks": 1e-4, "keypoints": 1e-3}


def build(name: str, size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    options: dict[str, Any] = {"weights": None, "weights_backbone": None}
    if not name.startswith("ssd"):  # the SSDs resize to their own fixed size
        options.update(min_size=size, max_size=size)
    model = torchvision.models.get_model(name, **options).eval()
    for module_name, module in model.named_modules():  # random classifiers score everything alike: spread them
        if not isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            continue
        if module_name.endswith(("cls_logits", "cls_score")) or ".classification_head.module_list." in module_name:
            torch.nn.init.normal_(module.weight, std=0.5 if isinstance(module, torch.nn.Linear) else 0.1)
    return samples.FirstImage(model)


def calibrate(model: torch.nn.Module, size: int) -> list[torch.Tensor]:
    """Three images giving no, one and several detections (the threshold set on the model), or the
    candidates' first three when none fits (the table then shows their detection counts)."""
    samples.set_score_thresh(model.model, 0.0)
    images = samples.candidate_images(size=size)
    found = samples._calibrate(model.model, images, many=3)
    if found is None:  # five detections on the third image at least, whatever the others give
        with torch.no_grad():
            top = model.model([images[2]])[0]["scores"].sort(descending=True).values
        samples.set_score_thresh(model.model, float(top[4] + top[5]) / 2 if len(top) > 5 else 0.0)
        return images[:3]
    return found[1]


def canonical(detections: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    boxes = detections["boxes"].double()
    keys = [boxes[:, i] for i in (3, 2, 1, 0)] + [detections["labels"].double(), -detections["scores"].double().round(
        decimals=5)]  # fmt: skip
    order = torch.arange(len(boxes))
    for key in keys:
        order = order[torch.sort(key[order], stable=True).indices]
    return {name: value[order] for name, value in detections.items()}


def compare(run: Any, model: torch.nn.Module, images: list[torch.Tensor]) -> str:
    """``ok (0/1/5 detections, max abs 1e-06)`` or what differs."""
    counts, worst = [], 0.0
    for image in images:
        with torch.no_grad():
            expected = canonical(model(image))
        try:
            got = canonical(run(image))
        except Exception as e:
            return f"run failed: {type(e).__name__}"
        counts.append(str(len(expected["scores"])))
        for key, value in expected.items():
            other = got.get(key)
            if other is None or tuple(other.shape) != tuple(value.shape):
                return f"{key}: shape {None if other is None else tuple(other.shape)} for {tuple(value.shape)}"
            if value.numel():
                difference = (other.double() - value.double()).abs().max().item()
                if difference > OUTPUT_TOLERANCE.get(key, 1e-4) * (1 + value.double().abs().max().item()):
                    return f"{key} differ by {difference:.2g}"
                worst = max(worst, difference)
    return f"ok ({'/'.join(counts)} detections, max abs {worst:.1g})"


def session(proto: Any) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--target", default="onnx", help="opreg's target (torch.onnx uses its default opset)")
    parser.add_argument("--models", nargs="*", help="only these models")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, ONNX Runtime {onnxruntime.__version__}; "
          f"random weights, images resized to {args.size}; opreg target {args.target}; latency: median of "
          f"{args.runs} runs at one thread")  # fmt: skip
    rows = []
    for name in args.models or MODELS:
        model = build(name, args.size)
        images = calibrate(model, args.size)
        row = {"model": name}
        started = time.perf_counter()
        try:
            ours = opreg.export(model, (images[2],), target=args.target)
            row["opreg"] = f"exported in {time.perf_counter() - started:.0f} s"
            row["opreg correct"] = compare(ours.run, model, images)
        except Exception as e:
            ours = None
            row["opreg"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
        started = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                theirs = torch.onnx.export(model, (images[2],), dynamo=True)
            row["torch.onnx"] = f"exported in {time.perf_counter() - started:.0f} s"
            with torch.no_grad():
                keys = list(model(images[2]))

            def run_theirs(image: torch.Tensor, keys: list = keys, program: Any = theirs) -> dict[str, torch.Tensor]:
                return dict(zip(keys, program(image), strict=True))

            row["torch.onnx correct"] = compare(run_theirs, model, images)
        except Exception as e:
            reason = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()[0][:60]
            row["torch.onnx"] = f"failed: {type(e).__name__}: {reason}"
        if ours is not None and row.get("opreg correct", "").startswith("ok"):
            our_session = session(ours.model_proto)
            feed = {our_session.get_inputs()[0].name: images[2].numpy()}
            times = []
            for _ in range(2):  # warm-up
                our_session.run(None, feed)
            for _ in range(args.runs):
                start = time.perf_counter()
                our_session.run(None, feed)
                times.append(time.perf_counter() - start)
            row["opreg ms"] = f"{statistics.median(times) * 1e3:.0f}"
            eager, threads = [], torch.get_num_threads()
            with torch.no_grad():
                torch.set_num_threads(1)
                for _ in range(max(args.runs // 2, 1)):
                    start = time.perf_counter()
                    model(images[2])
                    eager.append(time.perf_counter() - start)
                torch.set_num_threads(threads)
            row["eager ms"] = f"{statistics.median(eager) * 1e3:.0f}"
        rows.append(row)
        print(row, flush=True)
    columns = ["model", "opreg", "opreg correct", "opreg ms", "eager ms", "torch.onnx", "torch.onnx correct"]
    widths = {c: max(len(c), *(len(r.get(c, "-")) for r in rows)) for c in columns}
    print()
    print(" | ".join(c.ljust(widths[c]) for c in columns))
    print("-|-".join("-" * widths[c] for c in columns))
    for row in rows:
        print(" | ".join(row.get(c, "-").ljust(widths[c]) for c in columns))


if __name__ == "__main__":
    main()
