"""transformers' custom ops to standard ONNX."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor


@opreg.impl("transformers::grouped_mm_fallback", opset=18)
def transformers_grouped_mm_fallback(input: Tensor, weight: Tensor, offs: Tensor):
    """grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor: row ``s`` of ``input`` (S, in)
    times ``weight[e]`` (E, in, out), ``e`` the group whose cumulative end ``offs[e]`` first exceeds ``s``;
    rows past ``offs[-1]`` are 0, as transformers' loop leaves them. One MatMul of every row with every
    expert (E, S, out), then GatherElements of each row's own."""
    rows = op18.Shape(input, start=0, end=1)
    index = op18.Range(op18.Constant(value_int=0), op18.Squeeze(rows, [0]), op18.Constant(value_int=1))
    ends = op18.Cast(offs, to=ir.DataType.INT64)
    ended = op18.LessOrEqual(op18.Unsqueeze(ends, [0]), op18.Unsqueeze(index, [1]))  # (S, E): group e ended by row s
    group = op18.ReduceSum(op18.Cast(ended, to=ir.DataType.INT64), [1], keepdims=0)  # (S,)
    experts = op18.Shape(weight, start=0, end=1)
    group = op18.Min(group, op18.Sub(experts, op18.Constant(value_ints=[1])))  # rows past the last group: any
    products = op18.MatMul(op18.Unsqueeze(input, [0]), weight)  # (E, S, out)
    which = op18.Expand(op18.Reshape(group, [1, -1, 1]), op18.Concat([1], rows, op18.Shape(weight, start=2), axis=0))
    picked = op18.Squeeze(op18.GatherElements(products, which, axis=0), [0])  # (S, out)
    inside = op18.Less(index, op18.Slice(ends, [-1], [2**62]))  # (S,): rows within the last group's end
    return op18.Where(op18.Unsqueeze(inside, [1]), picked, op18.CastLike(op18.Constant(value_float=0.0), picked))


def samples() -> dict[str, list[Any]]:
    """Samples for the conformance kit: groups of several rows, empty groups, rows past the last group,
    int32 and int64 offsets."""
    import torch
    import transformers.integrations.moe  # noqa: F401 - defines the op the kit compares with

    from opreg.testing import Sample

    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g)
    weight = torch.randn(3, 5, 4, generator=g)
    return {
        "transformers::grouped_mm_fallback": [
            Sample.of(x, weight, torch.tensor([2, 5, 7])),
            Sample.of(x, weight, torch.tensor([0, 7, 7], dtype=torch.int32)),  # empty groups
            Sample.of(x, weight, torch.tensor([1, 3, 4])),  # rows 4-6 past the last group: 0
            Sample.of(torch.zeros(0, 5), weight, torch.tensor([0, 0, 0])),
        ]
    }
