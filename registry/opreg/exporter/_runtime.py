"""Running a model: ONNX Runtime with the packs' session configuration, or
``onnx.reference`` with the packs' reference kernels.

These functions take a model and the :class:`opreg.packs.host.PackHost` whose packs configure the
run; a :class:`Runner` binds them to one host, and is what :class:`opreg.OnnxProgram` is given
to run its model (it keeps the sessions the runner opens).
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from opreg.errors import RuntimeUnavailableError
from opreg.exporter._recorder import RANDOM_OPS
from opreg.packs.host import PackHost

logger = logging.getLogger(__name__)

STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
ORT_BUILTIN_DOMAINS = frozenset({"com.microsoft"})
"""Custom domains ONNX Runtime's CPU build implements without any library."""
IN_MEMORY_LIMIT = onnx.checker.MAXIMUM_PROTOBUF // 2
"""Weights above this many bytes reach ONNX Runtime through a file with external data, not
a serialised protobuf: one cannot exceed 2 GB, and serialising the weights doubles them in memory."""


def custom_ops(model: ir.Model) -> set[tuple[str, str]]:
    """``(domain, op_type)`` of every node outside the standard domains that is
    not a call to one of the model's own functions (subgraphs included)."""
    local = {(f.domain, f.name) for f in model.functions.values()}
    found = set()
    graphs: list[Any] = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if node.domain not in STANDARD_DOMAINS and (node.domain, node.op_type) not in local:
                found.add((node.domain, node.op_type))
    return found


def builtin_domains_only(model: ir.Model) -> bool:
    """Whether ONNX Runtime runs every op of ``model`` without any pack's library."""
    return all(domain in ORT_BUILTIN_DOMAINS for domain, _ in custom_ops(model))


def _describe(ops: set[tuple[str, str]]) -> str:
    return ", ".join(f"{d}::{o}" for d, o in sorted(ops))


_NO_KERNEL = re.compile(r"(?:Could not find an implementation|Failed to find kernel) for (\w+)\((\d+)\)")


def missing_random_kernel(error: BaseException) -> str | None:
    """``Op(version)`` when ``error`` is ONNX Runtime refusing a model for want of a kernel for a
    random op at the model's opset: its CPU kernels for RandomNormal, RandomUniform, their ``Like``
    forms, Bernoulli and Multinomial stop before those ops' opset 22 versions
    (microsoft/onnxruntime#32201), so ONNX Runtime runs them at targets up to 21 only."""
    found = _NO_KERNEL.search(str(error))
    if found is None or found.group(1) not in RANDOM_OPS:
        return None
    return f"{found.group(1)}({found.group(2)})"


def initializer_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def onnxruntime_session(model: ir.Model, host: PackHost) -> Any:
    """An ``InferenceSession`` for ``model``, configured by every loaded pack."""
    import onnxruntime

    from opreg.exporter._save import save_model

    options = onnxruntime.SessionOptions()
    for pack in host.configure_session(options):
        logger.debug("session configured by pack %s", pack)
    try:
        if initializer_bytes(model) > IN_MEMORY_LIMIT:
            with tempfile.TemporaryDirectory() as scratch:
                path = save_model(model, Path(scratch) / "model.onnx", external_data=True, check=False)
                return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        payload = ir.serde.serialize_model(model).SerializeToString()
        return onnxruntime.InferenceSession(payload, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        ops = custom_ops(model)
        random = missing_random_kernel(e)
        hint = ""
        if ops:
            hint = (
                f" The model uses custom ops {_describe(ops)}: install or load the pack that ships their "
                "kernels (opreg_configure_session), or run with runtime='reference'."
            )
        elif random:
            hint = (
                f" This ONNX Runtime has no CPU kernel for {random}: its random-number kernels stop at "
                "opset 21 (microsoft/onnxruntime#32201). Export with target=21 or lower to run the model "
                "in ONNX Runtime, or run it with runtime='reference'."
            )
        raise RuntimeUnavailableError(f"ONNX Runtime cannot load the model: {e}.{hint}") from e


def reference_evaluator(model: ir.Model, host: PackHost) -> Any:
    """An ``onnx.reference.ReferenceEvaluator`` for ``model`` with the packs' kernels."""
    from onnx.reference import ReferenceEvaluator

    kernels = host.reference_kernels()  # OpRun classes with an op_domain
    covered = {(getattr(k, "op_domain", ""), k.__name__) for k in kernels}
    missing = custom_ops(model) - covered
    if missing:
        raise RuntimeUnavailableError(
            f"the reference evaluator has no kernel for {_describe(missing)}: no loaded pack provides one "
            f"(opreg_reference_kernels). {_remedy(model, missing, host)}"
        )
    return ReferenceEvaluator(ir.serde.serialize_model(model), new_ops=kernels or None)


def _remedy(model: ir.Model, missing: set[tuple[str, str]], host: PackHost) -> str:
    """What runs a model the reference evaluator cannot: ONNX Runtime, once the ops it has no kernel
    for are embedded as the packs' function definitions, when its own domains are all that is missing."""
    foreign = {op for op in custom_ops(model) if op[0] not in ORT_BUILTIN_DOMAINS}
    if missing - {op for op in missing if op[0] in ORT_BUILTIN_DOMAINS}:
        return "Install the pack that emits these ops, or export with a target without their domains."
    defined: dict[tuple[str, str], str] = {}
    for pack, protos in host.functions():
        for proto in protos:
            defined.setdefault((proto.domain, proto.name), pack)
    undefined = foreign - set(defined)
    builtin = f"ONNX Runtime runs {_describe(missing)}"
    if undefined:
        return (
            f"{builtin}, but not {_describe(undefined)}, which no loaded pack configures a session for "
            "(opreg_configure_session) or defines as an ONNX function (opreg_functions): ship one of them"
        )
    owners = ", ".join(sorted({defined[op] for op in foreign}))
    return (
        f"{builtin}, and pack {owners} defines {_describe(foreign)} as ONNX functions: export with "
        "embed_functions=True (opreg export --embed-functions) and ONNX Runtime runs the whole model"
    )
