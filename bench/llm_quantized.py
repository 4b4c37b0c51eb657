"""Pre-quantized checkpoints (issue 51): ``opreg llm export`` against ONNX Runtime GenAI's builder
on the same GPTQ, AWQ and compressed-tensors checkpoints.

    python bench/llm_quantized.py [--checkpoint FOLDER ...] [--size tiny|small] [--markdown]
    python bench/llm_quantized.py --memory [--markdown]

Without ``--checkpoint``: the checkpoints of ``tests/quantized_checkpoints.py`` (GPTQ, GPTQ
act-order, AWQ, compressed-tensors) of a Llama of ``--size`` (:data:`SIZES`), written under
``build/llm_quantized/``. For each:

- opreg's folder (``opreg llm export CKPT -o OUT``, fp32 head, and ``--precision int4 --block-size
  32``, the head quantized too, as the builder's ``-p int4`` does) and the builder's (``-p int4 -e cpu``), where
  it loads the checkpoint; their sizes (``model.onnx`` and its data) and opreg's / the builder's;
- each folder's last-position logits in GenAI on a prompt against the checkpoint's own model
  (the tiny checkpoints: the float model of their integers; a checkpoint given: transformers'),
  max abs difference: the builder's reader (its ``loaders/gptq.py``, ``awq.py``) reading the
  layouts tests/quantized_checkpoints.py writes is the check of those layouts against a
  library's reader on this machine (gptqmodel and autoawq build CUDA extensions to install).

``--memory``: the export's peak memory on the largest quantized checkpoint written here in a few
minutes: a GPTQ checkpoint (4 bits, groups of 128, the hub's usual) of Llama-3.2-1B's shape
(:data:`MEMORY_SHAPE`, random weights), ``opreg llm export`` with the head float32 and
``--precision int4``, each in a fresh process: its peak resident memory (``wait4``, the process's
own, as bench/llm.py measures), CPU time, and the checkpoint's and the written folder's sizes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BUILD = ROOT / "build" / "llm_quantized"
PROMPT = [0, 17, 42, 99, 7, 123, 250, 3]


SIZES = {
    "tiny": {},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 4,
              "head_dim": 64, "num_hidden_layers": 4, "vocab_size": 4096},
}  # fmt: skip
"""The model's config values: tests/language_models.py's tiny Llama (its folder mostly graph and
tables), or one whose folder is mostly its weights, for the sizes."""


MEMORY_SHAPE = "1B"
"""bench/big_streaming.py's shape of the ``--memory`` checkpoint (Llama-3.2-1B's: 1.24B parameters)."""


def memory(markdown: bool) -> None:
    from bench.big_streaming import SHAPES, folder_gb, measured
    from tests import language_models as lm
    from tests import quantized_checkpoints as qc

    architecture, shape = SHAPES[MEMORY_SHAPE]
    folder = BUILD / "memory" / f"GPTQ_{MEMORY_SHAPE}_g128"
    if not (folder / "config.json").is_file():
        qc.gptq(folder, group=128, architecture=architecture, **shape)  # its float model dropped at once
        lm.tokenizer().save_pretrained(folder)
    header = ("checkpoint", "export", "checkpoint GB", "peak RSS GB", "peak / checkpoint", "folder GB", "CPU s")
    rows = []
    for label, flags in {"fp32 head": [], "--precision int4": ["--precision", "int4"]}.items():
        out = folder.parent / "out" / label.replace(" ", "_").replace("-", "")
        out.parent.mkdir(parents=True, exist_ok=True)
        done = measured([sys.executable, "-m", "opreg", "llm", "export", str(folder), "-o", str(out), *flags], None)
        if "error" in done:
            raise RuntimeError(f"{label} failed: {done['error']}")
        source = folder_gb(folder)
        rows.append((f"GPTQ {MEMORY_SHAPE} g128", label, f"{source:.2f}", f"{done['peak_gb']:.2f}",
                     f"{done['peak_gb'] / source:.2f}x", f"{folder_gb(out):.2f}", f"{done['cpu']:.0f}"))  # fmt: skip
    table(header, rows, markdown)


def table(header: tuple[str, ...], rows: list[tuple[str, ...]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in [header, *rows] if not markdown else rows:
        print("| " + " | ".join(row) + " |" if markdown else "  ".join(f"{c:<14}" for c in row))


def tiny_checkpoints(size: str) -> dict[str, tuple[Path, object]]:
    from tests import language_models as lm
    from tests import quantized_checkpoints as qc

    config = SIZES[size]
    made = {}
    for name, write in {
        "GPTQ 4-bit g32": qc.gptq, "GPTQ act-order": lambda f, **c: qc.gptq(f, act_order=True, **c),
        "AWQ 4-bit g32": qc.awq, "compressed-tensors W4A16 g32": qc.compressed,
    }.items():  # fmt: skip
        folder = BUILD / size / name.replace(" ", "_")
        reference = write(folder, **config)
        lm.tokenizer().save_pretrained(folder)
        made[name] = (folder, reference)
    return made


def export(command: list[str], out: Path) -> bool:
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode:
        print(f"  {' '.join(command[:4])}... failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return done.returncode == 0 and (out / "model.onnx").is_file()


def size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith("model.onnx"))


def genai_logits(folder: Path):
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens([PROMPT])
    return np.asarray(generator.get_output("logits"))[0, -1]


def same_blocks(ours: Path, builder: Path) -> str:
    """How many of the builder's MatMulNBits layers opreg's folder holds byte for byte (its ``B``,
    scales and zero points under opreg's names; the layers both write alone, not q/k/v)."""
    import numpy as np
    import onnx_ir as ir

    mine = ir.load(ours / "model.onnx").graph.initializers
    theirs = ir.load(builder / "model.onnx").graph.initializers
    same = compared = 0
    for name in theirs:
        if not name.endswith(".MatMulNBits.qweight"):
            continue
        base = "model." + name.removesuffix(".MatMulNBits.qweight").replace(".attn.", ".self_attn.")
        pairs = [(f"{base}.weight_{a}", name.replace("qweight", b)) for a, b in
                 (("Q4", "qweight"), ("scales", "scales"), ("zero_points", "qzeros"))]  # fmt: skip
        if not all(a in mine and b in theirs for a, b in pairs):
            continue
        compared += 1
        same += all(np.array_equal(mine[a].const_value.numpy().ravel(), theirs[b].const_value.numpy().ravel())
                    for a, b in pairs)  # fmt: skip
    return f"{same} of {compared}"


def reference_logits(folder: Path, model):
    import torch

    if model is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0, -1].numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", action="append", type=Path, default=[], help="a quantized checkpoint folder")
    parser.add_argument("--size", choices=SIZES, default="small", help="the model written (default: small)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--memory", action="store_true", help="the export's peak memory on a 1B GPTQ checkpoint")
    args = parser.parse_args()
    if args.memory:
        memory(args.markdown)
        return
    checkpoints = {str(p): (p, None) for p in args.checkpoint} or tiny_checkpoints(args.size)
    rows = []
    for name, (folder, model) in checkpoints.items():
        out = folder.parent / "out" / folder.name
        out.mkdir(parents=True, exist_ok=True)
        runs = {
            "opreg": [sys.executable, "-m", "opreg", "llm", "export", str(folder), "-o", str(out / "opreg")],
            "opreg int4": [sys.executable, "-m", "opreg", "llm", "export", str(folder), "-o", str(out / "opreg_int4"),
                           "--precision", "int4", "--block-size", "32"],
            "builder": [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o",
                        str(out / "builder"), "-p", "int4", "-e", "cpu"],
        }  # fmt: skip
        expected = reference_logits(folder, model)
        made = {}
        for label, command in runs.items():
            target = out / label.replace(" ", "_")
            if export(command, target):
                made[label] = (size(target), genai_logits(target))
        builder = made.get("builder", (None, None))
        if builder[0]:
            same = same_blocks(out / "opreg", out / "builder")
            print(f"  {name}: layers whose blocks are the builder's byte for byte: {same}")
        for label in ("opreg", "opreg int4", "builder"):
            if label in made:
                bytes_, logits = made[label]
                ratio = f"{bytes_ / builder[0]:.3f}" if builder[0] else "builder does not load it"
                to_builder = f"{abs(logits - builder[1]).max():.2e}" if builder[0] else "-"
                rows.append((name, label, f"{bytes_:,}", ratio, f"{abs(logits - expected).max():.2e}", to_builder))
    header = ("checkpoint", "folder", "model bytes", "/ builder", "max abs logits - checkpoint's model", "- builder's")
    table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
