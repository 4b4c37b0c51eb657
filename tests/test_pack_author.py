"""The pack author's walk, docs/writing-packs.md, run as a newcomer runs it.

Each shell command of the guide runs in order, in a fresh environment (a venv that sees this one's
packages behind its own); the guide's files are written where its code blocks say (the library an
author already has into the venv's site-packages, the edited ``impls.py`` over the generated one, the
model file into the working folder); what each step must show is checked. The wheel the guide builds
replaces the editable install, and the pack's tests run as its CI workflow runs them.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import onnx
import yaml

from tests.test_scaffold import layered_venv, run

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "writing-packs.md"
LIBRARY = "swishlib.py"
EDITED = "opreg-swishpack/opreg_swishpack/impls.py"
MODELS = "models.py"
FILES = (LIBRARY, EDITED, MODELS)
"""The guide's code blocks that are files of the walk (their first line is ``# PATH``), in its order."""
LOADER_SECTION = "## 8. A checkpoint loader"
LOADER_LIBRARY = "patchlib.py"
LOADER_FILES = (
    LOADER_LIBRARY,
    "opreg-patchpack/opreg_patchpack/loaders.py",
    "opreg-patchpack/opreg_patchpack/__init__.py",
)
"""The files of the guide's second walk, a checkpoint loader (its section ``LOADER_SECTION``)."""
TIMEOUT = 600


def walk(loader: bool = False) -> list[tuple[str, str]]:
    """The guide's shell commands and files, in order: ``("sh", command)`` and ``("file", block)``; of
    the pack's walk, or (``loader``) of its section on a checkpoint loader."""
    text = GUIDE.read_text()
    before, section = text.split(LOADER_SECTION)
    text = section.split("\n## ", 1)[0] if loader else before
    files = LOADER_FILES if loader else FILES
    steps = []
    for kind, block in re.findall(r"```(sh|python)\n(.*?)```", text, flags=re.S):
        if kind == "sh":
            steps += [("sh", line) for line in block.splitlines() if line.strip()]
        elif block.split("\n", 1)[0].removeprefix("# ") in files:
            steps.append(("file", block))
    return steps


def purelib(python: Path) -> Path:
    found = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=python.parent)
    return Path(found.stdout.strip())


def command(line: str, python: Path) -> list[str]:
    """A guide command as the venv runs it: pip offline (the venv sees opreg, torch and setuptools)."""
    program, *rest = shlex.split(line, comments=True)
    if program == "pip" and rest[0] in ("install", "wheel"):
        wheel = ["--force-reinstall"] if rest[-1].endswith(".whl") else []  # over the editable install
        return [str(python), "-m", "pip", rest[0], "-q", "--no-deps", "--no-build-isolation", *wheel, *rest[1:]]
    assert program in ("opreg", "pip", "python"), f"the walk does not know how to run {line!r}"
    return [str(python), "-m", program, *rest] if program != "python" else [str(python), *rest]


def place(block: str, cwd: Path, python: Path) -> None:
    path = block.split("\n", 1)[0].removeprefix("# ")
    installed = path in (LIBRARY, LOADER_LIBRARY)
    target = purelib(python) / path if installed else cwd / path  # the library is installed already
    assert path != EDITED or target.is_file(), "the guide edits impls.py before new-pack wrote it"
    target.write_text(block)


def test_the_guides_walk(tmp_path):
    python = layered_venv(tmp_path / "venv")
    cwd = tmp_path / "work"
    cwd.mkdir()
    steps = walk()
    assert [text.split("\n", 1)[0] for kind, text in steps if kind == "file"] == [f"# {f}" for f in FILES]
    done: dict[str, list] = {}
    for kind, text in steps:
        if kind == "file":
            place(text, cwd, python)
            continue
        ran = run(*command(text, python), cwd=cwd, timeout=TIMEOUT)
        key = " ".join(shlex.split(text, comments=True)[:2])
        done.setdefault(key, []).append(ran)
        check(key, len(done[key]), ran, cwd)
    assert sorted(done) == [
        "opreg explain", "opreg export", "opreg new-pack", "opreg pack-check", "opreg plugins",
        "pip install", "pip show", "pip wheel",
    ]  # fmt: skip
    published(python, cwd)


def check(key: str, nth: int, ran, cwd: Path) -> None:  # type: ignore[no-untyped-def]
    """What the ``nth`` run of guide command ``key`` must show."""
    out, err = ran.stdout, ran.stderr
    if (key, nth) == ("opreg pack-check", 1):  # the impl is still a stub
        assert ran.returncode == 1, out + err
        assert "13 passed, 1 failed" in out
        stub = (cwd / EDITED).read_text().splitlines().index('@opreg.impl("swishlib::fused_swish")') + 1
        failures = [line for line in out.splitlines() if line.startswith("failed: ")]
        assert failures == [
            "failed: [samples] swishpack:swishlib_fused_swish for swishlib::fused_swish.default: not written yet: "
            f"write the body of swishlib_fused_swish ({EDITED}:{stub})"  # relative to where it runs
        ], out
        return
    assert ran.returncode == 0, f"{key}:\n{out[-3000:]}\n{err[-3000:]}"
    if key == "opreg plugins":
        assert re.search(r"swishpack +│ opreg-swishpack +│ 0\.1\.0 +│ loaded +│ 1 ", out), out
    elif key == "opreg pack-check":
        assert "17 passed, 0 failed" in out, out
    elif key == "opreg explain":  # the pack's own op at its profile (issue 53: it lost to the standard impl)
        assert re.search(r"│ chosen +│ swishpack +│ swishlib_fused_swish_ow", out), out
        assert re.search(r"│ outranked +│ swishpack +│ swishlib_fused_swish +│", out), out
    elif key == "opreg export":
        assert "verified with onnxruntime" in out and "note: target" not in err, out + err
        exported(cwd, nth)
    elif key == "pip show":
        assert "Summary: opreg op pack: exports swishlib::fused_swish to ONNX (domain swishlib)" in out, out


def exported(cwd: Path, nth: int) -> None:
    """The models of the walk: at onnxruntime standard ONNX beside com.microsoft's Gelu, no domain joined; at
    the pack's profile its own op, defined by the embedded function."""
    model = onnx.load(cwd / ("block.onnx" if nth == 1 else "own.onnx"))
    imports = {o.domain: o.version for o in model.opset_import}
    nodes = {(n.domain, n.op_type) for n in model.graph.node}
    metadata = {p.key: p.value for p in model.metadata_props}
    assert "opreg.joined_domains" not in metadata
    if nth == 1:
        assert "swishlib" not in imports and imports["com.microsoft"] == 1
        # the standard swish, x * sigmoid(1.5 x), which opreg-ort-contrib's rewrite makes ONNX Runtime's QuickGelu
        assert nodes == {("", "Gemm"), ("com.microsoft", "QuickGelu"), ("com.microsoft", "Gelu")}, nodes
        assert not model.functions
        return
    assert imports["swishlib"] == 1 and "com.microsoft" not in imports and ("swishlib", "FusedSwish") in nodes
    assert [(f.domain, f.name) for f in model.functions] == [("swishlib", "FusedSwish")]


def published(python: Path, cwd: Path) -> None:
    """The wheel is what loads now, and the pack's CI workflow's commands are the ones the walk ran, and
    its tests pass where the workflow runs them (the pack's repository)."""
    (wheel,) = (cwd / "dist").glob("opreg_swishpack-0.1.0-py3-none-any.whl")
    where = run(python, "-c", "import opreg_swishpack; print(opreg_swishpack.__file__)", cwd=cwd)
    assert Path(where.stdout.strip()).is_relative_to(purelib(python)), where.stdout  # not the editable source
    listed = run(python, "-m", "opreg", "plugins", "--json", cwd=cwd, timeout=TIMEOUT)
    (report,) = [r for r in json.loads(listed.stdout) if r["name"] == "swishpack"]
    assert (report["status"], report["schemas"]) == ("loaded", ["swishlib::FusedSwish"])
    pack = cwd / "opreg-swishpack"
    workflow = yaml.safe_load((pack / ".github" / "workflows" / "opreg-pack.yml").read_text())
    steps = workflow["jobs"]["check"]["steps"]
    commands = [s["run"] for s in steps if "run" in s and s.get("name") != "install"]
    assert commands == ["opreg plugins", "opreg pack-check swishpack", "python -m pytest tests"]  # the walk ran two
    assert workflow["jobs"]["check"]["strategy"]["matrix"]["resolution"] == ["lowest-direct", "highest"]
    assert wheel.name in " ".join(shlex.split(GUIDE.read_text().split("## 6. Publishing")[1].split("```")[1]))
    tests = run(*command(commands[-1], python), "-q", "-p", "no:cacheprovider", cwd=pack, timeout=TIMEOUT)
    assert tests.returncode == 0, f"{commands[-1]}:\n{tests.stdout[-3000:]}\n{tests.stderr[-2000:]}"
    assert "2 passed" in tests.stdout  # the pack's tests: the export and the kit


def test_the_guides_checkpoint_loader_walk(tmp_path):
    """Section 8: a pack that teaches opreg a library's folders, installed as a real distribution, and the
    folder exported by ``opreg export`` alone. The pack's files are written once ``opreg new-pack`` made it."""
    import numpy as np
    import onnxruntime

    python = layered_venv(tmp_path / "venv")
    cwd = tmp_path / "work"
    cwd.mkdir()
    steps = walk(loader=True)
    files = [text for kind, text in steps if kind == "file"]
    assert [f.split("\n", 1)[0] for f in files] == [f"# {f}" for f in LOADER_FILES]
    place(files[0], cwd, python)  # the library, installed already
    ran = {}
    for kind, text in steps:
        if kind == "sh":
            key = " ".join(shlex.split(text, comments=True)[:2])
            ran[key] = run(*command(text, python), cwd=cwd, timeout=TIMEOUT)
            assert ran[key].returncode == 0, f"{text}:\n{ran[key].stdout[-3000:]}\n{ran[key].stderr[-3000:]}"
            if key == "opreg new-pack":
                for block in files[1:]:
                    place(block, cwd, python)
    assert sorted(ran) == ["opreg export", "opreg new-pack", "pip install", "python -c"]
    out = ran["opreg export"].stdout
    assert "patchpack:patchlib: patchlib, task feature-extraction (inferred from patchlib.json" in out, out
    assert "verified: 1 model(s) match eager PyTorch" in out, out
    folder = cwd / "patch-onnx"
    assert sorted(p.name for p in folder.iterdir()) == ["model.onnx", "patchlib.json"]
    session = onnxruntime.InferenceSession(folder / "model.onnx", providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"pixel_values": np.zeros((3, 3, 20, 20), np.float32)})  # a side neither verified
    assert got.shape == (3, 25, 8)
    (cwd / "patch-model" / "weights.pt").unlink()
    refused = run(python, "-m", "opreg", "export", "patch-model", "-o", "again", cwd=cwd, timeout=TIMEOUT)
    assert refused.returncode == 2 and "has no weights.pt: save the model with patchlib.save" in refused.stderr
    assert not (cwd / "again").exists()
