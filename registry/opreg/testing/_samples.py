"""Drive an op with sample inputs: export a one-op model, run it, compare with eager.

All samples of one call go into a single model (one capture, one session),
because an export costs far more than running it; only when that model fails
are the samples exported one by one, so each result names its own sample.

How a sample's outputs are compared is a :data:`Compare` hook:
:func:`compare_outputs` (every output elementwise, the default),
:class:`GatherIndices` (ops returning indices into their input, where ties
make the indices ambiguous: sort, topk, max.dim, ...), :class:`ScaledTolerance`
(transforms whose errors spread over every output: FFTs) or :class:`Distribution`
(random ops: their outputs' distribution over many draws, against eager's).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from opreg.errors import InvalidArgumentError
from opreg.pluginapi import TOLERANCES as _TOLERANCES
from opreg.pluginapi import Sample
from opreg.registry import Registry
from opreg.targets import Target, TargetLike

PASSED = "passed"
DISTRIBUTION = "distribution"
SHAPE_ONLY = "shape-only"
FAILED = "failed"
SKIPPED = "skipped"
STATUSES = (PASSED, DISTRIBUTION, SHAPE_ONLY, FAILED, SKIPPED)
"""A sample's status: its values matched; its results are random and their
distribution over many draws matched eager PyTorch's (:class:`Distribution`);
only its shapes and dtypes could be compared and they matched (uninitialized
results, or random ones without a :class:`Distribution`); it failed; or eager
PyTorch or ``torch.export`` rejected it (torch's limit, not the impl's)."""

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {getattr(torch, name): t for name, t in _TOLERANCES.items()}
"""Default ``(rtol, atol)`` by the sample's dtype (:data:`opreg.pluginapi.TOLERANCES`, by torch dtype)."""


@dataclasses.dataclass(frozen=True)
class SampleResult:
    """How one sample fared.

    Fields:
        index: the sample's position in the list driven.
        label: the sample's label.
        status: one of :data:`STATUSES` (``passed``, ``distribution``, ``shape-only``, ``failed``, ``skipped``).
        detail: why it failed or was skipped, or how a distribution or shape-only sample was compared.
    """

    index: int
    label: str
    status: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    def __str__(self) -> str:
        text = f"sample {self.index} ({self.label}): {self.status}"
        return f"{text}: {self.detail}" if self.detail else text


@dataclasses.dataclass(frozen=True)
class SampleCheck:
    """The samples of one op at one target and dtype.

    Fields:
        name: what was driven (an OpInfo name, an impl label).
        target: the target exported for.
        dtype: the samples' dtype.
        results: one per sample.
        torch_ops: the torch ops the exported models were made from (from
            the nodes' ``opreg.torch_op`` provenance).
    """

    name: str
    target: str
    dtype: str
    results: tuple[SampleResult, ...]
    torch_ops: frozenset[str] = frozenset()

    @property
    def ok(self) -> bool:
        """No sample failed, and at least one had its values compared (and matched).

        Shape-only samples do not fail a check, but they do not make one either: a check
        whose samples were all shape-only (or skipped) compared no value and is not ok,
        though :meth:`failures` is empty (see :attr:`compared`)."""
        return not self.failures() and self.compared

    @property
    def compared(self) -> bool:
        """At least one sample's values were compared with eager PyTorch and matched: value by
        value (``passed``) or, for random results, by distribution (``distribution``)."""
        return self.count(PASSED) + self.count(DISTRIBUTION) > 0

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def failures(self) -> list[SampleResult]:
        return [r for r in self.results if r.status == FAILED]

    def __str__(self) -> str:
        by_distribution = f"{self.count(DISTRIBUTION)} by distribution, " if self.count(DISTRIBUTION) else ""
        head = (
            f"{self.name} [{self.dtype}] at {self.target}: {self.count(PASSED)} passed, {by_distribution}"
            f"{self.count(SHAPE_ONLY)} shape-only, {self.count(FAILED)} failed, {self.count(SKIPPED)} skipped"
        )
        shown = [r for r in self.results if r.status != PASSED]
        return "\n".join([head, *(f"  {r}" for r in shown)])


class OpCall(torch.nn.Module):
    """Calls ``fn`` once per sample; the samples' tensors are its inputs, in order.

    Returns the tensors of every result, flattened, so any op's result
    structure (tuples, named tuples, lists, Python numbers) can be exported
    and compared. The samples' other arguments are deep-copied into the
    module, and :meth:`inputs` returns the tensors of deep copies, one copy
    per sample: an op that mutates its arguments (batch norm's running
    statistics in training) never changes the samples, nor another sample
    sharing a tensor with it.
    """

    def __init__(self, fn: Callable[..., Any], samples: Sequence[Sample]) -> None:
        super().__init__()
        self.fn = fn
        self.specs = []
        self.constants: list[list[Any]] = []
        for sample in samples:
            leaves, spec = torch.utils._pytree.tree_flatten((sample.args, sample.kwargs))
            self.specs.append(spec)
            self.constants.append([_INPUT if _is_tensor(leaf) else copy.deepcopy(leaf) for leaf in leaves])

    @staticmethod
    def inputs(samples: Sequence[Sample]) -> tuple[torch.Tensor, ...]:
        """The tensors of deep copies of ``samples`` (one copy per sample), in order."""
        found: list[torch.Tensor] = []
        for sample in samples:
            copied = sample.copy()
            found.extend(t for t in torch.utils._pytree.tree_leaves((copied.args, copied.kwargs)) if _is_tensor(t))
        return tuple(found)

    def forward(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        feed = iter(tensors)
        outputs: list[torch.Tensor] = []
        for spec, constants in zip(self.specs, self.constants, strict=True):
            leaves = [next(feed) if c is _INPUT else c for c in constants]
            args, kwargs = torch.utils._pytree.tree_unflatten(leaves, spec)
            outputs.extend(result_tensors(self.fn(*args, **kwargs)))
        return outputs


_INPUT = object()
"""Marks where a sample's tensor goes among its baked-in arguments."""


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


# -- comparing one sample's outputs ----------------------------------------------------------

Compare = Callable[[Sample, Sequence[torch.Tensor], Sequence[torch.Tensor], float, float], list[str]]
"""``compare(sample, got, expected, rtol, atol) -> problems``: how one sample's outputs are
judged. ``got`` are the exported model's output tensors for ``sample``, ``expected`` eager
PyTorch's (same count and order, see :func:`result_tensors`); ``rtol``/``atol`` apply to
floating outputs. Returns one line per problem, naming the output (``output 1: ...``);
an empty list means the sample passes. Shape-only samples never reach it."""


def compare_outputs(
    sample: Sample, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], rtol: float, atol: float
) -> list[str]:
    """The default :data:`Compare`: every output elementwise, with the same shape and dtype,
    floating values within ``atol + rtol * |expected|`` (NaN matches NaN), others exactly."""
    return [
        p
        for index, (g, e) in enumerate(zip(got, expected, strict=True))
        if (p := _elementwise(index, g, e, rtol, atol))
    ]


def _elementwise(index: int, got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> str:
    from opreg.exporter._program import compare_output

    check = compare_output(f"output {index}", got, expected, rtol, atol)
    return "" if check.ok else f"{check.name}: {check.detail} (max abs {check.max_abs:.3g})"


@dataclasses.dataclass(frozen=True)
class Arg:
    """Where an argument of the op is found in a :class:`Sample`.

    Fields:
        position: its index in ``sample.args`` (the op's first tensor is 0).
        name: its keyword name, looked up in ``sample.kwargs``.
        default: its value when the sample gives it neither way.
    """

    position: int
    name: str
    default: Any = None

    def of(self, sample: Sample) -> Any:
        if len(sample.args) > self.position:
            return sample.args[self.position]
        return sample.kwargs.get(self.name, self.default)


@dataclasses.dataclass(frozen=True)
class GatherIndices:
    """A :data:`Compare` for ops returning indices into their input along a dim (sort, topk,
    argsort, max.dim, kthvalue, ...): with ties, several index tensors are right.

    Value outputs are compared elementwise (as :func:`compare_outputs`). Each index output
    must have the expected shape and dtype, and the input gathered along ``dim`` with it must
    equal, exactly (NaN matching NaN), the input gathered with eager PyTorch's indices,
    i.e. the index picks an element equal to the one torch picked.

    Fields:
        dim: where the sample gives the dim.
        keepdim: where it says whether the reduced dim is kept (``None``: the indices
            always keep it, as sort and topk's do).
        indices: which outputs are indices.
    """

    dim: Arg
    keepdim: Arg | None = None
    indices: tuple[int, ...] = (1,)

    def __call__(
        self, sample: Sample, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], rtol: float, atol: float
    ) -> list[str]:
        source = sample.args[0]
        dim = self.dim.of(sample)
        problems = []
        for index, (g, e) in enumerate(zip(got, expected, strict=True)):
            if index not in self.indices or dim is None or not isinstance(source, torch.Tensor):
                problem = _elementwise(index, g, e, rtol, atol)  # median(x) without dim: values only
            else:
                keep = True if self.keepdim is None else bool(self.keepdim.of(sample))
                problem = self._indices(index, source, int(dim), keep, g, e)
            if problem:
                problems.append(problem)
        return problems

    @staticmethod
    def _indices(
        index: int, source: torch.Tensor, dim: int, keepdim: bool, got: torch.Tensor, expected: torch.Tensor
    ) -> str:
        name = f"output {index} (indices)"
        if (tuple(got.shape), got.dtype) != (tuple(expected.shape), expected.dtype):
            return f"{name}: {got.dtype}{tuple(got.shape)} != {expected.dtype}{tuple(expected.shape)}"
        if source.dim() == 0 or got.numel() == 0:
            return "" if torch.equal(got, expected) else f"{name}: {got.tolist()} != {expected.tolist()}"
        size = source.shape[dim]
        if bool(((got < 0) | (got >= size)).any()):
            return f"{name}: indices outside [0, {size}) along dim {dim}"
        if not keepdim:
            got, expected = got.unsqueeze(dim), expected.unsqueeze(dim)
        picked = torch.gather(source, dim, got)
        wanted = torch.gather(source, dim, expected)
        same = (
            (picked == wanted) | (picked.isnan() & wanted.isnan()) if source.is_floating_point() else picked == wanted
        )
        if bool(same.all()):
            return ""
        return f"{name}: {int((~same).sum())} of {same.numel()} pick an element unequal to eager PyTorch's pick"


@dataclasses.dataclass(frozen=True)
class ScaledTolerance:
    """A :data:`Compare` for transforms whose rounding errors spread over every output, as a
    Fourier transform's do: a small bin carries the error of the whole sum, so a tolerance
    relative to each element is wrong there. Each floating output must be within
    ``atol + rtol * |eager| + scale * max|eager|`` of eager PyTorch everywhere (the largest
    magnitude of that output); others are compared as :func:`compare_outputs` does.

    Fields:
        scale: the tolerance relative to the output's largest magnitude.
    """

    scale: float = 1e-5

    def __call__(
        self, sample: Sample, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], rtol: float, atol: float
    ) -> list[str]:
        problems = []
        for index, (g, e) in enumerate(zip(got, expected, strict=True)):
            floating = isinstance(e, torch.Tensor) and (e.is_floating_point() or e.is_complex()) and e.numel()
            magnitude = float(e.abs().nan_to_num(0.0, 0.0, 0.0).max()) if floating else 0.0
            if problem := _elementwise(index, g, e, rtol, atol + self.scale * magnitude):
                problems.append(problem)
        return problems


@dataclasses.dataclass(frozen=True)
class UpcastReference:
    """A :data:`Compare` for ops whose half-precision CPU kernel in torch rounds each step, where an
    impl that computes in float32 and rounds once is closer to the exact result: a float16 or
    bfloat16 sample's outputs are compared with ``fn`` run on the sample's inputs in float32, its
    results rounded to the sample's types (at the sample's tolerances); other samples with
    eager PyTorch, as :func:`compare_outputs` does.

    Fields:
        fn: the op, called as the samples call it.
    """

    fn: Callable[..., Any]

    def __call__(
        self, sample: Sample, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], rtol: float, atol: float
    ) -> list[str]:
        half = (torch.float16, torch.bfloat16)
        if not any(e.dtype in half for e in expected):
            return compare_outputs(sample, got, expected, rtol, atol)
        copy = sample.copy()
        args, kwargs = torch.utils._pytree.tree_map(
            lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype in half else v, (copy.args, copy.kwargs)
        )
        results = result_tensors(self.fn(*args, **kwargs))
        reference = [r.to(e.dtype) for r, e in zip(results, expected, strict=True)]
        return compare_outputs(sample, got, reference, rtol, atol)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """A :data:`Compare` for random ops, which ONNX Runtime draws from its own generator, not
    torch's: their results are compared by distribution (DESIGN.md §5), never value by value.

    A sample whose eager results change with the seed is run ``draws`` times in the exported
    model and ``draws`` times in eager PyTorch (after ``torch.manual_seed(seed)``). The model's
    random nodes are left unseeded, as a user's are; ONNX Runtime's process-wide seed is set to
    ``seed`` before the session is made (``onnxruntime.set_seed``), so a check in ONNX Runtime is
    reproducible (the reference evaluator draws from fresh numpy generators). Every draw of every
    output must have eager's shape and dtype, and each output's draws must pass these tests
    against eager's, the draws being the independent units (the elements of one draw may depend
    on each other: a permutation, a channel dropped whole):

    - moments, each draw's mean over its elements: the mean, the mean square (so the spread),
      the fraction of zeros and of non-finite values (Welch's z);
    - the shape: each draw's fraction of elements in each bin, where the bins are the values
      for outputs of at most ``categories`` distinct integers (integer types, bool, 0/1 masks,
      permutations) and otherwise the intervals between the deciles of both sides' values
      together; the fractions' vectors are compared with a two-sample Hotelling test, a
      chi-square-like test that takes their covariance from the draws (``scipy.stats.f``);
    - per element, over the draws: the mean (Welch's z), and for elements that draw from a
      continuous distribution (nearly all their values distinct) the whole distribution, with a
      two-sample Kolmogorov-Smirnov test (``scipy.stats.ks_2samp``), so that a tensor of means,
      scales or probabilities is checked element by element, not just on average.

    The false-alarm rate is ``alpha`` per output: the tests share it (Bonferroni), and a test
    over elements shares its part among them, so a right impl fails one output's check with
    probability at most ``alpha`` (1e-6 by default; the normal, F and Kolmogorov approximations
    make it nominal). Values of one element within ``atol + rtol * |value|`` of each other count as
    one value, on both sides alike, so a kernel that rounds differently is no mismatch. What a wrong impl can hide
    shrinks as 1 / sqrt(draws x elements): ``python bench/distribution_power.py`` measures how
    often the wrong distributions of issue 26 are found at the suite's sample sizes.

    Samples whose eager results do not change with the seed (dropout in eval, p=0) are
    compared elementwise, as :func:`compare_outputs`. A sample compared by distribution
    gets the status ``distribution`` (:data:`DISTRIBUTION`), never ``passed``.

    Needs scipy (``pip install 'opreg[testing]'``).

    Fields:
        draws: how many times the model and eager PyTorch are run.
        alpha: the false-alarm rate of one output's check.
        categories: outputs with at most this many distinct integer values are binned by value.
        seed: ONNX Runtime's seed, and eager PyTorch's.
        shape: ``False`` compares moments only (the mean, mean square, zeros, non-finite values,
            means per element): what opreg did before it compared shapes, kept for measuring.
    """

    draws: int = 200
    alpha: float = 1e-6
    categories: int = 32
    seed: int = 0
    shape: bool = True

    def __post_init__(self) -> None:
        if self.draws < 2 or not 0 < self.alpha < 1 or self.categories < 0:
            raise ValueError("Distribution needs draws >= 2, 0 < alpha < 1 and categories >= 0")
        if self.shape and importlib.util.find_spec("scipy") is None:
            raise InvalidArgumentError(
                "Distribution compares the shapes of distributions with scipy, which is not installed: "
                "pip install 'opreg[testing]' (or pass shape=False to compare moments only)"
            )

    def __call__(
        self, sample: Sample, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], rtol: float, atol: float
    ) -> list[str]:
        """A deterministic sample: elementwise, as :func:`compare_outputs`."""
        return compare_outputs(sample, got, expected, rtol, atol)

    def judge(
        self,
        got: Sequence[Sequence[torch.Tensor]],
        expected: Sequence[Sequence[torch.Tensor]],
        rtol: float,
        atol: float,
    ) -> tuple[list[str], str]:
        """Compare draws of one random sample: ``got[k][i]`` is output ``i`` of the model's draw ``k``,
        ``expected[k][i]`` eager PyTorch's. Returns the problems (one line each) and a summary."""
        problems: list[str] = []
        closest = (0.0, "")
        for index in range(len(expected[0])):
            mine = [draw[index] for draw in got]
            theirs = [draw[index] for draw in expected]
            want = (tuple(theirs[0].shape), theirs[0].dtype)
            wrong = next(((tuple(g.shape), g.dtype) for g in mine if (tuple(g.shape), g.dtype) != want), None)
            if wrong is not None:
                problems.append(f"output {index}: {wrong[1]}{wrong[0]} != {want[1]}{want[0]}")
                continue
            if theirs[0].numel() == 0:
                continue
            for name, ratio in self._statistics(torch.stack(mine), torch.stack(theirs), rtol, atol):
                if ratio > 1 or math.isnan(ratio):
                    problems.append(f"output {index}: {name}")
                elif ratio >= closest[0]:
                    closest = (ratio, f"output {index} {name}")
        summary = f"by distribution over {len(got)} draws, at a false-alarm rate of {self.alpha:g} per output"
        if closest[1]:
            summary += f" (closest to its bound: {closest[1]}, {closest[0]:.0%} of it)"
        return problems, summary

    def _statistics(
        self, got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float
    ) -> Iterable[tuple[str, float]]:
        """``(description, how close to failing)`` of every test of one output's draws (``[draws, ...]``
        tensors): for a z statistic ``|difference| / bound``, for a p-value ``log p / log threshold``;
        above 1 is a mismatch."""
        g, e = _merge_rounding(_as_draws(got), _as_draws(expected), rtol, atol)
        values = torch.cat([g, e]).unique()
        categorical = values.numel() <= self.categories and bool((values[values.isfinite()].frac() == 0).all())
        elements = g.shape[1]
        per_element_ks = self.shape and not categorical and elements > 1
        tests = 4 + (elements > 1) + self.shape + per_element_ks
        share = self.alpha / tests  # Bonferroni: the tests of one output share its false-alarm rate
        sigmas = _z_for(share)
        g_finite, e_finite = g.isfinite(), e.isfinite()
        g0, e0 = g.where(g_finite, 0.0), e.where(e_finite, 0.0)
        per_draw = {
            "mean": (g0.mean(1), e0.mean(1)),
            "mean square": ((g0 * g0).mean(1), (e0 * e0).mean(1)),
            "fraction of zeros": (_fraction(g0 == 0, g_finite), _fraction(e0 == 0, e_finite)),
            "fraction of non-finite values": ((~g_finite).double().mean(1), (~e_finite).double().mean(1)),
        }
        for name, (a, b) in per_draw.items():
            yield self._agreement(name, a, b, sigmas, rtol, atol)
        if elements > 1:  # per element, over the draws; the elements share this test's part
            yield self._agreement("mean per element", g0, e0, _z_for(share / elements), rtol, atol)
        if not self.shape:
            return
        yield _shape_test(g, e, values if categorical else None, share)
        if per_element_ks:
            yield _ks_per_element(g, e, share)

    @staticmethod
    def _agreement(
        name: str, got: torch.Tensor, expected: torch.Tensor, sigmas: float, rtol: float, atol: float
    ) -> tuple[str, float]:
        """How far the means over the draws (dim 0) of ``got`` and ``expected`` are, as a fraction of
        their bound; for several columns (per element), the worst column."""
        n = got.shape[0]
        a, b = got.mean(0), expected.mean(0)
        error = ((got.var(0) + expected.var(0)) / n).sqrt()
        bound = sigmas * error + atol + rtol * b.abs()
        ratio = ((a - b).abs() / bound.clamp_min(1e-300)).reshape(-1)
        worst = int(ratio.argmax())
        if ratio.numel() == 1:
            return f"{name} {float(a):.4g} vs eager {float(b):.4g} (bound {float(bound):.2g})", float(ratio[0])
        count = int((ratio > 1).sum())
        a, b, bound = a.reshape(-1), b.reshape(-1), bound.reshape(-1)
        text = (
            f"{name}: {count} of {ratio.numel()} elements out of bounds, worst element {worst}: "
            f"{float(a[worst]):.4g} vs eager {float(b[worst]):.4g} (bound {float(bound[worst]):.2g})"
        )
        return text if count else f"{name} (worst element {worst})", float(ratio[worst])


def _z_for(alpha: float) -> float:
    """The two-sided normal bound a difference passes with probability ``1 - alpha``."""
    return statistics.NormalDist().inv_cdf(1 - alpha / 2)


def _closeness(p: float, threshold: float) -> float:
    """A p-value as a fraction of its bound (above 1: below ``threshold``, a mismatch)."""
    return math.log(max(p, 1e-300)) / math.log(threshold) if p < 1 else 0.0


def _merge_rounding(got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> tuple[torch.Tensor, ...]:
    """``got`` and ``expected`` (``[draws, elements]``) with the finite values of each element that lie
    within ``atol + rtol * |v|`` of each other (chained, in sorted order) replaced by the smallest of
    them, on both sides alike: a kernel that rounds another way (``x * (1 / (1 - p))`` for
    ``x / (1 - p)``, a sum that is 1e-16 where the other is 0) then draws the same atoms as eager,
    and no bin edge falls inside such a cluster."""
    draws = got.shape[0]
    both = torch.cat([got, expected]).T  # [elements, 2 * draws]
    finite = both.isfinite()
    ordered, order = both.where(finite, math.inf).sort(1)
    gap = ordered[:, 1:] - ordered[:, :-1]
    apart = ~(gap <= atol + rtol * ordered[:, :-1].abs())  # inf - inf is NaN: apart too
    starts = torch.cat([torch.ones_like(apart[:, :1]), apart], 1)
    first = torch.where(starts, torch.arange(starts.shape[1]).expand_as(starts), 0).cummax(1).values
    merged = torch.empty_like(ordered).scatter_(1, order, ordered.gather(1, first))
    merged = merged.where(finite, both).T
    return merged[:draws], merged[draws:]


def _shape_test(
    got: torch.Tensor, expected: torch.Tensor, categories: torch.Tensor | None, threshold: float
) -> tuple[str, float]:
    """Each draw's fraction of elements per bin (a value of ``categories``; else at or below each
    decile of both sides' finite values), compared as vectors over the draws with a two-sample
    Hotelling test (F-distributed), the bins' covariance estimated from the draws."""
    import numpy as np

    g, e = got.numpy(), expected.numpy()
    if categories is not None:
        edges = categories.numpy()
        label = "fraction of each value"

        def fractions(x):
            return (x[:, :, None] == edges).mean(1)
    else:
        pooled = np.concatenate([g[np.isfinite(g)], e[np.isfinite(e)]])
        edges = np.unique(np.quantile(pooled, np.linspace(0.1, 0.9, 9))) if pooled.size else np.zeros(0)
        label = "fraction at or below each decile"

        def fractions(x):
            return (x[:, :, None] <= edges).mean(1)

    if edges.size == 0:
        return f"{label}: no finite values", 0.0
    a, b = fractions(g), fractions(e)
    p, where = _hotelling(a, b)
    detail = ", ".join(f"{edge:.4g}: {x:.3f} vs eager {y:.3f}" for edge, x, y in
                       zip(edges[where], a.mean(0)[where], b.mean(0)[where], strict=True))  # fmt: skip
    name = f"{label} (p={p:.2g}, bound {threshold:.2g}; most apart: {detail})"
    return name, _closeness(p, threshold)


def _hotelling(a, b) -> tuple[float, list[int]]:
    """p-value of a two-sample Hotelling T² test that rows of ``a`` and ``b`` (draws x bins) have
    the same mean, with the bins' pooled covariance, on the directions in which it varies (a
    difference in a direction in which both never vary is certain: p = 0); and the bin whose
    means are farthest apart."""
    import numpy as np
    from scipy import stats

    n = a.shape[0]
    difference = a.mean(0) - b.mean(0)
    where = [int(np.abs(difference).argmax())]
    covariance = (np.cov(a, rowvar=False, ddof=1) + np.cov(b, rowvar=False, ddof=1)).reshape(a.shape[1], -1) / 2
    eigenvalues, vectors = np.linalg.eigh(covariance)
    varies = eigenvalues > max(float(eigenvalues.max(initial=0.0)) * 1e-10, 1e-15)
    projected = vectors.T @ difference
    if np.abs(projected[~varies]).max(initial=0.0) > 1e-12:
        return 0.0, where
    dims = int(varies.sum())
    if dims == 0:
        return 1.0, where
    dims = min(dims, 2 * n - 2)
    t2 = (n / 2) * float(np.sum(projected[varies] ** 2 / eigenvalues[varies]))
    f = (2 * n - dims - 1) / (dims * (2 * n - 2)) * t2
    return float(stats.f.sf(f, dims, 2 * n - dims - 1)), where


KS_ELEMENTS = 100
"""The per-element Kolmogorov-Smirnov tests look at this many elements at most, evenly spread:
each has only the draws to go on, so more elements add cost, not power."""
CONTINUOUS_SHARE = 0.9
"""An element is tested with Kolmogorov-Smirnov when this share of its values (both sides' draws)
are distinct: the test assumes a continuous distribution, and a few atoms whose places two kernels
round apart (dropout's masks, attention with dropout in float16) would read as a wrong one. Such
elements are left to the per-element means and the deciles."""


def _ks_per_element(got: torch.Tensor, expected: torch.Tensor, alpha: float) -> tuple[str, float]:
    """Two-sample Kolmogorov-Smirnov tests, one per element over the draws (NaN as +inf), sharing ``alpha``."""
    import warnings

    from scipy import stats

    both = torch.cat([got, expected])
    distinct = torch.tensor([column.unique().numel() for column in both.T])
    continuous = (distinct >= CONTINUOUS_SHARE * both.shape[0]).nonzero().reshape(-1)  # KS assumes no atoms
    if continuous.numel() == 0:
        return "distribution per element: no element draws from a continuous distribution", 0.0
    picks = torch.linspace(0, continuous.numel() - 1, min(continuous.numel(), KS_ELEMENTS)).round().long().unique()
    columns = continuous[picks]
    g = got[:, columns].nan_to_num(nan=math.inf).numpy()
    e = expected[:, columns].nan_to_num(nan=math.inf).numpy()
    with warnings.catch_warnings():  # ties (atoms, masks) make scipy fall back from exact to asymptotic p-values
        warnings.simplefilter("ignore", RuntimeWarning)
        pvalues = stats.ks_2samp(g, e, axis=0).pvalue.reshape(-1)
    threshold = alpha / len(columns)
    worst = int(pvalues.argmin())
    p, element = float(pvalues[worst]), int(columns[worst])
    count = int((pvalues < threshold).sum())
    name = (
        f"distribution per element (Kolmogorov-Smirnov): {count} of {len(columns)} elements out of bounds, "
        f"worst element {element} (p={p:.2g}, bound {threshold:.2g})"
    )
    return name if count else f"distribution per element (worst element {element})", _closeness(p, threshold)


def _as_draws(stacked: torch.Tensor) -> torch.Tensor:
    """``[draws, ...]`` as float64 ``[draws, elements]`` (a complex output as its real and imaginary parts)."""
    if stacked.is_complex():
        stacked = torch.view_as_real(stacked.resolve_conj())
    return stacked.reshape(stacked.shape[0], -1).to(torch.float64)


def _fraction(hits: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    return (hits & finite).double().mean(1)


Exporter = Callable[[torch.export.ExportedProgram, Target], Callable[..., Any]]
"""``exporter(program, target) -> run``: an exporter other than opreg, for side-by-side
measures. It receives the captured (undecomposed) program of a batch of samples and the
target, and returns ``run(*tensors)``, which runs its model on the samples' tensors (in
:meth:`OpCall.inputs` order) and returns the outputs (any structure; their tensor leaves
are compared with eager PyTorch's). An error it raises is an export failure, one ``run``
raises a run failure."""


# -- driving --------------------------------------------------------------------------------


def check_samples(
    fn: Callable[..., Any],
    samples: Iterable[Sample],
    *,
    targets: Sequence[TargetLike],
    name: str | None = None,
    registry: Registry | None = None,
    runtime: str = "auto",
    tolerances: tuple[float, float] | None = None,
    values: bool = True,
    compare: Compare | None = None,
    exporter: Exporter | None = None,
) -> list[SampleCheck]:
    """Export ``fn`` called on ``samples`` for each target, run it, compare with eager.

    ``fn`` is called as ``fn(*sample.args, **sample.kwargs)``, eager and in the
    export, each time on a deep copy of the sample (:meth:`Sample.copy`). A
    sample that eager PyTorch or ``torch.export`` rejects is *skipped* (with
    torch's reason): it says nothing about the impl. One that fails to export
    through opreg, to run, or to match is *failed*. ``tolerances`` is
    ``(rtol, atol)`` for floating results (default: :data:`TOLERANCES` by dtype).
    ``compare`` judges each sample's outputs (default :func:`compare_outputs`;
    :class:`GatherIndices` for ops returning indices that ties make ambiguous;
    :class:`Distribution` for random ops).

    Samples whose eager results change with the random seed (``dropout`` in
    training, ``randn``) are compared by distribution over many draws when
    ``compare`` is a :class:`Distribution`, and get the status *distribution*;
    otherwise they are compared by shape and dtype only, and are *shape-only*
    rather than passed, as are all samples when ``values`` is false (ops that
    return uninitialized memory, like ``empty``).

    ``exporter`` drives another exporter instead of opreg (see :data:`Exporter`), with
    the same samples and comparisons: ``bench/coverage.py --all`` measures torch.onnx so.
    """
    from opreg.plugins import default_registry

    registry = registry if registry is not None else default_registry()
    samples = list(samples)
    name = name or getattr(fn, "__name__", repr(fn))
    compare = compare or compare_outputs
    expected = [_eager(fn, sample, values) for sample in samples]
    runnable = [i for i, e in enumerate(expected) if not isinstance(e, BaseException)]
    dtype = _dtype_of(samples)
    rtol, atol = tolerances or TOLERANCES.get(dtype, (1e-5, 1e-5))
    skipped = {
        i: SampleResult(i, samples[i].label, SKIPPED, f"eager PyTorch rejects it: {_short(expected[i])}")
        for i in range(len(samples))
        if i not in runnable
    }

    def matched(i: int, summary: str | None) -> SampleResult:
        if summary is not None:
            return SampleResult(i, samples[i].label, DISTRIBUTION, summary)
        if any(isinstance(e, _ShapeOnly) for e in expected[i]):
            why = "values not compared: uninitialized or random results, compared by shape and dtype only"
            return SampleResult(i, samples[i].label, SHAPE_ONLY, why)
        return SampleResult(i, samples[i].label, PASSED)

    # All runnable samples in one model first; one by one only if that fails.
    draws: dict[int, list[list[torch.Tensor]]] = {}  # eager draws of random samples, by id(sample)
    batch = _Batch(fn, [samples[i] for i in runnable], [expected[i] for i in runnable], compare, draws, exporter)
    per_target: dict[str, dict[int, SampleResult]] = {}
    ops: dict[str, set[str]] = {}
    targets = [registry.target(t) for t in targets]
    outcome = batch.capture(registry, targets[0]) if runnable else None
    singles: dict[int, _Batch] = {}
    for target in targets:
        key = str(target)
        results = per_target.setdefault(key, dict(skipped))
        ops.setdefault(key, set())
        if runnable and not isinstance(outcome, BaseException):
            verdict = batch.run(target, registry, runtime, rtol, atol, ops[key])
            if verdict is None:
                for local, i in enumerate(runnable):
                    results[i] = matched(i, batch.summaries.get(local))
                continue
        for i in runnable:  # one by one, so each result is the sample's own
            single = singles.get(i)
            if single is None:
                single = singles[i] = _Batch(fn, [samples[i]], [expected[i]], compare, draws, exporter)
                single.capture(registry, target)
            captured = single.program
            if isinstance(captured, BaseException):
                results[i] = SampleResult(i, samples[i].label, SKIPPED, f"torch.export rejects it: {_short(captured)}")
                continue
            verdict = single.run(target, registry, runtime, rtol, atol, ops[key])
            if verdict is None:
                results[i] = matched(i, single.summaries.get(0))
            else:
                results[i] = SampleResult(i, samples[i].label, FAILED, verdict)
    dtype_name = str(dtype).replace("torch.", "")
    return [
        SampleCheck(
            name,
            str(t),
            dtype_name,
            tuple(per_target[str(t)][i] for i in range(len(samples))),
            frozenset(ops[str(t)]),
        )
        for t in targets
    ]


class _Batch:
    """Samples exported together: captured once, then exported for each target."""

    def __init__(
        self,
        fn: Callable[..., Any],
        samples: list[Sample],
        expected: list[list[Any]],
        compare: Compare,
        draws: dict[int, list[list[torch.Tensor]]],
        exporter: Exporter | None = None,
    ) -> None:
        self.fn = fn
        self.exporter = exporter
        self.samples = samples
        self.module = OpCall(fn, samples).eval()
        self.inputs = OpCall.inputs(samples)  # deep copies: the samples themselves never reach the export
        self.expected = expected
        self.compare = compare
        self.program: Any = None
        self.draws = draws
        self.summaries: dict[int, str] = {}
        """Position in ``samples`` -> how its random results were compared by distribution (last run)."""

    def _by_distribution(self, expected: list[Any]) -> bool:
        return isinstance(self.compare, Distribution) and any(isinstance(e, _ShapeOnly) and e.random for e in expected)

    def _eager_draws(self, sample: Sample) -> list[list[torch.Tensor]]:
        """Eager PyTorch's draws of a random ``sample`` (seeded with ``seed``, then drawn in turn), made once."""
        found = self.draws.get(id(sample))
        if found is None:
            found = []
            torch.manual_seed(self.compare.seed)  # once: each draw continues torch's stream
            for _ in range(self.compare.draws):
                copied = sample.copy()
                with torch.no_grad():
                    found.append(_tensors(self.fn(*copied.args, **copied.kwargs)))
            self.draws[id(sample)] = found
        return found

    def capture(self, registry: Registry, target: Any) -> torch.export.ExportedProgram | BaseException:
        """Capture, and decompose for ``target``: other targets usually cover the
        same ops, and then export it as it is instead of decomposing again."""
        from opreg.exporter import _plan

        try:
            self.program = torch.export.export(self.module, self.inputs, strict=False)
        except Exception as e:
            self.program = e
            return e
        if self.exporter is not None:  # another exporter decomposes as it sees fit
            return self.program
        with contextlib.suppress(Exception):  # export() plans again and reports it
            self.program, _ = _plan.prepare(self.program, registry, target)
        return self.program

    def run(self, target: Any, registry: Registry, runtime: str, rtol: float, atol: float, ops: set[str]) -> str | None:
        """Export for ``target``, run and compare: ``None`` if every sample matches, else why not
        (each sample's outputs numbered from 0, as in a model of that sample alone)."""
        from opreg._export import export
        from opreg.exporter._nodes import TORCH_OP_KEY

        random = any(self._by_distribution(e) for e in self.expected)
        if self.exporter is not None:
            try:
                run = self.exporter(self.program, target)
            except Exception as e:
                return f"export failed: {_short(e)}"
        else:
            try:
                # ops that update an argument (batch norm's running statistics in training) are
                # compared by what they return: the updates are left out, as torch.onnx leaves them
                program = export(self.program, target=target, registry=registry, state="drop")
            except Exception as e:
                return f"export failed: {_short(e)}"
            for node in program.model.graph:
                op = node.metadata_props.get(TORCH_OP_KEY)
                if op:
                    ops.add(op)
            run = functools.partial(program.run, runtime=runtime)
        if random:  # ONNX Runtime seeds a session's random nodes from its process-wide seed
            import onnxruntime

            onnxruntime.set_seed(self.compare.seed)
        try:
            runs = 1 + (self.compare.draws - 1 if random else 0)
            draws = [torch.utils._pytree.tree_leaves(run(*self.inputs)) for _ in range(runs)]
        except Exception as e:
            return f"run failed: {_short(e)}"
        got = draws[0]
        total = sum(len(e) for e in self.expected)
        if len(got) != total:
            return f"the model returned {len(got)} tensors, eager PyTorch {total}"
        bad = []
        start = 0
        self.summaries = {}
        for local, (sample, expected) in enumerate(zip(self.samples, self.expected, strict=True)):
            mine = got[start : start + len(expected)]
            if self._by_distribution(expected):
                problems, summary = self.compare.judge(
                    [draw[start : start + len(expected)] for draw in draws], self._eager_draws(sample), rtol, atol
                )
                bad += problems
                self.summaries[local] = summary
                start += len(expected)
                continue
            start += len(expected)
            if any(isinstance(e, _ShapeOnly) for e in expected):
                bad += [
                    f"output {i}: {g.dtype}{tuple(g.shape)} != {e.tensor.dtype}{tuple(e.tensor.shape)}"
                    for i, (g, e) in enumerate(zip(mine, expected, strict=True))
                    if (tuple(g.shape), g.dtype) != (tuple(e.tensor.shape), e.tensor.dtype)
                ]
            else:
                bad += self.compare(sample, mine, expected, rtol, atol)
        return "; ".join(bad) or None


class _ShapeOnly:
    """An expected result whose values say nothing: ``random`` (they change with the seed) or uninitialized."""

    def __init__(self, tensor: torch.Tensor, random: bool) -> None:
        self.tensor = tensor
        self.random = random


def _eager(fn: Callable[..., Any], sample: Sample, values: bool) -> list[Any] | BaseException:
    """``fn``'s tensors on ``sample`` (seeded), or the error eager PyTorch raised.
    Run with two seeds, each on its own deep copy of the sample (so a mutating op
    sees the same arguments both times): results that differ are random, and
    checked by shape only."""
    runs = []
    for seed in (0, 1):
        copied = sample.copy()
        torch.manual_seed(seed)
        try:
            with torch.no_grad():
                runs.append(_tensors(fn(*copied.args, **copied.kwargs)))
        except Exception as e:
            return e
    first, second = runs
    random = any(not _same(a, b) for a, b in zip(first, second, strict=True))
    return [_ShapeOnly(t, random=values) for t in first] if random or not values else first


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and values (NaN equal to NaN); complex32, which torch cannot compare, as complex64."""
    if a.shape != b.shape:
        return False
    if a.dtype == torch.complex32:
        a, b = a.to(torch.complex64), b.to(torch.complex64)
    return torch.equal(a, b) or ((a.is_floating_point() or a.is_complex()) and torch.allclose(a, b, equal_nan=True))


_NUMBER_DTYPES = (
    ((bool, torch.SymBool), torch.bool),
    ((int, torch.SymInt), torch.int64),
    ((float, torch.SymFloat), torch.float64),
)


def result_tensors(result: Any) -> list[torch.Tensor]:
    """The tensors in an op's result; Python numbers (``item()``) become 0-d tensors."""
    found = []
    for leaf in torch.utils._pytree.tree_leaves(result):
        if isinstance(leaf, torch.Tensor):
            found.append(leaf)
            continue
        for kinds, dtype in _NUMBER_DTYPES:
            if isinstance(leaf, kinds):
                found.append(torch.scalar_tensor(leaf, dtype=dtype))
                break
    return found


def _tensors(result: Any) -> list[torch.Tensor]:
    return [t.detach().clone() for t in result_tensors(result)]


def _dtype_of(samples: Sequence[Sample]) -> torch.dtype:
    for sample in samples:
        for leaf in torch.utils._pytree.tree_leaves((sample.args, sample.kwargs)):
            if isinstance(leaf, torch.Tensor):
                return leaf.dtype
    return torch.float32


def _short(error: BaseException, limit: int = 300) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    shown = lines[:2] if lines and lines[0].endswith(":") else lines[:1]  # "...: " then what it is about
    text = f"{type(error).__name__}: {' '.join(shown)}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
