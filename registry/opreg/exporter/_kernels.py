"""ONNX Runtime's CPU kernels as its own kernel table lists them, and the nodes of a model it has
none for: which op, at which version, on which types, and the types its kernels take instead.

The table is the installed onnxruntime's (``onnxruntime_pybind11_state.get_all_opkernel_def()``),
read once. ONNX Runtime serves a node with a kernel by two rules (``KernelRegistry::VerifyKernelDef``):

- the version: the node's schema's since-version at the model's opset (Gemm at ai.onnx 23 is
  Gemm-13) must lie in a kernel's ``[start, end]``; a kernel registered open-ended serves its
  ``start`` only, so an op given a new version (RandomNormal-22) has no kernel until one is added;
- the types: every type bound to each type constraint the kernel names (``T`` of Gemm: the
  inputs' and output's element type) must be one it takes.

An ai.onnx op defined as a function (Bernoulli, Gelu) with no kernel is expanded into its body's
ops instead, and the CPU provider casts float16 nodes it has no kernel for to float32 itself (its
InsertCastTransformer); it never does so for bfloat16, so a bfloat16 model is what meets a missing
kernel in practice (a bfloat16 function is reported: its body's elementwise ops have no bfloat16
kernels).
Only ai.onnx nodes are judged (a custom domain's kernels are its pack's).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping

import onnx
import onnx_ir as ir

ONNX_DOMAINS = ("", "ai.onnx")
OPEN_ENDED = 2**31 - 1
"""The end of a kernel registered for every version from its start on."""
HALF_FLOATS = frozenset({"tensor(float16)", "tensor(bfloat16)"})


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One CPU kernel of ONNX Runtime: an ai.onnx op, the versions it serves, the types it takes by
    type constraint (``{"T": {"tensor(float)", ...}}``, as a sorted tuple of pairs)."""

    op: str
    start: int
    end: int
    types: tuple[tuple[str, frozenset[str]], ...]

    def serves(self, since: int, bound: Mapping[str, set[str]]) -> bool:
        """Whether ONNX Runtime picks this kernel for a node of schema version ``since`` whose type
        constraints are bound to ``bound``."""
        in_range = self.start == since or (self.start < since <= self.end and self.end != OPEN_ENDED)
        return in_range and all(bound.get(name, set()) <= allowed for name, allowed in self.types)


@dataclasses.dataclass(frozen=True)
class MissingKernel:
    """A node ONNX Runtime's CPU provider has no kernel for.

    Fields:
        node: the node's name.
        op: its op type; ``version``: its schema's since-version at the model's opset.
        types: the types bound to its type constraints (``T=bfloat16``), as shown in messages.
        offered: the types this op's kernels at that version take for the constraints that did
            not match (``float, double``); empty when no kernel serves the version at all.
        half: the node computes in bfloat16, and computes in float32 once cast (a kernel serves
            it there, or it is a function): what ``keep_float32`` does.
        function: an op ONNX defines as a function, which ONNX Runtime expands for want of a
            kernel; on bfloat16 its body's ops have none either, nearly always (Gelu's Sqrt).
    """

    node: str
    op: str
    version: int
    types: tuple[str, ...]
    offered: tuple[str, ...]
    half: bool
    function: bool = False

    def label(self) -> str:
        """``Gemm(13) on T=bfloat16 (its kernels take float, double)``."""
        if self.function:
            taken = " (no kernel: expanded into the ops of its function body, on these types)"
        elif self.offered:
            taken = f" (its kernels take {', '.join(self.offered)})"
        else:
            taken = " (no kernel at this version)"
        return f"{self.op}({self.version}) on {', '.join(self.types)}{taken}"


@functools.cache
def cpu_kernels() -> Mapping[str, tuple[Kernel, ...]]:
    """The installed ONNX Runtime's CPU kernels of ai.onnx ops, by op type (read once)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    found: dict[str, list[Kernel]] = {}
    for k in ort_state.get_all_opkernel_def():
        if k.provider == "CPUExecutionProvider" and k.domain in ONNX_DOMAINS:
            start, end = k.version_range
            types = tuple(sorted((name, frozenset(allowed)) for name, allowed in k.type_constraints.items()))
            found.setdefault(k.op_name, []).append(Kernel(k.op_name, start, end, types))
    return {op: tuple(kernels) for op, kernels in found.items()}


def type_string(dtype: ir.DataType) -> str:
    """ONNX's name of a tensor type, as kernel tables and schemas spell it (``tensor(bfloat16)``)."""
    return f"tensor({dtype.name.lower()})"


def bound_types(node: ir.Node, schema: onnx.defs.OpSchema) -> dict[str, set[str]]:
    """The types ``node`` binds each of ``schema``'s type constraints to (its inputs' and outputs')."""
    bound: dict[str, set[str]] = {}
    for formals, values in ((schema.inputs, node.inputs), (schema.outputs, node.outputs)):
        for index, value in enumerate(values):
            if value is None or value.dtype is None or not formals:
                continue
            formal = formals[min(index, len(formals) - 1)]  # a variadic last formal takes the rest
            bound.setdefault(formal.type_str, set()).add(type_string(value.dtype))
    return bound


def runs(op: str, since: int, bound: Mapping[str, set[str]]) -> bool:
    """Whether a CPU kernel serves ``op`` at schema version ``since`` with these types."""
    return any(k.serves(since, bound) for k in cpu_kernels().get(op, ()))


def missing(model: ir.Model) -> list[MissingKernel]:
    """The ai.onnx nodes of ``model`` (subgraphs included) ONNX Runtime's CPU provider has no kernel
    for, in graph order (float16 nodes it casts itself, and ops it expands as functions but on
    bfloat16, left out)."""
    return [found for _, found in missing_nodes(model)]


def missing_nodes(model: ir.Model) -> list[tuple[ir.Node, MissingKernel]]:
    """:func:`missing`, each with its node."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if opset is None:
        return []
    judged = ((node, _judge(node, opset)) for node in ir.traversal.RecursiveGraphIterator(model.graph))
    return [(node, found) for node, found in judged if found is not None]


def _judge(node: ir.Node, opset: int) -> MissingKernel | None:
    schema = _schema(node.op_type, opset) if node.domain in ONNX_DOMAINS else None
    if schema is None:
        return None
    bound = bound_types(node, schema)
    since = schema.since_version
    if runs(node.op_type, since, bound) or _cast_by_runtime(node.op_type, since, bound, "tensor(float16)"):
        return None
    bfloat16 = any("tensor(bfloat16)" in types for types in bound.values())
    if schema.has_function or schema.has_context_dependent_function:  # expanded into its body's ops
        if not bfloat16:  # which have kernels for every type but bfloat16's, nearly all
            return None
        types = tuple(f"{name}={'/'.join(sorted(map(_short, t)))}" for name, t in sorted(bound.items()))
        return MissingKernel(node.name or "", node.op_type, since, types, (), True, function=True)
    at_version = [k for k in cpu_kernels().get(node.op_type, ()) if k.serves(since, {})]
    wrong = sorted({name for k in at_version for name, allowed in k.types if not bound.get(name, set()) <= allowed})
    offered = sorted({_short(t) for k in at_version for name, allowed in k.types if name in wrong for t in allowed})
    types = tuple(f"{name}={'/'.join(sorted(map(_short, bound[name])))}" for name in wrong or sorted(bound))
    half = _cast_by_runtime(node.op_type, since, bound, "tensor(bfloat16)")
    return MissingKernel(node.name or "", node.op_type, since, types, tuple(offered), half)


def _cast_by_runtime(op: str, since: int, bound: Mapping[str, set[str]], half: str) -> bool:
    """Whether the node binds ``half`` and a kernel serves it once that type is float32."""
    if not any(half in types for types in bound.values()):
        return False
    return runs(op, since, {name: {_float32(t, half) for t in types} for name, types in bound.items()})


def _float32(type_: str, half: str) -> str:
    return "tensor(float)" if type_ == half else type_


def _short(type_: str) -> str:
    return type_.removeprefix("tensor(").removesuffix(")")


@functools.cache
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def describe(found: Iterable[MissingKernel]) -> str:
    """``Gemm(13) on T=bfloat16 (its kernels take float, double) x2, ...``: each kind once, with its count."""
    counts: dict[str, int] = {}
    for m in found:
        counts[m.label()] = counts.get(m.label(), 0) + 1
    return ", ".join(f"{label} x{n}" if n > 1 else label for label, n in counts.items())
