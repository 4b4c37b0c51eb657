"""Core impls of softmax, normalization, attention and pooling/resampling ops,
exported and run in ONNX Runtime against eager PyTorch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opreg
from opreg_core_ops.ops import normalization
from tests.optest import NEWEST, OPSETS, Lambda, check, onnx_ops

torch.manual_seed(0)


# -- softmax ----------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_softmax_family(opset):
    x = torch.randn(2, 3, 5)
    program = check(
        lambda x, s: (
            F.softmax(x, -1),
            F.log_softmax(x, 1),
            F.softmax(x, 0, dtype=torch.float64),
            F.log_softmax(x, -1, dtype=torch.float64),
            F.softmax(s, 0),
        ),
        x,
        torch.tensor(1.5),
        opset=opset,
    )
    ops = onnx_ops(program)
    assert "Softmax" in ops and "LogSoftmax" in ops


# -- layer norm -----------------------------------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(opset, affine):
    norm = nn.LayerNorm([3, 8], eps=1e-3, elementwise_affine=affine)
    if affine:
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
    program = check(norm, torch.randn(2, 3, 8), opset=opset)
    assert "LayerNormalization" in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
def test_native_layer_norm_statistics(opset):
    weight = torch.randn(8)
    x = torch.randn(2, 3, 8)
    program = check(lambda x: torch.ops.aten.native_layer_norm(x, [8], weight, None, 1e-5), x, opset=opset)
    assert "LayerNormalization" in onnx_ops(program)


def test_layer_norm_float16():
    check(nn.LayerNorm(8).half(), torch.randn(4, 8).half(), opset=18)


def test_layer_norm_decomposition_fallback():
    """The priority -1 decomposition, chosen over LayerNormalization by a user override."""
    registry = opreg.default_registry().copy()
    registry.register("aten::layer_norm", normalization.aten_layer_norm_decomposed, opset=18)
    registry.register("aten::native_layer_norm", normalization.aten_native_layer_norm_decomposed, opset=18)
    norm = nn.LayerNorm(8)
    nn.init.normal_(norm.weight)
    program = check(
        lambda x: (norm(x), torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5)),
        torch.randn(2, 3, 8),
        opset=18,
        registry=registry,
    )
    assert "LayerNormalization" not in onnx_ops(program)
    assert "ReduceMean" in onnx_ops(program)


# -- group norm --------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", sorted({18, 21, NEWEST}))
def test_group_norm(opset):
    norm = nn.GroupNorm(2, 6)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    plain = nn.GroupNorm(3, 6, affine=False)
    program = check(lambda x, y: (norm(x), plain(y)), torch.randn(2, 6, 4, 5), torch.randn(2, 6, 7), opset=opset)
    # InstanceNormalization of the grouped view at every opset: ONNX Runtime runs it fastest (bench/group_norm.py)
    assert "InstanceNormalization" in onnx_ops(program) and "GroupNormalization" not in onnx_ops(program)


@pytest.mark.parametrize("opset", sorted({18, 21, NEWEST}))
def test_native_group_norm_statistics(opset):
    weight, bias = torch.randn(4), torch.randn(4)
    check(
        lambda x: torch.ops.aten.native_group_norm(x, weight, bias, 2, 4, 9, 2, 1e-5),
        torch.randn(2, 4, 3, 3),
        opset=opset,
    )


# -- RMS norm ------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", sorted({18, 23, NEWEST}))
def test_rms_norm(opset):
    norm = nn.RMSNorm(8)
    nn.init.normal_(norm.weight)
    wide = nn.RMSNorm([3, 8], eps=1e-3, elementwise_affine=False)
    program = check(lambda x: (norm(x), wide(x)), torch.randn(2, 3, 8), opset=opset)
    assert ("RMSNormalization" in onnx_ops(program)) == (opset >= 23)


@pytest.mark.parametrize("opset", OPSETS)
def test_rms_norm_float16(opset):
    check(nn.RMSNorm(8).half(), torch.randn(4, 8).half(), opset=opset)


# -- batch and instance norm -----------------------------------------------------------------


def _trained_batch_norm(module):
    module.running_mean.normal_()
    module.running_var.uniform_(0.5, 2.0)
    if module.affine:
        nn.init.normal_(module.weight)
        nn.init.normal_(module.bias)
    return module.eval()


@pytest.mark.parametrize("opset", OPSETS)
def test_batch_norm_eval(opset):
    bn2d = _trained_batch_norm(nn.BatchNorm2d(4))
    bn1d = _trained_batch_norm(nn.BatchNorm1d(4, affine=False))
    program = check(lambda x, y: (bn2d(x), bn1d(y)), torch.randn(2, 4, 5, 5), torch.randn(3, 4), opset=opset)
    assert "BatchNormalization" in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
def test_instance_norm(opset):
    plain = nn.InstanceNorm2d(4)
    tracked = _trained_batch_norm(nn.InstanceNorm1d(4, affine=True, track_running_stats=True))
    check(lambda x, y: (plain(x), tracked(y)), torch.randn(2, 4, 5, 5), torch.randn(2, 4, 6), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_batch_norm_in_training_normalises_with_the_batch_statistics(opset):
    """train(): torch.export turns BatchNorm2d into _native_batch_norm_legit_functional; the output
    matches eager (check() would put the model in eval(), so this exports it as it is), and with
    state="io" so do the updated running statistics (verify compares them as outputs)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _trained_batch_norm(nn.BatchNorm2d(4)).train(), nn.ReLU()).train()
    x = torch.randn(2, 3, 8, 8)
    program = opreg.export(model, (x,), target=opset, state="io")
    stats = ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert [(s.input, s.output) for s in program.state_slots] == [(k, f"{k}_out") for k in stats]
    nodes = program.exported_program.graph.nodes
    assert any(n.target is torch.ops.aten._native_batch_norm_legit_functional.default for n in nodes)
    assert "BatchNormalization" not in onnx_ops(program)  # batch statistics, not the running ones
    program.verify(x, rtol=1e-5, atol=1e-5)
    program.verify(torch.randn(2, 3, 8, 8) * 3 + 1, rtol=1e-5, atol=1e-5)


_BN_FUNCTIONAL = torch.ops.aten._native_batch_norm_legit_functional.default


def _functional_batch_norms(x, weight, bias, mean, var, flat):
    return (
        _BN_FUNCTIONAL(x, weight, bias, mean, var, True, 0.1, 1e-5),
        _BN_FUNCTIONAL(flat, None, None, mean, var, True, 0.7, 0.5),  # (N, C), no affine
        _BN_FUNCTIONAL(x, weight, bias, mean, var, False, 0.1, 1e-5),  # eval: running stats, unchanged
    )


def _functional_batch_norm_inputs(dtype):
    torch.manual_seed(0)
    inputs = (torch.randn(3, 4, 5, 2), torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4) + 0.5)
    return tuple(t.to(dtype) for t in (*inputs, torch.randn(6, 4) * 2 + 1))


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_native_batch_norm_legit_functional_returns_the_new_running_statistics(dtype, opset):
    """Output, save_mean, save_invstd (rstd of the biased variance) and the running statistics
    updated with momentum (the unbiased variance), exactly as eager returns them."""
    check(_functional_batch_norms, *_functional_batch_norm_inputs(dtype), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_native_batch_norm_legit_functional_float16(opset):
    """float16: computed in float32. The running statistics come out in float32, as torch.export's
    graph declares them, while torch's eager CPU kernel returns float16: equal values, another dtype."""
    inputs = _functional_batch_norm_inputs(torch.float16)
    program = opreg.export(Lambda(_functional_batch_norms), inputs, target=opset)
    for got, expected in zip(program.run(*inputs), _functional_batch_norms(*inputs), strict=True):
        for index, (g, e) in enumerate(zip(got, expected, strict=True)):
            running = index >= 3  # running_mean_out, running_var_out
            assert g.dtype == (torch.float32 if running else torch.float16)
            torch.testing.assert_close(g, e.to(g.dtype), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("opset", OPSETS)
def test_batch_norm_of_an_empty_input_is_a_copy(opset):
    """torch returns a copy of an empty input, also a 1-D one (which BatchNormalization cannot take)."""
    empty, stats = torch.zeros(0), torch.zeros(0)
    check(F.batch_norm, empty, stats, stats, opset=opset)
    check(F.batch_norm, torch.zeros(0, 3), torch.zeros(3), torch.ones(3), opset=opset)


# -- attention ----------------------------------------------------------------------------------

Q, K, V = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 3)
_BOOL_MASK = torch.rand(5, 6) > 0.4
_BOOL_MASK[:, 0] = True
_BOOL_MASK[2] = False  # a row that attends to nothing: torch gives zeros
_FLOAT_MASK = torch.randn(2, 1, 5, 6)
_KEY_MASK = torch.randn(2, 1, 1, 6)  # one row for every query (a padding mask, diffusers' LTX-Video)

ATTENTION = {
    "plain": (F.scaled_dot_product_attention, (Q, K, V)),
    "causal_scale": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3), (Q, K, V)),
    "bool_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), (Q, K, V, _BOOL_MASK)),
    "float_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), (Q, K, V, _FLOAT_MASK)),
    "key_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), (Q, K, V, _KEY_MASK)),
    "gqa": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        (torch.randn(2, 8, 5, 8), K, V),
    ),
    "3d": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (Q[0], K[0], V[0])),
}


@pytest.mark.parametrize("opset", sorted({18, 23, NEWEST}))
@pytest.mark.parametrize("case", ATTENTION)
def test_scaled_dot_product_attention(case, opset):
    fn, inputs = ATTENTION[case]
    # a softmax-weighted sum of 6 products per element: float32 rounding differs by order
    program = check(fn, *inputs, opset=opset, rtol=1e-4, atol=1e-5)
    uses_attention = "Attention" in onnx_ops(program)
    assert uses_attention == (opset >= 23 and case != "3d")


class _CausalAttention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_attention_dynamic_sequence():
    seq = torch.export.Dim("seq", min=2, max=64)
    program = check(_CausalAttention(), Q, Q, Q, opset=18, rtol=1e-4, dynamic_shapes=({2: seq}, {2: seq}, {2: seq}))
    assert program.model_proto.graph.input[0].type.tensor_type.shape.dim[2].dim_param == "seq"
    assert "Trilu" in onnx_ops(program)  # the mask is built from the lengths the model runs with


class _CausalLayers(nn.Module):
    """Causal attention three times over, with the lengths of the first (5 queries, 6 keys)."""

    def forward(self, q, k, v):
        for _ in range(3):
            q = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return q


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_static_causal_mask_is_one_constant_every_layer_shares(dtype):
    """Static lengths: the mask is a constant, written once for every layer, not built from
    the shapes in each layer (a Trilu, an Expand, two Shapes and a Concat per layer)."""
    q, k, v = (t.to(dtype) for t in (Q, K, torch.randn(2, 4, 6, 8)))
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 2e-3}
    program = check(_CausalLayers(), q, k, v, opset=18, **tolerance)
    graph = program.model_proto.graph
    assert not {"Trilu", "Shape", "Expand"} & set(onnx_ops(program))
    masks = [i for i in graph.initializer if list(i.dims) == [5, 6]]
    assert len(masks) == 1
    mask = onnx.numpy_helper.to_array(masks[0])
    assert mask.dtype == torch.empty(0, dtype=dtype).numpy().dtype
    assert (mask == np.triu(np.full((5, 6), -np.inf), 1)).all()


class _PositionMask(nn.Module):
    """sdpa with a bool mask made from positions, as transformers 5's mask functions trace one for a
    model without padding (``arange(n) >= 0`` broadcast to (batch, 1, S, S)); ``first`` > 0 masks
    out the first keys, a mask that does mask."""

    def __init__(self, first: int = 0, compare=torch.ge) -> None:
        super().__init__()
        self.first, self.compare = first, compare

    def forward(self, q, k, v):
        n = k.shape[2]
        mask = self.compare(torch.arange(n), self.first)[None, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(q.shape[0], 1, q.shape[2], n))


_SEQUENCE = torch.export.Dim("sequence", min=2, max=64)


_MASK_INPUT = {"Attention": 3, "com.microsoft::MultiHeadAttention": 5}
"""Where each attention node the two targets write takes its mask (or bias)."""


@pytest.mark.parametrize("target", [23, "onnxruntime"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize(
    ("first", "compare", "dropped"),
    [(0, torch.ge, True), (-1, torch.gt, True), (1, torch.ge, False), (0, torch.gt, False)],
    ids=["ge0", "gt-1", "ge1", "gt0"],
)
def test_an_attention_mask_true_everywhere_is_dropped(first, compare, dropped, dynamic, target):
    """The lean pass drops an attention node's bool mask (ai.onnx Attention at 23), or the bias
    made of it (com.microsoft MultiHeadAttention at ``onnxruntime``), where the graph proves the mask
    true at every size (opreg.exporter.passes.masks: ONNX Runtime's Attention runs up to 2.2x
    slower with one); a mask that masks the first key stays. Numerics against eager at the example
    and at a second length."""
    q, k, v = (torch.randn(2, 4, 7, 8) for _ in range(3))
    dims = ({2: _SEQUENCE},) * 3 if dynamic else None
    model = _PositionMask(first, compare)
    program = check(model, q, k, v, opset=target, rtol=1e-4, atol=1e-5, dynamic_shapes=dims)
    ops = onnx_ops(program)
    (kind,) = [op for op in ops if op in _MASK_INPUT]
    (attention,) = [n for n, op in zip(program.model_proto.graph.node, ops, strict=True) if op == kind]
    assert (len(attention.input) <= _MASK_INPUT[kind]) == dropped
    if dropped and target == 23:
        assert ops == ["Attention"]  # the mask's nodes went with it
    if dropped and target == "onnxruntime":  # and "the row has a key", ReduceMax(Cast(mask)), with them
        assert not {"ReduceMax", "Cast", "Mul"} & set(ops)
    if dynamic:
        longer = tuple(torch.randn(2, 4, 12, 8) for _ in range(3))
        program.verify(*longer, rtol=1e-4, atol=1e-5)


class _TimesPositionOnes(nn.Module):
    """``tanh(x * ones)``, the ones made from positions (``arange(n) >= 0`` cast to float) over ``y``'s
    columns: of ``x``'s shape when ``x`` has them, else broadcasting ``x`` (batch, 1) to (batch, n)."""

    def forward(self, x, y):
        return torch.tanh(x * (torch.arange(y.shape[1]) >= 0).float())  # a model output is never replaced


@pytest.mark.parametrize(("columns", "dropped"), [(9, True), (1, False)], ids=["same-shape", "broadcast"])
def test_a_product_with_ones_is_dropped_only_where_it_keeps_the_shape(columns, dropped):
    """The mask pass's ``Mul(x, ones)`` -> ``x`` (opreg.exporter.passes.masks) only where the product
    has ``x``'s shape: ``x`` of (batch, 1) times ones of (batch, 9) is a broadcast, kept."""
    rows = torch.export.Dim("rows", min=2, max=64)
    n = torch.export.Dim("n", min=2, max=64)
    x, y = torch.randn(3, columns), torch.randn(3, 9)
    dims = ({0: rows, 1: n} if columns > 1 else {0: rows}, {0: rows, 1: n})
    program = check(_TimesPositionOnes(), x, y, opset=23, dynamic_shapes=dims)
    assert ("Mul" not in onnx_ops(program)) == dropped
    program.verify(torch.randn(5, columns if columns == 1 else 12), torch.randn(5, 12))


class _TimesOnesWeight(nn.Module):
    """``tanh(x * weight)``, the weight all ones at export time (an RMS norm's starts so)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(9))

    def forward(self, x):
        return torch.tanh(x * self.weight)


def test_a_product_with_a_weight_of_ones_is_kept():
    """The mask pass reads no weight's values: a weight of ones now may be trained or loaded later,
    and the fusion tools look for an RMS norm's ``Mul`` by its weight."""
    program = check(_TimesOnesWeight(), torch.randn(3, 9), opset=23)
    assert "Mul" in onnx_ops(program)


# -- pooling ------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_adaptive_max_pool(opset):
    """Values and torch's per-plane indices, for even bins (MaxPool) and uneven ones (per bin)."""
    program = check(
        lambda a, b: (F.adaptive_max_pool2d(a, (2, 3), return_indices=True), F.adaptive_max_pool3d(b, (1, 2, 2), True)),
        torch.randn(2, 3, 4, 9),
        torch.randn(1, 2, 3, 4, 6),
        opset=opset,
    )
    assert onnx_ops(program).count("MaxPool") == 2
    ties = torch.tensor([[[[1.0, 3, 3, 0, 2], [3, 1, 0, 3, 2], [0, 0, 1, 1, 1], [2, 3, 3, 0, 0]]]])
    uneven = check(
        lambda a, b: (F.adaptive_max_pool2d(a, (3, 3), True), F.adaptive_max_pool3d(b, (2, 3, 4), True)),
        ties,
        torch.randn(2, 3, 3, 4, 5),
        opset=opset,
    )
    assert "MaxPool" not in onnx_ops(uneven) and "ArgMax" in onnx_ops(uneven)


def test_max_pool2d_backward_adds_each_gradient_at_its_maximum():
    """Overlapping windows (stride < kernel) send two gradients to one maximum: they add up."""

    def grad(x, g):
        _, indices = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [1, 2], [1, 1], [1, 1], False)
        return torch.ops.aten.max_pool2d_with_indices_backward(g, x, [3, 3], [1, 2], [1, 1], [1, 1], False, indices)

    x = torch.randn(2, 3, 5, 6)
    program = check(grad, x, torch.randn(2, 3, 5, 3), opset=18)
    assert "ScatterElements" in onnx_ops(program)


def test_new_empty_strided_and_asserted_storage_offsets():
    """tensor_split at tensor indices: torch's decomposition asserts each piece's storage offset >= 0."""
    program = check(torch.tensor_split, torch.randn(5, 4), torch.tensor([1, 3]), opset=18)
    assert "Slice" in onnx_ops(program)
    empty = opreg.export(Lambda(lambda x: x.new_empty_strided((2, 3), (3, 1)) * 0 + 1), (torch.randn(2),), target=18)
    assert empty.run(torch.randn(2)).shape == (2, 3)


@pytest.mark.parametrize("opset", OPSETS)
def test_max_pool(opset):
    pool1 = nn.MaxPool1d(3, 2, 1)
    pool2 = nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True)
    pool3 = nn.MaxPool3d(2)
    program = check(
        lambda a, b, c: (pool1(a), pool2(b), pool3(c), pool2(b[0])),
        torch.randn(1, 2, 9),
        torch.randn(2, 3, 9, 9),
        torch.randn(1, 2, 4, 4, 6),
        opset=opset,
    )
    assert "MaxPool" in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
def test_max_pool_indices_match_torch(opset):
    pool2 = nn.MaxPool2d(3, 2, 1, return_indices=True)
    pool3 = nn.MaxPool3d(2, return_indices=True)
    check(lambda a, b: (*pool2(a), *pool3(b)), torch.randn(2, 3, 8, 7), torch.randn(1, 2, 4, 4, 6), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_avg_pool(opset):
    pools = [
        nn.AvgPool2d(3, 2, 1),
        nn.AvgPool2d(3, 2, 1, ceil_mode=True),
        nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
        nn.AvgPool2d(2, divisor_override=3),
    ]
    pool3 = nn.AvgPool3d(2, 1, 1, count_include_pad=False, divisor_override=None)
    pool1 = nn.AvgPool1d(3, 2, 1)
    program = check(
        lambda x, y, z: (*(p(x) for p in pools), pool3(y), pool1(z)),
        torch.randn(2, 3, 6, 7),
        torch.randn(1, 2, 4, 4, 5),
        torch.randn(1, 2, 9),
        opset=opset,
    )
    assert "AveragePool" in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
def test_avg_pool_divisor_override_and_integers(opset):
    """divisor_override (with ceil_mode too) and integer inputs: window sums over slices, torch's divisors."""
    pools = [
        nn.AvgPool2d(3, 2, 1, ceil_mode=True, divisor_override=2),
        nn.AvgPool2d((4, 4), (2, 3), 1, ceil_mode=True, count_include_pad=False, divisor_override=2),
    ]
    pool3 = nn.AvgPool3d((2, 3, 4), (1, 2, 2), (0, 1, 2), ceil_mode=True, divisor_override=2)
    pool1 = nn.AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False)
    check(
        lambda x, y, z: (*(p(x) for p in pools), pool3(y), pool1(z), pool1(z[0])),
        torch.randn(1, 3, 9, 9),
        torch.randn(1, 2, 5, 5, 5),
        torch.randint(-50, 50, (2, 3, 9)),
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_adaptive_avg_pool(opset):
    pools = (nn.AdaptiveAvgPool1d(3), nn.AdaptiveAvgPool2d((3, 5)), nn.AdaptiveAvgPool2d(1), nn.AdaptiveAvgPool2d(2))
    pool3 = nn.AdaptiveAvgPool3d((2, 3, 2))
    program = check(
        lambda a, b, c: (pools[0](a), pools[1](b), pools[2](b), pools[3](b[:, :, :6, :8]), pool3(c)),
        torch.randn(1, 2, 8),
        torch.randn(2, 3, 7, 9),
        torch.randn(1, 2, 5, 4, 4),
        opset=opset,
    )
    ops = onnx_ops(program)
    assert {"GlobalAveragePool", "AveragePool", "MatMul"} <= set(ops)


# -- upsampling ---------------------------------------------------------------------------------

UPSAMPLE = {
    "nearest": [
        (nn.Upsample(scale_factor=2), (4, 5)),
        (nn.Upsample(scale_factor=1.7), (4, 5)),
        (nn.Upsample(size=(11, 7)), (4, 5)),
        (nn.Upsample(scale_factor=2), (6,)),
        (nn.Upsample(scale_factor=2), (2, 3, 4)),
    ],
    "interpolating": [
        (nn.Upsample(scale_factor=2, mode="bilinear"), (4, 5)),
        (nn.Upsample(scale_factor=0.5, mode="bilinear"), (8, 6)),
        (nn.Upsample(size=(7, 9), mode="bilinear", align_corners=True), (4, 5)),
        (nn.Upsample(scale_factor=2, mode="bicubic"), (4, 5)),
        (nn.Upsample(scale_factor=1.5, mode="bicubic", align_corners=True), (4, 5)),
        (nn.Upsample(scale_factor=1.5, mode="linear"), (6,)),
        (nn.Upsample(scale_factor=2, mode="trilinear", align_corners=True), (2, 3, 4)),
    ],
}


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("case", UPSAMPLE)
def test_upsample(case, opset):
    modules = [m for m, _ in UPSAMPLE[case]]
    inputs = [torch.randn(2, 3, *spatial) for _, spatial in UPSAMPLE[case]]
    program = check(lambda *xs: tuple(m(x) for m, x in zip(modules, xs, strict=True)), *inputs, opset=opset)
    assert onnx_ops(program).count("Resize") == len(modules)


# -- padding, grid sampling, col2im/im2col, pixel shuffle, dropout ----------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_reflection_and_replication_pad(opset):
    pads = [nn.ReflectionPad1d((1, 2)), nn.ReflectionPad2d((1, 2, 0, 3)), nn.ReflectionPad3d(1)]
    pads += [nn.ReplicationPad1d((2, 0)), nn.ReplicationPad2d((1, 2, 0, 3)), nn.ReplicationPad3d((1, 0, 2, 1, 0, 1))]
    inputs = (torch.randn(1, 2, 6), torch.randn(2, 3, 5, 6), torch.randn(1, 2, 3, 4, 4))
    program = check(lambda a, b, c: tuple(p(x) for p, x in zip(pads, (a, b, c) * 2, strict=True)), *inputs, opset=opset)
    assert onnx_ops(program).count("Pad") == 6


GRID_MODES = [("bilinear", "zeros", False), ("nearest", "border", True), ("bicubic", "reflection", False)]


@pytest.mark.parametrize("opset", sorted({18, 20, NEWEST}))
def test_grid_sample(opset):
    grid = torch.rand(2, 3, 4, 2) * 2.4 - 1.2  # some points outside [-1, 1], to exercise padding
    program = check(
        lambda x, g: tuple(
            F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=corners)
            for mode, padding, corners in GRID_MODES
        ),
        torch.randn(2, 3, 5, 6),
        grid,
        opset=opset,
    )
    assert onnx_ops(program).count("GridSample") == len(GRID_MODES)
    modes = {
        a.s.decode()
        for n in program.model_proto.graph.node
        if n.op_type == "GridSample"
        for a in n.attribute
        if a.name == "mode"
    }
    # GridSample-20 renamed bilinear/bicubic to linear/cubic
    assert modes == ({"linear", "nearest", "cubic"} if opset >= 20 else {"bilinear", "nearest", "bicubic"})


@pytest.mark.parametrize("opset", OPSETS)
def test_fold_and_unfold(opset):
    fold = nn.Fold((4, 5), 2)
    unfold = nn.Unfold(3, dilation=2, padding=1, stride=2)
    program = check(lambda a, b: (fold(a), unfold(b)), torch.randn(2, 8, 12), torch.randn(2, 3, 8, 7), opset=opset)
    assert "Col2Im" in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
def test_unfold_any_dtype_and_empty_batch(opset):
    unfold = nn.Unfold((2, 3), dilation=(1, 2), padding=1, stride=(2, 1))
    check(
        lambda a, b, c: (unfold(a), unfold(b), unfold(c)),
        torch.rand(2, 3, 6, 7) > 0.5,
        torch.randn(1, 2, 5, 5),
        torch.randn(0, 1, 5, 5),
        opset=opset,
    )


@pytest.mark.parametrize("opset", sorted({18, NEWEST}))
def test_unfold_of_a_dynamic_size_translates_as_captured(opset):
    """ConvBERT's unfold: a (k, 1) kernel down a sequence of dynamic length. im2col translates as
    torch.export captured it, so the export skips torch's decomposition (a retrace of the whole graph)."""
    unfold = nn.Unfold((9, 1), padding=(4, 0))
    dilated = nn.Unfold((3, 2), dilation=(2, 1), padding=(1, 0))
    seq = torch.export.Dim("seq", min=5, max=64)
    program = check(
        lambda x: (unfold(x), dilated(x), dilated(x[0])),
        torch.randn(2, 8, 12, 3),
        opset=opset,
        dynamic_shapes=(({2: seq},),),
    )
    program.verify(torch.randn(2, 8, 31, 3))
    torch_ops = {m.value for n in program.model_proto.graph.node for m in n.metadata_props if m.key == "opreg.torch_op"}
    assert "aten::im2col.default" in torch_ops


@pytest.mark.parametrize("opset", sorted({18, NEWEST}))
def test_conv_with_padding_by_name_translates_as_captured(opset):
    """conv{1,2,3}d.padding: "same" pads the odd one at the end, as torch does (an even kernel,
    dilated); "valid" pads nothing. SigLIP's patch embedding writes padding="valid"."""
    same = nn.Conv2d(3, 4, (4, 3), padding="same", dilation=(2, 1))
    valid = nn.Conv2d(3, 4, 3, padding="valid", stride=2)
    line = nn.Conv1d(3, 2, 4, padding="same")
    program = check(lambda x: (same(x), valid(x), line(x[:, :, 0]), same(x[0])), torch.randn(2, 3, 9, 8), opset=opset)
    torch_ops = {m.value for n in program.model_proto.graph.node for m in n.metadata_props if m.key == "opreg.torch_op"}
    assert {"aten::conv2d.padding", "aten::conv1d.padding"} <= torch_ops


@pytest.mark.parametrize("opset", OPSETS)
def test_pixel_shuffle(opset):
    shuffle, unshuffle = nn.PixelShuffle(2), nn.PixelUnshuffle(2)
    program = check(
        lambda a, b: (shuffle(a), unshuffle(a), shuffle(b)),
        torch.randn(2, 8, 4, 6),
        torch.randn(2, 3, 8, 3, 3),
        opset=opset,
    )
    assert "Transpose" in onnx_ops(program)  # Reshape/Transpose: DepthToSpace has no integer kernels


@pytest.mark.parametrize("opset", OPSETS)
def test_dropout_in_eval_is_identity(opset):
    drop = nn.Dropout(0.5).eval()
    program = check(lambda x: drop(x) * 2, torch.randn(2, 3), opset=opset)
    assert "Dropout" not in onnx_ops(program)


def test_native_dropout_eval():
    check(lambda x: torch.ops.aten.native_dropout(x, 0.3, False), torch.randn(2, 3), opset=18)


def test_flash_attention_for_cpu():
    """Reached only when a graph holds it already (sdpa itself is kept whole); output and logsumexp."""
    check(
        lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True),
        Q,
        K,
        torch.randn(2, 4, 6, 8),
        opset=18,
        rtol=1e-4,
    )


# -- convolution, matrix products, distances ----------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_conv_unbatched_and_large_output_padding(opset):
    """Unbatched (C, H, W) input reaches aten::convolution as is; output_padding >= stride
    (allowed by torch below the dilation) is applied as end pads, not ConvTranspose's attribute."""
    x, w, b = torch.randn(4, 8, 8), torch.randn(2, 2, 3, 3), torch.randn(2)
    wt, bt = torch.randn(2, 2, 4, 5), torch.randn(4)
    check(
        lambda x, xt: (
            F.conv2d(x, w, b, stride=(3, 2), padding=(2, 1), groups=2, dilation=(4, 4)),
            F.conv1d(x[0:2, 0], w[:, :, 0], None, padding="same"),
            F.conv_transpose2d(
                xt, wt, bt, stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2, dilation=(4, 4)
            ),
            F.conv_transpose2d(xt[0], wt, None, stride=2, padding=1, output_padding=1, groups=2),
        ),
        x,
        torch.randn(2, 2, 4, 4),
        opset=opset,
        rtol=1e-4,
        atol=1e-4,
    )


def test_integer_conv_is_unsupported():
    """ONNX Conv takes floating types only."""
    with pytest.raises(opreg.UnsupportedOpsError):
        opreg.export(Lambda(F.conv2d), (torch.ones(1, 1, 3, 3, dtype=torch.int64),) * 2, target=18)


@pytest.mark.parametrize("opset", sorted({18, NEWEST}))
def test_linear_by_a_vector(opset):
    """A 1-D weight (D-FINE's distribution projection): the last dim is multiplied out."""
    w = torch.randn(6)
    check(lambda x: (F.linear(x, w), F.linear(x, w, torch.tensor(0.5))), torch.randn(2, 3, 6), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_addmm_and_linear_without_gemm(opset):
    """Integers (no integer Gemm in ONNX Runtime) and an empty inner dim (beta * input)."""
    ints = [torch.randint(-9, 9, s) for s in ((2, 3), (2, 4), (4, 3), (5, 4))]
    check(
        lambda i, a, b, x, s, e1, e2: (
            torch.addmm(i, a, b, beta=2, alpha=3),
            torch.addmm(i, a, b, beta=0),
            F.linear(x, b.T, i[0]),
            torch.addmm(s, e1, e2, alpha=0.6, beta=0.2),
            torch.addmm(s[0], e1, e2, alpha=0.6, beta=0.2),
        ),
        *ints,
        torch.randn(5, 10),
        torch.randn(5, 0),
        torch.randn(0, 10),
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_cdist_empty(opset):
    """ONNX Runtime returns an empty input to a reduction unreduced; the result is reshaped."""
    check(
        lambda a, b, c: (torch.cdist(a, b, p=0), torch.cdist(a, b, p=1), torch.cdist(c, b[0], p=2)),
        torch.randn(0, 4, 5),
        torch.randn(1, 3, 5),
        torch.randn(2, 0, 5),
        opset=opset,
    )


@pytest.mark.parametrize("opset", sorted({18, 21, NEWEST}))
def test_group_norm_empty_batch(opset):
    norm = nn.GroupNorm(2, 4)
    check(lambda x, y: (norm(x), norm(y)), torch.randn(0, 4, 3), torch.randn(0, 4), opset=opset)


# -- pooling corner cases ----------------------------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_max_pool_ceil_mode_sizes_and_integers(opset):
    """torch drops a ceil_mode window starting in the end padding (ONNX before 19 does not):
    sizes come from explicit end pads. Integer inputs (no MaxPool kernel) pool over slices."""
    pool3 = nn.MaxPool3d(3, ceil_mode=True, padding=1, dilation=(1, 2, 1), return_indices=True)
    pool2 = nn.MaxPool2d(3, 2, 1, dilation=(1, 2), ceil_mode=True, return_indices=True)
    check(
        lambda x, i, j: (*pool3(x), *pool3(i), *pool2(j), pool2(j[0])[0]),
        torch.randn(1, 2, 3, 6, 5),
        torch.randint(-5, 5, (1, 2, 3, 6, 5)),
        torch.randint(-100, 100, (2, 3, 7, 6), dtype=torch.int32),
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_adaptive_avg_pool_empty_batch(opset):
    pool = nn.AdaptiveAvgPool3d((5, 7, 4))
    check(pool, torch.randn(0, 8, 8, 8, 8), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_replication_pad_negative(opset):
    """Negative pads crop; torch reads x[clamp(i - begin, 0, size - 1)] even past a full crop."""
    check(
        lambda x: (
            F.pad(x, (-4, 5, 0, 0), "replicate"),
            F.pad(x, (5, -4, -4, 3), "replicate"),
            F.pad(x[0], (-1, 2), "replicate"),
        ),
        torch.randn(2, 3, 4, 4),
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_relu_integer(opset):
    check(F.relu, torch.randint(-5, 5, (3, 4)), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_pad_with_symbolic_pads_and_circular_as_captured(opset):
    """aten::pad as captured (no decomposition) where the static-pad impl passes: pads read from a dynamic dim
    (as Qwen2.5-VL's window grid pads its merged patches) in every mode, and circular padding, whose negative
    pads crop before it wraps around what is left."""
    size = torch.export.Dim("size", min=6, max=9)
    modes = ("constant", "reflect", "replicate", "circular")

    def fn(x):
        n = x.shape[2]
        return (
            *(F.pad(x, (n - 3, 1, 2, n - 4), mode) for mode in modes),
            F.pad(x, (n - 3, 1), value=-100.0),
            F.pad(x, (2, -1, -3, 1), "circular"),
            F.pad(x[0], (-1, 2), "circular"),
        )

    program = check(fn, torch.randn(2, 3, 6, 7), opset=opset, dynamic_shapes=(({2: size},),))
    program.verify(torch.randn(2, 3, 8, 7))
    torch_ops = {m.value for n in program.model_proto.graph.node for m in n.metadata_props if m.key == "opreg.torch_op"}
    assert "aten::pad.default" in torch_ops
    assert not torch_ops & {"aten::constant_pad_nd.default", "aten::reflection_pad2d.default", "aten::cat.default"}


@pytest.mark.parametrize("opset", OPSETS)
def test_embedding_bag(opset):
    """One impl serves _embedding_bag, _embedding_bag_forward_only and embedding_bag (torch.export
    captures the first two): sums, means, maxima, per-sample weights, a padding index."""
    weight, indices, offsets = torch.randn(10, 3), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4])
    weights = torch.rand(8)
    aten = torch.ops.aten
    program = check(
        lambda w, i, o, p: {
            "sum": aten.embedding_bag.default(w, i, o, False, 0)[0],
            "mean": aten.embedding_bag.default(w, i, o, False, 1)[0],
            "max": aten.embedding_bag.default(w, i, o, False, 2)[0],
            "private": aten._embedding_bag.default(w, i, o, False, 1, False, None, False, 2)[0],
            "padding_idx": aten.embedding_bag.padding_idx(w, i, o, False, 0, False, p, False, 4)[0],
            "weighted": F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
        },
        weight,
        indices,
        offsets,
        weights,
        opset=opset,
    )
    impls = {
        m.value
        for n in program.model_proto.graph.node
        for m in n.metadata_props
        if m.key == "opreg.impl" and "embedding" in m.value
    }
    assert impls == {"aten_embedding_bag"}
