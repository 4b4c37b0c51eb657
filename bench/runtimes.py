"""Where opreg's exports load and match: the model zoo and a language-model folder at the default
targets, run in older ONNX Runtime releases, in onnxruntime-node through transformers.js, and in
OpenVINO. Prints a markdown table: a row per model and target, a column per runtime, each cell
``ok`` with the max abs difference from the reference, ``differs``, or the runtime's refusal.

    python bench/runtimes.py [--releases 1.20.1 1.22.1 1.24.4 1.30.0] [--no-node] [--no-openvino] [--no-zoo]

The references: eager PyTorch for the zoo; for the decoder (``opreg llm export``'s folder), the
installed onnxruntime on the same steps (left-padded prompts, a decode step). Each runtime lives
under ``build/`` and is made on first use: ``build/ort-VERSION`` (``pip install onnxruntime==VERSION
numpy``, tests/side_runtimes.py), ``build/openvino`` (``pip install openvino numpy``), ``build/tjs``
(``npm install --ignore-scripts @huggingface/transformers@4.3.1``, whose onnxruntime-node is 1.30.0).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import opreg  # noqa: E402
from tests import language_models as lm  # noqa: E402
from tests import real_models, side_runtimes  # noqa: E402

RELEASES = ("1.20.1", "1.22.1", "1.24.4", "1.30.0")
TJS = "@huggingface/transformers@4.3.1"
NODE_RUNNER = ROOT / "bench" / "runtimes.mjs"
ZOO = (
    real_models.tutorial_cnn, real_models.resnet18, real_models.mobilenet, real_models.bert, real_models.distilbert,
    real_models.gpt2, real_models.llama, real_models.vit, real_models.greedy_decoder, real_models.early_exit,
)  # fmt: skip
RTOL, ATOL = 1e-3, 1e-4

OPENVINO_RUN = r"""
import json, sys
import numpy as np
import openvino

core = openvino.Core()
found = []
for model, feeds, expected, rtol, atol in json.loads(sys.argv[1]):
    row = {"model": model, "version": openvino.__version__}
    try:
        compiled = core.compile_model(model, "CPU")
    except Exception as e:
        row.update(loaded=False, error=str(e).strip().splitlines()[-1][-300:])
        found.append(row)
        continue
    row["loaded"] = True
    inputs = dict(np.load(feeds))
    try:
        result = compiled({name: inputs[name] for name in [p.get_any_name() for p in compiled.inputs]})
        outputs = [result[o] for o in compiled.outputs]
    except Exception as e:
        row.update(ran=False, error=str(e).strip().splitlines()[-1][-300:])
        found.append(row)
        continue
    wanted = np.load(expected)
    pairs = [(np.asarray(got), wanted[f"o{i}"]) for i, got in enumerate(outputs)]
    row.update(ran=True, max_abs=max((float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)), initial=0.0))
                                      for g, w in pairs), default=0.0),
               matches=all(g.shape == w.shape and np.allclose(g, w, rtol=rtol, atol=atol) for g, w in pairs))
    found.append(row)
print(json.dumps(found))
"""


def openvino_python() -> Path:
    """``build/openvino``'s Python, with openvino and numpy (made on first use)."""
    venv = ROOT / "build" / "openvino"
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "openvino", "numpy"], check=True)
        (venv / ".installed").write_text("openvino")
    return python


def tjs_folder() -> Path:
    folder = ROOT / "build" / "tjs"
    if not (folder / "node_modules" / "onnxruntime-node").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", TJS], cwd=folder, check=True)
    return folder


def zoo_cases(folder: Path, targets: tuple[str, ...]) -> list[tuple[str, tuple]]:
    """``(row label, case)`` for each zoo model at each target: saved, with its feeds and eager's outputs."""
    found = []
    for make in ZOO:
        case = make()
        for target in targets:
            program = opreg.export(
                case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes, target=target
            )
            name = f"{case.name}-{target}"
            program.save(folder / f"{name}.onnx")
            feeds = program.adapt_torch_inputs_to_onnx(*case.args, **case.kwargs)
            with torch.no_grad():
                eager = case.model(*case.args, **case.kwargs)
            expected = [t.detach().numpy() for t in program.adapt_torch_outputs_to_onnx(eager)]
            named = {n: f.numpy() for n, f in zip(program.input_names, feeds, strict=True)}
            label = f"{case.name} `{target}` (ai.onnx {program.model.opset_imports['']}, IR {program.model.ir_version})"
            found.append(
                (label, (str(folder / f"{name}.onnx"), *side_runtimes.write_case(folder, name, named, expected)))
            )
    return found


STEPS = {"2 left-padded prompts": (2, 5, 0, 2), "a decode step of 2 rows": (2, 1, 6, 2)}
"""``(batch, new tokens, past, left padding)`` of the steps of a generation each folder is run on (a
batch of prompts after a cache is one row at the default: GroupQueryAttention without query_seqlens
refuses more)."""


def decoder_cases(folder: Path, targets: tuple[str | None, ...]) -> list[tuple[str, tuple]]:
    """The llama decoder folder (``opreg llm export``) at each target (``None``: its default), with
    each of :data:`STEPS`' feeds and the installed onnxruntime's outputs as the reference."""
    import onnxruntime

    found = []
    for target in targets:
        out = folder / f"decoder-{target or 'default'}"
        options = {"target": target} if target else {}
        exported = opreg.llm.export_decoder(lm.causal_lm("llama"), out, tokenizer=lm.tokenizer(), **options)
        (program,) = exported.programs.values()
        path = out / next(iter(exported.programs))
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        opsets = f"ai.onnx {program.model.opset_imports['']}, IR {program.model.ir_version}"
        for step, sizes in STEPS.items():
            feeds = side_runtimes.decoder_step(session.get_inputs(), *sizes)
            name = f"decoder-{target or 'default'}-{step.replace(' ', '-')}"
            label = f"llama decoder folder `{target or exported.target.spec}` ({opsets}), {step}"
            found.append((label, (str(path), *side_runtimes.write_case(folder, name, feeds, session.run(None, feeds)))))
    return found


def _as_json(npz: str) -> str:
    """The arrays of ``npz`` as ``{name: {dtype, dims, data}}`` JSON beside it (for the node runner)."""
    arrays = dict(np.load(npz))
    path = npz.removesuffix(".npz") + ".json"
    plain = {
        name: {"dtype": str(a.dtype), "dims": list(a.shape), "data": a.reshape(-1).tolist()}
        for name, a in arrays.items()
    }
    Path(path).write_text(json.dumps(plain))
    return path


def run_node(cases: list[tuple]) -> list[dict]:
    given = [[m, _as_json(f), _as_json(e), r, a] for m, f, e, r, a in cases]
    done = subprocess.run(
        ["node", str(NODE_RUNNER), str(tjs_folder()), json.dumps(given)],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"node failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cell(row: dict) -> str:
    if not row.get("loaded"):
        return f"refused: {_short(row.get('error', ''))}"
    if not row.get("ran"):
        return f"loads, fails: {_short(row.get('error', ''))}"
    return f"ok ({row['max_abs']:.1e})" if row["matches"] else f"differs ({row['max_abs']:.1e})"


def _short(error: str) -> str:
    for marker in ("Current official support", "Unsupported model IR version", "has input size", "No Op registered"):
        if marker in error:
            return error[error.index(marker) :][:90].replace("|", "/")
    return error[-90:].replace("|", "/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="*", default=list(RELEASES), help="onnxruntime releases (build/ort-*)")
    parser.add_argument("--no-node", action="store_true", help="leave out onnxruntime-node (transformers.js)")
    parser.add_argument("--no-openvino", action="store_true", help="leave out OpenVINO")
    parser.add_argument("--no-zoo", action="store_true", help="the language-model folders only")
    options = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        zoo = [] if options.no_zoo else zoo_cases(folder, ("onnx", "onnxruntime"))
        labelled = zoo + decoder_cases(folder, (None, "onnx"))
        cases = [(*case, RTOL, ATOL) for _, case in labelled]
        columns: dict[str, list[dict]] = {}
        for version in options.releases:
            columns[f"onnxruntime {version}"] = side_runtimes.run_models(side_runtimes.python_of(version), cases)
        if not options.no_node:
            columns["onnxruntime-node 1.30.0 (transformers.js 4.3.1)"] = run_node(cases)
        if not options.no_openvino:
            python = openvino_python()
            done = subprocess.run(
                [str(python), "-c", OPENVINO_RUN, json.dumps(cases)], capture_output=True, text=True, check=True
            )
            rows = json.loads(done.stdout.strip().splitlines()[-1])
            columns[f"OpenVINO {rows[0]['version'].split('-')[0]}"] = rows
    print(f"| model, target | {' | '.join(columns)} |")
    print(f"| --- |{' --- |' * len(columns)}")
    for index, (label, _) in enumerate(labelled):
        print(f"| {label} | {' | '.join(cell(rows[index]) for rows in columns.values())} |")
    print(f"\n{time.perf_counter() - started:.0f} s; opreg {opreg.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
