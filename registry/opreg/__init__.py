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
    UnsupportedOpsError,
    VerificationError,
    WeightsError,
)

if TYPE_CHECKING:
    from opreg._export import export
    from opreg.checkpoint import CheckpointExport, export_checkpoint
    from opreg.compat import ExportOptions, OnnxRegistry, dynamo_export, pack_from_translation_table
    from opreg.explanation import Candidate, Conflict, Explanation
    from opreg.hookspecs import hookimpl
    from opreg.host import PackHost
    from opreg.impls import Impl
    from opreg.loaderapi import (
        CheckContext,
        Checkpoint,
        CheckpointLoader,
        Component,
        DynamicDim,
        ExportPlan,
        FileCopy,
        LoopCheck,
        ModelInput,
        PostStep,
        Recognition,
    )
    from opreg.opname import OpName
    from opreg.packset import PackSet
    from opreg.patching import CapturePatch, PatchOutcome
    from opreg.pluginapi import HookError, ModelSample, PackReport, PackReports, Sample
    from opreg.plugins import PLUGIN_API_VERSION, build_registry, default_host, default_registry
    from opreg.registrar import ImplSpec, Registrar, Rejection, impl
    from opreg.registry import Registry
    from opreg.settings import ExportSettings
    from opreg.table_out import TranslationTable, TranslationTableWarning
    from opreg.targets import (
        OpsetRequirement,
        Target,
        VersionRange,
        newest_onnxruntime_opset,
        newest_supported_opset,
        onnx_opset_range,
    )

_LAZY = {
    "ExportOptions": "opreg.compat",
    "OnnxRegistry": "opreg.compat",
    "dynamo_export": "opreg.compat",
    "pack_from_translation_table": "opreg.compat",
    "hookimpl": "opreg.hookspecs",
    "PackHost": "opreg.host",
    "OpName": "opreg.opname",
    "PackSet": "opreg.packset",
    "CapturePatch": "opreg.patching",
    "PatchOutcome": "opreg.patching",
    "HookError": "opreg.pluginapi",
    "ModelSample": "opreg.pluginapi",
    "PackReport": "opreg.pluginapi",
    "PackReports": "opreg.pluginapi",
    "Sample": "opreg.pluginapi",
    "PLUGIN_API_VERSION": "opreg.plugins",
    "build_registry": "opreg.plugins",
    "default_registry": "opreg.plugins",
    "default_host": "opreg.plugins",
    "ImplSpec": "opreg.registrar",
    "Registrar": "opreg.registrar",
    "Rejection": "opreg.registrar",
    "impl": "opreg.registrar",
    "Candidate": "opreg.explanation",
    "Conflict": "opreg.explanation",
    "Explanation": "opreg.explanation",
    "Impl": "opreg.impls",
    "CheckContext": "opreg.loaderapi",
    "Checkpoint": "opreg.loaderapi",
    "CheckpointLoader": "opreg.loaderapi",
    "Component": "opreg.loaderapi",
    "DynamicDim": "opreg.loaderapi",
    "ExportPlan": "opreg.loaderapi",
    "FileCopy": "opreg.loaderapi",
    "LoopCheck": "opreg.loaderapi",
    "ModelInput": "opreg.loaderapi",
    "PostStep": "opreg.loaderapi",
    "Recognition": "opreg.loaderapi",
    "CheckpointExport": "opreg.checkpoint",
    "export_checkpoint": "opreg.checkpoint",
    "Registry": "opreg.registry",
    "ExportSettings": "opreg.settings",
    "export": "opreg._export",
    "TranslationTable": "opreg.table_out",
    "TranslationTableWarning": "opreg.table_out",
    "OpsetRequirement": "opreg.targets",
    "Target": "opreg.targets",
    "VersionRange": "opreg.targets",
    "newest_onnxruntime_opset": "opreg.targets",
    "newest_supported_opset": "opreg.targets",
    "onnx_opset_range": "opreg.targets",
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


__all__ = [
    "PLUGIN_API_VERSION",
    "Candidate",
    "CapturePatch",
    "Conflict",
    "ExportError",
    "ExportOptions",
    "ExportSettings",
    "Explanation",
    "FrozenRegistryError",
    "HookError",
    "InterruptedAfterSave",
    "InvalidArgumentError",
    "InvalidInputError",
    "Impl",
    "ImplSpec",
    "ModelSample",
    "InvalidOpNameError",
    "InvalidTargetError",
    "NoImplementationError",
    "OnnxRegistry",
    "OpName",
    "OpregError",
    "OpsetConflictError",
    "OpsetRequirement",
    "PackHost",
    "PackReport",
    "PackReports",
    "PackSet",
    "PackWarning",
    "PatchOutcome",
    "PluginError",
    "PluginNotFoundError",
    "Registrar",
    "RegistrationError",
    "Rejection",
    "Registry",
    "Sample",
    "RuntimeUnavailableError",
    "SaveError",
    "ShapeGuardWarning",
    "SignatureMismatchError",
    "StateError",
    "Target",
    "TranslationTable",
    "TranslationTableWarning",
    "UnsupportedOpsError",
    "VerificationError",
    "WeightsError",
    "VersionRange",
    "build_registry",
    "default_host",
    "default_registry",
    "dynamo_export",
    "export",
    "hookimpl",
    "impl",
    "newest_onnxruntime_opset",
    "newest_supported_opset",
    "onnx_opset_range",
    "pack_from_translation_table",
    "CheckContext",
    "Checkpoint",
    "CheckpointError",
    "CheckpointExport",
    "CheckpointLoader",
    "Component",
    "DynamicDim",
    "ExportPlan",
    "FileCopy",
    "LoopCheck",
    "ModelInput",
    "PostStep",
    "Recognition",
    "export_checkpoint",
]
