"""Each hook's contract: when opreg calls it, and how its result is checked.

A spec in :mod:`opreg.packs.hookspecs` carries its contract on its ``def``, as an impl carries
``@opreg.impl``: ``@contract(when=EXPORT, check=check_rewrite_rules)``. ``when`` is a phrase
the spec's docstring says after "Called" (``tests/test_hooks.py`` holds them together);
``check(result) -> Checked`` normalizes a result, leaving out the items it cannot use
(:attr:`Checked.problems`) and raising :class:`Broken` for a result it cannot use at all.

Every hook result goes through its contract wherever it is called: by the loader (registration
hooks), the exporter (session, verification, export hooks) and the conformance kit (all of them),
through one per-pack caller (:func:`opreg.packs.packset.call_one`), so one mistake reads the same
everywhere (:class:`opreg.pluginapi.HookError`). This module imports only the standard library,
:mod:`opreg.pluginapi` and :mod:`opreg.loaderapi` (onnx, onnxscript, onnx_ir inside the checks that need them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opreg.loaderapi import CheckpointLoader
from opreg.pluginapi import CapturePatch, HookError, ModelSample, Sample

F = TypeVar("F", bound=Callable[..., Any])

CONTRACT_ATTRIBUTE = "opreg_contract"
"""The attribute :func:`contract` sets on a spec: its :class:`Contract`."""

REGISTRY_BUILD = "once per registry build"
SESSION = "each time opreg creates an ONNX Runtime session"
REFERENCE = "when a model is run or verified with onnx.reference"
EMBED = "when a model is exported with embed_functions=True"
EXPORT = "once per export (unless opreg.export(..., rewrite=False)), after translation and inlining"
KIT = "only by the conformance kit, never on export"
CAPTURE = "once per export of a torch.nn.Module, before the capture (unless patches=False)"
CHECKPOINT = "once per export of a checkpoint (opreg export FOLDER, opreg.export_checkpoint), before anything is built"


@dataclasses.dataclass(frozen=True)
class Checked:
    """A hook result after its contract's check: the normalized ``value`` and the ``problems`` of
    the items left out of it (a wrong item costs only itself; a wrong result as a whole is a
    :class:`~opreg.pluginapi.HookError`)."""

    value: Any
    problems: tuple[str, ...] = ()


class Broken(Exception):
    """Raised by a contract's check when a result cannot be used at all; the caller turns it into a
    :class:`~opreg.pluginapi.HookError` naming the pack and the hook."""


@dataclasses.dataclass(frozen=True)
class Contract:
    """One hook's contract.

    Fields:
        hook: the hook's name (a spec of this module).
        when: when opreg calls it.
        check: ``check(result) -> Checked``; raises :class:`Broken` for a result it cannot use.
    """

    hook: str
    when: str
    check: Callable[[Any], Checked]

    def apply(self, pack: str, result: Any) -> Checked:
        """``check(result)``, its :class:`Broken` as a :class:`~opreg.pluginapi.HookError` of ``pack``."""
        try:
            return self.check(result)
        except Broken as e:
            raise HookError(pack, self.hook, str(e)) from None


def contract(*, when: str, check: Callable[[Any], Checked]) -> Callable[[F], F]:
    """Put a hook's :class:`Contract` on its spec (the spec's name is the hook's); the function is
    returned unchanged, pluggy reads it as before."""

    def mark(spec: F) -> F:
        setattr(spec, CONTRACT_ATTRIBUTE, Contract(spec.__name__, when, check))
        return spec

    return mark


def contracts(specs: Any) -> dict[str, Contract]:
    """``{hook: Contract}`` of every spec of ``specs`` (a module or class) that carries one."""
    found = {}
    for value in vars(specs).values():
        carried = getattr(value, CONTRACT_ATTRIBUTE, None)
        if isinstance(carried, Contract):
            found[carried.hook] = carried
    return found


def _type(value: Any) -> str:
    return type(value).__name__


def _items(result: Any, what: str) -> list[Any]:
    if result is None:
        return []
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, (list, tuple)):
        raise Broken(f"must return a list of {what}, got {_type(result)}")
    return list(result)


def returns_nothing(result: Any) -> Checked:
    if result is not None:
        raise Broken(f"must return None (it works through what it is given), got {_type(result)}")
    return Checked(None)


def check_targets(result: Any) -> Checked:
    if result is None:
        return Checked({})
    if not isinstance(result, Mapping):
        raise Broken(f"must return a dict {{profile: {{domain: version}}}}, got {_type(result)}")
    profiles: dict[str, dict[str, int]] = {}
    problems = []
    for profile, versions in result.items():
        if not isinstance(profile, str) or not profile.isidentifier():
            problems.append(f"profile name must be an identifier string, got {profile!r}")
            continue
        if not isinstance(versions, Mapping):
            problems.append(f"profile {profile!r} must map domain -> version, got {_type(versions)}")
            continue
        bad = [
            f"profile {profile!r}: version of {domain!r} must be an int >= 1, got {version!r}"
            if isinstance(domain, str)
            else f"profile {profile!r}: domain must be a string, got {domain!r}"
            for domain, version in versions.items()
            if not isinstance(domain, str) or isinstance(version, bool) or not isinstance(version, int) or version < 1
        ]
        if bad:
            problems += bad
            continue
        profiles[profile] = dict(versions)
    return Checked(profiles, tuple(problems))


def check_reference_kernels(result: Any) -> Checked:
    from onnx.reference.op_run import OpRun

    kernels, problems = [], []
    for kernel in _items(result, "onnx.reference OpRun subclasses"):
        if not (isinstance(kernel, type) and issubclass(kernel, OpRun)):
            problems.append(f"{kernel!r} is not an onnx.reference.op_run.OpRun subclass")
        elif not isinstance(getattr(kernel, "op_domain", None), str) or not kernel.op_domain:
            problems.append(f"{kernel.__name__} sets no op_domain (the custom domain of the op it runs)")
        else:
            kernels.append(kernel)
    return Checked(kernels, tuple(problems))


def check_schemas(result: Any) -> Checked:
    import onnx.defs

    items = _items(result, "onnx.defs.OpSchema objects")
    schemas = [s for s in items if isinstance(s, onnx.defs.OpSchema)]
    return Checked(schemas, tuple(f"{s!r} is not an onnx.defs.OpSchema" for s in items if s not in schemas))


def check_functions(result: Any) -> Checked:
    import onnx
    import onnxscript

    functions, problems = [], []
    for item in _items(result, "onnx.FunctionProto or @onnxscript.script functions"):
        if isinstance(item, onnxscript.OnnxFunction):
            try:
                proto = item.to_function_proto()
            except Exception as e:
                problems.append(f"{item.name}: cannot be turned into a FunctionProto: {type(e).__name__}: {e}")
                continue
        elif isinstance(item, onnx.FunctionProto):
            proto = item
        else:
            problems.append(f"{item!r} is neither an onnx.FunctionProto nor an @onnxscript.script function")
            continue
        if not proto.domain:
            problems.append(f"function {proto.name} has no domain (it must be the custom op's domain)")
        else:
            functions.append(proto)
    return Checked(functions, tuple(problems))


def _check_keyed(result: Any, key: Callable[[Any], Any], kind: type, what: str, example: str) -> Checked:
    if result is None:
        return Checked({})
    if not isinstance(result, Mapping):
        raise Broken(f"must return a dict {{{what}: [{kind.__name__}, ...]}}, got {_type(result)}")
    found: dict[Any, list[Any]] = {}
    problems = []
    for raw, samples in result.items():
        try:
            name = key(raw)
        except Exception as e:
            problems.append(f"key {raw!r}: {e}")
            continue
        if isinstance(samples, (str, bytes, Mapping)) or not isinstance(samples, (list, tuple)):
            problems.append(f"{name}: must be a list of opreg.testing.{kind.__name__}, got {_type(samples)}")
        elif not samples:
            problems.append(f"{name}: the list of samples is empty")
        elif bad := [s for s in samples if not isinstance(s, kind)]:
            problems.append(f"{name}: {bad[0]!r} is not an opreg.testing.{kind.__name__} (build one with {example})")
        else:
            found.setdefault(name, []).extend(samples)
    return Checked(found, tuple(problems))


def _rule_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("it is not a rule name")
    return name


def check_samples(result: Any) -> Checked:
    from opreg.registry.opname import OpName

    return _check_keyed(result, OpName.of, Sample, "torch_op", "Sample.of(*args)")


def check_rewrite_samples(result: Any) -> Checked:
    return _check_keyed(result, _rule_name, ModelSample, "rule_name", "ModelSample.of(module, *args)")


def _check_named(result: Any, kind: type, what: str) -> Checked:
    """A list of ``kind`` values whose ``name`` is unique in the pack (``what``: how the message calls them)."""
    values, problems, names = [], [], set()
    for item in _items(result, f"opreg.{kind.__name__}"):
        if not isinstance(item, kind):
            problems.append(f"{item!r} is not an opreg.{kind.__name__}")
        elif item.name in names:
            problems.append(f"two {what} are named {item.name!r}: names must be unique in a pack")
        else:
            names.add(item.name)
            values.append(item)
    return Checked(values, tuple(problems))


def check_capture_patches(result: Any) -> Checked:
    return _check_named(result, CapturePatch, "patches")


def check_checkpoint_loaders(result: Any) -> Checked:
    return _check_named(result, CheckpointLoader, "checkpoint loaders")


def check_capture_samples(result: Any) -> Checked:
    return _check_keyed(result, _patch_name, ModelSample, "patch_name", "ModelSample.of(module, *args)")


def _patch_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("it is not a patch name")
    return name


def check_rewrite_rules(result: Any) -> Checked:
    try:
        return Checked(rewrites_of(result))
    except ValueError as e:
        raise Broken(str(e)) from None


def rewrites_of(result: Any) -> list[tuple[Any, tuple[str, ...]]]:
    """``(item, names)`` of each rewrite in what ``opreg_rewrite_rules`` returned: a rule's name, the
    names of a rule set's rules, a pass's class name. ``ValueError`` naming the first problem (a
    wrong type, a rule without a name, a name used twice)."""
    if result is None:
        return []
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, (list, tuple)):
        raise ValueError(f"must return a list of rewrite rules, rule sets and passes, got {_type(result)}")
    from onnx_ir.passes import PassBase
    from onnxscript.rewriter import pattern

    rewrites = []
    seen: set[str] = set()
    for item in result:
        if isinstance(item, pattern.RewriteRule):
            names: tuple[Any, ...] = (item.name,)
        elif isinstance(item, pattern.RewriteRuleSet):
            names = tuple(rule.name for rule in item.rules)
        elif isinstance(item, PassBase):
            names = (type(item).__name__,)
        else:
            raise ValueError(
                f"returned {item!r}, which is neither an onnxscript RewriteRule or RewriteRuleSet nor an "
                "onnx_ir.passes.PassBase"
            )
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError(
                f"returned a rule without a name ({item!r}): give each rule one, e.g. RewriteRule(pattern, "
                "replacement, check, name='MyFusion'); opreg records it on the nodes"
            )
        twice = sorted(seen.intersection(names)) or sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"returned two rewrites named {twice[0]!r}: names must be unique")
        seen.update(names)
        rewrites.append((item, names))
    return rewrites
