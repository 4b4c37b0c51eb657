"""A decoder's capture: its repeated layers captured once, the capture seeing their cache only.

:func:`export_step` plans the layers (:mod:`opreg.llm._layers`): one layer of each kind is
captured, the others are copies. torch.export need not see the other layers' cache either
(each layer's keys and values cost the capture about 0.02 s of CPU): :func:`trimmed` gives the
capture the ``past_key_values`` of the captured layers only, with their dynamic shapes, and
:func:`opreg.llm._layers.repeat_layers` adds the other layers' cache inputs and outputs and the
whole call's specs, so that the decoder's inputs and outputs are those of a whole capture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import torch

from opreg.exporter import OnnxProgram, run_export
from opreg.llm import _layers
from opreg.llm._cache import KeyValueCache
from opreg.llm._genai import text_config
from opreg.weights import bind, open_weights

PAST = "past_key_values"
"""The decoder's keyword taking the cache: key 0, value 0, key 1, ..."""


def export_step(step: torch.nn.Module, example: dict[str, Any], settings: Any, layout: Any) -> OnnxProgram:
    """The export of ``step`` (``opreg.llm._decoder.DecoderStep`` of ``layout``) called with
    ``example``: its repeated layers captured once where they can be: one layer of each kind,
    layer 0 a template too; else templates from layer 1 on (where a layer reads more of the
    layers before it than the hidden state); else all of them."""
    if layout.lora or layout.features or not all(isinstance(kind, KeyValueCache) for kind in layout.layers):
        return run_export(step, (), example, settings)  # not two inputs per layer (LoRA's, none: captured whole)
    first_past = len(layout.input_names) - 2 * layout.num_layers
    kinds = getattr(text_config(step.model), "layer_types", None)  # what the model's code reads by index
    differs = kinds.__getitem__ if isinstance(kinds, (list, tuple)) and len(kinds) == layout.num_layers else None
    plans = [
        _layers.plan_layers(step.model, layout.num_layers, first_past, differs=differs, hidden_only=hidden_only)
        for hidden_only in (True, False)
    ]
    # a streamed model's weights, all layers' (the capture binds only the prefix's), each missing one named now
    lazy = {} if settings.weights is None else bind(step, open_weights(settings.weights))
    trim = functools.partial(trimmed, step, example, settings)
    return _layers.export_repeated(step, (), example, settings, plans, "the decoder", lazy, trim)


@contextlib.contextmanager
def trimmed(
    step: torch.nn.Module, kwargs: dict[str, Any], settings: Any, plan: _layers.LayerPlan
) -> Iterator[_layers.Trimmed | None]:
    """The capture of ``step`` (whose ``layers`` say what each layer caches) called with
    ``kwargs`` for ``plan``'s prefix: the prefix's keys and values only (``None`` where the
    cache is not two tensors per layer after every other input)."""
    from torch.utils import _pytree as pytree

    past, layers = list(kwargs.get(PAST, ())), step.layers
    if len(past) != 2 * len(layers) or list(kwargs)[-1] != PAST:
        yield None
        return
    keep = 2 * plan.prefix
    small = {**kwargs, PAST: past[:keep]}
    shapes = dict(settings.dynamic_shapes)
    shapes[PAST] = list(shapes[PAST])[:keep]
    whole, in_spec = (pytree.tree_flatten(((), call))[1] for call in (kwargs, small))
    step.layers = layers[: plan.prefix]
    try:
        yield _layers.Trimmed(
            kwargs=small,
            settings=dataclasses.replace(settings, dynamic_shapes=shapes),
            in_spec=in_spec,
            out_spec=_outputs(keep),
            whole=(whole, _outputs(len(past))),
            extra=range(in_spec.num_leaves, whole.num_leaves),
        )
    finally:
        step.layers = layers


def _outputs(count: int) -> Any:
    """The spec of the decoder's outputs with ``count`` cache tensors."""
    from torch.utils import _pytree as pytree

    return pytree.tree_structure({"logits": 0, "present": [0] * count})
