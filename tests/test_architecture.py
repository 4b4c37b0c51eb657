"""The shape of the code, kept by checks: import contracts, no private names across
modules, no repeated blocks of code."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "registry", ROOT / "core_ops")
MIN_DUPLICATE_LINES = 6


def python_files() -> list[Path]:
    return sorted(p for folder in SOURCES for p in folder.rglob("*.py"))


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT)
    parts = list(relative.with_suffix("").parts[1:])  # registry/opreg/x.py -> opreg.x
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_import_contracts_are_kept():
    """pyproject.toml's [tool.importlinter] contracts: no cycles among opreg's modules, the
    exporter's stages import one way, the registry knows nothing of the exporter, and the
    core pack imports opreg's public API only."""
    command = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 kept, 0 broken" in done.stdout
    # imports under `if TYPE_CHECKING:` count too: a circle of type-only imports is a circle
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert settings["exclude_type_checking_imports"] is False


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _first_party(module: str) -> bool:
    return module == "opreg" or module.startswith(("opreg.", "opreg_core_ops"))


def private_uses(path: Path) -> list[str]:
    """``from opreg.x import _name`` and ``module._name`` on a module of opreg imported here."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    modules: dict[str, str] = {}  # local name -> first-party module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _first_party(node.module) and node.level == 0:
            for alias in node.names:
                if _private(alias.name) and not _is_module(f"{node.module}.{alias.name}"):
                    found.append(f"{here}:{node.lineno}: imports {node.module}.{alias.name}")
                elif _is_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _first_party(alias.name) and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _private(node.attr)
            and not _is_module(f"{modules[node.value.id]}.{node.attr}")
            and modules[node.value.id] != here
        ):
            found.append(f"{here}:{node.lineno}: uses {modules[node.value.id]}.{node.attr}")
    return found


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of this repository."""
    top, _, rest = dotted.partition(".")
    base = ROOT / ("registry" if top == "opreg" else "core_ops") / top
    path = base.joinpath(*rest.split(".")) if rest else base
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_no_private_name_is_used_across_modules():
    """A ``_private`` name is its module's business: another module uses the public name
    (private *modules*, such as ``opreg.exporter._plan``, may be imported inside the package)."""
    found = [use for path in python_files() for use in private_uses(path)]
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_private_name_check_can_fail(tmp_path, monkeypatch):
    probe = ROOT / "registry" / "opreg" / "exporter" / "_probe_for_test.py"
    probe.write_text("from opreg.exporter._recorder import _infer\nfrom opreg import plugins\nplugins._warned\n")
    try:
        assert [u.split(": ", 1)[1] for u in private_uses(probe)] == [
            "imports opreg.exporter._recorder._infer",
            "uses opreg.plugins._warned",
        ]
    finally:
        probe.unlink()


_TRIVIAL = re.compile(r"^[\s()\[\]{},:]*$")


def code_lines(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` that are code: no blank lines, comments, docstrings, imports,
    decorators, lone brackets or function signatures (impls mirror ATen schemas, and two
    functions may rightly take the same parameters); white space folded."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            docstrings.update(range(node.lineno, node.body[0].lineno))  # the signature
    kept = []
    for number, line in enumerate(source.splitlines(), 1):
        text = " ".join(line.split("#")[0].split()) if "#" in line and '"' not in line else " ".join(line.split())
        if number in docstrings or not text or text.startswith(("#", "import ", "from ", "@")) or _TRIVIAL.match(text):
            continue
        kept.append((number, text))
    return kept


def duplicated_blocks(paths: list[Path], size: int = MIN_DUPLICATE_LINES) -> list[str]:
    """Places where ``size`` consecutive code lines repeat, in one file or across files."""
    seen: dict[tuple[str, ...], list[tuple[Path, int]]] = defaultdict(list)
    for path in paths:
        lines = code_lines(path)
        for i in range(len(lines) - size + 1):
            window = tuple(text for _, text in lines[i : i + size])
            seen[window].append((path, lines[i][0]))
    found = []
    for window, places in seen.items():
        distinct = sorted(set(places))
        if len(distinct) > 1:
            where = ", ".join(f"{p.relative_to(ROOT)}:{line}" for p, line in distinct)
            found.append(f"{where}: {window[0][:60]} ...")
    return found


def test_no_block_of_six_lines_is_duplicated():
    found = duplicated_blocks(python_files())
    assert not found, f"blocks of {MIN_DUPLICATE_LINES}+ identical code lines:\n" + "\n".join(found)


def test_the_duplicate_check_can_fail(tmp_path):
    body = "".join(f"    x{i} = compute({i}, y)\n" for i in range(MIN_DUPLICATE_LINES))
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    one.write_text(f"def f(y):\n{body}    return x0\n")
    two.write_text(f"def g(y):\n{body}    return x1\n")
    monkeypatch_root = pytest.MonkeyPatch()
    monkeypatch_root.setattr(sys.modules[__name__], "ROOT", tmp_path)
    try:
        assert len(duplicated_blocks([one, two])) == 1
    finally:
        monkeypatch_root.undo()
