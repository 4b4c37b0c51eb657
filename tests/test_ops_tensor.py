"""Core-pack reductions, creation, indexing, shape and linear-algebra ops against eager PyTorch in ONNX Runtime."""

from __future__ import annotations

import math

import pytest
import torch

from tests.optest import LOWEST, NEWEST, OPSETS, check, onnx_ops

torch.manual_seed(0)

X = torch.randn(3, 4, 5)
M = torch.randn(4, 6)
I32 = torch.randint(-5, 5, (3, 4), dtype=torch.int32)
I64 = torch.randint(-5, 5, (3, 4))
B = torch.rand(3, 4) > 0.5
IDX = torch.tensor([2, 0, 3, 0])
XDUP = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 2.0]])


def case(name, fn, *inputs, marks=(), **options):
    return pytest.param(fn, inputs, options, id=name, marks=marks)


REDUCTIONS = [
    case("sum", lambda x: x.sum(), X),
    case("sum_dims_keepdim", lambda x: x.sum((0, -1), keepdim=True), X),
    case("sum_int32", lambda x: x.sum(1), I32),
    case("sum_bool", lambda x: x.sum(), B),
    case("sum_dtype", lambda x: x.sum(-1, dtype=torch.float64), I32),
    case("prod", lambda x: x.prod(), M),
    case("prod_dim_int", lambda x: x.prod(0, keepdim=True), I64),
    case("mean", lambda x: x.mean(), X),
    case("mean_dim", lambda x: x.mean((-1, 1), keepdim=True), X),
    case("mean_dtype", lambda x: x.mean(0, dtype=torch.float32), I32),
    case("amax", lambda x: x.amax(-1), X),
    case("amin_all_keepdim", lambda x: x.amin((), keepdim=True), X),
    case("amax_bool", lambda x: x.amax(0), B),
    case("max", lambda x: x.max(), I32),
    case("min", lambda x: x.min(), X),
    case("max_dim", lambda x: x.max(-1), XDUP),
    case("min_dim_keepdim", lambda x: x.min(0, keepdim=True), I64),
    case("argmax", lambda x: x.argmax(), XDUP),
    case("argmax_dim", lambda x: x.argmax(1, keepdim=True), XDUP),
    case("argmin_keepdim_all", lambda x: x.argmin(keepdim=True), X),
    case("argmin_int", lambda x: x.argmin(-2), I32),
    case("any", lambda x: x.any(), B),
    case("any_dim", lambda x: x.any(1), I32),
    case("any_dims", lambda x: x.any((0, 1), keepdim=True), B),
    case("all", lambda x: x.all(), I32),
    case("all_dim", lambda x: x.all(-1), B),
    case("is_all_true", lambda x: (torch._is_all_true(x), torch._is_all_true(x[:1] | True)), B),
    case("is_any_true", lambda x: (torch._is_any_true(x), torch._is_any_true(x[:1] & False)), B),
    case("var", lambda x: x.var(), X),
    case("var_dims_correction", lambda x: x.var((0, 2), correction=0, keepdim=True), X),
    case("std", lambda x: x.std(-1), X),
    case("std_unbiased_false", lambda x: x.std(1, unbiased=False, keepdim=True), X),
    case("cumsum", lambda x: x.cumsum(-1), X),
    case("cumsum_int32", lambda x: x.cumsum(0), I32),
    case("sort", lambda x: torch.sort(x, -1), X),
    case("sort_stable_desc", lambda x: torch.sort(x, dim=1, descending=True, stable=True), XDUP),
    case("sort_int", lambda x: torch.sort(x, dim=0, stable=True), I64),
    case("topk", lambda x: torch.topk(x, 2, dim=1), X),
    case("topk_smallest", lambda x: torch.topk(x, 3, largest=False), torch.randperm(12).reshape(3, 4)),
    case("logsumexp", lambda x: torch.logsumexp(x * 30, -1), X),
    case("prod_int32_cumsum_dtype", lambda x: (x.prod(), x.cumsum(1, dtype=torch.float64)), I32[:, :3]),
    case(
        "scalar_input",
        lambda x: (x.sum(0), x.amax(-1), x.argmax(0), x.cumsum(0), x.var(correction=0)),
        torch.tensor(3.0),
    ),
    case("logsumexp_keepdim", lambda x: torch.logsumexp(x, (0, 1), keepdim=True), X),
]

CREATION = [
    case("arange", lambda x: torch.arange(7) + x.sum().long(), I64),
    case("arange_float", lambda x: torch.arange(0.5, 3.2, 0.3) * x.sum(), M),
    case("arange_dtype", lambda x: torch.arange(1, 10, 3, dtype=torch.float32), M),
    case("arange_negative_step", lambda x: torch.arange(5, -3, -2, dtype=torch.int32), M),
    case("full", lambda x: torch.full((2, 3), 1.5) + x.sum(), M),
    case("full_int_bool", lambda x: (torch.full((2,), 7), torch.full((3,), True)), M),
    case("zeros_ones", lambda x: (torch.zeros(2, 3, dtype=torch.int32), torch.ones(4)), M),
    case("like", lambda x: (torch.zeros_like(x), torch.ones_like(x, dtype=torch.int64), torch.full_like(x, 3)), M),
    case("new", lambda x: (x.new_zeros(2), x.new_ones(3, 1), x.new_full((2,), 4.0)), I32),
    case("empty_shape", lambda x: torch.empty(2, 3).shape[0] * x, M),
    case("scalar_tensor_masked_fill", lambda x: x.masked_fill(x > 0, 2.5), M),
    case("fill", lambda x: x.clone().fill_(-1.0), M),
    case("to_int", lambda x: (x * 3).to(torch.int32), M),
    case("to_float_bool", lambda x: (x.to(torch.float64), x.bool()), I32),
    case("copy", lambda x, y: x.clone().copy_(y), M, M[:1].to(torch.float64)),
    case(
        "arange_start_empty_strided",
        lambda x: (torch.arange(2, 5), torch.empty_strided((2, 3), (3, 1)).shape[1] + x),
        M,
    ),
    case("fill_tensor", lambda x: x.clone().fill_(torch.tensor(2)), M),
    case("item", lambda x: torch.full((2,), x.sum().item()), M),
]


def _put(x, index, values):
    y = x.clone()
    y[index] = values
    return y


def _set(x):
    y = x.clone()
    y[:, 1:3] = 5.0
    y[0] = torch.arange(6.0)
    return y


INDEXING = [
    case("gather", lambda x, i: torch.gather(x, 1, i), M, torch.tensor([[0, 5], [1, 1], [2, 3], [5, 0]])),
    case("gather_neg_dim", lambda x, i: torch.gather(x, -2, i), M, torch.tensor([[0, 3, 1, 2, 0, 1]])),
    case("index_select", lambda x, i: torch.index_select(x, -1, i), M, IDX),
    case("embedding", lambda w, i: torch.nn.functional.embedding(i, w), M, torch.tensor([[0, 3], [2, 2]])),
    case("index_one", lambda x, i: x[i], X, IDX[:2]),
    case("index_middle", lambda x, i: x[:, i], X, IDX),
    case("index_negative", lambda x, i: x[..., i], X, -IDX - 1),
    case("index_two", lambda x, i, j: x[i, j], X, torch.tensor([0, 2]), torch.tensor([[1], [3]])),
    case("index_two_middle", lambda x, i, j: x[:, i, j], X, torch.tensor([0, 3]), torch.tensor([4, 1])),
    case("index_split", lambda x, i, j: x[i, :, j], X, torch.tensor([0, 2]), torch.tensor([4, 1])),
    case("index_mask", lambda x, m: x[m], I32.float(), B),
    case("index_mask_middle", lambda x, m: x[:, m], X, torch.tensor([True, False, True, True])),
    case("index_put", lambda x, i, v: x.index_put((i,), v), M, torch.tensor([1, 3]), torch.randn(2, 6)),
    case(
        "index_put_acc",
        lambda x, i, v: x.index_put((i,), v, accumulate=True),
        M,
        torch.tensor([1, 1, 0]),
        torch.tensor(2.0),
    ),
    case(
        "index_put_middle", lambda x, i, v: _put(x, (slice(None), i), v), X, torch.tensor([3, 0]), torch.randn(3, 2, 5)
    ),
    case(
        "index_put_two",
        lambda x, i, j: x.index_put((i, j), torch.tensor(9.0)),
        X,
        torch.tensor([0, 2]),
        torch.tensor([1, 3]),
    ),
    case("index_put_mask", lambda x, m: x.index_put((m,), torch.tensor(-1.0)), I32.float(), B),
    case("setitem_slice", _set, M),
    case(
        "scatter_src",
        lambda x, i, s: x.scatter(1, i, s),
        M,
        torch.tensor([[0, 5], [1, 2], [3, 4], [5, 0]]),
        torch.randn(4, 3),
    ),
    case("scatter_value", lambda x, i: x.scatter(0, i, 7.0), M, torch.tensor([[0, 1, 2, 3, 0, 1]])),
    case(
        "scatter_add",
        lambda x, i, s: x.scatter_add(1, i, s),
        M,
        torch.tensor([[0, 0], [1, 1], [2, 5], [5, 5]]),
        torch.randn(4, 2),
    ),
    case(
        "scatter_reduce_amax",
        lambda x, i, s: x.scatter_reduce(1, i, s, "amax", include_self=False),
        M,
        torch.tensor([[0, 0], [1, 1], [2, 5], [5, 5]]),
        torch.randn(4, 2),
    ),
    case(
        "scatter_reduce_mean",
        lambda x, i, s: x.scatter_reduce(1, i, s, "mean"),
        M,
        torch.tensor([[0, 0], [1, 1], [2, 5], [5, 5]]),
        torch.randn(4, 2),
    ),
    case(
        "scatter_reduce_prod_int",
        lambda x, i, s: x.scatter_reduce(0, i, s, "prod", include_self=False),
        I64,
        torch.tensor([[0, 1, 1, 2]]),
        torch.tensor([[2, 3, 4, 5]]),
    ),
    case("select", lambda x: (x[1], x[:, -1]), X),
    case("slice", lambda x: (x[1:], x[:, ::2], x[..., -3:-1], x[:, 1:100:3]), X),
    case("select_scatter", lambda x, s: torch.select_scatter(x, s, 1, -1), X, torch.randn(3, 5)),
    case("slice_scatter", lambda x, s: torch.slice_scatter(x, s, 2, 1, None, 2), X, torch.randn(3, 4, 2)),
    case("slice_scatter_negative", lambda x, s: torch.slice_scatter(x, s, 0, -2), X, torch.randn(2, 4, 5)),
    case("cat", lambda x, y: torch.cat([x, y, x], -1), M, torch.randn(4, 2)),
    case("cat_legacy_empty", lambda x: torch.cat([x, torch.zeros(0)]), M),
    case(
        "index_int32_put_int",
        lambda x, i, y: (x[i], y.index_put((i,), torch.tensor(1), accumulate=True)),
        M,
        torch.tensor([1, 2, 2], dtype=torch.int32),
        I64,
    ),
    case(
        "scatter_reduce_mean_int",
        lambda x, i, s: x.scatter_reduce(1, i, s, "mean"),
        torch.tensor([[-3, 4, 5]]),
        torch.tensor([[0, 0, 1]]),
        torch.tensor([[-2, -4, 7]]),
    ),
    case(
        "masked_scatter_none",
        lambda x, m, s: x.masked_scatter(m, s),
        M,
        torch.zeros(6, dtype=torch.bool),
        torch.randn(3),
    ),
    case("cat_promote", lambda x, y: torch.cat([x, y]), I32, M[:, :4]),
    case("stack", lambda x: torch.stack([x, x * 2], -1), M),
    case("split", lambda x: torch.split(x, 2, 1), X),
    case("split_sizes", lambda x: torch.split(x, [1, 4], -1), X),
    case("chunk_unbind", lambda x: (*torch.chunk(x, 2, 0), *torch.unbind(x, 1)), M),
    case("flip", lambda x: torch.flip(x, (0, -1)), X),
    case("repeat", lambda x: x.repeat(2, 1, 3), M),
    case("diagonal", lambda x: (torch.diagonal(x), torch.diagonal(x, 2), torch.diagonal(x, -1)), M),
    case("diagonal_dims", lambda x: torch.diagonal(x, 1, 2, 0), X),
    case("nonzero", torch.nonzero, I32),
    case("masked_fill_tensor", lambda x, m: x.masked_fill(m, torch.tensor(-2)), I32, B),
    case("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), I32.float(), B, torch.randn(12)),
    case(
        "masked_scatter_empty_source",
        lambda x, m, s: x.masked_scatter(m, s),
        M,
        torch.zeros(6, dtype=torch.bool),
        torch.randn(0),
    ),
    case("pad", lambda x: torch.nn.functional.pad(x, (1, 2, 0, 1), value=0.5), M),
    case("pad_negative", lambda x: torch.nn.functional.pad(x, (-1, 2)), M),
]


SHAPES = [
    case("view_reshape", lambda x: (x.view(4, 15), x.reshape(-1, 3), x.view(-1)), X),
    case("view_zero", lambda x: x[:0].view(0, 4, 5), X),
    case("permute_transpose", lambda x: (x.permute(2, 0, 1), x.transpose(-1, 0), x[0].t()), X),
    case("squeeze", lambda x: (x[:1].squeeze(0), x[:, :1].squeeze(), x.squeeze(1), x[:1].unsqueeze(-1)), X),
    case("expand", lambda x: (x[:1].expand(3, -1), x[:1].expand_as(x)), M),
    case("expand_new_dims", lambda x: x[:, :1].expand(2, -1, 5), M),
    case("flatten", lambda x: (x.flatten(), x.flatten(1), x[None].flatten(1, 2)), X),
    case("squeeze_dims", lambda x: x[:1, :, :1].squeeze((0, -1)), X),
]

LINALG = [
    case("matmul", lambda x, y: (x @ y, torch.mm(x, y)), M, torch.randn(6, 3)),
    case("bmm", torch.bmm, X, torch.randn(3, 5, 2)),
    case(
        "linear",
        lambda x, w, b: (torch.nn.functional.linear(x, w, b), torch.nn.functional.linear(x, w)),
        X,
        torch.randn(2, 5),
        torch.randn(2),
    ),
    case("addmm", lambda x, y, b: torch.addmm(b, x, y, beta=0.5, alpha=2.0), M, torch.randn(6, 3), torch.randn(3)),
    case("baddbmm", lambda b, x, y: torch.baddbmm(b, x, y, alpha=0.5), torch.randn(3, 4, 2), X, torch.randn(3, 5, 2)),
    case(
        "baddbmm_beta0",
        lambda b, x, y: torch.baddbmm(b, x, y, beta=0),
        torch.full((3, 1, 2), float("nan")),
        X,
        torch.randn(3, 5, 2),
    ),
    case("dot", torch.dot, torch.randn(5), torch.randn(5)),
    case(
        "cdist",
        lambda x, y: (torch.cdist(x, y), torch.cdist(x, y, p=1.0), torch.cdist(x, y, p=3.0)),
        M,
        torch.randn(3, 6),
    ),
    case("pdist", lambda x: (torch.pdist(x), torch.pdist(x, p=float("inf"))), M),
]


def _grouped(cases, size):
    """Cases exported together, one model per group (each export costs about a second of torch decomposition)."""
    return [
        pytest.param(cases[i : i + size], id="+".join(c.id for c in cases[i : i + size]))
        for i in range(0, len(cases), size)
    ]


def _combined(cases):
    """One function of all the cases' inputs returning all their outputs, and those inputs (cloned, so none alias)."""
    fns, spans, inputs = [], [], []
    for c in cases:
        fn, args, _ = c.values
        spans.append((len(inputs), len(inputs) + len(args)))
        inputs.extend(a.clone() for a in args)
        fns.append(fn)

    def combined(*args):
        outputs = []
        for fn, (start, end) in zip(fns, spans, strict=True):
            result = fn(*args[start:end])
            outputs.extend(result if isinstance(result, tuple) else (result,))
        return tuple(outputs)

    return combined, inputs


GROUPS = (
    _grouped(REDUCTIONS, 6) + _grouped(CREATION, 6) + _grouped(INDEXING, 6) + _grouped(SHAPES, 7) + _grouped(LINALG, 5)
)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("cases", GROUPS)
def test_ops(cases, opset):
    fn, inputs = _combined(cases)
    check(fn, *inputs, opset=opset)


N = torch.export.Dim("n", min=4)


@pytest.mark.parametrize("opset", OPSETS)
def test_slicing_with_a_dynamic_dim(opset):
    def fn(x, i):
        return (
            x[1:, ::2],
            x[-1],
            x[:, 1:-1],
            x[i],
            x.index_select(0, i),
            torch.slice_scatter(x, x[1:] * 2, 0, 1),
            torch.select_scatter(x, x[0] + 1, 0, -1),
            x.flip(0),
            torch.diagonal(x),
            torch.cat([x, x], 0),
        )

    x, i = torch.randn(5, 4), torch.tensor([0, 3, 2])
    program = check(fn, x, i, opset=opset, dynamic_shapes=(({0: N}, None),))  # Lambda.forward takes *args
    program.verify(torch.randn(9, 4), i)


SLICE_STARTS = (None, 0, 1, 3, -1, -4, -5)
SLICE_ENDS = (None, 0, 2, 3, 4, 5, -1, -3, -4, -5)
SLICE_STEPS = (1, 2, 3)
"""Boundaries of a slice of a dim of size 4: each end of the dim, one inside (``end = size - 1``), one
past, negative ones, and steps that do and do not divide the size. (torch refuses steps below 1.)"""


@pytest.mark.parametrize("opset", OPSETS)
def test_slice_boundaries(opset):
    """Every combination of SLICE_STARTS, SLICE_ENDS and SLICE_STEPS on a static dim of size 4, in one model."""
    bounds = [(a, b, c) for a in SLICE_STARTS for b in SLICE_ENDS for c in SLICE_STEPS]
    program = check(lambda x: tuple(x[:, a:b:c] for a, b, c in bounds), torch.randn(3, 4, 2), opset=opset)
    assert [tuple(v.shape) for v in program.model.graph.outputs] == [(3, len(range(4)[a:b:c]), 2) for a, b, c in bounds]


@pytest.mark.parametrize("opset", OPSETS)
def test_slice_boundaries_of_a_dynamic_dim(opset):
    """The same boundaries where the dim's size is known only at run time: ``size - 1`` as a symbolic end too."""

    def fn(x):
        size = x.shape[1]
        return (
            x[:, : size - 1],
            x[:, 1 : size - 1],
            x[:, :-1],
            x[:, -3:],
            x[:, -1:],
            x[:, :3],
            x[:, : size + 1],
            x[:, size - 1 :],
            x[:, ::2],
            x[:, -size:],
        )  # fmt: skip (most steps on a dynamic dim make torch.export specialize it)

    program = check(fn, torch.randn(3, 4), opset=opset, dynamic_shapes=(({1: N},),))
    for width in (4, 5, 9):
        program.verify(torch.randn(3, width))


@pytest.mark.parametrize("opset", OPSETS)
def test_creation_and_shapes_with_a_dynamic_dim(opset):
    def fn(x):
        n = x.shape[0]
        return (
            torch.arange(n),
            torch.arange(1, n, 2, dtype=torch.float32),
            torch.zeros(n, 2),
            torch.full((2, n), 3, dtype=torch.int32),
            torch.ones_like(x),
            x.view(n, -1, 2),
            x.reshape(-1),
            x[:1].expand(n, -1),
            x.unsqueeze(0).expand(3, -1, -1),
            x.numel() * x,
            torch.stack([x, x], 1),
            torch.nn.functional.pad(x, (n, 1, 0, n - 2), value=0.5),  # symbolic pads
        )

    program = check(fn, torch.randn(4, 6), opset=opset, dynamic_shapes=(({0: N},),))
    program.verify(torch.randn(7, 6))


def test_reshape_as_and_view_as_as_captured():
    """torch.export keeps reshape_as and view_as (RoFormer's rotary embedding): each a Reshape to the
    other tensor's shape, without torch's decomposition pass (a retrace of the whole graph)."""

    def fn(x, y):
        return x.reshape_as(y) + 1, x.view_as(y.t()) * 2

    program = check(fn, torch.randn(3, 4), torch.randn(4, 3), opset=18, optimize=False)
    assert {"aten::reshape_as.default", "aten::view_as.default"} <= _torch_ops(program)
    program.verify(torch.randn(3, 4), torch.randn(4, 3))


@pytest.mark.parametrize("opset", OPSETS)
def test_to_overloads_as_captured(opset):
    """torch.export keeps Tensor.to as aten::to.* (not _to_copy); each becomes a Cast,
    or an Identity when the dtype stays, without torch's decomposition pass."""

    def fn(x, m):
        return (
            x.to(torch.float64),
            x.to(torch.float32),
            x.to("cpu", torch.int32),
            x.to(dtype=torch.float16),
            x.to("cpu"),
            torch.ops.aten.to.other(x, m),
        )

    # optimize=False: the lean pass merges the chain of Identity nodes, keeping one's provenance
    program = check(fn, M, I64[:, :3].repeat(1, 2), opset=opset, optimize=False)
    torch_ops = {m.value for n in program.model_proto.graph.node for m in n.metadata_props if m.key == "opreg.torch_op"}
    assert {"aten::to.dtype", "aten::to.device", "aten::to.dtype_layout", "aten::to.other"} <= torch_ops
    assert "aten::_to_copy.default" not in torch_ops


def test_checks_joining_conditions_on_a_value_read_from_a_tensor():
    """``torch._check`` on ``|`` and ``&`` of conditions on a data-dependent size leaves
    ``operator.or_``/``and_`` of symbolic bools in the graph (Qwen2.5-VL's vision encoder reads its
    image grid so)."""
    import opreg

    class Model(torch.nn.Module):
        def forward(self, x, grid):
            h = grid[0].item()
            torch._check((h == 2) | (h >= 4))
            torch._check((h > 0) & (h <= x.shape[0]))
            return x[:h].sum(0), torch.arange(h)

    program = opreg.export(Model(), (torch.randn(6, 3), torch.tensor([2, 3])))
    program.verify(torch.randn(6, 3), torch.tensor([5, 1]))


@pytest.mark.parametrize("opset", OPSETS)
def test_symbolic_sizes_need_no_casts(opset):
    """arange and slice bounds from a symbolic size are INT64 already: no Cast to INT64."""

    def fn(x):
        n = x.shape[0]
        return torch.arange(n), torch.arange(1, n, 2), x[: n - 1], x[1:n]

    x = torch.randn(5, 6)
    program = check(fn, x, opset=opset, dynamic_shapes=(({0: N},),))
    program.verify(torch.randn(8, 6))
    assert "Cast" not in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_flatten_keeps_the_dims_before_start_dim(opset, dynamic):
    """ViT's patch embedding flattens from dim 2 on: ONNX Flatten always makes a 2-D
    result, so it is torch's flatten only when flattening from dim 1 to the end."""

    def fn(x):
        return (
            x.flatten(2),
            x.flatten(-2),
            x.flatten(1),
            x.flatten(),
            x.flatten(1, 2),
            x.flatten(0, 1),
            x.flatten(2, 2),
        )

    x = torch.randn(2, 3, 4, 5)
    if not dynamic:
        check(fn, x, opset=opset)
        return
    dims = {0: torch.export.Dim("batch"), 3: torch.export.Dim("width")}
    program = check(fn, x, opset=opset, dynamic_shapes=((dims,),))
    program.verify(torch.randn(5, 3, 4, 7))


@pytest.mark.parametrize("opset", OPSETS)
def test_reductions_with_a_dynamic_dim(opset):
    def fn(x):
        return (
            x.sum(0),
            x.var(0),
            x.std(),
            x.mean((0, 1)),
            x.amax(0),
            x.argmax(0),
            x.cumsum(0),
            torch.sort(x, 0, descending=True),
            torch.logsumexp(x, 0),
            torch.pdist(x),
        )

    program = check(fn, torch.randn(4, 6), opset=opset, dynamic_shapes=(({0: N},),))
    program.verify(torch.randn(9, 6))


@pytest.mark.parametrize("opset", OPSETS)
def test_integer_sum_accumulates_in_int64_and_sort_is_topk(opset):
    program = check(lambda x: (x.sum(0), torch.sort(x, 1)), I32, opset=opset)
    ops = onnx_ops(program)
    assert "Cast" in ops and "ReduceSum" in ops and "TopK" in ops


@pytest.mark.parametrize("opset", OPSETS)
def test_half_precision_reductions_accumulate_in_float(opset):
    x = torch.randn(3, 50).half()
    check(lambda x: (x.sum(1), x.mean(), x.var(0), x.cumsum(1), torch.logsumexp(x, 0)), x, opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_bool_prod_and_sort_compute_on_integers(opset):
    """No BOOL ReduceProd or TopK: through INT64/INT32 and back (sort keeps ties in order, as stable=True)."""
    x = torch.rand(4, 5, 6) > 0.3
    check(lambda x: (torch.prod(x, 1, dtype=torch.bool), x.prod(dtype=torch.bool)), x, opset=opset)
    check(lambda x: torch.sort(x, dim=-1, descending=True, stable=True), x, opset=opset)
    check(lambda x: torch.sort(x, dim=1, stable=True), x, opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_grid_sampler_float16_computes_in_float32(opset):
    x = torch.randn(1, 2, 4, 5).half()
    grid = (torch.rand(1, 3, 3, 2) * 2 - 1).half()
    program = check(lambda x, g: torch.nn.functional.grid_sample(x, g, align_corners=False), x, grid, opset=opset)
    assert onnx_ops(program).count("Cast") == 3  # input and grid to float32, the result back


_N, _I = float("nan"), float("inf")
NANS = torch.tensor(
    [
        [1.0, _N, 3.0, _N, -2.0],  # two NaNs, inside
        [_N, 2.0, _I, -1.0, 0.0],  # NaN first, then +inf
        [_I, -_I, 5.0, _N, 1.0],  # +inf and -inf before a NaN
        [-_I, 4.0, -3.0, 2.0, 0.5],  # no NaN, -inf
        [_N, _N, _N, _N, _N],  # all NaN
    ]
)
"""torch treats NaN as larger than +inf: slices holding one reduce to NaN, argmax and argmin pick the first."""
UNTIED = NANS[:4, [0, 2, 4, 1]]
"""At most one NaN a row and no equal elements: torch's unstable sort and topk order them unambiguously."""


def _nan_reductions(x):
    return (
        x.max(),
        x.min(),
        x[3].max(),  # no NaN: exact
        x.amax(1),
        x.amin(0),
        x.amax((0, 1), keepdim=True),
        torch.aminmax(x, dim=1),
        x.max(1),
        x.min(0, keepdim=True),
        x.argmax(1),
        x.argmin(1, keepdim=True),
        x.argmax(0),
        x.argmax(),
        x.argmin(keepdim=True),
    )


def _nan_sorts(x):
    return (
        torch.sort(x, dim=1, stable=True),
        torch.sort(x, dim=1, descending=True, stable=True),
        torch.sort(x, dim=0, stable=True),
        torch.sort(x, dim=0, descending=True, stable=True),
    )


def _nan_unstable_sorts_and_topk(x):
    return (
        torch.sort(x, 1),
        torch.sort(x, 1, descending=True),
        torch.argsort(x, 1),
        torch.topk(x, 2, 1),
        torch.topk(x, 3, 1, largest=False),
        torch.topk(x, 1, 0),
    )


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize(
    ("fn", "x"),
    [
        pytest.param(_nan_reductions, NANS, id="reductions"),
        pytest.param(_nan_sorts, NANS, id="stable_sorts"),
        pytest.param(_nan_unstable_sorts_and_topk, UNTIED, id="sorts_topk"),
    ],
)
def test_nan_propagation(fn, x, dtype, opset):
    """max/min, amax/amin, aminmax, max.dim/min.dim (values and indices), argmax/argmin, sort/sort.stable
    (both directions), argsort and topk (largest and smallest) give NaN torch's meaning on every ONNX Runtime:
    NaN is the largest value, even against +inf; integer-free, so every impl takes its floating path."""
    check(fn, x.to(dtype), opset=opset)


def test_nan_handling_adds_few_nodes_and_none_for_integers():
    """Graph size: amax gains IsNaN/Where/ReduceSum/Sub; float32 argmax and sort compare a float64 key;
    float64 sorts twice; integer inputs get the plain ops."""
    newest = OPSETS[-1]

    def ops(fn, x):
        return onnx_ops(check(fn, x, opset=newest))

    def stable_sort(x):
        return torch.sort(x, dim=1, stable=True)

    key = ["Cast", "Clip", "IsNaN", "Where"]
    assert ops(lambda x: x.amax(1), NANS) == ["ReduceMax", "IsNaN", "Where", "ReduceSum", "Sub"]
    assert ops(lambda x: x.argmax(1, keepdim=True), NANS) == [*key, "ArgMax"]
    assert ops(lambda x: x.argmin(0), NANS.half()) == [*key, "ArgMin"]
    assert ops(lambda x: x.max(1), NANS) == [*key, "ArgMax", "GatherElements", "Squeeze", "Squeeze"]
    assert ops(stable_sort, NANS) == [*key, "TopK", "GatherElements"]
    assert ops(stable_sort, NANS.double()) == [
        "IsNaN", "Where", "TopK", "Cast", "GatherElements", "TopK", "GatherElements", "GatherElements",
    ]  # fmt: skip
    ints = ops(lambda x: (x.amax(1), x.max(), x.argmax(1), x.max(0), stable_sort(x), torch.topk(x, 2)), I64)
    assert ints == ["ReduceMax", "ReduceMax", "ArgMax", "ReduceMax", "ArgMax", "TopK", "TopK"]


@pytest.mark.parametrize("opset", OPSETS)
def test_gather_and_scatter_edge_cases(opset):
    """OpInfo edge cases: 0-d self (ScatterElements needs rank >= 1), a uint8 index, an empty index
    of another rank, scatter's legacy ``reduce=``, and reductions ONNX Runtime has no float16/bool kernel for."""
    s, i0, u = torch.tensor(2.5), torch.tensor(0), torch.tensor(-1.5)
    x, src, idx = torch.randn(5, 4), torch.randn(3, 4), torch.tensor([[0, 1, 2, 0], [3, 3, 2, 1], [0, 2, 2, 1]])

    def fn(s, i0, u, x, src, idx):
        return (
            torch.gather(s, 0, i0),
            torch.gather(s, 0, i0.reshape(1)),
            torch.gather(x[0], 0, torch.zeros(0, dtype=torch.uint8)),
            torch.gather(x[0], 0, torch.zeros(2, 0, dtype=torch.uint8)),
            torch.index_select(s, 0, i0.reshape(1)),
            torch.scatter(s, 0, i0, u),
            torch.scatter_add(s, 0, i0, u),
            torch.scatter_reduce(s, 0, i0, u, "amax"),
            torch.scatter_reduce(s, 0, i0, u, "mean"),
            torch.scatter(x, 0, idx, src, reduce="add"),
            torch.scatter(x, 1, idx, src, reduce="multiply"),
            torch.scatter(x, 0, idx, 2.0, reduce="multiply"),
            torch.scatter(s, 0, i0, u, reduce="multiply"),
            torch.scatter_add(x.half(), 0, idx, src.half()),
            torch.scatter_reduce(x > 0, 0, idx, src > 0, "amax", include_self=False),
            torch.scatter_reduce(x > 0, 1, idx, src > 0, "prod"),
        )

    check(fn, s, i0, u, x, src, idx, opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_masks_and_nonzero_edge_cases(opset):
    """bool masked_fill/masked_scatter (ONNX Runtime has no bool Where), a mask broadcasting self, 0-d nonzero."""
    x, b, mask, source = torch.randn(5), torch.rand(5, 5) > 0.5, torch.rand(5, 5) > 0.3, torch.randn(5, 5)

    def fn(x, b, mask, source):
        return (
            b.masked_fill(mask, True),
            b.masked_fill(mask[0], torch.tensor(False)),
            b.masked_scatter(mask, ~b),
            x.masked_scatter(mask, source),
            torch.nonzero(x[0]),
            torch.nonzero(x[0] * 0),
        )

    check(fn, x, b, mask, source, opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_integer_arange_truncates_float_bounds(opset):
    """int64 arange truncates start, end and step first; other integer types count from the given values."""

    def fn():
        return (
            torch.arange(-0.9, 2.1, 2.0, dtype=torch.int64),
            torch.arange(2.1, -2.9, -1.0, dtype=torch.int64),
            torch.arange(3.1, dtype=torch.int64),
            torch.arange(-0.9, 2.1, 2.0, dtype=torch.int32),
            torch.arange(0.0, -8.000001, -4.0, dtype=torch.int32),
        )

    check(fn, opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_pixel_shuffle_any_dtype_and_empty(opset):
    """pixel (un)shuffle as Reshape/Transpose: integer and bool inputs, leading dims, empty tensors."""
    f = torch.nn.functional

    def fn(i, b, e):
        return (
            f.pixel_shuffle(i, 3),
            f.pixel_unshuffle(i, 1),
            f.pixel_shuffle(b, 2),
            f.pixel_unshuffle(f.pixel_shuffle(b, 2), 2),
            f.pixel_unshuffle(e, 1),
            f.pixel_shuffle(e, 1),
        )

    i = torch.arange(2 * 18 * 2 * 2).reshape(2, 18, 2, 2)
    b = torch.rand(3, 2, 8, 2, 3) > 0.5
    check(fn, i, b, torch.zeros(1, 1, 1, 0), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_embedding_max_norm_and_unfold_of_an_empty_batch(opset):
    """embedding(max_norm=…) renormalizes the rows it looks up (aten::embedding_renorm); unfold of batch 0."""
    f = torch.nn.functional

    def fn(w, i, x):
        return (
            f.embedding(i, w.clone(), max_norm=1.0),
            f.embedding(i, w.clone(), max_norm=1.5, norm_type=1.0),
            f.unfold(x, 2),
        )

    w = torch.randn(6, 4)
    check(fn, w, torch.tensor([[0, 2], [2, 5]]), torch.randn(0, 1, 5, 5), opset=opset)


def _torch_ops(program) -> set[str]:
    """The ATen ops the exported nodes came from (their ``opreg.torch_op`` metadata)."""
    return {m.value for n in program.model_proto.graph.node for m in n.metadata_props if m.key == "opreg.torch_op"}


TIES = torch.tensor([[3, 1, 3, 0, 1, 3, 3], [2, 2, 2, 2, 2, 2, 2], [0, 1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1, 0]])
"""Rows of ties: repeated values, all equal, ascending, descending; the columns tie too (columns 0 and 2)."""


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.bool], ids=str)
def test_argsort_stable_keeps_ties_in_index_order(dtype, opset):
    """argsort.stable, in both directions and along either dim, as captured (no decomposition): ONNX's TopK
    puts the lower index first among equal values whether largest or not, which is torch's stable order."""

    def fn(x):
        return (
            torch.argsort(x, dim=1, stable=True),
            torch.argsort(x, dim=1, descending=True, stable=True),
            torch.argsort(x, dim=0, stable=True),
            torch.argsort(x, dim=0, descending=True, stable=True),
        )

    program = check(fn, TIES.to(dtype), opset=opset)
    assert "aten::argsort.stable" in _torch_ops(program)
    assert "TopK" in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
def test_argsort_and_item_as_captured(opset):
    """argsort without stable= (on values without ties: torch leaves their order open) and item() of a 0-d
    and of a one-element tensor, translated as captured, without torch's decomposition pass."""

    def fn(x, i):
        return (
            torch.argsort(x, 1),
            torch.argsort(x, 0, descending=True),
            x * x[1, 2].item(),
            i * i[0].item(),
            x * i[1:2].reshape(1, 1).item(),
        )

    x = torch.randperm(20).reshape(4, 5).float()
    program = check(fn, x, torch.tensor([3, -2, 7]), opset=opset)
    assert {"aten::argsort.default", "aten::item.default"} <= _torch_ops(program)


# -- cumulative products and extremes ----------------------------------------------------------

SIGNS = torch.tensor([[2.0, 0.0, -3.0, 1.5, -1.0], [-0.5, 4.0, -2.0, 0.5, 8.0], [1.0, -1.0, 0.0, 0.0, 3.0]])
"""Zeros and negative values: a product of logarithms would give NaN or -inf where torch gives 0 or a sign."""
TIES = torch.tensor([[1.0, 3.0, 3.0, -math.inf, 3.0], [math.nan, 2.0, math.nan, 5.0, -1.0], [-math.inf] * 5])
"""Equal values (torch's index is the last holding the extreme), NaN (it wins and holds: the last NaN's index), -inf."""


@pytest.mark.parametrize("opset", (LOWEST, 25, 26, NEWEST))
@pytest.mark.parametrize(
    ("fn", "x"),
    [
        (lambda x: (x.cumprod(1), x.cumprod(0), x.cumprod(-1)), SIGNS),
        (lambda x: x.cumprod(-1), SIGNS[0]),  # rank 1, a negative dim
        (lambda x: (x.cumprod(1), x.cumprod(0, dtype=torch.float64)), I64),  # int64 products, exact
        (lambda x: (x.cumprod(1), (x > 0).cumprod(0)), I32),  # int32 and bool give int64, as torch promotes them
        (lambda x: x.cumprod(1), SIGNS.half()),  # float16: products in float32, each rounded once
        (lambda x: x.cumprod(0), torch.tensor(-2.5)),
    ],
    ids=["signs", "rank1_negative_dim", "int64", "int32_bool", "float16", "0d"],
)
def test_cumprod_keeps_zeros_and_signs(fn, x, opset):
    program = check(fn, x, opset=opset)
    ops = onnx_ops(program)
    if x.dim():  # CumProd where ai.onnx has it (26), a ReduceProd of prefix rows before
        assert ("CumProd" in ops) == (opset >= 26) and ("ReduceProd" in ops) == (opset < 26), ops


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize(
    ("fn", "x"),
    [
        (lambda x: (torch.cummax(x, 1), torch.cummin(x, 1), torch.cummax(x, 0), torch.cummin(x, -2)), TIES),
        (lambda x: (torch.cummax(x, -1), torch.cummin(x, -1)), TIES[1]),  # rank 1, a negative dim
        (lambda x: (torch.cummax(x, 1), torch.cummin(x, 0)), torch.tensor([[3, 1, 3, 7], [-2, -2, 5, -9]])),
        (lambda x: (torch.cummax(x, 1), torch.cummin(x, 1)), torch.tensor([[True, False, True], [False, False, True]])),
        (lambda x: (torch.cummax(x, 1), torch.cummin(x, 0)), TIES.half()),
        (lambda x: (torch.cummax(x, 0), torch.cummin(x, -1)), torch.tensor(1.5)),
    ],
    ids=["ties_nan_inf", "rank1_negative_dim", "int64", "bool", "float16", "0d"],
)
def test_cummax_and_cummin_take_torchs_index(fn, x, opset):
    check(fn, x, opset=opset)
