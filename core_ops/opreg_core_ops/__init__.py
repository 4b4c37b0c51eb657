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
        comparison,
        convolution,
        creation,
        dropout,
        elementwise,
        indexing,
        joining,
        linalg,
        normalization,
        padding,
        pooling,
        quantization,
        reduction,
        resampling,
        shape,
        special,
    )

    for module in (
        elementwise,
        comparison,
        activation,
        linalg,
        convolution,
        normalization,
        attention,
        pooling,
        resampling,
        padding,
        dropout,
        reduction,
        creation,
        indexing,
        joining,
        shape,
        quantization,
        special,
    ):
        module.register(registry)
    unsupported.register(registry)
