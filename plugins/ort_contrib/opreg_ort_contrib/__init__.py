"""opreg pack for ONNX Runtime's com.microsoft contrib ops.

Importing this module imports neither onnxruntime nor onnxscript; the hooks do.
"""

from __future__ import annotations

import opreg

OPREG_API_VERSION = 1

CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_PRIORITY = 10
"""Contrib impls outrank the core pack's wherever the target offers com.microsoft."""


_LAZY = {"MatMulNBitsQuantization": "opreg_ort_contrib.quantize", "TorchaoWeights": "opreg_ort_contrib.torchao"}
"""Public names whose modules are imported when first used (they import onnx_ir and numpy)."""


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@opreg.hookimpl
def opreg_targets():
    return {"onnxruntime": {"": opreg.newest_supported_opset(), CONTRIB_DOMAIN: 1}}


@opreg.hookimpl
def opreg_schemas():
    from opreg_ort_contrib import schemas

    return schemas.schemas()


@opreg.hookimpl
def opreg_register_ops(registry: opreg.Registrar) -> None:
    from opreg_ort_contrib import activation, attention, linalg

    registry.register_module(activation, attention, linalg)


@opreg.hookimpl
def opreg_rewrite_rules(target):
    if target.get(CONTRIB_DOMAIN) != 1:  # no rule applies (fusions.rules says the same): the module need not load
        return []
    from opreg_ort_contrib import fusions

    return fusions.rules(target)


@opreg.hookimpl
def opreg_rewrite_samples():
    from opreg_ort_contrib import samples

    return samples.samples()


@opreg.hookimpl
def opreg_samples():
    from opreg_ort_contrib import samples

    return samples.op_samples()
