"""LoRA adapters as the decoder's inputs (``adapters=``): one decoder, and one ``.onnx_adapter``
file per adapter that ONNX Runtime GenAI switches per request.

Each linear layer any of the adapters adapts takes its ``A`` and ``B`` as two inputs, as the
graph GenAI's builder makes for an adapter (``make_matmul_lora``: ``x @ W`` plus
``(x @ A) @ B``, the scale folded into ``B``), and as GenAI feeds an adapter's parameters by
name:

- ``<module>.lora_A.weight``: ``(in, rank)``, the adapter's ``lora_A`` transposed;
- ``<module>.lora_B.weight``: ``(rank, out)``, ``scale * lora_B`` transposed;

(``<module>``: the layer's name in the transformers model, ``model.layers.0.self_attn.q_proj``),
``rank`` dynamic. Each input's default (an initializer of its name) is empty, of rank 0, the
tensor GenAI makes where no adapter is active (``CreateEmptyInput``: the smaller of the last two
dims zeroed): the product adds zeros, and the decoder is the base model. An adapter's file holds
the inputs of the layers it adapts; a layer it leaves alone keeps its empty default.

The capture adds the product to each adapted layer's output with a forward hook (the modules,
and so the names of the base weights a streamed export binds, stay the model's own).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from opreg.llm._lora import Adapter

SUFFIX = ".onnx_adapter"
EXAMPLE_RANK = 2
"""The rank of the capture's example ``A`` and ``B`` (not 0 or 1, which torch.export would fix)."""


@dataclasses.dataclass(frozen=True)
class LoraInput:
    """One adapted linear layer's pair of decoder inputs.

    Fields:
        module: the layer's name in the transformers model.
        in_features, out_features: its ``Linear``'s.
    """

    module: str
    in_features: int
    out_features: int

    @property
    def names(self) -> tuple[str, str]:
        """The names of its ``A`` and ``B`` inputs."""
        return f"{self.module}.lora_A.weight", f"{self.module}.lora_B.weight"

    def empty(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Its ``A`` and ``B`` of rank 0: no adapter active."""
        return torch.zeros(self.in_features, 0, dtype=dtype), torch.zeros(0, self.out_features, dtype=dtype)


def lora_inputs(adapters: Sequence[Adapter], model: Any) -> tuple[LoraInput, ...]:
    """The layers any of ``adapters`` adapts, in ``model``'s order of modules."""
    adapted = {module for adapter in adapters for module in adapter.pairs}
    return tuple(
        LoraInput(name, module.in_features, module.out_features)
        for name, module in model.named_modules()
        if name in adapted
    )


def example(slots: Sequence[LoraInput], dtype: torch.dtype, generator: torch.Generator) -> list[torch.Tensor]:
    """The capture's example ``A`` and ``B`` of every slot, in order, of rank :data:`EXAMPLE_RANK`."""
    made = []
    for slot in slots:
        made.append(torch.randn(slot.in_features, EXAMPLE_RANK, generator=generator).to(dtype))
        made.append(torch.randn(EXAMPLE_RANK, slot.out_features, generator=generator).to(dtype))
    return made


def dynamic_shapes(slots: Sequence[LoraInput]) -> list[dict[int, Any]]:
    """Each slot's rank dynamic (one dim per layer: adapters may give layers different ranks)."""
    shapes: list[dict[int, Any]] = []
    for index, _ in enumerate(slots):
        rank = torch.export.Dim(f"lora_rank_{index}", min=0)
        shapes += [{1: rank}, {0: rank}]
    return shapes


def dims(slots: Sequence[LoraInput]) -> dict[str, tuple[Any, ...]]:
    """The inputs' dims by name, as the decoder names them."""
    named: dict[str, tuple[Any, ...]] = {}
    for index, slot in enumerate(slots):
        a, b = slot.names
        named[a] = (None, f"lora_rank_{index}")
        named[b] = (f"lora_rank_{index}", None)
    return named


@contextlib.contextmanager
def hooked(model: torch.nn.Module, slots: Sequence[LoraInput], values: list[torch.Tensor]) -> Iterator[None]:
    """``model``'s adapted layers adding ``(x @ A) @ B`` to their outputs while the block runs,
    ``A`` and ``B`` read from ``values`` (slot ``i``'s at ``2 * i`` and ``2 * i + 1``) at each call:
    the caller fills ``values`` before calling the model."""

    def hook(index: int) -> Any:
        def added(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            down, up = values[2 * index], values[2 * index + 1]
            return output + torch.matmul(torch.matmul(args[0], down), up)

        return added

    handles = [model.get_submodule(slot.module).register_forward_hook(hook(i)) for i, slot in enumerate(slots)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def add_defaults(graph: Any, slots: Sequence[LoraInput]) -> None:
    """Give each LoRA input of ``graph`` (an ``onnx_ir`` graph) its empty default (an initializer
    of its name, of rank 0), so that the decoder runs as the base model when none is fed."""
    import numpy as np
    import onnx_ir as ir

    inputs = {value.name: value for value in graph.inputs}
    for slot in slots:
        for name, shape in zip(slot.names, ((slot.in_features, 0), (0, slot.out_features)), strict=True):
            value = inputs[name]
            value.const_value = ir.tensor(np.zeros(shape, dtype=np.float32), name=name)
            graph.register_initializer(value)


def write_adapters(adapters: Sequence[Adapter], folder: Path) -> list[str]:
    """Write each adapter as ``<name>.onnx_adapter`` in ``folder`` (ONNX Runtime's adapter format,
    ``onnxruntime.AdapterFormat``): its layers' ``A`` and ``B`` as the decoder takes them; the
    names written."""
    import onnxruntime as ort

    written = []
    for adapter in adapters:
        parameters = {}
        for pair in adapter.pairs.values():
            down = pair.down.torch().to(torch.float32).T.contiguous()
            up = (pair.up.torch().to(torch.float32) * pair.scale).T.contiguous()
            slot = LoraInput(pair.module, int(down.shape[0]), int(up.shape[1]))
            for name, tensor in zip(slot.names, (down, up), strict=True):
                parameters[name] = ort.OrtValue.ortvalue_from_numpy(tensor.numpy())
        made = ort.AdapterFormat()
        made.set_adapter_version(1)
        made.set_model_version(1)
        made.set_parameters(parameters)
        name = adapter.name + SUFFIX
        made.export_adapter(str(folder / name))
        written.append(name)
    return written
