"""Normalization: layer, group, RMS, batch and instance norm.

LayerNormalization (opset 17) is the layer-norm impl from opset 17 on, with its
decomposition registered at a lower priority as the fallback; at ai.onnx 16, which has no
LayerNormalization, the decomposition is the impl (ReduceMean-13, Sub, Mul, Sqrt, Reciprocal). Group norm is
InstanceNormalization of the (N, groups, -1) view at every opset, as torch.onnx
spells it: measured on a diffusers VAE decoder (``bench/group_norm.py``, ONNX
Runtime 1.32, one thread) it runs about 0.9x the time of GroupNormalization-21,
which is registered at a lower priority, and of the ReduceMean decomposition
(GroupNormalization-18 scales per group, not per channel, so it is never used).
RMS norm is a decomposition at 18 and RMSNormalization at 23.

Batch norm in eval() is BatchNormalization. In training, torch.export turns it into
``_native_batch_norm_legit_functional``, which *returns* the updated running statistics
instead of writing them: a ReduceMean decomposition with the batch statistics (biased
variance to normalise, unbiased for the running variance, as torch's kernels do).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.onnx_opset import opset16 as op16
from onnxscript.onnx_opset import opset18 as op18
from onnxscript.onnx_opset import opset21 as op21
from onnxscript.onnx_opset import opset23 as op23

import opreg
from opreg.ops import FLOAT_TYPES, HALF_TYPES, Tensor, node_arg, rank_of

_STASH_FLOAT = int(ir.DataType.FLOAT)
"""``stash_type`` of the normalization ops: mean and variance in float32, as torch computes them for half inputs."""


def _default_eps(dtype: ir.DataType) -> float:
    """``torch.finfo(dtype).eps``, rms_norm's default epsilon (float32's for a non-float dtype)."""
    import torch
    from onnx_ir import tensor_adapters

    return torch.finfo(tensor_adapters.to_torch_dtype(dtype) if dtype in FLOAT_TYPES else torch.float32).eps


def _norm_count(normalized_shape) -> int:
    """How many trailing dims ``normalized_shape`` names (a list, or a 1-D INT64 value)."""
    if isinstance(normalized_shape, ir.Value):
        return int(normalized_shape.shape[0])
    return len(normalized_shape)


def _upcast(x):
    """x in float32 if it is float16/bfloat16 (torch computes norms in float there)."""
    return op18.Cast(x, to=ir.DataType.FLOAT) if x.dtype in HALF_TYPES else x


def _like(value, x):
    """``value`` back in ``x``'s dtype, if it was upcast."""
    return op18.CastLike(value, x) if x.dtype in HALF_TYPES else value


def _ones_of(x, start: int, end: int | None = None):
    """Ones in x's dtype shaped like x's dims [start:end] (a default scale)."""
    return op18.Expand(op18.CastLike(1.0, x), op18.Shape(x, start=start, end=end))


def _zeros_of(x, start: int, end: int | None = None):
    return op18.Expand(op18.CastLike(0.0, x), op18.Shape(x, start=start, end=end))


# -- layer norm -------------------------------------------------------------------------


def _layer_norm(input, normalized_shape, weight, bias, eps):
    axis = -_norm_count(normalized_shape)
    scale = weight if weight is not None else _ones_of(input, axis)
    out, mean, rstd = op18.LayerNormalization(
        input, scale, bias, axis=axis, epsilon=float(eps), stash_type=_STASH_FLOAT
    )
    return out, mean, rstd


@opreg.impl("aten::layer_norm")
def aten_layer_norm(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-05,
    cudnn_enable: bool = True,
):
    """layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor: LayerNormalization."""
    out, _mean, _rstd = _layer_norm(input, normalized_shape, weight, bias, eps)
    return out


@opreg.impl("aten::native_layer_norm")
def aten_native_layer_norm(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
):
    """native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor): LayerNormalization (with Mean and InvStdDev)."""
    out, mean, rstd = _layer_norm(input, normalized_shape, weight, bias, eps)
    if input.dtype != ir.DataType.FLOAT:  # the statistics come in float32; torch's are in the input's dtype
        mean, rstd = op18.CastLike(mean, input), op18.CastLike(rstd, input)
    return out, mean, rstd


def _layer_norm_decomposed(input, normalized_shape, weight, bias, eps):
    rank = rank_of(input)
    axes = list(range(rank - _norm_count(normalized_shape), rank))
    x = _upcast(input)
    mean = op18.ReduceMean(x, axes, keepdims=1)
    centered = op18.Sub(x, mean)
    var = op18.ReduceMean(op18.Mul(centered, centered), axes, keepdims=1)
    rstd = op18.Reciprocal(op18.Sqrt(op18.Add(var, op18.CastLike(float(eps), x))))
    out = _like(op18.Mul(centered, rstd), input)
    if weight is not None:
        out = op18.Mul(out, weight)
    if bias is not None:
        out = op18.Add(out, bias)
    return out, _like(mean, input), _like(rstd, input)


@opreg.impl("aten::layer_norm", priority=-1)
def aten_layer_norm_decomposed(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-05,
    cudnn_enable: bool = True,
):
    """layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor: ReduceMean/Sub/Mul/Sqrt decomposition (fallback)."""
    out, _mean, _rstd = _layer_norm_decomposed(input, normalized_shape, weight, bias, eps)
    return out


@opreg.impl("aten::native_layer_norm", priority=-1)
def aten_native_layer_norm_decomposed(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
):
    """native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor): ReduceMean/Sub/Mul/Sqrt decomposition (fallback)."""
    return _layer_norm_decomposed(input, normalized_shape, weight, bias, eps)


def _in_dtype_of(param, x):
    """``param`` in ``x``'s dtype: itself when it has it, so that a weight stays the named initializer
    (a CastLike of a constant is folded into an anonymous one)."""
    return param if param.dtype == x.dtype else op16.CastLike(param, x)


def _layer_norm_16(input, normalized_shape, weight, bias, eps):
    """Layer norm in ai.onnx 16's ops (no LayerNormalization, ReduceMean's axes an attribute): in
    float32 for a half input, as torch computes it."""
    rank = rank_of(input)
    axes = list(range(rank - _norm_count(normalized_shape), rank))
    x = op16.Cast(input, to=ir.DataType.FLOAT) if input.dtype in HALF_TYPES else input
    mean = op16.ReduceMean(x, axes=axes, keepdims=1)
    centered = op16.Sub(x, mean)
    two, epsilon = op16.CastLike(2.0, x), op16.CastLike(float(eps), x)
    std = op16.Sqrt(op16.Add(op16.ReduceMean(op16.Pow(centered, two), axes=axes, keepdims=1), epsilon))
    out = op16.Div(centered, std)
    out = out if weight is None else op16.Mul(out, _in_dtype_of(weight, x))
    out = out if bias is None else op16.Add(out, _in_dtype_of(bias, x))
    rstd = op16.Reciprocal(std)
    if input.dtype in HALF_TYPES:  # rounded once, at the end, as torch's kernel does
        out, mean, rstd = op16.CastLike(out, input), op16.CastLike(mean, input), op16.CastLike(rstd, input)
    return out, mean, rstd


@opreg.impl("aten::layer_norm", opset=(16, 16), priority=1)  # before LayerNormalization-17, which 16 lacks
def aten_layer_norm_16(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-05,
    cudnn_enable: bool = True,
):
    """layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor: at ai.onnx 16 only (LayerNormalization is 17's), ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add."""
    out, _mean, _rstd = _layer_norm_16(input, normalized_shape, weight, bias, eps)
    return out


@opreg.impl("aten::native_layer_norm", opset=(16, 16), priority=1)
def aten_native_layer_norm_16(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
):
    """native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor): at ai.onnx 16 only, ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add (with Mean and InvStdDev)."""
    return _layer_norm_16(input, normalized_shape, weight, bias, eps)


# -- group norm -------------------------------------------------------------------------


def _channel_view(param, rank: int):
    """A per-channel (C,) parameter shaped (C, 1, ..., 1) to broadcast over (N, C, *)."""
    return op18.Unsqueeze(param, list(range(1, rank - 1))) if rank > 2 else param


def _group_norm_decomposed(input, weight, bias, group, eps):
    rank = rank_of(input)
    x = _upcast(input)
    # (N, group, C/group * HxW), spelled out: with N=0 a -1 there would be ambiguous.
    per_group = op18.Div(op18.ReduceProd(op18.Shape(x, start=1), keepdims=1), [group])
    grouped = op18.Reshape(x, op18.Concat(op18.Shape(x, start=0, end=1), [group], per_group, axis=0))
    mean = op18.ReduceMean(grouped, [2], keepdims=1)
    centered = op18.Sub(grouped, mean)
    var = op18.ReduceMean(op18.Mul(centered, centered), [2], keepdims=1)
    rstd = op18.Reciprocal(op18.Sqrt(op18.Add(var, op18.CastLike(float(eps), x))))
    out = _like(op18.Reshape(op18.Mul(centered, rstd), op18.Shape(x)), input)
    if weight is not None:
        out = op18.Mul(out, _channel_view(weight, rank))
    if bias is not None:
        out = op18.Add(out, _channel_view(bias, rank))
    return out, _like(op18.Squeeze(mean, [2]), input), _like(op18.Squeeze(rstd, [2]), input)


def _group_norm_instance(input, weight, bias, group, eps):
    """Group norm as InstanceNormalization of the (N, group, C/group * HxW) view, as torch.onnx
    spells it: ONNX Runtime runs it in one kernel, about twice as fast as the ReduceMean
    decomposition on a diffusers VAE decoder (``python bench/group_norm.py``). Its CPU kernel
    is float32 only: float64 inputs keep the decomposition."""
    if input.dtype == ir.DataType.DOUBLE:
        out, _mean, _rstd = _group_norm_decomposed(input, weight, bias, group, eps)
        return out
    rank = rank_of(input)
    x = _upcast(input)
    # (N, group, C/group * HxW), spelled out: with N=0 a -1 there would be ambiguous.
    per_group = op18.Div(op18.ReduceProd(op18.Shape(x, start=1), keepdims=1), [group])
    grouped = op18.Reshape(x, op18.Concat(op18.Shape(x, start=0, end=1), [group], per_group, axis=0))
    ones, zeros = np.ones(group, dtype=np.float32), np.zeros(group, dtype=np.float32)
    normed = op18.InstanceNormalization(grouped, ones, zeros, epsilon=float(eps))
    out = _like(op18.Reshape(normed, op18.Shape(x)), input)
    if weight is not None:
        out = op18.Mul(out, _channel_view(weight, rank))
    if bias is not None:
        out = op18.Add(out, _channel_view(bias, rank))
    return out


def _group_norm_21(input, weight, bias, group, eps):
    if input.shape is not None and input.shape[0] == 0:
        # GroupNormalization's function body reshapes with -1, which fails on an empty batch.
        out, _mean, _rstd = _group_norm_decomposed(input, weight, bias, group, eps)
        return out
    scale = weight if weight is not None else _ones_of(input, 1, 2)
    shift = bias if bias is not None else _zeros_of(input, 1, 2)
    return op21.GroupNormalization(input, scale, shift, num_groups=group, epsilon=float(eps), stash_type=_STASH_FLOAT)


@opreg.impl("aten::group_norm", opset=18)
@opreg.impl("aten::group_norm", opset=21, priority=-1)  # GroupNormalization-21: slower in ONNX Runtime
def aten_group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-05,
    cudnn_enabled: bool = True,
    *,
    opset: int,
):
    """group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enabled=True) -> Tensor: InstanceNormalization of the grouped view; GroupNormalization (opset 21) below it."""
    if opset >= 21:
        return _group_norm_21(input, weight, bias, num_groups, eps)
    return _group_norm_instance(input, weight, bias, num_groups, eps)


@opreg.impl("aten::native_group_norm", opset=18)
@opreg.impl("aten::native_group_norm", opset=21, priority=-1)  # GroupNormalization-21: slower in ONNX Runtime
def aten_native_group_norm(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    N: int,
    C: int,
    HxW: int,
    group: int,
    eps: float,
    *,
    opset: int,
):
    """native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group, float eps) -> (Tensor, Tensor, Tensor): InstanceNormalization of the grouped view; GroupNormalization (opset 21) below it; the statistics decomposed (dropped when unused)."""
    if opset >= 21:
        out = _group_norm_21(input, weight, bias, group, eps)
    else:
        out = _group_norm_instance(input, weight, bias, group, eps)
    _out, mean, rstd = _group_norm_decomposed(input, None, None, group, eps)
    return out, mean, rstd


# -- RMS norm -------------------------------------------------------------------------


@opreg.impl("aten::rms_norm", opset=18)
@opreg.impl("aten::rms_norm", opset=23)
def aten_rms_norm(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
    *,
    opset: int,
):
    """rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor: Mul/ReduceMean/Sqrt decomposition; RMSNormalization from opset 23."""
    epsilon = _default_eps(input.dtype) if eps is None else float(eps)
    if opset >= 23:
        axis = -_norm_count(normalized_shape)
        scale = weight if weight is not None else _ones_of(input, axis)
        return op23.RMSNormalization(input, scale, axis=axis, epsilon=epsilon, stash_type=_STASH_FLOAT)
    rank = rank_of(input)
    axes = list(range(rank - _norm_count(normalized_shape), rank))
    x = _upcast(input)
    mean_square = op18.ReduceMean(op18.Mul(x, x), axes, keepdims=1)
    rms = op18.Sqrt(op18.Add(mean_square, op18.CastLike(epsilon, x)))
    out = _like(op18.Div(x, rms), input)
    return out if weight is None else op18.Mul(out, weight)


# -- batch and instance norm -------------------------------------------------------------


def _empty_stats(dtype: ir.DataType = ir.DataType.FLOAT):
    """The (0,)-shaped save_mean/save_invstd torch returns outside training."""
    return np.zeros((0,), dtype=dtype.numpy())


def _const(value: float, like):
    """``value`` as a constant of ``like``'s type, exactly (a Python float in CastLike
    would pass through FLOAT first)."""
    dtype = like.dtype  # a traced value's ir.DataType, or a numpy constant's dtype
    return np.array(value, dtype=dtype.numpy() if isinstance(dtype, ir.DataType) else dtype)


def _static_empty(input) -> bool:
    """A static shape with a 0 in it: torch's batch norm returns a copy of such an input."""
    shape = input.shape
    return shape is not None and any(isinstance(d, int) and d == 0 for d in shape)


def _batch_norm_eval(input, weight, bias, running_mean, running_var, eps):
    if _static_empty(input):
        # also the 1-D empty input torch accepts, where BatchNormalization has no channel dim
        return op18.Identity(input)
    scale = weight if weight is not None else _ones_of(input, 1, 2)
    shift = bias if bias is not None else _zeros_of(input, 1, 2)
    out, _mean, _var = op18.BatchNormalization(
        input, scale, shift, running_mean, running_var, epsilon=float(eps), training_mode=0
    )
    return out


@opreg.impl("aten::_native_batch_norm_legit_no_training")
def aten_native_batch_norm_legit_no_training(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    momentum: float,
    eps: float,
):
    """_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor): BatchNormalization (training_mode=0)."""
    out = _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)
    return out, _empty_stats(), _empty_stats()


def _eval_batch_norm(node) -> bool:
    """Running statistics, not updated: batch norm in eval mode."""
    return node_arg(node, 5, "training") is False and node_arg(node, 3, "running_mean") is not None


@opreg.impl("aten::batch_norm", predicate=_eval_batch_norm)
def aten_batch_norm(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
):
    """batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled) -> Tensor: BatchNormalization (eval only)."""
    return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)


@opreg.impl("aten::native_batch_norm", predicate=_eval_batch_norm)
def aten_native_batch_norm(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
):
    """native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor): BatchNormalization (eval only)."""
    out = _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)
    return out, _empty_stats(), _empty_stats()


def _batch_norm_training(input, weight, bias, eps):
    """Normalise with the batch statistics over every dim but the channel (dim 1), in float32
    for half inputs. Returns the output, the flat mean and rstd (computation type), and the
    sum of squared deviations and the element count per channel, for the running variance."""
    rank = rank_of(input)
    axes = [0, *range(2, rank)]
    x = _upcast(input)
    mean = op18.ReduceMean(x, axes, keepdims=1)
    centered = op18.Sub(x, mean)
    squares = op18.ReduceSum(op18.Mul(centered, centered), axes, keepdims=1)
    sizes = [input.shape[a] for a in axes]
    if all(isinstance(d, int) for d in sizes):
        count = _const(float(np.prod(sizes)), x)
    else:
        count = op18.CastLike(op18.ReduceProd(op18.Gather(op18.Shape(x), axes), keepdims=0), x)
    rstd = op18.Reciprocal(op18.Sqrt(op18.Add(op18.Div(squares, count), _const(eps, x))))
    out = _like(op18.Mul(centered, rstd), input)
    if weight is not None:
        out = op18.Mul(out, _channel_view(weight, rank))
    if bias is not None:
        out = op18.Add(out, _channel_view(bias, rank))
    return out, op18.Reshape(mean, [-1]), op18.Reshape(rstd, [-1]), op18.Reshape(squares, [-1]), count


@opreg.impl("aten::_native_batch_norm_legit.no_stats")
def aten_native_batch_norm_legit_no_stats(
    input: Tensor, weight: Tensor | None, bias: Tensor | None, training: bool, momentum: float, eps: float
):
    """_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor? bias, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor): ReduceMean decomposition over all dims but the channel (batch statistics, no running stats)."""
    out, mean, rstd, _squares, _count = _batch_norm_training(input, weight, bias, eps)
    return out, _like(mean, input), _like(rstd, input)


def _computing(value, input):
    """``value`` in the type ``input``'s statistics are computed in (float32 for half inputs)."""
    wanted = ir.DataType.FLOAT if input.dtype in HALF_TYPES else input.dtype
    return value if value.dtype == wanted else op18.Cast(value, to=wanted)


@opreg.impl("aten::_native_batch_norm_legit_functional")
def aten_native_batch_norm_legit_functional(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    training: bool,
    momentum: float,
    eps: float,
):
    """_native_batch_norm_legit_functional(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor, Tensor running_mean_out, Tensor running_var_out): training: ReduceMean decomposition with the batch statistics, and the running statistics updated as outputs ((1 - momentum) * running + momentum * batch, the unbiased variance); otherwise BatchNormalization with the running statistics, returned unchanged.

    The running statistics come out in the computation type (float32 for a half input): that
    is what torch.export's graph declares, though torch's eager CPU kernel returns them in
    their own type (the values agree; the mutated buffer keeps its type either way).
    """
    if not training:
        out = _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)
        empty = _empty_stats(input.dtype)
        return out, empty, empty, _computing(running_mean, input), _computing(running_var, input)
    out, mean, rstd, squares, count = _batch_norm_training(input, weight, bias, eps)
    unbiased = op18.Div(squares, op18.Sub(count, _const(1.0, count)))  # n = 1: 0/0, NaN as in torch

    def updated(running, batch):
        kept = op18.Mul(_computing(running, input), _const(1.0 - momentum, batch))
        return op18.Add(kept, op18.Mul(batch, _const(momentum, batch)))

    return out, _like(mean, input), _like(rstd, input), updated(running_mean, mean), updated(running_var, unbiased)


@opreg.impl("aten::_batch_norm_with_update_functional")
def aten_batch_norm_with_update_functional(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    momentum: float,
    eps: float,
):
    """_batch_norm_with_update_functional(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor running_mean_out, Tensor running_var_out): training batch norm, as _native_batch_norm_legit_functional with training=True (the reserve output empty, as on CPU)."""
    out, mean, rstd, new_mean, new_var = aten_native_batch_norm_legit_functional(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    reserve = op18.Constant(value=ir.tensor(np.zeros((0,), dtype=np.uint8)))
    return out, mean, rstd, reserve, new_mean, new_var


def _instance_norm_covered(node) -> bool:
    """Batch statistics, or running statistics that are given (not training-time updates)."""
    use_input_stats = node_arg(node, 5, "use_input_stats")
    return bool(use_input_stats) or node_arg(node, 3, "running_mean") is not None


@opreg.impl("aten::instance_norm", predicate=_instance_norm_covered)
def aten_instance_norm(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    use_input_stats: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
):
    """instance_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool use_input_stats, float momentum, float eps, bool cudnn_enabled) -> Tensor: InstanceNormalization (or BatchNormalization with running stats)."""
    if not use_input_stats:
        return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)
    scale = weight if weight is not None else _ones_of(input, 1, 2)
    shift = bias if bias is not None else _zeros_of(input, 1, 2)
    return op18.InstanceNormalization(input, scale, shift, epsilon=float(eps))


# -- weight norm --------------------------------------------------------------------------------


@opreg.impl("aten::_weight_norm")
def aten_weight_norm(v: Tensor, g: Tensor, dim: int = 0):
    """_weight_norm(Tensor v, Tensor g, int dim=0) -> Tensor: ``v * g / ReduceL2(v)`` over every dim but ``dim`` (all of them for -1), as torch's norm_except_dim."""
    rank = rank_of(v)
    if rank is None:
        raise ValueError("_weight_norm needs the rank of v")
    axes = list(range(rank)) if dim == -1 else [a for a in range(rank) if a != dim % rank]
    norm = op18.ReduceL2(v, axes, keepdims=1) if axes else op18.Abs(v)
    return op18.Mul(v, op18.Div(g, norm))
