"""LFM2-VL: opreg's decoder on embeddings against ONNX Runtime GenAI's builder's.

Run: python bench/vision_lfm2.py [--rounds N] [--keep DIR]

GenAI 0.18's builder builds LFM2-VL's language model only (``--extra_options exclude_embeds=true``:
the decoder of GenAI's ``lfm2_vl`` pipeline, on ``inputs_embeds``); opreg writes the whole folder.
One random-init LFM2-VL, saved once with the tests' tokenizer and an image processor: its text
model is bench/llm_lfm2.py's LFM2 (hidden 512, 8 layers, attention at 2, 5 and 7, short
convolutions of kernel 3 in the others, 8 query and 2 key/value heads, vocab 32000), its vision
encoder a 2-layer SigLIP2 of hidden 256 on patches of 16, merged 2x2. Then:

1. Export time: ``opreg llm export CKPT -o OUT`` (its defaults, then ``-t onnxruntime``) and the
   builder (``-p fp32 -e cpu --extra_options exclude_embeds=true``), each in a fresh process, in
   interleaved rounds: the median CPU and wall time (``OMP_NUM_THREADS=1``) and the folder's size.
2. Latency: each folder's ``model.onnx`` (the decoder on embeddings) in an ONNX Runtime session
   (CPU, 1 thread): a decode step after 128 and after 1024 tokens, and a 128-token prompt (its
   embeddings random), thread CPU time per call in interleaved rounds; the ratio is the median over
   rounds of opreg's time over the builder's in the same round (below 1.0 opreg is faster).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llm_lfm2 import ATTENTION, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB, exports, latency

TOKENS = ("<|image_start|>", "<|image_end|>", "<image>")


def checkpoint(folder: Path) -> Path:
    """Save the random-init LFM2-VL (seed 0), the tests' tokenizer and its image processor to ``folder``."""
    import torch
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration, Lfm2VlImageProcessor

    from tests import language_models as lm
    from tests import vision_models as vm

    text = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 2048, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 2048,
            "layer_types": ["full_attention" if i in ATTENTION else "conv" for i in range(LAYERS)],
            "bos_token_id": lm.EOS, "eos_token_id": lm.EOS, "pad_token_id": lm.PAD}  # fmt: skip
    vision = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 4,
              "patch_size": 16, "num_patches": 256}  # fmt: skip
    config = Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=lm.VOCAB + 2,
                          projector_hidden_size=1024, downsample_factor=2)  # fmt: skip
    torch.manual_seed(0)
    model = Lfm2VlForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = lm.EOS, lm.PAD
    model.save_pretrained(folder)
    vm.tokenizer(TOKENS).save_pretrained(folder)
    Lfm2VlImageProcessor(do_image_splitting=False).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="export rounds (latency: 10x as many)")
    parser.add_argument("--keep", type=Path, help="keep the checkpoint and the folders here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        ckpt = root / "checkpoint"
        if not (ckpt / "config.json").is_file():
            checkpoint(ckpt)
        folders = exports(ckpt, root, args.rounds, ("--extra_options", "exclude_embeds=true"))
        latency(folders, 10 * args.rounds)


if __name__ == "__main__":
    main()
