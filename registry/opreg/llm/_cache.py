"""The decoder's cache, layer by layer: what each kind of layer keeps from one call to the next,
the tensors that carry it in and out of the decoder, and the transformers cache layers holding
those tensors while the model runs (in the export's capture, and in the eager reference).

A :class:`DecoderLayout` lists one kind per layer; everything that names, shapes, fills or
compares the cache asks the kinds, never the architecture:

- :class:`KeyValueCache` (GenAI's ``full_attention``): keys and values, ``(batch,
  kv_heads, past_sequence_length, head_size)`` in, the past with this call's appended out.
- :class:`ConvState` (GenAI's ``conv``; LFM2's short convolutions): the last ``width``
  inputs of a depthwise causal convolution, ``(batch, channels, width)`` in and out, ``width``
  one less than the kernel (transformers keeps one more, which the convolution never reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from opreg.llm._layout import LAYOUT

BATCH, SEQUENCE, PAST, TOTAL = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"
"""The dim names of the decoder's inputs and outputs (ONNX Runtime GenAI's builder uses the same)."""


@dataclasses.dataclass(frozen=True)
class CacheTensor:
    """One tensor a layer's cache carries from a decoder call to the next.

    Fields:
        past: the input's name, ``%d`` the layer (as ``genai_config.json`` names it).
        present: the output's name.
        dims: the past's shape: ints, and :data:`BATCH` or :data:`PAST` for the dynamic dims.
        grows: whether the present is the past with the new tokens appended at :data:`PAST`'s
            dim (its dim then :data:`TOTAL`), rather than the past's shape.
    """

    past: str
    present: str
    dims: tuple[int | str, ...]
    grows: bool

    @property
    def present_dims(self) -> tuple[int | str, ...]:
        return tuple(TOTAL if dim == PAST and self.grows else dim for dim in self.dims)

    def shape(self, batch: int, past: int) -> tuple[int, ...]:
        """The past's shape at ``batch`` rows after ``past`` tokens."""
        return tuple({BATCH: batch, PAST: past}.get(dim, dim) for dim in self.dims)  # type: ignore[misc]

    @property
    def sequence_dim(self) -> int | None:
        """The present's dim along the tokens, counted without the batch (``None``: it has none)."""
        return self.dims.index(PAST) - 1 if self.grows else None


@dataclasses.dataclass(frozen=True)
class KeyValueCache:
    """An attention layer's cache: its keys and values, heads unrepeated (BNSH).

    Fields:
        kv_heads: key/value heads.
        head_size: the last dim of keys and values.
    """

    kv_heads: int
    head_size: int
    layer_type: ClassVar[str] = "full_attention"

    @property
    def tensors(self) -> tuple[CacheTensor, ...]:
        dims = (BATCH, self.kv_heads, PAST, self.head_size)
        return (
            CacheTensor(LAYOUT["past_key"], LAYOUT["present_key"], dims, grows=True),
            CacheTensor(LAYOUT["past_value"], LAYOUT["present_value"], dims, grows=True),
        )

    def capture_layer(self, past: Sequence[torch.Tensor]) -> Any:
        return past_layer_class()(*past)

    def eager_layer(self, past: Sequence[torch.Tensor], prefill: bool) -> Any:
        from transformers.cache_utils import DynamicLayer

        layer = DynamicLayer()
        if not prefill:
            layer.update(*past)
        return layer

    def present(self, layer: Any) -> list[torch.Tensor]:
        return [layer.keys, layer.values]

    eager_present = present


@dataclasses.dataclass(frozen=True)
class ConvState:
    """A short convolution's cache (LFM2's): the last ``width`` inputs of its depthwise causal
    convolution, which the next call's first tokens read.

    Fields:
        channels: the convolution's channels.
        width: inputs kept: the kernel size less one.
    """

    channels: int
    width: int
    layer_type: ClassVar[str] = "conv"

    @property
    def tensors(self) -> tuple[CacheTensor, ...]:
        dims = (BATCH, self.channels, self.width)
        return (CacheTensor(LAYOUT["past_conv"], LAYOUT["present_conv"], dims, grows=False),)

    def capture_layer(self, past: Sequence[torch.Tensor]) -> Any:
        return _conv_layer_class()(past[0])

    def eager_layer(self, past: Sequence[torch.Tensor], prefill: bool) -> Any:
        """transformers' own layer: empty for a prefill (the past is then zeros), else holding
        the state as its decode steps leave it (a column more than ``width``, which the
        convolution never reads) and marked as having a past."""
        from transformers.cache_utils import LinearAttentionLayer

        layer = LinearAttentionLayer()
        if not prefill:
            state = torch.nn.functional.pad(past[0], (1, 0))
            layer.lazy_initialization(conv_states=state)
            layer.conv_states[0].copy_(state)
            layer.has_previous_state[0] = True
        return layer

    def present(self, layer: Any) -> list[torch.Tensor]:
        return [layer.present]

    def eager_present(self, layer: Any) -> list[torch.Tensor]:
        return [layer.conv_states[0][..., -self.width :]]


LayerCache = KeyValueCache | ConvState
"""What one layer caches."""


def of_layer(layer: Any, index: int, model_name: str) -> LayerCache:
    """What the transformers cache layer ``layer`` (after one eager call) holds, as a kind."""
    from opreg.errors import ExportError

    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    conv, recurrent = getattr(layer, "conv_states", None) or {}, getattr(layer, "recurrent_states", None) or {}
    states = [state for state in [*conv.values(), *recurrent.values()] if isinstance(state, torch.Tensor)]
    if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.dim() == 4:
        if states:
            raise ExportError(
                f"layer {index} of {model_name}'s cache is a {type(layer).__name__} holding keys and values and a "
                "state-space layer's states (a hybrid layer): export_decoder lays out key/value caches and short "
                "convolutions' states only"
            )
        if (keys.shape[1], keys.shape[3]) != (values.shape[1], values.shape[3]):
            raise ExportError(
                f"{model_name} caches keys of {keys.shape[1]}x{keys.shape[3]} and values of "
                f"{values.shape[1]}x{values.shape[3]}: ONNX Runtime GenAI needs both in one shape"
            )
        return KeyValueCache(int(keys.shape[1]), int(keys.shape[3]))
    if list(conv) == [0] and len(states) == 1 and states[0] is conv[0] and conv[0].dim() == 3:
        return ConvState(int(conv[0].shape[1]), int(conv[0].shape[2]) - 1)
    raise ExportError(
        f"layer {index} of {model_name}'s cache is a {type(layer).__name__} without 4-D keys and values (a "
        "state-space or linear-attention layer?): export_decoder lays out key/value caches and short convolutions' "
        "states only"
    )


# -- the transformers cache layers the capture fills ----------------------------------------


def past_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class PastLayer(DynamicLayer):
        """A ``DynamicLayer`` holding a past given as tensors, its length read from their shape
        (``DynamicLayer`` returns 0 for an empty tensor: a branch on the size torch.export would
        specialise to ``past > 0``)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            super().__init__()
            self.keys, self.values = keys, values
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True

        def get_seq_length(self) -> int:
            return self.keys.shape[-2]

    return PastLayer


def past_cache(layer_class: type, past: Sequence[torch.Tensor], num_layers: int) -> Any:
    """A transformers ``DynamicCache`` holding ``past`` (key 0, value 0, key 1, ...) in layers of
    ``layer_class`` (:func:`past_layer_class`)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = [layer_class(past[2 * i], past[2 * i + 1]) for i in range(num_layers)]
    return cache


def presents(cache: Any) -> list[torch.Tensor]:
    """Each layer's keys and values of a transformers cache: key 0, value 0, key 1, ..."""
    present = []
    for layer in cache.layers:
        present += [layer.keys, layer.values]
    return present


def layer_names(key: str, value: str, num_layers: int) -> list[str]:
    """Each layer's key and value names, from their ``%d`` patterns: ``key % 0``, ``value % 0``, ``key % 1``, ..."""
    return [name % layer for layer in range(num_layers) for name in (key, value)]


def _conv_layer_class() -> type:
    from transformers.cache_utils import LinearAttentionLayer

    class PastConvLayer(LinearAttentionLayer):
        """A convolution's past given as a tensor: the model's new inputs are appended to it
        (what the convolution reads) and the last ``width`` of them are the present. It says it
        has no previous state, so the model takes its general path (a concatenation and a
        convolution), not its single-token kernel: a branch on the sequence length."""

        def __init__(self, state: torch.Tensor) -> None:
            super().__init__()
            self.past = self.present = state
            self.dtype, self.device = state.dtype, state.device

        def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
            full = torch.cat([self.past, conv_states.to(self.past.dtype)], dim=-1)
            self.present = full[..., full.shape[-1] - self.past.shape[-1] :]
            return full

    return PastConvLayer


def capture_cache(layers: Sequence[LayerCache], tensors: Sequence[torch.Tensor]) -> Any:
    """A transformers ``DynamicCache`` holding ``tensors`` (the decoder's cache inputs, in order)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = [kind.capture_layer(part) for kind, part in zip(layers, split(layers, tensors), strict=True)]
    return cache


def eager_cache(layers: Sequence[LayerCache], tensors: Sequence[torch.Tensor], prefill: bool) -> Any:
    """transformers' own cache layers: empty for a prefill (as ``generate`` starts), else holding
    ``tensors`` as its decode steps leave them."""
    from transformers import DynamicCache

    cache = DynamicCache()
    parts = split(layers, tensors)
    cache.layers = [kind.eager_layer(part, prefill) for kind, part in zip(layers, parts, strict=True)]
    return cache


def split(layers: Sequence[LayerCache], tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` (every layer's, in order) grouped by layer."""
    parts, start = [], 0
    for kind in layers:
        count = len(kind.tensors)
        parts.append(list(tensors[start : start + count]))
        start += count
    if start != len(tensors):
        raise ValueError(f"{len(tensors)} cache tensors given, the layout has {start}")
    return parts


def present(layers: Sequence[LayerCache], cache: Any, *, eager: bool = False) -> list[torch.Tensor]:
    """Every layer's present from ``cache`` after the call, in the decoder's output order."""
    found: list[torch.Tensor] = []
    for kind, layer in zip(layers, cache.layers, strict=True):
        found += kind.eager_present(layer) if eager else kind.present(layer)
    return found
