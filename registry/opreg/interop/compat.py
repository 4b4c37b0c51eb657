"""The tutorials' vocabulary over opreg's one registry (docs/design.md, "The tutorials' API").

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

from opreg.errors import InvalidArgumentError, OpsetConflictError, RegistrationError
from opreg.packs.plugins import default_registry, discovered, table_profile
from opreg.registry import table_in
from opreg.registry.impls import USER_PACK, Impl
from opreg.registry.opname import OpName
from opreg.registry.registrar import Registrar
from opreg.registry.registry import Registry
from opreg.registry.targets import Target

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
        from the function, and it is taken and called as torch.onnx takes and
        calls it (:func:`opreg.registry.table_in.torch_impl`, the path a
        ``custom_translation_table`` takes too). Returns the registered
        :class:`opreg.Impl`.
        """
        impl = table_in.torch_impl(self._name(namespace, op_name, overload), function, pack=USER_PACK, override=True)
        self.registry.add(impl)
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
    (default: the ``onnx`` profile plus the domains of the registered functions; ``opset_version=N``,
    torch.onnx's spelling, is ``target=N``), and torch.onnx.export's ``input_names``,
    ``output_names`` and ``dynamic_axes`` (:class:`opreg.ExportSettings` says what each does)."""

    def __init__(
        self,
        *,
        onnx_registry: OnnxRegistry | None = None,
        dynamic_shapes: Any = None,
        target: Any = "onnx",
        opset_version: int | None = None,
        input_names: Any = None,
        output_names: Any = None,
        dynamic_axes: Any = None,
    ) -> None:
        self.onnx_registry = onnx_registry
        self.dynamic_shapes = dynamic_shapes
        self.target = target
        self.opset_version = opset_version
        self.input_names = input_names
        self.output_names = output_names
        self.dynamic_axes = dynamic_axes


def dynamo_export(model: Any, /, *model_args: Any, export_options: ExportOptions | None = None, **model_kwargs: Any):
    """Export ``model(*model_args, **model_kwargs)`` as the tutorials' ``torch.onnx.dynamo_export`` did.

    Returns an :class:`opreg.OnnxProgram` (``model_proto``, ``save``,
    ``adapt_torch_inputs_to_onnx``, ``adapt_torch_outputs_to_onnx``, and
    opreg's ``run``/``verify``).
    """
    from opreg.exporter import export

    options = export_options or ExportOptions()
    onnx_registry = options.onnx_registry or OnnxRegistry()
    if options.opset_version is not None and options.target != "onnx":
        raise InvalidArgumentError(
            f"ExportOptions got target={options.target!r} and opset_version={options.opset_version!r}: pass one "
            "(opset_version=N is target=N)"
        )
    base = options.target if options.opset_version is None else options.opset_version
    return export(
        model,
        tuple(model_args),
        model_kwargs or None,
        target=onnx_registry.target(base),
        dynamic_shapes=options.dynamic_shapes,
        registry=onnx_registry.registry,
        inline=TUTORIAL_INLINE_LIMIT,
        input_names=options.input_names,
        output_names=options.output_names,
        dynamic_axes=options.dynamic_axes,
    )


def pack_from_translation_table(
    name: str,
    table: Any,
    *,
    opsets: table_in.OpsetsLike = None,
    priority: int = 0,
    registry: Registry | None = None,
) -> Registry:
    """A ``custom_translation_table`` (``{torch op: function}``, as ``torch.onnx.export(dynamo=True,
    custom_translation_table=...)`` takes it) as pack ``name``.

    Returns a new, unfrozen copy of ``registry`` (default: :func:`opreg.default_registry`)
    with the table's functions registered as pack ``name``'s impls. They are
    not user overrides: they rank by ``priority`` and opset requirement like
    any pack's impls, and the copy prefers pack ``name`` over any other pack's
    impl of the same priority and requirement (the core pack's, conditional or
    not); pass ``priority=1`` to win over newer-opset impls too. Each
    function's opset requirement is read from the function unless ``opsets``
    declares it (``{"": 18, "mylib.ops": 1}``).
    If the table's functions emit custom domains, the copy has a target
    profile ``name`` (the ``onnx`` profile plus those domains), when ``name``
    is an identifier and free.

    Keys may be op overloads, op packets (each overload the function fits) or
    op names; values a function or a list of functions (see
    :mod:`opreg.registry.table_in`). Raises :class:`opreg.RegistrationError` listing
    every entry opreg cannot take, and :class:`opreg.InvalidArgumentError` when
    ``name`` is not a string or is taken: by an installed pack (``"core"``,
    ``"ort_contrib"``, whether loaded or not) or a pack already in ``registry``.
    """
    base = registry if registry is not None else default_registry()
    _check_pack_name(name, base)
    registrar = Registrar(name)
    impls = registrar.register_translation_table(table, opsets=opsets, priority=priority)
    if registrar.rejected:
        lines = "; ".join(f"{r.op} ({r.function}): {r.error}" for r in registrar.rejected)
        raise RegistrationError(f"{len(registrar.rejected)} entry(ies) of table {name!r} cannot be used: {lines}")
    result = base.copy()
    result.add(*impls)
    for op in sorted({impl.op for impl in impls}):
        result.prefer(op, name)
    profile = table_profile(impls)
    if profile and name.isidentifier() and name not in result.profiles:
        result.add_profile(name, profile, pack=name)
    return result


def _check_pack_name(name: Any, registry: Registry) -> None:
    """Refuse a name the table's impls cannot carry: not a string, or one an installed pack
    or a pack of ``registry`` already has (its impls would pass as that pack's)."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(
            f"pack_from_translation_table's first argument names the new pack, a non-empty string such as "
            f"'mylib', got {type(name).__name__} {name!r}"
        )
    taken = {f.name: f"the installed pack {f.name!r} ({f.distribution} {f.version})" for f in discovered()}
    taken.update({r.name: f"the installed pack {r.name!r} ({r.distribution} {r.version})" for r in registry.packs})
    taken.update({i.pack: f"pack {i.pack!r} of the registry" for i in registry.impls() if i.pack not in taken})
    taken[USER_PACK] = "opreg's name for impls registered by hand"
    if name in taken:
        free = next(f"{name}_table{n or ''}" for n in range(100) if f"{name}_table{n or ''}" not in taken)
        raise InvalidArgumentError(
            f"pack name {name!r} is taken by {taken[name]}: the table's impls would pass as that pack's; "
            f"pass a name of your own, e.g. pack_from_translation_table({free!r}, table)"
        )
