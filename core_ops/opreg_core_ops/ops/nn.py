"""Neural-network layers: convolution, pooling."""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg_core_ops.ops._helpers import expand_param, rank_of, symmetric_pads


def _conv(input, weight, bias, stride, padding, dilation, groups):
    rank = len(weight.shape) - 2 if weight.shape is not None else 2
    kernel = list(weight.shape[2:]) if weight.shape is not None else None
    attrs = dict(
        strides=expand_param(stride, rank),
        pads=symmetric_pads(padding, rank),
        dilations=expand_param(dilation, rank),
        group=groups,
    )
    if kernel is not None and all(isinstance(k, int) for k in kernel):
        attrs["kernel_shape"] = kernel
    if bias is None:
        return op18.Conv(input, weight, **attrs)
    return op18.Conv(input, weight, bias, **attrs)


def aten_conv2d(
    input,
    weight,
    bias=None,
    stride: Sequence[int] = (1, 1),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    groups: int = 1,
):
    """conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=1, SymInt[2] padding=0, SymInt[2] dilation=1, SymInt groups=1) -> Tensor: Conv."""
    return _conv(input, weight, bias, stride, padding, dilation, groups)


def aten_convolution(
    input,
    weight,
    bias,
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
    rank = len(weight.shape) - 2
    attrs = dict(
        strides=expand_param(stride, rank),
        pads=symmetric_pads(padding, rank),
        dilations=expand_param(dilation, rank),
        output_padding=expand_param(output_padding, rank),
        group=groups,
    )
    if bias is None:
        return op18.ConvTranspose(input, weight, **attrs)
    return op18.ConvTranspose(input, weight, bias, **attrs)


def aten_max_pool2d(
    self,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
):
    """max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> Tensor: MaxPool."""
    kernel = expand_param(kernel_size, 2)
    strides = expand_param(stride, 2) if stride else kernel
    pooled, _indices = op18.MaxPool(
        self,
        kernel_shape=kernel,
        strides=strides,
        pads=symmetric_pads(padding, 2),
        dilations=expand_param(dilation, 2),
        ceil_mode=int(ceil_mode),
    )
    return pooled


def aten_adaptive_avg_pool2d(self, output_size: Sequence[int]):
    """adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor: GlobalAveragePool (output 1x1) or AveragePool (even splits)."""
    size = expand_param(output_size, 2)
    if size == [1, 1]:
        return op18.GlobalAveragePool(self)
    rank = rank_of(self)
    height, width = self.shape[rank - 2], self.shape[rank - 1]
    if not (isinstance(height, int) and isinstance(width, int) and height % size[0] == 0 and width % size[1] == 0):
        raise ValueError(f"adaptive_avg_pool2d to {size} needs static input sizes divisible by it, got {self.shape}")
    kernel = [height // size[0], width // size[1]]
    return op18.AveragePool(self, kernel_shape=kernel, strides=kernel)


def register(registry: opreg.Registrar) -> None:
    registry.register("aten::conv2d", aten_conv2d, opset=18)
    registry.register("aten::convolution", aten_convolution, opset=18)
    registry.register("aten::max_pool2d", aten_max_pool2d, opset=18)
    registry.register("aten::adaptive_avg_pool2d", aten_adaptive_avg_pool2d, opset=18)
