"""Non-negative axes (``opreg/exporter/_axes.py``): impls pass torch's ``dim=-1`` through, and the
recorder counts it from the front, so ``onnx.reference`` and onnxscript's constant folder (which
evaluates nodes with it) handle every node."""

from __future__ import annotations

import collections

import onnx_ir as ir
import pytest
import torch

import opreg
from opreg.exporter._axes import AXIS_OPS, FUSION_SPELLED
from tests.optest import Lambda

ATOL = 1e-5


def _negative_axes(program) -> list[str]:
    """Every ai.onnx node of ``program`` naming an axis from the back: ``op.attribute=value``."""
    found = []
    for node in ir.traversal.RecursiveGraphIterator(program.model.graph):
        slot = AXIS_OPS.get(node.op_type)
        if node.domain != "" or slot is None or node.op_type in FUSION_SPELLED:
            continue
        attr = node.attributes.get(slot.attribute) if slot.attribute else None
        if attr is not None:
            values = [attr.value] if attr.type == ir.AttributeType.INT else list(attr.value)
            found += [f"{node.op_type}.{attr.name}={v}" for v in values if v < 0]
        value = node.inputs[slot.input] if slot.input is not None and len(node.inputs) > slot.input else None
        if value is not None and value.const_value is not None:
            found += [f"{node.op_type}.input{slot.input}={v}" for v in value.const_value.numpy().reshape(-1) if v < 0]
    return found


x = torch.randn(2, 3, 4)
LAST_DIM = {
    "gather": (lambda x, i: torch.gather(x, -1, i), (x, torch.randint(0, 4, (2, 3, 2)))),
    "max": (lambda x: x.max(-1), (x,)),
    "min": (lambda x: x.min(-1, keepdim=True), (x,)),
    "sort": (lambda x: x.sort(-1, descending=True), (x,)),
    "topk": (lambda x: x.topk(2, -1), (x,)),
    "searchsorted": (
        lambda s, v: torch.searchsorted(s, v, right=True),
        (torch.sort(torch.randn(2, 5)).values, torch.randn(2, 3)),
    ),
    "diagonal": (lambda x: torch.diagonal(x, 0, -2, -1), (x,)),
    "diagonal_offset": (lambda x: torch.diagonal(x, 1, -1, 0), (torch.randn(4, 4, 3),)),
    "softmax_cat_cumsum": (lambda x: torch.cat([x.softmax(-1), x.cumsum(-1)], -1), (x,)),
    "unsqueeze_squeeze_sum": (lambda x: x.unsqueeze(-1).sum(-1).unsqueeze(-2).squeeze(-2), (x,)),
    "split_flatten_norm": (
        lambda x: torch.nn.functional.layer_norm(x.split(2, -1)[1].flatten(-2), (6,)),
        (x,),
    ),
    # rank 1, where -1 and 0 are one axis of the input, but -1 of an unsqueeze's output is 1 (issue 53: both sides)
    "rank1": (
        lambda v: (torch.cat([v.softmax(-1), v.cumsum(-1)], -1), v.unsqueeze(-1), v.unsqueeze(0), v.sort(-1)[0],
                   v.topk(2, -1)[1], v.max(-1)[0], torch.gather(v, -1, torch.tensor([3, 0]))),
        (torch.randn(5),),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(LAST_DIM))
def test_dim_minus_one_runs_in_the_reference_evaluator(case):
    """``program.run(..., runtime="reference")`` of ops over dim -1: onnx.reference's GatherElements
    compared the wrong dims for a negative axis and raised (gather, max/min, diagonal)."""
    fn, args = LAST_DIM[case]
    program = opreg.export(Lambda(fn), args)
    assert _negative_axes(program) == []
    result = program.verify(*args, runtime="reference", atol=ATOL)
    assert result.runtime == "reference"
    program.verify(*args, atol=ATOL)  # and ONNX Runtime agrees


def _gaussian(window: int, sigma: torch.Tensor) -> torch.Tensor:
    """kornia's ``gaussian``: (B, window) weights around the window's middle, the nearest sample 1."""
    x = (torch.arange(window, dtype=sigma.dtype) - window // 2).expand(sigma.shape[0], -1)
    dist = x.pow(2.0)
    dist = dist - dist.min(-1, keepdim=True)[0]
    denominator = 2 * sigma.pow(2.0)
    impulse = denominator == 0
    gauss = torch.exp(-dist / torch.where(impulse, torch.ones_like(denominator), denominator))
    gauss = torch.where(impulse, (dist == 0).to(dist.dtype), gauss)
    return gauss / gauss.sum(-1, keepdim=True)


class GaussianBlur(torch.nn.Module):
    """kornia's ``gaussian_blur2d`` as it computes it: a kernel from sigma (arange, exp, sum,
    normalize) at every call, applied as two separable depthwise convolutions."""

    def __init__(self, window: int = 5, sigma: float = 1.5) -> None:
        super().__init__()
        self.window, self.sigma = window, sigma

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        channels = image.shape[1]
        sigma = torch.tensor([[self.sigma]], dtype=image.dtype)
        kernel = _gaussian(self.window, sigma)
        pad = self.window // 2
        rows = kernel[:, None, None, :].expand(channels, -1, -1, -1)
        out = torch.nn.functional.pad(image, [pad, pad, 0, 0], mode="reflect")
        out = torch.nn.functional.conv2d(out, rows, groups=channels)
        columns = kernel[:, None, :, None].expand(channels, -1, -1, -1)
        out = torch.nn.functional.pad(out, [0, 0, pad, pad], mode="reflect")
        return torch.nn.functional.conv2d(out, columns, groups=channels)


class AntialiasedResize(torch.nn.Module):
    """kornia's ``resize(..., antialias=True)``: a gaussian blur whose sigma follows the scale, then
    a bilinear resize."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        blurred = GaussianBlur(window=3, sigma=0.5)(image)
        return torch.nn.functional.interpolate(blurred, size=(8, 8), mode="bilinear", align_corners=False)


@pytest.mark.parametrize(
    ("model", "most"),
    # torch.onnx's counts for the same modules (torch 2.13, opset 18): 6 and 7
    [(GaussianBlur(), {"Pad": 2, "Conv": 2}), (AntialiasedResize(), {"Pad": 2, "Conv": 2, "Resize": 1})],
)
def test_kernels_computed_from_constants_fold(model, most):
    """The kernel computed at every call folds into the Conv weights: it took a GatherElements
    over dim -1 (the min), which the folder's reference evaluator could not run, and 24 nodes
    stayed in the graph."""
    image = torch.rand(1, 3, 16, 16)
    program = opreg.export(model, (image,))
    ops = collections.Counter(node.op_type for node in program.model.graph)
    assert ops == collections.Counter(most), ops
    program.verify(image, atol=ATOL)


def test_normalized_where_ranks_are_known_only():
    """A dynamic input keeps its rank, so its axes are counted from the front too."""

    def fn(x):
        return torch.nn.functional.one_hot(x.argmax(-1), 4) + x.cumsum(-1).flatten(-2).topk(4, -1)[1][:, None, :]

    program = opreg.export(Lambda(fn), (x,), dynamic_shapes=(({0: torch.export.Dim.DYNAMIC},),))  # forward(*args)
    assert _negative_axes(program) == []
    axes = {n.op_type: n.attributes["axis"].value for n in program.model.graph if n.op_type in ("ArgMax", "TopK")}
    assert axes == {"ArgMax": 2, "TopK": 1}
    other = torch.randn(5, 3, 4)
    program.verify(other, atol=ATOL)
    program.verify(other, atol=ATOL, runtime="reference")


def test_axes_fusion_tools_match_as_minus_one_stay_so():
    """onnxscript's and ORT's fusion patterns spell the last axis of a Softmax, Concat, ReduceMean
    or Slice as -1 (layer and RMS normalization, rotary embeddings, attention): those keep it, and
    the reference evaluator and the folder handle them."""

    def fn(x):
        return torch.cat([x.softmax(-1), x - x.mean(-1, keepdim=True), x[..., 1:]], -1)

    program = opreg.export(Lambda(fn), (x,))
    axes = {n.op_type: n.attributes["axis"].value for n in program.model.graph if "axis" in n.attributes}
    assert axes == {"Softmax": -1, "Concat": -1}
    mean = next(n for n in program.model.graph if n.op_type == "ReduceMean")
    assert mean.inputs[1].const_value.numpy().tolist() == [-1]
    program.verify(x, atol=ATOL, runtime="reference")
