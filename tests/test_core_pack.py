"""The core pack's impls follow the house rules."""

from __future__ import annotations

import inspect

import pytest
from onnxscript.values import Opset

from opreg.plugins import build_registry

CORE = [i for i in build_registry(plugins=[]).impls() if i.pack == "core"]


def _opset_aliases(func, seen=None) -> dict[str, Opset]:
    """ai.onnx opset aliases a function reads, following helpers of its own module."""
    seen = set() if seen is None else seen
    seen.add(func)
    aliases = {}
    for name in func.__code__.co_names:
        value = func.__globals__.get(name)
        if isinstance(value, Opset) and value.domain == "":
            aliases[name] = value
        elif inspect.isfunction(value) and value.__module__ == func.__module__ and value not in seen:
            aliases.update(_opset_aliases(value, seen))
    return aliases


@pytest.mark.parametrize("impl", CORE, ids=lambda i: f"{i.op}:{i.name}")
def test_opset_alias_matches_declared_requirement(impl):
    """`op20.X` in an impl that declares ai.onnx >= 20: the alias, the module and the requirement agree."""
    aliases = _opset_aliases(impl.function)
    assert aliases, f"{impl.name} uses no ai.onnx opset alias"
    for name, opset in aliases.items():
        assert name == f"op{opset.version}", f"{impl.name}: alias {name} for opset {opset.version}"
    assert max(o.version for o in aliases.values()) == impl.requirement.onnx.min


@pytest.mark.parametrize("impl", CORE, ids=lambda i: f"{i.op}:{i.name}")
def test_impls_are_documented_and_schema_checked(impl):
    doc = inspect.getdoc(impl.function) or ""
    assert doc.startswith(f"{impl.op.name}"), f"{impl.name}'s docstring must start with the ATen schema"
    assert impl.schema_checked
