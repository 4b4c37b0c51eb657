"""A language model's decoder at target="onnxruntime": GroupQueryAttention on the unrepeated
cache (past and present able to share one buffer), rotary inside it and packed q, k, v, each
checked against eager transformers, in a plain session and with one buffer for past and present."""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import torch

import opreg

LAYERS, HEADS, KV_HEADS, SIZE, VOCAB = 2, 4, 2, 16, 128


def _llama(**extra):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HEADS * SIZE, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128, **extra,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


class Decoder(torch.nn.Module):
    """The model with its cache as inputs and outputs, positions from the mask (left padding)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, past_key_values):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for layer, (key, value) in enumerate(past_key_values):
            cache.update(key, value, layer)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache,
            use_cache=True,
        )  # fmt: skip
        return out.logits, [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def _inputs(batch: int, seq: int, past: int, padding: int = 0, seed: int = 0):
    """Token ids, a mask (every row after the first left-padded by ``padding`` more) and a random cache."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    for row in range(1, batch):
        mask[row, : min(row * padding, past + seq - 1)] = 0
    cache = [
        tuple(torch.randn(batch, KV_HEADS, past, SIZE, generator=generator) for _ in range(2)) for _ in range(LAYERS)
    ]
    return torch.randint(0, VOCAB, (batch, seq), generator=generator), mask, cache


def _export(model, bounds: bool = True, target: str = "onnxruntime", **options):
    batch = torch.export.Dim("batch", max=8)
    seq, past = (torch.export.Dim(n, max=32) if bounds else torch.export.Dim(n) for n in ("seq", "past"))
    dims = {
        "input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: torch.export.Dim.AUTO},
        "past_key_values": [({0: batch, 2: past},) * 2] * LAYERS,
    }  # fmt: skip
    example = _inputs(2, 3, 4, padding=1)
    return opreg.export(Decoder(model), example, target=target, dynamic_shapes=dims, **options)


NEWER = "onnxruntime==1.32"
"""A target naming the release whose GroupQueryAttention takes ``query_seqlens``: rotary inside it then."""


@pytest.fixture(scope="module")
def llama():
    model = _llama()
    return model, _export(model)


@pytest.fixture(scope="module")
def llama_newer(llama):
    model, _ = llama
    return model, _export(model, target=NEWER)


def _ops(program) -> collections.Counter:
    return collections.Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in program.model.graph)


def _check(program, model, batch, seq, past, padding):
    ids, mask, cache = _inputs(batch, seq, past, padding, seed=batch * 100 + seq * 10 + past)
    program.verify(ids, mask, cache, rtol=1e-4, atol=1e-4)  # every row, padding included


def _attention_inputs(program) -> list[list]:
    return [list(n.inputs) for n in program.model.graph if n.op_type == "GroupQueryAttention"]


def test_decoder_runs_on_group_query_attention_with_the_16_inputs_onnxruntime_1_30_loads(llama):
    """The default: GroupQueryAttention on the cache without ``query_seqlens`` (1.30 refuses a 17th
    input), so the rotary stays before it; q, k and v are one projection, split for the rotary."""
    _, program = llama
    ops = _ops(program)
    assert ops["com.microsoft::GroupQueryAttention"] == LAYERS and ops["RotaryEmbedding"] == 2 * LAYERS
    assert ops["Split"] == LAYERS and "com.microsoft::MultiHeadAttention" not in ops
    fired = program.model.metadata_props["opreg.rewrites"]
    assert "ort_contrib:GroupQueryAttentionOnCache=" in fired and "RotaryInsideAttention" not in fired
    assert "ort_contrib:PackedQKV=" in fired
    for inputs in _attention_inputs(program):
        assert len(inputs) == 12 and inputs[10] is not None and inputs[11] is not None  # up to head_sink
        assert inputs[3].name.startswith("past_key_values") and inputs[4].name.startswith("past_key_values")
        rotated = [inputs[0].producer(), inputs[1].producer()]
        assert [n.op_type for n in rotated] == ["RotaryEmbedding"] * 2
        split = rotated[0].inputs[0].producer()
        assert split.op_type == "Split" and rotated[1].inputs[0].producer() is split
        assert inputs[2].producer() is split
    assert len([name for name in program.model.graph.initializers if name.endswith("qkv_packed")]) == LAYERS


def test_at_onnxruntime_1_32_it_runs_with_rotary_inside_and_packed_projections(llama_newer):
    _, program = llama_newer
    ops = _ops(program)
    assert ops["com.microsoft::GroupQueryAttention"] == LAYERS
    assert not {"com.microsoft::MultiHeadAttention", "RotaryEmbedding"} & set(ops)
    past = {v for v in program.model.graph.inputs if v.name.startswith("past")}
    assert not [
        n for n in program.model.graph if n.op_type == "Concat" and past & set(n.inputs)
    ]  # no copy of the cache
    fired = program.model.metadata_props["opreg.rewrites"]
    for rule in ("GroupQueryAttentionOnCache", "RotaryInsideAttention", "PackedQKV"):
        assert f"ort_contrib:{rule}=" in fired
    for inputs in _attention_inputs(program):
        assert len(inputs) == 17 and inputs[16] is not None  # query_seqlens
        assert inputs[1] is None and inputs[2] is None  # packed q, k, v
        assert inputs[3].name.startswith("past_key_values") and inputs[4].name.startswith("past_key_values")
        assert inputs[9] is not None  # the positions
        assert inputs[7].const_value.shape == (64, SIZE // 2)  # the bounds: past 32 + seq 32
    packed = [name for name in program.model.graph.initializers if name.endswith("qkv_packed")]
    assert len(packed) == LAYERS
    assert all(name in program.model.metadata_props["opreg.folded_weights"] for name in packed)


@pytest.mark.parametrize(
    ("batch", "seq", "past", "padding"),
    [(1, 1, 5, 0), (3, 1, 5, 2), (1, 7, 0, 0), (3, 7, 0, 2), (1, 7, 5, 0), (2, 1, 0, 0)],
    ids=["decode", "decode-left-padded", "prompt", "prompts-left-padded", "a-prompt-after-a-cache", "first-token"],
)
@pytest.mark.parametrize("target", ["default", NEWER])
def test_decoder_matches_eager(llama, llama_newer, target, batch, seq, past, padding):
    model, program = llama if target == "default" else llama_newer
    _check(program, model, batch, seq, past, padding)


def test_a_batch_of_prompts_after_a_cache_needs_a_target_naming_onnxruntime_1_32(llama, llama_newer):
    """The default's 16-input GroupQueryAttention (what 1.30 loads) is refused by the kernel on a
    batch of prompts after a cache, as the builder's graph is; a target naming 1.32 writes the
    17th input, ``query_seqlens``, and that case matches eager."""
    model, program = llama
    with pytest.raises(Exception, match="batch_size must be 1 when sequence_length > 1 and past context is given"):
        _check(program, model, 3, 7, 5, 2)
    _check(llama_newer[1], model, 3, 7, 5, 2)


def _session(program):
    options = onnxruntime.SessionOptions()
    return onnxruntime.InferenceSession(
        program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize("target", ["default", NEWER])
def test_past_and_present_can_share_one_buffer(llama, llama_newer, target):
    """As ONNX Runtime GenAI runs it: each layer's past and present bound to one buffer of the
    longest length, a left-padded prompt then decode steps; logits as eager transformers' at every step."""
    model, program = llama if target == "default" else llama_newer
    session, longest, batch = _session(program), 16, 2
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    buffers = [onnxruntime.OrtValue.ortvalue_from_numpy(np.zeros((batch, KV_HEADS, longest, SIZE), np.float32))
               for _ in range(2 * LAYERS)]  # fmt: skip
    ids, mask, _ = _inputs(batch, 5, 0, padding=2, seed=7)
    tokens, eager_cache = ids, None
    for _ in range(4):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -tokens.shape[1] :]
        binding = session.io_binding()
        for name, value in zip(names[:2], (tokens, mask), strict=True):
            binding.bind_cpu_input(name, value.numpy())
        for name, buffer in zip(names[2:], buffers, strict=True):
            binding.bind_ortvalue_input(name, buffer)
        binding.bind_output(outputs[0])
        for name, buffer in zip(outputs[1:], buffers, strict=True):
            binding.bind_ortvalue_output(name, buffer)
        session.run_with_iobinding(binding)
        logits = binding.copy_outputs_to_cpu()[0]
        with torch.no_grad():
            expected = model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=eager_cache,
                             use_cache=True)  # fmt: skip
        eager_cache = expected.past_key_values
        np.testing.assert_allclose(logits, expected.logits.numpy(), rtol=1e-4, atol=1e-4)
        tokens = torch.from_numpy(logits[:, -1:].argmax(-1))
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.int64)], 1)


def test_without_length_bounds_the_rotary_stays_before_the_attention():
    """The rotary tables need the longest length: without ``Dim(max=...)`` it stays RotaryEmbedding-23."""
    model = _llama()
    program = _export(model, bounds=False)
    ops = _ops(program)
    assert ops["com.microsoft::GroupQueryAttention"] == LAYERS and ops["RotaryEmbedding"] == 2 * LAYERS
    _check(program, model, 3, 7, 0, 2)
    _check(program, model, 3, 1, 5, 2)


@pytest.mark.parametrize("window", [None, 3])
def test_only_a_causal_padding_mask_becomes_group_query_attention(window):
    """A mask other than "causal and not padding" (here a sliding window of 3) is not what
    GroupQueryAttention applies: that attention stays as it is, and exact."""
    from opreg_ort_contrib.samples import _decoder_sample

    sample = _decoder_sample(window)
    program = opreg.export(sample.module, sample.args, target="onnxruntime")
    assert ("com.microsoft::GroupQueryAttention" in _ops(program)) == (window is None)
    program.verify(*sample.args, rtol=1e-4, atol=1e-5)


def test_the_mask_is_recognised_by_its_values_not_its_spelling():
    from opreg_ort_contrib.kv_cache import is_causal_padding_mask

    graph = ir.Graph([], [], nodes=[], opset_imports={"": 20}, name="g")
    mask = ir.Value(name="mask", shape=ir.Shape(["b", "t"]), type=ir.TensorType(ir.DataType.INT64))
    graph.inputs.append(mask)
    # keys the mask allows, without the causal part: not the mask GroupQueryAttention applies
    node = ir.node("Cast", [mask], {"to": ir.DataType.BOOL})
    graph.append(node)
    unsqueezed = ir.node("Unsqueeze", [node.outputs[0], ir.Value(name="axes", const_value=ir.tensor([1, 2]))])
    graph.register_initializer(unsqueezed.inputs[1])
    graph.append(unsqueezed)
    batch, query, past = (ir.SymbolicDim(n) for n in "bsp")
    assert is_causal_padding_mask(unsqueezed.outputs[0], batch, query, past) is None


# -- the fusions a user's export takes: opreg.llm.export_decoder at target="onnxruntime" --------------


def _attention(decoder) -> list[ir.Node]:
    graph = decoder.program.model.graph
    found = [n for n in graph if (n.domain, n.op_type) == ("com.microsoft", "GroupQueryAttention")]
    assert len(found) == LAYERS
    return found


def _tiny(config_class, model_class, **extra):
    torch.manual_seed(0)
    config = config_class(
        vocab_size=VOCAB, hidden_size=HEADS * SIZE, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128, eos_token_id=0, **extra,
    )  # fmt: skip
    return model_class(config).eval()


def test_an_interleaved_rotary_goes_into_group_query_attention_as_rotary_interleaved():
    """Cohere rotates interleaved pairs (GPT-J's rotate_every_two, cos/sin by repeat_interleave): the
    rotary is taken into GroupQueryAttention with ``rotary_interleaved=1`` and nothing of it is left
    outside; the decoder matches transformers, a left-padded batch included."""
    from transformers import CohereConfig, CohereForCausalLM

    model = _tiny(CohereConfig, CohereForCausalLM)
    decoder = opreg.llm.export_decoder(model, target=NEWER)
    labels = {c.name for c in decoder.verify([(1, 1, 0), (3, 7, 5)])}  # and a left-padded prefill
    assert any("left padding, row 1's tokens" in label for label in labels)
    for node in _attention(decoder):
        attributes = {a.name: a.value for a in node.attributes.values()}
        assert attributes["do_rotary"] == 1 and attributes["rotary_interleaved"] == 1
        cos_cache, sin_cache, positions = node.inputs[7:10]
        assert cos_cache.is_initializer() and sin_cache.is_initializer() and positions.name == "position_ids"
    ops = _ops(decoder.program)
    assert not {"RotaryEmbedding", "Neg", "Sin", "Cos"} & set(ops)  # no rotation left outside the kernel
    assert "ort_contrib:InterleavedRotaryEmbedding=4" in decoder.program.model.metadata_props["opreg.rewrites"]


def test_packed_projections_keep_each_bias_with_its_own_projection():
    """Qwen2's q, k and v projections have biases (set to random values: transformers initialises
    them to zero): packed into one matmul and one bias in q, k, v order, GroupQueryAttention taking
    the packed query; the decoder matches transformers, a left-padded batch included."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = _tiny(Qwen2Config, Qwen2ForCausalLM)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.copy_(torch.randn(projection.bias.shape, generator=generator))
    decoder = opreg.llm.export_decoder(model, target=NEWER)
    labels = {c.name for c in decoder.verify([(1, 1, 0), (3, 7, 5)])}  # and a left-padded prefill
    assert any("left padding, row 1's tokens" in label for label in labels)
    for index, node in enumerate(_attention(decoder)):
        assert node.inputs[1] is None and node.inputs[2] is None  # packed q, k, v
        assert {a.name: a.value for a in node.attributes.values()}["do_rotary"] == 1
        add = node.inputs[0].producer()
        packed = add.inputs[0].producer()
        assert add.op_type == "Add" and (packed.op_type, packed.domain) == ("MatMul", "")
        attention = model.model.layers[index].self_attn
        weights = [attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]
        stored = torch.cat(weights).T.detach().numpy()  # (in, out): MatMul, no transB
        np.testing.assert_array_equal(packed.inputs[1].const_value.numpy(), stored)
        expected = torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias])
        np.testing.assert_array_equal(add.inputs[1].const_value.numpy(), expected.detach().numpy())


def test_a_rotary_after_per_head_norms_goes_into_group_query_attention():
    """Qwen3 normalises the query's and key's heads (q_norm, k_norm) before the rotary: the rotary is
    still taken into GroupQueryAttention (on the normalised heads, merged), the norms stay before it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = _tiny(Qwen3Config, Qwen3ForCausalLM, head_dim=SIZE)
    decoder = opreg.llm.export_decoder(model, target=NEWER)
    decoder.verify([(1, 1, 0), (3, 7, 5)])  # and a left-padded prefill
    for node in _attention(decoder):
        assert {a.name: a.value for a in node.attributes.values()}["do_rotary"] == 1
        assert node.inputs[0].producer().op_type == "Reshape"  # the normalised heads, merged
    ops = _ops(decoder.program)
    assert "RotaryEmbedding" not in ops and ops["RMSNormalization"] == 2 * LAYERS + 2 * LAYERS + 1


def _angles(graph: ir.Graph, positions: ir.Value, frequencies: list[float], function: str = "Cos") -> ir.Value:
    """``function(positions * frequencies)``, as a rotary's angles are made, added to ``graph``."""
    table = ir.val(
        f"inv_freq_{len(graph.initializers)}", const_value=ir.tensor(np.array(frequencies, dtype=np.float32))
    )
    graph.register_initializer(table)
    cast = ir.node("Cast", [positions], {"to": ir.DataType.FLOAT})
    axes = ir.node("Constant", [], {"value": ir.tensor(np.array([-1], dtype=np.int64))})
    column = ir.node("Unsqueeze", [cast.outputs[0], axes.outputs[0]])
    angle = ir.node("Mul", [column.outputs[0], table])
    out = ir.node(function, [angle.outputs[0]])
    for node in (cast, axes, column, angle, out):
        graph.append(node)
    return out.outputs[0]


def test_a_slices_key_is_what_it_computes_so_each_rotary_table_is_probed_once():
    """Each layer's copy of the angles has its own nodes; the tables are probed once for all the
    copies computing the same values, and apart for any that differ (a frequency, the function)."""
    from opreg_ort_contrib.probe import Slice

    positions = ir.val("positions", ir.DataType.INT64, ir.Shape(["batch", "sequence"]))
    graph = ir.Graph([positions], [], nodes=[], opset_imports={"": 23})
    first, copy = _angles(graph, positions, [1.0, 0.5]), _angles(graph, positions, [1.0, 0.5])
    other, sine = _angles(graph, positions, [1.0, 0.25]), _angles(graph, positions, [1.0, 0.5], "Sin")
    key = Slice.of(first, cut=positions).key()
    assert Slice.of(copy, cut=positions).key() == key
    assert Slice.of(other, cut=positions).key() != key
    assert Slice.of(sine, cut=positions).key() != key
