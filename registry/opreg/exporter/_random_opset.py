"""The ai.onnx version a model that draws random numbers is exported at, when the user left it to a
profile: one ONNX Runtime runs.

ONNX Runtime's CPU kernels for RandomNormal, RandomUniform, their ``Like`` forms, Bernoulli and
Multinomial are those ops' versions before ai.onnx 22 (microsoft/onnxruntime#32201; ONNX Runtime
matches a kernel registered open-ended to its op's since-version only, and opset 22 gave each a
new one), so a model that draws random numbers loads there only at ai.onnx 21 or lower. A target
profile (the default ``onnx``, ``onnxruntime``, a pack's) is a ceiling, not a pin: such a model is
planned at ai.onnx :data:`RANDOM_KERNELS_UP_TO` instead, unless an op has no impl there (then at
the profile's version, as before). A target that names its ai.onnx version (``18``, ``"onnx,25"``,
``{"": 23}``, an :class:`opreg.Target`) is kept as given: ``run()`` then says why ONNX Runtime
cannot load the model.

A fact about one runtime, kept here until targets can name runtime releases (issue 50): a test
holds :data:`RANDOM_KERNELS_UP_TO` to the installed ONNX Runtime's kernel table.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch

from opreg.errors import UnsupportedOpsError
from opreg.exporter import _plan
from opreg.exporter._nodes import draws_random, op_name
from opreg.registry.targets import ONNX_DOMAIN, Target, TargetLike

if TYPE_CHECKING:
    from opreg.registry.registry import Registry

logger = logging.getLogger(__name__)

RANDOM_KERNELS_UP_TO = 21
"""The newest ai.onnx version at which ONNX Runtime (1.32, CPU) has kernels for every random op."""


def pins_onnx(spec: TargetLike) -> bool:
    """Whether the target ``spec`` names its ai.onnx version (an int, a dict, or a string with a
    version or an ``ai.onnx=N`` item), rather than leaving it to a profile. A :class:`Target` is read
    by the spec it was built from (its ``name``: ``opreg export -t`` hands one over); one built from a
    dict, or by hand, names its version."""
    if isinstance(spec, Target):
        return spec.name is None or pins_onnx(spec.name)
    if not isinstance(spec, str):
        return True
    for item in (i.strip() for i in spec.split(",")):
        domain, equals, _ = item.partition("=")
        if item.isdigit() or (equals and domain.strip() in (ONNX_DOMAIN, "ai.onnx")):
            return True
    return False


def random_ops(program: torch.export.ExportedProgram) -> list[str]:
    """The torch ops of ``program`` (control-flow bodies included) that draw random numbers."""
    return sorted({str(op_name(n.target)) for n in _nodes_of(program) if draws_random(n)})


def _nodes_of(program: torch.export.ExportedProgram) -> Iterator[torch.fx.Node]:
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            yield from (n for n in module.graph.nodes if n.op == "call_function")


def prepare(
    program: torch.export.ExportedProgram, registry: Registry, target: Target, spec: TargetLike
) -> tuple[torch.export.ExportedProgram, _plan.Plan]:
    """:func:`opreg.exporter._plan.prepare` at the target ONNX Runtime runs the model's random ops at,
    when ``spec`` (the target as the user gave it) leaves ai.onnx to a profile; else at ``target``."""
    drawn = random_ops(program) if target.onnx > RANDOM_KERNELS_UP_TO and not pins_onnx(spec) else []
    if not drawn:
        return _plan.prepare(program, registry, target)
    lowered = _with_onnx(target, RANDOM_KERNELS_UP_TO)
    try:
        prepared, chosen = _plan.prepare(program, registry, lowered), lowered
    except UnsupportedOpsError as e:  # an op with no impl at the lower version: the profile's, as before
        prepared, chosen, why = _plan.prepare(program, registry, target), target, f"as at {RANDOM_KERNELS_UP_TO}: {e}"
    else:
        why = f"not {target}'s {target.onnx} (name the version to keep it: target={target.onnx})"
    logger.info(
        "the model draws random numbers (%s), which ONNX Runtime runs up to ai.onnx %d: exported at ai.onnx %d, %s",
        ", ".join(drawn),
        RANDOM_KERNELS_UP_TO,
        chosen.onnx,
        why,
    )
    return prepared


def _with_onnx(target: Target, version: int) -> Target:
    versions: Mapping[str, int] = {**dict(target.versions), ONNX_DOMAIN: version}
    name = f"{target.name or target},ai.onnx={version}"
    return dataclasses.replace(target, versions=tuple(sorted(versions.items())), name=name)
