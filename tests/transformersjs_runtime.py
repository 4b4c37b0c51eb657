"""transformers.js for the suite's runtime tests: npm's ``@huggingface/transformers`` 4.3.1 (with
onnxruntime-node 1.30) installed once into build/tjs (``npm install --ignore-scripts``: the package's
CPU binary comes with it, its install scripts would only download more), or found in
``OPREG_TJS_DIR`` (a folder whose ``node_modules`` holds it; /work/sidevenvs/tjs is one). The node
scripts in tests/transformersjs/ resolve it from ``OPREG_TJS_DIR``, which :func:`run` sets.

``missing()`` says why it cannot run here (node or npm not installed), ``install()`` installs it
(under a lock: the suite's workers share the folder), ``run(script, folder, options)`` runs one of
the scripts on an exported folder and returns the JSON it prints.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

VERSION = "4.3.1"
BUILD = Path(__file__).resolve().parents[1] / "build" / "tjs"
SCRIPTS = Path(__file__).parent / "transformersjs"


def directory() -> Path:
    """Where transformers.js is (or goes): ``OPREG_TJS_DIR``, or build/tjs."""
    return Path(os.environ.get("OPREG_TJS_DIR") or BUILD)


def installed(folder: Path) -> bool:
    return (folder / "node_modules" / "@huggingface" / "transformers" / "package.json").is_file()


def missing() -> str:
    """Why transformers.js cannot run here (``""`` when it can, or can be installed)."""
    if shutil.which("node") is None:
        return "node is not installed (transformers.js runs on node)"
    if not installed(directory()) and shutil.which("npm") is None:
        return f"npm is not installed, and transformers.js is not in {directory()} (set OPREG_TJS_DIR)"
    return ""


def install() -> Path:
    """transformers.js's folder, installed first if it is not (npm, under a lock)."""
    folder = directory()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed(folder):
            argv = ["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", str(folder)]
            done = subprocess.run(
                [*argv, f"@huggingface/transformers@{VERSION}"], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"npm could not install transformers.js {VERSION} into {folder}:\n{done.stderr[-2000:]}"
                )
    return folder


def run(script: str, folder: Path, options: dict[str, Any], tjs: Path) -> dict[str, Any]:
    """The JSON line ``tests/transformersjs/script`` prints on the exported ``folder``."""
    done = subprocess.run(
        ["node", str(SCRIPTS / script), str(folder), json.dumps(options)], capture_output=True, text=True,
        timeout=300, env={**os.environ, "OPREG_TJS_DIR": str(tjs)}, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"transformers.js failed on {folder} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
