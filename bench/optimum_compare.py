"""``opreg export`` against ``optimum-cli export onnx`` on the same tiny checkpoints, one per
(model_type, task) pair optimum-onnx 0.1.0 exports for transformers.

What it measures
----------------
For each pair (optimum's TasksManager table, from the side venv), a tiny random checkpoint is written
with the OLDER transformers (4.57.3, the side venv's: bench/optimum_side.py; tokenizer and processor
files where the model takes text, images or audio), so that both exporters read the same files. Each
exporter then runs as a user runs it, at its default settings, in a fresh process:

    opreg export FOLDER -o DIR --task T                        (verifies against PyTorch by default)
    optimum-cli export onnx --model FOLDER --task T DIR        (validates against PyTorch by default)

Per pair: exported and verified by each side's own check (opreg: exit 0; optimum: exit 0 without
its "succeeded with the warning" or "error occurred during validation" line), the CPU seconds of
the whole command (user + system of the child and its children: ``resource``'s RUSAGE_CHILDREN),
and the ONNX Runtime latency of the main model (the first of ``model.onnx``,
``decoder_model.onnx``, ``encoder_model.onnx`` both wrote): the same inputs, the same session
options (one thread, default graph optimizations), the two sessions run in turn, median of
``--runs``. ``--optimized`` adds, per pair, ``opreg export -t onnxruntime`` against ``optimum-cli
... --optimize O2`` and their latency; ``--wide`` measures both settings' latency on a BERT of
BERT-base's width (hidden 768, 12 heads, 4 layers), one sequence of 128 tokens.

Checkpoints whose model class transformers 5 (this venv) lacks are not a pair of the comparison.
Results go to build/optimum_compare/results[SHARD].json after every pair: a rerun resumes where it stopped
(``--redo`` forgets the selected pairs). ``--only`` shards by model_type; ``--table`` only prints.

    python bench/optimum_compare.py --make-venv                       # build/optimum-venv (once)
    nice -n 19 python bench/optimum_compare.py --only bert vit t5     # a shard
    python bench/optimum_compare.py --wide                            # BERT at BERT-base's width: latency
    nice -n 19 python bench/optimum_compare.py                        # every pair (hours)
    python bench/optimum_compare.py --table                           # the tables of what ran
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "optimum_compare"
VENV = ROOT / "build" / "optimum-venv"
SIDE = [
    "torch==2.13.0+cpu", "transformers==4.57.3", "optimum-onnx==0.1.0", "optimum==2.1.0", "onnxruntime==1.32.0",
    "onnx==1.23.2", "pillow",
]  # fmt: skip
"""The side venv's packages (``--make-venv``), as the side venv the bench makes holds them."""
VALIDATION_FAILED = ("succeeded with the warning", "error occurred during validation")
"""What optimum-cli logs when its validation fails (it still exits 0; it logs nothing when it passes)."""
TIMEOUT = 1800
BATCH = 12
"""Checkpoints written per side-venv process, before their pairs run."""
DIMS = {
    "batch_size": 2, "num_choices": 2, "sequence_length": 16, "encoder_sequence_length": 16, "past_sequence_length": 16,
}  # fmt: skip


def make_venv(venv: Path) -> None:
    """Create the side venv (python3.11, the packages of :data:`SIDE`; the machine's pip
    constraints, which pin this project's transformers, do not apply to it)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *SIDE], check=True, env=env)


def _cpu_of(argv: list[str], log: Path) -> tuple[int, float, str]:
    """Run ``argv`` (its output to ``log``): exit code, CPU seconds of it and its children, output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("w") as out:
        try:
            code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT, check=False).returncode
        except subprocess.TimeoutExpired:
            code = -9
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, round(cpu, 2), log.read_text(errors="replace")


def _last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line.split(":")[0] or line.startswith("error")]
    return (errors or lines or ["(no output)"])[-1][:240]


def run_opreg(folder: Path, task: str, out: Path, target: str | None) -> dict[str, Any]:
    argv = [str(Path(sys.executable).with_name("opreg")), "export", str(folder), "-o", str(out), "--task", task]
    code, cpu, output = _cpu_of(argv + (["-t", target] if target else []), out.with_suffix(".log"))
    return {"ok": code == 0, "verified": code == 0, "cpu": cpu, "error": "" if code == 0 else _last_error(output)}


def run_optimum(venv: Path, folder: Path, task: str, out: Path, optimize: str | None) -> dict[str, Any]:
    argv = [str(venv / "bin" / "optimum-cli"), "export", "onnx", "--model", str(folder), "--task", task]
    code, cpu, output = _cpu_of(
        argv + (["--optimize", optimize] if optimize else []) + [str(out)], out.with_suffix(".log")
    )
    warning = next((line for line in output.splitlines() if any(w in line for w in VALIDATION_FAILED)), "")
    verified = code == 0 and not warning
    return {
        "ok": code == 0,
        "verified": verified,
        "cpu": cpu,
        "error": "" if verified else (warning or _last_error(output))[:240],
    }


def _main_model(a: Path, b: Path) -> str | None:
    for name in ("model.onnx", "decoder_model.onnx", "encoder_model.onnx"):
        if (a / name).is_file() and (b / name).is_file():
            return name
    return None


def _feeds(
    session: Any, folder: Path, dims: dict[str, int] | None = None, fixed: dict[str, list[Any]] | None = None
) -> dict[str, Any]:
    """Inputs for ``session``: ids below 64, masks of ones, position ids counting on from the past,
    floats from a seeded normal; dynamic dims from :data:`DIMS` (a sum of them where optimum names
    one so; 16 otherwise; audio 16000 samples; image sides the config's), except where the other
    model's input (``fixed``: its shape by input name) has the dim fixed (optimum names an image's
    channels and MarkupLM's xpath depth; opreg's models have the config's)."""
    import numpy as np

    dims = dims or DIMS
    config = json.loads((folder / "config.json").read_text())
    side = config.get("image_size") or config.get("vision_config", {}).get("image_size") or 32
    side = side if isinstance(side, int) else side[0]
    rng = np.random.default_rng(0)
    feeds = {}
    inputs = session.get_inputs()
    for node in inputs:
        shape = []
        other = (fixed or {}).get(node.name) or [None] * len(node.shape)
        for i, (dim, known) in enumerate(zip(node.shape, other, strict=True)):
            if isinstance(dim, int) or isinstance(known, int):
                shape.append(dim if isinstance(dim, int) else known)
            elif node.name == "input_values" and i == 1:
                shape.append(16000)
            elif dim in ("height", "width"):
                shape.append(side)
            else:  # optimum names the mask of a model with past "past_sequence_length + sequence_length"
                shape.append(sum(dims.get(part.strip(), 16) for part in str(dim).split("+")))
        if node.name == "position_ids":  # the new tokens' positions, after the past
            past = dims["past_sequence_length"] if any("past" in str(d) for i in inputs for d in i.shape) else 0
            feeds[node.name] = np.broadcast_to(np.arange(past, past + shape[-1]), shape).astype(np.int64)
        elif "int" in node.type:
            fill = 1 if "mask" in node.name else (0 if "type" in node.name else None)
            value = np.full(shape, fill) if fill is not None else rng.integers(0, 64, shape)
            feeds[node.name] = value.astype(np.int64)
        elif "bool" in node.type:
            feeds[node.name] = np.ones(shape, dtype=bool)
        else:
            feeds[node.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def latency(
    opreg_model: Path, optimum_model: Path, folder: Path, runs: int, dims: dict[str, int] | None = None
) -> dict[str, Any]:
    """Median milliseconds of each model on the same inputs (``dims``: :data:`DIMS` unless given),
    the two sessions run in turn."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    sessions = [
        ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in (opreg_model, optimum_model)
    ]
    names = [sorted(i.name for i in s.get_inputs()) for s in sessions]
    extra = sorted(set(names[0]) - set(names[1]))
    if set(names[1]) - set(names[0]) or extra not in ([], ["position_ids"]):
        return {"error": f"inputs differ: opreg {names[0]}, optimum {names[1]}"}
    theirs = _feeds(sessions[1], folder, dims, {i.name: i.shape for i in sessions[0].get_inputs()})
    feeds = dict(theirs)
    if extra:  # opreg keeps position_ids where optimum's config of a family takes none (Gemma): opreg's alone
        feeds |= {name: _feeds(sessions[0], folder, dims)[name] for name in extra}
    times: list[list[float]] = [[], []]
    for i in range(runs + 3):
        for session, seconds, inputs in zip(sessions, times, (feeds, theirs), strict=True):
            started = time.perf_counter()
            session.run(None, inputs)
            if i >= 3:  # warm-up runs left out
                seconds.append(time.perf_counter() - started)
    ms = [round(1000 * statistics.median(t), 3) for t in times]
    return {"opreg_ms": ms[0], "optimum_ms": ms[1], "ratio": round(ms[0] / ms[1], 3)}


IMPORTS = "import torch, transformers; transformers.AutoModel, transformers.BertModel"
"""What both commands import before their own work: the baseline ``--baseline`` times in each venv."""


def baseline(venv: Path, runs: int) -> dict[str, Any]:
    """CPU seconds of importing torch and transformers (:data:`IMPORTS`) in this venv and in the
    side venv, median of ``runs`` each, in turn: what each command pays before its own work."""
    log = WORK / "baseline.log"
    times: dict[str, list[float]] = {"opreg": [], "optimum": []}
    for _ in range(runs):
        for side, python in (("opreg", sys.executable), ("optimum", str(venv / "bin" / "python"))):
            times[side].append(_cpu_of([python, "-c", IMPORTS], log)[1])
    return {side: round(statistics.median(t), 2) for side, t in times.items()}


def _known_families() -> set[str]:
    """The model types opreg-transformers' loaders know (data modules: cheap to import)."""
    from opreg_transformers import encoders, media, seq2seq

    return {*encoders.FAMILIES, *media.FAMILIES, *seq2seq.FAMILIES}


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {"pairs": [], "rows": {}}


def _merged() -> dict[str, Any]:
    """Every results file of build/optimum_compare/ as one (a pair's fields from each shard)."""
    merged: dict[str, Any] = {"pairs": [], "rows": {}}
    for path in sorted(WORK.glob("results*.json")):
        results = _load(path)
        merged["pairs"] = merged["pairs"] or results["pairs"]
        for key, row in results["rows"].items():
            merged["rows"][key] = {**merged["rows"].get(key, {}), **row}
    return merged


def _save(results: dict[str, Any]) -> None:
    path = Path(results["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(results, indent=1))
    partial.replace(path)


def _side(venv: Path, *args: str) -> str:
    argv = [str(venv / "bin" / "python"), str(ROOT / "bench" / "optimum_side.py"), *args]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def write_checkpoints(venv: Path, keys: list[str], results: dict[str, Any]) -> None:
    """Write the checkpoints of ``keys`` no shard has written, in one side-venv process; note each
    one's model class (or why it could not be built) in ``results``."""
    folders = {key: WORK / "ckpt" / key.replace("/", "--") for key in keys}
    jobs = [
        {"model_type": key.split("/")[0], "task": key.split("/")[1], "folder": str(folder)}
        for key, folder in folders.items()
        if not (folder / "bench.json").is_file()
    ]
    if jobs:
        job_file = Path(results["path"]).with_suffix(".jobs")  # one per shard
        job_file.write_text(json.dumps(jobs))
        _side(venv, "write", str(job_file))
    for key, folder in folders.items():
        results["rows"].setdefault(key, {}).update(json.loads((folder / "bench.json").read_text()))
    _save(results)


def compare(venv: Path, key: str, row: dict[str, Any], args: argparse.Namespace) -> None:
    """Fill ``row`` for the pair ``key``: both exports, their latency, and at ``--optimized`` both
    optimized exports."""
    import transformers

    task = key.split("/")[1]
    folder = WORK / "ckpt" / key.replace("/", "--")
    out = WORK / f"out{args.shard}" / key.replace("/", "--")
    if not hasattr(transformers, row["model_class"]):
        row["skipped"] = f"transformers {transformers.__version__} has no {row['model_class']}"
        return
    plain = (("opreg", None), ("optimum", None))
    tuned = (("opreg_ort", "onnxruntime"), ("optimum_o2", "O2")) if args.optimized else ()
    for side, setting in (*plain, *tuned):
        if side in row:
            continue
        target = out / side
        shutil.rmtree(target, ignore_errors=True)  # a run stopped half-way
        target.parent.mkdir(parents=True, exist_ok=True)
        if side.startswith("opreg"):
            row[side] = run_opreg(folder, task, target, setting)
        else:
            row[side] = run_optimum(venv, folder, task, target, setting)
    for a, b, name in (("opreg", "optimum", "latency"), ("opreg_ort", "optimum_o2", "latency_o2")):
        if a in row and row[a]["ok"] and row[b]["ok"] and name not in row:
            model = _main_model(out / a, out / b)
            try:
                row[name] = (
                    latency(out / a / model, out / b / model, folder, args.runs)
                    if model
                    else {"error": "no main model in both"}
                )
            except Exception as e:  # a row of the table
                row[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            if model:
                row[name]["model"] = model


WIDE_DIMS = {**DIMS, "batch_size": 1, "sequence_length": 128}
"""The ``--wide`` latency's inputs: one sequence of 128 tokens."""


def wide(venv: Path, runs: int) -> dict[str, Any]:
    """BERT feature extraction at BERT-base's width (the side venv's ``WIDE`` config, 4 layers): both
    exporters at their defaults and at their ONNX Runtime settings (``-t onnxruntime``, ``--optimize
    O2``), the latency of each pair on one sequence of 128 tokens."""
    folder = WORK / "ckpt-wide" / "bert--feature-extraction"
    if not (folder / "bench.json").is_file():
        job_file = WORK / "wide.jobs"
        job_file.write_text(
            json.dumps([{"model_type": "bert", "task": "feature-extraction", "folder": str(folder), "wide": True}])
        )
        _side(venv, "write", str(job_file))
    out, row = WORK / "out_wide", {}
    for side, setting in (("opreg", None), ("optimum", None), ("opreg_ort", "onnxruntime"), ("optimum_o2", "O2")):
        target = out / side
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        run = run_opreg if side.startswith("opreg") else functools.partial(run_optimum, venv)
        row[side] = run(folder, "feature-extraction", target, setting)
    for a, b, name in (("opreg", "optimum", "latency"), ("opreg_ort", "optimum_o2", "latency_o2")):
        if row[a]["ok"] and row[b]["ok"]:
            row[name] = latency(out / a / "model.onnx", out / b / "model.onnx", folder, runs, WIDE_DIMS)
    (WORK / "wide.json").write_text(json.dumps(row, indent=1))
    return row


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x over {len(values)}" if values else "-"


def _cell(side: dict[str, Any]) -> str:
    if side["verified"]:
        return "verified"
    error = re.sub(r"/\S*?/(build/optimum_compare/)", r"\1", side["error"])  # the folder, not the machine's path
    return ("exported, not verified: " if side["ok"] else "failed: ") + error[:90].replace("|", "/")


def _latency_cell(lat: dict[str, Any]) -> str:
    return f"{lat['opreg_ms']} / {lat['optimum_ms']} ({lat['model']})" if "ratio" in lat else lat.get("error", "")[:80]


def _beyond_imports(both: list[dict[str, Any]]) -> dict[str, str]:
    """The CPU time ratio once each venv's import of torch and transformers is taken off."""
    if not (WORK / "baseline.json").is_file():
        return {}
    base = json.loads((WORK / "baseline.json").read_text())
    ratios = [(r["opreg"]["cpu"] - base["opreg"]) / (r["optimum"]["cpu"] - base["optimum"]) for r in both]
    name = f"CPU s beyond importing torch and transformers ({base['opreg']} s / {base['optimum']} s), median ratio"
    return {name: _median(ratios)}


def table(results: dict[str, Any]) -> None:
    """Print the per-pair table and the summary of what ran."""
    rows = {k: r for k, r in sorted(results["rows"].items()) if "opreg" in r and "optimum" in r}
    print("| model_type | task | opreg | optimum | CPU s opreg / optimum | latency ms opreg / optimum (model) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, r in rows.items():
        cpu = f"{r['opreg']['cpu']} / {r['optimum']['cpu']}"
        cells = [*key.split("/"), _cell(r["opreg"]), _cell(r["optimum"]), cpu, _latency_cell(r.get("latency", {}))]
        print("| " + " | ".join(cells) + " |")
    verified = {side: {k for k, r in rows.items() if r[side]["verified"]} for side in ("opreg", "optimum")}
    both = [rows[k] for k in verified["opreg"] & verified["optimum"]]
    built = results["rows"].values()
    summary = {
        "pairs run": f"{len(rows)} (of {len(results['pairs'])} optimum lists; {sum('skipped' in r for r in built)} "
        f"without a transformers 5 class, {sum('error' in r for r in built)} not built)",
        "exported and verified: opreg / optimum / both": f"{len(verified['opreg'])} / {len(verified['optimum'])} / "
        f"{len(both)}",
        "optimum-only": f"{len(verified['optimum'] - verified['opreg'])}: "
        + ", ".join(sorted(verified["optimum"] - verified["opreg"])),
        "opreg-only": f"{len(verified['opreg'] - verified['optimum'])}: "
        + ", ".join(sorted(verified["opreg"] - verified["optimum"])),
        "CPU s of the command, opreg / optimum, median ratio": _median(
            [r["opreg"]["cpu"] / r["optimum"]["cpu"] for r in both]
        ),
        **_beyond_imports(both),
        "latency opreg / optimum, median ratio": _median(
            [r["latency"]["ratio"] for r in both if "ratio" in r.get("latency", {})]
        ),
        "latency -t onnxruntime / --optimize O2, median ratio": _median(
            [r["latency_o2"]["ratio"] for r in rows.values() if "ratio" in r.get("latency_o2", {})]
        ),
    }
    print("\n| summary | value |\n| --- | --- |")
    for name, value in summary.items():
        print(f"| {name} | {value} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimum-venv", type=Path, default=VENV, help=f"the side venv (default {VENV})")
    parser.add_argument("--make-venv", action="store_true", help="create the side venv and stop")
    parser.add_argument("--only", nargs="+", metavar="MODEL_TYPE", help="these model types only (a shard)")
    parser.add_argument("--tasks", nargs="+", metavar="TASK", help="these tasks only")
    parser.add_argument(
        "--pairs", type=Path, metavar="FILE", help="the pairs of this file only, one MODEL_TYPE/TASK a line"
    )
    parser.add_argument("--write-only", action="store_true", help="write the selected checkpoints and stop")
    parser.add_argument("--optimized", action="store_true", help="also -t onnxruntime against --optimize O2")
    parser.add_argument("--runs", type=int, default=200, help="latency runs per model (default 200)")
    parser.add_argument("--redo", action="store_true", help="forget the selected pairs' results first")
    parser.add_argument(
        "--shard", default="", help="results file suffix, for a second run at the same time (--table merges them)"
    )
    parser.add_argument(
        "--baseline", type=int, metavar="N", help="time importing torch and transformers in both venvs, N times each"
    )
    parser.add_argument(
        "--wide", action="store_true", help="BERT feature extraction at BERT-base's width: latency of both settings"
    )
    parser.add_argument("--table", action="store_true", help="print the tables of what ran and stop")
    args = parser.parse_args()
    if args.make_venv:
        make_venv(args.optimum_venv)
        return 0
    if args.wide:
        row = wide(args.optimum_venv, args.runs)
        print(json.dumps({k: v.get("ratio", v) if "latency" in k else v for k, v in row.items()}, indent=1))
        return 0
    if args.table:
        table(_merged())
        return 0
    if args.baseline:
        WORK.mkdir(parents=True, exist_ok=True)
        (WORK / "baseline.json").write_text(json.dumps(baseline(args.optimum_venv, args.baseline)))
        table(_merged())
        return 0
    results = _load(WORK / f"results{args.shard}.json") | {"path": str(WORK / f"results{args.shard}.json")}
    if not results["pairs"]:
        results["pairs"] = json.loads(_side(args.optimum_venv, "pairs"))
        _save(results)
    keys = [
        f"{model_type}/{task}"
        for model_type, task, _ in results["pairs"]
        if (not args.only or model_type in args.only) and (not args.tasks or task in args.tasks)
    ]
    if args.pairs:
        chosen = set(args.pairs.read_text().split())
        keys = [key for key in keys if key in chosen]
    if args.redo:
        for key in keys:
            results["rows"].pop(key, None)
    elif not args.optimized:  # a pair another shard ran is not run again (--table merges the shards)
        ran = {key for key, row in _merged()["rows"].items() if "opreg" in row and "optimum" in row}
        keys = [key for key in keys if key not in ran]
    keys.sort(key=lambda key: (key.split("/")[0] not in _known_families(), key))  # opreg's families first
    if args.write_only:
        write_checkpoints(args.optimum_venv, keys, results)
        return 0
    for start in range(0, len(keys), BATCH):
        write_checkpoints(args.optimum_venv, keys[start : start + BATCH], results)
        for key in keys[start : start + BATCH]:
            row = results["rows"][key]
            if "error" not in row:
                compare(args.optimum_venv, key, row, args)
                _save(results)
                print(
                    key,
                    {
                        k: (v.get("verified"), v.get("cpu")) if isinstance(v, dict) and "cpu" in v else v
                        for k, v in row.items()
                    },
                    flush=True,
                )
    table(_merged())
    return 0


if __name__ == "__main__":
    sys.exit(main())
