"""A harness for core-pack op tests: export a small module at the lowest and
highest supported opsets, run it in ONNX Runtime, compare with eager PyTorch."""

from __future__ import annotations

import torch

import opreg

LOWEST = 18
NEWEST = opreg.newest_supported_opset()
OPSETS = (LOWEST, NEWEST)

TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float64: (1e-7, 1e-7),
}
"""(rtol, atol) per floating dtype; integer and bool outputs must match exactly."""


class Lambda(torch.nn.Module):
    """Wraps a function of tensors as a module (``Lambda(lambda x: torch.cumsum(x, 0))``)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def check(fn, *inputs, opset: int, rtol: float | None = None, atol: float | None = None, **export_options):
    """Export ``fn`` (a module or a function of the inputs) at ``opset``, verify it in
    ONNX Runtime against eager PyTorch, and return the ``OnnxProgram``."""
    module = fn if isinstance(fn, torch.nn.Module) else Lambda(fn)
    program = opreg.export(module.eval(), inputs, target=opset, **export_options)
    dtype = next((t.dtype for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()), torch.float32)
    default_rtol, default_atol = TOLERANCES.get(dtype, (1e-5, 1e-5))
    program.verify(*inputs, rtol=default_rtol if rtol is None else rtol, atol=default_atol if atol is None else atol)
    return program


def onnx_ops(program) -> list[str]:
    """The op types of the model's nodes, in order (``domain::op`` outside ai.onnx)."""
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in program.model_proto.graph.node]
