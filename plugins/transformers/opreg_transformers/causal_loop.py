"""The loop check of a causal LM's folder: greedy generation from the written ``model.onnx`` in
ONNX Runtime, as optimum's ``ORTModelForCausalLM`` and transformers.js run it, against
transformers' ``generate`` (``num_beams=1``, ``do_sample=False``, the checkpoint's generation
config set aside: no end token stops it; :func:`opreg_transformers.generation.greedy_generate`).

Two prompts of different lengths, the shorter padded on the left (as a decoder-only batch is
padded, so the mask and the positions count); the first step feeds the prompts with every past
empty, each next one the chosen tokens with the presents as the past, the mask grown by one and
the positions counted from it as ``generate`` counts them. The tokens must equal ``generate``'s at
every step, and each step's logits transformers' within :data:`TOLERANCE`; else
:class:`opreg.VerificationError` names the step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import opreg
from opreg_transformers import generation, loading

STEPS = 20
"""New tokens generated (at most what the positions allow after the prompt)."""
TOLERANCE = 1e-3
"""Logits' absolute and relative tolerance, through every step."""
LENGTHS = (7, 4)
"""The prompts' lengths: the second padded on the left to the first."""
PAST, PRESENT = "past_key_values", "present"
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def check(folder: Path, checkpoint: Path) -> str:
    """Greedy generation from ``folder``'s ``model.onnx`` against ``checkpoint``'s model; a one-line summary."""
    import torch

    model = loading.load(checkpoint, "AutoModelForCausalLM", dtype=torch.float32)
    text = model.config.get_text_config(decoder=True)
    limit = getattr(text, "max_position_embeddings", None) or STEPS + max(LENGTHS)
    steps = min(STEPS, limit - max(LENGTHS))
    ids, mask = prompts(int(text.vocab_size))
    tokens, logits = generation.greedy_generate(model, ids, mask, steps)
    got_tokens, got = greedy(Path(folder) / "model.onnx", ids, mask, steps)
    worst = 0.0
    for index in range(steps):
        end = ids.shape[1] + index + 1
        if not np.array_equal(got_tokens[:, :end], tokens[:, :end]):
            raise opreg.VerificationError(
                f"greedy generation from model.onnx differs from generate's at step {index + 1}: tokens "
                f"{got_tokens[:, ids.shape[1] : end].tolist()}, generate's {tokens[:, ids.shape[1] : end].tolist()}"
            )
        error = float(np.abs(got[index] - logits[index]).max())
        if not np.allclose(got[index], logits[index], rtol=TOLERANCE, atol=TOLERANCE):
            raise opreg.VerificationError(f"greedy generation: step {index + 1}'s logits differ by {error:.2e}")
        worst = max(worst, error)
    return f"{steps} greedy tokens of {len(LENGTHS)} prompts (left-padded) equal generate's; logits within {worst:.1e}"


def prompts(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids of :data:`LENGTHS`, left-padded, and their mask."""
    ids = np.random.default_rng(0).integers(3, vocab, size=(len(LENGTHS), max(LENGTHS)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        mask[row, max(LENGTHS) - length :] = 1
    return ids, mask


def greedy(path: Path, ids: np.ndarray, mask: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The tokens (the prompts first) and each step's last logits of greedy generation with the
    decoder at ``path`` in ONNX Runtime."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = {value.name: value for value in session.get_inputs()}
    names = [value.name for value in session.get_outputs()]
    batch = ids.shape[0]
    cache = {
        name: np.zeros((batch, value.shape[1], 0, value.shape[3]), _DTYPES[value.type])
        for name, value in inputs.items()
        if name.startswith(PAST + ".")
    }
    tokens, new, values = ids, ids, []
    for _ in range(steps):
        feeds = {"input_ids": new, "attention_mask": mask, **cache}
        if "position_ids" in inputs:  # as generate counts them: a padding token takes no position
            positions = np.cumsum(mask, -1) - 1
            feeds["position_ids"] = np.where(mask == 0, 1, positions)[:, -new.shape[1] :]
        try:
            outputs = dict(zip(names, session.run(names, feeds), strict=True))
        except Exception as e:  # ONNX Runtime's errors share no base class
            raise opreg.VerificationError(
                f"{path.name} fails in ONNX Runtime {onnxruntime.__version__} at step {len(values) + 1}: "
                f"{type(e).__name__}: {e}"
            ) from e
        values.append(outputs["logits"][:, -1].astype(np.float32))
        new = values[-1].argmax(-1)[:, None].astype(np.int64)
        tokens = np.concatenate([tokens, new], axis=1)
        mask = np.concatenate([mask, np.ones_like(new)], axis=1)
        cache = {
            PAST + name[len(PRESENT) :]: value for name, value in outputs.items() if name.startswith(PRESENT + ".")
        }
    return tokens, np.stack(values)
