"""Pre-quantized checkpoints (issue 51): ``opreg llm export`` against ONNX Runtime GenAI's builder
on the same GPTQ, AWQ and compressed-tensors checkpoints.

    python bench/llm_quantized.py [--checkpoint FOLDER ...] [--size tiny|small] [--markdown]

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
    args = parser.parse_args()
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
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in [header, *rows] if not args.markdown else rows:
        print("| " + " | ".join(row) + " |" if args.markdown else "  ".join(f"{c:<14}" for c in row))


if __name__ == "__main__":
    main()
