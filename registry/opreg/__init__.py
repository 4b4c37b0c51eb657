"""opreg: export PyTorch models to ONNX through a registry of op packs.

Importing opreg is cheap: no pack, no torch, no onnxruntime is imported until
a registry is first needed.
"""

from __future__ import annotations

from opreg.compat import ExportOptions, OnnxRegistry, dynamo_export, pack_from_translation_table
from opreg.errors import (
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
    PluginError,
    PluginNotFoundError,
    RegistrationError,
    RuntimeUnavailableError,
    SaveError,
    SignatureMismatchError,
    UnsupportedOpsError,
    VerificationError,
)
from opreg.hookspecs import hookimpl
from opreg.opname import OpName
from opreg.packset import PackSet
from opreg.patching import CapturePatch, PatchOutcome
from opreg.pluginapi import HookError, ModelSample, PackReport, Sample
from opreg.plugins import PLUGIN_API_VERSION, build_registry, default_registry
from opreg.registrar import ImplSpec, Registrar, Rejection, impl
from opreg.registry import Candidate, Conflict, Explanation, Impl, Registry
from opreg.table_out import TranslationTable, TranslationTableWarning
from opreg.targets import (
    OpsetRequirement,
    Target,
    VersionRange,
    newest_onnxruntime_opset,
    newest_supported_opset,
    onnx_opset_range,
)

__version__ = "0.1.0"


def export(model, args=(), kwargs=None, **options):  # type: ignore[no-untyped-def]
    """Export a PyTorch module to ONNX through the registry; see :func:`opreg.exporter.export`.

    ``opreg.export(model, args=(), kwargs=None, *, target="onnx",
    dynamic_shapes=None, plugins=None, exclude=None, registry=None,
    inline=True, embed_functions=False, optimize=True, fold_weights=True, rewrite=True, seed=None,
    patches=True, exclude_patches=(), progress=None)``
    returns an :class:`opreg.exporter.OnnxProgram`
    with ``model``, ``model_proto``, ``save``, ``run`` and ``verify``.
    """
    from opreg import exporter

    return exporter.export(model, args, kwargs, **options)


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # The exporter's types import torch: load them on first use only.
    if name in ("OnnxProgram", "OutputCheck", "Verification", "MissingOp", "Location"):
        from opreg import exporter

        return getattr(exporter, name)
    raise AttributeError(f"module 'opreg' has no attribute {name!r}")


__all__ = [
    "PLUGIN_API_VERSION",
    "Candidate",
    "CapturePatch",
    "Conflict",
    "ExportError",
    "ExportOptions",
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
    "PackReport",
    "PackSet",
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
    "SignatureMismatchError",
    "Target",
    "TranslationTable",
    "TranslationTableWarning",
    "UnsupportedOpsError",
    "VerificationError",
    "VersionRange",
    "build_registry",
    "default_registry",
    "dynamo_export",
    "export",
    "hookimpl",
    "impl",
    "newest_onnxruntime_opset",
    "newest_supported_opset",
    "onnx_opset_range",
    "pack_from_translation_table",
]
