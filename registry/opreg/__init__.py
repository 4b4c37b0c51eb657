"""opreg: export PyTorch models to ONNX through a registry of op packs.

Importing opreg is cheap: no pack, no torch, no onnxruntime is imported until
a registry is first needed, and the names below are imported from their modules
when first used.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from opreg.errors import (
    CheckpointError,
    ExportError,
    FrozenRegistryError,
    InterruptedAfterSave,
    InvalidArgumentError,
    InvalidInputError,
    InvalidOpNameError,
    InvalidTargetError,
    NoImplementationError,
    OpregError,
    OpsetConflictError,
    PackWarning,
    PluginError,
    PluginNotFoundError,
    RegistrationError,
    RuntimeUnavailableError,
    SaveError,
    ShapeGuardWarning,
    SignatureMismatchError,
    StateError,
    StreamingError,
    UnsupportedOpsError,
    VerificationError,
    WeightsError,
    WeightsWarning,
)

if TYPE_CHECKING:
    from opreg._export import export
    from opreg.checkpoint import CheckpointExport, export_checkpoint
    from opreg.interop.compat import ExportOptions, OnnxRegistry, dynamo_export, pack_from_translation_table
    from opreg.loaderapi import (
        CheckContext,
        Checkpoint,
        CheckpointLoader,
        Component,
        DynamicDim,
        ExportPlan,
        FileCopy,
        Handover,
        HandoverResult,
        LoopCheck,
        ModelInput,
        PostStep,
        Recognition,
    )
    from opreg.packs.hookspecs import hookimpl
    from opreg.packs.host import PackHost
    from opreg.packs.packset import PackSet
    from opreg.packs.patching import CapturePatch, PatchOutcome
    from opreg.packs.plugins import PLUGIN_API_VERSION, build_registry, default_host, default_registry
    from opreg.pluginapi import HookError, ModelSample, PackReport, PackReports, Sample
    from opreg.registry.explanation import Candidate, Conflict, Explanation
    from opreg.registry.impls import Impl
    from opreg.registry.opname import OpName
    from opreg.registry.registrar import ImplSpec, Registrar, Rejection, impl
    from opreg.registry.registry import Registry
    from opreg.registry.table_out import TranslationTable, TranslationTableWarning
    from opreg.registry.targets import (
        OpsetRequirement,
        Target,
        VersionRange,
        newest_onnxruntime_opset,
        newest_supported_opset,
        onnx_opset_range,
    )
    from opreg.settings import ExportSettings

_LAZY = {
    "ExportOptions": "opreg.interop.compat",
    "OnnxRegistry": "opreg.interop.compat",
    "dynamo_export": "opreg.interop.compat",
    "pack_from_translation_table": "opreg.interop.compat",
    "hookimpl": "opreg.packs.hookspecs",
    "PackHost": "opreg.packs.host",
    "OpName": "opreg.registry.opname",
    "PackSet": "opreg.packs.packset",
    "CapturePatch": "opreg.packs.patching",
    "PatchOutcome": "opreg.packs.patching",
    "HookError": "opreg.pluginapi",
    "ModelSample": "opreg.pluginapi",
    "PackReport": "opreg.pluginapi",
    "PackReports": "opreg.pluginapi",
    "Sample": "opreg.pluginapi",
    "PLUGIN_API_VERSION": "opreg.packs.plugins",
    "build_registry": "opreg.packs.plugins",
    "default_registry": "opreg.packs.plugins",
    "default_host": "opreg.packs.plugins",
    "ImplSpec": "opreg.registry.registrar",
    "Registrar": "opreg.registry.registrar",
    "Rejection": "opreg.registry.registrar",
    "impl": "opreg.registry.registrar",
    "Candidate": "opreg.registry.explanation",
    "Conflict": "opreg.registry.explanation",
    "Explanation": "opreg.registry.explanation",
    "Impl": "opreg.registry.impls",
    "Registry": "opreg.registry.registry",
    "CheckContext": "opreg.loaderapi",
    "Checkpoint": "opreg.loaderapi",
    "CheckpointLoader": "opreg.loaderapi",
    "Component": "opreg.loaderapi",
    "DynamicDim": "opreg.loaderapi",
    "ExportPlan": "opreg.loaderapi",
    "FileCopy": "opreg.loaderapi",
    "Handover": "opreg.loaderapi",
    "HandoverResult": "opreg.loaderapi",
    "LoopCheck": "opreg.loaderapi",
    "ModelInput": "opreg.loaderapi",
    "PostStep": "opreg.loaderapi",
    "Recognition": "opreg.loaderapi",
    "CheckpointExport": "opreg.checkpoint",
    "export_checkpoint": "opreg.checkpoint",
    "ExportSettings": "opreg.settings",
    "export": "opreg._export",
    "TranslationTable": "opreg.registry.table_out",
    "TranslationTableWarning": "opreg.registry.table_out",
    "OpsetRequirement": "opreg.registry.targets",
    "Target": "opreg.registry.targets",
    "VersionRange": "opreg.registry.targets",
    "newest_onnxruntime_opset": "opreg.registry.targets",
    "newest_supported_opset": "opreg.registry.targets",
    "onnx_opset_range": "opreg.registry.targets",
}
"""Public name -> the module that defines it, imported on first use (PEP 562): ``import opreg``
runs only :mod:`opreg.errors`, so a command that reads a cache starts fast."""

__version__ = "0.1.0"


_EXPORTER_NAMES = ("OnnxProgram", "OutputCheck", "Verification", "MissingOp", "Location", "StateSlot", "FixedDim")


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(_imported(module), name)
        globals()[name] = value  # found once
        return value
    # The exporter's types import torch: load them on first use only.
    if name in _EXPORTER_NAMES:
        return getattr(_imported("opreg.exporter"), name)
    if not name.startswith("__"):  # a submodule, as an eager import of it used to make it an attribute
        try:
            return _imported(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module 'opreg' has no attribute {name!r}")


def _imported(module: str):  # type: ignore[no-untyped-def]
    """``module``, imported with the collector kept off the objects alive before (opreg/_heap.py), as
    an export keeps it: ``opreg.export``'s first lookup imports its module, the first thing an export
    allocates, and a full collection the caller's process has come due for (a million objects of
    torch and the model's library, a quarter of a second) would otherwise land there."""
    loaded = sys.modules.get(module)
    if loaded is not None:  # imported already: nothing to guard (an exporter name is looked up at every use)
        return loaded
    with importlib.import_module("opreg._heap").quiet():  # not `from opreg import`: that asks __getattr__
        return importlib.import_module(module)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_EXPORTER_NAMES})


__all__ = [  # sorted; every name the module and __getattr__ give (tests/test_public_names.py)
    "Candidate",
    "CapturePatch",
    "CheckContext",
    "Checkpoint",
    "CheckpointError",
    "CheckpointExport",
    "CheckpointLoader",
    "Component",
    "Conflict",
    "DynamicDim",
    "Explanation",
    "ExportError",
    "ExportOptions",
    "ExportPlan",
    "ExportSettings",
    "FileCopy",
    "FixedDim",
    "FrozenRegistryError",
    "Handover",
    "HandoverResult",
    "HookError",
    "Impl",
    "ImplSpec",
    "InterruptedAfterSave",
    "InvalidArgumentError",
    "InvalidInputError",
    "InvalidOpNameError",
    "InvalidTargetError",
    "Location",
    "LoopCheck",
    "MissingOp",
    "ModelInput",
    "ModelSample",
    "NoImplementationError",
    "OnnxProgram",
    "OnnxRegistry",
    "OpName",
    "OpregError",
    "OpsetConflictError",
    "OpsetRequirement",
    "OutputCheck",
    "PLUGIN_API_VERSION",
    "PackHost",
    "PackReport",
    "PackReports",
    "PackSet",
    "PackWarning",
    "PatchOutcome",
    "PluginError",
    "PluginNotFoundError",
    "PostStep",
    "Recognition",
    "Registrar",
    "RegistrationError",
    "Registry",
    "Rejection",
    "RuntimeUnavailableError",
    "Sample",
    "SaveError",
    "ShapeGuardWarning",
    "SignatureMismatchError",
    "StateError",
    "StateSlot",
    "StreamingError",
    "Target",
    "TranslationTable",
    "TranslationTableWarning",
    "UnsupportedOpsError",
    "Verification",
    "VerificationError",
    "VersionRange",
    "WeightsError",
    "WeightsWarning",
    "build_registry",
    "default_host",
    "default_registry",
    "dynamo_export",
    "export",
    "export_checkpoint",
    "hookimpl",
    "impl",
    "newest_onnxruntime_opset",
    "newest_supported_opset",
    "onnx_opset_range",
    "pack_from_translation_table",
]
