"""How often ``opreg.testing.Distribution`` finds a wrong distribution, and how often it raises a
false alarm on a right one: issue 26's table, re-measured.

Run: python bench/distribution_power.py [--seeds 20] [--draws 200] [--only TEXT]

For each case of ``tests/wrong_distributions.py`` (a Cauchy with swapped parameters or 3x the
scale, a uniform with the normal's mean and variance at 1,000 elements, dropout 0.25 instead of
0.3), at the sample size the suite checks the right impl with, the wrong impl and the core pack's
right one are each checked ``--seeds`` times at ai.onnx 18, ``Distribution(seed=s)`` for
s = 0, 1, ...: a new seed for ONNX Runtime and for eager PyTorch each time. Each check is made
twice: with the shape tests (opreg now) and with moments alone (``shape=False``: what opreg
compared before issue 26). The table counts the checks that failed: for a wrong impl, how often
it was found; for a right one, false alarms. The suite keeps one seeded run of each
(``tests/test_random.py``). Exits 1 if a wrong impl is found fewer than 19 times in 20 with the
shape tests, or a right one fails any check.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from opreg.testing import FAILED, Distribution, check_samples
from tests.wrong_distributions import WRONG, WrongDistribution


def failures(case: WrongDistribution, registry: opreg.Registry, seeds: int, draws: int, shape: bool) -> int:
    """How many of ``seeds`` seeded checks of ``case``'s call fail with ``registry``'s impl."""
    found = 0
    for seed in range(seeds):
        compare = Distribution(draws=draws, seed=seed, shape=shape)
        (check,) = check_samples(case.fn, [case.sample()], targets=[18], compare=compare, registry=registry)
        (result,) = check.results
        found += result.status == FAILED
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20, help="checks per impl and comparison (default 20)")
    parser.add_argument("--draws", type=int, default=200, help="draws per check (default 200, the suite's)")
    parser.add_argument("--only", default="", help="only cases whose name contains this")
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")

    right = opreg.default_registry()
    columns = ("wrong: found", "(moments only)", "right: false alarms", "(moments only)")
    header = f"{'case':46} " + " ".join(f"{c:>20}" for c in columns)
    print(f"{options.seeds} seeded checks each, {options.draws} draws, ai.onnx 18, ONNX Runtime")
    print(header)
    print("-" * len(header))
    started, ok = time.perf_counter(), True
    for case in WRONG:
        if options.only not in case.name:
            continue
        wrong = case.registry()
        counts = [
            failures(case, wrong, options.seeds, options.draws, shape=True),
            failures(case, wrong, options.seeds, options.draws, shape=False),
            failures(case, right, options.seeds, options.draws, shape=True),
            failures(case, right, options.seeds, options.draws, shape=False),
        ]
        ok &= counts[0] * 20 >= 19 * options.seeds and counts[2] == 0
        print(f"{case.name:46} " + " ".join(f"{f'{n}/{options.seeds}':>20}" for n in counts), flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
