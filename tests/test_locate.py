"""When the numbers differ, opreg says where: faults seeded in the middle of real models
(throwaway packs, a translation table and a rewrite rule, all real distributions) are
named by program.locate(), and only they; float drift names no impl."""

from __future__ import annotations

import json

import pytest
import torch
from torch._higher_order_ops.scan import scan

import opreg
from opreg.exporter import Location

REGISTER = """
import sys
from onnxscript.onnx_opset import opset18 as op

@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register_module(sys.modules[__name__])
"""

WRONG_GELU = (
    REGISTER
    + '''
@opreg.impl("aten::gelu", opset=18, priority=10)
def aten_gelu_sigmoid(self, approximate: str = "none"):
    """gelu(Tensor self, *, str approximate='none') -> Tensor, as x * sigmoid(1.702 x): close, not equal."""
    return op.Mul(self, op.Sigmoid(op.Mul(self, op.Constant(value_float=1.702))))
'''
)

HALF_RELU = (
    REGISTER
    + '''
@opreg.impl("aten::relu", opset=18, priority=10)
def aten_relu_half(self):
    """relu(Tensor self) -> Tensor, computed in float16: the wrong dtype inside, float32 outside."""
    half = op.Cast(self, to=10)
    return op.Cast(op.Max(half, op.CastLike(op.Constant(value_float=0.0), half)), to=1)
'''
)

SHIFTED_SLICE = (
    REGISTER
    + '''
@opreg.impl("aten::slice.Tensor", opset=18, priority=10)
def aten_slice_shifted(self, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1):
    """slice.Tensor(Tensor self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1), off by one."""
    start = 0 if start is None else start
    end = 2**62 if end is None else end
    return op.Slice(self, op.Constant(value_ints=[start + 1]), op.Constant(value_ints=[end + 1]),
                    op.Constant(value_ints=[dim]), op.Constant(value_ints=[step]))
'''
)

RANK_DROPPING_MEAN = (
    REGISTER
    + '''
@opreg.impl("aten::mean.dim", opset=18, priority=10)
def aten_mean_dropping(self, dim: list[int] | None = None, keepdim: bool = False, dtype: int = -1):
    """mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor, keepdim
    ignored; its axes computed, so translation cannot see the rank."""
    axes = op.Sub(op.Size(op.Shape(self)), op.Constant(value_ints=[1]))
    return op.ReduceMean(self, axes, keepdims=0)
'''
)

LEAKY_TABLE = """
import torch
from onnxscript.onnx_opset import opset18 as op

def leaky_relu(self):
    return op.LeakyRelu(self, alpha=0.01)

TABLE = {torch.ops.aten.relu.default: leaky_relu}
"""

WRONG_TANH_RULE = """
from onnxscript.rewriter import pattern

def _add_tanh(op, x, y):
    return op.Tanh(op.Add(x, y))

def _scaled_add_tanh(op, x, y):  # wrong: the residual branch is scaled (and no Add, so it matches once)
    return op.Tanh(op.Sub(x, op.Mul(y, op.Constant(value_float=-0.9))))

@opreg.hookimpl
def opreg_rewrite_rules(target):
    return [pattern.RewriteRule(_add_tanh, _scaled_add_tanh, name="AddTanh")]
"""


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention, then an MLP (the faults sit in its middle)."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.head = torch.nn.Linear(d, d)

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return self.head(torch.tanh(x))


class SlicingBlock(Block):
    """The block, keeping half of the features after the attention."""

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        half = x[..., 4:20]
        return torch.tanh(self.fc1(torch.cat([half, half], dim=-1)))


class CenteringBlock(Block):
    """The block, centring the MLP's input on its mean."""

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        x = x - x.mean(-1, keepdim=True)
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


class Deep(torch.nn.Module):
    """Residual tanh layers: float32 drifts from eager beyond a tolerance of 1e-6, no node is wrong."""

    def __init__(self, depth: int = 48, d: int = 32) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x


def _block_input():
    torch.manual_seed(0)
    return torch.randn(2, 5, 32)


def make_block():
    """``opreg export tests.test_locate:make_block``."""
    return Block().eval(), (_block_input(),)


def _cnn():
    torch.manual_seed(0)
    model = CNN()
    with torch.no_grad():  # batch norm statistics that are not the identity
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model.eval(), torch.randn(2, 3, 16, 16)


def _assert_only(location: Location, suspect: str, torch_op: str) -> None:
    """The report names ``suspect``, and nothing else, at nodes of ``torch_op``."""
    assert location.verdict == "fault", location
    assert location.suspects == (suspect,), location
    assert {d.torch_op for d in location.culprits} == {torch_op}, location
    assert location.first, location
    assert all(d.suspect == suspect for d in location.first), location
    assert all(not d.error.ok for d in location.culprits)


def test_a_wrong_impl_in_a_transformer_block_is_named_with_its_line(make_pack):
    module = make_pack("wronggelu", WRONG_GELU)
    model, x = Block().eval(), _block_input()
    program = opreg.export(model, (x,), plugins=["wronggelu"])
    location = program.locate(x)
    _assert_only(location, "wronggelu:aten_gelu_sigmoid", "aten::gelu.default")
    (culprit,) = location.culprits
    assert culprit.pack == "wronggelu"
    path, line = culprit.impl_source.rsplit(":", 1)
    assert path.endswith(f"{module}/__init__.py") and int(line) > 0
    assert culprit.source.startswith(__file__) and culprit.module == ""
    assert culprit.first and culprit.error.ratio > 10 and culprit.local is not None and culprit.local.ratio > 10
    assert culprit.onnx_ops == ("Mul", "Sigmoid", "Mul")
    assert location.grew_most is not None and location.grew_most.node == culprit.node
    assert "wronggelu:aten_gelu_sigmoid is wrong at node gelu" in str(location)
    # what follows the fault diverges too, but each such node is right on its own inputs
    assert len(location.divergences) > 1 and all(not d.faulty for d in location.divergences if d is not culprit)


def test_verify_locate_puts_the_report_in_the_error(make_pack):
    make_pack("wronggelu", WRONG_GELU)
    model, x = Block().eval(), _block_input()
    program = opreg.export(model, (x,), plugins=["wronggelu"])
    with pytest.raises(opreg.VerificationError, match="wronggelu:aten_gelu_sigmoid is wrong at node gelu") as caught:
        program.verify(x, locate=True)
    assert caught.value.location.suspects == ("wronggelu:aten_gelu_sigmoid",)
    with pytest.raises(opreg.VerificationError) as plain:
        program.verify(x)
    assert plain.value.location is None and "is wrong at" not in str(plain.value)


def test_a_correct_export_locates_nothing():
    model, x = Block().eval(), _block_input()
    program = opreg.export(model, (x,))
    location = program.locate(x)
    assert location.verdict == "ok" and location.divergences == () and location.suspects == ()
    assert location.compared >= 25  # every value of the block, attention's reshapes included
    program.verify(x, locate=True)


def test_a_translation_table_with_wrong_values_in_a_cnn_is_named(make_pack):
    make_pack("leaky", LEAKY_TABLE, header="", attr="TABLE")
    model, x = _cnn()
    registry = opreg.default_registry(plugins=["leaky"], prefer={"aten::relu": "leaky"})
    program = opreg.export(model, (x,), registry=registry)
    location = program.locate(x)
    _assert_only(location, "leaky:leaky_relu", "aten::relu.default")
    assert [d.node for d in location.first] == ["relu"]  # the first relu; the second is wrong too
    assert {d.node for d in location.culprits} == {"relu", "relu_1"}


def test_an_impl_computing_in_the_wrong_dtype_in_a_cnn_is_named(make_pack):
    make_pack("halfrelu", HALF_RELU)
    model, x = _cnn()
    program = opreg.export(model, (x,), plugins=["halfrelu"])
    location = program.locate(x, rtol=1e-5, atol=1e-5)  # float16 rounds at 5e-4: out of a float32 tolerance
    _assert_only(location, "halfrelu:aten_relu_half", "aten::relu.default")
    assert all(d.onnx_ops == ("Cast", "Max", "Cast") for d in location.culprits), location


def test_an_off_by_one_slice_is_named(make_pack):
    make_pack("shifted", SHIFTED_SLICE)
    model, x = SlicingBlock().eval(), _block_input()
    program = opreg.export(model, (x,), plugins=["shifted"])
    location = program.locate(x)
    _assert_only(location, "shifted:aten_slice_shifted", "aten::slice.Tensor")
    (culprit,) = location.culprits
    assert culprit.source.startswith(__file__)


def test_a_wrong_rank_is_refused_at_export_naming_the_impl(make_pack):
    make_pack("droprank", RANK_DROPPING_MEAN)
    model, x = CenteringBlock().eval(), _block_input()
    with pytest.raises(opreg.ExportError, match=r"made by impl droprank:aten_mean_dropping for aten::mean.dim") as e:
        opreg.export(model, (x,), plugins=["droprank"])
    assert f"{__file__}:" in str(e.value)  # the model's line, not only a node name the user never wrote


def test_a_rewrite_rule_with_wrong_values_is_named_not_the_impls_it_replaced(make_pack):
    make_pack("addtanh", WRONG_TANH_RULE)
    model, x = Block().eval(), _block_input()
    program = opreg.export(model, (x,), plugins=["addtanh"])
    fired = {p.key: p.value for p in program.model_proto.metadata_props}["opreg.rewrites"]
    assert fired.startswith("addtanh:AddTanh=")
    location = program.locate(x)
    assert location.verdict == "fault" and location.suspects == ("addtanh:AddTanh",), location
    (culprit,) = location.culprits
    assert culprit.rules == ("addtanh:AddTanh",) and culprit.suspect == "addtanh:AddTanh"
    assert culprit.impl in ("core:aten_add", "core:aten_tanh")  # the node's own impl is reported, not blamed
    assert "Mul" in culprit.onnx_ops and culprit.first


def test_float_drift_in_a_deep_model_names_no_impl():
    torch.manual_seed(0)
    model, x = Deep().eval(), torch.randn(4, 32)
    program = opreg.export(model, (x,))
    with pytest.raises(opreg.VerificationError) as caught:  # a naive tolerance fails ...
        program.verify(x, rtol=1e-6, atol=1e-6, locate=True)
    location = caught.value.location
    assert location.verdict == "drift", location  # ... but no node is wrong
    assert location.suspects == () and location.culprits == ()
    assert location.divergences and all(d.local is not None and d.local.ok for d in location.divergences)
    grew = location.grew_most
    assert grew is not None and grew.added < 0.5 * max(s.ratio for s in location.path)  # no single jump
    assert "no node computes another function than torch" in str(location)
    program.verify(x, rtol=1e-4, atol=1e-4)


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8),
            torch.nn.Softmax(-1),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)


def test_zero_tolerances_call_float_drift_drift_and_still_find_a_wrong_impl(make_pack):
    """Round 4: with ``rtol=atol=0`` every core op whose ONNX Runtime kernel rounds differently from
    torch's (a few 1e-7) was called wrong. A node is judged against its replay with at least
    ``torch.testing``'s tolerances for its dtype; the values themselves with the user's."""
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    location = opreg.export(Mixed().eval(), (x,)).locate(x, rtol=0, atol=0)
    assert location.verdict == "drift" and location.suspects == (), location
    assert location.divergences and all(d.local is not None and d.local.ok for d in location.divergences)
    text = str(location)
    assert "no node computes another function than torch" in text and "nan" not in text
    assert "beyond any multiple of the tolerance" in text
    assert all(d.error.max_abs < 1e-5 for d in location.divergences)
    make_pack("wronggelu", WRONG_GELU)
    model, block_input = Block().eval(), _block_input()
    wrong = opreg.export(model, (block_input,), plugins=["wronggelu"]).locate(block_input, rtol=0, atol=0)
    assert wrong.verdict == "fault" and wrong.suspects == ("wronggelu:aten_gelu_sigmoid",), wrong


class AllRandom(torch.nn.Module):
    def forward(self, x):
        return torch.rand_like(x) * 2


def test_a_model_of_random_values_only_says_nothing_was_compared():
    """Round 4: it said "every one of 0 intermediate values matches eager PyTorch"."""
    x = torch.randn(3, 4)
    location = opreg.export(AllRandom().eval(), (x,)).locate(x)
    assert location.compared == 0
    assert str(location).splitlines() == [
        "no intermediate value could be compared with eager PyTorch",
        "not compared: 2 value(s) drawn by or computed from random ops (aten::rand_like.default); they match "
        "eager only in distribution (opreg.testing.Distribution)",
    ]


def test_the_report_is_json_ready(make_pack):
    make_pack("wronggelu", WRONG_GELU)
    model, x = Block().eval(), _block_input()
    location = opreg.export(model, (x,), plugins=["wronggelu"]).locate(x)
    data = json.loads(json.dumps(location.to_dict()))
    assert data["verdict"] == "fault" and data["suspects"] == ["wronggelu:aten_gelu_sigmoid"]
    (culprit,) = [d for d in data["divergences"] if d["faulty"]]
    assert culprit["torch_op"] == "aten::gelu.default" and culprit["impl_source"]
    assert culprit["error"]["ratio"] > 1 and data["grew_most"]["node"] == "gelu"


def test_export_verify_locate_prints_the_table_and_json(make_pack, capsys, tmp_path):
    from tests.test_cli import run

    make_pack("wronggelu", WRONG_GELU)
    output = tmp_path / "block.onnx"
    model = "tests.test_locate:make_block"
    code, out, err = run(capsys, "export", model, "-o", str(output), "--verify", "-p", "wronggelu")
    assert code == 1 and "rerun with --locate" in err
    code, out, err = run(capsys, "export", model, "-o", str(output), "--verify", "--locate", "-p", "wronggelu")
    assert code == 1 and "does not match eager PyTorch" in err
    assert "where it goes wrong" in out and "wronggelu:aten_gelu_sigmoid" in out and "WRONG" in out
    assert "wronggelu:aten_gelu_sigmoid is wrong at node gelu" in out
    code, out, _ = run(capsys, "export", model, "-o", str(output), "--verify", "--locate", "--json", "-p", "wronggelu")
    data = json.loads(out)
    assert code == 1 and data["verified"] is False and data["location"]["suspects"] == ["wronggelu:aten_gelu_sigmoid"]
    code, out, _ = run(
        capsys, "export", model, "-o", str(output), "--verify", "--locate", "--json", "-p", "no:wronggelu"
    )
    assert code == 0 and json.loads(out)["verified"] is True


# -- control flow, random ops, complex values ---------------------------------------------


class Scanned(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, xs):
        def step(carry, x):
            carry = torch.nn.functional.gelu(self.lin(x) + carry)
            return carry, carry.clone()

        last, ys = scan(step, torch.zeros(2, 8), xs)
        return torch.relu(ys).sum(0) + last


def test_a_fault_inside_a_scan_body_names_the_scan_and_the_impls_its_body_used(make_pack):
    make_pack("wronggelu", WRONG_GELU)
    torch.manual_seed(0)
    model, xs = Scanned().eval(), torch.randn(4, 2, 8)
    program = opreg.export(model, (xs,), plugins=["wronggelu"])
    location = program.locate(xs)
    assert location.verdict == "fault", location
    (culprit,) = location.culprits
    assert culprit.torch_op == "scan" and culprit.impl == "opreg:scan"
    assert "wronggelu:aten_gelu_sigmoid" in culprit.body_impls
    assert any("compared at its outputs" in note for note in location.notes)
    # the body, exported alone and located on its first iteration, names the impl inside it
    assert culprit.inner is not None and culprit.inner.suspects == ("wronggelu:aten_gelu_sigmoid",)
    assert location.suspects == ("wronggelu:aten_gelu_sigmoid",)
    assert "inside its body" in str(location)


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        def true_fn(x):
            return torch.nn.functional.gelu(self.lin(x))

        def false_fn(x):
            return torch.tanh(x)

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,)) * 2


def test_a_fault_inside_a_cond_branch_is_named_from_inside_the_branch_taken(make_pack):
    make_pack("wronggelu", WRONG_GELU)
    x = torch.ones(2, 8)
    program = opreg.export(Branchy().eval(), (x,), plugins=["wronggelu"])
    location = program.locate(x)
    (culprit,) = location.culprits
    assert culprit.torch_op == "cond" and location.suspects == ("wronggelu:aten_gelu_sigmoid",), location
    assert program.locate(-x).verdict == "ok"  # the other branch has no gelu


class Noisy(torch.nn.Module):
    def forward(self, x):
        noise = torch.randn_like(x)
        return torch.sin(x) * 2, x + noise


def test_random_ops_are_left_out_with_a_note():
    x = torch.randn(3, 4)
    program = opreg.export(Noisy().eval(), (x,))
    location = program.locate(x)
    assert location.verdict == "ok", location
    assert any("random ops (aten::randn_like.default)" in note for note in location.notes)


class Spectral(torch.nn.Module):
    def forward(self, x):
        spectrum = torch.fft.rfft(x) * 2
        return torch.fft.irfft(spectrum * spectrum.conj(), n=x.shape[-1])


def test_complex_values_are_compared_as_real_pairs():
    torch.manual_seed(0)
    x = torch.randn(2, 16)
    program = opreg.export(Spectral().eval(), (x,))
    location = program.locate(x)
    assert location.verdict == "ok", location
    assert location.compared >= 3


class HalfSum(torch.nn.Module):
    """issue 53: a float16 Linear, GELU and a sum over 64 values, whose verify fails by float16's rounding."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)).sum(-1)


WRONG_HALF_SUM = (
    REGISTER
    + '''
@opreg.impl("aten::sum.dim_IntList", opset=18, priority=10)
def aten_sum_dim_in_half(self, dim: list[int] | None, keepdim: bool = False, dtype: int | None = None):
    """sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor, one
    percent short."""
    return op.Mul(op.ReduceSum(self, op.Constant(value_ints=list(dim)), keepdims=int(keepdim)), op.CastLike(0.99, self))
'''
)


def test_float16_rounding_names_no_impl_and_a_wrong_float16_impl_is_named(make_pack):
    """issue 53: --locate after a float16 verify called core:aten_sum_dim wrong over a few units in the
    last place. Each value is compared at its dtype's tolerance, and a node is wrong only beyond four
    units in the last place of its replay (two correct float16 kernels round that far apart): drift, no
    suspect. A sum that is wrong by 1% is still named."""
    torch.manual_seed(0)
    model, x = HalfSum().half(), torch.randn(4, 16, 64).half()
    program = opreg.export(model, (x,))
    with pytest.raises(opreg.VerificationError, match=r"float16's default") as caught:
        program.verify(x, locate=True)
    location = caught.value.location
    assert (location.rtol, location.atol) == (None, None)
    assert location.verdict == "drift" and location.suspects == (), location
    assert "each dtype's default tolerances" in str(location)
    make_pack("wronghalfsum", WRONG_HALF_SUM)
    wrong = opreg.export(model, (x,), plugins=["wronghalfsum"]).locate(x)
    assert wrong.suspects == ("wronghalfsum:aten_sum_dim_in_half",), wrong


class HalfGridSample(torch.nn.Module):
    def forward(self, x, grid):
        return torch.nn.functional.grid_sample(x, grid, align_corners=False)


def test_a_float16_op_torchs_own_kernel_rounds_worse_is_not_called_wrong():
    """torch's float16 CPU grid_sampler rounds each step (off by up to 0.125 here); the core pack's
    computes in float32 and rounds once. Its replay in float16 disagrees by thousands of tolerances,
    its replay in float32, rounded once, not at all: drift, no suspect."""
    torch.manual_seed(0)
    x, grid = (torch.randn(1, 2, 8, 8) * 30).half(), (torch.rand(1, 6, 6, 2) * 2 - 1).half()
    location = opreg.export(HalfGridSample(), (x, grid)).locate(x, grid)
    (divergence,) = location.divergences
    assert divergence.error.ratio > 100 and divergence.local is not None and divergence.local.ratio == 0.0
    assert location.verdict == "drift" and location.suspects == (), location
