"""Install opreg into a fresh venv with the newest (or lowest) releases its
``pyproject.toml`` ranges allow, ignoring the lock, and run a fast subset of
the suite there.

    python tools/try_releases.py newest   # before a dependency surprises a user
    python tools/try_releases.py lowest   # the ranges' lower bounds are really tested

Not part of the default suite: it resolves against the package registry of the
day, so its result changes when a dependency releases. It needs ``uv`` (``pip
install uv``) for the ``lowest`` resolution; both modes use it to install.
The venv is ``build/releases-MODE`` (kept, so a failure can be looked into).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROJECTS = (".", "plugins/ort_contrib", "plugins/test_customop")
DEV_TOOLS = ("pytest", "pytest-xdist", "hypothesis", "expecttest", "transformers")
"""What the subset needs besides opreg, installed at their locked versions: the ranges under test are the
library's, not the dev tools'."""

RESOLUTION = {"newest": "highest", "lowest": "lowest-direct"}
TORCH = {"lowest": "torch==2.13.0+cpu"}
"""The lowest torch is the CPU build on disk: the registry's plain 2.13.0 is a CUDA build of several GB."""

SUBSET = (
    "tests/test_targets.py",
    "tests/test_registry.py",
    "tests/test_plugins.py",
    "tests/test_export.py",
    "tests/test_ops_elementwise.py",
    "tests/test_ops_nn.py",
    "tests/test_ops_tensor.py",
    "tests/test_models.py",
    "tests/test_compat.py",
    "plugins",
)
"""Registry and targets, the exporter, every core op family, the real models and both packs:
what a new onnx, onnxscript, onnx-ir or onnxruntime release breaks first (about 2 minutes)."""

VERSIONS = ("torch", "onnx", "onnxscript", "onnx-ir", "onnxruntime", "numpy", "protobuf", "pluggy", "rich")


def locked(names: tuple[str, ...]) -> list[str]:
    """``name==version`` for each of ``names``, as ``constraints.txt`` pins it."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.lower()] = f"{name}=={version}"
    return [pins[name] for name in names]


def run(*command: str | Path, **kwargs) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(map(str, command)), flush=True)
    return subprocess.run([str(c) for c in command], cwd=ROOT, check=False, text=True, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=sorted(RESOLUTION), help="which end of the pyproject.toml ranges to install")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (default: the fast subset)")
    args = parser.parse_args(argv)
    uv = shutil.which("uv")
    if uv is None:
        parser.error("uv is not installed: pip install uv")

    venv = ROOT / "build" / f"releases-{args.mode}"
    shutil.rmtree(venv, ignore_errors=True)
    started = time.perf_counter()
    if run(sys.executable, "-m", "venv", venv).returncode:
        return 2
    python = venv / "bin" / "python"
    editables = [item for project in PROJECTS for item in ("-e", project)]
    torch = [TORCH[args.mode]] if args.mode in TORCH else []
    install = run(uv, "pip", "install", "--python", python, "--resolution", RESOLUTION[args.mode],
                  *editables, *torch, *locked(DEV_TOOLS))  # fmt: skip
    if install.returncode:
        return 2
    listed = run(uv, "pip", "list", "--python", python, capture_output=True)
    pins = [line for line in listed.stdout.splitlines() if line.split(" ")[0] in VERSIONS]
    tests = run(python, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider", *(args.pytest_args or SUBSET))
    print(f"\n{args.mode} releases ({time.perf_counter() - started:.0f} s):")
    print("\n".join(f"  {line}" for line in pins))
    print(f"  pytest exit code {tests.returncode}")
    return tests.returncode


if __name__ == "__main__":
    raise SystemExit(main())
