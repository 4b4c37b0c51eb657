"""``opreg new-pack``: write a complete, installable op pack to start from.

:func:`pack_names` derives every name a pack needs from its distribution name
and refuses names that would not work; :func:`new_pack` renders the files in
memory, writes them to a temporary directory beside the destination and
renames it into place, so a refusal or a failure leaves nothing behind.

For a distribution ``opreg-mypack`` (or ``mypack``):

- pack (entry-point and target-profile) name ``mypack``;
- import name ``opreg_mypack``, also the torch library namespace of the
  example custom op (``opreg_mypack::scaled_add``): a module name is unique
  in an environment, and so is a torch namespace that copies it;
- custom ONNX domain ``mypack.ops`` (``--domain com.example.mypack`` when the
  author owns a DNS name): the entry-point name it derives from is unique
  among installed packs.
"""

from __future__ import annotations

import dataclasses
import keyword
import os
import re
import shutil
import tempfile
from pathlib import Path

from opreg import _scaffold_templates as templates
from opreg.errors import OpregError

_DISTRIBUTION_RE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
"""A valid distribution name (PEP 508 ``identifier``)."""
_DOMAIN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
RESERVED_DOMAINS = ("ai.onnx", "com.microsoft", "pkg.onnxscript")
"""Domains (and their subdomains) that belong to ONNX, ONNX Runtime and onnxscript."""
RESERVED_PACK_NAMES = frozenset({"core", "onnx", "onnxruntime"})
"""Taken by opreg's core pack, its built-in profile and ONNX Runtime's profile."""
WELL_KNOWN_DISTRIBUTIONS = frozenset({
    "torch", "torchvision", "torchaudio", "onnx", "onnxruntime", "onnxruntime-gpu", "onnxscript", "onnx-ir",
    "numpy", "protobuf", "transformers", "pluggy", "pip", "setuptools", "wheel", "opreg", "opreg-ort-contrib",
    "opreg-test-customop",
})  # fmt: skip
"""Distribution names a new pack must never take, installed here or not: installing the pack
(``pip install -e``) would replace the real one."""


class ScaffoldError(OpregError, ValueError):
    """``opreg new-pack`` was given a name, domain or directory it cannot use."""


@dataclasses.dataclass(frozen=True)
class PackNames:
    """Every name of a new pack, derived from its distribution name.

    Fields:
        distribution: the distribution name, as given (``opreg-mypack``).
        pack: the entry-point name, also the target profile's (``mypack``).
        package: the import name (``opreg_mypack``).
        namespace: the torch library namespace of the example custom op.
        domain: the custom ONNX domain of the pack's ops (``mypack.ops``).
    """

    distribution: str
    pack: str
    package: str
    namespace: str
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

    def substitutions(self) -> dict[str, str]:
        title = self.pack.replace("_", " ")
        return {**dataclasses.asdict(self), "title": title}


def pack_names(distribution: str, domain: str | None = None) -> PackNames:
    """Derive a pack's names from its distribution name (``opreg-mypack`` or ``mypack``).

    Raises :class:`ScaffoldError` with what to do when a name is unusable.
    """
    _check_distribution(distribution)
    _check_not_taken(distribution)
    normalized = re.sub(r"[-_.]+", "_", distribution).lower()
    pack = normalized.removeprefix("opreg_") if normalized != "opreg" else ""
    if not pack:
        raise ScaffoldError(f"{distribution!r} is opreg's own distribution: name the pack, e.g. opreg-mypack")
    package = f"opreg_{pack}"
    return PackNames(distribution, pack, package, package, domain if domain is not None else f"{pack}.ops")


def _check_not_taken(distribution: str) -> None:
    """Refuse the name of an installed or well-known distribution: the new pack would replace it."""
    import importlib.metadata

    from packaging.utils import canonicalize_name

    name = canonicalize_name(distribution)
    if name == "opreg":
        return  # named below: opreg's own distribution
    try:
        installed = importlib.metadata.distribution(name).version
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None or name in WELL_KNOWN_DISTRIBUTIONS:
        where = f"installed here (version {installed})" if installed else "a well-known package"
        raise ScaffoldError(
            f"{distribution!r} is the name of a distribution {where}: installing the new pack under it would "
            f"replace that one; name the pack e.g. {_suggestion(name)}"
        )


def _suggestion(name: str) -> str:
    stem = re.sub(r"[^a-z0-9]+", "", name)
    return "opreg-mypack" if not stem or stem.startswith("opreg") else f"opreg-{stem}"


def _check_distribution(name: str) -> None:
    if not _DISTRIBUTION_RE.match(name):
        raise ScaffoldError(
            f"{name!r} is not a valid distribution name: use letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit (e.g. opreg-mypack)"
        )


def render(names: PackNames) -> dict[str, str]:
    """The pack's files, ``{relative path: text}``."""
    values = names.substitutions()
    files = {
        "pyproject.toml": templates.PYPROJECT,
        "README.md": templates.README,
        f"{names.package}/__init__.py": templates.INIT,
        f"{names.package}/torch_ops.py": templates.TORCH_OPS,
        f"{names.package}/impls.py": templates.IMPLS,
        f"{names.package}/runtime.py": templates.RUNTIME,
        f"tests/test_{names.pack}.py": templates.TESTS,
    }
    return {path: _fill(text, values) for path, text in files.items()}


def _fill(template: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        return values[match.group(1)]

    return re.sub(r"\{\{(\w+)\}\}", one, template).lstrip("\n")


def new_pack(distribution: str, *, domain: str | None = None, directory: str | os.PathLike[str] | None = None) -> Path:
    """Write a new pack named ``distribution`` to ``directory`` (default ``./distribution``).

    The directory must not exist or be empty. Returns its path. Raises
    :class:`ScaffoldError` (and writes nothing) for an unusable name, domain or
    directory.
    """
    names = pack_names(distribution, domain)
    destination = Path(directory if directory is not None else names.distribution)
    if destination.exists() and not destination.is_dir():
        raise ScaffoldError(f"{destination} exists and is not a directory: choose another with -o DIR")
    if destination.is_dir() and any(destination.iterdir()):
        raise ScaffoldError(f"{destination} is not empty: choose a new or empty directory with -o DIR")
    files = render(names)
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
