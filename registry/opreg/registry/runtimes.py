"""ONNX Runtime releases as targets: per release, the ops and versions its CPU provider has kernels
for, and the newest ai.onnx opset and IR version it loads.

The facts are data (``ort_kernels.json`` beside this module, made by ``tools/ort_kernels.py`` from
each release's own kernel table, ``get_all_opkernel_def()``): per release, per (domain, op), the
version ranges of its kernels. A release the data does not hold, such as the installed one when it
is newer, is read live from the installed onnxruntime.

ONNX Runtime serves a node with a kernel when the node's schema version at the model's opset (Gemm
at ai.onnx 23 is Gemm-13) lies in the kernel's range, a kernel registered open-ended serving its
start only (``KernelRegistry::VerifyKernelDef``): an op given a new version (RandomNormalLike-22)
has no kernel until the release adds one (:func:`serves`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from opreg.errors import InvalidTargetError
from opreg.registry.versions import is_function

RUNTIME = "onnxruntime"
"""The runtime whose releases a target may name (``onnxruntime==1.22``), and its profile's name."""
TABLE = Path(__file__).with_name("ort_kernels.json")
KERNEL_DOMAINS = frozenset({"", "ai.onnx.ml", "com.microsoft"})
"""The domains the tables judge: ONNX Runtime's kernels of other domains are the packs' business."""

NO_KERNEL_NEEDED = frozenset({"Constant"})
"""ai.onnx ops ONNX Runtime runs with no kernel: it turns them into initializers when it loads a model."""

Range = tuple[int, int | None]


def serves(ranges: tuple[Range, ...], since: int) -> bool:
    """Whether a kernel of ``ranges`` (``(start, end)``, ``end`` ``None`` for open-ended) serves a
    node whose schema version is ``since``, by ONNX Runtime's rule."""
    return any(start == since or (end is not None and start < since <= end) for start, end in ranges)


@dataclasses.dataclass(frozen=True)
class Release:
    """One ONNX Runtime release's CPU kernels and the newest opset and IR version it loads.

    Fields:
        version: the release (``1.22.1``).
        max_opset: the newest ai.onnx opset it loads; ``max_ir``: the newest IR version.
        kernels: per ``(domain, op)`` (``""`` for ai.onnx), the version ranges of its kernels.
    """

    version: str
    max_opset: int
    max_ir: int
    kernels: Mapping[tuple[str, str], tuple[Range, ...]] = dataclasses.field(repr=False, compare=False)

    @property
    def label(self) -> str:
        """``onnxruntime 1.22.1``."""
        return f"{RUNTIME} {self.version}"

    def runs(self, domain: str, op: str, since: int) -> bool:
        """Whether the release runs ``op`` of ``domain`` at schema version ``since``: a CPU kernel
        serves it, or it needs none (``Constant``, which the runtime folds; an op ONNX defines as a
        function, which it expands). A domain it does not judge (:data:`KERNEL_DOMAINS`) always runs."""
        domain = "" if domain == "ai.onnx" else domain
        if domain not in KERNEL_DOMAINS or serves(self.kernels.get((domain, op), ()), since):
            return True
        return not domain and (op in NO_KERNEL_NEEDED or is_function(op, since, domain))


@functools.cache
def releases() -> tuple[Release, ...]:
    """The releases the data holds, oldest first."""
    table = json.loads(TABLE.read_text())
    return tuple(_release(version, entry) for version, entry in sorted(table.items(), key=lambda i: _key(i[0])))


def _release(version: str, entry: Mapping) -> Release:
    kernels = {}
    for key, ranges in entry["kernels"].items():
        domain, _, op = key.rpartition(":")
        kernels[(domain, op)] = tuple((int(start), end) for start, end in ranges)
    return Release(version, int(entry["max_opset"]), int(entry["max_ir"]), kernels)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def release(version: str, newest: Callable[[], int] | None = None) -> Release:
    """The release ``version`` names: ``1.22`` is the newest 1.22.x the data holds, ``1.22.1`` that
    one; the installed release is read live when the data does not hold it (``newest``: the newest
    opset it loads, :func:`opreg.registry.targets.newest_onnxruntime_opset`). Anything else is an
    :class:`InvalidTargetError` listing the releases known."""
    wanted = _key(version)
    if not wanted or len(wanted) != len(version.split(".")):
        raise InvalidTargetError(f"{RUNTIME}=={version}: give a release as numbers, e.g. {RUNTIME}==1.22")
    found = [r for r in releases() if _key(r.version)[: len(wanted)] == wanted]
    if found:
        return found[-1]
    installed = installed_version()
    if installed is not None and _key(installed)[: len(wanted)] == wanted:
        return installed_release(newest)
    known = ", ".join(r.version for r in releases())
    raise InvalidTargetError(
        f"opreg has no kernel table for {RUNTIME} {version}: known releases are {known}"
        f"{f' and the installed {installed}' if installed else ''}. Add one with tools/ort_kernels.py {version}"
    )


def installed_version() -> str | None:
    """The installed onnxruntime's version (read from its distribution, without importing it)."""
    import importlib.metadata

    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def installed_release(newest: Callable[[], int] | None = None) -> Release:
    """The installed onnxruntime's release: from the data when it holds that version, else read
    live (its kernel table, and ``newest()``: :func:`opreg.registry.targets.newest_onnxruntime_opset`;
    without it, the newest release the data holds says)."""
    version = installed_version()
    if version is None:
        raise InvalidTargetError(f"the {RUNTIME} target needs onnxruntime installed: pip install onnxruntime")
    held = [r for r in releases() if r.version == version.partition("+")[0]]
    if held:
        return held[0]
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    kernels: dict[tuple[str, str], set[Range]] = {}
    for k in state.get_all_opkernel_def():
        if k.provider == "CPUExecutionProvider":
            start, end = k.version_range
            domain = "" if k.domain == "ai.onnx" else k.domain
            kernels.setdefault((domain, k.op_name), set()).add((start, None if end >= 2**31 - 1 else end))
    newest = releases()[-1]
    return Release(
        version,
        newest() if newest is not None else releases()[-1].max_opset,
        newest.max_ir,  # not probed live: newer releases read at least what the newest held one does
        {key: tuple(sorted(ranges, key=lambda r: r[0])) for key, ranges in kernels.items()},
    )


def first_with(domain: str, op: str, since: int) -> Release | None:
    """The oldest release the data holds with a CPU kernel for ``op`` at ``since``, if any."""
    return next((r for r in releases() if r.runs(domain, op, since)), None)


def lacks(release: Release, domain: str, op: str, since: int) -> str:
    """``RandomNormalLike-22 (ai.onnx), which onnxruntime 1.32.0 has no CPU kernel for (none of
    opreg's tables has one)``: a missing kernel, said for a refusal."""
    other = first_with(domain, op, since)
    where = (
        f"{RUNTIME} {other.version} and later have one"
        if other is not None and _key(other.version) > _key(release.version)
        else f"no {RUNTIME} release opreg knows has one"
    )
    return f"{op}-{since} ({domain or 'ai.onnx'}), which {release.label} has no CPU kernel for ({where})"
