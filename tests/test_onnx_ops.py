"""The ONNX ops torch users write inline (torch.onnx.ops) export through opreg's core pack."""

from __future__ import annotations

import pytest
import torch
import torch.onnx.ops

import opreg
from opreg.registry.targets import MIN_ONNX_OPSET

NEWEST = opreg.newest_supported_opset()


class Symbolic(torch.nn.Module):
    """A custom-domain node and a standard one with two outputs, among ordinary torch ops."""

    def forward(self, x):
        custom = torch.onnx.ops.symbolic(
            "opreg.tests.symbolic::Scale",
            (x, None, x),
            {"alpha": 0.5, "axes": [1, 2], "mode": "fast", "flag": True, "floats": [0.25, 0.5], "names": ["a"]},
            dtype=torch.float64,
            shape=x.shape,
            version=3,
            metadata_props={"origin": "inline"},
        )
        low, high = torch.onnx.ops.symbolic_multi_out(
            "Split", (x,), {"axis": 1, "num_outputs": 2}, dtypes=(x.dtype, x.dtype), shapes=((2, 2), (2, 2))
        )
        return custom, low * 2, high


def test_symbolic_nodes_are_emitted_as_described():
    program = opreg.export(Symbolic(), (torch.randn(2, 4),))
    model = program.model_proto
    (custom,) = [n for n in model.graph.node if n.domain == "opreg.tests.symbolic"]
    assert custom.op_type == "Scale" and list(custom.input)[1] == ""  # the None input keeps its place
    attributes = {a.name: onnx_value(a) for a in custom.attribute}
    assert attributes == {
        "alpha": 0.5, "axes": [1, 2], "mode": b"fast", "flag": 1, "floats": [0.25, 0.5], "names": [b"a"],
    }  # fmt: skip
    assert {p.key: p.value for p in custom.metadata_props}["origin"] == "inline"
    assert {p.key: p.value for p in custom.metadata_props}["opreg.impl"] == "onnx_symbolic_symbolic"
    imports = {o.domain: o.version for o in model.opset_import}
    assert imports == {"": MIN_ONNX_OPSET, "opreg.tests.symbolic": 3}  # the onnx profile is a ceiling
    (output,) = [o for o in model.graph.output if o.name == "output_0"]
    assert output.type.tensor_type.elem_type == 11  # DOUBLE, as declared
    split = [n for n in model.graph.node if n.op_type == "Split"]
    assert len(split) == 1 and len(split[0].output) == 2


def onnx_value(attribute):
    import onnx

    value = onnx.helper.get_attribute_value(attribute)
    return value if isinstance(value, (int, float, bytes)) else list(value)


@pytest.mark.parametrize("target", [18, NEWEST])
def test_symbolic_standard_ops_verify_against_eager(target):
    class Model(torch.nn.Module):
        def forward(self, x):
            if torch.onnx.is_in_onnx_export():  # the idiom torch.onnx.ops documents; true under opreg too
                y = torch.onnx.ops.symbolic("Softsign", (x,), dtype=x.dtype, shape=x.shape, version=18)
            else:
                y = torch.nn.functional.softsign(x)
            return y + 1

    x = torch.randn(3, 5)
    program = opreg.export(Model(), (x,), target=target)
    assert "Softsign" in [n.op_type for n in program.model_proto.graph.node]
    program.verify(x)


def test_a_symbolic_op_newer_than_the_target_is_refused():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.onnx.ops.symbolic("Gelu", (x,), dtype=x.dtype, shape=x.shape, version=20)

    with pytest.raises(opreg.OpsetConflictError, match="ai.onnx opset 20"):
        opreg.export(Model(), (torch.randn(3),), target=18)


class Rope(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, x, cos, sin, positions):
        return torch.onnx.ops.rotary_embedding(x, cos, sin, positions, **self.options)


ROPE = {
    "halves": ({}, (2, 3, 5, 8)),
    "interleaved": ({"interleaved": True}, (2, 3, 5, 8)),
    "3d": ({"num_heads": 3}, (2, 5, 24)),
    "partial": ({"rotary_embedding_dim": 4}, (2, 3, 5, 8)),
}


@pytest.mark.parametrize("target", [18, 22, 23, NEWEST])
@pytest.mark.parametrize("case", sorted(ROPE))
def test_rotary_embedding(case, target):
    options, shape = ROPE[case]
    torch.manual_seed(0)
    half = options.get("rotary_embedding_dim", 8) // 2
    x, cos, sin = torch.randn(*shape), torch.randn(10, half), torch.randn(10, half)
    positions = torch.randint(0, 10, (2, 5))
    program = opreg.export(Rope(**options), (x, cos, sin, positions), target=target)
    op_types = {n.op_type for n in program.model_proto.graph.node}
    assert ("RotaryEmbedding" in op_types) == (target >= 23)
    program.verify(x, cos, sin, positions)


class Attention(torch.nn.Module):
    def __init__(self, past: bool = False, **options):
        super().__init__()
        self.past = past
        self.options = options

    def forward(self, q, k, v, *extra):
        if self.past:  # no mask, a key/value cache
            return torch.onnx.ops.attention(q, k, v, None, *extra, **self.options)
        return torch.onnx.ops.attention(q, k, v, *extra, **self.options)


def _attention_inputs(case):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    if case == "gqa":
        return {}, (q, k[:, :2], v[:, :2])
    if case == "causal":
        return {"is_causal": True}, (q, k[:, :, :5], v[:, :, :5])
    if case == "bool_mask":
        return {}, (q, k, v, torch.rand(5, 6) > 0.3)
    if case == "float_mask_softcap":
        return {"softcap": 2.0, "qk_matmul_output_mode": 2}, (q, k, v, torch.randn(5, 6))
    if case == "3d":
        return {"q_num_heads": 4, "kv_num_heads": 2}, (torch.randn(2, 5, 32), *torch.randn(2, 2, 6, 16))
    if case == "past":
        return {"past": True, "scale": 0.3, "softmax_precision": 1}, (q, k, v, *torch.randn(2, 2, 4, 3, 8))
    raise AssertionError(case)


ATTENTION = ["gqa", "causal", "bool_mask", "float_mask_softcap", "3d", "past"]
DECOMPOSED_AT_23 = {"float_mask_softcap"}  # ONNX Runtime's Attention-23 applies softcap before the mask


@pytest.mark.parametrize("target", [18, 23, NEWEST])
@pytest.mark.parametrize("case", ATTENTION)
def test_attention(case, target):
    options, inputs = _attention_inputs(case)
    program = opreg.export(Attention(**options), inputs, target=target)
    op_types = {n.op_type for n in program.model_proto.graph.node}
    assert ("Attention" in op_types) == (target >= 23 and case not in DECOMPOSED_AT_23)
    program.verify(*inputs)
