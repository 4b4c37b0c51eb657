"""Drive an op with sample inputs: export a one-op model, run it, compare with eager.

All samples of one call go into a single model (one capture, one session),
because an export costs far more than running it; only when that model fails
are the samples exported one by one, so each result names its own sample.

How a sample's outputs are compared is a :data:`Compare` hook:
:func:`compare_outputs` (every output elementwise, the default) or
:class:`GatherIndices` (ops returning indices into their input, where ties
make the indices ambiguous: sort, topk, max.dim, ...).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from opreg.registry import Registry
from opreg.targets import Target, TargetLike

PASSED = "passed"
SHAPE_ONLY = "shape-only"
FAILED = "failed"
SKIPPED = "skipped"
STATUSES = (PASSED, SHAPE_ONLY, FAILED, SKIPPED)
"""A sample's status: its values matched; only its shapes and dtypes could be
compared and they matched (uninitialized or random results); it failed; or
eager PyTorch or ``torch.export`` rejected it (torch's limit, not the impl's)."""

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float64: (1e-7, 1e-7),
}
"""Default ``(rtol, atol)`` by the sample's dtype; integer and bool results must be exact.
float32: torch's own ``assert_close`` atol, a looser rtol for different summation
orders; float16: about five float16 ulps, since ONNX Runtime often computes
float16 ops in float32 and rounds once where torch's CPU kernels round each step."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One call of an op: ``fn(*args, **kwargs)``.

    Fields:
        args, kwargs: the arguments; tensors anywhere in them (also in lists)
            become the model's inputs, everything else is baked in.
        label: how the sample is named in reports (shapes and scalars).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    label: str = ""

    @classmethod
    def of(cls, *args: Any, **kwargs: Any) -> Sample:
        return cls(args, kwargs, describe(args, kwargs))

    def copy(self) -> Sample:
        """A deep copy (tensors, lists and dicts copied; tensors shared within the sample stay shared),
        so running an op that mutates its arguments on the copy leaves this sample untouched."""
        args, kwargs = copy.deepcopy((self.args, self.kwargs))
        return Sample(args, kwargs, self.label)


@dataclasses.dataclass(frozen=True)
class SampleResult:
    """How one sample fared.

    Fields:
        index: the sample's position in the list driven.
        label: the sample's label.
        status: one of :data:`STATUSES` (``passed``, ``shape-only``, ``failed``, ``skipped``).
        detail: why it failed or was skipped, or what a shape-only sample's values are.
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
        """At least one sample's values were compared with eager PyTorch and matched."""
        return self.count(PASSED) > 0

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def failures(self) -> list[SampleResult]:
        return [r for r in self.results if r.status == FAILED]

    def __str__(self) -> str:
        head = (
            f"{self.name} [{self.dtype}] at {self.target}: {self.count(PASSED)} passed, "
            f"{self.count(SHAPE_ONLY)} shape-only, {self.count(FAILED)} failed, {self.count(SKIPPED)} skipped"
        )
        shown = [r for r in self.results if r.status != PASSED]
        return "\n".join([head, *(f"  {r}" for r in shown)])


def describe(args: Any, kwargs: Any = None) -> str:
    """A short label for arguments: tensors as ``f32[2,3]``, the rest as repr."""

    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).replace("torch.", "")
            return f"{dtype}[{','.join(map(str, value.shape))}]"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(one(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in (kwargs or {}).items()]
    return ", ".join(parts)


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
    :class:`GatherIndices` for ops returning indices that ties make ambiguous).

    ``exporter`` drives another exporter instead of opreg (see :data:`Exporter`), with
    the same samples and comparisons: ``bench/coverage.py --all`` measures torch.onnx so.

    Results are compared by shape and dtype only, and the sample is
    *shape-only* rather than passed, when ``values`` is false (ops that return
    uninitialized memory, like ``empty``) and for samples whose eager results
    change with the random seed (``dropout`` in training).
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

    def matched(i: int) -> SampleResult:
        if any(isinstance(e, _ShapeOnly) for e in expected[i]):
            why = "values not compared: uninitialized or random results, compared by shape and dtype only"
            return SampleResult(i, samples[i].label, SHAPE_ONLY, why)
        return SampleResult(i, samples[i].label, PASSED)

    # All runnable samples in one model first; one by one only if that fails.
    batch = _Batch(fn, [samples[i] for i in runnable], [expected[i] for i in runnable], compare, exporter)
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
                for i in runnable:
                    results[i] = matched(i)
                continue
        for i in runnable:  # one by one, so each result is the sample's own
            single = singles.get(i)
            if single is None:
                single = singles[i] = _Batch(fn, [samples[i]], [expected[i]], compare, exporter)
                single.capture(registry, target)
            captured = single.program
            if isinstance(captured, BaseException):
                results[i] = SampleResult(i, samples[i].label, SKIPPED, f"torch.export rejects it: {_short(captured)}")
                continue
            verdict = single.run(target, registry, runtime, rtol, atol, ops[key])
            results[i] = matched(i) if verdict is None else SampleResult(i, samples[i].label, FAILED, verdict)
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
        exporter: Exporter | None = None,
    ) -> None:
        self.exporter = exporter
        self.samples = samples
        self.module = OpCall(fn, samples).eval()
        self.inputs = OpCall.inputs(samples)  # deep copies: the samples themselves never reach the export
        self.expected = expected
        self.compare = compare
        self.program: Any = None

    def capture(self, registry: Registry, target: Any) -> torch.export.ExportedProgram | BaseException:
        """Capture, and decompose for ``target``: other targets usually cover the
        same ops, and then export it as it is instead of decomposing again."""
        from opreg.exporter import _decompose

        try:
            self.program = torch.export.export(self.module, self.inputs, strict=False)
        except Exception as e:
            self.program = e
            return e
        if self.exporter is not None:  # another exporter decomposes as it sees fit
            return self.program
        with contextlib.suppress(Exception):  # export() decomposes again and reports it
            self.program = _decompose.decompose(self.program, registry, target)
        return self.program

    def run(self, target: Any, registry: Registry, runtime: str, rtol: float, atol: float, ops: set[str]) -> str | None:
        """Export for ``target``, run and compare: ``None`` if every sample matches, else why not
        (each sample's outputs numbered from 0, as in a model of that sample alone)."""
        import opreg
        from opreg.exporter._nodes import TORCH_OP_KEY

        if self.exporter is not None:
            try:
                run = self.exporter(self.program, target)
            except Exception as e:
                return f"export failed: {_short(e)}"
        else:
            try:
                program = opreg.export(self.program, target=target, registry=registry)
            except Exception as e:
                return f"export failed: {_short(e)}"
            for node in program.model.graph:
                op = node.metadata_props.get(TORCH_OP_KEY)
                if op:
                    ops.add(op)
            run = functools.partial(program.run, runtime=runtime)
        try:
            got = torch.utils._pytree.tree_leaves(run(*self.inputs))
        except Exception as e:
            return f"run failed: {_short(e)}"
        total = sum(len(e) for e in self.expected)
        if len(got) != total:
            return f"the model returned {len(got)} tensors, eager PyTorch {total}"
        bad = []
        start = 0
        for sample, expected in zip(self.samples, self.expected, strict=True):
            mine = got[start : start + len(expected)]
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
    """An expected result whose values say nothing (random or uninitialized)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


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
    random = not values or any(
        a.shape != b.shape
        or not (torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True)))
        for a, b in zip(first, second, strict=True)
    )
    return [_ShapeOnly(t) for t in first] if random else first


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
