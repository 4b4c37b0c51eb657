"""Drive an op with sample inputs: export a one-op model, run it, compare with eager.

All samples of one call go into a single model (one capture, one session),
because an export costs far more than running it; only when that model fails
are the samples exported one by one, so each result names its own sample.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from opreg.registry import Registry
from opreg.targets import TargetLike

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"

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
    """How one sample fared: ``status`` is passed, failed or skipped, ``detail`` says why."""

    index: int
    label: str
    status: str
    detail: str = ""

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
        return all(r.status != FAILED for r in self.results) and any(r.status == PASSED for r in self.results)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def failures(self) -> list[SampleResult]:
        return [r for r in self.results if r.status == FAILED]

    def __str__(self) -> str:
        head = (
            f"{self.name} [{self.dtype}] at {self.target}: {self.count(PASSED)} passed, "
            f"{self.count(FAILED)} failed, {self.count(SKIPPED)} skipped"
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
) -> list[SampleCheck]:
    """Export ``fn`` called on ``samples`` for each target, run it, compare with eager.

    ``fn`` is called as ``fn(*sample.args, **sample.kwargs)``. A sample that
    eager PyTorch or ``torch.export`` rejects is *skipped* (with torch's
    reason): it says nothing about the impl. One that fails to export
    through opreg, to run, or to match is *failed*. ``tolerances`` is
    ``(rtol, atol)`` for floating results (default: :data:`TOLERANCES` by dtype).

    Results are compared by shape and dtype only when ``values`` is false
    (ops that return uninitialized memory, like ``empty``) and for samples
    whose eager results change with the random seed (``dropout`` in training).
    """
    from opreg.plugins import default_registry

    registry = registry if registry is not None else default_registry()
    samples = list(samples)
    name = name or getattr(fn, "__name__", repr(fn))
    expected = [_eager(fn, sample, values) for sample in samples]
    runnable = [i for i, e in enumerate(expected) if not isinstance(e, BaseException)]
    dtype = _dtype_of(samples)
    rtol, atol = tolerances or TOLERANCES.get(dtype, (1e-5, 1e-5))
    skipped = {
        i: SampleResult(i, samples[i].label, SKIPPED, f"eager PyTorch rejects it: {_short(expected[i])}")
        for i in range(len(samples))
        if i not in runnable
    }

    # All runnable samples in one model first; one by one only if that fails.
    batch = _Batch(fn, [samples[i] for i in runnable], [expected[i] for i in runnable])
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
                    results[i] = SampleResult(i, samples[i].label, PASSED)
                continue
        for i in runnable:  # one by one, so each result is the sample's own
            single = singles.get(i)
            if single is None:
                single = singles[i] = _Batch(fn, [samples[i]], [expected[i]])
                single.capture(registry, target)
            captured = single.program
            if isinstance(captured, BaseException):
                results[i] = SampleResult(i, samples[i].label, SKIPPED, f"torch.export rejects it: {_short(captured)}")
                continue
            verdict = single.run(target, registry, runtime, rtol, atol, ops[key])
            status = PASSED if verdict is None else FAILED
            results[i] = SampleResult(i, samples[i].label, status, verdict or "")
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

    def __init__(self, fn: Callable[..., Any], samples: list[Sample], expected: list[list[Any]]) -> None:
        self.module = OpCall(fn, samples).eval()
        self.inputs = OpCall.inputs(samples)
        self.expected = [t for group in expected for t in group]
        self.program: Any = None

    def capture(self, registry: Registry, target: Any) -> torch.export.ExportedProgram | BaseException:
        """Capture, and decompose for ``target``: other targets usually cover the
        same ops, and then export it as it is instead of decomposing again."""
        from opreg.exporter import _capture

        try:
            self.program = torch.export.export(self.module, self.inputs, strict=False)
        except Exception as e:
            self.program = e
            return e
        with contextlib.suppress(Exception):  # export() decomposes again and reports it
            self.program = _capture.decompose(self.program, registry, target)
        return self.program

    def run(self, target: Any, registry: Registry, runtime: str, rtol: float, atol: float, ops: set[str]) -> str | None:
        """Export for ``target``, run and compare: ``None`` if every output matches, else why not."""
        import opreg
        from opreg.exporter._program import _compare
        from opreg.exporter._translate import PROVENANCE_KEYS

        try:
            program = opreg.export(self.program, target=target, registry=registry)
        except Exception as e:
            return f"export failed: {_short(e)}"
        for node in program.model.graph:
            op = node.metadata_props.get(PROVENANCE_KEYS[0])
            if op:
                ops.add(op)
        try:
            got = torch.utils._pytree.tree_leaves(program.run(*self.inputs, runtime=runtime))
        except Exception as e:
            return f"run failed: {_short(e)}"
        if len(got) != len(self.expected):
            return f"the model returned {len(got)} tensors, eager PyTorch {len(self.expected)}"
        bad = []
        for index, (g, e) in enumerate(zip(got, self.expected, strict=True)):
            if isinstance(e, _ShapeOnly):
                if (tuple(g.shape), g.dtype) != (tuple(e.tensor.shape), e.tensor.dtype):
                    bad.append(f"output {index}: {g.dtype}{tuple(g.shape)} != {e.tensor.dtype}{tuple(e.tensor.shape)}")
                continue
            check = _compare(f"output {index}", g, e, rtol, atol)
            if not check.ok:
                bad.append(f"{check.name}: {check.detail} (max abs {check.max_abs:.3g})")
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
