"""The tutorials' vocabulary over opreg's one registry (DESIGN.md §7).

``OnnxRegistry``, ``ExportOptions`` and ``dynamo_export`` mirror the API of
torch 2.1-2.5 that the PyTorch ONNX tutorials use, so their code runs with
``torch.onnx`` replaced by ``opreg``. They are a thin layer: an
``OnnxRegistry`` is a copy of :func:`opreg.default_registry` and
``register_op`` is :meth:`opreg.Registry.register`; the result of
``dynamo_export`` is an :class:`opreg.OnnxProgram`.

The target is the ``onnx`` profile plus every custom domain the functions
registered here emit, at the version taken from the function itself (the
``Opset`` it was written with). As ``dynamo_export`` did, script functions of
at most three nodes are inlined and larger ones kept as model-local functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opreg.errors import OpsetConflictError
from opreg.opname import OpName
from opreg.plugins import default_registry
from opreg.registry import Impl, Registry
from opreg.targets import Target

TUTORIAL_INLINE_LIMIT = 3
"""``dynamo_export`` inlined functions this small; the tutorials' graphs assume it."""


class OnnxRegistry:
    """The registry of the tutorials: ``register_op`` and ``is_registered_op``.

    Starts as a copy of the installed packs' registry (``plugins`` and
    ``exclude`` choose packs as in :func:`opreg.default_registry`).
    """

    def __init__(self, *, plugins: Iterable[str] | None = None, exclude: Iterable[str] | None = None) -> None:
        self.registry: Registry = default_registry(plugins=plugins, exclude=exclude).copy()
        self._registered: list[Impl] = []

    @staticmethod
    def _name(namespace: str, op_name: str, overload: str | None) -> OpName:
        return OpName.of(f"{namespace}::{op_name}.{overload or 'default'}")

    def register_op(self, namespace: str, op_name: str, overload: str | None = None, *, function: Any) -> Impl:
        """Use ``function`` (an onnxscript function) for ``namespace::op_name.overload``.

        It overrides every pack's impl of that op; its opset versions are read
        from the function. Returns the registered :class:`opreg.Impl`.
        """
        impl = self.registry.register(self._name(namespace, op_name, overload), function)
        self._registered.append(impl)
        return impl

    def is_registered_op(self, namespace: str, op_name: str, overload: str | None = None) -> bool:
        """Whether any impl (a pack's or one registered here) exists for the op."""
        return self._name(namespace, op_name, overload) in self.registry

    def target(self, base: Any = "onnx") -> Target:
        """``base`` plus the custom domains the functions registered here emit.

        Two functions that need different versions of one domain are a
        :class:`OpsetConflictError` naming both.
        """
        resolved = self.registry.target(base)
        versions = resolved.as_dict()
        owners: dict[str, Impl] = {}
        for impl in self._registered:
            for domain, wanted in impl.requirement.domains:
                have = versions.get(domain)
                if have is None:
                    versions[domain] = wanted.min
                    owners[domain] = impl
                elif have not in wanted:
                    other = owners.get(domain)
                    by = f"{other.name} (for {other.op})" if other else f"target {resolved}"
                    raise OpsetConflictError(
                        f"{impl.name} (for {impl.op}) needs {domain}{wanted}, but {by} has {domain} "
                        f"version {have}: a model has one version per domain; write both functions "
                        "with the same Opset version"
                    )
        return Target.of(versions)


class ExportOptions:
    """Options of :func:`dynamo_export`: the registry to use, and optionally the target
    (default: the ``onnx`` profile plus the domains of the registered functions)."""

    def __init__(
        self,
        *,
        onnx_registry: OnnxRegistry | None = None,
        dynamic_shapes: Any = None,
        target: Any = "onnx",
    ) -> None:
        self.onnx_registry = onnx_registry
        self.dynamic_shapes = dynamic_shapes
        self.target = target


def dynamo_export(model: Any, /, *model_args: Any, export_options: ExportOptions | None = None, **model_kwargs: Any):
    """Export ``model(*model_args, **model_kwargs)`` as the tutorials' ``torch.onnx.dynamo_export`` did.

    Returns an :class:`opreg.OnnxProgram` (``model_proto``, ``save``,
    ``adapt_torch_inputs_to_onnx``, ``adapt_torch_outputs_to_onnx``, and
    opreg's ``run``/``verify``).
    """
    from opreg.exporter import export

    options = export_options or ExportOptions()
    onnx_registry = options.onnx_registry or OnnxRegistry()
    return export(
        model,
        tuple(model_args),
        model_kwargs or None,
        target=onnx_registry.target(options.target),
        dynamic_shapes=options.dynamic_shapes,
        registry=onnx_registry.registry,
        inline=TUTORIAL_INLINE_LIMIT,
    )
