"""``opreg new-pack``: the pack it writes installs, loads and passes its own tests;
names and directories it cannot use are refused without writing anything."""

from __future__ import annotations

import json
import os
import re
import shlex
import site
import subprocess
import sys
from pathlib import Path

import pytest

from opreg import scaffold

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str | os.PathLike[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPREG_DISABLE_PLUGIN_AUTOLOAD")}
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def guide_commands() -> list[list[str]]:
    """The shell block that opens docs/writing-packs.md, one command a line."""
    section = (ROOT / "docs" / "writing-packs.md").read_text()
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def in_venv(command: list[str], python: Path) -> list[str]:
    """A guide command as the venv runs it: offline installs, no cache written into the pack."""
    program, *rest = command
    if program == "pip" and rest[0] == "install":
        return [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *rest[1:]]
    if program == "python" and rest[:2] == ["-m", "pytest"]:
        return [str(python), *rest, "-q", "-p", "no:cacheprovider"]
    assert program in ("opreg", "python"), f"the test does not know how to run {command}"
    return [str(python), "-m", "opreg", *rest] if program == "opreg" else [str(python), *rest]


def layered_venv(venv: Path) -> Path:
    """A new venv that sees this environment's packages (torch, opreg, pip) behind its own, so a
    pack installed into it is installed nowhere else; returns its python.

    ``venv --system-site-packages`` would not do: run from inside a venv, it links the *base*
    interpreter's site-packages, where opreg is not installed. A ``.pth`` file that adds this
    environment's site directories (running their ``.pth`` files too, for editable installs)
    works the same from a venv and from a system Python.
    """
    made = run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv.parent)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    found = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=venv.parent)
    outer = [p for p in [*site.getsitepackages(), site.getusersitepackages()] if Path(p).is_dir()]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in outer)
    (Path(found.stdout.strip()) / "_outer_environment.pth").write_text(lines)
    return python


def test_the_guides_commands_make_a_pack_that_loads_and_passes_its_tests(tmp_path):
    python = layered_venv(tmp_path / "venv")
    commands = guide_commands()
    assert [c[:2] for c in commands] == [["opreg", "new-pack"], ["pip", "install"], ["opreg", "plugins"],
                                         ["python", "-m"]]  # fmt: skip
    outputs = []
    for command in commands:
        done = run(*in_venv(command, python), cwd=tmp_path)
        assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    # no staging directory left (pytest-benchmark, if installed, leaves .benchmarks)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".benchmarks") == ["opreg-mypack", "venv"]
    assert re.search(r"mypack +│ opreg-mypack +│ 0\.1\.0 +│ loaded +│ 1 ", outputs[2]), outputs[2]
    assert "8 passed" in outputs[3], outputs[3]  # the template's own tests, renamed

    listed = run(python, "-m", "opreg", "plugins", "--json", cwd=tmp_path)
    (report,) = [r for r in json.loads(listed.stdout) if r["name"] == "mypack"]
    assert (report["distribution"], report["status"], report["impls"]) == ("opreg-mypack", "loaded", 1), report
    assert report["profiles"] == ["mypack"] and "mypack.ops" in report["domains"]
    assert run(sys.executable, "-c", "import opreg_mypack", cwd=ROOT).returncode == 1  # only in the venv


def test_new_pack_reports_what_it_wrote(tmp_path):
    made = run(sys.executable, "-m", "opreg", "new-pack", "opreg-mypack", "--json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    pack = tmp_path / "opreg-mypack"
    assert created["directory"] == str(pack)
    assert (created["pack"], created["package"], created["domain"]) == ("mypack", "opreg_mypack", "mypack.ops")
    assert sorted(str(p.relative_to(pack)) for p in pack.rglob("*") if p.is_file()) == created["files"]
    assert created["files"] == [
        "README.md",
        "opreg_mypack/__init__.py",
        "opreg_mypack/impls.py",
        "opreg_mypack/runtime.py",
        "opreg_mypack/torch_ops.py",
        "pyproject.toml",
        "tests/test_mypack.py",
    ]
    assert 'mypack = "opreg_mypack"' in (pack / "pyproject.toml").read_text()


def test_the_pack_is_a_renamed_copy_of_the_template(tmp_path):
    """Every file of plugins/test_customop, each template name replaced and nothing else changed."""
    template = ROOT / "plugins" / "test_customop"
    pack = scaffold.new_pack("opreg-mypack", directory=tmp_path / "pack")
    copied = sorted(str(p.relative_to(pack)) for p in pack.rglob("*") if p.is_file())
    originals = scaffold.template_files(template)
    assert len(copied) == len(originals) == 7
    for original in originals:
        text = (template / original).read_text()
        new = (
            "tests/test_mypack.py"
            if original == "tests/test_customop.py"
            else original.replace("opreg_test_customop", "opreg_mypack")
        )
        written = (pack / new).read_text()
        for old_name in ("test_customop", "test.customop", "mylibrary", "opreg-test-customop"):
            assert old_name not in written, (new, old_name)
        kept = [line for line in text.splitlines() if scaffold.MARKER not in line]
        assert len(written.splitlines()) == len(kept), new  # renamed line by line, template-only lines left out
    assert 'DOMAIN = "mypack.ops"' in (pack / "opreg_mypack" / "__init__.py").read_text()
    torch_ops = (pack / "opreg_mypack" / "torch_ops.py").read_text()
    assert '@torch.library.custom_op("opreg_mypack::addandround_op"' in torch_ops
    assert "template pack" not in (pack / "README.md").read_text()


def test_the_wheel_ships_the_template(tmp_path):
    """Built as a user installs it, opreg's wheel holds the template and the list of well-known names."""
    import shutil
    import zipfile

    source = tmp_path / "source"  # a copy: pip builds in the tree it is given
    leftovers = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".*")
    for part in ("pyproject.toml", "README.md", "registry", "core_ops", "plugins/test_customop"):
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, source / part, ignore=leftovers)
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(ROOT / part, source / part)
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, source,
                cwd=tmp_path, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("opreg-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    template = {f"opreg/_template/{f}" for f in scaffold.template_files(ROOT / "plugins" / "test_customop")}
    assert template <= names, sorted(template - names)
    assert "opreg/well_known_names.txt" in names
    assert not [n for n in names if "_template" in n and ("egg-info" in n or "__pycache__" in n)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["my pack"], "not a valid distribution name"),
        (["mypack-"], "not a valid distribution name"),
        (["opreg"], "opreg's own distribution"),
        (["opreg-3d"], "not a Python identifier"),
        (["opreg-class"], "Python keyword"),
        (["core"], "taken by opreg"),
        # opreg's own packages, whichever way the name is written (issue 27, defect 4)
        (["opreg-core-ops"], "one of opreg's own packages"),
        (["opreg_core_ops"], "one of opreg's own packages"),
        (["core-ops"], "'opreg_core_ops', one of opreg's own packages"),
        (["opreg-ort-contrib"], "one of opreg's own packages"),
        (["ort_contrib"], "one of opreg's own packages"),
        (["opreg-test-customop"], "one of opreg's own packages"),
        # installed distributions, importable names, well-known projects
        (["onnxscript"], "a distribution installed here"),
        (["pluggy"], "a distribution installed here"),
        (["boto3"], "a well-known PyPI project"),
        (["scikit_learn"], "a well-known PyPI project"),  # canonical name scikit-learn
        (["Flask"], "a well-known PyPI project"),
        (["opreg-dev-torchvision-shim"], "a distribution installed here"),
        (["dev-torchvision-shim"], "import name 'opreg_dev_torchvision_shim' of 'dev-torchvision-shim' is already"),
        (["mypack", "--domain", "my..ops"], "not dotted identifiers"),
        (["mypack", "--domain", "my-company.ops"], "not dotted identifiers"),
        (["mypack", "--domain", "ai.onnx"], "belongs to ai.onnx"),
        (["mypack", "--domain", "com.microsoft.nchwc"], "belongs to com.microsoft"),
    ],
)
def test_unusable_names_are_refused_and_nothing_is_written(tmp_path, args, message):
    refused = run(sys.executable, "-m", "opreg", "new-pack", *args, cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.startswith("opreg: error: ") and message in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_non_empty_directory_is_refused_and_left_alone(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("")
    for target in ("taken", "file"):
        refused = run(sys.executable, "-m", "opreg", "new-pack", "mypack", "-o", target, cwd=tmp_path)
        assert refused.returncode == 2 and "-o DIR" in refused.stderr, refused.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["file", "notes.txt", "taken"]


def test_an_empty_directory_is_filled(tmp_path):
    (tmp_path / "empty").mkdir()
    path = scaffold.new_pack("mypack", domain="com.example.mypack", directory=tmp_path / "empty")
    assert path == tmp_path / "empty"
    assert 'DOMAIN = "com.example.mypack"' in (path / "opreg_mypack" / "__init__.py").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]


def test_a_failed_write_leaves_nothing(tmp_path):
    # a valid name whose package directory is longer than a file name may be
    long = "opreg-" + "a" * 300
    failed = run(sys.executable, "-m", "opreg", "new-pack", long, "-o", "out", cwd=tmp_path)
    assert failed.returncode == 2 and "could not write" in failed.stderr, failed.stderr
    assert list(tmp_path.iterdir()) == []


def test_names_derive_from_the_distribution():
    names = scaffold.pack_names("Opreg.My_Pack")
    assert (names.pack, names.package, names.namespace, names.domain) == (
        "my_pack",
        "opreg_my_pack",
        "opreg_my_pack",
        "my_pack.ops",
    )
    assert scaffold.pack_names("mypack").package == "opreg_mypack"


def test_generated_code_is_lint_clean(tmp_path):
    pytest.importorskip("ruff")
    path = scaffold.new_pack("opreg-mypack", directory=tmp_path / "pack")
    # from inside the pack, as its author runs ruff: opreg is third-party there
    for command in (["check", "--no-cache"], ["format", "--check"]):
        linted = run(sys.executable, "-m", "ruff", *command, "--isolated", "--line-length", "120", ".", cwd=path)
        assert linted.returncode == 0, linted.stdout
