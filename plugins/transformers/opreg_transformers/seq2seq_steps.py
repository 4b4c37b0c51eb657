"""The three models of an encoder-decoder checkpoint as optimum-onnx 0.1.0 exports them, each a
``torch.nn.Module`` around the transformers model that takes and returns optimum's names:

- :class:`EncoderStep`: ``input_ids``, ``attention_mask`` -> ``last_hidden_state``;
- :class:`DecoderStep`: ``encoder_attention_mask``, ``input_ids``, ``encoder_hidden_states`` ->
  ``logits`` and every layer's ``present.{i}.decoder.key``/``.value`` (self-attention) and
  ``present.{i}.encoder.key``/``.value`` (cross-attention);
- :class:`DecoderWithPastStep`: ``encoder_attention_mask``, ``input_ids`` and every layer's
  ``past_key_values.{i}.decoder.*`` and ``.encoder.*`` -> ``logits`` and the self-attention's
  ``present.{i}.decoder.*`` (the cross-attention's keys and values do not change after the first
  step: optimum leaves them out).

Each calls the model's own ``forward`` (the one ``generate`` calls), so a family's details (T5's
relative position buckets counted from the past's length, BART's learned positions after an offset)
are the library's. Imports torch and transformers: imported by a component's build step.
"""

from __future__ import annotations

from typing import Any

import torch

from opreg_transformers.seq2seq import CROSS, PAST, PRESENT, SELF, cache_names


def _layers_of(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def presents(cache: Any, *, cross: bool) -> dict[str, torch.Tensor]:
    """A transformers ``EncoderDecoderCache`` as optimum's ``present.*`` outputs (the
    cross-attention's too with ``cross``)."""
    mine = _layers_of(cache.self_attention_cache)
    theirs = _layers_of(cache.cross_attention_cache) if cross else [()] * len(mine)
    parts = (SELF, CROSS) if cross else (SELF,)
    tensors = [t for own, other in zip(mine, theirs, strict=True) for t in (*own, *other)]
    return dict(zip(cache_names(PRESENT, len(mine), parts), tensors, strict=True))


class EncoderStep(torch.nn.Module):
    """The encoder of ``model``: ``forward(input_ids, attention_mask)`` -> ``{"last_hidden_state"}``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return {"last_hidden_state": hidden}


class DecoderStep(torch.nn.Module):
    """The decoder's first step, no past: ``output`` (``logits``, or a bare model's
    ``last_hidden_state``) and the cache it starts."""

    def __init__(self, model: torch.nn.Module, output: str) -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(
        self, encoder_attention_mask: torch.Tensor, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        out = self.model(
            attention_mask=encoder_attention_mask, decoder_input_ids=input_ids,
            encoder_outputs=(encoder_hidden_states,), use_cache=True,
        )  # fmt: skip
        return {self.output: getattr(out, self.output), **presents(out.past_key_values, cross=True)}


class DecoderWithPastStep(torch.nn.Module):
    """The decoder after a past: ``forward(encoder_attention_mask, input_ids, **past)``, the past by
    optimum's names (:func:`cache_names`); ``output`` and the self-attention's new cache."""

    def __init__(self, model: torch.nn.Module, output: str, layers: int) -> None:
        super().__init__()
        self.model = model
        self.output = output
        self.layers = layers

    def forward(
        self, encoder_attention_mask: torch.Tensor, input_ids: torch.Tensor, **past: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        from transformers import DynamicCache, EncoderDecoderCache

        def cache(part: str) -> Any:
            names = cache_names(PAST, self.layers, (part,))
            return DynamicCache([(past[k], past[v]) for k, v in zip(names[::2], names[1::2], strict=True)])

        both = EncoderDecoderCache(cache(SELF), cache(CROSS))  # the cross-attention read from its past
        first = past[cache_names(PAST, 1, (CROSS,))[0]]
        hidden = first.new_zeros(*encoder_attention_mask.shape, self.model.config.d_model)  # never read
        out = self.model(
            attention_mask=encoder_attention_mask, decoder_input_ids=input_ids, encoder_outputs=(hidden,),
            past_key_values=both, use_cache=True,
        )  # fmt: skip
        return {self.output: getattr(out, self.output), **presents(out.past_key_values, cross=False)}


def grow_sinusoidal_positions(model: torch.nn.Module, positions: int) -> None:
    """Give M2M100's sinusoidal position tables (encoder and decoder) ``positions`` rows past the
    padding index before the capture: the model regrows a table a longer sequence outruns, a
    branch on the length torch.export would refuse over the dims' range. The rows are the
    sinusoids the model would compute, so eager is unchanged."""
    for stack in (model.get_encoder(), model.get_decoder()):
        table = stack.embed_positions
        needed = table.padding_idx + 1 + positions + table.offset
        if table.weights.size(0) < needed:
            table.make_weights(needed, table.embedding_dim, table.padding_idx)


class EosClassification(torch.nn.Module):
    """A BART-like ``...ForSequenceClassification``: ``forward(input_ids, attention_mask)`` ->
    ``{"logits"}`` of each row's last ``eos_token_id`` state, found by its position (the last token
    when a row has none, which transformers refuses) rather than by transformers' boolean mask,
    whose size torch.export cannot follow."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        last = torch.where(input_ids.eq(self.model.config.eos_token_id), positions, -1).amax(-1)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        return {"logits": self.model.classification_head(hidden[rows, last])}
