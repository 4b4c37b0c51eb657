"""``opreg export FOLDER`` over every (family, task) pair opreg-transformers' encoder loader serves,
and what verifying by default costs.

What it measures
----------------
1. The sweep (default): for each family of ``opreg_transformers.encoders.FAMILIES`` and each task
   it lists, a tiny random checkpoint (tests/test_checkpoint_encoders.py's configs) is written with
   ``save_pretrained`` and exported with ``opreg.export_checkpoint`` (verified at two sizes, as by
   default). One row per pair: exported and verified or the error, the largest difference from
   eager PyTorch, the export's CPU seconds in this process (capture, translation, verification;
   torch and transformers already imported).
2. ``--timing N``: the whole command as a user runs it, ``opreg export FOLDER -o DIR`` on a tiny
   BERT (the one transformers.js and optimum-cli were tried on: 2 layers, hidden 32), N times with
   ``--verify`` and N times with ``--no-verify``, alternating; the child process's CPU time (user +
   system, from ``resource.getrusage``), median and range. CPU, not wall time: the machine is shared.

    python bench/checkpoint_tasks.py                 # the sweep: every pair
    python bench/checkpoint_tasks.py --timing 5      # verify's cost on the whole command
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sweep(work: Path) -> int:
    from opreg_transformers import encoders

    import opreg
    from tests.test_checkpoint_encoders import save

    failed = 0
    print("| family | task | result | max abs vs eager | export CPU s |")
    print("| --- | --- | --- | --- | --- |")
    for family, spec in sorted(encoders.FAMILIES.items()):
        for task in spec.tasks:
            folder = save(work / f"{family}-{task}", family, task)
            started = time.process_time()
            try:
                result = opreg.export_checkpoint(folder, work / f"{family}-{task}-onnx")
            except Exception as e:  # a row of the table, not the end of the sweep
                failed += 1
                print(f"| {family} | {task} | {type(e).__name__}: {str(e).splitlines()[0][:120]} | | |", flush=True)
                continue
            worst = max(c.max_abs for m in result.models for v in m.verified for c in v.outputs)
            print(f"| {family} | {task} | verified | {worst:.2g} | {time.process_time() - started:.1f} |", flush=True)
    return failed


def _child_cpu(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def timing(work: Path, runs: int) -> None:
    from tests.test_checkpoint_export import save_bert

    folder = save_bert(work / "tiny-bert", max_position_embeddings=512)
    opreg = str(Path(sys.executable).with_name("opreg"))
    times: dict[str, list[float]] = {"--verify": [], "--no-verify": []}
    for _ in range(runs):
        for flag, seconds in times.items():
            seconds.append(_child_cpu([opreg, "export", str(folder), "-o", str(work / "out"), flag]))
    print("| command | CPU s, median | range |")
    print("| --- | --- | --- |")
    for flag, seconds in times.items():
        print(f"| opreg export tiny-bert -o out {flag} | {statistics.median(seconds):.2f} | "
              f"{min(seconds):.2f}-{max(seconds):.2f} |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--timing", type=int, metavar="N", help="time the whole command N times with and without verify"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.timing:
            timing(Path(tmp), args.timing)
            return 0
        return 1 if sweep(Path(tmp)) else 0


if __name__ == "__main__":
    sys.exit(main())
