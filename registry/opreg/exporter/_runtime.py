"""Running an exported model: ONNX Runtime with the packs' session configuration,
or ``onnx.reference`` with the packs' reference kernels."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from opreg.errors import RuntimeUnavailableError

if TYPE_CHECKING:
    from opreg.exporter._program import OnnxProgram

logger = logging.getLogger(__name__)

STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
ORT_BUILTIN_DOMAINS = frozenset({"com.microsoft"})
"""Custom domains ONNX Runtime's CPU build implements without any library."""


def custom_ops(program: OnnxProgram) -> set[tuple[str, str]]:
    """``(domain, op_type)`` of every node outside the standard domains that is
    not a call to one of the model's own functions."""
    model = program.model
    local = {(f.domain, f.name) for f in model.functions.values()}
    found = set()
    graphs: list[Any] = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if node.domain not in STANDARD_DOMAINS and (node.domain, node.op_type) not in local:
                found.add((node.domain, node.op_type))
    return found


def _describe(ops: set[tuple[str, str]]) -> str:
    return ", ".join(f"{d}::{o}" for d, o in sorted(ops))


def onnxruntime_session(program: OnnxProgram) -> Any:
    """An ``InferenceSession`` for the model, configured by every loaded pack."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    for pack, _ in program.registry.call_hook("opreg_configure_session", options=options):
        logger.debug("session configured by pack %s", pack)
    try:
        if program.initializer_bytes() > 1_000_000_000:
            with tempfile.TemporaryDirectory() as scratch:
                path = program.save(Path(scratch) / "model.onnx", external_data=True)
                return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        payload = program.model_proto.SerializeToString()
        return onnxruntime.InferenceSession(payload, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        ops = custom_ops(program)
        hint = (
            f" The model uses custom ops {_describe(ops)}: install or load the pack that ships their "
            "kernels (opreg_configure_session), or run with runtime='reference'."
            if ops
            else ""
        )
        raise RuntimeUnavailableError(f"ONNX Runtime cannot load the model: {e}.{hint}") from e


def onnxruntime_can_run(program: OnnxProgram) -> bool:
    if all(domain in ORT_BUILTIN_DOMAINS for domain, _ in custom_ops(program)):
        return True
    if "onnxruntime" in program._sessions:
        return True
    try:
        program._sessions["onnxruntime"] = onnxruntime_session(program)  # kept for run()
    except RuntimeUnavailableError:
        return False
    return True


def reference_kernels(program: OnnxProgram) -> list[type]:
    kernels: list[type] = []
    for pack, result in program.registry.call_hook("opreg_reference_kernels"):
        for kernel in result or ():
            if not isinstance(kernel, type):
                logger.warning("pack %s returned a reference kernel that is not a class: %r", pack, kernel)
                continue
            kernels.append(kernel)
    return kernels


def reference_evaluator(program: OnnxProgram) -> Any:
    """An ``onnx.reference.ReferenceEvaluator`` with the packs' kernels."""
    from onnx.reference import ReferenceEvaluator

    kernels = reference_kernels(program)
    covered = {(getattr(k, "op_domain", ""), k.__name__) for k in kernels}
    missing = custom_ops(program) - covered
    if missing:
        raise RuntimeUnavailableError(
            f"the reference evaluator has no kernel for {_describe(missing)}: no loaded pack provides one "
            "(opreg_reference_kernels). Install the pack that emits these ops, or export with a target "
            "without their domains."
        )
    return ReferenceEvaluator(program.model_proto, new_ops=kernels or None)
