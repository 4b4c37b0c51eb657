"""Mutation testing with mutmut: how many small changes to a chosen set of modules the tests catch.

    python tools/mutation.py run [--max-children 2] [--tests-from REV]   # mutate, test, print the score
    python tools/mutation.py run --only opreg/packs/packset.py --tests tests/test_registry.py  # a part of it
    python tools/mutation.py run 'opreg.exporter._save.x_save_model__mutmut_*' \
        --only opreg/exporter/_save.py --tests tests/test_save.py        # one function's mutants
    python tools/mutation.py results                                    # the score and the survivors again
    python tools/mutation.py show NAME                                  # one mutant's diff

Not part of the suite (hours on two cores). It builds ``build/mutation/`` with the packages laid out
as mutmut expects (``src/opreg``, ``src/opreg_core_ops``: mutmut names a mutant after the module
path it reads, which must be the import path), the tests, the root ``conftest.py`` and a
``pyproject.toml`` holding the configuration below, and runs ``mutmut`` there. Files are copied
only when they changed, so a rerun retests only the functions whose code or tests changed.

``--tests-from REV`` takes ``tests/`` and ``conftest.py`` from a git revision instead of the work
tree (e.g. ``main``), in ``build/mutation-REV/``: the same mutants against another suite, for a
before/after score (``results`` and ``show`` take it too).
"""

from __future__ import annotations

import argparse
import filecmp
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = {"opreg": ROOT / "registry" / "opreg", "opreg_core_ops": ROOT / "core_ops" / "opreg_core_ops"}
MODULES = (
    "opreg/exporter/_save.py",
    "opreg/registry/registry.py",
    "opreg/registry/resolution.py",
    "opreg/registry/impls.py",
    "opreg/registry/explanation.py",
    "opreg/packs/packset.py",
    "opreg/exporter/_rewrite.py",
    "opreg/packs/patching.py",
    "opreg/exporter/_pytrees.py",
    "opreg_core_ops/ops/indexing.py",
    "opreg_core_ops/ops/reduction.py",
    "opreg_core_ops/ops/random.py",
    "opreg/authoring/_opspec.py",
    "opreg/authoring/_packtext.py",
    "opreg/authoring/_packcode.py",
    "opreg/authoring/scaffold.py",
    "opreg/testing/_kit_pack.py",
    "opreg/testing/_kit_report.py",
    "opreg/llm/_families.py",
    "opreg/llm/_whisper.py",
    "opreg/llm/_vision.py",
    "opreg/llm/_folder.py",
    "opreg/exporter/_grown.py",
    "opreg/exporter/_mounts.py",
)
"""What mutates: the save, the registry and its packs, the packs' rewrite passes, capture patches,
the names of outputs, three core-pack op families; and what round five added (issue 53): the
scaffold (``new-pack``), the kit's pack checks, the language-model families, Whisper and the
vision-language checks, the output folder, grown dims and mounts."""
TESTS = (
    "tests/test_save.py",
    "tests/test_registry.py",
    "tests/test_plugins.py",
    "tests/test_hooks.py",
    "tests/test_rewrite.py",
    "tests/test_patching.py",
    "tests/test_structures.py",
    "tests/test_ops_tensor.py",
    "tests/test_ops_nn.py",
    "tests/test_random.py",
    "tests/test_scaffold.py",
    "tests/test_scaffold_hostile.py",
    "tests/test_kit.py",
    "tests/test_llm.py",
    "tests/test_llm_whisper.py",
    "tests/test_llm_vision.py",
    "tests/test_llm_folder.py",
    "tests/test_folder_keeps.py",
    "tests/test_checkpoint_dims.py",
    "tests/test_dynamic.py",
)
"""The test files each mutant may run (mutmut runs those of their tests that reach the mutated
function). The save's interrupt tests (every name with "interrupt") are left out: their child
processes import opreg unmutated, and under mutmut some end before the signal reaches them."""
LEFT_OUT = "not interrupt and not the_wheel_ships"
"""The tests no mutant runs (a ``-k`` expression): the save's interrupt tests, and the scaffold's wheel
test, which builds opreg's wheel from the repository's root (absent from mutmut's folder)."""
PYTEST_ARGS = ["-p", "no:opreg", "-p", "no:cacheprovider", "-q"]
"""opreg's own pytest plugin would import opreg before mutmut puts the mutants first on sys.path."""


def config(modules=MODULES, tests=TESTS) -> str:
    def strings(values) -> str:
        return "[" + ", ".join(json.dumps(v) for v in values) + "]"

    return "\n".join([
        "[tool.mutmut]",
        'source_paths = ["src"]',
        f"only_mutate = {strings(f'src/{m}' for m in modules)}",
        'also_copy = ["conftest.py"]',
        f"pytest_add_cli_args = {strings(PYTEST_ARGS)}",
        f"pytest_add_cli_args_test_selection = {strings([*tests, '-k', LEFT_OUT])}",
        'process_isolation = "forkserver"',
        "use_git_change_detection = false",
        "",
        "[tool.pytest.ini_options]",
        'addopts = "-ra --strict-markers"',
        "",
    ])  # fmt: skip


def sync(source: Path, target: Path) -> None:
    """Copy the files of ``source`` to ``target`` (the package's data too: the scaffold reads
    ``well_known_names.txt``), each only if it changed."""
    for path in source.rglob("*"):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        copy = target / path.relative_to(source)
        if not copy.exists() or not filecmp.cmp(path, copy, shallow=False):
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)


def tests_from(rev: str) -> Path:
    """``tests/`` and ``conftest.py`` of git revision ``rev``, in a folder of their own."""
    folder = ROOT / "build" / f"mutation-tests-{rev.replace('/', '_')}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    paths = ["tests"] + (["conftest.py"] if _exists(rev, "conftest.py") else [])
    archive = subprocess.run(["git", "archive", rev, *paths], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def _exists(rev: str, path: str) -> bool:
    done = subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=ROOT, capture_output=True, check=False)
    return done.returncode == 0


def build(rev: str | None) -> Path:
    """Where mutmut runs: one folder per suite, so each keeps its own results."""
    return ROOT / "build" / ("mutation" if rev is None else f"mutation-{rev.replace('/', '_')}")


def prepare(rev: str | None, modules=MODULES, tests=TESTS) -> None:
    folder = build(rev)
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in PACKAGES.items():
        sync(source, folder / "src" / name)
    origin = tests_from(rev) if rev else ROOT
    shutil.rmtree(folder / "tests", ignore_errors=True)
    shutil.copytree(origin / "tests", folder / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    conftest = origin / "conftest.py"
    (folder / "conftest.py").write_text(conftest.read_text() if conftest.exists() else "")
    settings = folder / "pyproject.toml"
    if settings.exists() and settings.read_text() != config(modules, tests):
        shutil.rmtree(folder / "mutants", ignore_errors=True)  # mutmut keeps mutants of the old selection
    settings.write_text(config(modules, tests))


def mutmut(rev: str | None, *args: str) -> int:
    command = [str(Path(sys.executable).parent / "mutmut"), *args]
    return subprocess.run(command, cwd=build(rev), check=False).returncode


def score(rev: str | None) -> None:
    """mutmut's own counts (``mutmut export-cicd-stats``), as the score: caught / (all - skipped),
    mutants no selected test reaches counting as not caught."""
    mutmut(rev, "export-cicd-stats")
    stats = json.loads((build(rev) / "mutants" / "mutmut-cicd-stats.json").read_text())
    tested = stats["total"] - stats["skipped"]
    caught = stats["killed"] + stats["timeout"]
    print(f"score: {caught} of {tested} mutants caught ({100 * caught / max(tested, 1):.1f}%); {json.dumps(stats)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="mutate, run the tests, print the score")
    run.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    run.add_argument("--tests-from", metavar="REV", help="take tests/ and conftest.py from this git revision")
    run.add_argument("--only", nargs="+", choices=MODULES, default=MODULES, help="mutate these of MODULES only")
    run.add_argument("--tests", nargs="+", choices=TESTS, default=TESTS, help="run these of TESTS only")
    run.add_argument("names", nargs="*", help="mutmut's names (or globs) of the mutants to test; default all")
    results = commands.add_parser("results", help="the score and every surviving mutant")
    show = commands.add_parser("show", help="one mutant's diff")
    show.add_argument("name")
    for command in (run, results, show):
        if command is not run:
            command.add_argument("--tests-from", metavar="REV", help="the results of a run with --tests-from REV")
    options = parser.parse_args()
    rev = options.tests_from
    if options.command == "run":
        prepare(rev, options.only, options.tests)
        code = mutmut(rev, "run", "--max-children", str(options.max_children), *options.names)
        score(rev)
        return code
    if options.command == "results":
        score(rev)
        return mutmut(rev, "results")
    return mutmut(rev, "show", options.name)


if __name__ == "__main__":
    sys.exit(main())
