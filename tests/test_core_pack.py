"""The core pack's impls follow the house rules."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import types
import typing
from collections.abc import Sequence

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # defines the quantized_decomposed ops, so their impls are checked
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20
from onnxscript.values import Opset

from opreg.ops import Tensor
from opreg.packs.plugins import build_registry
from opreg.registry import _inspect, _opsets
from opreg.registry.marks import marked
from opreg_core_ops import ops
from opreg_core_ops.ops.elementwise import aten_where

CORE = [i for i in build_registry(plugins=[]).impls() if i.pack == "core"]


def onnx_aliases(function) -> dict[str, Opset]:
    """The ai.onnx opsets an impl reads by name (not inside a mapping of version-specific pieces,
    ``NAME[]``): the impl's own code and its helpers', as registration sees them (``_opsets.names_read``)."""
    return {
        name: value
        for name, value in _opsets.names_read(function)
        if isinstance(value, Opset) and value.domain == "" and not name.endswith("[]")
    }


def check_opsets(function, requirement, versions=None) -> None:
    """``op20.X`` in an impl that declares ai.onnx >= 20: every alias is named after its
    version, and the declared minimum is the newest version the code (helpers included) uses.
    A function registered at several ``versions`` (one body, told its opset) uses exactly
    the opsets of those versions."""
    name = getattr(function, "__name__", function)
    aliases = onnx_aliases(function)
    assert aliases, f"{name} uses no ai.onnx opset alias"
    for alias, opset in aliases.items():
        assert alias == f"op{opset.version}", f"{name}: alias {alias} for opset {opset.version}"
    used = _opsets.onnx_module_versions(_opsets.used_opsets(function))
    assert {o.version for o in aliases.values()} <= used
    if versions is not None:
        assert used == versions, f"{name} is registered at {sorted(versions)} but its code uses {sorted(used)}"
        return
    assert requirement.onnx.min == max(used), f"{name} declares {requirement} but its code uses {sorted(used)}"


def registered_versions(impl) -> set[int] | None:
    """The ai.onnx versions ``impl``'s function is registered at for its op, if it is told its opset."""
    if not impl.params.takes_opset:
        return None
    return {i.requirement.onnx.min for i in CORE if i.function is impl.function and i.op == impl.op}


@pytest.mark.parametrize("impl", CORE, ids=lambda i: f"{i.op}:{i.name}:{i.requirement.onnx.min}")
def test_declared_requirement_is_what_the_code_uses(impl):
    check_opsets(impl.function, impl.requirement, registered_versions(impl))


def test_every_versioned_impl_has_several_versions():
    """One body for several opsets replaces the ``_opsetNN`` twins: none is left, and a function told
    its opset is registered at more than one."""
    assert not [i.name for i in CORE if "_opset" in i.name]
    versioned = {(i.op, i.name): registered_versions(i) for i in CORE if i.params.takes_opset}
    assert len(versioned) == 27 and all(len(v) > 1 for v in versioned.values()), versioned


# -- the check above can fail -------------------------------------------------------------


def _helper_on_20(x):
    return op20.Gelu(x)


def _calls_helper(x):
    return _second_helper(x)


def _second_helper(x):
    return _calls_helper(x) if x is None else _helper_on_20(x)  # a cycle, then op20


def gelu_through_helpers(self, approximate: str = "none"):
    """gelu(Tensor self, *, str approximate='none') -> Tensor: op18 here, op20 two helpers down."""
    return op18.Identity(_calls_helper(self))


op19 = op20  # a misnamed alias


def gelu_misnamed(self, approximate: str = "none"):
    return op19.Gelu(self)


def test_used_opsets_follow_helpers_through_cycles():
    assert _opsets.onnx_module_versions(_opsets.used_opsets(gelu_through_helpers)) == {18, 20}
    # functions of another package (here the core pack's, for a function of tests) are not followed
    assert _opsets.used_opsets(where_elsewhere) == {}


def where_elsewhere(condition, self, other):
    return aten_where(condition, self, other)


def test_the_opset_check_can_fail():
    requirement = build_registry(plugins=[]).resolve("aten::gelu", 18).requirement  # ai.onnx>=18
    with pytest.raises(AssertionError, match="declares ai.onnx>=18 but its code uses"):
        check_opsets(gelu_through_helpers, requirement)
    with pytest.raises(AssertionError, match="alias op19 for opset 20"):
        check_opsets(gelu_misnamed, requirement)
    with pytest.raises(AssertionError, match=r"registered at \[18, 21\] but its code uses \[18, 20\]"):
        check_opsets(gelu_through_helpers, requirement, {18, 21})


def test_every_family_module_is_loaded():
    """Each public module of opreg_core_ops.ops is an op family the hook registers: it marks impls,
    and every function it marks is registered (none refused, no module left out of the hook's list)."""
    families = {
        f"opreg_core_ops.ops.{m.name}" for m in pkgutil.iter_modules(ops.__path__) if not m.name.startswith("_")
    }
    assert {i.function.__module__ for i in CORE} == families
    registered = {id(i.function) for i in CORE}
    for family in sorted(families):
        functions = [function for function, _ in marked(importlib.import_module(family))]
        assert functions, f"{family} marks no impl"
        missing = [function.__name__ for function in functions if id(function) not in registered]
        assert not missing, f"{family}: marked but not registered: {missing}"


def tensor_annotation(jit_type):
    """What a tensor argument of torch type ``jit_type`` is annotated with: ``Tensor``,
    ``Tensor | None`` (``Tensor?``), ``Sequence[Tensor]`` (``Tensor[]``), ``Sequence[Tensor | None]``."""
    if isinstance(jit_type, torch.OptionalType):
        return tensor_annotation(jit_type.getElementType()) | None
    if isinstance(jit_type, torch.ListType):
        return Sequence[tensor_annotation(jit_type.getElementType())]
    return Tensor


ATTRIBUTE = "an attribute type (int, float, bool, str, a sequence of them)"


def accepted(annotation) -> set:
    """What an annotation accepts, one entry per member of a union: a tensor annotation as itself
    (``Tensor``, ``Sequence[Tensor]``), ``None``, and any attribute type as :data:`ATTRIBUTE`."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    members = members or (annotation,)
    return {ATTRIBUTE if _inspect._is_attribute_annotation(m) else m for m in members}


def schema_types(arg) -> tuple[set, set]:
    """(what an annotation must accept for schema argument ``arg``, what it may accept): a tensor
    argument's annotation (``Tensor?`` is ``Tensor | None``) both; for another argument, an
    attribute type, or ``None`` besides when it is optional."""
    if _inspect._schema_arg_kind(arg) == "tensor":
        return accepted(tensor_annotation(arg.type)), accepted(tensor_annotation(arg.type))
    return {ATTRIBUTE}, {ATTRIBUTE, type(None)}


def check_annotations(impl, served) -> None:
    """Each parameter's annotation accepts what ``impl``'s schema passes there, and nothing no schema of
    ``served`` (the ops its function is registered for) passes: a function serving ``add.Tensor`` and
    ``add.Scalar`` annotates ``other`` with ``Tensor | float``, one serving only ``add.Tensor`` with ``Tensor``.
    A parameter past ``impl``'s schema has a default and is, by name, another served schema's."""
    annotations = inspect.signature(impl.function, eval_str=True).parameters
    schemas = {str(i.op): [a for a in _inspect.torch_schema(i.op).arguments if not a.is_out] for i in served}
    arguments = schemas[str(impl.op)]
    left_out = arguments[len(impl.params.params) :]
    assert all(_inspect.placement_only(a) for a in left_out), f"{impl.name} leaves schema arguments out"
    for place, param in enumerate(impl.params.params):
        if place >= len(arguments):
            names = {_inspect.python_name(s[place].name) for s in schemas.values() if place < len(s)}
            assert param.has_default and param.name in names, f"{impl.name}: {param.text} is no argument of {impl.op}"
            continue
        assert param.name == _inspect.python_name(arguments[place].name)  # `from` is written `from_`
        given = accepted(annotations[param.name].annotation)
        required, _ = schema_types(arguments[place])
        allowed = set().union(*(schema_types(s[place])[1] for s in schemas.values() if place < len(s)))
        assert required <= given, (
            f"{impl.name}: {param.text} does not accept {impl.op}'s {arguments[place].name}: {arguments[place].type}"
        )
        assert given <= allowed, f"{impl.name}: {param.text} accepts what no schema it serves passes"


@pytest.mark.parametrize("impl", CORE, ids=lambda i: f"{i.op}:{i.name}")
def test_parameters_are_annotated_and_named_as_the_schema_says(impl):
    """Tensor arguments annotated with ``Tensor`` (read as tensors, not attributes), the others with
    attribute types, each parameter named as the ATen schema names it. Only trailing arguments that
    say nothing of the values (device, layout, memory format, pinned memory) may be left out. A function
    serving several overloads (``add.Tensor`` and ``add.Scalar``) annotates a parameter with the union of
    what they pass (``other: Tensor | float``): see :func:`check_annotations`."""
    check_annotations(impl, [i for i in CORE if i.function is impl.function])


def add_tensor(self: Tensor, other: Tensor, alpha: float = 1.0):
    """add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: serves only add.Tensor."""


def add_scalar_as_tensor(self: Tensor, other: Tensor | float, alpha: float = 1.0):
    """add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor: accepts a tensor no schema passes."""


def div_extra(self: Tensor, other: Tensor, rounding_mode: str | None = None, scale: float = 1.0):
    """div.Tensor(Tensor self, Tensor other) -> Tensor: ``scale`` is no schema's argument."""


def test_the_annotation_check_can_fail():
    """An annotation that leaves out what a served schema passes (``other: Tensor`` also serving
    ``add.Scalar``), one that accepts what none passes, and a parameter no served schema has, each fail."""
    from opreg.registry.impls import build_impl

    def impl(function, op):
        return build_impl(
            op, function, opset=None, domains=None, priority=0, predicate=None, pack="core", override=False
        )

    tensor, scalar = impl(add_tensor, "aten::add.Tensor"), impl(add_tensor, "aten::add.Scalar")
    check_annotations(tensor, [tensor])
    with pytest.raises(AssertionError, match=r"does not accept aten::add\.Scalar's"):
        check_annotations(scalar, [tensor, scalar])
    lone = impl(add_scalar_as_tensor, "aten::add.Scalar")
    with pytest.raises(AssertionError, match="accepts what no schema it serves passes"):
        check_annotations(lone, [lone])
    extra = impl(div_extra, "aten::div.Tensor")
    with pytest.raises(AssertionError, match="is no argument of aten::div.Tensor"):
        check_annotations(extra, [extra, impl(div_extra, "aten::div.Tensor_mode")])


@pytest.mark.parametrize("impl", CORE, ids=lambda i: f"{i.op}:{i.name}")
def test_impls_are_documented_and_schema_checked(impl):
    """The docstring starts with the ATen schema of an op the function is registered for; a function
    registered for several ops gives each one's schema at the start of a paragraph."""
    doc = inspect.getdoc(impl.function) or ""
    ops = {i.op.name for i in CORE if i.function is impl.function}
    assert re.split(r"[.(]", doc)[0] in ops, f"{impl.name}'s docstring must start with the ATen schema"
    schema = re.compile(rf"{re.escape(impl.op.name)}[.(]")
    paragraphs = [doc, *(p.lstrip() for p in doc.split("\n\n")[1:])]
    assert any(schema.match(p) for p in paragraphs), f"{impl.name} does not say what it does for {impl.op}"
    assert impl.schema_checked
