"""What the installed packs give opreg, as JSON: a refactor of the framework shows it changes none of it.

Every impl of the default registry (op, function, pack, requirement, priority, predicate, kind,
convention, source, parameters...), every op marked unsupported, the profiles, every pack's report, and every
hook's result on every loaded pack after its contract's check (``opreg_rewrite_rules`` at each
profile and at the newest ai.onnx), each object described by what identifies it (a schema by
domain, name and version, a rule by name, a sample by its label, a function by its qualified name).

    python tools/behaviour_dump.py before.json        # on the commit before a refactor
    python tools/behaviour_dump.py after.json         # after it
    cmp before.json after.json                        # identical, or `diff` says what changed

The file has no timing, path or memory address in it, so two runs of one tree write the same bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

HOOKS_WITHOUT_ARGUMENTS = (
    "opreg_targets",
    "opreg_schemas",
    "opreg_reference_kernels",
    "opreg_functions",
    "opreg_samples",
    "opreg_rewrite_samples",
    "opreg_capture_patches",
    "opreg_capture_samples",
)
"""The hooks called with nothing; ``opreg_register_ops`` is dumped as the registry's impls,
``opreg_configure_session`` as the packs that answer it (it returns nothing)."""


def name_of(value: Any) -> str:
    """A function's or class's ``module.qualname``, the source tree's root left out."""
    module = getattr(value, "__module__", None) or ""
    qualname = getattr(value, "__qualname__", None) or getattr(value, "name", None) or type(value).__qualname__
    return f"{module}.{qualname}" if module else str(qualname)


def describe(value: Any) -> Any:
    """``value`` as JSON that identifies it, never an address."""
    import onnx
    import onnx.defs
    import torch
    from onnx_ir.passes import PassBase
    from onnxscript.rewriter import pattern

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(key): describe(item) for key, item in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [describe(item) for item in value]
    if isinstance(value, onnx.defs.OpSchema):
        return f"schema {value.domain}::{value.name} since {value.since_version}"
    if isinstance(value, onnx.FunctionProto):
        return f"function {value.domain}::{value.name} ({len(value.node)} nodes)"
    if isinstance(value, pattern.RewriteRuleSet):
        return {"rule set": [describe(rule) for rule in value.rules]}
    if isinstance(value, pattern.RewriteRule):
        return f"rule {value.name}"
    if isinstance(value, PassBase):
        return f"pass {type(value).__qualname__}"
    if isinstance(value, torch.Tensor):
        return f"tensor {str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, torch.nn.Module):
        return f"module {type(value).__qualname__}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: describe(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, type) or callable(value):
        return f"callable {name_of(value)}"
    return f"{type(value).__qualname__} {value}"


def impl_row(impl: Any) -> dict[str, Any]:
    return {
        "op": str(impl.op),
        "function": name_of(impl.function),
        "name": impl.name,
        "pack": impl.pack,
        "requirement": str(impl.requirement),
        "priority": impl.priority,
        "predicate": None if impl.predicate is None else name_of(impl.predicate),
        "override": impl.override,
        "complex": impl.complex,
        "kind": impl.kind,
        "convention": impl.convention,
        "schema_checked": impl.schema_checked,
        "source": os.path.relpath(impl.source, ROOT) if impl.source.startswith(str(ROOT)) else impl.source,
        "profiles": list(impl.profiles),
        "params": describe(impl.params),
        "keywords": impl.keywords,
    }


def dump() -> dict[str, Any]:
    import onnxruntime

    import opreg

    registry, host = opreg.default_registry(), opreg.default_host()
    hooks: dict[str, Any] = {}
    for hook in HOOKS_WITHOUT_ARGUMENTS:
        hooks[hook] = {pack: describe(value) for pack, value in host.call(hook)}
    targets = {name: registry.target(name) for name in sorted(registry.profiles)}
    targets["newest"] = registry.target(opreg.newest_supported_opset())
    hooks["opreg_rewrite_rules"] = {
        name: {pack: describe(value) for pack, value in host.call("opreg_rewrite_rules", target=target)}
        for name, target in targets.items()
    }
    packs = host.packs
    hooks["opreg_configure_session"] = sorted(
        pack for pack in packs.loaded if "opreg_configure_session" in packs.implemented(pack)
    )
    host.call("opreg_configure_session", options=onnxruntime.SessionOptions())  # raises nothing
    return {
        "packs": [describe(dataclasses.replace(report, seconds=0.0)) for report in registry.packs],
        "profiles": registry.profiles,
        "unsupported": {str(op): list(reason) for op, reason in sorted(registry.unsupported().items())},
        "impls": sorted((impl_row(i) for i in registry.impls()), key=lambda r: json.dumps(r, sort_keys=True)),
        "hooks": hooks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the JSON file to write")
    args = parser.parse_args()
    os.environ.setdefault("OPREG_NO_CACHE", "1")  # the packs' own answers, not a cached registry
    args.output.write_text(json.dumps(dump(), indent=1, sort_keys=True) + "\n")
    import opreg

    print(f"wrote {args.output} (opreg from {Path(opreg.__file__).parent})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
