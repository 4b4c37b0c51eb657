"""What users and pack authors import keeps working: every public name from its documented place.

The places are read from the docs themselves (README.md and docs/*.md, their code blocks and inline
code), so a new documented import is covered as soon as it is written; the modules that moved into
packages keep their old paths (:data:`MOVED`), the same module object.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

MOVED = {
    "opreg.hookspecs": "opreg.packs.hookspecs",
    "opreg.hookchecks": "opreg.packs.hookchecks",
    "opreg.plugins": "opreg.packs.plugins",
    "opreg.packfaults": "opreg.packs.packfaults",
    "opreg.targets": "opreg.registry.targets",
}
"""Old path -> the module's place now, for the modules packs and users imported before they moved
(an alias module at the old path: ``import opreg.targets`` gives ``opreg.registry.targets`` itself)."""

IMPORT = re.compile(
    r"^\s*from\s+(opreg(?:\.[\w.]+)?)\s+import\s+\(?([\w\s,]+?)\)?\s*(?:#.*)?$|^\s*import\s+(opreg(?:\.[\w.]+)?)\b",
    re.M,
)
DOTTED = re.compile(r"(?<![\w./-])opreg(?:\.[A-Za-z_]\w*)+(?:\()?")


def documented_imports() -> set[tuple[str, str]]:
    """``(module, name)`` for each ``from module import name`` the pages write, ``(module, "")`` for
    each ``import module``."""
    found = set()
    for page in PAGES:
        text = (ROOT / page).read_text()
        text = text.replace("`", "\n")  # inline code: an import between backticks stands on a line of its own
        for module, names, imported in IMPORT.findall(text):
            if imported:
                found.add((imported, ""))
            else:
                found |= {(module, name.split(" as ")[0].strip()) for name in names.split(",") if name.strip()}
    return found


def documented_paths() -> set[str]:
    """Every dotted path into opreg the pages name: ``opreg.a.b...`` (a module's attribute), and
    ``opreg.Name`` or ``opreg.name(`` (a public name, a function called). One lower-case word after
    ``opreg.`` without a call is a metadata key of an exported model (``opreg.torch_op``), not a name."""
    paths = set()
    for page in PAGES:
        for match in DOTTED.findall((ROOT / page).read_text()):
            called = match.endswith("(")
            path = match.removesuffix("(")
            parts = path.split(".")
            if len(parts) > 2 or called or parts[1][0].isupper():
                paths.add(path)
    return paths


def resolve(path: str) -> object:
    """The object ``path`` names: the longest importable module, then attributes."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for name in parts[end:]:
            value = getattr(value, name)
        return value
    raise ModuleNotFoundError(path)


def test_the_docs_are_read():
    """The readers find what the pages are known to hold, so an empty result is never a pass."""
    assert {("opreg.ops", "Tensor"), ("opreg.testing", "check_pack"), ("opreg.values", "is_complex")} <= (
        documented_imports()
    )
    assert {"opreg.llm.export_decoder", "opreg.testing.Distribution", "opreg.export", "opreg.Registry"} <= (
        documented_paths()
    )
    assert "opreg.torch_op" not in documented_paths()


@pytest.mark.parametrize(("module", "name"), sorted(documented_imports()))
def test_each_documented_import_works(module, name):
    imported = importlib.import_module(module)
    if name:
        assert hasattr(imported, name), f"{module} has no {name}, which the docs import from it"


@pytest.mark.parametrize("path", sorted(documented_paths()))
def test_each_documented_path_resolves(path):
    assert resolve(path) is not None


@pytest.mark.parametrize("package", ["opreg", "opreg.llm", "opreg.testing", "opreg.ops"])
def test_every_name_of_a_public_all_imports(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
        exec(f"from {package} import {name}", {})


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_module_keeps_its_old_path(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]
    package, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(package), name) is sys.modules[new]


def test_what_packs_import_from_the_old_paths_still_works():
    """The first-party packs' imports of before the move, as a third party's pack still writes them."""
    import opreg
    from opreg.hookspecs import CONTRACTS, hookimpl
    from opreg.packfaults import user_stacklevel
    from opreg.plugins import host_of, load
    from opreg.targets import DEFAULT_ONNX_OPSET

    assert hookimpl is opreg.hookimpl and CONTRACTS and callable(load) and callable(host_of)
    assert user_stacklevel is opreg.ops.user_stacklevel and isinstance(DEFAULT_ONNX_OPSET, int)
