"""Translation tables out: opreg's packs serve torch.onnx.export(dynamo=True) users, and the
limits of torch's custom_translation_table that docs/torch-onnx.md quotes are what torch does."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import onnxruntime
import onnxscript
import pytest
import torch
from onnxscript.onnx_opset import opset18 as op18

import opreg
import opreg.registry.table_out
import opreg.registry.targets
from opreg.registry.table_out import TranslationTable, TranslationTableWarning
from tests.models import Sequence, TutorialCNN

RELU_AS_MAX = """
from onnxscript.onnx_opset import opset18 as op18


def aten_relu_max(self):
    \"\"\"relu(Tensor self) -> Tensor: Max with 0.\"\"\"
    return op18.Max(self, op18.CastLike(0.0, self))


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::relu", aten_relu_max, opset=18, priority=1)
"""


def torch_export(model, args, table, **options):
    """torch.onnx.export(dynamo=True) with ``table``, quietly (torch reports its progress)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(model, args, dynamo=True, custom_translation_table=table, verbose=False, **options)


def run_ort(program, args):
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)})


def table_of(registry, target):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TranslationTableWarning)
        return registry.translation_table(target)


@pytest.mark.parametrize("target", [18, opreg.newest_supported_opset()])
def test_a_packs_standard_domain_override_is_what_torch_onnx_uses(make_pack, target):
    make_pack("relumax", RELU_AS_MAX)
    table = table_of(opreg.build_registry(), target)
    assert isinstance(table, TranslationTable) and table.opset_version == target
    assert table.impls["aten::relu.default"].label == "relumax:aten_relu_max"

    model, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.randn(3, 4)
    program = torch_export(model, (x,), table, opset_version=table.opset_version)
    ops = [(n.domain, n.op_type) for n in program.model_proto.graph.node]
    assert ("", "Max") in ops and ("", "Relu") not in ops
    assert {(o.domain, o.version) for o in program.model_proto.opset_import} == {("", target)}
    np.testing.assert_allclose(run_ort(program, (x,))[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_ort_contrib_serves_torch_onnx_at_the_onnxruntime_target():
    class Model(torch.nn.Module):
        def forward(self, x):
            inverse = torch.linalg.inv_ex(x).inverse  # torch.onnx alone has no translation of inv_ex
            return torch.nn.functional.gelu(inverse) + torch.nn.functional.gelu(x, approximate="tanh")

    table = table_of(opreg.default_registry(), "onnxruntime")
    assert table.target.get("com.microsoft") == 1
    # ORT's Gelu kernels are float32 only: a predicate says so, which torch.onnx cannot evaluate
    assert "aten_gelu_contrib has a predicate" in table.left_out["aten::gelu.default"]
    x = torch.randn(4, 4) + 4 * torch.eye(4)
    program = torch_export(Model(), (x,), table, opset_version=table.opset_version)
    ops = [(n.domain, n.op_type) for n in program.model_proto.graph.node]
    assert ("com.microsoft", "Inverse") in ops
    assert not {("com.microsoft", "Gelu"), ("com.microsoft", "FastGelu")} & set(ops)
    imports = {o.domain: o.version for o in program.model_proto.opset_import}
    assert imports == {"": table.opset_version, "com.microsoft": 1}
    np.testing.assert_allclose(run_ort(program, (x,))[0], Model()(x).numpy(), rtol=1e-4, atol=1e-5)

    with pytest.raises(Exception, match="(?s)linalg_inv_ex"):  # what the table adds to torch.onnx
        torch_export(Model(), (x,), None, opset_version=table.opset_version)


def test_above_what_torch_onnx_builds_the_impls_are_chosen_at_18():
    """Above onnxscript's version converter's newest opset, torch.onnx builds at 18 and converts
    with onnx's converter, which fails on newer ops: a Gelu of opset 20 would stay in an opset-18
    model that no runtime loads. The table chooses its impls at 18 and keeps the asked version."""
    newest = opreg.registry.table_out.torch_onnx_newest_opset()
    high = opreg.registry.targets.onnx_opset_range()[1]
    if high <= newest:
        pytest.skip(f"the installed onnxscript builds no ai.onnx above {newest}")
    table = table_of(opreg.default_registry(plugins=[]), high)
    assert table.opset_version == high and table.target.onnx == 18
    assert table.impls["aten::gelu.default"].label == "core:aten_gelu"
    model, x = torch.nn.GELU(), torch.randn(3)
    program = torch_export(model, (x,), table, opset_version=table.opset_version)
    assert {o.domain: o.version for o in program.model_proto.opset_import} == {"": high}
    np.testing.assert_allclose(run_ort(program, (x,))[0], model(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", [18, 23])
def test_the_core_pack_as_a_table_exports_real_models(target):
    """Every trace-only core impl in the table runs under torch.onnx's recorder as under opreg's."""
    table = table_of(opreg.default_registry(plugins=[]), target)
    called: collections.Counter[str] = collections.Counter()

    def counted(name, entry):
        def call(*args, **kwargs):
            called[name] += 1
            return entry(*args, **kwargs)

        return call

    counting = {op: counted(str(opreg.OpName.of(op)), entry) for op, entry in table.items()}
    batch = torch.export.Dim("batch")
    for model, x, dims in (
        (TutorialCNN().eval(), torch.randn(2, 1, 32, 32), {"x": {0: batch}}),
        (Sequence().eval(), torch.randn(2, 5, 8), {"x": {0: batch, 1: torch.export.Dim("seq")}}),
    ):
        program = torch_export(model, (x,), counting, opset_version=target, dynamic_shapes=dims)
        bigger = torch.randn(3, *x.shape[1:])
        np.testing.assert_allclose(run_ort(program, (bigger,))[0], model(bigger).detach().numpy(), rtol=1e-4, atol=1e-5)
    expected = {"aten::linear.default", "aten::max_pool2d.default", "aten::relu.default", "aten::gelu.default"}
    assert expected <= set(called)


def test_what_torch_onnx_cannot_take_is_left_out_with_one_warning():
    registry = opreg.default_registry().copy()
    custom = onnxscript.values.Opset("opreg.tests.noschema", 1)

    def gelu_noschema(self, approximate: str = "none"):
        return onnxscript.values.Op(custom, "Gelu")(self)

    @onnxscript.script(onnxscript.values.Opset("opreg.tests.fn", 1))
    def relu_script(self):  # no return annotation
        return op18.Relu(self)

    def hardtanh_where(self, min_val: float = -1.0, max_val: float = 1.0):
        return op18.Clip(self, op18.CastLike(min_val, self), op18.CastLike(max_val, self))

    registry.register("aten::gelu", gelu_noschema, domains={"opreg.tests.noschema": 1})
    registry.register("aten::relu", relu_script)
    registry.register("aten::hardtanh", hardtanh_where, predicate=lambda node: True)
    with pytest.warns(TranslationTableWarning) as caught:
        table = registry.translation_table("onnx,opreg.tests.noschema=1")
    assert len(caught) == 1
    message = str(caught[0].message)
    left = table.left_out
    assert "no schema" in left["aten::gelu.default"] and "SchemaError" in left["aten::gelu.default"]
    assert "return annotation" in left["aten::relu.default"]
    assert "predicate" in left["aten::hardtanh.default"] and "core:aten_hardtanh is in the table" in message
    assert torch.ops.aten.gelu.default not in table and torch.ops.aten.relu.default not in table
    assert table.impls["aten::hardtanh.default"].label == "core:aten_hardtanh"
    assert all(op in message for op in left)


# -- torch.onnx's own limits, as docs/torch-onnx.md quotes them ---------------------------------


class Gelu(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)


def gelu_trace(self, approximate: str = "none"):
    return op18.Mul(self, op18.Sigmoid(op18.Mul(self, op18.CastLike(1.702, self))))


def _chain(error: BaseException) -> str:
    text = []
    while error is not None:
        text.append(f"{type(error).__name__}: {error}")
        error = error.__cause__
    return "\n".join(text)


def test_torch_onnx_refuses_op_packets_and_lists():
    with pytest.raises(TypeError, match="should be provided as an OpOverload instead of an OpOverloadPacket"):
        torch_export(Gelu(), (torch.randn(3),), {torch.ops.aten.gelu: gelu_trace})
    with pytest.raises(TypeError, match="should be a single callable, not a sequence"):
        torch_export(Gelu(), (torch.randn(3),), {torch.ops.aten.gelu.default: [gelu_trace]})


def test_torch_onnx_needs_a_return_annotation_on_script_functions():
    @onnxscript.script(onnxscript.values.Opset("opreg.tests.fn", 1))
    def gelu_script(input_x, approximate: str = "none"):
        return op18.Mul(input_x, op18.Sigmoid(op18.Mul(input_x, 1.702)))

    with pytest.raises(Exception) as caught:
        torch_export(Gelu(), (torch.randn(3),), {torch.ops.aten.gelu.default: gelu_script})
    assert "The number of values and replacements must match." in _chain(caught.value)


def test_torch_onnx_needs_a_schema_for_custom_domain_ops():
    msft = onnxscript.values.Opset("opreg.tests.noschema", 1)

    def gelu_custom(self, approximate: str = "none"):
        return msft.Gelu(self)

    with pytest.raises(Exception) as caught:
        torch_export(Gelu(), (torch.randn(3),), {torch.ops.aten.gelu.default: gelu_custom})
    assert "No schema registered for 'Gelu' version '1' and domain 'opreg.tests.noschema'!" in _chain(caught.value)


def test_torch_onnx_ignores_string_keys_and_never_checks_opsets():
    program = torch_export(Gelu(), (torch.randn(3),), {"aten::gelu.default": gelu_trace}, opset_version=18)
    assert "Sigmoid" not in {n.op_type for n in program.model_proto.graph.node}  # torch's own gelu

    def gelu_opset20(self, approximate: str = "none"):
        from onnxscript.onnx_opset import opset20 as op20

        return op20.Gelu(self, approximate=approximate)

    program = torch_export(Gelu(), (torch.randn(3),), {torch.ops.aten.gelu.default: gelu_opset20}, opset_version=18)
    assert [n.op_type for n in program.model_proto.graph.node] == ["Gelu"]  # Gelu is ai.onnx 20 ...
    assert {o.version for o in program.model_proto.opset_import} == {18}  # ... in an ai.onnx 18 model
