"""Cost of pack discovery: registry build time and ``opreg plugins`` wall time.

What it measures
----------------
For 0, 10 and 100 synthetic packs (10 impls each) it builds a throwaway
"site-packages" in a temp dir: each pack is a real distribution on disk
(``<pkg>/__init__.py`` plus ``<pkg>-0.1.dist-info/`` with ``METADATA`` and an
``opreg.plugins`` entry point), byte-compiled as pip would. The installed
packs (core, ort_contrib, test_customop) load in every scenario, so the 0-pack
row is the baseline. Each measurement runs in a fresh interpreter with the
temp dir on ``PYTHONPATH`` (and ``OPREG_DISABLE_PLUGIN_AUTOLOAD`` removed),
which:

1. imports torch, onnx, onnxscript, onnxruntime and opreg first: that time is
   *not* counted (``--json`` shows it as ``import_s``);
2. times the first ``opreg.packs.plugins.build_registry()`` (**cold**: finds the
   entry points, imports every pack, runs the hooks, looks up torch schemas);
3. times more builds, each after ``opreg.packs.plugins.clear_cache()`` (**warm**:
   the pack modules are imported and torch schemas cached already, so this is
   discovery + hooks + validating and adding the impls);
4. times ``registry.resolve("aten::relu", target)`` per call with timeit, the
   target built once; relu has an impl in the core pack and in half of the
   synthetic packs (50 candidates with 100 packs);
5. checks that every synthetic pack is ``loaded`` with all its impls, and
   otherwise exits non-zero naming the pack.

Then it runs the real console command ``opreg plugins --json --no-cache`` per
scenario and reports its whole-process wall time (best / median), which
includes interpreter start-up, the torch import and loading every pack. And it
runs ``opreg plugins --json``, ``opreg ops --json`` and ``opreg explain
aten::relu --json`` as a user's second run does, answered from the cache of
what packs declare (:mod:`opreg.packs.packcache`, in a temp dir, filled once per
scenario by an untimed run): whole-process wall time, median over the rounds,
and each run checked to import no torch.

Every measurement is repeated over ``ROUNDS`` rounds that visit the scenarios
in turn, so drift in machine load hits all rows alike. Reported: median cold
build over the rounds' processes, median of all warm builds, median resolve
time (each process: median of 5 timeit repeats), median cached command time.

How to read it
--------------
``added vs 0 packs`` is a row's build time minus the 0-pack row's (cold /
warm): what the synthetic packs cost a registry build. The goals are checked
against this run's own numbers, as differences, never against another
machine's: 100 packs add < 150 ms to a cold build, resolving one op takes
< 20 µs (worst scenario), and with nothing changed since the last run each of
``opreg plugins``, ``ops`` and ``explain`` answers in <= 0.5 s wall (median, worst
scenario; issue 28). Cold builds carry tens of ms of noise (one sample
per process, and the 0-pack baseline includes test_customop defining its torch
custom op); warm builds are steadier. The 10- and 100-pack rows show whether
the cost grows linearly with the number of packs.

Run from the repo root: ``python bench/discovery.py [--json]`` (about two
minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCENARIOS = (0, 10, 100)
IMPLS_PER_PACK = 10
PACK_MODULE = "opreg_bench_pack_{index:03d}"
PACK_PREFIX = "bench_"
PACK_NAME = PACK_PREFIX + "{index:03d}"
RESOLVE_OP = "aten::relu"
ROUNDS = 3
"""Fresh measuring processes and ``opreg plugins`` runs per scenario."""
WARM_BUILDS = 5
RESOLVE_REPEATS = 5
AUTOLOAD_ENV = "OPREG_DISABLE_PLUGIN_AUTOLOAD"
CACHE_ENV = "OPREG_CACHE_DIR"
NO_CACHE_ENV = "OPREG_NO_CACHE"
CACHED_COMMANDS = {
    "plugins": ["plugins", "--json"],
    "ops": ["ops", "--json"],
    "explain": ["explain", RESOLVE_OP, "--json"],
}
"""The commands that answer from the cache of what packs declare, as timed."""
CACHED_GOAL_S = 0.5
HEAVY_IMPORTS = ("torch", "onnx", "onnxscript", "onnxruntime")
"""Imported, untimed, before measuring, in this order: torch first as in a user's program (the order
changes what a first build costs), onnxruntime because ort_contrib's ``opreg_targets`` hook imports it."""

ADDED_BUILD_GOAL_MS = 150.0
RESOLVE_GOAL_US = 20.0

# ATen ops with schema ``(Tensor self) -> Tensor`` -> the ONNX op that implements them.
UNARY_OPS = {
    "relu": "Relu",
    "abs": "Abs",
    "neg": "Neg",
    "exp": "Exp",
    "log": "Log",
    "sin": "Sin",
    "cos": "Cos",
    "tan": "Tan",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "sqrt": "Sqrt",
    "ceil": "Ceil",
    "floor": "Floor",
    "reciprocal": "Reciprocal",
    "sign": "Sign",
    "erf": "Erf",
    "asin": "Asin",
    "acos": "Acos",
    "atan": "Atan",
    "sinh": "Sinh",
}

PACK_SOURCE = '''\
"""Synthetic opreg pack {index} written by bench/discovery.py."""

from onnxscript.onnx_opset import opset18 as op18

import opreg

OPREG_API_VERSION = 1

{functions}

@opreg.hookimpl
def opreg_register_ops(registry):
{registrations}
'''


class BenchError(Exception):
    """The benchmark could not measure what it claims to (a pack did not load, a process failed)."""


# -- synthetic packs ----------------------------------------------------------------


def pack_ops(index: int) -> list[str]:
    """The ATen ops pack ``index`` implements: a window of UNARY_OPS, so packs overlap."""
    names = list(UNARY_OPS)
    return [names[(index + j) % len(names)] for j in range(IMPLS_PER_PACK)]


def write_pack(root: Path, index: int) -> None:
    """Write pack ``index`` as an installed distribution under ``root``."""
    module = PACK_MODULE.format(index=index)
    functions, registrations = [], []
    for op in pack_ops(index):
        function = f"aten_{op}_{index:03d}"
        functions.append(f"def {function}(self):\n    return op18.{UNARY_OPS[op]}(self)\n")
        registrations.append(f'    registry.register("aten::{op}", {function}, opset=18)')
    package = root / module
    package.mkdir()
    source = PACK_SOURCE.format(index=index, functions="\n".join(functions), registrations="\n".join(registrations))
    (package / "__init__.py").write_text(source)

    dist_info = root / f"{module}-0.1.dist-info"
    dist_info.mkdir()
    dist_name = module.replace("_", "-")
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(f"[opreg.plugins]\n{PACK_NAME.format(index=index)} = {module}\n")


def write_packs(root: Path, count: int) -> None:
    """Install ``count`` synthetic packs into ``root`` and byte-compile them (as pip does)."""
    root.mkdir(parents=True)
    for index in range(count):
        write_pack(root, index)
    if count and not compileall.compile_dir(root, quiet=1):
        raise BenchError(f"synthetic packs in {root} do not compile")


def scenario_env(root: Path, cache: Path) -> dict[str, str]:
    """Environment for a measured process: ``root`` first on the path, autoload on, the cache of
    what packs declare in ``cache`` (never the user's)."""
    env = dict(os.environ)
    env.pop(AUTOLOAD_ENV, None)
    env.pop(NO_CACHE_ENV, None)
    env[CACHE_ENV] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return env


def synthetic_problems(reports: list[dict[str, Any]], count: int) -> list[str]:
    """What is wrong with the synthetic packs' load reports (``[]`` if all ``count`` loaded fully)."""
    synthetic = [r for r in reports if r["name"].startswith(PACK_PREFIX)]
    problems = []
    if len(synthetic) != count:
        problems.append(f"expected {count} synthetic packs, found {len(synthetic)}")
    for r in synthetic:
        if r["status"] != "loaded" or r["impls"] != IMPLS_PER_PACK or r["rejected"]:
            problems.append(
                f"pack {r['name']}: status {r['status']}, {r['impls']}/{IMPLS_PER_PACK} impls, "
                f"{len(r['rejected'])} rejected; reason: {r['reason'] or '-'}"
            )
    return problems


# -- the measuring process ------------------------------------------------------------


def worker(count: int) -> dict[str, Any]:
    """In a fresh process: time registry builds and resolution with ``count`` synthetic packs."""
    import importlib

    started = time.perf_counter()
    for module in HEAVY_IMPORTS:
        importlib.import_module(module)
    import opreg
    import opreg.packs.plugins

    import_s = time.perf_counter() - started

    def check(registry: opreg.Registry) -> None:
        reports = [
            {"name": r.name, "status": r.status, "impls": r.impls, "rejected": r.rejected, "reason": r.reason}
            for r in registry.packs
        ]
        problems = synthetic_problems(reports, count)
        if problems:
            raise BenchError(f"with {count} packs, synthetic packs did not load:\n  " + "\n  ".join(problems))

    started = time.perf_counter()
    registry = opreg.packs.plugins.build_registry()
    cold_ms = (time.perf_counter() - started) * 1e3
    check(registry)

    warm_ms = []
    for _ in range(WARM_BUILDS):
        opreg.packs.plugins.clear_cache()
        started = time.perf_counter()
        registry = opreg.packs.plugins.build_registry()
        warm_ms.append((time.perf_counter() - started) * 1e3)
        check(registry)

    import timeit

    target = registry.target("onnx")
    chosen = registry.resolve(RESOLVE_OP, target)
    if chosen is None:
        raise BenchError(f"{RESOLVE_OP} does not resolve at target {target}")
    namespace = {"resolve": registry.resolve, "op": RESOLVE_OP, "target": target}
    timer = timeit.Timer("resolve(op, target)", globals=namespace)
    number, _ = timer.autorange()
    resolve_us = [t / number * 1e6 for t in timer.repeat(RESOLVE_REPEATS, number)]

    return {
        "import_s": import_s,
        "cold_build_ms": cold_ms,
        "warm_build_ms": warm_ms,
        "resolve_us": statistics.median(resolve_us),
        "registry_impls": len(registry),
        "resolve_candidates": len(registry.candidates(RESOLVE_OP, target)),
        "resolved_to": chosen.label,
        "conflicts": len(registry.conflicts(target)),
        "other_packs": {r.name: r.status for r in registry.packs if not r.name.startswith(PACK_PREFIX)},
    }


# -- the parent -----------------------------------------------------------------------


def run_worker(count: int, env: dict[str, str]) -> dict[str, Any]:
    """Measure one scenario in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(count)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BenchError(f"measuring {count} packs failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise BenchError(f"measuring {count} packs printed nothing; stderr:\n{proc.stderr.strip()}")
    return json.loads(lines[-1])


def opreg_command() -> list[str]:
    """This interpreter's ``opreg`` console script (not a shell shim), else ``python -m opreg.cli``."""
    script = Path(sys.executable).parent / ("opreg.exe" if os.name == "nt" else "opreg")
    if script.is_file():
        return [str(script)]
    found = shutil.which("opreg")
    return [found] if found else [sys.executable, "-m", "opreg.cli"]


def time_cli(command: list[str], count: int, env: dict[str, str], argv: list[str]) -> float:
    """Wall time (s) of one ``opreg ARGV``; checks the packs ``opreg plugins`` lists, and that a
    command answered from the cache imported no torch (``--debug`` logs where it read from)."""
    cached = "--no-cache" not in argv
    started = time.perf_counter()
    proc = subprocess.run([*command, *argv], env=env, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - started
    shown = " ".join(argv)
    if proc.returncode != 0:
        raise BenchError(f"`opreg {shown}` with {count} packs exited {proc.returncode}:\n{proc.stderr}")
    if argv[0] == "plugins":
        problems = synthetic_problems(json.loads(proc.stdout), count)
        if problems:
            raise BenchError(f"`opreg {shown}` with {count} packs:\n  " + "\n  ".join(problems))
    if cached and not any(Path(env[CACHE_ENV]).glob("declared/*.json")):
        raise BenchError(f"`opreg {shown}` with {count} packs left no cache entry in {env[CACHE_ENV]}")
    return wall_s


def imports_torch(command: list[str], env: dict[str, str], argv: list[str]) -> bool:
    """Whether ``opreg ARGV`` imports torch (read from ``-X importtime``; untimed)."""
    script = command if command[0] == sys.executable else [sys.executable, *command]
    proc = subprocess.run([*script[:1], "-X", "importtime", *script[1:], *argv], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    return any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def summarize(
    count: int, runs: list[dict[str, Any]], cli: list[float], cached: dict[str, list[float]]
) -> dict[str, Any]:
    """One scenario's row from its processes' raw numbers."""
    warm = [ms for run in runs for ms in run["warm_build_ms"]]
    last = runs[-1]
    return {
        "packs": count,
        "impls": count * IMPLS_PER_PACK,
        "cold_build_ms": statistics.median(run["cold_build_ms"] for run in runs),
        "warm_build_ms": statistics.median(warm),
        "resolve_us": statistics.median(run["resolve_us"] for run in runs),
        "cli_wall_s_best": min(cli),
        "cli_wall_s_median": statistics.median(cli),
        "cold_build_ms_all": [run["cold_build_ms"] for run in runs],
        "warm_build_ms_all": warm,
        "resolve_us_all": [run["resolve_us"] for run in runs],
        "cli_wall_s_all": cli,
        "cached_wall_s_median": {name: statistics.median(times) for name, times in cached.items()},
        "cached_wall_s_all": cached,
        "import_s": [run["import_s"] for run in runs],
        "registry_impls": last["registry_impls"],
        "resolve_candidates": last["resolve_candidates"],
        "resolved_to": last["resolved_to"],
        "conflicts": last["conflicts"],
        "other_packs": last["other_packs"],
    }


def measure(progress: Any) -> dict[str, Any]:
    command = opreg_command()
    runs: dict[int, list[dict[str, Any]]] = {count: [] for count in SCENARIOS}
    cli: dict[int, list[float]] = {count: [] for count in SCENARIOS}
    cached: dict[int, dict[str, list[float]]] = {count: {name: [] for name in CACHED_COMMANDS} for count in SCENARIOS}
    with tempfile.TemporaryDirectory(prefix="opreg-bench-discovery-") as tmp:
        envs = {}
        for count in SCENARIOS:
            root = Path(tmp) / f"site-{count}"
            write_packs(root, count)
            envs[count] = scenario_env(root, Path(tmp) / f"cache-{count}")
            time_cli(command, count, envs[count], CACHED_COMMANDS["plugins"])  # fills the cache, untimed
            for argv in CACHED_COMMANDS.values():
                if imports_torch(command, envs[count], argv):
                    raise BenchError(f"`opreg {' '.join(argv)}` with {count} packs imports torch: not from the cache")
        for round_ in range(1, ROUNDS + 1):
            for count in SCENARIOS:
                progress.print(f"[dim]round {round_}/{ROUNDS}, {count} packs: registry builds, `opreg plugins`[/]")
                runs[count].append(run_worker(count, envs[count]))
                cli[count].append(time_cli(command, count, envs[count], ["plugins", "--json", "--no-cache"]))
                for name, argv in CACHED_COMMANDS.items():
                    cached[count][name].append(time_cli(command, count, envs[count], argv))

    scenarios = [summarize(count, runs[count], cli[count], cached[count]) for count in SCENARIOS]
    base = scenarios[0]
    for row in scenarios:
        row["added_cold_ms"] = row["cold_build_ms"] - base["cold_build_ms"]
        row["added_warm_ms"] = row["warm_build_ms"] - base["warm_build_ms"]
        row["cli_added_s"] = row["cli_wall_s_median"] - base["cli_wall_s_median"]

    most = scenarios[-1]
    worst_resolve = max(row["resolve_us"] for row in scenarios)
    goals = [
        {
            "goal": f"{most['packs']} packs add < {ADDED_BUILD_GOAL_MS:g} ms to a cold registry build",
            "value": f"{most['added_cold_ms']:+.1f} ms (warm: {most['added_warm_ms']:+.1f} ms)",
            "pass": most["added_cold_ms"] < ADDED_BUILD_GOAL_MS,
        },
        {
            "goal": f"resolving one op takes < {RESOLVE_GOAL_US:g} µs",
            "value": f"{worst_resolve:.2f} µs (worst scenario)",
            "pass": worst_resolve < RESOLVE_GOAL_US,
        },
    ]
    for name in CACHED_COMMANDS:
        worst = max(row["cached_wall_s_median"][name] for row in scenarios)
        goals.append({
            "goal": f"`opreg {name}`, nothing changed since the last run, answers in <= {CACHED_GOAL_S:g} s wall",
            "value": f"{worst:.3f} s median (worst scenario); loading the packs: "
            f"{max(row['cli_wall_s_median'] for row in scenarios):.2f} s",
            "pass": worst <= CACHED_GOAL_S,
        })  # fmt: skip
    return {
        "python": sys.version.split()[0],
        "opreg_command": command,
        "impls_per_pack": IMPLS_PER_PACK,
        "rounds": ROUNDS,
        "scenarios": scenarios,
        "goals": goals,
    }


def render(results: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(
        title="opreg discovery cost (torch import excluded from build and resolve times)",
        title_justify="left",
        header_style="bold",
        caption=(
            f"cold: median over {ROUNDS} fresh processes; warm: median of {ROUNDS}x{WARM_BUILDS} builds after "
            f"clear_cache(); resolve: {RESOLVE_OP}, per call;\n`opreg plugins --json --no-cache` (loads the packs): "
            f"best / median of {ROUNDS} runs, whole process; cached: `opreg plugins --json`, `ops --json`, "
            f"`explain {RESOLVE_OP} --json`\nanswered from the cache of what packs declare, median of {ROUNDS} runs, "
            "whole process"
        ),
        caption_justify="left",
    )
    columns = ["packs", "impls", "cold build ms", "warm build ms (median)", "added vs 0 packs (ms) cold / warm"]
    columns += ["resolve µs", "`opreg plugins --no-cache` wall s", "cached plugins / ops / explain wall s"]
    for column in columns:
        table.add_column(column, justify="right")
    for row in results["scenarios"]:
        table.add_row(
            str(row["packs"]),
            str(row["impls"]),
            f"{row['cold_build_ms']:.1f}",
            f"{row['warm_build_ms']:.1f}",
            f"{row['added_cold_ms']:+.1f} / {row['added_warm_ms']:+.1f}",
            f"{row['resolve_us']:.2f}",
            f"{row['cli_wall_s_best']:.2f} / {row['cli_wall_s_median']:.2f}",
            " / ".join(f"{row['cached_wall_s_median'][name]:.3f}" for name in CACHED_COMMANDS),
        )
    console.print(table)
    for goal in results["goals"]:
        verdict = "[bold green]PASS[/]" if goal["pass"] else "[bold red]FAIL[/]"
        console.print(f"{verdict}  {goal['goal']}: {goal['value']}")
    for row in results["scenarios"]:
        bad = {name: status for name, status in row["other_packs"].items() if status != "loaded"}
        if bad:
            console.print(f"[yellow]note[/]: with {row['packs']} packs, installed packs not loaded: {bad}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON instead of a table")
    parser.add_argument("--worker", type=int, metavar="PACKS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker is not None:  # the measuring process: keep it free of rich
        try:
            result = worker(args.worker)
        except BenchError as e:
            sys.stderr.write(f"{e}\n")
            return 1
        sys.stdout.write(json.dumps(result) + "\n")
        return 0

    from rich.console import Console

    errors = Console(stderr=True)
    try:
        results = measure(errors)
    except BenchError as e:
        errors.print("[bold red]discovery bench failed:[/]", end=" ")
        errors.print(str(e), markup=False, highlight=False, soft_wrap=True)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
    else:
        # A pipe gets no terminal width; do not fold the table to 80 columns there.
        render(results, Console(width=None if sys.stdout.isatty() else 160))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
