"""How one sample's outputs are compared with eager PyTorch's: a :data:`Compare` hook.

:func:`compare_outputs` (every output elementwise, the default), :class:`GatherIndices` (ops
returning indices into their input, where ties make the indices ambiguous: sort, topk,
max.dim, ...), :class:`ScaledTolerance` (transforms whose errors spread over every output:
FFTs), :class:`UpcastReference` and :class:`Distribution` (random ops: their outputs'
distribution over many draws, against eager's). :mod:`opreg.testing._samples` drives them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from opreg.errors import InvalidArgumentError
from opreg.pluginapi import Sample
from opreg.registry.targets import Target

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
    from opreg.exporter.diagnosis.compare import compare_output

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
