"""Core pack: elementwise math, comparison/logical/bitwise ops and activations, exported at
the lowest and newest opsets, run in ONNX Runtime and compared with eager PyTorch.

Ops are grouped into one export per case (a dict of outputs, named by op) to keep the file fast."""

from __future__ import annotations

import onnx
import pytest
import torch
import torch.nn.functional as F

from tests.optest import NEWEST, OPSETS, check, onnx_ops

NAN, INF = float("nan"), float("inf")


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, generator=g) * 2  # any sign
    positive = torch.rand(4, 5, generator=g) * 3 + 0.1
    unit = torch.rand(4, 5, generator=g) * 1.8 - 0.9  # inside (-1, 1)
    above_one = torch.rand(4, 5, generator=g) * 3 + 1.0
    return x, positive, unit, above_one


def _unary(x, p, u, g):
    return {
        "abs": torch.abs(x),
        "neg": torch.neg(x),
        "sign": torch.sign(x),
        "ceil": torch.ceil(x),
        "floor": torch.floor(x),
        "round": torch.round(x),
        "trunc": torch.trunc(x),
        "acos": torch.acos(u),
        "acosh": torch.acosh(g),
        "asin": torch.asin(u),
        "asinh": torch.asinh(x),
        "atan": torch.atan(x),
        "atanh": torch.atanh(u),
        "cos": torch.cos(x),
        "cosh": torch.cosh(x),
        "sin": torch.sin(x),
        "sinh": torch.sinh(x),
        "tan": torch.tan(u),
        "tanh": torch.tanh(x),
        "erf": torch.erf(x),
        "exp": torch.exp(x),
        "expm1": torch.expm1(x),
        "log": torch.log(p),
        "log1p": torch.log1p(p),
        "log2": torch.log2(p),
        "log10": torch.log10(p),
        "reciprocal": torch.reciprocal(p),
        "sqrt": torch.sqrt(p),
        "rsqrt": torch.rsqrt(p),
        "sigmoid": torch.sigmoid(x),
    }


@pytest.mark.parametrize("opset", OPSETS)
def test_unary_float32(opset):
    program = check(_unary, *_inputs(), opset=opset)
    ops = set(onnx_ops(program))
    assert {"Abs", "Acos", "Erf", "Sigmoid", "Round", "Sqrt", "Reciprocal"} <= ops


@pytest.mark.parametrize("opset", OPSETS)
def test_unary_edge_values(opset):
    halves = torch.tensor([-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.5, -0.7, 0.7, NAN, INF, -INF])
    tiny = torch.tensor([1e-7, -1e-7, 1e-4, -1e-4, 0.0, -1.0, 50.0, -50.0, 100.0, -120.0, NAN, INF, -INF])
    check(
        lambda h, t: {
            "round": torch.round(h),
            "trunc": torch.trunc(h),
            "ceil": torch.ceil(h),
            "floor": torch.floor(h),
            "sign": torch.sign(h),  # sign(NaN) is 0 in torch
            "expm1": torch.expm1(t),  # exact near 0, -1 and inf at the ends
            "log1p": torch.log1p(t.clamp(min=-1.0)),  # exact near 0, -inf at -1
            "round2": torch.round(h * 1.234, decimals=2),
            "round_1": torch.round(h * 123.4, decimals=-1),
        },
        halves,
        tiny,
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_unary_integer_and_bool(opset):
    i = torch.tensor([[-3, -1, 0], [1, 2, 7]])
    b = torch.tensor([[True, False, True], [False, False, True]])
    program = check(
        lambda i, b: {
            # integer -> integer
            "abs": torch.abs(i),
            "neg": torch.neg(i),
            "sign": torch.sign(i),
            "floor": torch.floor(i),
            "ceil": torch.ceil(i),
            "round": torch.round(i),
            "trunc": torch.trunc(i),
            # integer -> float32
            "sqrt": torch.sqrt(i.abs()),
            "exp": torch.exp(i),
            "sin": torch.sin(i),
            "sigmoid": torch.sigmoid(i),
            "reciprocal": torch.reciprocal(i + 10),
            "log2": torch.log2(i.abs() + 1),
            # bool
            "sign_bool": torch.sign(b),
            "cos_bool": torch.cos(b),
        },
        i,
        b,
        opset=opset,
    )
    assert "Cast" in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
def test_unary_bfloat16(opset):
    # most ONNX math ops take no bfloat16: computed in float32 and cast back, as torch does on CPU.
    def fn(x, p, u):
        x, p, u = x.bfloat16(), p.bfloat16(), u.bfloat16()
        out = {
            "sin": torch.sin(x),
            "tan": torch.tan(u),
            "round": torch.round(x),
            "log1p": torch.log1p(p),
            "atan2": torch.atan2(x, p),
        }
        # keys unlike the FX node names (sin, tan...): an output named like an inner value breaks SSA
        return {f"bf16_{k}": v.float() for k, v in out.items()} | {"bf16_isinf": torch.isinf(x)}

    program = check(fn, *_inputs(4)[:3], opset=opset)
    assert "Sin" in onnx_ops(program)


# -- binary arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_add_sub_mul_div_float(opset):
    x, y = _inputs(1)[:2]
    check(
        lambda x, y: {
            "add": x + y,
            "add_alpha": torch.add(x, y, alpha=2.5),
            "add_scalar": x + 1,
            "add_scalar_alpha": torch.ops.aten.add.Scalar(x, 2.0, 3),
            "sub": x - y,
            "sub_alpha": torch.sub(x, y, alpha=-0.5),
            "sub_scalar": torch.ops.aten.sub.Scalar(x, 0.25),
            "rsub": 3 - x,
            "mul": x * y,
            "mul_scalar": torch.ops.aten.mul.Scalar(x, 1.5),
            "div": x / y,
            "div_scalar": torch.ops.aten.div.Scalar(x, 4.0),
            "broadcast": x + y[0],
        },
        x,
        y,
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_one_impl_serves_the_tensor_and_scalar_overloads(opset):
    """``add.Tensor`` and ``add.Scalar`` (and the like) share one impl whose annotation covers both
    (``other: Tensor | float``): each node gets what torch passes, a tensor or a Python number, so a
    number keeps ranking below a tensor in torch's promotion (float16 stays float16, int32 stays int32)."""
    h = torch.tensor([0.5, -1.25, 3.0, 70000.0 / 64], dtype=torch.float16)
    k = torch.tensor([0.25, 2.0, -3.0, 1.0], dtype=torch.float16)
    i = torch.tensor([7, -9, 12, 5], dtype=torch.int32)
    ops = torch.ops.aten
    program = check(
        lambda h, k, i: {
            "add_tensor": ops.add.Tensor(h, k),
            "add_scalar": ops.add.Scalar(h, 0.1),  # 0.1 rounds to float16, as torch computes it
            "add_float_to_int": ops.add.Scalar(i, 2.5),  # float32 (the default), not a constant's float64
            "eq_tensor": ops.eq.Tensor(h, k),
            "eq_scalar": ops.eq.Scalar(h, 3.0),
            "remainder_scalar": ops.remainder.Scalar(i, 4),
            "remainder_scalar_tensor": ops.remainder.Scalar_Tensor(10, i),
            "where_scalar_other": ops.where.ScalarOther(i > 0, h, 2.5),
            "where_scalar_self": ops.where.ScalarSelf(i > 0, 2.5, h),
            "div_scalar_mode": ops.div.Scalar_mode(i, 3, rounding_mode="floor"),
        },
        h,
        k,
        i,
        opset=opset,
    )
    impls = {}
    for node in program.model_proto.graph.node:
        props = {m.key: m.value for m in node.metadata_props}
        impls.setdefault(props["opreg.torch_op"], set()).add(props["opreg.impl"])
    assert impls["aten::add.Tensor"] == impls["aten::add.Scalar"] == {"aten_add"}
    assert impls["aten::eq.Tensor"] == impls["aten::eq.Scalar"] == {"aten_eq"}
    assert impls["aten::remainder.Scalar"] == impls["aten::remainder.Scalar_Tensor"] == {"aten_remainder"}
    assert impls["aten::where.ScalarOther"] == impls["aten::where.ScalarSelf"] == {"aten_where"}
    outputs = {o.name: o.type.tensor_type.elem_type for o in program.model_proto.graph.output}
    assert outputs["add_scalar"] == outputs["where_scalar_self"] == onnx.TensorProto.FLOAT16
    assert outputs["remainder_scalar_tensor"] == outputs["div_scalar_mode"] == onnx.TensorProto.INT32
    assert outputs["add_float_to_int"] == onnx.TensorProto.FLOAT


@pytest.mark.parametrize("opset", OPSETS)
def test_add_sub_mul_div_integer_and_bool(opset):
    i = torch.tensor([[-7, -3, 0, 5], [7, 9, -11, 2]])
    j = torch.tensor([[2, -2, 3, 3], [-4, 4, 5, -1]])
    s = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32)
    b = torch.tensor([[True, False, True, False], [True, True, False, False]])
    check(
        lambda i, j, s, b, x: {
            "add": i + j,
            "add_alpha": torch.add(i, j, alpha=3),
            "sub_alpha": torch.sub(i, j, alpha=2),
            "add_float_scalar": i + 1.5,  # int64 + float -> float32
            "mul_float_scalar": i * 2.5,
            "int32_plus_int64": s + i,  # -> int64
            "int32_times_int": s * 3,  # stays int32
            "int_plus_float": i + x,  # -> float32
            "div_int": i / j,  # true division -> float32
            "div_int_scalar": i / 2,
            "add_bool": b + b,  # logical or
            "mul_bool": b * b.flip(0),  # logical and
            "bool_plus_int": b + i,
        },
        i,
        j,
        s,
        b,
        torch.randn(2, 4),
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_div_rounding_modes(opset):
    a = torch.tensor([-7.0, -7.0, 7.0, 7.0, 1.0, -1.0, 5.5, -5.5, 0.0, 3.0, -3.0])
    b = torch.tensor([2.0, -2.0, 2.0, -2.0, 0.1, 0.1, 1.5, 1.5, 3.0, 0.0, 0.0])
    i = torch.tensor([-7, -7, 7, 7, 0, 9, -9])
    j = torch.tensor([2, -2, 2, -2, 3, 4, 4])
    check(
        lambda a, b, i, j: {
            "floor": torch.div(a, b, rounding_mode="floor"),  # 1 // 0.1 == 9, x // 0 == x / 0
            "trunc": torch.div(a, b, rounding_mode="trunc"),
            "true": torch.div(a, b, rounding_mode=None),
            "floor_scalar": torch.div(a, 2.5, rounding_mode="floor"),
            "trunc_scalar": torch.div(a, -2.5, rounding_mode="trunc"),
            "floordiv_op": a // 2,
            "int_floor": torch.div(i, j, rounding_mode="floor"),
            "int_trunc": torch.div(i, j, rounding_mode="trunc"),
            "int_floor_scalar": i // 4,
            "int_trunc_scalar": torch.div(i, -4, rounding_mode="trunc"),
            "int_floor_float_scalar": torch.div(i, 2.5, rounding_mode="floor"),  # -> float32
            "int_true": torch.div(i, j),
            "scalar_mode_floor": torch.ops.aten.div.Scalar_mode(a, 2.0, rounding_mode="floor"),
            "scalar_mode_trunc": torch.ops.aten.div.Scalar_mode(a, -2.0, rounding_mode="trunc"),
            "scalar_mode_int": torch.ops.aten.div.Scalar_mode(i, 2, rounding_mode="floor"),
        },
        a,
        b,
        i,
        j,
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_div_trunc_float16_rounds_the_quotient_to_float16_first(opset):
    # -8.4765625 / -0.061 is 138.9495 in float32, 139.0 in float16: torch truncates the latter
    a = torch.tensor([-8.4765625, 7.0, -7.0]).half()
    b = torch.tensor([-0.061004638671875, 2.0, 2.0]).half()
    check(lambda a, b: torch.div(a, b, rounding_mode="trunc"), a, b, opset=opset, rtol=0, atol=0)


@pytest.mark.parametrize("opset", OPSETS)
def test_where_bool_and_celu_float16(opset):
    c = torch.tensor([True, False, True, False])
    x = torch.tensor([True, True, False, False])
    check(lambda c, x: torch.where(c, x, ~x), c, x, opset=opset)
    check(lambda x: torch.nn.functional.celu(x, alpha=0.5), torch.randn(3, 4).half(), opset=opset)


@pytest.mark.parametrize("opset", sorted({18, NEWEST}))
def test_square_and_multiply_translate_as_captured(opset):
    """torch.square and torch.multiply stay themselves in torch.export's graph (RMS norms of causal
    LMs square; ConvBERT multiplies): their impls spare the export torch's decomposition, a retrace."""
    x = torch.randn(3, 4)
    b, small = torch.tensor([True, False, True]), torch.tensor([1, -2, 3], dtype=torch.int8)
    program = check(
        lambda x, b, small: (
            torch.square(x),
            torch.square(b),
            torch.square(small),
            torch.multiply(x, x[0]),
            torch.multiply(small, 3),
        ),
        x,
        b,
        small,
        opset=opset,
    )
    torch_ops = {m.value for n in program.model_proto.graph.node for m in n.metadata_props if m.key == "opreg.torch_op"}
    assert {"aten::square.default", "aten::multiply.Tensor"} <= torch_ops


@pytest.mark.parametrize("opset", OPSETS)
def test_pow(opset):
    x, p = _inputs(2)[:2]
    i = torch.tensor([[-3, -1, 0], [1, 2, 5]])
    e = torch.tensor([[2, 3, 0], [1, 2, 3]])
    small = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int8)
    check(
        lambda x, p, i, e, small: {
            "tensor_tensor": torch.pow(p, x),
            "square": x**2,
            "cube": x**3,
            "sqrt": p**0.5,
            "neg_exponent": p**-1.5,
            "scalar_base": 2**x,
            "float_base_int_exponent": 2.5**e,  # -> float32
            "int_base": 2**e,  # stays int64
            "int_int": i**e,
            "int_scalar": i**3,
            "int_float_exponent": e**0.5,  # -> float32
            "int_float_tensor": i ** x[:2, :3],
            "int8": small**2,
        },
        x,
        p,
        i,
        e,
        small,
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_fmod_remainder(opset):
    a = torch.tensor([-7.0, -7.0, 7.0, 7.0, 5.5, -5.5, 0.0, -0.25, 3.0])
    b = torch.tensor([3.0, -3.0, 3.0, -3.0, 2.0, 2.0, 3.0, 1.0, -1.5])
    i = torch.tensor([-7, -7, 7, 7, 0, -1, 9])
    j = torch.tensor([3, -3, 3, -3, 5, 4, -4])
    check(
        lambda a, b, i, j: {
            "fmod": torch.fmod(a, b),
            "fmod_scalar": torch.fmod(a, -2.0),
            "remainder": torch.remainder(a, b),
            "remainder_scalar": a % 2.5,
            "remainder_neg_scalar": a % -2.5,
            "remainder_scalar_tensor": torch.remainder(5.0, b),
            "int_fmod": torch.fmod(i, j),
            "int_fmod_scalar": torch.fmod(i, -4),
            "int_remainder": torch.remainder(i, j),
            "int_remainder_scalar": i % 4,
            "int_remainder_float": i % 2.5,  # -> float32
        },
        a,
        b,
        i,
        j,
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_atan2(opset):
    # quadrants, the axes, signed zeros and infinities
    y = torch.tensor(
        [0.0, 1.0, -1.0, 1.0, -1.0, 2.0, -2.0, 0.0, 0.0, 3.0, -3.0, 0.0, -0.0, -0.0, INF, -INF, 1.0, INF, NAN]
    )
    x = torch.tensor(
        [0.0, 1.0, 1.0, -1.0, -1.0, 0.0, 0.0, -2.0, 2.0, -0.5, -0.5, -0.0, -0.0, -1.0, INF, -INF, -INF, 2.0, 1.0]
    )
    i = torch.tensor([1, -2, 3, 0])
    j = torch.tensor([-1, -2, 0, 4])
    program = check(lambda y, x, i, j: (torch.atan2(y, x), torch.atan2(i, j)), y, x, i, j, opset=opset)
    assert "Atan" in onnx_ops(program)


@pytest.mark.parametrize("opset", OPSETS)
def test_maximum_minimum(opset):
    a = torch.tensor([1.0, NAN, 3.0, -INF, INF, NAN, -0.5])
    b = torch.tensor([2.0, 1.0, NAN, 0.0, 1.0, NAN, -0.25])
    i = torch.tensor([1, -5, 3])
    j = torch.tensor([2, -7, 3], dtype=torch.int32)
    p = torch.tensor([True, False, True])
    q = torch.tensor([False, False, True])
    check(
        lambda a, b, i, j, p, q: {
            "maximum": torch.maximum(a, b),  # NaN propagates from either side
            "minimum": torch.minimum(a, b),
            "int_max": torch.maximum(i, j),  # int32 with int64 -> int64
            "int_min": torch.minimum(i, j),
            "int_float": torch.maximum(i, a[:3]),  # -> float32
            "bool_max": torch.maximum(p, q),
            "bool_min": torch.minimum(p, q),
        },
        a,
        b,
        i,
        j,
        p,
        q,
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_clamp(opset):
    x = torch.tensor([[-3.0, -0.5, 0.0, 0.7, 2.0, NAN]])
    lo = torch.tensor([[-1.0], [0.5]])
    hi = torch.tensor([1.0, 1.0, 1.0, 0.6, 3.0, 1.0])
    i = torch.tensor([-5, 0, 3, 9])
    check(
        lambda x, lo, hi, i: {
            "both": torch.clamp(x, -1.0, 1.0),
            "min": torch.clamp(x, min=0.1),
            "max": torch.clamp(x, max=0.1),
            "crossed": torch.clamp(x, 1.0, -1.0),  # min > max: everything is max
            "tensor_both": torch.clamp(x, lo, hi),
            "tensor_min": torch.clamp(x, min=lo),
            "tensor_max": torch.clamp(x, max=hi),
            "int": torch.clamp(i, -1, 4),
            "int_float_bounds": torch.clamp(i, 0.5, 2.5),  # -> float32
            "clamp_min": x.clamp_min(0.0),
        },
        x,
        lo,
        hi,
        i,
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_where(opset):
    x, y = _inputs(3)[:2]
    i = torch.arange(20).reshape(4, 5)
    check(
        lambda x, y, i: {
            "float": torch.where(x > 0, x, y),
            "broadcast": torch.where(x[:, :1] > 0, x, y[0]),
            "int": torch.where(i % 2 == 0, i, -i),
            "int_float": torch.where(x > 0, i, y),  # -> float32
        },
        x,
        y,
        i,
        opset=opset,
    )


# -- comparison, logical, bitwise ----------------------------------------------------------------------


def _comparisons(a, b):
    return {
        "eq": a == b,
        "ne": a != b,
        "lt": a < b,
        "le": a <= b,
        "gt": a > b,
        "ge": a >= b,
    }


@pytest.mark.parametrize("opset", OPSETS)
def test_comparisons(opset):
    a = torch.tensor([1.0, 2.0, NAN, -INF, 0.5, 3.0])
    b = torch.tensor([1.0, 1.0, NAN, 0.0, 0.5, NAN])
    i = torch.tensor([1, 2, 3, 4, 5, 6])
    p = torch.tensor([True, False, True, False, True, False])
    q = torch.tensor([True, True, False, False, True, True])

    def fn(a, b, i, p, q):
        out = {}
        for label, (lhs, rhs) in {
            "float": (a, b),
            "float_scalar": (a, 1.0),
            "int": (i, i.flip(0)),
            "int_scalar": (i, 3),
            "int_float_scalar": (i, 2.5),  # compared in float
            "int_float": (i, a),
            "bool": (p, q),
            "bool_scalar": (p, True),
        }.items():
            out.update({f"{label}_{k}": v for k, v in _comparisons(lhs, rhs).items()})
        return out

    check(fn, a, b, i, p, q, opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_logical_isinf_isnan(opset):
    p = torch.tensor([True, False, True, False])
    q = torch.tensor([True, True, False, False])
    x = torch.tensor([0.0, -1.5, NAN, 2.0])
    i = torch.tensor([0, 3, 0, -2])
    special = torch.tensor([0.0, INF, -INF, NAN, 1e38, -3.0])
    check(
        lambda p, q, x, i, special: {
            "isinf": torch.isinf(special),
            "isnan": torch.isnan(special),
            "isinf_half": torch.isinf(special.half()),  # IsInf takes float16 only from opset 20
            "isinf_int": torch.isinf(i),
            "isnan_int": torch.isnan(i),
            "isnan_bool": torch.isnan(p),
            "and": torch.logical_and(p, q),
            "or": torch.logical_or(p, q),
            "xor": torch.logical_xor(p, q),
            "not": torch.logical_not(p),
            "and_float": torch.logical_and(x, i),
            "or_int": torch.logical_or(i, p),
            "xor_float": torch.logical_xor(x, q),
            "not_float": torch.logical_not(x),  # NaN is true
            "not_int": torch.logical_not(i),
        },
        p,
        q,
        x,
        i,
        special,
        opset=opset,
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_bitwise(opset):
    i = torch.tensor([0, 5, -6, 12, 255])
    j = torch.tensor([3, 6, 7, -1, 15])
    s = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)
    u = torch.tensor([0, 1, 127, 128, 255], dtype=torch.uint8)
    p = torch.tensor([True, False, True, False, True])
    q = torch.tensor([True, True, False, False, False])
    program = check(
        lambda i, j, s, u, p, q: {
            "and": i & j,
            "or": i | j,
            "xor": i ^ j,
            "and_scalar": i & 4,
            "or_scalar": torch.ops.aten.bitwise_or.Scalar(i, 8),
            "xor_scalar": i ^ -1,
            "mixed": s & i,  # int32 with int64 -> int64
            "not": ~i,
            "not_int32": ~s,
            "not_uint8": ~u,
            "bool_and": p & q,
            "bool_or": p | q,
            "bool_xor": p ^ q,
            "bool_not": ~p,
            "bool_int": p | s,
        },
        i,
        j,
        s,
        u,
        p,
        q,
        opset=opset,
    )
    ops = onnx_ops(program)
    assert {"BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Not"} <= set(ops)


@pytest.mark.parametrize("opset", OPSETS)
def test_and_or_operators_as_captured(opset):
    """torch.export keeps ``&`` and ``|`` as aten::__and__/__or__ (transformers' attention masks
    use them); covering them lets the export skip torch's decomposition pass."""
    i = torch.tensor([0, 5, -6, 12, 255])
    s = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)
    p = torch.tensor([True, False, True, False, True])
    program = check(lambda i, s, p: (i & s, i | 3 * i, p & (i > 0), p | (s > 2)), i, s, p, opset=opset)
    torch_ops = {m.value for n in program.model_proto.graph.node for m in n.metadata_props if m.key == "opreg.torch_op"}
    assert {"aten::__and__.Tensor", "aten::__or__.Tensor"} <= torch_ops
    assert {"BitwiseAnd", "BitwiseOr", "And", "Or"} <= set(onnx_ops(program))


# -- activations ------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_activations(opset):
    x = torch.cat([torch.linspace(-6, 6, 49), torch.tensor([-30.0, 30.0, 0.0, 3.0, -3.0])])
    i = torch.tensor([-9, -1, 0, 3, 8])
    program = check(
        lambda x, i: {
            "relu": F.relu(x),
            "elu": F.elu(x),
            "elu_alpha": F.elu(x, alpha=0.5),
            "elu_scaled": torch.ops.aten.elu(x, 1.5, 2.0, 0.5),
            "selu": F.selu(x),
            "celu": F.celu(x, alpha=2.0),
            "leaky_relu": F.leaky_relu(x),
            "leaky_relu_slope": F.leaky_relu(x, 0.2),
            "hardtanh": F.hardtanh(x),
            "hardtanh_range": F.hardtanh(x, -2.0, 0.5),
            "relu6": F.relu6(x),  # hardtanh(0, 6) by the time opreg sees it
            "hardswish": F.hardswish(x),
            "hardsigmoid": F.hardsigmoid(x),
            "softplus": F.softplus(x),
            "softplus_beta": F.softplus(x, beta=2.0, threshold=5.0),
            "softplus_big": F.softplus(x * 10),  # above the threshold: x itself
            "mish": F.mish(x),
            "silu": F.silu(x),
            "hardtanh_int": F.hardtanh(i, -2, 5),
        },
        x,
        i,
        opset=opset,
    )
    ops = set(onnx_ops(program))
    assert {"Elu", "Selu", "Celu", "LeakyRelu", "Clip", "HardSwish", "HardSigmoid", "Softplus", "Mish"} <= ops
    # silu stays Sigmoid and Mul at every opset: onnxruntime has no kernel for Swish (opset 24)
    assert "Sigmoid" in ops and "Swish" not in ops


@pytest.mark.parametrize("opset", OPSETS)
def test_gelu_from_opset_20(opset):
    x = torch.linspace(-5, 5, 41)
    program = check(lambda x: (F.gelu(x), F.gelu(x, approximate="tanh")), x, opset=opset)
    ops = onnx_ops(program)
    assert ops.count("Gelu") == (2 if opset >= 20 else 0)
