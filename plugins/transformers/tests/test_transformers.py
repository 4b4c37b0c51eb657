"""opreg-transformers: grouped_mm_fallback checked by the conformance kit, and Mixtral's default CPU path
(its experts call the op) exported and compared with eager PyTorch."""

from __future__ import annotations

import pytest
import torch

import opreg

transformers = pytest.importorskip("transformers")


def test_conformance(opreg_pack_check):
    opreg_pack_check("transformers").assert_ok()


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def mixtral(layers: int = 2) -> Logits:
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return Logits(transformers.MixtralForCausalLM(config).eval())


def test_mixtral_default_path_exports():
    model = mixtral()
    ids = torch.randint(0, 64, (2, 9))
    captured = torch.export.export(model, (ids,), strict=False)
    assert "transformers.grouped_mm_fallback.default" in {str(n.target) for n in captured.graph.nodes}
    batch, sequence = torch.export.Dim("batch", max=8), torch.export.Dim("sequence", max=32)
    program = opreg.export(model, (ids,), dynamic_shapes={"input_ids": {0: batch, 1: sequence}})
    assert {n.metadata_props.get("opreg.pack") for n in program.model.graph} >= {"transformers"}
    program.verify(ids)
    program.verify(torch.randint(0, 64, (3, 17)))


def test_mixtral_without_the_pack_names_the_op():
    with pytest.raises(opreg.UnsupportedOpsError, match="transformers::grouped_mm_fallback"):
        opreg.export(mixtral(1), (torch.randint(0, 64, (1, 5)),), exclude=["transformers"])
