"""Random impls that draw from the wrong distribution, each beside the call and the sample the suite
checks the right impl with (``tests/test_random.py``): issue 26's table of what a moments-only
comparison missed. ``tests/test_random.py`` shows each is found, seeded (one deterministic run);
``bench/distribution_power.py`` counts how often over 20 seeds, and how often the right impls
raise a false alarm.

Each wrong impl is registered by hand on a copy of the default registry, so it wins over the core
pack's for that op and nothing else changes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from onnxscript.onnx_opset import opset18 as op18

import opreg
from opreg.testing import Sample


def _cauchy(self, median: float, sigma: float):
    """median + sigma * tan(pi * (U - 1/2)), as the core pack draws Cauchy numbers."""
    u = op18.RandomUniformLike(self)
    spread = op18.Mul(op18.Tan(op18.Mul(op18.Sub(u, 0.5), math.pi)), float(sigma))
    return op18.CastLike(op18.Add(spread, float(median)), self)


def cauchy_swapped(self, median: float = 0.0, sigma: float = 1.0, generator: str | None = None):
    """cauchy(Tensor self, float median=0., float sigma=1., *, Generator? generator=None) -> Tensor:
    median and sigma swapped."""
    return _cauchy(self, sigma, median)


def cauchy_three_times_the_scale(self, median: float = 0.0, sigma: float = 1.0, generator: str | None = None):
    """cauchy(Tensor self, float median=0., float sigma=1., *, Generator? generator=None) -> Tensor: 3 sigma."""
    return _cauchy(self, median, 3 * sigma)


def randn_uniform(size: Sequence[int], dtype: int | None = None, layout: int | None = None, device: str | None = None,
                  pin_memory: bool | None = None):  # fmt: skip
    """randn(SymInt[] size, *, ScalarType? dtype=None, ...) -> Tensor: uniform on [-sqrt 3, sqrt 3), the
    normal's mean (0) and variance (1)."""
    half = math.sqrt(3.0)
    return op18.RandomUniform(shape=list(size), low=-half, high=half, dtype=1 if dtype is None else dtype)


def dropout_a_quarter(input, p: float, train: bool):
    """dropout(Tensor input, float p, bool train) -> Tensor: drops with probability 0.25, whatever p says."""
    keep = op18.Less(op18.RandomUniformLike(input, dtype=11), 0.75)
    return op18.Div(op18.Mul(input, op18.CastLike(keep, input)), 0.75)


@dataclasses.dataclass(frozen=True)
class WrongDistribution:
    """A wrong impl of ``op``, and the call and sample the suite checks that op's right impl with.

    Fields:
        name: the row of issue 26's table.
        op: the torch op the impl is registered for.
        impl: the wrong impl.
        fn: the call, as the suite makes it.
        sample: its inputs, as the suite gives them (seeded: the same every time).
    """

    name: str
    op: str
    impl: Callable
    fn: Callable
    sample: Callable[[], Sample]

    def registry(self) -> opreg.Registry:
        registry = opreg.default_registry().copy()
        registry.register(self.op, self.impl, opset=18)
        return registry


def _randn_sample() -> Sample:
    return Sample.of(torch.zeros(1))  # randn takes only its size; the input is not used


def _means() -> Sample:
    return Sample.of(torch.randn(4, 5, generator=torch.Generator().manual_seed(1)))


def _probabilities() -> Sample:
    return Sample.of(torch.rand(4, 6, generator=torch.Generator().manual_seed(2)))


RANDN_SIZE = (10, 100)
"""The suite's randn sample: 1,000 elements, where issue 26 found a uniform passing for a normal."""

WRONG: tuple[WrongDistribution, ...] = (
    WrongDistribution(
        "Cauchy with swapped parameters", "aten::cauchy", cauchy_swapped,
        lambda mean: mean.clone().cauchy_(1.0, 0.5), _means,
    ),
    WrongDistribution(
        "Cauchy with 3x the scale", "aten::cauchy", cauchy_three_times_the_scale,
        lambda mean: mean.clone().cauchy_(1.0, 0.5), _means,
    ),
    WrongDistribution(
        "uniform with the normal's mean and variance", "aten::randn", randn_uniform,
        lambda x: torch.randn(*RANDN_SIZE, dtype=torch.float64) + 0 * x.sum(), _randn_sample,
    ),
    WrongDistribution(
        "dropout 0.25 instead of 0.3", "aten::dropout", dropout_a_quarter,
        lambda p: F.dropout(p, 0.3, training=True), _probabilities,
    ),
)  # fmt: skip
