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
    # the profile is a ceiling: the model imports what its nodes need, opreg's oldest target here
    assert _opsets(program) == {"": opreg.registry.targets.MIN_ONNX_OPSET, "com.microsoft": 1}
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
    report = opreg_pack_check("ort_contrib")
    report.assert_ok()
    samples = [r for r in report.results if r.check == "samples"]
    assert samples and all(r.status == "passed" for r in samples)
    newest = opreg.newest_supported_opset()
    assert {"ai.onnx=18", f"ai.onnx={newest}"} <= {r.target.split(",")[0] for r in samples}  # both ends
    assert {r.check for r in report.results if r.status == "passed"} >= {"load", "import", "samples", "rewrites"}


# -- attention -------------------------------------------------------------------------------------

PROFILE_ONNX = opreg.default_registry().target("onnxruntime").onnx
"""The ``onnxruntime`` profile's ai.onnx: the newest the installed onnx, onnxscript and ONNX Runtime allow."""
STANDARD_ATTENTION = 23 <= PROFILE_ONNX <= 24
"""At ai.onnx 23-24 the pack emits ai.onnx Attention (ONNX Runtime has its kernel); from 25 on,
MultiHeadAttention and GroupQueryAttention (ONNX Runtime 1.32 runs Attention-25's function body)."""


def _attention_at_profile(kind: str) -> str:
    """The attention node the profile gets where the contrib kernel would be ``kind``."""
    return "Attention" if STANDARD_ATTENTION else f"com.microsoft::{kind}"


ATTENTION_TARGETS = {
    "onnxruntime": {"Attention"} if STANDARD_ATTENTION else {"MultiHeadAttention", "GroupQueryAttention"},
    "24,com.microsoft=1": {"Attention"},
    "18,com.microsoft=1": {"MultiHeadAttention", "GroupQueryAttention"},
}


class Sdpa(torch.nn.Module):
    def __init__(self, **options) -> None:
        super().__init__()
        self.options = options

    def forward(self, q, k, v, *mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, *mask, **self.options)


def _padded_causal_mask(batch=2, seq=6):
    """Causal, the first row's first two keys padded away: its first two queries see no key at all."""
    mask = torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch, 1, seq, seq).clone()
    mask[0, ..., :2] = False
    return mask


def _attention_cases():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    k2, v2 = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    return {
        "plain": (Sdpa(), (q, k, v)),
        "causal_scale": (Sdpa(is_causal=True, scale=0.3), (q, k, v)),
        "bool_mask_rows_all_masked": (Sdpa(), (q, k, v, _padded_causal_mask())),
        "float_mask": (Sdpa(), (q, k, v, torch.randn(6, 6))),
        "gqa_causal": (Sdpa(is_causal=True, enable_gqa=True), (q, k2, v2)),
        "gqa_mask": (Sdpa(enable_gqa=True), (q, k2, v2, _padded_causal_mask())),
        "longer_keys": (Sdpa(), (q, torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8), torch.rand(2, 1, 6, 9) > 0.3)),
    }


@pytest.mark.parametrize("target", sorted(ATTENTION_TARGETS))
@pytest.mark.parametrize("case", sorted(_attention_cases()))
def test_sdpa_on_fused_attention_kernels_matches_eager(case, target):
    model, args = _attention_cases()[case]
    program = opreg.export(model, args, target=target)
    kernels = {op for _, op in _nodes(program)} & {"MultiHeadAttention", "GroupQueryAttention", "Attention"}
    assert len(kernels) == 1 and kernels <= ATTENTION_TARGETS[target], kernels
    result = program.verify(*args, rtol=1e-4, atol=1e-5)
    assert result.runtime == "onnxruntime"


def test_rows_whose_keys_are_all_masked_give_zero_as_in_torch():
    model, (q, k, v, mask) = _attention_cases()["bool_mask_rows_all_masked"]
    expected = model(q, k, v, mask)
    assert torch.equal(expected[0, :, :2], torch.zeros_like(expected[0, :, :2]))
    got = opreg.export(model, (q, k, v, mask), target="onnxruntime").run(q, k, v, mask)
    assert torch.equal(got[0, :, :2], expected[0, :, :2])


def test_shape_inference_understands_the_attention_kernels():
    model, args = _attention_cases()["gqa_mask"]
    proto = opreg.export(model, args, target="18,com.microsoft=1").model_proto
    del proto.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    (gqa,) = [n for n in inferred.graph.node if n.op_type == "GroupQueryAttention"]
    (info,) = [v for v in inferred.graph.value_info if v.name == gqa.output[0]]
    assert [d.dim_value for d in info.type.tensor_type.shape.dim] == [2, 6, 32]


# -- the real models: rewrite rules and kernels, verified against eager PyTorch --------------------

# model -> ops the onnxruntime export must hold, ops it must not
REAL_MODELS = {
    "bert": (
        {_attention_at_profile("Attention"), "com.microsoft::BiasGelu", "Sum"},
        {"Softmax", "com.microsoft::MultiHeadAttention"},  # q, k and v packed into Attention (PackedAttention)
    ),
    "gpt2": ({_attention_at_profile("MultiHeadAttention"), "com.microsoft::FastGelu"}, {"Softmax", "Tanh"}),
    "llama": (
        {
            _attention_at_profile("GroupQueryAttention"),
            "RotaryEmbedding",
            "RMSNormalization",
            "com.microsoft::QuickGelu",
        },
        {"Softmax", "ReduceMean", "Neg"},
    ),
    "vit": (
        {_attention_at_profile("Attention"), "com.microsoft::BiasGelu"},
        {"Softmax", "com.microsoft::MultiHeadAttention"},
    ),
}


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_models_get_the_fused_kernels_and_match_eager(name):
    from tests import real_models

    case = real_models.FACTORIES[name]()
    program = opreg.export(case.model, case.args, case.kwargs, target="onnxruntime", dynamic_shapes=case.dynamic_shapes)
    ops = {f"{d}::{op}" if d else op for d, op in _nodes(program)}
    wanted, unwanted = REAL_MODELS[name]
    assert wanted <= ops, wanted - ops
    assert not ops & unwanted, ops & unwanted
    assert "com.microsoft::SkipLayerNormalization" not in ops  # slower than LayerNormalization on ORT's CPU
    program.verify(*case.args, rtol=1e-4, atol=1e-4, **case.kwargs)
    (other_args, other_kwargs) = case.other_inputs
    program.verify(*other_args, rtol=1e-4, atol=1e-4, **other_kwargs)  # dynamic batch and sequence


def test_a_fused_node_keeps_the_provenance_of_what_it_replaced():
    from tests import real_models

    case = real_models.FACTORIES["llama"]()
    program = opreg.export(case.model, case.args, case.kwargs, target="onnxruntime", dynamic_shapes=case.dynamic_shapes)
    rms = next(n for n in program.model_proto.graph.node if n.op_type == "RMSNormalization")
    props = {p.key: p.value for p in rms.metadata_props}
    assert props["opreg.rewrite"] == "ort_contrib:RMSNormalization"
    assert (
        props["opreg.torch_op"]
        == "aten::pow.Tensor_Scalar+aten::mean.dim+aten::add.Tensor+aten::rsqrt.default+aten::mul.Tensor"
    )
    assert props["opreg.pack"] == "core"
    assert props["opreg.module"].startswith("model.")


def test_a_llama_decode_step_with_a_static_cache_reads_the_cache_in_place():
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": 16}
    )
    step = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=16).eval()
    inputs = {"input_ids": torch.tensor([[5]]), "cache_position": torch.tensor([7])}
    captured = torch.export.export(step, (), inputs, strict=True)  # non-strict capture cannot be decomposed
    program = opreg.export(captured, (), inputs, target="onnxruntime", state="drop")  # the cache is not state here
    kernel = "Attention" if STANDARD_ATTENTION else "MultiHeadAttention"
    attention = [n for n in program.model_proto.graph.node if n.op_type == kernel]
    assert len(attention) == 2
    assert all(
        {p.key: p.value for p in n.metadata_props}["opreg.rewrite"].endswith(f"{kernel}OnHeads") for n in attention
    )
    program.verify(rtol=1e-4, atol=1e-5, **inputs)
