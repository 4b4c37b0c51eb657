"""opreg pack for the tutorial's custom op ``mylibrary::addandround_op``.

Importing this module is cheap, and so is loading the pack: the torch op is defined
when first used (``opreg_test_customop.addandround_op``, as a model that calls it does)
or when the samples are asked for. The registry checks the impl against the op's schema
when an export first plans it, so loading the pack need not define the op.
"""

from __future__ import annotations

from typing import Any

import opreg

OPREG_API_VERSION = 1
OPREG_REQUIRES_TORCH = ">=2.6"

DOMAIN = "test.customop"
DOMAIN_VERSION = 1
"""The version of test.customop this pack's ops are at; bump it when an op's schema changes."""


def __getattr__(name: str) -> Any:
    if name == "addandround_op":
        from opreg_test_customop.torch_ops import addandround_op

        return addandround_op
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@opreg.hookimpl
def opreg_targets():
    from opreg.registry.targets import DEFAULT_ONNX_OPSET

    return {"test_customop": {"": DEFAULT_ONNX_OPSET, DOMAIN: DOMAIN_VERSION}}


@opreg.hookimpl
def opreg_schemas():
    from opreg_test_customop import runtime

    return runtime.schemas()


@opreg.hookimpl
def opreg_reference_kernels():
    from opreg_test_customop import runtime

    return runtime.reference_kernels()


@opreg.hookimpl
def opreg_functions():
    from opreg_test_customop import runtime

    return runtime.functions()


@opreg.hookimpl
def opreg_samples():
    import torch
    from opreg.testing import Sample

    from opreg_test_customop import torch_ops  # noqa: F401 - the samples call the op: define it

    generator = torch.Generator().manual_seed(0)
    halves = torch.tensor([[-1.25, -0.75, -0.25, 0.25], [0.75, 1.25, 2.0, -3.0]])  # x + x lands on .5: ties
    return {
        "mylibrary::addandround_op": [
            Sample.of(torch.randn(3, 4, generator=generator)),
            Sample.of(halves),
            Sample.of(torch.randn(2, 1, 5, generator=generator) * 100),
            Sample.of(torch.zeros(0, 3)),
        ]
    }


@opreg.hookimpl
def opreg_register_ops(registry: opreg.Registrar) -> None:
    from opreg_test_customop import impls

    registry.register_module(impls)  # every @opreg.impl of the module
