"""Verifying an exported model: every output (and the state it leaves) against eager PyTorch."""

from __future__ import annotations

import copy
import math
import numbers
from typing import Any

import onnx_ir as ir
import torch

from opreg.errors import InvalidArgumentError, VerificationError
from opreg.exporter._state import BUFFER
from opreg.exporter.diagnosis.compare import Verification, compare_output, mismatch_error
from opreg.exporter.diagnosis.eager import run_eager
from opreg.exporter.diagnosis.run import ONNXRUNTIME, Program, check_runtime


def check_tolerances(rtol: Any, atol: Any) -> None:
    """verify's and locate's tolerances: finite numbers >= 0, checked before anything runs."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
            raise InvalidArgumentError(f"{name}= takes a tolerance: a finite number >= 0 such as 1e-4, got {value!r}")


def verify_program(
    program: Program, args: tuple, kwargs: dict[str, Any], *, rtol: float, atol: float, runtime: str, locate: bool
) -> Verification:
    """:meth:`opreg.exporter.OnnxProgram.verify`: the model and eager PyTorch on the same inputs, each
    output compared; a :class:`opreg.VerificationError` listing the mismatches (located with ``locate``)."""
    check_tolerances(rtol, atol)
    check_runtime(runtime, "auto")
    if not isinstance(locate, bool):
        raise InvalidArgumentError(f"locate= takes True or False, got {type(locate).__name__} {locate!r}")
    program.adapt_torch_inputs_to_onnx(*args, **kwargs)  # wrong inputs get opreg's error, not torch's
    module = program.eager_module("verify")
    if runtime == "auto":
        runtime = program.runtime_for()
    names, got, expected = _both_sides(program, module, args, kwargs, runtime)
    checks = tuple(compare_output(n, g, e, rtol, atol) for n, g, e in zip(names, got, expected, strict=True))
    if all(c.ok for c in checks):
        return Verification(runtime, checks)
    location = program.locate(*args, rtol=rtol, atol=atol, runtime=runtime, **kwargs) if locate else None
    where = f"\nwhere it goes wrong:\n{location}" if location is not None else ""
    error = mismatch_error(
        checks,
        f"output(s) differ from eager PyTorch ({runtime}, rtol={rtol}, atol={atol})",
        f"{where}{_random_hint(program.model)}{_saturation_hint(program.model, runtime)}",
    )
    error.location = location
    raise error


def _both_sides(
    program: Program, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], runtime: str
) -> tuple[list, list, list]:
    """Each output's name, the model's value and eager's, then the state each leaves. Each side runs
    on its own copy of the inputs: a model may update an input in place (exported as state, or dropped
    with state="drop"), and verify never changes the caller's tensors; nor the program's state."""
    saved = dict(program.state)
    eager_inputs, onnx_inputs = copy.deepcopy((args, kwargs)), copy.deepcopy((args, kwargs))
    expected, updated = run_eager(module, program.state, *eager_inputs)
    try:
        got = program.run(*onnx_inputs[0], runtime=runtime, **onnx_inputs[1])
        exp_leaves = torch.utils._pytree.tree_leaves(expected)
        got_leaves = torch.utils._pytree.tree_leaves(got)
        names = [s.name or f"constant_{i}" for i, s in enumerate(program.output_slots)]
        for slot in program.state_slots:  # and the state it leaves
            names.append(slot.output)
            if slot.kind == BUFFER:
                exp_leaves.append(updated[slot.key])
                got_leaves.append(program.state[slot.key])
            else:
                index = program.input_names.index(slot.input)
                exp_leaves.append(program.input_values(*eager_inputs)[index])
                got_leaves.append(program.input_values(*onnx_inputs)[index])
    finally:
        program.state = saved  # verify leaves the state as it found it
    if len(exp_leaves) != len(got_leaves):
        raise VerificationError(f"eager PyTorch returned {len(exp_leaves)} values, the ONNX model {len(got_leaves)}")
    return names, got_leaves, exp_leaves


def _saturation_hint(model: ir.Model, runtime: str) -> str:
    """Why a QDQ model can differ in ONNX Runtime on this CPU (its int8 kernels saturate), if they do."""
    from opreg.exporter.diagnosis import _intkernels

    if runtime != ONNXRUNTIME or not _intkernels.has_int8_weights(model):
        return ""
    return _intkernels.saturation_hint(model, _intkernels.integer_products_saturate())


def _random_hint(model: ir.Model) -> str:
    """What to do when a model that draws random numbers does not match value by value."""
    from opreg.exporter._recorder import is_random

    drawn = sorted({n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph) if is_random(n)})
    if not drawn:
        return ""
    return (
        f"\nThe model draws random numbers ({', '.join(drawn)}) from the runtime's generator, not torch's: "
        "its outputs can only match eager PyTorch in distribution. Check them with "
        "opreg.testing.check_samples(..., compare=opreg.testing.Distribution())."
    )
