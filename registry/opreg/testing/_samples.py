"""Drive an op with sample inputs: export a one-op model, run it, compare with eager.

All samples of one call go into a single model (one capture, one session),
because an export costs far more than running it; only when that model fails
are the samples exported one by one, so each result names its own sample.

How a sample's outputs are compared is a :data:`~opreg.testing._compare.Compare`
hook, in :mod:`opreg.testing._compare` (elementwise by default; ties of indices,
scaled tolerances, distributions of random ops).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from opreg.pluginapi import TOLERANCES as _TOLERANCES
from opreg.pluginapi import Sample
from opreg.registry.registry import Registry
from opreg.registry.targets import TargetLike
from opreg.testing._compare import Compare, Distribution, Exporter, compare_outputs, result_tensors

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
    from opreg.packs.plugins import default_registry

    registry = registry if registry is not None else default_registry()
    samples = list(samples)
    name = name or getattr(fn, "__name__", repr(fn))
    drive = _Driving(fn, samples, values, compare or compare_outputs, exporter)
    dtype = _dtype_of(samples)
    rtol, atol = tolerances or TOLERANCES.get(dtype, (1e-5, 1e-5))
    targets = [registry.target(t) for t in targets]
    drive.capture(registry, targets[0])
    dtype_name = str(dtype).replace("torch.", "")
    checks = []
    for target in targets:
        results, ops = drive.at(target, registry, runtime, rtol, atol)
        checks.append(SampleCheck(name, str(target), dtype_name, results, frozenset(ops)))
    return checks


class _Driving:
    """The samples of one :func:`check_samples` call and eager PyTorch's results on them, driven at one
    target after another: all the runnable samples in one model first, one by one only if that fails, so
    each result is the sample's own (each sample's model captured once, for every target)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        samples: list[Sample],
        values: bool,
        compare: Compare,
        exporter: Exporter | None,
    ) -> None:
        self.fn = fn
        self.samples = samples
        self.compare = compare
        self.exporter = exporter
        self.expected = [_eager(fn, sample, values) for sample in samples]
        self.runnable = [i for i, e in enumerate(self.expected) if not isinstance(e, BaseException)]
        self.draws: dict[int, list[list[torch.Tensor]]] = {}  # eager draws of random samples, by id(sample)
        self.batch = self._batch(self.runnable)
        self.singles: dict[int, _Batch] = {}

    def _batch(self, indices: list[int]) -> _Batch:
        samples, expected = [self.samples[i] for i in indices], [self.expected[i] for i in indices]
        return _Batch(self.fn, samples, expected, self.compare, self.draws, self.exporter)

    def capture(self, registry: Registry, target: Any) -> None:
        """Capture the model of all the runnable samples (decomposed for ``target``)."""
        if self.runnable:
            self.batch.capture(registry, target)

    def at(
        self, target: Any, registry: Registry, runtime: str, rtol: float, atol: float
    ) -> tuple[tuple[SampleResult, ...], set[str]]:
        """Every sample's result at ``target``, and the torch ops its models were made of."""
        results = {
            i: SampleResult(i, sample.label, SKIPPED, f"eager PyTorch rejects it: {_short(self.expected[i])}")
            for i, sample in enumerate(self.samples)
            if i not in self.runnable
        }
        ops: set[str] = set()
        together = self.runnable and not isinstance(self.batch.program, BaseException)
        if together and self.batch.run(target, registry, runtime, rtol, atol, ops) is None:
            for local, i in enumerate(self.runnable):
                results[i] = self._matched(i, self.batch.summaries.get(local))
        else:
            for i in self.runnable:
                results[i] = self._alone(i, target, registry, runtime, rtol, atol, ops)
        return tuple(results[i] for i in range(len(self.samples))), ops

    def _alone(
        self, i: int, target: Any, registry: Registry, runtime: str, rtol: float, atol: float, ops: set[str]
    ) -> SampleResult:
        single = self.singles.get(i)
        if single is None:
            single = self.singles[i] = self._batch([i])
            single.capture(registry, target)
        label = self.samples[i].label
        if isinstance(single.program, BaseException):
            return SampleResult(i, label, SKIPPED, f"torch.export rejects it: {_short(single.program)}")
        verdict = single.run(target, registry, runtime, rtol, atol, ops)
        return self._matched(i, single.summaries.get(0)) if verdict is None else SampleResult(i, label, FAILED, verdict)

    def _matched(self, i: int, summary: str | None) -> SampleResult:
        label = self.samples[i].label
        if summary is not None:
            return SampleResult(i, label, DISTRIBUTION, summary)
        if any(isinstance(e, _ShapeOnly) for e in self.expected[i]):
            why = "values not compared: uninitialized or random results, compared by shape and dtype only"
            return SampleResult(i, label, SHAPE_ONLY, why)
        return SampleResult(i, label, PASSED)


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
