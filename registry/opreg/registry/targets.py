"""Targets: the opset version per domain an exported model must run on.

A :class:`Target` maps ONNX domains to versions, ``""`` being ai.onnx:
``Target({"": 18})``, ``Target({"": 20, "com.microsoft": 1})``. Named
profiles are sugar for such maps; ``onnx`` is built in and packs contribute
more through the ``opreg_targets`` hook.

An impl states what it needs as an :class:`OpsetRequirement`; a target meets
it when its ai.onnx version lies in the impl's range and it offers every
custom domain the impl emits at a version in that domain's range.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from opreg.errors import InvalidTargetError
from opreg.registry import runtimes
from opreg.registry.runtimes import RUNTIME, Release

ONNX_DOMAIN = ""
"""The ai.onnx domain, spelled as ONNX spells it in ``opset_import``."""

MIN_ONNX_OPSET = 18
"""The oldest ai.onnx version a target may have: the core pack's impls start there (the
opset of torch.onnx's dynamo exporter, and ONNX Runtime's oldest supported ones)."""

LOWEST_TARGET_OPSET = 16
"""The oldest ai.onnx version a target may name (``target=16``, torch.onnx's ``opset_version=17``):
below :data:`MIN_ONNX_OPSET` a model takes the impls that reach it (:mod:`opreg.registry.reach`)."""

DEFAULT_ONNX_OPSET = 23
"""ai.onnx version of the built-in ``onnx`` profile.

The newest opset with a top-level ``onnxscript.opsetNN`` module, and one that
every onnxruntime opreg supports (1.30+) loads. Targets up to
:func:`onnx_opset_range`'s maximum are accepted; this is only the default.
"""

BUILTIN_PROFILES: Mapping[str, Mapping[str, int]] = {"onnx": {ONNX_DOMAIN: DEFAULT_ONNX_OPSET}}

_DOMAIN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*$")


def normalize_domain(domain: str) -> str:
    """Return ``domain`` with ``ai.onnx`` spelled ``""``; reject malformed names."""
    if not isinstance(domain, str):
        raise InvalidTargetError(f"domain must be a string, got {domain!r}")
    if domain in ("", "ai.onnx"):
        return ONNX_DOMAIN
    if not _DOMAIN_RE.match(domain):
        raise InvalidTargetError(
            f"{domain!r} is not a valid ONNX domain name: use dotted identifiers "
            "such as 'com.microsoft' or 'test.customop'"
        )
    return domain


def domain_label(domain: str) -> str:
    """How a domain is shown to people: ``ai.onnx`` for ``""``."""
    return domain or "ai.onnx"


def onnx_opset_range() -> tuple[int, int]:
    """The ai.onnx versions a target may have: :data:`MIN_ONNX_OPSET` up to what opreg
    can build with the installed onnx and onnxscript.

    The maximum is the lower of onnx's newest opset and the newest
    ``onnxscript.onnx_opset.opsetNN`` module: impls are written with those
    modules, so an opset onnxscript has no module for has no impl written
    (or tested) against its schemas. Read once per process (importing onnx
    and onnxscript), unless :func:`assume_onnx_opset_range` gave it.
    """
    if not _opset_range:
        _opset_range.append(_read_onnx_opset_range())
    return _opset_range[0]


_opset_range: list[tuple[int, int]] = []
"""This process's :func:`onnx_opset_range`, once known: a fact of the installed onnx and onnxscript."""


def _read_onnx_opset_range() -> tuple[int, int]:
    import onnx.defs

    return MIN_ONNX_OPSET, min(max(_onnxscript_opsets()), onnx.defs.onnx_opset_version())


def assume_onnx_opset_range(value: tuple[int, int]) -> None:
    """Take ``value`` as :func:`onnx_opset_range` in this process without importing onnx and
    onnxscript: the range an earlier process read with the same onnx and onnxscript installed
    (:mod:`opreg.packs.packcache` keeps it with what the packs declare, keyed on the installed
    distributions). Ignored once the range is known."""
    if not _opset_range:
        low, high = value
        _opset_range.append((int(low), int(high)))


@functools.cache
def _onnxscript_opsets() -> tuple[int, ...]:
    import onnxscript.onnx_opset

    return tuple(
        sorted(int(m.group(1)) for name in dir(onnxscript.onnx_opset) if (m := re.fullmatch(r"opset(\d+)", name)))
    )


CACHE_ENV = "OPREG_CACHE_DIR"
"""opreg's per-user cache folder, when set: what it found out about the installed runtime, and
what the packs declare (:mod:`opreg.packs.packcache`). Default: :func:`user_cache_dir`."""


def user_cache_dir() -> Path:
    """opreg's folder in the user cache directory of this platform."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
        return Path(base, "opreg", "Cache")
    if sys.platform == "darwin":
        return Path(os.path.expanduser("~"), "Library", "Caches", "opreg")
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not os.path.isabs(base):  # the XDG spec: a relative path is to be ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "opreg")


def cache_dir() -> Path:
    """opreg's per-user cache folder: ``$OPREG_CACHE_DIR`` if set, else :func:`user_cache_dir`."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return Path(value).expanduser() if value else user_cache_dir()


_RUNTIME_CACHE = "onnxruntime-opset.json"


def _runtime_fingerprint() -> str | None:
    """What the probe's answer depends on, without importing onnxruntime: where its package
    is and when it was installed, and onnx's version (``None`` if either is missing)."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        return None
    try:
        installed = os.stat(spec.origin).st_mtime_ns
        onnx_version = importlib.metadata.version("onnx")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    return f"{spec.origin}@{installed};onnx={onnx_version}"


@functools.cache
def newest_onnxruntime_opset() -> int:
    """The newest ai.onnx opset the installed onnxruntime loads, found by trying
    every opset the installed onnx defines, newest first.

    The answer is kept in opreg's per-user cache (:func:`cache_dir`), keyed on the
    onnxruntime package's location and install time and on onnx's version, so a
    process that only exports does not import onnxruntime for it; a new install
    of either is probed again. It may exceed what opreg can build
    (:func:`onnx_opset_range`); the newest target opreg supports is
    :func:`newest_supported_opset`.
    """
    fingerprint = _runtime_fingerprint()
    path = cache_dir() / _RUNTIME_CACHE
    known: dict[str, int] = {}
    if fingerprint is not None:
        try:
            known = json.loads(path.read_text())
            cached = known.get(fingerprint)
            if isinstance(cached, int) and not isinstance(cached, bool):
                return cached
        except (OSError, ValueError, AttributeError):
            known = {}
    version = _probe_onnxruntime_opset()
    if fingerprint is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs the probe again
            path.parent.mkdir(parents=True, exist_ok=True)
            staged = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            staged.write_text(json.dumps({**known, fingerprint: version} if isinstance(known, dict) else {}))
            os.replace(staged, path)
    return version


def _probe_onnxruntime_opset() -> int:
    import onnx
    import onnx.defs
    import onnxruntime
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    ])  # fmt: skip
    low, high = onnx_opset_range()[0], onnx.defs.onnx_opset_version()
    for version in range(high, low - 1, -1):
        opsets = [helper.make_opsetid("", version)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=onnx.helper.find_min_ir_version_for(opsets))
        try:
            onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:
            continue
        return version
    raise RuntimeError(
        f"onnxruntime {onnxruntime.__version__} loads no opset from {low} to {high} (onnx {onnx.__version__})"
    )


def newest_supported_opset() -> int:
    """The newest ai.onnx target opreg supports: the lower of what it can build
    (:func:`onnx_opset_range`) and what the installed onnxruntime runs
    (:func:`newest_onnxruntime_opset`). The ``onnxruntime`` profile uses it."""
    return min(onnx_opset_range()[1], newest_onnxruntime_opset())


def _why_not_newer(version: int, high: int) -> str:
    """Why an opset onnx defines is still out of reach (onnxscript has no module for it)."""
    import onnx
    import onnx.defs
    import onnxscript

    if high < version <= onnx.defs.onnx_opset_version():
        return (
            f" (onnx {onnx.__version__} defines opset {version}, but onnxscript {onnxscript.__version__} has "
            f"opset modules up to {max(_onnxscript_opsets())}, and impls are written with them)"
        )
    return ""


def _check_version(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTargetError(f"{what} must be an integer version, got {value!r}")
    if value < 1:
        raise InvalidTargetError(f"{what} must be a version of at least 1, got {value}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class VersionRange:
    """An inclusive range of opset versions.

    Fields:
        min: lowest version accepted (at least 1).
        max: highest version accepted, or ``None`` for no upper bound.
    """

    min: int
    max: int | None = None

    def __post_init__(self) -> None:
        _check_version(self.min, "minimum version")
        if self.max is not None:
            _check_version(self.max, "maximum version")
            if self.max < self.min:
                raise InvalidTargetError(
                    f"version range {self.min}..{self.max} is empty: the maximum must be at least the minimum"
                )

    @classmethod
    def of(cls, value: VersionRangeLike) -> VersionRange:
        """Build a range from ``18`` (18 and up), ``(18, 20)`` or a range."""
        if isinstance(value, VersionRange):
            return value
        if isinstance(value, tuple) and len(value) == 2:
            return cls(value[0], value[1])
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        raise InvalidTargetError(
            f"an opset requirement must be a version (18), a (min, max) tuple "
            f"((18, 20); max may be None) or a VersionRange, got {value!r}"
        )

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.min <= version and (self.max is None or version <= self.max)

    def __str__(self) -> str:
        if self.max is None:
            return f">={self.min}"
        if self.max == self.min:
            return f"=={self.min}"
        return f"{self.min}..{self.max}"


VersionRangeLike = int | tuple[int, int | None] | VersionRange


@dataclasses.dataclass(frozen=True, slots=True)
class OpsetRequirement:
    """What an impl needs from a target.

    Fields:
        onnx: the ai.onnx versions the impl is valid for.
        domains: ``(domain, range)`` pairs, sorted by domain, for every custom
            domain the impl emits.
    """

    onnx: VersionRange
    domains: tuple[tuple[str, VersionRange], ...] = ()

    def __post_init__(self) -> None:
        names = [d for d, _ in self.domains]
        if names != sorted(set(names)):
            raise InvalidTargetError(f"custom domains must be unique and sorted, got {names}")
        if ONNX_DOMAIN in names:
            raise InvalidTargetError("ai.onnx belongs in `onnx`, not among the custom domains")

    @classmethod
    def build(cls, onnx: VersionRangeLike, domains: Mapping[str, VersionRangeLike] | None = None) -> OpsetRequirement:
        items: dict[str, VersionRange] = {}
        for domain, value in (domains or {}).items():
            name = normalize_domain(domain)
            if name == ONNX_DOMAIN:
                raise InvalidTargetError("declare the ai.onnx requirement with opset=..., not in domains=")
            items[name] = VersionRange.of(value)
        return cls(VersionRange.of(onnx), tuple(sorted(items.items())))

    @property
    def domain_map(self) -> dict[str, VersionRange]:
        return dict(self.domains)

    def rank(self) -> tuple[int, int, int]:
        """Newer-is-larger key used to prefer the newest requirement."""
        return (self.onnx.min, len(self.domains), sum(r.min for _, r in self.domains))

    def __str__(self) -> str:
        parts = [f"ai.onnx{self.onnx}"]
        parts += [f"{d}{r}" for d, r in self.domains]
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """The opset version per domain an exported model must run on.

    Fields:
        versions: ``(domain, version)`` pairs sorted by domain; ``""`` is
            ai.onnx and is always present.
        name: the profile or spec it was built from, for display only (not
            part of equality or hashing).
        runtime: the ONNX Runtime release (``"1.22.1"``) whose CPU kernels every chosen impl's
            ops must have (:mod:`opreg.registry.runtimes`), or ``None``: ``onnxruntime==1.22``,
            ``onnx@onnxruntime==1.22``, and the ``onnxruntime`` profile (the installed release).
        pinned: whether the spec named the ai.onnx version (``18``, ``ai.onnx=25``, a dict), so the
            model imports exactly it; a profile alone is a ceiling, and the model imports the
            lowest version its nodes need (not part of equality or hashing).
        named_release: whether the spec named the release (``onnxruntime==1.32``) rather than the
            profile alone (``onnxruntime``, the installed release): a pack may then write what only
            that release and newer load (opreg-ort-contrib's ``query_seqlens``).

    Build one with :meth:`Target.of` (dicts, versions, profile names, specs).
    """

    versions: tuple[tuple[str, int], ...]
    name: str | None = dataclasses.field(default=None, compare=False)
    runtime: str | None = None
    pinned: bool = dataclasses.field(default=True, compare=False)
    named_release: bool = False

    def __post_init__(self) -> None:
        domains = [d for d, _ in self.versions]
        if domains != sorted(set(domains)):
            raise InvalidTargetError(f"target domains must be unique and sorted, got {domains}")
        mapping = dict(self.versions)
        if ONNX_DOMAIN not in mapping:
            raise InvalidTargetError(
                f"target {self._label()} has no ai.onnx version: add one, e.g. {{'': 18, 'com.microsoft': 1}}"
            )
        for domain, version in self.versions:
            _check_version(version, f"version of {domain_label(domain)!r} in target {self._label()}")
        low, high = LOWEST_TARGET_OPSET, onnx_opset_range()[1]
        wanted = mapping[ONNX_DOMAIN]
        if not low <= wanted <= high:
            raise InvalidTargetError(
                f"ai.onnx version {wanted} in target {self._label()} is outside what opreg supports with the "
                f"installed onnx and onnxscript: use a version from {low} to {high}{_why_not_newer(wanted, high)}"
            )

    def _label(self) -> str:
        return repr(self.name) if self.name else repr(dict(self.versions))

    @classmethod
    def of(
        cls,
        spec: TargetLike,
        profiles: Mapping[str, Mapping[str, int]] | None = None,
    ) -> Target:
        """Build a target from any of the accepted spellings.

        ``spec`` may be a :class:`Target`; a dict ``{domain: version}`` (``""``
        or ``"ai.onnx"`` for the standard domain); an int (the ai.onnx
        version); or a string of comma-separated items, each a profile name,
        an ai.onnx version, or ``domain=version`` (``"onnxruntime"``,
        ``"20"``, ``"onnx,com.microsoft=1"``). Later items override earlier
        ones. ``profiles`` maps profile names to version dicts (the built-in
        ``onnx`` profile is always known).
        """
        if isinstance(spec, Target):
            return spec
        known = {**BUILTIN_PROFILES, **(profiles or {})}
        if isinstance(spec, Mapping):
            return cls._from_items(spec.items(), None)
        if isinstance(spec, int) and not isinstance(spec, bool):
            return cls._from_items([(ONNX_DOMAIN, spec)], str(spec))
        if isinstance(spec, str):
            return cls._from_string(spec, known)
        raise InvalidTargetError(
            f"a target must be a profile name, a {{domain: version}} dict, an ai.onnx version "
            f"or a Target, got {type(spec).__name__} {spec!r}"
        )

    @classmethod
    def _from_string(cls, spec: str, known: Mapping[str, Mapping[str, int]]) -> Target:
        if not spec.strip():
            raise InvalidTargetError(f"the target is empty: write {_SPELLINGS}")
        items: dict[str, int] = {}
        explicit: dict[str, str] = {}  # domain -> the item that named it (a profile's domains may be overridden)
        runtime: Release | None = None
        named = False
        for raw in spec.split(","):
            item = raw.strip()
            if not item:
                raise InvalidTargetError(f"target {spec!r} has an empty item: write {_SPELLINGS}")
            if "==" in item or item == RUNTIME:
                profile, runtime = _runtime_item(item, spec, known)
                named = item != RUNTIME
                items.update({normalize_domain(d): v for d, v in known[profile].items()})
                continue
            if "=" in item:
                domain, _, version = item.partition("=")
                if not version.strip().isdigit():
                    raise InvalidTargetError(f"in target {spec!r}, {item!r} needs an integer version (domain=version)")
                name, value = normalize_domain(domain.strip()), int(version)
            elif item.isdigit():
                name, value = ONNX_DOMAIN, int(item)
            elif item.startswith("-") and item[1:].isdigit():
                _check_version(int(item), f"ai.onnx version in target {spec!r}")
                continue
            elif item in known:
                items.update({normalize_domain(d): v for d, v in known[item].items()})
                continue
            else:
                raise InvalidTargetError(
                    f"unknown target profile {item!r}: known profiles are "
                    f"{', '.join(sorted(known))}; or give versions, e.g. 'ai.onnx=20,com.microsoft=1'"
                )
            if name in explicit:
                raise InvalidTargetError(
                    f"target {spec!r} gives {domain_label(name)} twice ({explicit[name]!r} and {item!r}): "
                    "give each domain once"
                )
            explicit[name] = item
            items[name] = value
        if ONNX_DOMAIN not in items:
            raise InvalidTargetError(
                f"target {spec!r} has no ai.onnx version: add a profile or a version, e.g. 'onnx,{spec}' or '18,{spec}'"
            )
        if runtime is not None:
            if ONNX_DOMAIN in explicit and items[ONNX_DOMAIN] > runtime.max_opset:
                raise InvalidTargetError(
                    f"in target {spec!r}, {explicit[ONNX_DOMAIN]!r} is newer than {runtime.label} loads "
                    f"(ai.onnx up to {runtime.max_opset}): name {runtime.max_opset} or lower, or a newer release"
                )
            items[ONNX_DOMAIN] = min(items[ONNX_DOMAIN], runtime.max_opset)
        target = cls._from_items(items.items(), spec)
        version = runtime.version if runtime else None
        return dataclasses.replace(target, runtime=version, pinned=ONNX_DOMAIN in explicit, named_release=named)

    @classmethod
    def _from_items(cls, items, name: str | None) -> Target:
        versions: dict[str, int] = {}
        for domain, version in items:
            versions[normalize_domain(domain)] = version
        return cls(tuple(sorted(versions.items())), name)

    @property
    def onnx(self) -> int:
        """The ai.onnx version."""
        return dict(self.versions)[ONNX_DOMAIN]

    def get(self, domain: str) -> int | None:
        """The version of ``domain`` in this target, or ``None``."""
        for d, v in self.versions:
            if d == domain:
                return v
        return None

    def unmet(self, requirement: OpsetRequirement) -> str | None:
        """Why this target does not meet ``requirement``, or ``None`` if it does."""
        if self.onnx not in requirement.onnx:
            return f"needs ai.onnx{requirement.onnx}, target has {self.onnx}"
        for domain, wanted in requirement.domains:
            have = self.get(domain)
            if have is None:
                return f"needs {domain}{wanted}, target has no {domain}"
            if have not in wanted:
                return f"needs {domain}{wanted}, target has {domain}=={have}"
        return None

    def as_dict(self) -> dict[str, int]:
        return dict(self.versions)

    @property
    def spec(self) -> str:
        """How to write this target for ``-t`` or ``target=``: the spelling it was built from, else
        its versions (``ai.onnx=23,com.microsoft=1``)."""
        return self.name if self.name else ",".join(f"{domain_label(d)}={v}" for d, v in self.versions)

    def extended(self, versions: Mapping[str, int]) -> Target:
        """This target with more custom domains (``{"mypack.ops": 1}``), spelled ``SPEC,mypack.ops=1``.
        A domain it already names is an :class:`InvalidTargetError`."""
        named = sorted(domain_label(d) for d in versions if self.get(normalize_domain(d)) is not None)
        if named:
            raise InvalidTargetError(f"target {self} already names {', '.join(named)}")
        extra = ",".join(f"{domain_label(normalize_domain(d))}={v}" for d, v in sorted(versions.items()))
        items = [*self.versions, *((normalize_domain(d), v) for d, v in versions.items())]
        grown = Target._from_items(items, f"{self.name},{extra}" if self.name and extra else self.name)
        return dataclasses.replace(grown, runtime=self.runtime, pinned=self.pinned, named_release=self.named_release)

    def with_onnx(self, version: int) -> Target:
        """This target with ai.onnx at ``version``, pinned there."""
        versions = {**dict(self.versions), ONNX_DOMAIN: version}
        return dataclasses.replace(self, versions=tuple(sorted(versions.items())), pinned=True)

    def __str__(self) -> str:
        body = ",".join(f"{domain_label(d)}={v}" for d, v in self.versions)
        if self.runtime is not None:
            body += f"; {RUNTIME} {self.runtime}'s kernels"
        return f"{self.name} ({body})" if self.name and not self.name[0].isdigit() else body


def _runtime_item(item: str, spec: str, known: Mapping[str, Mapping[str, int]]) -> tuple[str, Release]:
    """``(profile, release)`` of a runtime item: ``onnxruntime`` (the profile, at the installed
    release), ``onnxruntime==1.22`` (the ``onnxruntime`` profile, else ``onnx``, at 1.22) or
    ``PROFILE@onnxruntime==1.22``."""
    profile, at, runtime = item.rpartition("@")
    name, equals, version = runtime.partition("==")
    if name.strip() != RUNTIME or (equals and not version.strip()) or (at and not profile.strip()):
        raise InvalidTargetError(
            f"in target {spec!r}, {item!r} is not a runtime release: write {RUNTIME}==1.22 or onnx@{RUNTIME}==1.22"
        )
    profile = profile.strip() or (RUNTIME if RUNTIME in known else "onnx")
    if profile not in known:
        raise InvalidTargetError(
            f"in target {spec!r}, unknown target profile {profile!r}: known profiles are {', '.join(sorted(known))}"
        )
    if equals:
        return profile, runtimes.release(version.strip(), newest_onnxruntime_opset)
    return profile, runtimes.installed_release(newest_onnxruntime_opset)


TargetLike = Target | Mapping[str, int] | int | str

_SPELLINGS = (
    "a profile name (onnx, onnxruntime, ...), an ONNX Runtime release (onnxruntime==1.22, onnx@onnxruntime==1.22), "
    "an ai.onnx version (18), or domain=version items (onnx,com.microsoft=1)"
)
