"""The core ATen ops this pack leaves without an impl, and why: out of scope, or not
implemented yet (and then what they would map to).

This is the one place they are listed. They are declared to the registry, so
``opreg check`` and export errors give the reason instead of "no impl", and
``bench/coverage.py`` counts them apart from ops simply not written yet. Every
reason must be true: ONNX *can* express random numbers and DFTs, so those are "not
implemented yet", never "ONNX cannot".
"""

from __future__ import annotations

_GRADIENT = (
    "a gradient op: torch.export of a forward pass never emits it, and opreg exports inference graphs "
    "(export a forward pass, not a training step)"
)


def _rng(onnx_form: str) -> str:
    return (
        f"not implemented yet: would map to {onnx_form}, whose numbers follow the runtime's generator, "
        "not torch's (so only their distribution can be checked); pass random tensors in as inputs meanwhile"
    )


UNSUPPORTED: dict[str, str] = {
    "aten::_adaptive_avg_pool2d_backward.default": _GRADIENT,
    "aten::avg_pool2d_backward.default": _GRADIENT,
    "aten::convolution_backward.default": _GRADIENT,
    "aten::embedding_dense_backward.default": _GRADIENT,
    "aten::max_pool2d_with_indices_backward.default": _GRADIENT,
    "aten::native_group_norm_backward.default": _GRADIENT,
    "aten::native_layer_norm_backward.default": _GRADIENT,
    "aten::rand.default": _rng("ONNX's RandomUniform"),
    "aten::randn.default": _rng("ONNX's RandomNormal"),
    "aten::randperm.default": _rng("the order of RandomUniform keys (TopK indices)"),
    "aten::_fft_r2c.default": (
        "not implemented yet: would map to ONNX's DFT (onesided), its complex result carried as a "
        "trailing dimension of 2 (real, imaginary), the convention opreg's design fixes for complex tensors"
    ),
    "aten::_fft_c2r.default": (
        "not implemented yet: would map to ONNX's inverse DFT of the spectrum rebuilt from its "
        "Hermitian half, the complex input carried as a trailing dimension of 2 (real, imaginary)"
    ),
    "aten::_native_batch_norm_legit.default": (
        "the in-place form, writing the new running statistics into running_mean/running_var; "
        "torch.export replaces it with aten::_native_batch_norm_legit_functional, which returns them "
        "and is implemented, so an exported graph does not hold it"
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
