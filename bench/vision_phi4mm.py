"""Phi-4-multimodal: opreg's decoder on embeddings against ONNX Runtime GenAI's builder's Phi-3.

Run: python bench/vision_phi4mm.py [--rounds N] [--keep DIR]

GenAI 0.18's builder builds ``Phi4MMForCausalLM`` (the original remote-code checkpoint, its vision
LoRA merged), not transformers' ``Phi4MultimodalForCausalLM``: it refuses the checkpoint
(``NotImplementedError``). Phi-4-multimodal's language model is Phi-3's, under the same weight
names, so the builder gets a ``Phi3ForCausalLM`` checkpoint holding the same text weights
(``--extra_options exclude_embeds=true``: its decoder on ``inputs_embeds``). One random-init
Phi-4-multimodal (seed 0): its text model hidden 512, 8 layers, 8 query and 2 key/value heads,
feed-forward 2048, vocab 32000; a 1-layer SigLIP of hidden 64 on 448-pixel crops in patches of 14;
a 1-block audio encoder (which the class always holds, not exported). Then:

1. ``opreg llm export PHI4MM -o OUT`` (its defaults, then ``-t onnxruntime``) and the builder on
   the Phi-3 checkpoint, once each.
2. Latency: each folder's ``model.onnx`` (the decoder on embeddings) in an ONNX Runtime session
   (CPU, 1 thread): a decode step after 128 and after 1024 tokens, and a 128-token prompt (its
   embeddings random), thread CPU time per call in interleaved rounds; the ratio is the median over
   rounds of opreg's time over the builder's in the same round (below 1.0 opreg is faster).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llm_lfm2 import HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB, latency


def checkpoints(root: Path) -> tuple[Path, Path]:
    """Save the random-init Phi-4-multimodal (seed 0) and a Phi-3 of its text weights, each with the
    tests' tokenizer."""
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM, Phi4MultimodalConfig, Phi4MultimodalForCausalLM

    from tests import language_models as lm
    from tests import vision_models as vm

    text = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 2048, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 2048,
            "original_max_position_embeddings": 2048,
            "bos_token_id": lm.EOS, "eos_token_id": lm.EOS, "pad_token_id": lm.PAD}  # fmt: skip
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_token_id": lm.VOCAB + 2}  # fmt: skip
    audio = {"hidden_size": 32, "intermediate_size": 64, "num_blocks": 1, "num_attention_heads": 2,
             "ext_pw_out_channel": 32, "depthwise_separable_out_channel": 32, "nemo_conv_channels": 32,
             "input_size": 16, "audio_token_id": lm.VOCAB + 3}  # fmt: skip
    torch.manual_seed(0)
    model = Phi4MultimodalForCausalLM(Phi4MultimodalConfig(**text, vision_config=vision, audio_config=audio)).eval()
    phi3 = Phi3ForCausalLM(Phi3Config(**text)).eval()
    missing = phi3.load_state_dict(model.state_dict(), strict=False).missing_keys
    if missing:
        raise SystemExit(f"the Phi-3 checkpoint lacks {missing}")
    folders = root / "phi4mm", root / "phi3"
    tokenizer = vm.tokenizer(("<|image|>", "<|audio|>"))
    for saved, folder in zip((model, phi3), folders, strict=True):
        saved.generation_config.eos_token_id, saved.generation_config.pad_token_id = lm.EOS, lm.PAD
        saved.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="latency: 10x as many rounds")
    parser.add_argument("--keep", type=Path, help="keep the checkpoints and the folders here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        phi4mm, phi3 = checkpoints(root)
        folders = {name: root / name.replace(" ", "-") for name in ("opreg", "opreg -t onnxruntime", "builder")}
        opreg = [sys.executable, "-m", "opreg", "llm", "export", str(phi4mm), "-o"]
        builder = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(phi3), "-p", "fp32", "-e", "cpu",
                   "-c", str(root / "cache"), "--extra_options", "exclude_embeds=true", "-o"]  # fmt: skip
        for command in ([*opreg, str(folders["opreg"])],
                        [*opreg, str(folders["opreg -t onnxruntime"]), "-t", "onnxruntime"],
                        [*builder, str(folders["builder"])]):  # fmt: skip
            subprocess.run(command, check=True, capture_output=True)
        latency(folders, 10 * args.rounds)


if __name__ == "__main__":
    main()
