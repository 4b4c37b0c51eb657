"""Which causal LMs opreg exports as a GenAI decoder, and which ONNX Runtime GenAI's builder builds.

Run: python bench/llm_models.py [--all] [--types llama,qwen2,...] [-j 2] [--timeout 900] [--fresh] [--markdown]

For each architecture (by default the sample of ``tests/language_models.py``'s ``SAMPLE``; with
``--all`` every entry of transformers' causal-LM mapping), in a process of its own with a timeout:

1. build a tiny random-init model from the architecture's default config shrunk to ``SMALL``
   (hidden 64, 2 layers, 4 query and 2 key/value heads, vocab 300): no download;
2. opreg: ``opreg.llm.export_decoder`` at target ``onnx`` into a folder with the tests' tokenizer,
   ``Decoder.verify`` against transformers' forward (batch 1 and 3, sequence 1 and 7, past 0 and 5,
   left padding; rtol=atol=1e-4), then ONNX Runtime GenAI's greedy generation from the folder
   against transformers' greedy ``generate`` (24 tokens, token for token). A mixture of experts
   whose default experts call ``transformers::grouped_mm_fallback`` without a pack installed that
   translates it (opreg-transformers) is retried with transformers' ``batched_mm`` experts, and says so;
3. the builder: the model saved as a checkpoint, ``python -m onnxruntime_genai.models.builder -p
   fp32 -e cpu``, and if it builds, the same greedy comparison through GenAI.

Random-init logits are nearly flat, so matching greedy tokens is a strict check of the numerics,
not of quality. Results are kept in ``build/llm_models.jsonl`` (a rerun redoes only what is
missing; ``--fresh`` redoes all). Prints one row per architecture and the counts: both, opreg
only, builder only, neither.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "build" / "llm_models.jsonl"
LENGTH = 24
PROMPT = "hello world, the quick fox"


def _short(error: BaseException | str) -> str:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:240]


def _greedy_pair(model: Any, folder: Path) -> bool:
    from tests import language_models as lm

    prompt = list(lm.tokenizer()(PROMPT)["input_ids"])
    return lm.genai_greedy(folder, prompt, LENGTH) == lm.greedy(model, prompt, LENGTH)


def _forward_only(model: Any, row: dict[str, Any], refusal: Exception) -> None:
    """A model export_decoder refuses (no key/value cache): its forward, logits only, at a fixed
    sequence length (a state-space model's scan is a Python loop over the tokens)."""
    import torch

    import opreg

    model.config.use_cache = False
    ids = torch.randint(2, 300, (2, 5))
    batch = {"input_ids": {0: torch.export.Dim("batch")}}
    try:
        program = opreg.export(model, (), {"input_ids": ids}, dynamic_shapes=batch)
        program.verify(input_ids=torch.randint(2, 300, (3, 5)))
        forward = "its forward (logits, fixed sequence length) exports and matches"
    except Exception as e:
        forward = "its forward does not export either: " + _short(e)
    row["opreg"] = f"refused: {_short(refusal)[:120]}; {forward}"


def _opreg(model: Any, folder: Path, row: dict[str, Any]) -> None:
    import opreg
    from tests import language_models as lm

    started = time.process_time()
    try:
        decoder = opreg.llm.export_decoder(model, folder, target="onnx", tokenizer=lm.tokenizer())
    except opreg.UnsupportedOpsError as e:
        if "grouped_mm_fallback" not in str(e) or not hasattr(model, "set_experts_implementation"):
            raise
        model.set_experts_implementation("batched_mm")
        row["note"] = "experts as transformers' batched_mm (no installed pack translates grouped_mm_fallback)"
        started = time.process_time()
        decoder = opreg.llm.export_decoder(model, folder, target="onnx", tokenizer=lm.tokenizer())
    except opreg.ExportError as e:
        if "key/value" not in str(e):
            raise
        _forward_only(model, row, e)
        return
    row["opreg_export_cpu_s"] = round(time.process_time() - started, 2)
    row["opreg_nodes"] = len(decoder.program.model.graph)
    checks = decoder.verify()
    row["opreg_max_abs"] = max(c.max_abs for c in checks)
    row["opreg_tokens"] = _greedy_pair(model, folder)
    row["opreg"] = "ok" if row["opreg_tokens"] else "tokens differ"


def _builder(model: Any, scratch: Path, row: dict[str, Any], timeout: float) -> None:
    from tests import language_models as lm

    checkpoint = lm.checkpoint(model, scratch / "checkpoint")
    out = scratch / "builder"
    command = [
        sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out),
        "-p", "fp32", "-e", "cpu", "-c", str(scratch / "cache"),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row["builder"] = f"timed out after {timeout:.0f} s"
        return
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "not supported" in line.lower()]
        row["builder"] = "fails: " + _short((errors or lines or ["no output"])[-1])
        return
    try:
        row["builder_tokens"] = _greedy_pair(model, out)
    except Exception as e:
        row["builder"] = "builds; GenAI fails to run it: " + _short(e)
        return
    row["builder"] = "ok" if row["builder_tokens"] else "tokens differ"


def one(model_type: str, timeout: float) -> dict[str, Any]:
    """Everything about one architecture (run in its own process)."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    import torch

    from tests import language_models as lm

    row: dict[str, Any] = {"type": model_type}
    try:
        model = lm.causal_lm(model_type)
        with torch.no_grad():
            model(input_ids=torch.ones(1, 3, dtype=torch.int64))  # a tiny config it cannot run is not a test
    except Exception as e:
        row["opreg"] = row["builder"] = "does not build from a small config: " + _short(e)
        return row
    row["class"] = type(model).__name__
    with tempfile.TemporaryDirectory() as scratch:
        scratch_path = Path(scratch)
        try:
            _opreg(model, scratch_path / "opreg", row)
        except Exception as e:
            row["opreg"] = "fails: " + _short(e)
            row["opreg_trace"] = traceback.format_exc()[-2000:]
        try:
            _builder(model, scratch_path, row, timeout)
        except Exception as e:
            row["builder"] = "fails: " + _short(e)
    return row


def _run(model_type: str, timeout: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", model_type, "--timeout", str(timeout)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=3 * timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"type": model_type, "opreg": f"timed out after {3 * timeout:.0f} s", "builder": "-"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"type": model_type, "opreg": "crashed: " + _short(done.stderr[-400:] or "no output"), "builder": "-"}
    return json.loads(lines[-1])


def _types(args: argparse.Namespace) -> list[str]:
    from tests import language_models as lm

    if args.types:
        return args.types.split(",")
    if args.all:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    return list(lm.SAMPLE)


def _load() -> dict[str, dict[str, Any]]:
    if not RESULTS.exists():
        return {}
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    return {row["type"]: row for row in rows}


def _table(rows: list[dict[str, Any]]) -> None:
    print(f"{'architecture':<20} {'class':<30} {'opreg decoder':<46} {'builder':<46} {'export CPU s':>12}")
    for row in rows:
        opreg = row.get("opreg", "?")
        if opreg == "ok":
            opreg = f"ok (max abs {row['opreg_max_abs']:.1e}, tokens match)"
        builder = row.get("builder", "?")
        if builder == "ok":
            builder = "ok (tokens match)"
        cpu = row.get("opreg_export_cpu_s", "")
        print(f"{row['type']:<20} {row.get('class', '-'):<30} {opreg[:46]:<46} {builder[:46]:<46} {cpu!s:>12}")
        if row.get("note"):
            print(f"{'':<20} note: {row['note']}")
    built = [r for r in rows if not str(r.get("opreg", "")).startswith("does not build")]
    ours = {r["type"] for r in built if r.get("opreg") == "ok"}
    theirs = {r["type"] for r in built if r.get("builder") == "ok"}
    everything = {r["type"] for r in built}
    print(
        f"\n{len(built)} architectures build from a small config ({len(rows) - len(built)} do not): "
        f"opreg {len(ours)}, builder {len(theirs)}; both {len(ours & theirs)}, opreg only {len(ours - theirs)}, "
        f"builder only {len(theirs - ours)}, neither {len(everything - ours - theirs)}"
    )
    if theirs - ours:
        print("builder only: " + ", ".join(sorted(theirs - ours)))
    for row in built:
        if row["type"] not in ours:
            print(f"  opreg {row['type']}: {row.get('opreg')}")


def _markdown(rows: list[dict[str, Any]]) -> None:
    """The matrix as docs/language-models.md shows it."""
    print("| architecture | class | opreg decoder | builder | opreg export, CPU s |\n|---|---|---|---|---|")
    for row in rows:
        opreg, builder = str(row.get("opreg", "?")), str(row.get("builder", "?"))
        if opreg == "ok":
            opreg = f"ok (max abs {row['opreg_max_abs']:.0e}, tokens match)"
        if row.get("note"):
            opreg += f"; {row['note']}"
        if builder == "ok":
            builder = "ok (tokens match)"
        elif "is not currently supported" in builder:
            builder = "not supported (NotImplementedError)"
        elif "GenAI fails" in builder:
            builder = builder.split(": RuntimeError")[0] + " (" + builder.split("running ")[-1].split(" node")[0] + ")"
        if opreg.startswith("refused"):
            opreg = opreg.split(" (a state-space")[0].replace("ExportError: ", "") + "; " + opreg.split("; ")[-1]
        cells = [row["type"], row.get("class", "-"), opreg, builder, str(row.get("opreg_export_cpu_s", "-"))]
        print("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every architecture of transformers' causal-LM mapping")
    parser.add_argument("--types", help="comma-separated model types (config model_type)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="architectures at once (at most 2 here)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the builder of one architecture")
    parser.add_argument("--fresh", action="store_true", help="ignore kept results")
    parser.add_argument("--markdown", action="store_true", help="print the kept results as a Markdown table")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.timeout), default=str))
        return
    types = _types(args)
    if args.markdown:
        _markdown([row for t, row in _load().items() if t in types])
        return
    kept = {} if args.fresh else _load()
    todo = [t for t in types if t not in kept]
    RESULTS.parent.mkdir(exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(args.jobs, 2))) as pool:
        futures = {pool.submit(_run, t, args.timeout): t for t in todo}
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            kept[row["type"]] = row
            with RESULTS.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
            print(f"{row['type']}: opreg {row.get('opreg')} | builder {row.get('builder')}", flush=True)
    _table([kept[t] for t in types])


if __name__ == "__main__":
    main()
