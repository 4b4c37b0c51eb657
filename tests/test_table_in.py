"""Translation tables in: what libraries ship for torch.onnx.export(custom_translation_table=...)
works in opreg unchanged, as an installed pack or through pack_from_translation_table."""

from __future__ import annotations

import importlib
import textwrap

import numpy as np
import pytest
import torch

import opreg
import opreg.registry.table_in
from opreg.packs.plugins import build_registry
from tests.test_cli import run

LIBRARY = textwrap.dedent(
    '''
    """A library that ships its own ONNX export for torch.onnx, as torchvision does: custom
    torch ops (with fake impls) and a custom_translation_table. Nothing here knows opreg."""
    import onnxscript
    import torch
    from onnxscript import FLOAT, INT64
    from onnxscript.onnx_opset import opset18 as op18

    if not hasattr(torch.ops.opreg_tables, "clip_boxes"):  # each test imports this module anew
        torch.library.define("opreg_tables::clip_boxes", "(Tensor boxes, SymInt height, SymInt width) -> Tensor")
        torch.library.define("opreg_tables::scaled_add", "(Tensor x, Tensor y, float alpha=1.0) -> Tensor")
        torch.library.define("opreg_tables::minmax", "(Tensor x, int dim) -> (Tensor, Tensor)")
        torch.library.define("opreg_tables::double", "(Tensor x) -> Tensor")
        torch.library.define("opreg_tables::bias_gelu", "(Tensor x, Tensor bias) -> Tensor")

        @torch.library.impl("opreg_tables::clip_boxes", "CompositeExplicitAutograd")
        def _clip_boxes(boxes, height, width):
            limits = torch.tensor([width, height, width, height], dtype=boxes.dtype)
            return torch.minimum(boxes, limits).clamp(min=0)

        @torch.library.impl("opreg_tables::scaled_add", "CompositeExplicitAutograd")
        def _scaled_add(x, y, alpha=1.0):
            return x + alpha * y

        @torch.library.impl("opreg_tables::minmax", "CompositeExplicitAutograd")
        def _minmax(x, dim):
            return x.amin(dim), x.amax(dim)

        @torch.library.impl("opreg_tables::double", "CompositeExplicitAutograd")
        def _double(x):
            return x * 2

        @torch.library.impl("opreg_tables::bias_gelu", "CompositeExplicitAutograd")
        def _bias_gelu(x, bias):
            return torch.nn.functional.gelu(x + bias)

        for name in ("clip_boxes", "scaled_add", "double", "bias_gelu"):
            torch.library.register_fake(f"opreg_tables::{name}", lambda x, *rest, **kw: torch.empty_like(x))

        @torch.library.register_fake("opreg_tables::minmax")
        def _(x, dim):
            shape = [s for i, s in enumerate(x.shape) if i != dim % x.dim()]
            return x.new_empty(shape), x.new_empty(shape)


    def clip_boxes(boxes, height, width):  # trace-only, attributes unannotated: torch.onnx calls it as is
        limits = op18.CastLike([width, height, width, height], boxes)
        return op18.Max(op18.Min(boxes, limits), op18.CastLike(0, boxes))


    functions = onnxscript.values.Opset("opreg_tables.functions", 1)


    @onnxscript.script(functions)  # the tutorials' way: a script function in a domain of its own
    def scaled_add(x, y, alpha: float = 1.0) -> FLOAT:
        return op18.Add(x, op18.Mul(y, op18.CastLike(alpha, y)))


    def minmax(x, dim: int):  # two outputs
        return op18.ReduceMin(x, [dim], keepdims=0), op18.ReduceMax(x, [dim], keepdims=0)


    def double_float(x: FLOAT):
        return op18.Mul(x, op18.CastLike(2.0, x))


    def double_int(x: INT64):
        return op18.Add(x, x)


    TABLE = {
        torch.ops.opreg_tables.clip_boxes: clip_boxes,  # an op packet: its overloads
        torch.ops.opreg_tables.scaled_add.default: scaled_add,
        torch.ops.opreg_tables.minmax.default: minmax,
        torch.ops.opreg_tables.double.default: [double_float, double_int],  # torch 2.6-2.7 took lists
    }
    '''
)

CUSTOM_DOMAIN = textwrap.dedent(
    '''
    """A pack module around a table whose function emits a custom-domain op, with the op's
    schema (torch.onnx needs one too) and a reference kernel, so models verify without a
    native runtime."""
    import math

    import numpy as np
    import onnx.defs
    import onnxscript
    import torch
    from onnx.reference.op_run import OpRun

    from {library} import *  # noqa: F403 - the library's ops and functions

    ops = onnxscript.values.Opset("opreg_tables.ops", 1)


    def bias_gelu(x, bias):
        return ops.BiasGelu(x, bias)


    OPREG_TRANSLATION_TABLE = {{torch.ops.opreg_tables.bias_gelu.default: bias_gelu}}


    class BiasGelu(OpRun):
        op_domain = "opreg_tables.ops"

        def _run(self, x, bias):
            y = x + bias
            erf = np.vectorize(math.erf)(y / math.sqrt(2))
            return ((0.5 * y * (1 + erf)).astype(x.dtype),)


    @opreg.hookimpl
    def opreg_reference_kernels():
        return [BiasGelu]


    @opreg.hookimpl
    def opreg_schemas():
        floats = ["tensor(float)", "tensor(double)"]
        parameter = onnx.defs.OpSchema.FormalParameter
        return [
            onnx.defs.OpSchema(
                "BiasGelu", "opreg_tables.ops", 1, "gelu(x + bias)",
                inputs=[parameter("X", "T"), parameter("bias", "T")], outputs=[parameter("Y", "T")],
                type_constraints=[("T", floats, "")],
            )
        ]
    '''
)


class Boxes(torch.nn.Module):
    """Uses every op of the library's table."""

    def forward(self, boxes, x, y, n):
        ops = torch.ops.opreg_tables
        low, high = ops.minmax(x, 1)
        return ops.clip_boxes(boxes, 20, 30), ops.scaled_add(x, y, 0.5), low, high, ops.double(x), ops.double(n)


def _inputs():
    torch.manual_seed(0)
    boxes = torch.tensor([[-3.0, 4.0, 40.0, 25.0], [5.0, -1.0, 12.0, 8.0]])
    return boxes, torch.randn(2, 3), torch.randn(2, 3), torch.arange(6).reshape(2, 3)


@pytest.fixture
def library(make_pack):
    """The library installed as a pack whose entry point names its table (``module:TABLE``)."""
    module = make_pack("tables", LIBRARY, header="", dist="opreg-tables-lib", attr="TABLE")
    importlib.import_module(module)  # a user imports the library: its torch ops exist
    return module


def test_an_installed_table_is_a_pack(library):
    registry = build_registry()
    report = registry.packs.report("tables")
    assert (report.status, report.impls, report.rejected) == ("loaded", 4, ())
    assert report.distribution == "opreg-tables-lib"
    assert report.profiles == ()  # its functions emit ai.onnx only (a kept script function's domain is free)
    impl = registry.resolve("opreg_tables::clip_boxes", 18)
    assert (impl.pack, impl.name, impl.convention, str(impl.requirement)) == (
        "tables", "clip_boxes", "torch.onnx", "ai.onnx>=18",
    )  # fmt: skip


@pytest.mark.parametrize("target", [18, "onnx"])
def test_models_using_an_installed_table_export_and_verify(library, target):
    args = _inputs()
    program = opreg.export(Boxes(), args, target=target, inline=False)
    nodes = [(n.domain, n.op_type) for n in program.model_proto.graph.node]
    assert ("opreg_tables.functions", "scaled_add") in nodes  # the script function, kept as a function
    assert {"Min", "Max", "ReduceMin", "ReduceMax"} <= {t for _, t in nodes}
    assert ("", "Add") in nodes and ("", "Mul") in nodes  # double: the list's INT64 function, then its FLOAT one
    imports = {o.domain: o.version for o in program.model_proto.opset_import}
    assert imports["opreg_tables.functions"] == 1
    packs = {p.value for n in program.model_proto.graph.node for p in n.metadata_props if p.key == "opreg.pack"}
    assert "tables" in packs
    program.verify(*args)


def test_an_installed_table_goes_back_out_to_torch_onnx(library):
    """Both directions on a table opreg did not write: in as a pack, out as a table torch.onnx takes."""
    import warnings

    import onnxruntime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = build_registry().translation_table(18)
        args = _inputs()
        program = torch.onnx.export(
            Boxes(), args, dynamo=True, custom_translation_table=table, opset_version=18, verbose=False
        )
    assert table.impls["opreg_tables::clip_boxes.default"].pack == "tables"
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)})
    for value, expected in zip(got, Boxes()(*args), strict=True):
        np.testing.assert_allclose(value, expected.numpy(), rtol=1e-5, atol=1e-6)


def test_a_list_calls_the_first_function_whose_annotations_accept_the_inputs(library):
    class Double(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opreg_tables.double(x)

    for value, op_type in ((torch.randn(3), "Mul"), (torch.arange(3), "Add")):
        program = opreg.export(Double(), (value,))
        assert [n.op_type for n in program.model_proto.graph.node] == [op_type]
        program.verify(value)


def test_a_pack_module_may_define_a_table_and_ship_kernels(make_pack, library):
    module = make_pack("tables_ops", CUSTOM_DOMAIN.format(library=library))
    registry = build_registry()
    report = registry.packs.report("tables_ops")
    assert (report.status, report.impls, report.domains) == ("loaded", 1, ("ai.onnx", "opreg_tables.ops"))
    assert module

    class BiasGelu(torch.nn.Module):
        def forward(self, x, bias):
            return torch.ops.opreg_tables.bias_gelu(x, bias) * 2

    x, bias = torch.randn(2, 3), torch.randn(3)
    program = opreg.export(BiasGelu(), (x, bias), target="onnx,opreg_tables.ops=1")
    first = program.model_proto.graph.node[0]
    assert (first.domain, first.op_type) == ("opreg_tables.ops", "BiasGelu")
    result = program.verify(x, bias)
    assert result.runtime == "reference"


def test_pack_from_translation_table_returns_an_unfrozen_copy(library):
    table = importlib.import_module(library).TABLE
    registry = opreg.pack_from_translation_table("mylib", table)
    assert not registry.frozen and opreg.default_registry().frozen
    assert {str(i.op) for i in registry.impls() if i.pack == "mylib"} == {
        "opreg_tables::clip_boxes.default",
        "opreg_tables::scaled_add.default",
        "opreg_tables::minmax.default",
        "opreg_tables::double.default",
    }
    assert "mylib" not in registry.profiles  # no custom domain to add to a profile
    args = _inputs()
    opreg.export(Boxes(), args, registry=registry).verify(*args)


def test_pack_from_translation_table_prefers_the_table_on_ties_with_core():
    from onnxscript.onnx_opset import opset18 as op18

    def relu_as_max(self):
        return op18.Max(self, op18.CastLike(0.0, self))

    registry = opreg.pack_from_translation_table("mine", {torch.ops.aten.relu.default: relu_as_max})
    assert registry.resolve("aten::relu", 18).pack == "mine"
    assert opreg.default_registry().resolve("aten::relu", 18).pack == "core"
    program = opreg.export(torch.nn.ReLU(), (torch.randn(4),), registry=registry)
    assert [n.op_type for n in program.model_proto.graph.node] == ["Max"]


def _anything(*args, **kwargs):  # only resolved, never called
    return None


def _core_table() -> tuple[list[opreg.OpName], dict]:
    """Every op the core pack implements, as a table mapping it to one function."""
    import torch.ao.quantization.fx._decomposed  # defines the quantized_decomposed ops the core pack covers

    ops = sorted({i.op for i in opreg.default_registry().impls() if i.pack == "core"}, key=str)
    table = {}
    for op in ops:
        namespace, _, rest = str(op).partition("::")
        name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace), name)
        table[getattr(packet, overload)] = _anything
    return ops, table


@pytest.mark.parametrize("target", [18, opreg.newest_supported_opset()], ids=["lowest", "newest"])
def test_a_tables_impls_win_over_core_for_every_op_they_cover(target):
    """The README's promise: at the default priority the table's function goes before every core
    impl of the same or an older opset (conditional ones too); with priority=1, before all."""
    ops, table = _core_table()
    assert len(ops) > 300
    for priority in (0, 1):
        registry = opreg.pack_from_translation_table("mine", table, opsets={"": 18}, priority=priority)
        for op in ops:
            ordered = [i for i in registry.candidates(op, target) if not i.complex]  # complex nodes stay with theirs
            mine = next(i for i in ordered if i.pack == "mine")
            ahead = ordered[: ordered.index(mine)]
            assert all(i.requirement.onnx.min > 18 for i in ahead) and not (priority and ahead), (op, ahead)


def _conv2d_as_table(input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    from onnxscript.onnx_opset import opset18 as op18

    pads = [*padding, *padding]
    return op18.Conv(input, weight, bias, strides=stride, pads=pads, dilations=dilation, group=groups)


def _gelu_as_table(self, approximate: str = "none"):
    from onnxscript.onnx_opset import opset18 as op18

    return op18.Mul(op18.Mul(self, 0.5), op18.Add(op18.Erf(op18.Div(self, 1.4142135623730951)), 1.0))


@pytest.mark.parametrize(
    ("op", "function", "model", "target", "priority"),
    [
        (torch.ops.aten.conv2d.default, _conv2d_as_table, torch.nn.Conv2d(2, 3, 3), 18, 0),  # core's is conditional
        (torch.ops.aten.gelu.default, _gelu_as_table, torch.nn.GELU(), 23, 1),  # core's Gelu needs ai.onnx 20
    ],
    ids=["conditional-core-impl", "newer-core-impl"],
)
def test_an_exported_model_uses_the_tables_function(op, function, model, target, priority):
    x = torch.randn(1, 2, 6, 6)
    registry = opreg.pack_from_translation_table("mine", {op: function}, priority=priority)
    program = opreg.export(model.eval(), (x,), registry=registry, target=target)
    packs = {p.value for n in program.model_proto.graph.node for p in n.metadata_props if p.key == "opreg.pack"}
    assert packs == {"mine"}
    program.verify(x)


def test_pack_from_translation_table_names_every_entry_it_cannot_take():
    def relu(self, extra):  # a parameter aten::relu does not have
        return self

    table = {torch.ops.aten.relu.default: relu, "not an op": relu, torch.ops.aten.gelu.default: 42}
    with pytest.raises(opreg.RegistrationError, match=r"3 entry\(ies\) of table 'bad'") as info:
        opreg.pack_from_translation_table("bad", table)
    message = str(info.value)
    assert "aten::relu.default (relu)" in message and "'not an op'" in message and "42" in message


def test_a_broken_table_pack_is_reported_and_the_others_load(make_pack, library):
    make_pack("badtable", "TABLE = {'aten::relu': 42}\n", header="", attr="TABLE")
    make_pack("notimportable", "raise ImportError('no such thing')\nTABLE = {}\n", header="", attr="TABLE")
    registry = build_registry()
    bad = registry.packs.report("badtable")
    assert bad.status == "failed" and "all 1 impl(s) rejected" in bad.reason
    broken = registry.packs.report("notimportable")
    assert broken.status == "failed" and "no such thing" in broken.reason
    assert registry.packs.report("tables").status == "loaded"


def test_tutorial_register_op_and_tables_take_one_path():
    """register_op of the tutorials' API and a table give the same impl: read from the
    function, checked and called as torch.onnx would."""
    from onnxscript.onnx_opset import opset18 as op18

    def aten_sum(self, dim, keepdim=False, dtype=-1):  # torch.onnx passes dtype=None as -1
        if dtype != -1:
            self = op18.Cast(self, to=dtype)
        return op18.ReduceSum(self, op18.Constant(value_ints=list(dim)), keepdims=int(keepdim))

    legacy = opreg.OnnxRegistry()
    by_tutorial = legacy.register_op(namespace="aten", op_name="sum", overload="dim_IntList", function=aten_sum)
    by_table = opreg.pack_from_translation_table("t", {torch.ops.aten.sum.dim_IntList: aten_sum})
    from_table = by_table.resolve("aten::sum.dim_IntList", 18)
    assert (by_tutorial.convention, by_tutorial.requirement) == (from_table.convention, from_table.requirement)

    class Sum(torch.nn.Module):
        def forward(self, x):
            return x.sum(1), x.sum(0, dtype=torch.float64)

    x = torch.randn(3, 4)
    program = opreg.dynamo_export(Sum(), x, export_options=opreg.ExportOptions(onnx_registry=legacy))
    assert [n.op_type for n in program.model_proto.graph.node].count("ReduceSum") == 2
    outputs = program.run(x)
    np.testing.assert_allclose(outputs[0].numpy(), x.sum(1).numpy(), rtol=1e-5)
    assert outputs[1].dtype == torch.float64


def test_a_script_function_in_onnxscripts_default_domain_is_taken(tmp_path, monkeypatch):
    source = textwrap.dedent(
        """
        import onnxscript
        from onnxscript import FLOAT
        from onnxscript.onnx_opset import opset18 as op18

        @onnxscript.script()
        def relu6(self) -> FLOAT:
            return op18.Clip(self, op18.CastLike(0.0, self), op18.CastLike(6.0, self))
        """
    )
    (tmp_path / "default_domain_fn.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    relu6 = importlib.import_module("default_domain_fn").relu6
    registry = opreg.pack_from_translation_table("six", {torch.ops.aten.relu6.default: relu6})
    impl = registry.resolve("aten::relu6", 18)
    assert impl.function.function_ir.domain == opreg.registry.table_in.FUNCTION_DOMAIN

    class Relu6(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.relu6(x)

    x = torch.randn(8) * 10
    program = opreg.export(Relu6(), (x,), registry=registry, inline=False)
    assert {f.domain for f in program.model_proto.functions} == {opreg.registry.table_in.FUNCTION_DOMAIN}
    program.verify(x)


MODEL_FILE = textwrap.dedent(
    """
    import torch
    import {library}  # the library defines its ops


    class Net(torch.nn.Module):
        def forward(self, boxes, x):
            low, high = torch.ops.opreg_tables.minmax(x, 0)
            return torch.ops.opreg_tables.clip_boxes(boxes, 10, 10), high - low


    def make():
        return Net(), (torch.rand(3, 4) * 20, torch.randn(3, 5))
    """
)


def test_opreg_check_counts_an_installed_tables_ops_as_covered(capsys, library, tmp_path):
    model_file = tmp_path / "boxes_model.py"
    model_file.write_text(MODEL_FILE.format(library=library))
    code, out, _ = run(capsys, "check", f"{model_file}:make")
    assert code == 0 and "every op" in out
    code, out, _ = run(capsys, "check", f"{model_file}:make", "-p", "no:tables", "--json")
    missing = {m["op"] for m in __import__("json").loads(out)["missing"]}
    assert code == 1 and missing == {"opreg_tables::clip_boxes.default", "opreg_tables::minmax.default"}
