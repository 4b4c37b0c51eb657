"""The pack author's walk (docs/writing-packs.md), timed command by command.

What it measures
----------------
It runs the guide as a newcomer does, in a fresh venv that sees this environment's packages behind its
own (as ``tests/test_pack_author.py`` does, whose helpers it uses): each shell command of the guide in
order, the guide's files written where its code blocks say. For each command it reports the process's
wall time and CPU time (user + system of the child), and the exit code; the files of the generated pack
the author edits (the guide's code blocks that land inside the pack) are counted. Then ``opreg
pack-check`` on the finished pack runs ``--rounds`` more times, each in a fresh process (median).

Run::

    python bench/pack_author.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_pack_author import FILES, command, place, walk  # noqa: E402
from tests.test_scaffold import layered_venv, run  # noqa: E402


def timed(args: list[str], cwd: Path) -> tuple[int, float, float]:
    """Run ``args``: (exit code, wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = run(*args, cwd=cwd, timeout=900)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return done.returncode, wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="extra pack-check runs on the finished pack")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        python = layered_venv(Path(scratch) / "venv")
        cwd = Path(scratch) / "work"
        cwd.mkdir()
        print("| step | exit | wall s | CPU s |\n|---|---|---|---|")
        for kind, text in walk():
            if kind == "file":
                place(text, cwd, python)
                print(f"| write {text.split(chr(10), 1)[0].removeprefix('# ')} | | | |")
                continue
            code, wall, cpu = timed(command(text, python), cwd)
            shown = text.split("#", 1)[0].strip().replace("|", "\\|")
            print(f"| `{shown}` | {code} | {wall:.1f} | {cpu:.1f} |", flush=True)
        edited = [f for f in FILES if f.startswith("opreg-swishpack/")]
        print(f"\nfiles of the generated pack edited: {len(edited)} ({', '.join(edited)})")
        runs = [timed(command("opreg pack-check swishpack", python), cwd) for _ in range(args.rounds)]
        assert all(code == 0 for code, _, _ in runs), runs
        wall = statistics.median(r[1] for r in runs)
        cpu = statistics.median(r[2] for r in runs)
        print(f"opreg pack-check swishpack, {args.rounds} fresh processes: median wall {wall:.1f} s, CPU {cpu:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
