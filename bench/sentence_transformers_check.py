"""opreg-transformers' sentence-transformers loader against the library itself.

The loader rebuilds a sentence-transformers pipeline from the folder's files (pooling modes from
``1_Pooling/config.json``) without the library, and the suite checks it against the pooling written
again by hand; this compares with ``SentenceTransformer.encode`` itself. The library needs
scikit-learn, which transformers then imports in every process (0.75 s of CPU), so it is not in the
dev set-up: this script makes ``build/st-venv``, a venv that sees the dev venv's packages behind its
own, installs sentence-transformers there, and in it, for each pooling mode: saves a tiny MPNet
pipeline with ``SentenceTransformer.save``, exports the folder with ``opreg.export_checkpoint``,
and compares ONNX Runtime's ``sentence_embedding`` with ``encode`` on padded sentences.

    python bench/sentence_transformers_check.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "build" / "st-venv"

CHECK = r"""
import sys, tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

import opreg

MODES = [("mean",), ("cls",), ("max",), ("mean_sqrt_len_tokens",), ("weightedmean",), ("lasttoken",), ("cls", "mean")]
SENTENCES = ["the cat sat", "a dog", "hello world and more words than the others"]
print(f"sentence-transformers {sentence_transformers.__version__}, transformers {transformers.__version__}")
print("| pooling | normalised | max abs (ONNX Runtime vs encode) |")
print("| --- | --- | --- |")
worst = 0.0
with tempfile.TemporaryDirectory() as tmp:
    base = Path(tmp) / "base"
    torch.manual_seed(0)
    config = transformers.MPNetConfig(vocab_size=64, max_position_embeddings=42, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=37)
    transformers.MPNetModel(config).save_pretrained(base)
    words = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", *"abcdefghijklmnopqrstuvwxyz"]
    special = dict(cls_token="<s>", pad_token="<pad>", sep_token="</s>", unk_token="<unk>", mask_token="<mask>")
    transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, **special).save_pretrained(base)
    for i, modes in enumerate(MODES):
        mode = modes[0] if len(modes) == 1 else modes
        model = SentenceTransformer(modules=[Transformer(str(base)), Pooling(32, pooling_mode=mode), Normalize()])
        folder = Path(tmp) / f"st{i}"
        model.save(str(folder))
        opreg.export_checkpoint(folder, Path(tmp) / f"out{i}")
        loaded = SentenceTransformer(str(folder), device="cpu")
        want = loaded.encode(SENTENCES, convert_to_numpy=True)
        features = loaded.tokenize(SENTENCES)
        session = onnxruntime.InferenceSession(Path(tmp) / f"out{i}" / "model.onnx", providers=["CPUExecutionProvider"])
        _, got = session.run(None, {k: features[k].numpy() for k in ("input_ids", "attention_mask")})
        diff = float(np.abs(got - want).max())
        worst = max(worst, diff)
        print(f"| {' + '.join(modes)} | yes | {diff:.2g} |", flush=True)
sys.exit(0 if worst < 1e-4 else 1)
"""


def venv() -> Path:
    """``build/st-venv``'s python, made once: the dev venv's packages behind sentence-transformers."""
    sys.path.insert(0, str(ROOT))
    from tests.test_scaffold import layered_venv

    python = VENV / "bin" / "python"
    if not python.exists():
        VENV.parent.mkdir(exist_ok=True)
        layered_venv(VENV)
        subprocess.run([python, "-m", "pip", "install", "-q", "sentence-transformers"], check=True)
    return python


def main() -> int:
    return subprocess.run([venv(), "-c", CHECK], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
