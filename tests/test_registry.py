"""Registration checks, lints and resolution on hand-built registries."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import onnx_ir as ir
import onnxscript
import pytest
import torch
from onnxscript import opset18
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg
import opreg.packs.plugins
from opreg import (
    FrozenRegistryError,
    InvalidOpNameError,
    NoImplementationError,
    OpName,
    RegistrationError,
    SignatureMismatchError,
)
from opreg.ops import Tensor
from opreg.registry.registry import USER_PACK, build_impl

custom_ort = onnxscript.values.Opset(domain="com.microsoft", version=1)
custom_aten = onnxscript.values.Opset(domain="custom.aten", version=1)
custom_opset = onnxscript.values.Opset(domain="test.customop", version=1)


# The tutorials' functions, verbatim (../shared/seeds/000 and 001).
@onnxscript.script(custom_aten)
def custom_aten_add(input_x, input_y, alpha: float = 1.0):
    input_y = opset18.Mul(input_y, alpha)
    return opset18.Add(input_x, input_y)


@onnxscript.script(custom_ort)
def custom_aten_gelu(input_x, approximate: str = "none"):
    return custom_ort.Gelu(input_x)


@onnxscript.script(custom_opset)
def custom_addandround(input_x):
    add_x = custom_opset.CustomOpOne(input_x, input_x)
    round_x = custom_opset.CustomOpTwo(add_x)
    return opset18.Cast(round_x, to=1)


def pack_impl(op, fn, pack="pack_a", priority=0, opset=None, domains=None, predicate=None):
    """An impl as a pack would register it (not a user override)."""
    return build_impl(
        op, fn, opset=opset, domains=domains, priority=priority, predicate=predicate, pack=pack, override=False
    )


def relu18(self):
    return op18.Relu(self)


def relu18_b(self):
    return op18.Relu(self)


def gelu18(self, approximate: str = "none"):
    return op18.Relu(self)  # numerics do not matter here, only resolution


def gelu20(self, approximate: str = "none"):
    return op20.Gelu(self, approximate=approximate)


# -- op names -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("aten::add.Tensor", OpName("aten", "add", "Tensor")),
        ("aten::gelu", OpName("aten", "gelu", "default")),
        ("aten.add.Tensor", OpName("aten", "add", "Tensor")),
        ("mylibrary::addandround_op.default", OpName("mylibrary", "addandround_op")),
    ],
)
def test_op_names(text, expected):
    assert OpName.of(text) == expected


def test_op_name_from_torch_overload():
    assert OpName.of(torch.ops.aten.add.Tensor) == OpName("aten", "add", "Tensor")
    assert OpName.of(torch.ops.aten.gelu.default) == OpName("aten", "gelu")


@pytest.mark.parametrize("bad", ["add", "aten::", "aten::add.Tensor.x", "aten::1x", ""])
def test_bad_op_names(bad):
    with pytest.raises(InvalidOpNameError, match="namespace::name.overload"):
        OpName.of(bad)


# -- the tutorials' functions register as written -------------------------------------


def test_tutorial_functions_register_as_written():
    registry = opreg.Registry()
    add = registry.register("aten::add.Tensor", custom_aten_add)
    gelu = registry.register("aten::gelu.default", custom_aten_gelu)
    assert add.kind == "script" and add.schema_checked
    assert str(add.requirement) == "ai.onnx>=18"
    assert gelu.requirement.domain_map["com.microsoft"].min == 1
    assert registry.resolve("aten::gelu", {"": 18, "com.microsoft": 1}) is gelu
    assert registry.resolve("aten::gelu", 18) is None  # no com.microsoft in the target


def test_custom_op_impl_is_checked_against_its_torch_schema():
    import opreg_test_customop

    opreg_test_customop.addandround_op  # defines the torch op
    impl = opreg.Registry().register("mylibrary::addandround_op", custom_addandround)
    assert impl.schema_checked
    assert impl.requirement.domain_map == {"test.customop": opreg.VersionRange(1)}


def test_unknown_custom_namespace_is_accepted_unchecked():
    impl = opreg.Registry().register("nosuchlib::thing", relu18)
    assert not impl.schema_checked


def late_scale(x, factor: float = 1.0):
    """scale(Tensor x, float factor) -> Tensor"""
    return op18.Mul(x, op18.CastLike(factor, x))


def late_scale_misnamed(x, k: float = 1.0):
    return op18.Mul(x, op18.CastLike(k, x))


def test_an_impl_registered_before_its_op_exists_is_checked_when_first_planned():
    """A pack need not import the library that defines its ops (torch's quantized_decomposed ops
    cost an import on every export): an impl registered before its op exists is checked against
    the op's schema when an export first plans it, and a mismatch is named there."""
    from tests.optest import Lambda

    defined = hasattr(torch.ops.opreg_late, "scale")
    wrong, right = opreg.Registry(), opreg.Registry()
    misnamed = wrong.register("opreg_late::scale", late_scale_misnamed)
    named = right.register("opreg_late::scale", late_scale)
    assert defined or not (misnamed.schema_checked or named.schema_checked)
    if not defined:

        @torch.library.custom_op("opreg_late::scale", mutates_args=())
        def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
            return x * factor

        scale.register_fake(lambda x, factor: torch.empty_like(x))
    model, x = Lambda(lambda x: torch.ops.opreg_late.scale(x, 2.0)), torch.randn(3)
    with pytest.raises(SignatureMismatchError, match=r"late_scale_misnamed.*opreg_late::scale.*'k'"):
        opreg.export(model, (x,), registry=wrong)
    opreg.export(model, (x,), registry=right).verify(x)


# -- signature checks ---------------------------------------------------------------


def gelu_wrong_attr_name(self, approx: str = "none"):
    return op18.Relu(self)


def gelu_unannotated(self, approximate="none"):
    return op18.Relu(self)


def add_extra(self, other, alpha: float = 1.0, *, extra: int):
    return op18.Add(self, other)


def add_missing_required(self):
    return op18.Relu(self)


def add_attr_for_tensor(self, other: int):
    return op18.Add(self, other)


@pytest.mark.parametrize(
    ("op", "fn", "message"),
    [
        ("aten::gelu", gelu_wrong_attr_name, "attribute 'approx' is in the place of argument 'approximate'"),
        ("aten::gelu", gelu_unannotated, "has no type annotation"),
        ("aten::add.Tensor", add_extra, r"parameters the op does not have \(extra\)"),
        ("aten::add.Tensor", add_missing_required, "required argument.*other"),
        ("aten::add.Tensor", add_attr_for_tensor, "annotated as an attribute"),
    ],
)
def test_signature_mismatch_names_op_schema_and_function(op, fn, message):
    with pytest.raises(SignatureMismatchError, match=message) as info:
        opreg.Registry().register(op, fn)
    text = str(info.value)
    assert fn.__name__ in text  # the function's signature
    assert "The op's schema is aten::" in text  # the expected schema


def sum_annotated(self: ir.Value, dim: Sequence[int] | None, keepdim: bool = False, dtype: int | None = None):
    return op18.ReduceSum(self, dim, keepdims=int(keepdim))


def index_annotated(self: ir.Value, indices: Sequence[ir.Value | None]):
    return op18.Identity(self)


def sum_unannotated(self, dim, keepdim: bool = False):
    return op18.ReduceSum(self, dim, keepdims=int(keepdim))


def relu_unresolvable(self: NoSuchType):  # noqa: F821 - the name is the point
    return op18.Relu(self)


def test_string_annotations_are_read_as_the_types_they_name():
    """This module's `from __future__ import annotations` makes every annotation a string."""
    params = {p.name: p for p in opreg.Registry().register("aten::sum.dim_IntList", sum_annotated).params.params}
    assert params["dim"].attribute and params["dtype"].attribute and params["keepdim"].attribute
    assert params["self"].annotated and not params["self"].attribute
    index = opreg.Registry().register("aten::index.Tensor", index_annotated)
    assert [p.attribute for p in index.params.params] == [False, False]


def test_a_missing_annotation_is_named_after_the_schema_type():
    with pytest.raises(SignatureMismatchError, match=r"`dim: Sequence\[int\] \| None`"):
        opreg.Registry().register("aten::sum.dim_IntList", sum_unannotated)


def test_annotations_that_cannot_be_evaluated_are_rejected():
    with pytest.raises(RegistrationError, match="annotations cannot be evaluated.*NoSuchType"):
        opreg.Registry().register("aten::relu", relu_unresolvable)


def test_trailing_defaulted_arguments_may_be_left_out():
    def sdpa(query, key, value):
        return op18.MatMul(query, key)

    impl = opreg.Registry().register("aten::scaled_dot_product_attention", sdpa)
    assert impl.schema_checked


def full_like_placed_anywhere(self: Tensor, fill_value: float, dtype: int | None = None):
    return op18.Expand(op18.Cast(fill_value, to=self.dtype if dtype is None else dtype), op18.Shape(self))


def full_like_untyped(self: Tensor, fill_value: float):
    return full_like_placed_anywhere(self, fill_value)


def test_an_impl_without_the_placement_arguments_covers_nodes_that_give_them():
    """``layout``, ``device``, ``pin_memory`` and ``memory_format`` say where a result is stored, not
    what it holds (torch's schemas type layout and memory format as ``int?``): an impl with no
    parameter for them covers nodes that pass them. One without a parameter for an argument that
    changes the values covers only the nodes that leave it at its default, and says so."""
    from tests.optest import Lambda

    registry = opreg.Registry()
    registry.register("aten::full_like", full_like_placed_anywhere)
    x = torch.randn(3)
    placed = Lambda(lambda x: torch.full_like(x, 2.0, layout=torch.strided, memory_format=torch.contiguous_format))
    opreg.export(placed, (x,), registry=registry).verify(x)

    registry = opreg.Registry()
    registry.register("aten::full_like", full_like_untyped)
    typed = Lambda(lambda x: torch.full_like(x, 2, dtype=torch.int64))
    with pytest.raises(opreg.UnsupportedOpsError, match="no parameter for argument dtype=torch.int64"):
        opreg.export(typed, (x,), registry=registry)


def test_partials_and_traced_functions_are_checked_by_their_real_signature():
    import functools

    from onnxscript.values import TracedOnnxFunction

    def add_with_flag(self, other, alpha: float = 1.0, *, flag: bool):
        return op18.Add(self, other)

    assert opreg.Registry().register("aten::add.Tensor", functools.partial(add_with_flag, flag=True)).schema_checked
    traced = TracedOnnxFunction(op18, gelu_wrong_attr_name)
    with pytest.raises(SignatureMismatchError, match="'approx' is in the place of argument 'approximate'"):
        opreg.Registry().register("aten::gelu", traced)


def test_unknown_aten_op_and_overload_are_typos():
    with pytest.raises(RegistrationError, match="torch has no op aten::gelo.*Did you mean aten::gelu"):
        opreg.Registry().register("aten::gelo", relu18)
    with pytest.raises(RegistrationError, match="no overload 'Tensr'.*Tensor"):
        opreg.Registry().register("aten::add.Tensr", custom_aten_add)


# -- lints ------------------------------------------------------------------------


def test_script_function_without_domain_is_rejected():
    @onnxscript.script()
    def no_domain(x):
        return opset18.Relu(x)

    with pytest.raises(RegistrationError, match=r"no explicit domain.*'this'.*Opset\('your.domain', 1\)"):
        opreg.Registry().register("aten::relu", no_domain)


def test_custom_domain_without_declared_version_is_rejected():
    def gelu_undeclared(self, approximate: str = "none"):
        return custom_ort.Gelu(self)

    with pytest.raises(RegistrationError, match=r"emits com.microsoft ops but declares no version.*'com.microsoft': 1"):
        opreg.Registry().register("aten::gelu", gelu_undeclared, domains={})
    # Declared, or left to inference, it is fine.
    assert opreg.Registry().register("aten::gelu", gelu_undeclared, domains={"com.microsoft": 1})
    assert opreg.Registry().register("aten::gelu", gelu_undeclared).requirement.domains


def test_opset_with_no_version_is_rejected():
    unversioned = onnxscript.values.Opset("my.domain", None)

    def relu_unversioned(self):
        return unversioned.MyRelu(self)

    with pytest.raises(RegistrationError, match="Opset with no version"):
        opreg.Registry().register("aten::relu", relu_unversioned)


def test_declared_opset_must_cover_the_opset_module_used():
    with pytest.raises(RegistrationError, match="uses ai.onnx opset 20 but declares ai.onnx>=18"):
        opreg.Registry().register("aten::gelu", gelu20, opset=18)
    assert opreg.Registry().register("aten::gelu", gelu20).requirement.onnx.min == 20


def test_unannotated_attribute_without_schema_is_rejected():
    def thing(x, alpha=1.0):
        return op18.Relu(x)

    with pytest.raises(RegistrationError, match="alpha.*no type annotation"):
        opreg.Registry().register("nosuchlib::thing", thing)


# -- resolution -----------------------------------------------------------------------


def registry_of(*impls):
    return opreg.Registry.build(impls).copy()


def test_newest_requirement_wins_and_target_is_never_exceeded():
    old = pack_impl("aten::gelu", gelu18, opset=18)
    new = pack_impl("aten::gelu", gelu20, opset=20)
    registry = registry_of(old, new)
    assert registry.resolve("aten::gelu", 18).name == old.name
    assert registry.resolve("aten::gelu", 19).requirement.onnx.min == 18
    assert registry.resolve("aten::gelu", 20).requirement.onnx.min == 20


def test_priority_beats_newer_requirement_and_override_beats_priority():
    low = pack_impl("aten::relu", relu18, opset=18, priority=5, pack="a")
    high_new = pack_impl("aten::relu", relu18_b, opset=20, pack="b")
    registry = registry_of(low, high_new)
    assert registry.resolve("aten::relu", 23).pack == "a"
    override = registry.register("aten::relu", relu18)
    assert registry.resolve("aten::relu", 23) is override
    assert override.pack == USER_PACK
    assert "registered by the user" in str(registry.explain("aten::relu", 23))


def test_max_version_is_honoured():
    capped = pack_impl("aten::relu", relu18, opset=(18, 19))
    registry = registry_of(capped)
    assert registry.resolve("aten::relu", 19) is not None
    assert registry.resolve("aten::relu", 20) is None
    row = registry.explain("aten::relu", 20).candidates[0]
    assert row.status == "dropped" and "needs ai.onnx18..19, target has 20" in row.reason


def test_ties_are_conflicts_broken_deterministically():
    a = pack_impl("aten::relu", relu18, pack="zeta")
    b = pack_impl("aten::relu", relu18_b, pack="alpha")
    for order in ((a, b), (b, a)):
        registry = registry_of(*order)
        assert registry.resolve("aten::relu", 18).pack == "alpha"
        explanation = registry.explain("aten::relu", 18)
        assert [i.pack for i in explanation.conflicts] == ["zeta"]
        (conflict,) = registry.conflicts(18)
        assert [i.pack for i in conflict.impls] == ["alpha", "zeta"]


def test_predicates_are_tried_first_and_need_a_node():
    only_float = pack_impl("aten::relu", relu18_b, predicate=lambda node: node == "float")
    general = pack_impl("aten::relu", relu18)
    registry = registry_of(general, only_float)
    assert registry.resolve("aten::relu", 18, node="float") is registry.impls("aten::relu")[1]
    assert registry.resolve("aten::relu", 18, node="int").name == "relu18"
    assert registry.resolve("aten::relu", 18).name == "relu18"  # no node: predicates cannot be shown to apply
    statuses = {c.impl.name: c.status for c in registry.explain("aten::relu", 18).candidates}
    assert statuses == {"relu18_b": "conditional", "relu18": "chosen"}
    assert registry.conflicts(18) == []


def test_a_raising_predicate_means_not_covered():
    def broken(node):
        raise RuntimeError("boom")

    registry = registry_of(pack_impl("aten::relu", relu18, predicate=broken))
    assert registry.resolve("aten::relu", 18, node=object()) is None


def test_get_explains_what_is_missing():
    registry = registry_of(pack_impl("aten::gelu", gelu20, opset=20))
    with pytest.raises(NoImplementationError, match="needs ai.onnx>=20, target has 18"):
        registry.get("aten::gelu", 18)


def test_shared_registries_are_frozen_and_copies_are_independent():
    registry = registry_of(pack_impl("aten::relu", relu18)).freeze()
    with pytest.raises(FrozenRegistryError, match=r"call .copy\(\)"):
        registry.register("aten::relu", relu18)
    copy = registry.copy()
    copy.register("aten::relu", relu18_b)
    assert len(copy.impls("aten::relu")) == 2 and len(registry.impls("aten::relu")) == 1
    assert copy.resolve("aten::relu", 18).name == "relu18_b"


def test_profiles_are_unique():
    registry = opreg.Registry()
    registry.add_profile("mine", {"": 20, "my.domain": 2})
    assert registry.target("mine").as_dict() == {"": 20, "my.domain": 2}
    with pytest.raises(opreg.InvalidTargetError, match="already defined"):
        registry.add_profile("onnx", {"": 18})


def test_same_pack_and_name_tie_is_broken_by_requirement_not_order():
    # Found by hypothesis: equal rank (one custom domain at version 1 each), same pack and name.
    via_ms = pack_impl("aten::relu", relu18, pack="a", domains={"com.microsoft": 1})
    via_test = pack_impl("aten::relu", relu18, pack="a", domains={"test.customop": 1})
    target = {"": 18, "com.microsoft": 1, "test.customop": 1}
    chosen = {
        str(registry_of(*order).resolve("aten::relu", target).requirement)
        for order in [(via_ms, via_test), (via_test, via_ms)]
    }
    assert len(chosen) == 1


# -- impl metadata on the def: @opreg.impl and Registrar.register_module --------------------------

DIALECT_MODULE = """
import onnxscript
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset20 as op20

import opreg

from other_module import imported_impl  # registered with its own module, not this one


@opreg.impl("aten::gelu")
def aten_gelu(self, approximate: str = "none"):
    return op18.Mul(self, op18.Sigmoid(op18.Mul(self, op18.CastLike(1.702, self))))


@opreg.impl("aten::gelu", opset=20, priority=1)
def aten_gelu_opset20(self, approximate: str = "none"):
    return op20.Gelu(self, approximate=approximate)


@opreg.impl("aten::relu")
@opreg.impl("aten::relu6", predicate=lambda node: True)
def aten_relu_like(self):
    return op18.Relu(self)


@opreg.impl("aten::abs")
@onnxscript.script(onnxscript.values.Opset("dialect.ops", 1))
def aten_abs(self):
    return op18.Abs(self)


def helper(x):  # not marked: not an impl
    return x
"""


def test_register_module_registers_every_marked_function_in_definition_order(tmp_path, monkeypatch):
    (tmp_path / "other_module.py").write_text(
        "import opreg\nfrom onnxscript.onnx_opset import opset18 as op18\n\n"
        "@opreg.impl('aten::neg')\ndef imported_impl(self):\n    return op18.Neg(self)\n"
    )
    (tmp_path / "dialect_pack_ops.py").write_text(DIALECT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import dialect_pack_ops

    registrar = opreg.Registrar("dialect")
    impls = registrar.register_module(dialect_pack_ops)
    assert [(str(i.op), i.name, i.priority, i.predicate is not None) for i in impls] == [
        ("aten::gelu.default", "aten_gelu", 0, False),
        ("aten::gelu.default", "aten_gelu_opset20", 1, False),
        ("aten::relu.default", "aten_relu_like", 0, False),  # stacked marks register top to bottom
        ("aten::relu6.default", "aten_relu_like", 0, True),
        ("aten::abs.default", "aten_abs", 0, False),
    ]
    assert impls[1].requirement.onnx.min == 20 and registrar.rejected == []
    assert dialect_pack_ops.aten_gelu.__opreg_impls__ == (opreg.ImplSpec("aten::gelu"),)  # metadata only


def test_a_bad_impl_spec_is_refused_at_the_def():
    with pytest.raises(RegistrationError, match="priority must be an int"):
        opreg.impl("aten::relu", priority="high")


def test_one_body_for_several_opsets_is_told_its_version():
    """A function with a keyword-only ``opset`` is an impl per mark, each passed the version it is
    registered at; without a declared opset there is no version to pass."""

    def aten_gelu_versioned(self, approximate: str = "none", *, opset: int):
        return op18.Identity(self) if opset < 20 else op20.Gelu(self, approximate=approximate)

    registry = opreg.Registry()
    old = registry.register("aten::gelu", aten_gelu_versioned, opset=18)  # uses op20 too: the body branches
    new = registry.register("aten::gelu", aten_gelu_versioned, opset=20)
    assert (old.keywords, new.keywords) == ({"opset": 18}, {"opset": 20})
    assert [p.name for p in old.params.params] == ["self", "approximate"]  # not a node argument
    assert registry.resolve("aten::gelu", 19) is old and registry.resolve("aten::gelu", 21) is new
    with pytest.raises(RegistrationError, match=r"takes the opset it is registered at .* opset=N"):
        registry.register("aten::gelu", aten_gelu_versioned)


def test_the_registry_is_data_impls_profiles_preferences_and_unsupported_compare_and_hash():
    """Issue 25: two registries built from the same packs hold equal data; changing one changes it."""
    built, again = opreg.build_registry(), opreg.build_registry()
    assert built is not again and built.impls()[0] is not again.impls()[0]
    assert built.data() == again.data() and hash(built.data()) == hash(again.data())
    assert set(built.impls()) == set(again.impls()) and len(set(built.impls())) == len(built)
    assert built.explain("aten::gelu", "onnxruntime") == again.explain("aten::gelu", "onnxruntime")
    preferred = opreg.build_registry(prefer={"aten::gelu": "ort_contrib"}).data()
    assert preferred != built.data() and preferred.preferences == ((opreg.OpName.of("aten::gelu"), "ort_contrib"),)
    copy = built.copy()
    assert copy.data() == built.data()
    copy.mark_unsupported("aten::frobnicate", "no such op")
    assert copy.data() != built.data() and copy.data().unsupported[-1][1:] == ("<user>", "no such op")
    other = built.copy()
    other.add_profile("mine", {"": 18})
    assert other.data() != built.data() and other.data().profiles[-1] == ("mine", (("", 18),), "<user>")
    impl = built.impls("aten::gelu")[0]
    assert dataclasses.replace(impl, priority=impl.priority + 1) != impl
    assert dataclasses.replace(impl, params=None) == impl  # read from the function, not compared


def test_the_host_and_the_registry_read_the_same_pack_reports():
    """A host's PackSet and its registry's PackReports read the reports alike (ReportSequence):
    in load order, by index and by name, and an unknown pack is a KeyError."""
    loaded = opreg.packs.plugins.build()
    packs, reports = loaded.host.packs, loaded.registry.packs
    assert len(packs) == len(reports) == len(reports.reports) >= 2
    for index, report in enumerate(reports.reports):
        assert packs[index] is reports[index] is report
        assert packs.report(report.name) is reports.report(report.name) is report
    assert list(packs) == list(reports) == list(reports.reports)
    for sequence in (packs, reports):
        with pytest.raises(KeyError, match="no_such_pack"):
            sequence.report("no_such_pack")


def test_a_built_registry_is_a_value_beside_its_plugin_host():
    """Issue 40: a frozen registry compares and hashes by its data, which its host (the packs' live code)
    is no part of; it calls no hook itself, and only a frozen registry hashes."""
    loaded, again = opreg.packs.plugins.build(), opreg.packs.plugins.build()
    built = loaded.registry
    assert built == again.registry and hash(built) == hash(again.registry) and len({built, again.registry}) == 1
    assert loaded.host is not again.host and list(loaded.host.packs) == list(built.packs)  # the host: its own object
    assert isinstance(loaded.host, opreg.PackHost) and not hasattr(built, "call_hook") and not hasattr(built, "host")
    assert loaded.host.functions() and any(
        pack == "ort_contrib" for pack, _ in loaded.host.rewrite_rules(built.target())
    )
    with pytest.raises(opreg.FrozenRegistryError):
        built.host = opreg.PackHost()  # a frozen registry takes no attribute
    copy = built.copy()
    assert copy == built and copy.packs == built.packs
    with pytest.raises(TypeError, match="unfrozen"):
        hash(copy)
    copy.mark_unsupported("aten::frobnicate", "no such op")
    assert copy != built and copy.freeze() != built and hash(copy) != hash(built)
    assert hash(copy) == hash(copy)  # its data was taken once, at freeze
    preferred = opreg.build_registry(prefer={"aten::gelu": "ort_contrib"})
    assert preferred != built
    assert opreg.Registry().freeze() == opreg.Registry().freeze() != built


def _reachable(root: object) -> list[object]:
    """Every object reachable from ``root`` through ``gc.get_referents``, ``root`` included (modules,
    classes and functions are not followed: they are shared code, not the registry's state)."""
    import gc
    import types

    seen, stack, found = set(), [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type, types.FunctionType, types.CodeType)):
            continue
        seen.add(id(obj))
        found.append(obj)
        stack.extend(gc.get_referents(obj))
    return found


def test_a_default_registry_holds_no_host_and_never_changes():
    """Issue 40: the registry is a value: nothing reachable from the default registry is a plugin host, a
    pack set or a pluggy object, resolving leaves its state as it was (the memo lives beside it), and a
    frozen registry takes no attribute."""
    import pluggy

    from opreg.packs.packset import PackSet

    registry = opreg.default_registry()
    assert opreg.packs.plugins.load().registry is registry and opreg.packs.plugins.load().host is opreg.default_host()
    live = (opreg.PackHost, PackSet, pluggy.PluginManager, pluggy.HookRelay, pluggy.HookCaller)
    reachable = _reachable(registry)
    assert len(reachable) > len(registry)  # the walk reaches the impls
    assert not [type(o).__name__ for o in reachable if isinstance(o, live)]
    state = {name: (value, len(value) if hasattr(value, "__len__") else None) for name, value in vars(registry).items()}
    before = hash(registry)
    for target in ("onnx", "onnxruntime", 18):
        for op in registry.ops():
            registry.resolve(op, target)
    after = {name: (value, len(value) if hasattr(value, "__len__") else None) for name, value in vars(registry).items()}
    assert after == state and hash(registry) == before
    for name in ("host", "_impls", "_frozen", "anything"):
        with pytest.raises(opreg.FrozenRegistryError, match="cannot be set"):
            setattr(registry, name, None)
    with pytest.raises(TypeError):
        registry._impls[opreg.OpName.of("aten::relu.default")] = ()  # its tables are read-only too
