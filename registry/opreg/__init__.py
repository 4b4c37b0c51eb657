"""opreg: export PyTorch models to ONNX through a registry of op packs.

Importing opreg is cheap: no pack, no torch, no onnxruntime is imported until
a registry is first needed.
"""

from __future__ import annotations

from opreg.errors import (
    FrozenRegistryError,
    InvalidOpNameError,
    InvalidTargetError,
    NoImplementationError,
    OpregError,
    PluginError,
    PluginNotFoundError,
    RegistrationError,
    SignatureMismatchError,
)
from opreg.hookspecs import hookimpl
from opreg.opname import OpName
from opreg.plugins import PLUGIN_API_VERSION, PackReport, Registrar, build_registry, default_registry
from opreg.registry import Candidate, Conflict, Explanation, Impl, Registry
from opreg.targets import OpsetRequirement, Target, VersionRange

__version__ = "0.1.0"

__all__ = [
    "PLUGIN_API_VERSION",
    "Candidate",
    "Conflict",
    "Explanation",
    "FrozenRegistryError",
    "Impl",
    "InvalidOpNameError",
    "InvalidTargetError",
    "NoImplementationError",
    "OpName",
    "OpregError",
    "OpsetRequirement",
    "PackReport",
    "PluginError",
    "PluginNotFoundError",
    "Registrar",
    "RegistrationError",
    "Registry",
    "SignatureMismatchError",
    "Target",
    "VersionRange",
    "build_registry",
    "default_registry",
    "hookimpl",
]
