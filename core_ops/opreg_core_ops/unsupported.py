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

_SAMPLER = (
    "not implemented yet: ONNX has no sampler for it, and an exact one from RandomUniform needs rejection "
    "sampling, a Loop whose trip count depends on the draws"
)


UNSUPPORTED: dict[str, str] = {
    "aten::_adaptive_avg_pool2d_backward.default": _GRADIENT,
    "aten::avg_pool2d_backward.default": _GRADIENT,
    "aten::convolution_backward.default": _GRADIENT,
    "aten::embedding_dense_backward.default": _GRADIENT,
    "aten::native_group_norm_backward.default": _GRADIENT,
    "aten::native_layer_norm_backward.default": _GRADIENT,
    "aten::random.default": (
        "not implemented yet: draws integers up to the dtype's largest (2^63 - 1 for int64), more than the 53 "
        "bits of the float64 uniforms random ops are made of; random_(to) is implemented"
    ),
    "aten::random.from": (
        "torch.export cannot capture it: FX writes the call as torch.ops.aten.random.from, a Python syntax "
        "error (`from` is a keyword); random_(to) is implemented"
    ),
    "aten::poisson.default": _SAMPLER,
    "aten::binomial.default": _SAMPLER,
    "aten::_standard_gamma.default": _SAMPLER,
    "aten::_sample_dirichlet.default": _SAMPLER,
    "aten::_native_batch_norm_legit.default": (
        "the in-place form, writing the new running statistics into running_mean/running_var; "
        "torch.export replaces it with aten::_native_batch_norm_legit_functional, which returns them "
        "and is implemented, so an exported graph does not hold it"
    ),
    "aten::atan2.out": (
        "an out= variant writes into a preallocated tensor; torch.export's functional graphs use "
        "aten::atan2.default, which is implemented"
    ),
}
"""Torch op -> why the core pack has no impl for it."""
