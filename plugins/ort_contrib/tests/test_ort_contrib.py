"""opreg-ort-contrib: com.microsoft kernels when the target has the domain, standard ONNX otherwise."""

from __future__ import annotations

import onnx
import pytest
import torch

import opreg

GELU_KINDS = {"none": "Gelu", "tanh": "FastGelu"}


class GeluModel(torch.nn.Module):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.approximate = approximate

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x), approximate=self.approximate)


class InverseModel(torch.nn.Module):
    def forward(self, x):
        return torch.inverse(x) @ x.transpose(-1, -2)


def _nodes(program) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in program.model_proto.graph.node]


def _opsets(program) -> dict[str, int]:
    return {o.domain: o.version for o in program.model_proto.opset_import}


@pytest.mark.parametrize("approximate", sorted(GELU_KINDS))
def test_gelu_uses_contrib_kernel_on_onnxruntime(approximate):
    torch.manual_seed(0)
    model, x = GeluModel(approximate).eval(), torch.randn(4, 8)
    program = opreg.export(model, (x,), target="onnxruntime")
    assert ("com.microsoft", GELU_KINDS[approximate]) in _nodes(program)
    assert _opsets(program) == {"": opreg.newest_supported_opset(), "com.microsoft": 1}
    onnx.checker.check_model(program.model_proto, full_check=True)
    result = program.verify(x, atol=1e-5)
    assert result.runtime == "onnxruntime"


@pytest.mark.parametrize("approximate", sorted(GELU_KINDS))
def test_gelu_is_standard_onnx_on_the_onnx_target(approximate):
    model, x = GeluModel(approximate).eval(), torch.randn(4, 8)
    program = opreg.export(model, (x,), target="onnx")
    assert all(domain == "" for domain, _ in _nodes(program))
    assert "com.microsoft" not in _opsets(program)
    program.verify(x, atol=1e-5)


def test_inverse_maps_to_contrib_inverse():
    x = torch.randn(2, 4, 4) + 4 * torch.eye(4)
    program = opreg.export(InverseModel(), (x,), target="onnxruntime")
    assert ("com.microsoft", "Inverse") in _nodes(program)
    assert _opsets(program)["com.microsoft"] == 1
    onnx.checker.check_model(program.model_proto, full_check=True)
    program.verify(x, atol=1e-4)


def test_shape_inference_understands_the_contrib_ops():
    x = torch.randn(2, 4, 4) + 4 * torch.eye(4)
    proto = opreg.export(InverseModel(), (x,), target="onnxruntime").model_proto
    del proto.graph.value_info[:]  # forget what the exporter recorded; infer it again
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    inverse = next(n for n in inferred.graph.node if n.op_type == "Inverse")
    (info,) = [v for v in inferred.graph.value_info if v.name == inverse.output[0]]
    assert [d.dim_value for d in info.type.tensor_type.shape.dim] == [2, 4, 4]
    assert info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_inverse_without_the_contrib_domain_says_where_it_is_covered():
    x = torch.randn(3, 3) + 3 * torch.eye(3)
    with pytest.raises(opreg.UnsupportedOpsError) as caught:
        opreg.export(InverseModel(), (x,), target="onnx")
    (missing,) = [m for m in caught.value.missing if m.op == "aten::linalg_inv_ex.default"]
    assert any(e.startswith("ort_contrib:aten_linalg_inv_ex") for e in missing.elsewhere)


def test_conformance_kit(opreg_pack_check):
    opreg_pack_check("ort_contrib").assert_ok()
