"""The core pack against PyTorch's own op database (``op_db``).

Every OpInfo whose samples reach an ATen op the core pack implements is
driven at float32 and at the integer, bool and float16 dtypes it supports:
its CPU samples (the first :data:`LIMITS`) go into one-op models exported at
the lowest and the newest supported opset, run in ONNX Runtime and compared
with eager PyTorch (tolerances: ``opreg.testing.TOLERANCES``; integer and
bool results exact). Samples that eager PyTorch or ``torch.export`` itself
rejects are skipped (torch's limits, not the pack's); every other failure
is either fixed or listed in :data:`KNOWN` with its reason, the exact
samples and the error they fail with, so a new failure, a known sample
failing with another error, or a known one that starts passing, fails the
test. Ops returning indices are compared by gathering (``oi.COMPARE``);
uninitialized results by shape and dtype only (:data:`SHAPE_ONLY`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import pytest
import torch

import opreg
from opreg.testing import PASSED, check_samples, compare_outputs
from opreg.testing import SHAPE_ONLY as SHAPE_ONLY_STATUS
from opreg.testing import opinfo as oi

LIMITS = {"float32": 16}
LIMIT = 8
"""Samples per OpInfo: the first 16 at float32, 8 at the other dtypes (some OpInfos
generate hundreds of near-duplicates; ``bench/coverage.py`` drives 24 by default)."""

TOLERANCES = {
    "nn.functional.conv3d": (
        (1e-4, 1e-4),
        "sums of 64 products (a 4x4x4 kernel, dilated) accumulated in another order by ONNX Runtime's Conv",
    ),
    "nn.functional.scaled_dot_product_attention": (
        (1e-4, 1e-4),
        "softmax over rows of 10+ scores, summed in another order by ONNX Runtime's MatMul",
    ),
}
"""Per-OpInfo ``(rtol, atol)`` wider than ``opreg.testing.TOLERANCES``, with why (float32)."""

TARGETS = (18, opreg.newest_supported_opset())


@dataclasses.dataclass(frozen=True)
class Known:
    """An expected failure of one OpInfo at one dtype.

    Fields:
        reason: why the samples fail (torch's limit, ONNX's, or a known gap in opreg).
        samples: exactly which sample indices fail (at one target or more).
        error: a regular expression searched in every failing sample's detail (or one per
            sample, by index): a listed sample failing otherwise is a new failure.
    """

    reason: str
    samples: frozenset[int]
    error: str | Mapping[int, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", frozenset(self.samples))
        if not self.reason or not self.samples:
            raise ValueError("a KNOWN entry needs a reason and the failing samples")
        if isinstance(self.error, Mapping) and set(self.error) != self.samples:
            raise ValueError("a KNOWN entry's errors by sample must name exactly its samples")
        for pattern in self.error.values() if isinstance(self.error, Mapping) else [self.error]:
            re.compile(pattern)

    def pattern(self, index: int) -> str:
        """The error sample ``index`` must fail with."""
        return self.error[index] if isinstance(self.error, Mapping) else self.error

    def matches(self, index: int, detail: str) -> bool:
        return re.search(self.pattern(index), detail) is not None


_INT_CONV = "ONNX Conv/ConvTranspose have no integer types; integer inputs are refused by the impl's predicate"
_INT_CONV_ERROR = r"UnsupportedOpsError: .* aten::conv(olution|1d|2d|3d)\.default: .*predicates reject these nodes"
_MULTINOMIAL = (
    "multinomial with replacement is ONNX's Multinomial, which nothing here runs at opset 22 and up: ONNX "
    "Runtime 1.32 has no kernel past opset 21 (microsoft/onnxruntime#32201) and onnx.reference none at all"
)
_MULTINOMIAL_ERROR = r"run failed: RuntimeImplementationError: No registered implementation for operator 'Multinomial'"
_COMPLEX_WINDOW = "ONNX's STFT takes a real window; stft with a complex one is refused by the impl"
_COMPLEX_ISTFT = "istft with return_complex=True (a complex signal) is refused by the impl: only real signals"

_REPEATS_TENSOR = (
    "repeat_interleave with a tensor of repeats is repeat_interleave.Tensor, whose output size depends on the "
    "repeats' values: no impl (repeats as an int is covered)"
)
_REPEATS_TENSOR_ERROR = r"UnsupportedOpsError: .* aten::repeat_interleave\.Tensor: .*No installed pack implements it"

KNOWN: dict[tuple[str, str], Known] = {
    **{
        ("repeat_interleave", dtype): Known(_REPEATS_TENSOR, {3, 4}, _REPEATS_TENSOR_ERROR)
        for dtype in ("float32", "int64", "bool", "float16")
    },
    ("nn.functional.conv1d", "int64"): Known(_INT_CONV, range(8), _INT_CONV_ERROR),
    ("nn.functional.conv2d", "int64"): Known(_INT_CONV, range(8), _INT_CONV_ERROR),
    ("nn.functional.conv3d", "int64"): Known(_INT_CONV, range(8), _INT_CONV_ERROR),
    ("nn.functional.conv_transpose1d", "int64"): Known(_INT_CONV, range(8), _INT_CONV_ERROR),
    ("nn.functional.conv_transpose2d", "int64"): Known(_INT_CONV, range(8), _INT_CONV_ERROR),
    ("nn.functional.conv_transpose2d", "float16"): Known(
        "torch's float16 CPU conv_transpose rounds partial sums; ONNX Runtime's result is closer to "
        "float32's (3 of 3872 elements off by 0.0625 at magnitude ~8)",
        {2},
        r"^output 0: 3 of 3872 elements out of tolerance",
    ),
    ("multinomial", "float32"): Known(_MULTINOMIAL, {4, 5}, _MULTINOMIAL_ERROR),
    ("multinomial", "float16"): Known(_MULTINOMIAL, {4, 5}, _MULTINOMIAL_ERROR),
    ("stft", "complex64"): Known(_COMPLEX_WINDOW, {7}, r"ONNX's STFT takes a real window"),
    ("istft", "complex64"): Known(_COMPLEX_ISTFT, {7}, r"istft with return_complex=True is not exported"),
    **{
        ("as_strided.partial_views", dtype): Known(
            "the input is a view into a larger storage and as_strided reads that storage outside the view "
            "(storage_offset=0 before it, 10 past its end); an exported model receives the view's values only "
            "(test_as_strided_of_a_partial_view_reads_the_view checks what it computes instead)",
            {1, 2},
            {
                1: r"^output 0: (4 of 4 elements out of tolerance|values differ) \(max abs [\d.]+\)$",
                2: r"^run failed: .*Gather.* indices element out of data bounds, idx=10 must be within the inclusive "
                r"range \[-10,9\]$",
            },
        )
        for dtype in ("float32", "int64", "bool", "float16")
    },
    ("norm.nuc", "float32"): Known(
        "the nuclear norm sums singular values: ONNX has no SVD (nor eigendecomposition) op, so "
        "aten::_linalg_svd has no impl (it would take Jacobi sweeps in a Loop)",
        {0, 1},
        r"UnsupportedOpsError: .* aten::_linalg_svd\.default",
    ),
    ("_upsample_bilinear2d_aa", "float32"): Known(
        "with scale factors given, torch derives its antialiasing filter (and the output size, in float64) from "
        "them; Resize's antialias filter follows the sizes, so the impl's predicate takes output sizes only",
        {2, 3, 5, 6},
        r"UnsupportedOpsError: .* aten::_upsample_bilinear2d_aa\.(vec|default): .*predicates reject these nodes",
    ),
    ("unique_consecutive", "float32"): Known(
        "torch's meta kernel gives unique_consecutive(dim=-1) of a 1-D tensor a 2-D result (u0, 5), its eager "
        "kernel a 1-D one: the graph torch.export declares contradicts every correct impl",
        {15},
        r"returned a rank-1 tensor where torch computes rank 2",
    ),
}
"""Expected failures: why, exactly which samples fail, and with what error."""

SHAPE_ONLY = {
    name: "uninitialized memory: only the shape and dtype say anything"
    for name in ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
}
"""OpInfos whose samples are all compared by shape and dtype only (``oi.UNINITIALIZED``), with why;
any other OpInfo must have a sample compared by value."""


COMPLEX64 = frozenset(
    {
        *(f"fft.{kind}{dims}" for kind in ("fft", "ifft", "irfft", "hfft") for dims in ("", "2", "n")),
        "stft", "istft", "view_as_real", "real", "imag", "conj", "conj_physical", "angle", "abs", "exp", "mul", "add",
        "sub", "div.no_rounding_mode", "rand_like", "randn_like", "randn", "normal.in_place", "uniform",
    }
)  # fmt: skip
"""OpInfos also driven at complex64 (complex values travel as real pairs, docs/design.md, "An export"): the ones whose
ops the core pack's complex impls serve."""


def _cases() -> list[tuple[str, str]]:
    registry = opreg.default_registry()
    infos: dict[str, object] = {}
    for op in registry.ops():
        if op.namespace == "aten" and any(i.pack == "core" for i in registry.impls(op)):
            for info in oi.opinfos_for(op):
                infos[oi.full_name(info)] = info
    cases = [(name, str(dtype).replace("torch.", "")) for name in sorted(infos) for dtype in oi.dtypes_for(infos[name])]
    return cases + [(name, "complex64") for name in sorted(COMPLEX64)]


_INFOS = {oi.full_name(i): i for i in oi.op_db()}
_CASES = _cases()


@pytest.mark.parametrize(
    ("name", "dtype"), [("conv_transpose2d", "float16"), ("multinomial", "float32"), ("sum", "int64")]
)
def test_the_samples_are_the_ones_torchs_sample_inputs_gives(name, dtype):
    """``oi.samples`` draws from ``sample_inputs_func`` as ``sample_inputs`` does, without its stack
    walks: the same tensors (the KNOWN entries name samples by index and by the errors they give)."""
    import itertools

    info, dt = _INFOS[name if name != "conv_transpose2d" else "nn.functional.conv_transpose2d"], getattr(torch, dtype)
    torch.manual_seed(0)
    theirs = [(s.input, *s.args) for s in itertools.islice(info.sample_inputs("cpu", dt), LIMIT)]
    ours = [s.args for s in oi.samples(info, dt, LIMIT)]
    assert len(ours) == len(theirs) > 0
    for mine, reference in zip(ours, theirs, strict=True):
        for a, b in zip(mine, reference, strict=True):
            assert type(a) is type(b)
            if isinstance(a, torch.Tensor):
                assert (a.dtype, a.shape) == (b.dtype, b.shape) and torch.equal(a, b)


def test_every_known_entry_and_shape_only_name_is_a_case():
    """An entry for an OpInfo or dtype no longer driven would silently vouch for nothing."""
    assert set(KNOWN) <= set(_CASES), sorted(set(KNOWN) - set(_CASES))
    assert set(SHAPE_ONLY) <= {name for name, _ in _CASES}, sorted(set(SHAPE_ONLY) - {name for name, _ in _CASES})


@pytest.mark.parametrize(("name", "dtype"), _CASES, ids=lambda v: v)
def test_opinfo_samples(name: str, dtype: str) -> None:
    info = _INFOS[name]
    tolerances = TOLERANCES[name][0] if name in TOLERANCES and dtype == "float32" else None
    limit = LIMITS.get(dtype, LIMIT)
    checks = oi.check_opinfo(info, getattr(torch, dtype), targets=TARGETS, limit=limit, tolerances=tolerances)
    failures = [(c.target, r) for c in checks for r in c.failures()]
    failing = {r.index for _, r in failures}
    report = "\n".join(str(c) for c in checks if c.failures())
    known = KNOWN.get((name, dtype))
    expected = known.samples if known else frozenset()
    if failing - expected:
        pytest.fail(f"new failures (not in KNOWN):\n{report}", pytrace=False)
    if expected - failing:
        pytest.fail(
            f"KNOWN lists samples {sorted(expected - failing)} of {name} [{dtype}] as failing, but they pass: "
            "remove them from KNOWN",
            pytrace=False,
        )
    assert [c.target for c in checks] == [str(opreg.Target.of(t)) for t in TARGETS], "a target was not checked"
    assert all(c.results for c in checks), f"{name} [{dtype}] has no samples: it would pass comparing nothing"
    if known:
        otherwise = [
            f"  sample {r.index} at {t}: {r.detail} (expected {known.pattern(r.index)!r})"
            for t, r in failures
            if not known.matches(r.index, r.detail)
        ]
        if otherwise:
            pytest.fail(
                f"KNOWN expects samples {sorted(expected)} of {name} [{dtype}] to fail with their errors, "
                "but some fail otherwise:\n" + "\n".join(otherwise),
                pytrace=False,
            )
        pytest.xfail(f"{known.reason} (samples {sorted(expected)})")
    ran = "\n".join(str(c) for c in checks)
    if name in SHAPE_ONLY:
        assert not any(c.compared for c in checks), f"{name} [{dtype}] is compared by value: remove it from SHAPE_ONLY"
        assert all(c.count(SHAPE_ONLY_STATUS) for c in checks), f"no sample of {name} [{dtype}] ran:\n{ran}"
    else:
        assert all(c.compared for c in checks), f"no sample of {name} [{dtype}] was compared by value:\n{ran}"


def test_as_strided_of_a_partial_view_reads_the_view():
    """What KNOWN's as_strided.partial_views sample 1 computes instead: its input is elements 5-14 of a
    storage of 20, and torch's as_strided with storage_offset=0 reads elements 0-3, before the view; the
    exported model receives the view's 10 values only and reads them as its storage."""
    info = _INFOS["as_strided.partial_views"]
    sample = oi.samples(info, torch.float32, LIMIT)[1]
    view, size, stride = sample.args
    assert (view.storage_offset(), view.untyped_storage().nbytes() // 4) == (5, 20)
    assert sample.kwargs == {"storage_offset": 0}

    def on_the_view(sample, got, expected, rtol, atol):
        own = torch.as_strided(sample.args[0].clone(), size, stride, 0)  # the view's values as a storage
        assert not torch.equal(own, expected[0])  # torch reads elsewhere
        return compare_outputs(sample, got, [own], rtol, atol)

    checks = check_samples(oi.op_for(info), [sample], targets=TARGETS, compare=on_the_view)
    assert [r.status for c in checks for r in c.results] == [PASSED, PASSED], "\n".join(map(str, checks))
