"""The core ATen ops this pack deliberately leaves without an impl, and why.

This is the one place they are listed. They are declared to the registry, so
``opreg check`` and export errors give the reason instead of "no impl", and
``bench/coverage.py`` counts them apart from ops simply not written yet.
"""

from __future__ import annotations

_GRADIENT = (
    "a gradient op: torch.export of a forward pass never emits it, and opreg exports inference graphs "
    "(export the model in eval() mode, without autograd)"
)
_RNG = (
    "draws from torch's random generator, whose stream ONNX cannot reproduce "
    "(ONNX's Random* ops have their own seeds); pass random tensors in as inputs instead"
)

UNSUPPORTED: dict[str, str] = {
    "aten::_adaptive_avg_pool2d_backward.default": _GRADIENT,
    "aten::avg_pool2d_backward.default": _GRADIENT,
    "aten::convolution_backward.default": _GRADIENT,
    "aten::embedding_dense_backward.default": _GRADIENT,
    "aten::max_pool2d_with_indices_backward.default": _GRADIENT,
    "aten::native_group_norm_backward.default": _GRADIENT,
    "aten::native_layer_norm_backward.default": _GRADIENT,
    "aten::rand.default": _RNG,
    "aten::randn.default": _RNG,
    "aten::randperm.default": _RNG,
    "aten::_fft_r2c.default": (
        "returns a complex tensor; ONNX has no complex element type in its standard ops "
        "(DFT packs real/imaginary into a trailing axis), so opreg does not model complex values"
    ),
    "aten::_fft_c2r.default": (
        "takes a complex tensor; ONNX has no complex element type in its standard ops, "
        "so opreg does not model complex values"
    ),
    "aten::_native_batch_norm_legit.default": (
        "the in-place form, writing the new running statistics into running_mean/running_var; "
        "torch.export replaces it with aten::_native_batch_norm_legit_functional, which returns them "
        "and is implemented, so an exported graph does not hold it"
    ),
    "aten::as_strided.default": (
        "reads the input's underlying storage by offset and strides; ONNX tensors are values "
        "without storage, so views of views cannot be reproduced in general"
    ),
    "aten::sym_storage_offset.default": "asks for a storage offset; ONNX tensors have no storage",
    "aten::atan2.out": (
        "an out= variant writes into a preallocated tensor; torch.export's functional graphs use "
        "aten::atan2.default, which is implemented"
    ),
}
"""Torch op -> why the core pack has no impl for it."""


def register(registry) -> None:
    for op, reason in UNSUPPORTED.items():
        registry.mark_unsupported(op, reason)
