"""Timing several models' ONNX Runtime sessions without favouring the one loaded first.

In one process holding several ONNX Runtime sessions (or GenAI models), the one loaded first can run
slower, two copies of the same folder too (issue 36: 1.05-1.15x for the copy loaded first). So a
bench's ratio of two models timed in one process depends on which was loaded first.
:func:`rotated` runs a bench's timing function once per model in a fresh process, each loading the
models in a rotated order (the first process loads them in the given order, the next starts with the
second model, and so on), splits the rounds between the processes and pools them: a ratio's median is
over every process's rounds, and no model is always loaded first.

The timing function is any module-level function of a bench, ``timer(paths, rounds)``: it loads
``paths`` (a name to a folder or file, in the order given) and returns each case's :class:`Timing`
per name. The fresh process imports it by its module's name (``bench.whisper`` for a function of
``python bench/whisper.py``), so a bench needs no flag of its own for it.

A child's command: ``python bench/rotated.py REQUEST``, ``REQUEST`` the JSON of the timer's
``module:name``, ``rounds`` and the ``paths`` as ``[name, path]`` pairs; it prints each case's
per-round seconds as JSON on its last line.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclasses.dataclass
class Timing:
    """One session's seconds per run in each interleaved round of a case."""

    rounds: list[float]

    @property
    def median(self) -> float:
        return float(np.median(self.rounds))

    def ratios(self, other: Timing) -> np.ndarray:
        """This session's time over ``other``'s in each round: each pair ran back to back, under the same load."""
        return np.array(self.rounds) / np.array(other.rounds)


Timer = Callable[[dict[str, Path], int], dict[str, dict[str, Timing]]]
"""A bench's timing function: ``paths`` loaded in their order, each case's :class:`Timing` per name."""


def rotated(timer: Timer, paths: dict[str, Path], rounds: int) -> dict[str, dict[str, Timing]]:
    """``timer`` in one fresh process per entry of ``paths``, each loading them in a rotated order,
    ``rounds`` split between the processes (at least one each); each case's rounds pooled in order, so
    the rounds of two names pair up as they ran, back to back in one process."""
    names = list(paths)
    result: dict[str, dict[str, Timing]] = {}
    for index in range(len(names)):
        order = names[index:] + names[:index]
        share = rounds // len(names) + (index < rounds % len(names))
        pairs = [[name, str(paths[name])] for name in order]
        request = json.dumps({"timer": _importable(timer), "rounds": max(share, 1), "paths": pairs})
        done = subprocess.run([sys.executable, __file__, request], check=False, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"timing in the order {order} failed:\n{done.stderr}")
        for label, times in json.loads(done.stdout.splitlines()[-1]).items():
            for name, values in times.items():
                result.setdefault(label, {}).setdefault(name, Timing([])).rounds.extend(values)
    return result


def _importable(timer: Timer) -> str:
    """``module:name`` of ``timer``; a function of the script being run is named by its path (``bench.llm``)."""
    module = timer.__module__
    if module == "__main__":
        script = Path(sys.modules["__main__"].__file__).resolve().with_suffix("")
        module = ".".join(script.relative_to(ROOT).parts)
    return f"{module}:{timer.__qualname__}"


def child(request: str) -> None:
    """A fresh process of :func:`rotated`: the timer of ``request`` on its paths, in their order."""
    task = json.loads(request)
    module, name = task["timer"].split(":")
    timer = getattr(importlib.import_module(module), name)
    result = timer({name: Path(path) for name, path in task["paths"]}, task["rounds"])
    print(json.dumps({label: {name: t.rounds for name, t in times.items()} for label, times in result.items()}))


if __name__ == "__main__":
    child(sys.argv[1])
