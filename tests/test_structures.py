"""What a model takes besides tensors, and what it returns: issue 24's causes, each reproduced
by a small local module (real torch.export, real ONNX Runtime, eager PyTorch as the reference).

- a bool or int argument (diffusers' ``return_dict=False``, RAFT's ``num_flow_updates``) is a
  constant of the export, recorded in the model, checked by ``run``/``verify``;
- an output class registered as a pytree node without key functions (diffusers' ``BaseOutput``)
  is named from its fields;
- a returned cache (transformers' ``DynamicCache``) exports, named ``past_key_values.<layer>.key``,
  and ``detach_`` no longer sends the graph through torch's decomposition.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

import opreg
from opreg.exporter import _capture, _plan
from tests.test_cli import run as run_cli

ATOL = 1e-5
NAME = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
"""An output name: path parts of letters, digits and underscores, joined with dots."""


# -- non-tensor arguments ------------------------------------------------------------------


class Flagged(nn.Module):
    """diffusers' ``return_dict``: a bool that picks the returned structure."""

    def forward(self, x: torch.Tensor, return_dict: bool = True):
        y = torch.relu(x) * 2
        return {"sample": y} if return_dict else (y,)


class Refine(nn.Module):
    """RAFT's ``num_flow_updates``: an int that sets how many refinement steps run."""

    def __init__(self) -> None:
        super().__init__()
        self.step = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, num_updates: int = 12):
        flows = []
        for _ in range(num_updates):
            x = x + torch.tanh(self.step(x))
            flows.append(x)
        return flows


def test_a_bool_argument_is_a_constant_of_the_export():
    x = torch.randn(2, 3)
    program = opreg.export(Flagged(), (x,), {"return_dict": False}, target=18)
    assert program.input_names == ("x",) and program.output_names == ("output_0",)
    assert json.loads(program.model.metadata_props["opreg.constant_inputs"]) == {"return_dict": False}
    result = program.run(x, return_dict=False)
    assert isinstance(result, tuple) and len(result) == 1
    torch.testing.assert_close(result[0], Flagged()(x, return_dict=False)[0])
    program.verify(torch.randn(2, 3), False)  # the same value, given by position
    with pytest.raises(
        opreg.InvalidInputError, match=r"argument return_dict was False when the model was exported, got True"
    ):
        program.run(x, return_dict=True)
    with pytest.raises(opreg.InvalidInputError, match="return_dict was False .* got True"):
        program.verify(x)  # left out, it takes forward's default, True: not what the model computes


def test_an_int_argument_is_a_constant_and_a_dynamic_int_is_an_input():
    torch.manual_seed(0)
    model, x = Refine().eval(), torch.randn(2, 4)
    program = opreg.export(model, (x,), {"num_updates": 4}, target=18)
    assert len(program.output_names) == 4 and program.input_names == ("x",)
    assert json.loads(program.model.metadata_props["opreg.constant_inputs"]) == {"num_updates": 4}
    program.verify(x, num_updates=4, atol=ATOL)
    with pytest.raises(opreg.InvalidInputError, match=r"num_updates was 4 .* got 5.*Dim\.DYNAMIC"):
        program.run(x, num_updates=5)

    class Tile(nn.Module):
        def forward(self, x: torch.Tensor, n: int):
            return x.repeat(n, 1) * n

    dynamic = opreg.export(Tile(), (x, 3), dynamic_shapes={"x": None, "n": torch.export.Dim.DYNAMIC}, target=18)
    (n,) = [v for v in dynamic.model.graph.inputs if v.name == "n"]
    assert str(n.dtype) == "INT64" and list(n.shape) == []  # a 0-d int64 input
    assert "opreg.constant_inputs" not in dynamic.model.metadata_props
    assert [str(d) for d in dynamic.model.graph.outputs[0].shape] == ["2*n", "4"]  # sizes it sets are named after it
    for value in (1, 3, 7):
        dynamic.verify(x, value)


class Mode(enum.Enum):
    PLAIN = "plain"
    NEGATED = "negated"


class Configured(nn.Module):
    def forward(self, x, mode: Mode = Mode.PLAIN, scale: float = 1.0, name: str = "a", cfg=None, pad=None):
        y = x * scale
        if mode is Mode.NEGATED:
            y = -y
        if cfg["flag"]:
            y = y + cfg["shift"][0]
        return y, name + "!", cfg["sizes"]


def test_constants_of_every_kind_are_recorded_and_listed_by_inspect(capsys, tmp_path):
    x, shift = torch.randn(2, 3), torch.randn(3)
    cfg = {"flag": True, "shift": (shift,), "sizes": [2, 3]}
    kwargs = {"mode": Mode.NEGATED, "scale": 0.5, "name": "b", "cfg": cfg, "pad": None}
    program = opreg.export(Configured(), (x,), kwargs, target=18)
    assert program.input_names == ("x", "cfg_shift_0")  # tensors only
    constants = json.loads(program.model.metadata_props["opreg.constant_inputs"])
    assert constants == {
        "mode": "Mode.NEGATED", "scale": 0.5, "name": "b", "cfg['flag']": True,
        "cfg['sizes'][0]": 2, "cfg['sizes'][1]": 3, "pad": None,
    }  # fmt: skip
    y, text, sizes = program.run(x, **kwargs)
    assert text == "b!" and sizes == [2, 3]  # constant outputs come back as they were
    torch.testing.assert_close(y, -(x * 0.5) + shift)
    program.verify(x, **kwargs)
    other = {**kwargs, "cfg": {**cfg, "sizes": [2, 4]}}
    with pytest.raises(opreg.InvalidInputError, match=r"argument cfg\['sizes'\]\[1\] was 3 .* got 4"):
        program.run(x, **other)
    with pytest.raises(opreg.InvalidInputError, match=r"argument mode was Mode.NEGATED .* got Mode.PLAIN"):
        program.run(x, **{**kwargs, "mode": Mode.PLAIN})

    path = program.save(tmp_path / "configured.onnx")
    code, out, _ = run_cli(capsys, "inspect", str(path), "--json")
    assert code == 0 and json.loads(out)["constant_inputs"] == constants
    code, out, _ = run_cli(capsys, "inspect", str(path))
    assert code == 0 and "constant inputs (fixed when exported" in out and 'mode="Mode.NEGATED"' in out


def test_an_argument_left_at_its_default_may_be_passed_or_left_out():
    x = torch.randn(2, 3)
    program = opreg.export(Configured(), (x,), {"cfg": {"flag": False, "shift": (x[0],), "sizes": []}}, target=18)
    cfg = {"flag": False, "shift": (torch.randn(3),), "sizes": []}
    program.verify(x, cfg=cfg)
    program.verify(x, Mode.PLAIN, 1.0, cfg=cfg)  # the defaults, spelled out by position
    with pytest.raises(opreg.InvalidInputError, match="argument scale was 1.0 when the model was exported, got 2.0"):
        program.run(x, scale=2.0, cfg=cfg)


# -- outputs of any structure ----------------------------------------------------------


@dataclasses.dataclass
class Unkeyed:
    """Registered as a pytree node with no key function and no names in its context."""

    sample: torch.Tensor
    residual: torch.Tensor


pytree.register_pytree_node(Unkeyed, lambda o: ([o.sample, o.residual], None), lambda v, _: Unkeyed(*v))


def _diffusers_output():
    from diffusers.utils import BaseOutput

    @dataclasses.dataclass
    class Transformer2DOutput(BaseOutput):  # BaseOutput registers it without a flatten_with_keys_fn
        sample: torch.Tensor
        hidden: torch.Tensor | None = None

    return Transformer2DOutput


class ReturnsUnkeyed(nn.Module):
    def __init__(self, output_class=None) -> None:
        super().__init__()
        self.output_class = output_class

    def forward(self, x):
        if self.output_class is None:
            return Unkeyed(x.sin(), x.cos())
        return self.output_class(sample=x.sin(), hidden=x.cos())


@pytest.mark.parametrize("kind", ["context-free", "diffusers"])
def test_an_output_class_registered_without_key_functions_is_named_from_its_fields(kind):
    output_class = None if kind == "context-free" else _diffusers_output()
    model, x = ReturnsUnkeyed(output_class), torch.randn(2, 3)
    expected = model(x)
    with pytest.raises(ValueError, match="Did not find a flatten_with_keys_fn"):
        pytree.tree_flatten_with_path(expected)  # the cause: torch cannot name its leaves
    program = opreg.export(model, (x,), target=18)
    fields = ("sample", "residual") if output_class is None else ("sample", "hidden")
    assert program.output_names == fields
    result = program.run(x)
    assert type(result) is type(expected)
    torch.testing.assert_close(result.sample, expected.sample)
    program.verify(x)


@dataclasses.dataclass
class Reordered:
    """Its flatten function lists ``first`` then ``second``; its key function the other way round."""

    first: torch.Tensor
    second: torch.Tensor


pytree.register_pytree_node(
    Reordered,
    lambda o: ([o.first, o.second], None),
    lambda values, _: Reordered(*values),
    flatten_with_keys_fn=lambda o: (
        [(pytree.GetAttrKey("second"), o.second), (pytree.GetAttrKey("first"), o.first)],
        None,
    ),
)


class ReturnsReordered(nn.Module):
    def forward(self, x):
        return Reordered(x + 1, x * 10)


def test_output_names_follow_the_flatten_order_whatever_order_the_key_function_lists():
    """Round 4, a mutation survivor: the ONNX outputs come in the flatten function's order; each
    must carry its own name, or a runtime user reading ``first`` by name gets ``second``."""
    import onnxruntime

    x = torch.arange(3.0)
    program = opreg.export(ReturnsReordered(), (x,), target=18)
    assert program.output_names == ("first", "second")
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    by_name = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x.numpy()}), strict=True))
    torch.testing.assert_close(torch.from_numpy(by_name["first"]), x + 1)
    torch.testing.assert_close(torch.from_numpy(by_name["second"]), x * 10)
    result = program.run(x)
    assert type(result) is Reordered
    torch.testing.assert_close(result.first, x + 1)
    program.verify(x)


class Pair(NamedTuple):
    low: torch.Tensor
    high: torch.Tensor


class Plain:
    """A class nothing registered: opreg registers it by its attributes when torch refuses it."""

    def __init__(self, total: torch.Tensor, note: str) -> None:
        self.total, self.note = total, note


@dataclasses.dataclass
class Unregistered:
    value: torch.Tensor
    count: int = 2


class Structured(nn.Module):
    def forward(self, x):
        return {
            "pair": Pair(x.min(-1).values, x.max(-1).values),
            "nested": (x + 1, [x + 2, {"deep": x + 3}]),
            "plain": Plain(x.sum(), "kept"),
            "data": Unregistered(x * 2),
            "logits": x,
        }


def test_nested_outputs_are_named_from_their_paths_and_rebuilt():
    x = torch.randn(2, 3)
    program = opreg.export(Structured(), (x,), target=18)
    assert program.output_names == (
        "pair.low",
        "pair.high",
        "nested.0",
        "nested.1.0",
        "nested.1.1.deep",
        "plain.total",
        "data.value",
        "logits",
    )  # fmt: skip  (data.count is an int: a constant the model returns, not an ONNX output)
    assert all(NAME.match(name) for name in program.output_names)
    result = program.run(x)
    assert isinstance(result["pair"], Pair) and isinstance(result["plain"], Plain) and result["plain"].note == "kept"
    assert isinstance(result["data"], Unregistered) and result["data"].count == 2
    torch.testing.assert_close(result["nested"][1][1]["deep"], x + 3)
    program.verify(x)
    again = opreg.export(Structured(), (torch.randn(2, 3),), target=18)
    assert again.output_names == program.output_names  # stable across exports


class Keyed(nn.Module):
    """Outputs whose paths would collide once cleaned, and a name an input already has."""

    def forward(self, x):
        return {"a b": x + 1, "a_b": x + 2, "x": x + 3}


def test_output_names_are_unique():
    program = opreg.export(Keyed(), (torch.randn(2),), target=18)
    assert program.output_names == ("a_b", "a_b_out", "x_out")


# -- caches --------------------------------------------------------------------------------


class KeyValues(nn.Module):
    """Returns transformers' ``DynamicCache`` filled layer by layer, as a decoder's forward does."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.keys = nn.ModuleList(nn.Linear(8, 8) for _ in range(layers))
        self.values = nn.ModuleList(nn.Linear(8, 8) for _ in range(layers))

    def forward(self, x):
        from transformers import DynamicCache

        cache = DynamicCache()
        batch, length, _ = x.shape
        for index, (key, value) in enumerate(zip(self.keys, self.values, strict=True)):
            k = key(x).view(batch, length, 2, 4).transpose(1, 2)
            v = value(x).view(batch, length, 2, 4).transpose(1, 2)
            cache.update(k, v, index)
            x = x + torch.softmax(k @ v.transpose(-1, -2), -1).sum(1) @ x
        return x, cache


def test_a_returned_cache_is_named_per_layer_and_comes_back_as_a_cache():
    from transformers import DynamicCache

    torch.manual_seed(0)
    model, x = KeyValues().eval(), torch.randn(2, 5, 8)
    program = opreg.export(model, (x,), target=18)
    assert program.output_names == (
        "output_0", "output_1.0.key", "output_1.0.value", "output_1.1.key", "output_1.1.value",
    )  # fmt: skip
    _, cache = program.run(x)
    assert isinstance(cache, DynamicCache) and cache.get_seq_length() == 5 and len(cache.layers) == 2
    torch.testing.assert_close(cache.layers[1].values, model(x)[1].layers[1].values, atol=ATOL, rtol=1e-4)
    program.verify(x, atol=ATOL)


class Detaching(nn.Module):
    """``detach``, ``contiguous`` and, on a fresh tensor, ``detach_`` (what a cache's ``torch.tensor([])``
    leaves): no-ops that sent the whole graph through torch's decomposition."""

    def forward(self, x):
        empty = torch.tensor([1.0, 2.0]).detach_()
        return x.detach().t().contiguous() * empty.sum()


def test_detach_translates_as_captured_without_the_decomposition():
    registry = opreg.default_registry()
    target = registry.target(18)
    x = torch.randn(3, 2)
    captured = _capture.capture(Detaching(), (x,), None, None)
    ops = {str(n.target) for n in captured.graph.nodes if n.op == "call_function"}
    assert {"aten.detach.default", "aten.detach_.default", "aten.contiguous.default"} <= ops
    program, _ = _plan.prepare(captured, registry, target)
    assert program is captured  # no retrace by torch's decomposition
    opreg.export(Detaching(), (x,), target=18).verify(x)


class Composite(nn.Module):
    """Ops torch.export keeps as the model wrote them (composite ones, not decomposed), which the
    models sweep found sending graphs through torch's decomposition: ``chunk`` (rotary halves),
    ``type_as``, ``where`` with a scalar, ``min``/``max`` of two tensors, ``1 - x`` (``rsub``),
    ``conv1d`` (audio front ends), ``conv3d`` (video), ``pad``, ``unflatten``, ``einsum`` and
    ``repeat_interleave`` by an int."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(3, 3, 3, padding=1)
        self.conv3 = nn.Conv3d(1, 2, 3, padding=1)

    def forward(self, x, mask, volume):
        a, b = x.chunk(2, dim=-1)
        y = torch.where(mask, a, -1.0) + torch.min(a, b) * torch.max(a, b) + mask.type_as(x)
        y = (1 - y) + self.conv1(y.unsqueeze(0))[0]
        pad = nn.functional.pad
        z = torch.einsum("ij,kj->ik", pad(y, (1, 0), value=2.0), pad(x.unflatten(1, (2, 3))[:, 0], (0, 1)))
        return z.repeat_interleave(2, dim=0), torch.where(mask, 0.5, b), self.conv3(volume)


def test_composite_ops_translate_as_captured_without_the_decomposition():
    registry = opreg.default_registry()
    target = registry.target(18)
    inputs = (torch.randn(3, 6), torch.tensor([[True, False, True]] * 3), torch.randn(1, 1, 3, 4, 4))
    captured = _capture.capture(Composite(), inputs, None, None)
    ops = {str(n.target) for n in captured.graph.nodes if n.op == "call_function"}
    expected = {
        "aten.chunk.default", "aten.type_as.default", "aten.where.ScalarOther", "aten.where.ScalarSelf",
        "aten.min.other", "aten.max.other", "aten.rsub.Scalar", "aten.conv1d.default", "aten.conv3d.default",
        "aten.pad.default", "aten.unflatten.int", "aten.einsum.default", "aten.repeat_interleave.self_int",
    }  # fmt: skip
    assert expected <= ops, sorted(expected - ops)
    program, _ = _plan.prepare(captured, registry, target)
    assert program is captured  # no retrace by torch's decomposition
    opreg.export(Composite(), inputs, target=18).verify(*inputs, atol=ATOL)


class CheckpointComposites(nn.Module):
    """Ops the checkpoint comparison with optimum found sending graphs through torch's
    decomposition, at dynamic sizes: ``square`` (RMS norms), ``multiply`` and ``unfold``
    (ConvBERT), ``repeat_interleave`` by an int (Cohere's and GLM's rotary), ``conv_transpose2d``
    (DPT), ``_weight_norm`` (HuBERT's positional convolution), ``floor_divide`` (GPT-OSS)."""

    def __init__(self) -> None:
        super().__init__()
        self.unfold = nn.Unfold((3, 1), padding=(1, 0))
        self.up = nn.ConvTranspose2d(4, 2, 2, stride=2)
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=1), dim=2)

    def forward(self, x, image):
        n = x.shape[1]
        y = torch.multiply(torch.square(x), x.repeat_interleave(2, dim=-1)[..., :4])
        patches = self.unfold(y.transpose(1, 2).unsqueeze(-1))
        position = torch.arange(n) // 2 + torch.floor_divide(torch.arange(n), 3)
        return patches, self.up(image), self.conv(y.transpose(1, 2)), position


def test_checkpoint_composites_translate_as_captured_at_dynamic_sizes():
    registry = opreg.default_registry()
    target = registry.target(18)
    inputs = (torch.randn(2, 5, 4), torch.randn(1, 4, 3, 5))
    seq, side = torch.export.Dim("seq", min=2, max=64), torch.export.Dim("side", min=2, max=64)
    dynamic = ({1: seq}, {2: side, 3: side + 2})
    captured = _capture.capture(CheckpointComposites(), inputs, None, dynamic)
    ops = {str(n.target) for n in captured.graph.nodes if n.op == "call_function"}
    expected = {
        "aten.square.default", "aten.multiply.Tensor", "aten.im2col.default", "aten.repeat_interleave.self_int",
        "aten.conv_transpose2d.input", "aten._weight_norm.default", "aten.floor_divide.default",
    }  # fmt: skip
    assert expected <= ops, sorted(expected - ops)
    program, _ = _plan.prepare(captured, registry, target)
    assert program is captured  # no retrace by torch's decomposition
    exported = opreg.export(CheckpointComposites(), inputs, target=18, dynamic_shapes=dynamic)
    exported.verify(*inputs, atol=ATOL)
    exported.verify(torch.randn(2, 9, 4), torch.randn(1, 4, 6, 8), atol=ATOL)


class ClampAfterAConversion(nn.Module):
    """GPT-OSS's experts: ids read ``.float()`` (a copy), then clamped in place."""

    def forward(self, x):
        ids = x.argsort(dim=-1)
        before = ids.float()
        ids.clamp_(max=2)
        return before, ids, ids.to(torch.int64) + 1


def test_an_in_place_op_after_a_dtype_conversion_translates_as_captured():
    registry = opreg.default_registry()
    inputs = (torch.randn(2, 5),)
    captured = _capture.capture(ClampAfterAConversion(), inputs, None, None)
    assert "aten.clamp_.default" in {str(n.target) for n in captured.graph.nodes}
    program, _ = _plan.prepare(captured, registry, registry.target(18))
    assert program is captured  # the in-place clamp is translated as clamp: the float copy does not see it
    opreg.export(ClampAfterAConversion(), inputs, target=18).verify(*inputs)


class MaskShapedLikeScores(nn.Module):
    """XLM's attention: the mask expanded to the scores' shape (``expand_as``, a view of the mask),
    then the scores masked in place; and a view of the scores themselves taken before, read after."""

    def forward(self, scores, mask):
        scores = scores * 1.5
        shaped = (mask == 0).expand_as(scores)
        scores.masked_fill_(shaped, -1e4)
        return scores.softmax(-1)

    @staticmethod
    def viewed(scores, mask):
        scores = scores * 1.5
        first = scores[0]  # a view of the scores, taken before the update and read after it
        scores.masked_fill_((mask == 0).expand_as(scores), -1e4)
        return scores.softmax(-1), first + 1


class ViewOfScores(nn.Module):
    def forward(self, scores, mask):
        return MaskShapedLikeScores.viewed(scores, mask)


@pytest.mark.parametrize(("model", "captured_as_is"), [(MaskShapedLikeScores(), True), (ViewOfScores(), False)])
def test_an_in_place_op_after_a_view_of_another_tensor_translates_as_captured(model, captured_as_is):
    registry = opreg.default_registry()
    inputs = (torch.randn(2, 3, 4), torch.tensor([[1, 1, 0, 1]]).expand(3, 4).contiguous())
    captured = _capture.capture(model, inputs, None, None)
    assert "aten.masked_fill_.Scalar" in {str(n.target) for n in captured.graph.nodes}
    program, _ = _plan.prepare(captured, registry, registry.target(18))
    assert (program is captured) is captured_as_is  # a view of the scores themselves: left to torch
    opreg.export(model, inputs, target=18).verify(*inputs)


class ScaledQueries(nn.Module):
    """DeBERTa's attention: the queries, a view of a linear's output, divided in place."""

    def __init__(self, read_base: bool = False) -> None:
        super().__init__()
        self.linear, self.read_base = nn.Linear(4, 8), read_base

    def forward(self, x):
        projected = self.linear(x)
        queries = projected.view(x.shape[0], 2, 4).permute(1, 0, 2)
        queries /= 2.0
        scores = queries @ queries.transpose(-1, -2)
        return (scores, projected * 3) if self.read_base else scores  # the base read after: it sees the division


@pytest.mark.parametrize("read_base", [False, True])
def test_an_in_place_op_on_a_view_nothing_else_sees_translates_as_captured(read_base):
    registry = opreg.default_registry()
    model, inputs = ScaledQueries(read_base), (torch.randn(3, 4),)
    captured = _capture.capture(model, inputs, None, None)
    assert "aten.div_.Tensor" in {str(n.target) for n in captured.graph.nodes}
    program, _ = _plan.prepare(captured, registry, registry.target(18))
    assert (program is captured) is not read_base  # a base read after the update: left to torch
    opreg.export(model, inputs, target=18).verify(*inputs)


class ShiftRight(nn.Module):
    """transformers' shift_tokens_right: writes into slices of a tensor it made (copy_, fill_), then
    masks it in place."""

    def forward(self, ids):
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = 2
        shifted.masked_fill_(shifted == 5, 1)
        return shifted


class ShiftRightMBart(nn.Module):
    """mBART's shift_tokens_right: a clone of the ids masked in place, then shifted by slices, its
    last real token moved to the front."""

    def forward(self, ids):
        shifted = ids.clone()
        shifted.masked_fill_(shifted == 8, 1)
        last = (shifted.ne(1).sum(dim=1) - 1).unsqueeze(-1)
        start = shifted.gather(1, last).squeeze(-1)
        shifted[:, 1:] = shifted[:, :-1].clone()
        shifted[:, 0] = start
        return shifted * 1


class MaskedCloneReadAfter(nn.Module):
    """The clone masked in place is read by its first name after a slice of it was updated (the
    capture reads the masked result there: made functional, and right)."""

    def forward(self, ids):
        shifted = ids.clone()
        masked = shifted.masked_fill_(shifted == 8, 1)
        masked[:, 1:] = 3
        return shifted + 0, masked * 1


class ViewReadAfterAnUpdate(nn.Module):
    """A view of a base read after another view of it was updated: left to torch's decomposition."""

    def forward(self, ids):
        grid = torch.zeros_like(ids)
        row = grid[0]
        grid[1:, 1] = 7
        return row + 1, grid * 2


class BaseReturned(nn.Module):
    """The updated base is an output of the graph: left to torch's decomposition."""

    def forward(self, ids):
        grid = torch.zeros_like(ids)
        grid[1:, 1] = 7
        return grid


@pytest.mark.parametrize(
    ("module", "retraced"),
    [
        (ShiftRight, False),
        (ShiftRightMBart, False),
        (MaskedCloneReadAfter, False),
        (ViewReadAfterAnUpdate, True),
        (BaseReturned, True),
    ],
)
def test_in_place_updates_of_slices_are_made_functional_without_a_retrace(module, retraced):
    registry = opreg.default_registry()
    ids = torch.randint(0, 9, (3, 6))
    seq = torch.export.Dim("seq", min=3, max=32)
    captured = _capture.capture(module(), (ids,), None, ({1: seq},))
    assert {"aten.copy_.default", "aten.fill_.Tensor"} & {str(n.target) for n in captured.graph.nodes}
    program, _ = _plan.prepare(captured, registry, registry.target(18))
    assert (program is not captured) == retraced
    exported = opreg.export(module(), (ids,), target=18, dynamic_shapes=({1: seq},))
    exported.verify(ids)
    exported.verify(torch.randint(0, 9, (3, 11)))


class Broadcasting(nn.Module):
    def forward(self, x, y):
        return torch.einsum("...ik,...j->ij", x, y)  # an ellipsis of two ranks: ONNX's Einsum cannot


def test_a_node_its_impls_predicates_reject_goes_through_the_decomposition():
    registry = opreg.default_registry()
    inputs = (torch.randn(1, 2, 3), torch.randn(3))
    captured = _capture.capture(Broadcasting(), inputs, None, None)
    decomposed, _ = _plan.prepare(captured, registry, registry.target(18))
    assert decomposed is not captured
    assert "aten.einsum.default" not in {str(n.target) for n in decomposed.graph.nodes}
    program = opreg.export(Broadcasting(), inputs, target=18)
    assert "Einsum" not in {n.op_type for n in program.model.graph}
    program.verify(*inputs, atol=ATOL)


def test_a_language_model_returning_its_cache_exports_and_matches_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    model = transformers.Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 6))
    program = opreg.export(model, (ids,), {"use_cache": True}, target=18)
    assert program.output_names == (
        "logits", "past_key_values.0.key", "past_key_values.0.value",
        "past_key_values.1.key", "past_key_values.1.value",
    )  # fmt: skip
    program.verify(ids, use_cache=True, atol=ATOL)
    out = program.run(ids, use_cache=True)
    assert isinstance(out, transformers.modeling_outputs.CausalLMOutputWithPast)
    assert out.past_key_values.get_seq_length() == 6
