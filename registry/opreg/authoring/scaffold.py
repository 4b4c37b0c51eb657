"""``opreg new-pack``: a new op pack, written for the ops it translates.

``opreg new-pack opreg-swishpack --op 'swishlib::fused_swish(Tensor x, float beta) -> Tensor'``
writes an installable distribution whose package holds, for each op: an impl
stub (the body to write, in ``impls.py``), the pack's ONNX op for it (schema,
reference kernel, and a place for its definition in standard ONNX), samples
for the conformance kit, and a test; plus the metadata, a README and a CI
workflow (:mod:`opreg.authoring._packfiles`). ``--empty`` writes a pack with no ops.

:func:`pack_names` derives every name a pack needs from its distribution name
and refuses names that would not work or would collide; :func:`render` gives
the files; :func:`new_pack` writes them to a temporary directory beside the
destination and renames it into place, so a refusal or a failure leaves
nothing behind. For a distribution ``opreg-mypack`` (or ``mypack``): the import
package is ``opreg_mypack``, the entry-point and target-profile name
``mypack``, and the custom ONNX domain ``mypack.ops`` (``--domain
com.example.mypack`` when the author owns a DNS name).
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from opreg.errors import OpregError

_DISTRIBUTION_RE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
"""A valid distribution name (PEP 508 ``identifier``)."""
_DOMAIN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
RESERVED_DOMAINS = ("ai.onnx", "com.microsoft", "pkg.onnxscript")
"""Domains (and their subdomains) that belong to ONNX, ONNX Runtime and onnxscript."""
RESERVED_PACK_NAMES = frozenset({"core", "onnx", "onnxruntime"})
"""Taken by opreg's core pack, its built-in profile and ONNX Runtime's profile."""
OPREG_DISTRIBUTIONS = frozenset({
    "opreg", "opreg-core-ops", "opreg-ort-contrib", "opreg-test-customop", "opreg-torchvision", "opreg-transformers",
    "opreg-timm",
    "opreg-diffusers",
})  # fmt: skip
"""opreg's own distribution names, its core pack's and its first-party packs' (canonical form)."""
OPREG_PACKAGES = frozenset(name.replace("-", "_") for name in OPREG_DISTRIBUTIONS)
"""The import packages of :data:`OPREG_DISTRIBUTIONS` (``opreg``, ``opreg_core_ops``, ...)."""
WELL_KNOWN_LIST = Path(__file__).with_name("well_known_names.txt")
"""The most-downloaded PyPI projects (see the file's header): names a new pack must never take,
installed here or not, because installing the pack (``pip install -e``) would replace the real one."""


class ScaffoldError(OpregError, ValueError):
    """``opreg new-pack`` was given a name, domain or directory it cannot use."""


def _check_distribution(name: str) -> None:
    if not _DISTRIBUTION_RE.match(name):
        raise ScaffoldError(
            f"{name!r} is not a valid distribution name: use letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit (e.g. opreg-mypack)"
        )


@dataclasses.dataclass(frozen=True)
class PackNames:
    """Every name of a new pack, derived from its distribution name.

    Fields:
        distribution: the distribution name, as given (``opreg-mypack``).
        pack: the entry-point name, also the target profile's (``mypack``).
        package: the import name (``opreg_mypack``).
        domain: the custom ONNX domain of the pack's ops (``mypack.ops``).
    """

    distribution: str
    pack: str
    package: str
    domain: str

    def __post_init__(self) -> None:
        _check_distribution(self.distribution)
        if keyword.iskeyword(self.pack):
            raise ScaffoldError(f"pack name {self.pack!r} is a Python keyword: choose another name")
        if not self.pack.isidentifier():
            raise ScaffoldError(
                f"distribution {self.distribution!r} gives pack name {self.pack!r}, which is not a Python identifier: "
                "start the name after 'opreg-' with a letter (e.g. opreg-mypack)"
            )
        if self.pack in RESERVED_PACK_NAMES:
            raise ScaffoldError(
                f"pack name {self.pack!r} is taken by opreg (core pack or built-in target profiles): choose another"
            )
        if not self.package.isidentifier() or keyword.iskeyword(self.package):
            raise ScaffoldError(f"import name {self.package!r} is not a Python identifier: choose another name")
        if not _DOMAIN_RE.match(self.domain):
            raise ScaffoldError(
                f"domain {self.domain!r} is not dotted identifiers: pass e.g. --domain com.example.{self.pack}"
            )
        for reserved in RESERVED_DOMAINS:
            if self.domain == reserved or self.domain.startswith(reserved + "."):
                raise ScaffoldError(
                    f"domain {self.domain!r} belongs to {reserved}, not to a new pack: "
                    f"pass your own, e.g. --domain com.example.{self.pack}"
                )


def pack_names(distribution: str, domain: str | None = None) -> PackNames:
    """Derive a pack's names from its distribution name (``opreg-mypack`` or ``mypack``).

    Raises :class:`ScaffoldError` with what to do when a name is unusable or taken:
    opreg's own names, an installed distribution, an importable top-level name, or
    one of the most-downloaded PyPI projects.
    """
    _check_distribution(distribution)
    normalized = re.sub(r"[-_.]+", "_", distribution).lower()
    pack = normalized.removeprefix("opreg_") if normalized != "opreg" else ""
    if not pack:
        raise ScaffoldError(f"{distribution!r} is opreg's own distribution: name the pack, e.g. opreg-mypack")
    names = PackNames(distribution, pack, f"opreg_{pack}", domain if domain is not None else f"{pack}.ops")
    _check_not_taken(names)
    return names


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def _check_not_taken(names: PackNames) -> None:
    """Refuse names the new pack would share with a package that exists: installing it would replace
    that one, or importing one would give the other."""
    import importlib.metadata
    import importlib.util

    distribution = _canonical(names.distribution)
    suggestion = _suggestion(distribution)
    if distribution in OPREG_DISTRIBUTIONS or names.package in OPREG_PACKAGES:
        taken = distribution if distribution in OPREG_DISTRIBUTIONS else names.package
        raise ScaffoldError(
            f"{names.distribution!r} would be {taken!r}, one of opreg's own packages: name the pack e.g. {suggestion}"
        )
    try:
        installed = importlib.metadata.distribution(distribution).version
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None:
        raise ScaffoldError(
            f"{names.distribution!r} is the name of a distribution installed here (version {installed}): installing "
            f"the new pack would replace it; name the pack e.g. {suggestion}"
        )
    if distribution in well_known_names():
        raise ScaffoldError(
            f"{names.distribution!r} is the name of a well-known PyPI project: installing the new pack would replace "
            f"it; name the pack e.g. {suggestion}"
        )
    try:
        spec = importlib.util.find_spec(names.package)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        where = spec.origin or ", ".join(spec.submodule_search_locations or ()) or "?"
        raise ScaffoldError(
            f"import name {names.package!r} of {names.distribution!r} is already importable here ({where}): "
            f"the new pack would shadow it or be shadowed; name the pack e.g. {suggestion}"
        )


@functools.cache
def well_known_names() -> frozenset[str]:
    """The canonical names of :data:`WELL_KNOWN_LIST`."""
    lines = WELL_KNOWN_LIST.read_text(encoding="utf-8").splitlines()
    return frozenset(_canonical(line) for line in lines if line.strip() and not line.startswith("#"))


def _suggestion(name: str) -> str:
    stem = re.sub(r"[^a-z0-9]+", "", name.lower())
    return "opreg-mypack" if not stem or stem.startswith("opreg") else f"opreg-{stem}"


# -- the files ---------------------------------------------------------------------------------


def render(names: PackNames, ops: Sequence[str] = ()) -> dict[str, str]:
    """The new pack's files, ``{relative path: text}``, for the ops whose schemas ``ops`` gives
    (``'ns::name(Tensor x, float beta) -> Tensor'``; none: a pack with no ops yet). Raises
    :class:`ScaffoldError` for a schema it cannot write a pack for."""
    from opreg.authoring import _opspec, _packfiles

    try:
        specs = _opspec.parse_all(tuple(ops))
    except _opspec.OpSpecError as e:
        raise ScaffoldError(str(e)) from e
    return _packfiles.render(names.distribution, names.pack, names.package, specs, names.domain)


def new_pack(
    distribution: str,
    *,
    ops: Sequence[str] = (),
    empty: bool = False,
    domain: str | None = None,
    directory: str | os.PathLike[str] | None = None,
) -> Path:
    """Write a new pack named ``distribution`` to ``directory`` (default ``./distribution``), for the
    torch ops whose schemas ``ops`` gives, or with no ops if ``empty``.

    The directory must not exist or be empty. Returns its path. Raises
    :class:`ScaffoldError` (and writes nothing) for an unusable name, domain,
    schema or directory, and when neither ``ops`` nor ``empty`` is given.
    """
    names = pack_names(distribution, domain)
    if isinstance(ops, str):
        ops = (ops,)
    if bool(ops) == bool(empty):
        raise ScaffoldError(
            "name the ops the pack translates, --op 'mylib::fused_swish(Tensor x, float beta) -> Tensor' "
            "(repeatable; ops=[...] in Python), or pass --empty for a pack with no ops yet"
            if not ops
            else "--op and --empty exclude each other: give the ops, or --empty"
        )
    destination = Path(directory if directory is not None else names.distribution)
    if destination.exists() and not destination.is_dir():
        raise ScaffoldError(f"{destination} exists and is not a directory: choose another with -o DIR")
    if destination.is_dir() and any(destination.iterdir()):
        raise ScaffoldError(f"{destination} is not empty: choose a new or empty directory with -o DIR")
    files = render(names, ops)
    destination = destination.absolute()
    if not destination.parent.is_dir():
        raise ScaffoldError(f"directory {destination.parent} does not exist: create it first, or choose -o DIR")
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    except OSError as e:
        reason = os.strerror(e.errno).lower() if e.errno else str(e)
        raise ScaffoldError(
            f"cannot write the pack to {destination}: cannot create files in {destination.parent} ({reason}); "
            "choose a writable location with -o DIR"
        ) from e
    try:
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        staging.chmod(0o777 & ~_umask())
        if destination.is_dir():
            destination.rmdir()  # empty, checked above
        staging.rename(destination)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise ScaffoldError(f"could not write the pack to {destination}: {e}; nothing was written") from e
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


def _umask() -> int:
    # mkdtemp creates 0o700; give the pack the permissions a plain mkdir would.
    mask = os.umask(0)
    os.umask(mask)
    return mask
