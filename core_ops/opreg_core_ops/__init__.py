"""opreg's core pack: ATen ops -> standard ONNX (ai.onnx).

Loaded through the ``opreg.plugins`` entry point like any other pack.
Importing this module is cheap; the op modules are imported when the hook runs.
"""

from __future__ import annotations

import opreg

OPREG_API_VERSION = 1


@opreg.hookimpl
def opreg_register_ops(registry: opreg.Registrar) -> None:
    from opreg_core_ops import unsupported
    from opreg_core_ops.ops import (
        activation,
        attention,
        binning,
        comparison,
        complex,
        convolution,
        creation,
        cumulative,
        dropout,
        elementwise,
        embedding_bag,
        indexing,
        joining,
        linalg,
        noops,
        normalization,
        onnx_ops,
        padding,
        pooling,
        quantization,
        random,
        reduction,
        resampling,
        sets,
        shape,
        special,
        spectral,
        views,
    )

    registry.register_module(
        elementwise, comparison, activation, linalg, convolution, normalization, attention, pooling, resampling,
        padding, dropout, reduction, cumulative, creation, indexing, joining, shape, onnx_ops, random, complex,
        spectral, quantization, special, views, embedding_bag, binning, sets, noops,
    )  # fmt: skip
    for op, reason in unsupported.UNSUPPORTED.items():
        registry.mark_unsupported(op, reason)
