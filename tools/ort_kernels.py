"""Regenerate ``registry/opreg/registry/ort_kernels.json``: per ONNX Runtime release, the CPU kernels'
version ranges per (domain, op), and the newest ai.onnx opset and IR version the release loads.

    python tools/ort_kernels.py 1.18.1 1.20.1 1.22.1 1.24.4 1.26.0 1.28.0 1.30.0 1.32.0
    python tools/ort_kernels.py --venv /work/sidevenvs/ort-1.22.1 ...   # venvs already made

Each release is read in its own venv (``build/ort-VERSION``, made with ``pip install onnxruntime==VERSION
numpy`` when missing), by ONNX Runtime's own table (``onnxruntime_pybind11_state.get_all_opkernel_def()``)
and by loading a one-node model at each opset and IR version until the release refuses one. Releases
already in the file and not named are kept. Types are not kept: opreg judges the installed release's
types live (``opreg.exporter._kernels``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "registry" / "opreg" / "registry" / "ort_kernels.json"

DUMP = r"""
import json, onnxruntime
from onnxruntime.capi import onnxruntime_pybind11_state as state
from onnx import TensorProto, helper

def loads(opset, ir):
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value("x")], [value("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    try:
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True

kernels = {}
for k in state.get_all_opkernel_def():
    if k.provider == "CPUExecutionProvider":
        start, end = k.version_range
        key = f"{k.domain}:{k.op_name}" if k.domain not in ("", "ai.onnx") else k.op_name
        kernels.setdefault(key, set()).add((start, None if end >= 2**31 - 1 else end))
print(json.dumps({
    "version": onnxruntime.__version__,
    "max_opset": max(v for v in range(13, 40) if loads(v, 8)),
    "max_ir": max(v for v in range(8, 20) if loads(13, v)),
    "kernels": {op: sorted(ranges, key=lambda r: r[0]) for op, ranges in sorted(kernels.items())},
}))
"""


def venv_for(version: str) -> Path:
    """``build/ort-VERSION``, made with that release of onnxruntime (and onnx, numpy) if missing."""
    venv = ROOT / "build" / f"ort-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"onnxruntime=={version}", "onnx", "numpy"], check=True
        )
    return venv


def dump(venv: Path) -> dict:
    """One release's entry, read in ``venv``."""
    found = subprocess.run([str(venv / "bin" / "python"), "-c", DUMP], check=True, capture_output=True, text=True)
    return json.loads(found.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="*", help="onnxruntime releases to read (each in build/ort-VERSION)")
    parser.add_argument("--venv", action="append", default=[], type=Path, help="a venv with onnxruntime installed")
    options = parser.parse_args()
    table = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    for venv in [*options.venv, *(venv_for(v) for v in options.versions)]:
        entry = dump(venv)
        table[entry.pop("version")] = entry
        print(f"{venv}: onnxruntime {list(table)[-1]}", file=sys.stderr)
    ordered = dict(sorted(table.items(), key=lambda item: tuple(int(p) for p in item[0].split(".")[:3])))
    TABLE.write_text(_compact(ordered))


def _compact(table: dict) -> str:
    """One line per (release, op): the file stays small and its diffs readable."""
    lines = ["{"]
    for n, (version, entry) in enumerate(table.items()):
        lines.append(f'"{version}": {{"max_opset": {entry["max_opset"]}, "max_ir": {entry["max_ir"]}, "kernels": {{')
        ops = [f"  {json.dumps(op)}: {json.dumps(ranges)}" for op, ranges in entry["kernels"].items()]
        lines.append(",\n".join(ops))
        lines.append("}}" + ("," if n < len(table) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
