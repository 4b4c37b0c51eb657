"""Convolution: conv1d, conv2d, conv3d and convolution (transposed too)."""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.ops import Tensor, expand_param, rank_of, symmetric_pads


def _unbatched(input, weight) -> bool:
    """Whether ``input`` has no batch dim (C, *spatial): aten::convolution takes that too."""
    return rank_of(input) == rank_of(weight) - 1


def _conv(input, weight, bias, stride, padding, dilation, groups, pads=None):
    """Conv; ``pads``: ONNX's begin-then-end pads, where ``padding`` (the same at both ends) does not say them."""
    rank = len(weight.shape) - 2 if weight.shape is not None else 2
    kernel = list(weight.shape[2:]) if weight.shape is not None else None
    attrs = dict(
        strides=expand_param(stride, rank),
        pads=symmetric_pads(padding, rank) if pads is None else pads,
        dilations=expand_param(dilation, rank),
        group=groups,
    )
    if kernel is not None and all(isinstance(k, int) for k in kernel):
        attrs["kernel_shape"] = kernel
    unbatched = _unbatched(input, weight)
    x = op18.Unsqueeze(input, [0]) if unbatched else input
    y = op18.Conv(x, weight, **attrs) if bias is None else op18.Conv(x, weight, bias, **attrs)
    return op18.Squeeze(y, [0]) if unbatched else y


def _conv_transpose(input, weight, bias, stride, padding, dilation, output_padding, groups):
    """ConvTranspose with torch's output size. ONNX Runtime rejects output_padding >= stride
    (torch allows it below stride or dilation), so the extra rows come from the end pads
    instead: pads end at ``padding - output_padding``, and a zero Pad where that is negative."""
    rank = len(weight.shape) - 2
    pads = expand_param(padding, rank)
    extra = expand_param(output_padding, rank)
    end_pads = [max(p - e, 0) for p, e in zip(pads, extra, strict=True)]
    grow = [max(e - p, 0) for p, e in zip(pads, extra, strict=True)]
    attrs = dict(
        strides=expand_param(stride, rank),
        pads=pads + end_pads,
        dilations=expand_param(dilation, rank),
        group=groups,
    )
    unbatched = _unbatched(input, weight)
    x = op18.Unsqueeze(input, [0]) if unbatched else input
    if not any(grow):
        y = op18.ConvTranspose(x, weight, **attrs) if bias is None else op18.ConvTranspose(x, weight, bias, **attrs)
    else:
        y = op18.Pad(op18.ConvTranspose(x, weight, **attrs), [0] * (rank + 2) + [0, 0] + grow)
        if bias is not None:
            y = op18.Add(y, op18.Unsqueeze(bias, list(range(1, rank + 1))))
    return op18.Squeeze(y, [0]) if unbatched else y


def _floating_input(node) -> bool:
    """ONNX Conv/ConvTranspose take floating types only (no integer convolution)."""
    value = node.args[0].meta.get("val")
    return value is None or value.is_floating_point()


@opreg.impl("aten::conv1d", predicate=_floating_input)
@opreg.impl("aten::conv2d", predicate=_floating_input)
@opreg.impl("aten::conv3d", predicate=_floating_input)
def aten_conv(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Sequence[int] = (1,),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    groups: int = 1,
):
    """conv1d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] stride=1, SymInt[1] padding=0, SymInt[1] dilation=1, SymInt groups=1) -> Tensor: Conv.

    conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=1, SymInt[2] padding=0, SymInt[2] dilation=1, SymInt groups=1) -> Tensor: Conv.

    conv3d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[3] stride=1, SymInt[3] padding=0, SymInt[3] dilation=1, SymInt groups=1) -> Tensor: Conv."""
    return _conv(input, weight, bias, stride, padding, dilation, groups)


@opreg.impl("aten::conv1d.padding", predicate=_floating_input)
@opreg.impl("aten::conv2d.padding", predicate=_floating_input)
@opreg.impl("aten::conv3d.padding", predicate=_floating_input)
def aten_conv_padding(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Sequence[int] = (1,),
    padding: str = "valid",
    dilation: Sequence[int] = (1,),
    groups: int = 1,
):
    """conv1d.padding(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] stride=1, str padding="valid", SymInt[1] dilation=1, SymInt groups=1) -> Tensor: Conv, ``same`` padded as torch pads it (the odd one at the end).

    conv2d.padding(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=1, str padding="valid", SymInt[2] dilation=1, SymInt groups=1) -> Tensor: the same in 2-D.

    conv3d.padding(Tensor input, Tensor weight, Tensor? bias=None, SymInt[3] stride=1, str padding="valid", SymInt[3] dilation=1, SymInt groups=1) -> Tensor: the same in 3-D."""
    rank = rank_of(weight) - 2
    dilations = expand_param(dilation, rank)
    if padding == "valid":
        return _conv(input, weight, bias, stride, 0, dilations, groups)
    if padding != "same":
        raise ValueError(f"conv padding must be 'valid' or 'same', got {padding!r}")
    totals = [d * (k - 1) for d, k in zip(dilations, weight.shape[2:], strict=True)]
    pads = [t // 2 for t in totals] + [t - t // 2 for t in totals]
    return _conv(input, weight, bias, stride, 0, dilations, groups, pads)


@opreg.impl("aten::conv_transpose1d", predicate=_floating_input)
@opreg.impl("aten::conv_transpose2d.input", predicate=_floating_input)
def aten_conv_transpose(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Sequence[int] = (1,),
    padding: Sequence[int] = (0,),
    output_padding: Sequence[int] = (0,),
    groups: int = 1,
    dilation: Sequence[int] = (1,),
):
    """conv_transpose1d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] stride=1, SymInt[1] padding=0, SymInt[1] output_padding=0, SymInt groups=1, SymInt[1] dilation=1) -> Tensor: ConvTranspose.

    conv_transpose2d.input(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=1, SymInt[2] padding=0, SymInt[2] output_padding=0, SymInt groups=1, SymInt[2] dilation=1) -> Tensor: ConvTranspose."""
    rank = rank_of(weight) - 2
    return _conv_transpose(
        input,
        weight,
        bias,
        expand_param(stride, rank),
        expand_param(padding, rank),
        expand_param(dilation, rank),
        expand_param(output_padding, rank),
        groups,
    )


@opreg.impl("aten::convolution", predicate=_floating_input)
def aten_convolution(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
):
    """convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor: Conv or ConvTranspose."""
    if not transposed:
        return _conv(input, weight, bias, stride, padding, dilation, groups)
    return _conv_transpose(input, weight, bias, stride, padding, dilation, output_padding, groups)
