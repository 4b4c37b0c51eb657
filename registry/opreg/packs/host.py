"""The plugin host: what an export asks of the loaded packs' code, an object of its own beside the registry.

A :class:`opreg.Registry` is a value: impls, profiles, unsupported ops, preferences, the capture
patches added by hand. What the packs' code answers while a model is exported (rewrite rules, function
definitions, capture patches, the session configuration, reference kernels) is asked of the
:class:`PackHost` built beside it (:func:`opreg.packs.plugins.load` gives both; :func:`opreg.default_host`,
:func:`opreg.packs.plugins.host_of`; an export's ``host=``), which calls each loaded pack's hook through the
one per-pack caller of its :class:`~opreg.packs.packset.PackSet`. The registry holds no reference to it. A
host with no packs (``PackHost()``, the host of a registry built by hand) answers nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from opreg.packs.packset import PackSet

REWRITE_RULES = "opreg_rewrite_rules"
FUNCTIONS = "opreg_functions"
CAPTURE_PATCHES = "opreg_capture_patches"
CONFIGURE_SESSION = "opreg_configure_session"
REFERENCE_KERNELS = "opreg_reference_kernels"
CHECKPOINT_LOADERS = "opreg_checkpoint_loaders"


@dataclasses.dataclass(frozen=True, eq=False)
class PackHost:
    """The loaded packs' hooks, asked by name (compared by identity: it holds live pack code).

    Fields:
        packs: the :class:`opreg.PackSet` of the packs loaded beside the registry: each discovered
            pack's report (iterate it), and the per-pack caller of the loaded packs' hooks.
    """

    packs: PackSet = dataclasses.field(default_factory=PackSet)

    def call(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``(pack, result)`` of ``hook`` on every loaded pack (see :meth:`opreg.PackSet.call`)."""
        return self.packs.call(hook, **kwargs)

    def rewrite_rules(self, target: Any) -> list[tuple[str, Any]]:
        """``(pack, rules)`` of every pack's ``opreg_rewrite_rules`` at ``target``."""
        return self.call(REWRITE_RULES, target=target)

    def functions(self) -> list[tuple[str, Any]]:
        """``(pack, FunctionProtos)`` of every pack's ``opreg_functions``."""
        return self.call(FUNCTIONS)

    def configure_session(self, options: Any) -> list[str]:
        """Let every pack configure ONNX Runtime's ``options``; the packs that did."""
        return [pack for pack, _ in self.call(CONFIGURE_SESSION, options=options)]

    def checkpoint_loaders(self) -> list[tuple[str, Any]]:
        """``(pack, loader)`` of every :class:`opreg.CheckpointLoader` the packs offer, in load order."""
        return [(pack, loader) for pack, loaders in self.call(CHECKPOINT_LOADERS) for loader in loaders]

    def reference_kernels(self) -> list[type]:
        """The ``onnx.reference`` kernels (``OpRun`` classes) of every pack, in load order."""
        return [kernel for _pack, kernels in self.call(REFERENCE_KERNELS) for kernel in kernels]


__all__ = ["PackHost"]
