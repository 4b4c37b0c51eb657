"""Older ONNX Runtime releases, each in its own venv under ``build/``, to load and run exported models in.

``python_of("1.30.0")`` makes ``build/ort-1.30.0`` once (``pip install onnxruntime==1.30.0 numpy`` from
the package index; ~30 s, about 60 MB), keyed by version and kept for later runs; a lock lets parallel
test workers share it. :func:`run_models` runs models there in a subprocess: each loads, is fed its
inputs, and its outputs are compared with the expected ones. ``bench/runtimes.py`` uses the same venvs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"

RUN = r"""
import json, sys
import numpy as np
import onnxruntime

found = []
for model, feeds, expected, rtol, atol in json.loads(sys.argv[1]):
    row = {"model": model, "version": onnxruntime.__version__}
    try:
        session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception as e:
        row.update(loaded=False, error=str(e).splitlines()[0][-400:])
        found.append(row)
        continue
    row["loaded"] = True
    inputs = dict(np.load(feeds))
    try:
        outputs = session.run(None, inputs)
    except Exception as e:
        row.update(ran=False, error=str(e).splitlines()[0][-400:])
        found.append(row)
        continue
    wanted = np.load(expected)
    worst = max(
        (float(np.max(np.abs(got.astype(np.float64) - wanted[f"o{i}"].astype(np.float64)), initial=0.0))
         for i, got in enumerate(outputs)),
        default=0.0,
    )
    row.update(ran=True, max_abs=worst, matches=all(
        np.allclose(got, wanted[f"o{i}"], rtol=rtol, atol=atol) for i, got in enumerate(outputs)
    ))
    found.append(row)
print(json.dumps(found))
"""


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def python_of(version: str, extra: Sequence[str] = ()) -> Path:
    """The Python of ``build/ort-VERSION``, a venv with ``onnxruntime==VERSION`` and numpy (and
    ``extra`` requirements), made on first use."""
    venv = BUILD / f"ort-{version}"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    with _locked(BUILD / f"ort-{version}.lock"):
        if not done.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 f"onnxruntime=={version}", "numpy", *extra],
                check=True, env={**os.environ, "PIP_NO_INPUT": "1"},
            )  # fmt: skip
            done.write_text(version)
    return python


def write_case(folder: Path, name: str, feeds: Mapping[str, np.ndarray], expected: Sequence[np.ndarray]) -> tuple:
    """Save ``feeds`` (by ONNX input name) and ``expected`` (in output order) beside the model: the
    paths :func:`run_models` takes."""
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / f"{name}.feeds.npz", **feeds)
    np.savez(folder / f"{name}.expected.npz", **{f"o{i}": v for i, v in enumerate(expected)})
    return str(folder / f"{name}.feeds.npz"), str(folder / f"{name}.expected.npz")


def run_models(python: Path, cases: Sequence[tuple[str, str, str, float, float]]) -> list[dict]:
    """Run each ``(model, feeds.npz, expected.npz, rtol, atol)`` with ``python``'s onnxruntime: a row
    per model (``loaded``, ``ran``, ``matches``, ``max_abs``, ``error``)."""
    done = subprocess.run(
        [str(python), "-c", RUN, json.dumps(list(cases))], capture_output=True, text=True, check=False, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} could not run the models: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def decoder_step(inputs: Sequence, batch: int, length: int, past: int, padding: int) -> dict[str, np.ndarray]:
    """Random feeds for a decoder step (GenAI's names: ``input_ids``, ``attention_mask``,
    ``position_ids``, the cache) with ``inputs`` (a session's ``get_inputs()``) giving each one's shape:
    ``length`` new tokens of ``batch`` rows after a past of ``past``, the rows after the first
    left-padded by ``padding``, positions from the mask."""
    rng = np.random.default_rng(0)
    mask = np.ones((batch, past + length), np.int64)
    mask[1:, :padding] = 0
    dims = {"batch_size": batch, "sequence_length": length, "past_sequence_length": past}
    dims["total_sequence_length"] = past + length
    feeds = {}
    for value in inputs:
        shape = [d if isinstance(d, int) else dims[d] for d in value.shape]
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, 50, shape).astype(np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = mask
        elif value.name == "position_ids":
            feeds[value.name] = np.clip(np.cumsum(mask, 1) - 1, 0, None)[:, past:].astype(np.int64)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds
