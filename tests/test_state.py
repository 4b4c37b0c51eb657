"""State is never dropped silently: a model that updates buffers or inputs during forward is
refused, exported with the state as inputs and outputs (state="io"), or exported without the
updates when asked (state="drop")."""

from __future__ import annotations

import copy
import textwrap

import onnxruntime
import pytest
import torch

import opreg
from opreg.exporter import StateSlot
from tests.optest import OPSETS
from tests.test_cli import run


class Counter(torch.nn.Module):
    """Counts its calls and sums what it has seen, in buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("seen", torch.zeros(3))
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1
        self.seen.add_(x.sum(0))
        return self.linear(x) * self.count + self.seen


class BumpInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        running.mul_(0.5).add_(x.mean(0))
        return x - running


BATCH = {"x": {0: torch.export.Dim("batch")}}


def test_a_model_that_updates_buffers_is_refused_by_default_naming_them():
    with pytest.raises(opreg.StateError, match=r"Counter updates buffer\(s\) 'count', 'seen' during forward") as info:
        opreg.export(Counter(), (torch.randn(2, 3),))
    assert info.value.buffers == ("count", "seen") and info.value.inputs == ()
    assert "state='io'" in str(info.value) and "state='drop'" in str(info.value)


def test_an_input_updated_in_place_is_refused_by_default_naming_it():
    with pytest.raises(opreg.StateError, match=r"input\(s\) 'running' in place") as info:
        opreg.export(BumpInput(), (torch.randn(4, 3), torch.zeros(3)))
    assert info.value.inputs == ("running",)


class BumpAndReturn(torch.nn.Module):
    """Updates its input in place and returns that very value: the caller reads the update there."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.mul_(2).add_(y), x.sum()


class BumpAndReturnOther(torch.nn.Module):
    """Updates its input in place and returns something else: a view of it, or a value computed from it."""

    def __init__(self, view: bool) -> None:
        super().__init__()
        self.view = view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x[0] if self.view else x * 2


@pytest.mark.parametrize("opset", OPSETS)
def test_an_input_updated_in_place_and_returned_exports_by_default(opset):
    """Its new value is not lost: the output carries it (torch.onnx exports the same model)."""
    program = opreg.export(BumpAndReturn(), (torch.randn(3), torch.randn(3)), target=opset)
    assert program.state_slots == () and [v.name for v in program.model.graph.outputs] == ["output_0", "output_1"]
    x, y = torch.randn(3), torch.randn(3)
    got = program.run(x.clone(), y)
    torch.testing.assert_close(got, BumpAndReturn()(x.clone(), y))


@pytest.mark.parametrize("view", [True, False], ids=["a view of it", "a value computed from it"])
def test_an_input_update_no_output_carries_is_still_refused(view):
    with pytest.raises(opreg.StateError, match=r"input\(s\) 'x' in place") as info:
        opreg.export(BumpAndReturnOther(view), (torch.randn(3),))
    assert info.value.inputs == ("x",)


def test_over_the_op_database_normal_exports_and_batch_norm_with_update_asks_for_state():
    """The two OpInfos whose op updates a user input, exported as the op alone under the default
    state="error": normal_ returns the tensor it fills, so nothing is lost; _batch_norm_with_update's
    running statistics are updated and not returned, so they would be."""
    from opreg.testing import OpCall
    from opreg.testing import opinfo as oi

    infos = {oi.full_name(i): i for i in oi.op_db()}
    normal, batch_norm = infos["normal.in_place"], infos["_batch_norm_with_update"]
    exported = refused = 0
    for sample in oi.samples(normal, torch.float32, 8):
        model = OpCall(oi.op_for(normal), [sample])
        program = opreg.export(model, OpCall.inputs([sample]), target=21)
        assert program.state_slots == () and "RandomNormalLike" in {n.op_type for n in program.model.graph}
        exported += 1
    for sample in oi.samples(batch_norm, torch.float32, 8):
        model = OpCall(oi.op_for(batch_norm), [sample])
        with pytest.raises(opreg.StateError, match=r"input\(s\) .* in place") as info:
            opreg.export(model, OpCall.inputs([sample]))
        assert len(info.value.inputs) == 2  # running_mean and running_var
        refused += 1
    assert exported > 0 and refused > 0


def test_state_takes_three_values():
    with pytest.raises(opreg.InvalidArgumentError, match="state='keep': use 'error'"):
        opreg.export(Counter(), (torch.randn(2, 3),), state="keep")


@pytest.mark.parametrize("opset", OPSETS)
def test_state_io_makes_each_buffer_an_input_and_an_output_that_steps_like_the_module(opset):
    torch.manual_seed(0)
    model = Counter()
    program = opreg.export(model, (torch.randn(2, 3),), target=opset, dynamic_shapes=BATCH, state="io")
    assert program.state_slots == (
        StateSlot("buffer", "count", "count", "count_out"),
        StateSlot("buffer", "seen", "seen", "seen_out"),
    )
    graph = program.model.graph
    assert [v.name for v in graph.inputs] == ["x", "count", "seen"]
    assert [v.name for v in graph.outputs] == ["output", "count_out", "seen_out"]
    assert "count" not in graph.initializers and "seen" not in graph.initializers
    # three calls: the program keeps its state as the module keeps its buffers
    eager = copy.deepcopy(model)
    for batch in (1, 3, 2):
        x = torch.randn(batch, 3)
        torch.testing.assert_close(program.run(x), eager(x), rtol=1e-5, atol=1e-5)
    assert int(program.state["count"]) == 3 and torch.allclose(program.state["seen"], eager.seen)
    # verify compares the new state too, and leaves the program's and the module's state alone
    before = {k: v.clone() for k, v in program.state.items()}
    result = program.verify(torch.randn(4, 3))
    assert [c.name for c in result] == ["output", "count_out", "seen_out"]
    assert all(torch.equal(before[k], program.state[k]) for k in before)
    assert int(model.count) == 0  # the export and verify never moved the user's buffers


def test_state_io_runs_in_a_plain_session_feeding_the_outputs_back():
    """What a user of the .onnx file does: feed each ``*_out`` back as the next call's input."""
    model = Counter()
    program = opreg.export(model, (torch.randn(2, 3),), dynamic_shapes=BATCH, state="io")
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString())
    state = {"count": model.count.numpy(), "seen": model.seen.numpy()}
    for _ in range(3):
        x = torch.randn(2, 3)
        output, state["count"], state["seen"] = session.run(None, {"x": x.numpy(), **state})
        torch.testing.assert_close(torch.from_numpy(output), model(x), rtol=1e-5, atol=1e-5)
    assert int(state["count"]) == 3


def test_state_drop_leaves_the_updates_out_when_asked():
    model = Counter()
    program = opreg.export(model, (torch.randn(2, 3),), state="drop")
    assert program.state_slots == () and [v.name for v in program.model.graph.inputs] == ["x"]
    x = torch.randn(2, 3)
    first, second = program.run(x), program.run(x)
    torch.testing.assert_close(first, second)  # each call reads the exported (zero) state
    torch.testing.assert_close(first, Counter.forward(copy.deepcopy(model), x))


def test_state_io_writes_an_updated_input_back_as_eager_does():
    program = opreg.export(BumpInput(), (torch.randn(4, 3), torch.zeros(3)), state="io")
    assert program.state_slots == (StateSlot("input", "running", "running", "running_out"),)
    x, running, eager_running = torch.randn(4, 3), torch.ones(3), torch.ones(3)
    torch.testing.assert_close(program.run(x, running), BumpInput()(x, eager_running))
    torch.testing.assert_close(running, eager_running)  # updated in place, like eager's
    given = torch.ones(3)
    assert [c.name for c in program.verify(x, given)] == ["output", "running_out"]
    assert torch.equal(given, torch.ones(3))  # verify runs both sides on copies


def test_a_static_kv_cache_is_state_and_a_decode_loop_matches_eager():
    """transformers' static cache module keeps its KV cache in buffers: with state="io" each step
    reads the cache the last one wrote (torch.onnx exports a step that reads an empty cache)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": 8}
    )
    step = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=8).eval()
    example = {"input_ids": torch.tensor([[7]]), "cache_position": torch.tensor([0])}
    # non-strict capture of the static cache cannot be decomposed by torch 2.13; strict can
    captured = torch.export.export(step, (), example, strict=True)
    with pytest.raises(opreg.StateError, match="'key_cache_0', 'value_cache_0'"):
        opreg.export(captured)
    program = opreg.export(captured, state="io")
    assert {s.key for s in program.state_slots} >= {"key_cache_0", "value_cache_0"}
    eager = captured.module()
    for position, token in enumerate([7, 9, 11, 13]):
        inputs = {"input_ids": torch.tensor([[token]]), "cache_position": torch.tensor([position])}
        torch.testing.assert_close(program.run(**inputs), eager(**inputs), rtol=1e-4, atol=1e-5)
    assert program.state["key_cache_0"][0, :, 4:].abs().sum() == 0  # four slots written, the rest empty
    assert program.state["key_cache_0"][0, :, :4].abs().sum() > 0
    program.verify(input_ids=torch.tensor([[5]]), cache_position=torch.tensor([4]))


MODEL_FILE = textwrap.dedent(
    """
    import torch

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            self.count += 1
            return x * self.count

    def make():
        return Counter(), (torch.randn(2, 3),)
    """
)


def test_cli_export_refuses_state_unless_told_what_to_do(tmp_path, capsys):
    model_file = tmp_path / "stateful.py"
    model_file.write_text(MODEL_FILE)
    output = tmp_path / "model.onnx"
    code, _, err = run(capsys, "export", f"{model_file}:make", "-o", str(output))
    assert code == 2 and "updates buffer(s) 'count'" in err and "--state io" in err
    assert not output.exists()
    code, out, _ = run(capsys, "export", f"{model_file}:make", "-o", str(output), "--state", "io", "--verify")
    assert code == 0 and "3 output(s) match" not in out and "2 output(s) match" in out
    session = onnxruntime.InferenceSession(str(output))
    assert [i.name for i in session.get_inputs()] == ["x", "count"]
    assert [o.name for o in session.get_outputs()] == ["output", "count_out"]
