"""PyTorch's own op database (``op_db``) as sample inputs for ATen impls.

``op_db`` lives in ``torch.testing._internal`` and needs the test-only
package ``expecttest``; it takes several seconds to import, so it is loaded
once, on first use.

Each OpInfo's samples are compared with :func:`compare_for` (elementwise,
by gathering the input for ops whose indices ties make ambiguous, see
:data:`COMPARE`, or by distribution for the random ops in :data:`RANDOM`),
and by shape and dtype only for :data:`UNINITIALIZED` ones.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from opreg.pluginapi import Sample, describe
from opreg.registry.opname import OpName
from opreg.registry.registry import Registry
from opreg.registry.targets import TargetLike
from opreg.testing._compare import Arg, Compare, Distribution, Exporter, GatherIndices, ScaledTolerance, UpcastReference
from opreg.testing._samples import SampleCheck, check_samples

EXTRA_DTYPES = (torch.int64, torch.int32, torch.bool, torch.float16)
"""Tried beside float32 when the OpInfo supports them (one integer type: int64, else int32)."""

ALSO_COVERS: dict[str, tuple[str, ...]] = {
    "convolution": ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d"),
    "conv1d": ("nn.functional.conv1d",),
    "conv2d": ("nn.functional.conv2d",),
    "conv3d": ("nn.functional.conv3d",),
    "_adaptive_avg_pool2d": ("nn.functional.adaptive_avg_pool2d",),
    "adaptive_avg_pool2d": ("nn.functional.adaptive_avg_pool2d",),
    "max_pool2d_with_indices": ("nn.functional.max_pool2d",),
    "max_pool2d": ("nn.functional.max_pool2d",),
    "avg_pool2d": ("nn.functional.avg_pool2d",),
    "_softmax": ("softmax",),
    "_log_softmax": ("log_softmax",),
    "_native_batch_norm_legit_no_training": ("nn.functional.batch_norm",),
    "_native_batch_norm_legit_functional": (
        "nn.functional.batch_norm",
        "native_batch_norm",
        "_native_batch_norm_legit",
    ),
    "native_layer_norm": ("nn.functional.layer_norm",),
    "native_group_norm": ("nn.functional.group_norm",),
    "_to_copy": ("to",),
    "_scaled_dot_product_flash_attention_for_cpu": ("nn.functional.scaled_dot_product_attention",),
    "scalar_tensor": ("scalar_tensor",),
    "alias": ("view_as",),
    "upsample_bilinear2d": ("nn.functional.interpolate",),
    "upsample_nearest2d": ("nn.functional.interpolate",),
    "_unsafe_view": ("view",),
    "split_with_sizes": ("split",),
    "constant_pad_nd": ("nn.functional.pad",),
    "pad": ("nn.functional.pad",),
    "reflection_pad2d": ("nn.functional.pad",),
    "replication_pad2d": ("nn.functional.pad",),
    "embedding": ("nn.functional.embedding",),
    "_cdist_forward": ("cdist",),
    "_pdist_forward": ("nn.functional.pdist",),
    "col2im": ("nn.functional.fold",),
    "index": ("__getitem__",),
    "_local_scalar_dense": ("item",),
    "max_pool1d_with_indices": ("nn.functional.max_pool1d",),
    "max_pool3d_with_indices": ("nn.functional.max_pool3d",),
    "reflection_pad1d": ("nn.functional.pad",),
    "reflection_pad3d": ("nn.functional.pad",),
    "replication_pad1d": ("nn.functional.pad",),
    "replication_pad3d": ("nn.functional.pad",),
    "upsample_bicubic2d": ("nn.functional.interpolate",),
    "upsample_linear1d": ("nn.functional.interpolate",),
    "upsample_nearest1d": ("nn.functional.interpolate",),
    "upsample_nearest3d": ("nn.functional.interpolate",),
    "upsample_trilinear3d": ("nn.functional.interpolate",),
    "_fft_r2c": ("fft.rfft", "fft.rfft2", "fft.rfftn", "fft.fft", "fft.fft2", "fft.fftn", "fft.ihfft", "fft.ihfft2",
                 "fft.ihfftn", "fft.ifft", "fft.ifft2", "fft.ifftn"),
    "_fft_c2c": ("fft.fft", "fft.fft2", "fft.fftn", "fft.ifft", "fft.ifft2", "fft.ifftn", "fft.hfft", "fft.hfft2",
                 "fft.hfftn"),
    "_fft_c2r": ("fft.irfft", "fft.irfft2", "fft.irfftn", "fft.hfft", "fft.hfft2", "fft.hfftn"),
    "normal_functional": ("normal.in_place",),
    "rrelu_with_noise_functional": ("nn.functional.rrelu",),
    "bernoulli": (
        "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train",
    ),
    "_unique2": ("unique",),
    "_trilinear": ("nn.functional.bilinear",),
    "_batch_norm_with_update_functional": ("_batch_norm_with_update",),
    "_embedding_bag_forward_only": ("nn.functional.embedding_bag",),
    "linalg_vector_norm": ("norm", "nn.functional.normalize"),
    "_linalg_slogdet": ("logdet",),
    "var_mean": ("std_mean",),
    "as_strided": ("resize_",),
    "resize": ("resize_as_",),
}  # fmt: skip
"""ATen op base name -> OpInfo names whose samples reach it, where the names differ."""


UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
"""OpInfos whose results are uninitialized memory: compared by shape and dtype only."""

_DIM = Arg(1, "dim", -1)
_KEEPDIM = Arg(2, "keepdim", False)

_FFTS = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")

COMPARE: dict[str, Compare] = {
    "sort": GatherIndices(_DIM),
    "argsort": GatherIndices(_DIM, indices=(0,)),
    "topk": GatherIndices(Arg(2, "dim", -1)),
    "max.reduction_with_dim": GatherIndices(Arg(1, "dim"), _KEEPDIM),
    "min.reduction_with_dim": GatherIndices(Arg(1, "dim"), _KEEPDIM),
    "kthvalue": GatherIndices(Arg(2, "dim", -1), Arg(3, "keepdim", False)),
    "median": GatherIndices(Arg(1, "dim", None), _KEEPDIM),
    "nanmedian": GatherIndices(Arg(1, "dim", None), _KEEPDIM),
    "mode": GatherIndices(_DIM, _KEEPDIM),
    "cummax": GatherIndices(Arg(1, "dim")),
    "cummin": GatherIndices(Arg(1, "dim")),
    **{f"fft.{kind}{dims}": ScaledTolerance(3e-5) for kind in _FFTS for dims in ("", "2", "n")},
    "stft": ScaledTolerance(3e-5),
    "istft": ScaledTolerance(3e-5),
}
"""OpInfo full name -> how its samples' outputs are compared, where not elementwise.

These ops return indices into their input; where the input has equal elements, torch
leaves which of them is picked unspecified (``sort`` without ``stable=True``, ``topk``,
``max(dim)``, ``kthvalue``, ``median``, ``mode``; ``cummax``/``cummin`` pick the last),
so an index is right when it picks an element equal to eager PyTorch's pick
(:class:`~opreg.testing._samples.GatherIndices`); values are compared as usual.
``argmax``/``argmin`` are documented to return the first occurrence and stay
elementwise; ``msort`` returns values only.

Fourier transforms are compared within 3e-5 of each output's largest magnitude
(:class:`~opreg.testing._samples.ScaledTolerance`): every bin is a sum over the whole
signal, and ONNX Runtime sums sizes that are not powers of 2 directly, in float32, where
torch's pocketfft factors them (observed: at most 1e-5 of the largest magnitude)."""


RANDOM = frozenset(
    {
        "randn", "rand_like", "randn_like", "randint", "randint_like", "normal", "normal.number_mean",
        "normal.in_place", "uniform", "bernoulli", "multinomial", "exponential", "cauchy", "geometric", "log_normal",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train", "nn.functional.rrelu",
        "nn.functional.scaled_dot_product_attention",
    }
)  # fmt: skip
"""OpInfos with random results (in training, or with ``dropout_p > 0``): their random samples are
compared by distribution (:class:`~opreg.testing._samples.Distribution`, default settings), the
others elementwise."""


def op_for(info: Any) -> Any:
    """What drives ``info``'s samples: ``info.op``, except that a :data:`RANDOM` OpInfo's op draws
    fresh numbers at every call. op_db wraps its random ops in ``wrapper_set_seed``, which seeds
    torch with 42 at every call (so its tests see the same numbers each time); a comparison by
    distribution needs many different draws, so the wrapper is bypassed for the call."""
    op = info.op
    namespace = getattr(op, "__globals__", None)
    if full_name(info) not in RANDOM or namespace is None or "wrapper_set_seed" not in namespace:
        return op

    @functools.wraps(op)
    def fresh(*args: Any, **kwargs: Any) -> Any:
        reseeding = namespace["wrapper_set_seed"]
        namespace["wrapper_set_seed"] = _call
        try:
            return op(*args, **kwargs)
        finally:
            namespace["wrapper_set_seed"] = reseeding

    return fresh


def _call(op: Any, *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


UPCAST: dict[str, str] = {
    "grid_sampler_2d": "torch's float16 CPU grid_sampler rounds each step (off by up to 0.06 from a float64 "
    "reference); the core pack computes in float32 and rounds once (off by < 0.001)",
}
"""OpInfos whose half-precision samples are compared with torch in float32 (:class:`UpcastReference`),
with why: torch's own half kernel is the less exact of the two."""


def compare_for(info: Any) -> Compare | None:
    """How ``info``'s sample outputs are compared: :data:`COMPARE`'s hook, a :class:`Distribution`
    for :data:`RANDOM` OpInfos, an :class:`UpcastReference` for :data:`UPCAST` ones, or ``None``
    (elementwise)."""
    name = full_name(info)
    if name in UPCAST:
        return UpcastReference(op_for(info))
    return Distribution() if name in RANDOM else COMPARE.get(name)


@functools.cache
def op_db() -> tuple[Any, ...]:
    """``torch.testing._internal.common_methods_invocations.op_db`` (needs ``expecttest``)."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db as db
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"PyTorch's op database needs the test-only package expecttest: pip install expecttest ({e})"
        ) from e
    return tuple(db)


def full_name(info: Any) -> str:
    """``name`` or ``name.variant`` (``nn.functional.gelu``, ``norm.fro``)."""
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


_PREFIXES = ("nn.functional.", "special.", "linalg.", "fft.")
"""OpInfo namespaces whose ops are single ATen ops under another spelling
(``masked.*``, ``sparse.*`` and ``_refs.*`` are compositions of many)."""


def _keys(info: Any) -> set[str]:
    names = {info.name, info.name.replace(".", "_")}
    if info.name.startswith(_PREFIXES):
        names.add(info.name.rsplit(".", 1)[-1])
    if info.aten_name:
        names.add(info.aten_name)
    return names


@functools.cache
def _index() -> dict[str, tuple[Any, ...]]:
    """Every spelling an OpInfo is found by (see :func:`_keys`, plus its full name) -> OpInfos."""
    index: dict[str, list[Any]] = {}
    for info in op_db():
        for key in _keys(info) | {full_name(info)}:
            index.setdefault(key, []).append(info)
    return {key: tuple(infos) for key, infos in index.items()}


def opinfos_for(op: Any) -> tuple[Any, ...]:
    """The OpInfos whose samples exercise ATen op ``op`` (by name, plus :data:`ALSO_COVERS`)."""
    base = OpName.of(op).name
    index = _index()
    found: dict[int, Any] = {}
    for name in (base, base.lstrip("_"), *ALSO_COVERS.get(base, ())):
        for info in index.get(name, ()):
            found[id(info)] = info
    return tuple(found.values())


def dtypes_for(info: Any) -> list[torch.dtype]:
    """float32, plus one integer type, bool and float16 when ``info`` supports them."""
    supported = info.supported_dtypes("cpu")
    chosen = [torch.float32] if torch.float32 in supported else []
    ints = [d for d in (torch.int64, torch.int32) if d in supported]
    chosen.extend(ints[:1])
    chosen.extend(d for d in (torch.bool, torch.float16) if d in supported)
    return chosen


def samples(info: Any, dtype: torch.dtype, limit: int | None = None) -> list[Sample]:
    """``info``'s CPU sample inputs at ``dtype`` as :class:`Sample` s (the first ``limit``): those
    ``info.sample_inputs("cpu", dtype)`` gives outside a ``unittest.TestCase``, with the same values."""
    torch.manual_seed(0)
    picked = []
    for s in itertools.islice(_sample_inputs(info, dtype), limit):
        args = (s.input, *s.args)
        picked.append(Sample(args, dict(s.kwargs), describe(args, s.kwargs)))
    return picked


def _sample_inputs(info: Any, dtype: torch.dtype) -> Iterator[Any]:
    """What ``info.sample_inputs("cpu", dtype)`` yields, without what it costs on the side.

    torch wraps the samples in an iterator that first walks the caller's stack with
    ``inspect.stack()`` (twice) for a ``unittest`` test whose name would seed it, reading a
    source line of every frame: under pytest about a second per call on a loaded machine, 40% of
    an OpInfo test's time. Outside a ``unittest.TestCase`` that walk finds nothing, and the
    iterator then seeds every generator with torch's default test seed before each sample;
    this draws the samples from ``info.sample_inputs_func`` the same way (the same tensors:
    ``tests/test_opdb.py`` compares the two)."""
    from torch.testing._internal import common_utils

    found = iter(info.sample_inputs_func(info, "cpu", dtype, False))
    while True:
        common_utils.set_rng_seed(common_utils.SEED)
        try:
            yield next(found)
        except StopIteration:
            return


def check_opinfo(
    info: Any,
    dtype: torch.dtype,
    *,
    targets: Sequence[TargetLike],
    registry: Registry | None = None,
    limit: int | None = None,
    tolerances: tuple[float, float] | None = None,
    exporter: Exporter | None = None,
) -> list[SampleCheck]:
    """Drive ``info.op`` with its samples at ``dtype``; one :class:`SampleCheck` per target
    (through ``exporter`` instead of opreg when given, see :data:`~opreg.testing.Exporter`)."""
    return check_samples(
        op_for(info),
        samples(info, dtype, limit),
        targets=targets,
        name=full_name(info),
        registry=registry,
        tolerances=tolerances,
        values=info.name not in UNINITIALIZED,
        compare=compare_for(info),
        exporter=exporter,
    )
