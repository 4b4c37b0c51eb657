"""The opset a model needs, not the newest: each domain imported at the lowest version at which every
node keeps the meaning it was emitted with (:class:`LowestOpsets`), and which ops set that floor.

Impls are chosen for the target (the best there); the model then imports, per domain with ONNX
schemas (ai.onnx, ai.onnx.ml), the largest since-version of its nodes' ops at the versions they were
emitted against (:func:`opreg.registry.versions.floor`): a node emitted with ``op18.Add`` needs
ai.onnx 14, ``op23.Attention`` needs 23. A node whose emitter is not known (a pass or rewrite rule
made it) counts as emitted at the model's version. The impls' own minimum holds too (opreg's oldest
target, :func:`opreg.registry.targets.onnx_opset_range`). A target that names its ai.onnx version
(``-t 25``) is kept as given: the pass is not run.

A target that names an ONNX Runtime release (``onnxruntime==1.22``, the ``onnxruntime`` profile)
then has the finished model checked against that release's CPU kernels (:class:`RuntimeKernels`).
"""

from __future__ import annotations

import json
import logging

import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from opreg.errors import OpsetConflictError
from opreg.exporter.passes.pipeline import all_graphs, all_nodes
from opreg.registry.runtimes import KERNEL_DOMAINS, Release, lacks
from opreg.registry.targets import ONNX_DOMAIN, RUNTIME, domain_label
from opreg.registry.versions import FLOOR_KEY, Floor, floor, since

logger = logging.getLogger(__name__)

SCHEMA_DOMAINS = (ONNX_DOMAIN, "ai.onnx.ml")
"""The domains whose ops have ONNX schemas to judge: a custom domain keeps its target's version."""


class LowestOpsets(InPlacePass):
    """Import each of :data:`SCHEMA_DOMAINS` at the lowest version its nodes need (at least ``low``
    for ai.onnx), recorded in the model's metadata (:data:`FLOOR_KEY`) and in :attr:`floors`."""

    def __init__(self, low: int) -> None:
        super().__init__()
        self.low = low
        self.floors: dict[str, Floor] = {}

    def call(self, model: ir.Model) -> PassResult:
        modified = False
        for domain in SCHEMA_DOMAINS:
            current = model.opset_imports.get(domain)
            if current is None:
                continue
            nodes = [
                (n.op_type, n.version or current, _types(n.inputs), _types(n.outputs))
                for n in all_nodes(model)
                if _domain(n) == domain
            ]
            found = floor(domain, nodes, self.low if domain == ONNX_DOMAIN else 1, current)
            if found.unknown or found.version >= current:
                continue
            for owner in all_graphs(model):  # the main graph and the kept functions
                if domain in owner.opset_imports:
                    owner.opset_imports[domain] = found.version
            self.floors[domain] = found
            modified = True
            logger.info("%s imported at %d: %s", domain_label(domain), found.version, describe(found))
        if self.floors:
            model.metadata_props[FLOOR_KEY] = json.dumps(
                {domain_label(d): {"version": f.version, "set_by": list(f.set_by)} for d, f in self.floors.items()}
            )
        return PassResult(model, modified)


def _types(values) -> tuple[str | None, ...]:
    """``tensor(float)`` per value, ``None`` where the type is not known (or the value is missing)."""
    return tuple(
        f"tensor({v.dtype.name.lower()})"
        if v is not None and v.dtype is not None and isinstance(v.type, ir.TensorType)
        else None
        for v in values
    )


def _domain(node: ir.Node) -> str:
    return ONNX_DOMAIN if node.domain == "ai.onnx" else node.domain


def describe(found: Floor) -> str:
    """``set by LayerNormalization-17, Gelu-20``, or ``opreg's oldest target`` when no op needs more."""
    return f"set by {', '.join(found.set_by)}" if found.set_by else "the oldest opset opreg exports"


class RuntimeKernels(InPlacePass):
    """Refuse a model with a node the target's ONNX Runtime release has no CPU kernel for, at the
    opset the model imports (:func:`opreg.registry.runtimes.lacks` names the op, the release, and
    the releases that have one). Resolution already passed over impls whose ops the release lacks;
    this is the proof on the finished model (an op a pass made, or one a lowered opset reads anew)."""

    def __init__(self, release: Release) -> None:
        super().__init__()
        self.release = release

    def call(self, model: ir.Model) -> PassResult:
        found: dict[str, int] = {}
        for node in all_nodes(model):
            domain = _domain(node)
            version = model.opset_imports.get(domain)
            if version is None or domain not in KERNEL_DOMAINS:
                continue
            at = since(node.op_type, version, domain) or version
            if not self.release.runs(domain, node.op_type, at):
                label = lacks(self.release, domain, node.op_type, at)
                found[label] = found.get(label, 0) + 1
        if found:
            listed = "; ".join(f"{label} (x{n})" if n > 1 else label for label, n in found.items())
            raise OpsetConflictError(
                f"the model needs {listed}. Export for a release that has it (-t {RUNTIME}==VERSION), name a "
                f"lower ai.onnx version (-t {RUNTIME},ai.onnx=N), or register an impl that avoids the op"
            )
        return PassResult(model, False)
