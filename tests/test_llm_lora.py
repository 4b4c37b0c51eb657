"""LoRA adapters (issue 51): ``adapter=`` (``--adapter``) merges a PEFT adapter into the weights
as they are written; ``adapters=`` (``--adapters``) gives the base model each adapted layer's A
and B as inputs and writes one ``.onnx_adapter`` per adapter, which ONNX Runtime GenAI's
``Adapters`` load and switch per request.

A tiny random Llama saved as a checkpoint, two tiny random LoRA adapters (PEFT's own
``get_peft_model`` and ``save_pretrained``, B drawn non-zero so each adapter changes the tokens),
eager PEFT the reference: GenAI's greedy tokens equal PEFT's ``generate``, token for token.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import opreg
from opreg.errors import ExportError, InvalidArgumentError
from tests import language_models as lm
from tests.test_cli import run

PROMPT = [5, 17, 42, 9, 101, 7, 3]
LENGTH = 20
ADAPTERS = {
    # name: (target modules, rank, alpha, rslora, seed)
    "math": (["q_proj", "v_proj", "down_proj"], 4, 8, False, 1),
    "chat": (["k_proj", "o_proj", "gate_proj", "up_proj"], 2, 16, True, 2),
}


def make_adapter(base: torch.nn.Module, folder: Path, name: str) -> Path:
    """A PEFT LoRA adapter of ``base`` (a copy of it is wrapped), saved as ``folder / name``, its
    B drawn at random (PEFT starts B at zero: the adapter would change nothing)."""
    import copy

    from peft import LoraConfig, get_peft_model

    targets, rank, alpha, rslora, seed = ADAPTERS[name]
    config = LoraConfig(r=rank, lora_alpha=alpha, use_rslora=rslora, target_modules=targets, lora_dropout=0.0)
    peft = get_peft_model(copy.deepcopy(base), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module_name, parameter in peft.named_parameters():
            if "lora_" in module_name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    peft.save_pretrained(folder / name)
    return folder / name


def peft_greedy(base: torch.nn.Module, adapter: Path | None) -> list[int]:
    """Eager PEFT's greedy tokens with ``adapter`` on ``base`` (``None``: the base model)."""
    import copy

    from peft import PeftModel

    if adapter is None:
        return lm.greedy(base, PROMPT, LENGTH)
    model = PeftModel.from_pretrained(copy.deepcopy(base), adapter).eval()
    return lm.greedy(model, PROMPT, LENGTH)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = lm.causal_lm("llama")
    checkpoint = lm.checkpoint(base, root / "base")
    adapters = {name: make_adapter(base, root, name) for name in ADAPTERS}
    expected = {name: peft_greedy(base, path) for name, path in adapters.items()}
    expected[None] = peft_greedy(base, None)
    assert len({tuple(tokens) for tokens in expected.values()}) == 3, "each adapter must change the tokens"
    return root, base, checkpoint, adapters, expected


def genai_greedy(folder: Path, adapter: str | None) -> list[int]:
    """GenAI's greedy tokens from ``folder``, ``adapter``'s file loaded and active (``None``: none)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    adapters = og.Adapters(model)
    for file in sorted(folder.glob("*.onnx_adapter")):
        adapters.load(str(file), file.name.removesuffix(".onnx_adapter"))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=LENGTH, do_sample=False)
    generator = og.Generator(model, params)
    if adapter is not None:
        generator.set_active_adapter(adapters, adapter)
    generator.append_tokens([PROMPT])
    while not generator.is_done():
        generator.generate_next_token()
    return [int(token) for token in generator.get_sequence(0)]


@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "loaded"])
def test_adapter_merged_into_the_weights_generates_eager_peft_greedy_tokens(setup, streaming):
    root, _, checkpoint, adapters, expected = setup
    folder = root / f"merged-{streaming}"
    decoder = opreg.llm.export_checkpoint(checkpoint, folder, adapter=adapters["math"], streaming=streaming)
    assert not decoder.adapters and not list(folder.glob("*.onnx_adapter"))
    assert [v.name for v in decoder.program.model.graph.inputs if "lora" in v.name] == []
    assert genai_greedy(folder, None) == expected["math"]
    decoder.verify([(1, 7, 0), (2, 1, 5)], left_padding=False)  # against the base with the adapter merged


@pytest.fixture(scope="module")
def inputs(setup):
    """The base model with both adapters' inputs, and its folder."""
    root, _, checkpoint, adapters, _ = setup
    folder = root / "inputs"
    return opreg.llm.export_checkpoint(checkpoint, folder, adapters=[adapters["math"], adapters["chat"]]), folder


def test_adapters_as_inputs_generate_eager_peft_greedy_tokens_per_adapter_and_none(setup, inputs):
    _, base, _, _, expected = setup
    decoder, folder = inputs
    assert sorted(p.name for p in folder.glob("*.onnx_adapter")) == ["chat.onnx_adapter", "math.onnx_adapter"]
    graph = decoder.program.model.graph
    lora = [v for v in graph.inputs if ".lora_" in v.name]
    # every projection of both layers is adapted by one adapter or the other: 7 per layer, A and B each
    assert len(lora) == 2 * 7 * 2
    a = next(v for v in lora if v.name == "model.layers.1.self_attn.q_proj.lora_A.weight")
    b = next(v for v in lora if v.name == "model.layers.1.self_attn.q_proj.lora_B.weight")
    width = base.model.layers[1].self_attn.q_proj.in_features  # in and out
    assert (a.shape[0], str(a.shape[1]), str(b.shape[0]), b.shape[1]) == (width, "lora_rank_7", "lora_rank_7", width)
    assert a.const_value.shape == (width, 0) and b.const_value.shape == (0, width)  # the empty default: no adapter
    for name in (None, "math", "chat"):
        assert genai_greedy(folder, name) == expected[name], name
    decoder.verify([(1, 7, 0), (2, 1, 5)], left_padding=False)  # no adapter active: the base model


def test_the_command_line_writes_the_int4_base_with_float_lora_inputs(setup, capsys):
    """``--adapters`` at int4: the base weights MatMulNBits, each adapter's A and B float inputs
    of plain MatMuls; GenAI switches the adapter on and off in the quantized folder."""
    root, _, checkpoint, adapters, _ = setup
    folder = root / "int4"
    code, _, err = run(
        capsys, "llm", "export", str(checkpoint), "-o", str(folder), "--precision", "int4",
        "--adapters", f"{adapters['math']},{adapters['chat']}",
    )  # fmt: skip
    assert code == 0, err
    assert sorted(p.name for p in folder.glob("*.onnx_adapter")) == ["chat.onnx_adapter", "math.onnx_adapter"]
    import onnx_ir as ir

    graph = ir.load(folder / "model.onnx").graph
    lora = {v.name: v for v in graph.inputs if ".lora_" in v.name}
    readers = {node.op_type for v in lora.values() for node, _ in v.uses()}
    assert readers == {"MatMul"} and all(v.dtype == ir.DataType.FLOAT for v in lora.values())
    assert sum(node.op_type == "MatMulNBits" for node in graph) >= 2 * 7  # every projection's base weight
    tokens = {name: genai_greedy(folder, name) for name in (None, "math", "chat")}
    assert len({tuple(t) for t in tokens.values()}) == 3


def test_an_adapter_file_holds_a_transposed_and_b_scaled_as_the_inputs_take_them(setup, inputs):
    """The ``.onnx_adapter`` read back by ONNX Runtime: A transposed, B scaled by alpha / rank and
    transposed, under the decoder's input names."""
    from safetensors.torch import load_file

    _, _, _, adapters, _ = setup
    made = onnxruntime.AdapterFormat.read_adapter(str(inputs[1] / "math.onnx_adapter"))
    parameters = {name: value.numpy() for name, value in made.get_parameters().items()}
    stored = load_file(adapters["math"] / "adapter_model.safetensors")
    module = "model.layers.0.self_attn.v_proj"
    a, b = (stored[f"base_model.model.{module}.lora_{k}.weight"] for k in "AB")
    _, rank, alpha, _, _ = ADAPTERS["math"]
    np.testing.assert_array_equal(parameters[f"{module}.lora_A.weight"], a.T.numpy())
    np.testing.assert_allclose(parameters[f"{module}.lora_B.weight"], (b * alpha / rank).T.numpy(), rtol=1e-6)
    assert len(parameters) == 2 * 3 * 2  # q, v, down of 2 layers, A and B each


def _edited(setup, name: str, config: dict | None = None, tensors: dict | None = None) -> Path:
    """A copy of the adapter "math" with its config's keys replaced by ``config`` and its tensors
    by ``tensors``."""
    import shutil

    from safetensors.torch import save_file

    root, _, _, adapters, _ = setup
    folder = root / name
    shutil.copytree(adapters["math"], folder, dirs_exist_ok=True)
    if config is not None:
        path = folder / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if tensors is not None:
        save_file(tensors, folder / "adapter_model.safetensors")
    return folder


@pytest.mark.parametrize(
    ("config", "tensors", "said"),
    [
        ({"use_dora": True}, None, "DoRA's magnitude vectors (use_dora)"),
        ({"bias": "lora_only"}, None, "trained biases (bias='lora_only')"),
        ({"peft_type": "IA3"}, None, "is a 'IA3' adapter: the export takes LoRA adapters only"),
        (None, {"base_model.model.model.layers.5.mlp.up_proj.lora_A.weight": torch.ones(2, 64),
                "base_model.model.model.layers.5.mlp.up_proj.lora_B.weight": torch.ones(128, 2)},
         "adapts model.layers.5.mlp.up_proj, no module of LlamaForCausalLM"),
        (None, {"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": torch.ones(2, 48),
                "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight": torch.ones(128, 2)},
         "do not fit its Linear(64, "),
        (None, {"base_model.model.model.embed_tokens.lora_embedding_A": torch.ones(2, 300)},
         "not a linear layer's lora_A or lora_B"),
    ],
    ids=["dora", "bias", "ia3", "no-module", "shape", "embedding"],
)  # fmt: skip
def test_an_adapter_the_export_cannot_hold_is_refused_with_the_reason_before_the_capture(
    setup, config, tensors, said, tmp_path, caplog
):
    _, _, checkpoint, _, _ = setup
    adapter = _edited(setup, f"bad-{len(said)}", config, tensors)
    for option in ({"adapter": adapter}, {"adapters": [adapter]}):
        with caplog.at_level("INFO"), pytest.raises(ExportError, match=re.escape(said)):
            opreg.llm.export_checkpoint(checkpoint, tmp_path / "out", **option)
        assert "captured" not in caplog.text and not (tmp_path / "out").exists()


def test_options_refused_at_once(setup, tmp_path):
    _, base, checkpoint, adapters, _ = setup
    with pytest.raises(InvalidArgumentError, match="give one of them"):
        opreg.llm.LLMSettings(adapter=adapters["math"], adapters=[adapters["chat"]])
    with pytest.raises(InvalidArgumentError, match="names two adapters math"):
        opreg.llm.LLMSettings(adapters=[adapters["math"], tmp_path / "math"])
    with pytest.raises(InvalidArgumentError, match="give the checkpoint folder, or merge it"):
        opreg.llm.export_decoder(base, adapter=adapters["math"])
    with pytest.raises(ExportError, match="is not a PEFT adapter folder"):
        opreg.llm.export_checkpoint(checkpoint, adapters=[tmp_path])
