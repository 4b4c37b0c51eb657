"""opreg's diffusion folders in optimum-onnx's runtime: ``ORTDiffusionPipeline`` on what ``opreg
export`` writes, against the diffusers pipeline.

What it measures
----------------
For each tiny random pipeline of the suite (``tests/diffusion_pipelines.py``: Stable Diffusion, SDXL,
SD3, Flux) it exports the folder with ``opreg.export_checkpoint`` (in this process: the CPU time of the
export, verification and loop check included, torch and diffusers already imported), then loads the
folder, unchanged, with optimum-onnx 0.1.0's ``ORTDiffusionPipeline.from_pretrained`` in a side venv
(transformers 4.57.3, diffusers 0.35.2: the newest diffusers that runs beside that transformers) and
generates an image (prompt "a cat sat on the mat", 2 steps, seed 0, 16 x 24) that is compared with the
diffusers pipeline's in this environment (the largest difference, values in [0, 1]). Then how far the loop
check's image moves when the folder's denoiser is wrong: its output layer's weight (the UNet's
``conv_out``, the transformer's ``proj_out``) scaled by 1.01 and 1.05 (the check's tolerance is 1/510).

The side venv lives in ``build/optimum-diffusers`` and is made on the first run (the CPU torch of the
lock, optimum-onnx 0.1.0, transformers 4.57.3, diffusers 0.35.2; a few minutes). The tiny pipelines'
tokenizers are written by transformers 5, whose ``tokenizer_config.json`` transformers 4.57 cannot read
for T5 and whose CLIP tokenizer it reads only as the fast one: the side script loads them itself and
hands them to ``from_pretrained`` (a hub checkpoint's tokenizers load as they are).

Run::

    python bench/diffusion_runtime.py [--rebuild-venv]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import opreg  # noqa: E402
from tests import diffusion_pipelines  # noqa: E402

BUILD = ROOT / "build" / "diffusion_runtime"
VENV = ROOT / "build" / "optimum-diffusers"
SIDE_PACKAGES = ["torch==2.13.0+cpu", "onnxruntime==1.32.0", "optimum-onnx==0.1.0", "transformers==4.57.3",
                 "diffusers==0.35.2", "pillow"]  # fmt: skip
CALL = {"prompt": "a cat sat on the mat", "num_inference_steps": 2, "height": 16, "width": 24, "output_type": "np"}
SIDE_SCRIPT = """
import json, sys
from pathlib import Path

import numpy as np
import torch
import transformers
from optimum.onnxruntime import ORTDiffusionPipeline

folder, call, out = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
tokenizers = {}
for name in ("tokenizer", "tokenizer_2", "tokenizer_3"):
    if (folder / name).is_dir():
        try:
            tokenizers[name] = transformers.AutoTokenizer.from_pretrained(folder / name)
        except AttributeError:  # transformers 5's T5 tokenizer_config.json: its tokenizer.json alone
            tokenizers[name] = transformers.T5TokenizerFast(tokenizer_file=str(folder / name / "tokenizer.json"),
                                                            extra_ids=0)
pipeline = ORTDiffusionPipeline.from_pretrained(folder, **tokenizers)
pipeline.set_progress_bar_config(disable=True)
np.save(out, pipeline(**call, generator=torch.Generator().manual_seed(0)).images)
print(type(pipeline).__name__)
"""


def side_venv(rebuild: bool) -> Path:
    """The side venv's python, made on first use."""
    python = VENV / "bin" / "python"
    if rebuild or not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *SIDE_PACKAGES], check=True)
    return python


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def call_of(family: str) -> dict[str, object]:
    return {**CALL, **({"max_sequence_length": 32} if family in ("stable-diffusion-3", "flux") else {})}


def measure(family: str, python: Path) -> dict[str, object]:
    import diffusers

    source = diffusion_pipelines.save(family, BUILD / "pipelines" / family)
    (BUILD / "onnx").mkdir(exist_ok=True)
    started = cpu()
    result = opreg.export_checkpoint(source, BUILD / "onnx" / family)
    export_cpu = cpu() - started
    out = BUILD / f"{family}-optimum.npy"
    side = subprocess.run([str(python), "-c", SIDE_SCRIPT, str(result.folder), _json(call_of(family)), str(out)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    eager = diffusers.DiffusionPipeline.from_pretrained(source)
    eager.set_progress_bar_config(disable=True)
    want = eager(**call_of(family), generator=torch.Generator().manual_seed(0)).images
    optimum = f"{float(np.abs(np.load(out) - want).max()):.1e}" if side.returncode == 0 else side.stderr[-300:]
    return {
        "family": family,
        "models": len(result.models),
        "export CPU s": f"{export_cpu:.1f}",
        "opreg loop check": result.checks[0].split("within ")[1].split(" ")[0],
        "optimum ORTDiffusionPipeline vs diffusers": optimum,
        "runtime class": side.stdout.strip(),
        "loop, denoiser 1 % off": moved(source, result.folder, 1.01),
        "loop, denoiser 5 % off": moved(source, result.folder, 1.05),
    }


def moved(source: Path, folder: Path, factor: float) -> str:
    """The loop check's image difference once the denoiser's output layer is ``factor`` times its weight."""
    import shutil

    import onnx

    from opreg_diffusers import loaders

    changed = BUILD / "changed"
    shutil.rmtree(changed, ignore_errors=True)
    shutil.copytree(folder, changed)
    denoiser = next(changed / n / "model.onnx" for n in ("unet", "transformer") if (changed / n).is_dir())
    model = onnx.load(denoiser)
    layers = [t for t in model.graph.initializer if t.name.endswith(("conv_out.weight", "proj_out.weight"))]
    weight = min(layers, key=lambda t: len(t.name))  # the model's own, not a block's
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * factor, weight.name))
    onnx.save(model, denoiser)
    checkpoint = opreg.Checkpoint(source)
    plan = loaders.plan(checkpoint, "text-to-image")
    try:
        said = plan.checks[0].run(opreg.CheckContext(checkpoint, plan, {}, {}, changed))
    except opreg.VerificationError as e:
        said = str(e)
    return said.split("within ")[1].split(" ")[0] + (" (fails)" if "NOT within" in said else " (passes)")


def _json(value: object) -> str:
    import json

    return json.dumps(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rebuild-venv", action="store_true", help="make build/optimum-diffusers again")
    args = parser.parse_args()
    python = side_venv(args.rebuild_venv)
    rows = [measure(family, python) for family in diffusion_pipelines.PIPELINES]
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("| " + " | ".join("---" for _ in columns) + " |")
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    print(f"\n{time.strftime('%Y-%m-%d')}, opreg {opreg.__version__}, torch {torch.__version__}, onnxruntime "
          f"{__import__('onnxruntime').__version__}; side venv: {', '.join(SIDE_PACKAGES)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
