"""Docs are code: every hook is documented, and every Python block in the docs runs."""

from __future__ import annotations

import inspect
import linecache
import re
import sys
import types
from pathlib import Path

import pytest

from opreg import hookspecs
from opreg.plugins import hook_names

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
DOCS = ["README.md", "CONTRIBUTING.md", "BENCHMARKS.md", *PAGES]
HOOKS_GUIDE = "docs/pack-reference.md"  # its section "The hooks" documents every hook
WALK = "docs/writing-packs.md"
"""The pack author's walk: its file blocks (``# swishlib.py``, ...) are run by tests/test_pack_author.py."""


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_every_hook_is_a_documented_spec():
    specs = sorted(name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("opreg_"))
    assert specs == sorted(hook_names())
    guide = (ROOT / HOOKS_GUIDE).read_text()
    hooks = guide[guide.index("\n## The hooks\n") :]
    hooks = hooks[: hooks.index("\n## ", 1)]
    for name in specs:
        assert len(inspect.getdoc(getattr(hookspecs, name)) or "") > 80, f"{name} needs a real docstring"
        assert f"`{name}(" in hooks, f"{HOOKS_GUIDE}, 'The hooks', does not document hook {name}"


SET_UP = "python3 -m venv .venv && . .venv/bin/activate && python -m pip install -r requirements-dev.txt"
TEST = "python -m pytest -n auto"


def test_readme_has_the_two_commands_and_ci_runs_them():
    readme = (ROOT / "README.md").read_text()
    assert f"```\n{SET_UP}\n{TEST}\n```" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"\n{SET_UP}\n" in ci and f"\n{TEST}\n" in ci


def test_the_set_up_is_locked():
    """requirements-dev.txt installs requirements-dev.in under the lock, which pins every
    package the set-up installs except opreg's own (editable) distributions."""
    assert (ROOT / "requirements-dev.txt").read_text().split("\n")[-3:] == [
        "-c constraints.txt",
        "-r requirements-dev.in",
        "",
    ]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.lower().replace("_", "-")] = version
    for name in ("torch", "onnx", "onnxscript", "onnx-ir", "onnxruntime", "numpy", "protobuf", "transformers",
                 "pytest", "pytest-xdist", "hypothesis", "ruff", "expecttest", "setuptools"):  # fmt: skip
        assert name in pins, f"{name} is not pinned in constraints.txt"
    own = {"opreg", "opreg-ort-contrib", "opreg-test-customop"}
    assert not own & set(pins)
    drift = {name: (v, _installed(name)) for name, v in pins.items() if _installed(name) not in (None, v)}
    assert not drift, (
        f"installed versions differ from the lock (locked, installed): {drift}; run the README's set-up "
        "command in a fresh venv, or regenerate the lock (CONTRIBUTING.md, 'The lock') and run the suite"
    )


def _installed(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_readme_is_a_door():
    """README stays short and links every reference page, BENCHMARKS.md and CONTRIBUTING.md."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "README.md is a door: move reference text to a page under docs/"
    for page in [*PAGES, "BENCHMARKS.md", "CONTRIBUTING.md"]:
        assert f"]({page})" in readme, f"README.md does not link {page}"


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve(doc):
    """Every relative link of a page names a file that exists, and an anchor a heading of it."""
    text = (ROOT / doc).read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        linked = (ROOT / doc).parent / path if path else ROOT / doc
        assert linked.exists(), f"{doc} links {target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in headings(linked), f"{doc} links {target}: no such heading"


def headings(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings (code blocks left out)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    titles = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", t.lower()).replace(" ", "-") for t in titles}


def walk_file(doc: str, source: str) -> bool:
    """Whether ``source`` is a file of the pack author's walk, which tests/test_pack_author.py writes and runs
    in a fresh environment (an installed library, the edited pack, a model file) rather than here."""
    from tests.test_pack_author import FILES, LOADER_FILES

    return doc == WALK and source.split("\n", 1)[0].removeprefix("# ") in FILES + LOADER_FILES


def test_the_walks_files_are_the_walks():
    from tests.test_pack_author import walk

    files = [b for b in python_blocks(ROOT / WALK) if walk_file(WALK, b)]
    walks = [text for loader in (False, True) for kind, text in walk(loader) if kind == "file"]
    assert len(files) == 6 and files == walks


@pytest.mark.parametrize(
    ("doc", "index"),
    [(doc, i) for doc in DOCS for i, b in enumerate(python_blocks(ROOT / doc)) if not walk_file(doc, b)],
)
def test_python_blocks_run(doc, index, tmp_path, monkeypatch):
    source = python_blocks(ROOT / doc)[index]
    monkeypatch.chdir(tmp_path)
    if source.startswith("# my_pack/__init__.py"):
        run_pack_skeleton(source, ROOT / doc, tmp_path, monkeypatch)
    else:
        name = f"{doc}[block {index}]"
        # onnxscript.script reads its function's source and module: let inspect find both
        monkeypatch.setitem(linecache.cache, name, (len(source), None, source.splitlines(True), name))
        module = types.ModuleType("__doc_example__")
        monkeypatch.setitem(sys.modules, module.__name__, module)
        exec(compile(source, name, "exec"), module.__dict__)


def run_pack_skeleton(source: str, guide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install the guide's pack module, with the entry point of the guide's first toml block, as a
    real distribution and load it."""
    import sys

    import opreg.plugins

    package = tmp_path / "my_pack"
    package.mkdir()
    (package / "__init__.py").write_text(source)
    (impls,) = [b for b in python_blocks(guide) if b.startswith("# my_pack/impls.py")]
    (package / "impls.py").write_text(impls)
    info = tmp_path / "my_pack-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pack\nVersion: 0.1\n")
    toml = re.search(r"```toml\n(.*?)```", guide.read_text(), flags=re.S).group(1)
    ini = toml.replace('[project.entry-points."opreg.plugins"]', "[opreg.plugins]").replace('"', "")
    (info / "entry_points.txt").write_text(ini)
    monkeypatch.syspath_prepend(str(tmp_path))
    opreg.plugins.clear_cache()
    try:
        registry = opreg.plugins.build_registry(plugins=["my_pack"], exclude=["core"])
        (my_pack,) = [r for r in registry.packs if r.name == "my_pack"]
        assert (my_pack.status, my_pack.impls) == ("loaded", 1), my_pack
        assert registry.resolve("aten::relu", 18).pack == "my_pack"
    finally:
        opreg.plugins.clear_cache()
        for name in [m for m in sys.modules if m == "my_pack" or m.startswith("my_pack.")]:
            del sys.modules[name]
