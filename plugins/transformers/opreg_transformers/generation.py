"""The loop check of an encoder-decoder folder: decoding in ONNX Runtime from the written files,
as its runtimes run them, against transformers: greedy generation against ``generate``
(``num_beams=1``, ``do_sample=False``), or for a bare model (``feature-extraction``) the decoder
fed fixed tokens one at a time against the model on the whole sequence.

Two prompts of different lengths (the shorter padded, so the encoder's mask counts) are encoded by
``encoder_model.onnx``; then each new token is the argmax of the decoder's last logits (or the next
fixed token), fed back for as many steps as the positions allow (up to :data:`STEPS`), never
stopping at an end token: the later steps are where exporters go wrong (T5's relative position
buckets, BART's positions after the past's length). With past, it runs the way transformers.js does
(``decoder_model_merged.onnx``: an empty past and ``use_cache_branch`` false at the first step, the
presents fed back after) and the way optimum's ``ORTModelForSeq2SeqLM`` does without the merged file
(``decoder_model.onnx`` then ``decoder_with_past_model.onnx``); without past, ``decoder_model.onnx``
on the whole sequence at each step. The tokens must equal ``generate``'s, and every step's logits
(or states) transformers' within :data:`TOLERANCE`; else :class:`opreg.VerificationError` names
the way and the step.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import opreg
from opreg_transformers import seq2seq
from opreg_transformers.seq2seq import CROSS, PAST, PRESENT, Layout

STEPS = 24
"""New tokens generated: past T5's exact buckets (16 with its 32 buckets) into the logarithmic ones."""
TOLERANCE = 1e-3
"""Logits' absolute and relative tolerance, through every step."""
LENGTHS = (9, 6)
"""The prompts' lengths: the second padded to the first."""


def check(folder: Path, layout: Layout, model: Any, past: bool, output: str = "logits") -> str:
    """Decoding in ``folder`` against ``model``; a one-line summary. ``output`` ``logits``: greedy
    generation against ``model.generate``; else (a bare model's ``last_hidden_state``) the decoder
    fed fixed tokens one at a time against ``model`` on the whole sequence, step by step."""
    ids, mask = _prompts(layout)
    steps = STEPS if layout.longest is None else min(STEPS, layout.longest - 1)
    greedy = output == "logits"
    tokens, expected = (
        _generate(model, layout, ids, mask, steps) if greedy else _states(model, layout, ids, mask, steps)
    )
    sessions = _Sessions(folder)
    ways: dict[str, Callable[..., Any]] = (
        {"merged decoder": _merged_step, "decoder then decoder with past": _split_step} if past
        else {"decoder without past": _full_step}
    )  # fmt: skip
    worst = 0.0
    for way, step in ways.items():
        got_tokens, got = _decode(sessions, layout, ids, mask, step, output, tokens if not greedy else None, steps)
        for index in range(steps):
            if not np.array_equal(got_tokens[:, : index + 2], tokens[:, : index + 2]):
                raise opreg.VerificationError(
                    f"greedy generation with the {way} differs from generate's at step {index + 1}: tokens "
                    f"{got_tokens[:, : index + 2].tolist()}, generate's {tokens[:, : index + 2].tolist()}"
                )
            error = float(np.abs(got[index] - expected[index]).max())
            if not np.allclose(got[index], expected[index], rtol=TOLERANCE, atol=TOLERANCE):
                raise opreg.VerificationError(
                    f"decoding with the {way}: step {index + 1}'s {output} differs from transformers' by {error:.2e}"
                )
            worst = max(worst, error)
    what = "greedy tokens of {} prompts equal generate's" if greedy else "decoder steps of {} prompts equal eager's"
    return f"{steps} {what.format(len(LENGTHS))} ({', '.join(ways)}); {output} within {worst:.1e}"


def _prompts(layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(0)
    ids = generator.integers(3, layout.vocab, size=(len(LENGTHS), max(LENGTHS)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    return ids, mask


def _generate(model: Any, layout: Layout, ids: np.ndarray, mask: np.ndarray, steps: int) -> tuple[Any, Any]:
    """``generate``'s tokens (the start token first) and each step's logits (:func:`greedy_generate`)."""
    return greedy_generate(model, ids, mask, steps, decoder_start_token_id=layout.start)


def greedy_generate(model: Any, ids: np.ndarray, mask: np.ndarray, steps: int, **config: Any) -> tuple[Any, Any]:
    """``generate``'s tokens and each step's logits, ``steps`` greedy steps, with the model's own
    generation config set aside: no end token, no forced or suppressed tokens (``config``: what the
    model needs besides, an encoder-decoder's ``decoder_start_token_id``)."""
    import torch
    import transformers

    plain = transformers.GenerationConfig(**config)
    asked = transformers.GenerationConfig(
        **config, max_new_tokens=steps, num_beams=1, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    kept, model.generation_config = model.generation_config, plain
    try:
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), generation_config=asked
            )
    finally:
        model.generation_config = kept
    return out.sequences.numpy(), np.stack([step.float().numpy() for step in out.logits])


def _states(model: Any, layout: Layout, ids: np.ndarray, mask: np.ndarray, steps: int) -> tuple[Any, Any]:
    """Fixed decoder tokens (the start token, then random ones) and the model's last hidden state
    at each of the first ``steps`` positions, the whole sequence at once."""
    import torch

    tokens = np.random.default_rng(1).integers(3, layout.decoder_vocab, size=(ids.shape[0], steps + 1))
    tokens[:, 0] = layout.start
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
            decoder_input_ids=torch.from_numpy(tokens[:, :steps]),
        )  # fmt: skip
    return tokens, out.last_hidden_state.numpy().transpose(1, 0, 2)


class _Sessions:
    """The folder's models in ONNX Runtime, each opened once; ``run(name, feeds)`` -> outputs by name."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.sessions: dict[str, Any] = {}

    def run(self, name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnxruntime

        try:
            session = self.sessions.get(name)
            if session is None:
                path = self.folder / f"{name}.onnx"
                session = self.sessions[name] = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            return dict(zip(names, session.run(names, feeds), strict=True))
        except Exception as e:  # ONNX Runtime's errors share no base class
            sizes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items() if not k.startswith(PAST))
            raise opreg.VerificationError(
                f"{name}.onnx fails in ONNX Runtime {onnxruntime.__version__} on {sizes}: {type(e).__name__}: {e}"
            ) from e


def _decode(
    sessions: _Sessions,
    layout: Layout,
    ids: np.ndarray,
    mask: np.ndarray,
    step: Callable[..., Any],
    output: str,
    forced: np.ndarray | None,
    steps: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The folder's tokens (the start token first) and each step's ``output`` at the new token,
    ``step`` running the decoder once (``step(sessions, layout, tokens, feeds, cache) -> outputs``);
    the next token the argmax of the logits, or ``forced``'s."""
    hidden = sessions.run(seq2seq.ENCODER, {"input_ids": ids, "attention_mask": mask})["last_hidden_state"]
    tokens = np.full((ids.shape[0], 1), layout.start, dtype=np.int64)
    feeds = {"encoder_attention_mask": mask, "encoder_hidden_states": hidden}
    cache: dict[str, np.ndarray] | None = None
    values = []
    for index in range(steps):
        outputs = step(sessions, layout, tokens, feeds, cache)
        values.append(outputs[output][:, -1])
        chosen = values[-1].argmax(-1) if forced is None else forced[:, index + 1]
        tokens = np.concatenate([tokens, chosen[:, None].astype(np.int64)], axis=1)
        cache = _next_cache(cache, outputs)
    return tokens, np.stack(values)


def _next_cache(cache: dict[str, np.ndarray] | None, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The presents as the next step's past; the cross-attention's kept from the first step (after
    it a decoder with past gives none, the merged one empty constants: transformers.js keeps them too)."""
    new = {PAST + name[len(PRESENT) :]: value for name, value in outputs.items() if name.startswith(PRESENT + ".")}
    if cache is not None:
        new.update((name, value) for name, value in cache.items() if f".{CROSS}." in name)
    return new


def _merged_step(sessions: _Sessions, layout: Layout, tokens: np.ndarray, feeds: dict, cache: dict | None) -> dict:
    if cache is None:  # transformers.js's first step: every past empty
        shape = (tokens.shape[0], layout.heads, 0, layout.head_size)
        cache = {name: np.zeros(shape, np.float32) for name in seq2seq.cache_names(PAST, layout.layers)}
    branch = np.array([tokens.shape[1] > 1])
    return sessions.run(seq2seq.MERGED, {**feeds, "input_ids": tokens[:, -1:], **cache, "use_cache_branch": branch})


def _split_step(sessions: _Sessions, layout: Layout, tokens: np.ndarray, feeds: dict, cache: dict | None) -> dict:
    if cache is None:
        return sessions.run(seq2seq.DECODER, {**feeds, "input_ids": tokens})
    mask = feeds["encoder_attention_mask"]
    return sessions.run(
        seq2seq.WITH_PAST_DECODER, {"encoder_attention_mask": mask, "input_ids": tokens[:, -1:], **cache}
    )


def _full_step(sessions: _Sessions, layout: Layout, tokens: np.ndarray, feeds: dict, cache: dict | None) -> dict:
    return sessions.run(seq2seq.DECODER, {**feeds, "input_ids": tokens})
