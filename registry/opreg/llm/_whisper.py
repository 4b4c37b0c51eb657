"""Whisper for ONNX Runtime GenAI: an encoder and a decoder, in the layout GenAI's builder writes.

- The encoder (``encoder.onnx``) takes the log-mel features and returns the encoder's hidden
  states and, per decoder layer, the cross-attention keys and values computed from them once
  (the decoder layer's own ``k_proj``/``v_proj``, split into heads: BNSH).
- The decoder (``decoder.onnx``) takes the tokens, each layer's self-attention cache and the
  cross-attention keys and values, and returns the logits and the self-attention cache with
  this call's keys and values appended. Its positions follow from the past's length, as
  transformers' decoder computes them.

Both are captured with torch.export from modules that call the transformers model's own parts:
the encoder, and the decoder with a transformers ``EncoderDecoderCache`` whose cross-attention
half holds the keys and values given (marked as computed, so the decoder reads them instead of
projecting the encoder's output again).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.exporter import OnnxProgram, OutputCheck
from opreg.exporter._capture import TRACING_LOCK
from opreg.exporter.diagnosis.compare import compare_output
from opreg.llm import _layers, _whisper_genai
from opreg.llm._cache import BATCH, PAST, SEQUENCE, TOTAL, layer_names, past_cache, past_layer_class, presents
from opreg.llm._capture import EXAMPLE, evaluating, set_dims
from opreg.llm._compare import checked, compare_all, runnable
from opreg.llm._family import Request
from opreg.llm._precision import check_quantized
from opreg.llm._result import ExportedModel, SavedFolder
from opreg.llm._whisper_genai import DECODER_FILE, ENCODER_FILE, WHISPER_LAYOUT
from opreg.settings import ExportSettings

ENCODER_SEQUENCE = "encoder_sequence_length"
"""The dim name of the cross-attention keys' and values' length (half the audio frames)."""


@dataclasses.dataclass(frozen=True)
class WhisperLayout:
    """The shapes of an exported Whisper, as ``genai_config.json`` describes them.

    Fields:
        encoder_layers, encoder_heads: the encoder's layers and attention heads.
        num_layers: decoder layers, each with a self-attention cache (in and out) and cross-attention
            keys and values (in).
        num_heads: the decoder's attention heads (keys and values have as many).
        head_size: the last dim of every cache.
        hidden_size, vocab_size: the model's ``d_model`` and vocabulary.
        num_mel_bins, num_frames: the features' shape, ``[batch, num_mel_bins, num_frames]``
            (Whisper's encoder takes 30 s: ``2 * max_source_positions`` frames).
        max_target_positions: the decoder's longest sequence (its table of positions).
        dtype: the features', caches' and logits' element type.
    """

    encoder_layers: int
    encoder_heads: int
    num_layers: int
    num_heads: int
    head_size: int
    hidden_size: int
    vocab_size: int
    num_mel_bins: int
    num_frames: int
    max_target_positions: int
    dtype: torch.dtype

    @property
    def encoder_output_names(self) -> list[str]:
        cross = layer_names(WHISPER_LAYOUT["cross_present_key"], WHISPER_LAYOUT["cross_present_value"], self.num_layers)
        return [WHISPER_LAYOUT["encoder_hidden_states"], *cross]

    @property
    def decoder_input_names(self) -> list[str]:
        past = layer_names(WHISPER_LAYOUT["past_key"], WHISPER_LAYOUT["past_value"], self.num_layers)
        cross = layer_names(WHISPER_LAYOUT["cross_past_key"], WHISPER_LAYOUT["cross_past_value"], self.num_layers)
        return [WHISPER_LAYOUT["input_ids"], *past, *cross]

    @property
    def decoder_output_names(self) -> list[str]:
        present = layer_names(WHISPER_LAYOUT["present_key"], WHISPER_LAYOUT["present_value"], self.num_layers)
        return [WHISPER_LAYOUT["logits"], *present]

    def cache(self, batch: int, length: int, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        """Every layer's key and value of ``length`` positions: zeros, or random with ``generator``."""
        shape = (batch, self.num_heads, length, self.head_size)
        if generator is None:
            return [torch.zeros(shape, dtype=self.dtype) for _ in range(2 * self.num_layers)]
        return [torch.randn(shape, generator=generator).to(self.dtype) for _ in range(2 * self.num_layers)]


def layout_of(model: Any) -> WhisperLayout:
    """The layout of a transformers ``WhisperForConditionalGeneration``."""
    config = model.config
    encoder, decoder = getattr(getattr(model, "model", None), "encoder", None), getattr(model, "model", None)
    if encoder is None or not hasattr(decoder, "decoder") or not hasattr(model, "proj_out"):
        raise ExportError(
            f"{type(model).__name__} has no encoder, decoder and proj_out: export_whisper exports a transformers "
            "WhisperForConditionalGeneration"
        )
    heads = int(config.decoder_attention_heads)
    strides = encoder.conv1.stride[0] * encoder.conv2.stride[0]
    return WhisperLayout(
        encoder_layers=int(config.encoder_layers),
        encoder_heads=int(config.encoder_attention_heads),
        num_layers=int(config.decoder_layers),
        num_heads=heads,
        head_size=int(config.d_model) // heads,
        hidden_size=int(config.d_model),
        vocab_size=int(model.proj_out.out_features),
        num_mel_bins=int(config.num_mel_bins),
        num_frames=int(config.max_source_positions) * strides,
        max_target_positions=int(config.max_target_positions),
        dtype=model.proj_out.weight.dtype,
    )


# -- the modules torch.export captures ---------------------------------------------------------


class EncoderStep(torch.nn.Module):
    """``forward(audio_features)`` returns ``{"hidden_states": ..., "cross": [key 0, value 0, ...]}``:
    the encoder's output and each decoder layer's cross-attention keys and values of it (BNSH)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio_features: torch.Tensor) -> dict[str, Any]:
        hidden = self.model.model.encoder(input_features=audio_features).last_hidden_state
        return {"hidden_states": hidden, "cross": cross_keys_values(self.model, hidden)}


def cross_keys_values(model: Any, hidden: torch.Tensor) -> list[torch.Tensor]:
    """Each decoder layer's cross-attention keys and values of the encoder output ``hidden``, split
    into heads as the layer's attention splits them: ``[batch, heads, frames, head_size]``."""
    cross = []
    for layer in model.model.decoder.layers:
        attention = layer.encoder_attn
        shape = (hidden.shape[0], hidden.shape[1], -1, attention.head_dim)
        cross += [
            attention.k_proj(hidden).view(shape).transpose(1, 2),
            attention.v_proj(hidden).view(shape).transpose(1, 2),
        ]
    return cross


class DecoderStep(torch.nn.Module):
    """``forward(input_ids, past, cross)`` returns ``{"logits": ..., "present": [key 0, value 0, ...]}``:
    the decoder after ``past`` (each layer's self-attention keys and values) with the
    cross-attention keys and values ``cross``."""

    def __init__(self, model: torch.nn.Module, num_layers: int) -> None:
        super().__init__()
        self.model = model
        self.num_layers = num_layers
        self._layer = past_layer_class()

    def forward(
        self, input_ids: torch.Tensor, past: Sequence[torch.Tensor], cross: Sequence[torch.Tensor]
    ) -> dict[str, Any]:
        from transformers import EncoderDecoderCache

        caches = [past_cache(self._layer, pairs, self.num_layers) for pairs in (past, cross)]
        cache = EncoderDecoderCache(*caches)
        for layer in range(self.num_layers):
            cache.is_updated[layer] = True  # the cross-attention reads the keys and values given
        encoder = cross[0].new_zeros(cross[0].shape[0], 1, self.model.config.d_model)  # given, never read
        out = self.model.model.decoder(
            input_ids=input_ids, encoder_hidden_states=encoder, past_key_values=cache, use_cache=True
        )
        return {"logits": self.model.proj_out(out.last_hidden_state), "present": presents(caches[0])}


# -- the result ----------------------------------------------------------------------------------


class Whisper(ExportedModel):
    """An exported Whisper: an encoder and a decoder (an :class:`opreg.llm.ExportedModel`).

    Attributes:
        encoder: the encoder's :class:`opreg.OnnxProgram` (``audio_features`` in; hidden states and
            cross-attention keys and values out, named as :data:`opreg.llm.WHISPER_LAYOUT`).
        decoder: the decoder's :class:`opreg.OnnxProgram`.
        layout: their :class:`WhisperLayout`.
        model: the transformers model they were exported from.
        tokenizer, feature_extractor: what :meth:`save` writes beside them (either may be ``None``).
        context_length: the longest sequence GenAI may generate.
        precision: the weights' precision (``"fp32"``, ``"int4"``, ...).
    """

    def __init__(
        self,
        encoder: OnnxProgram,
        decoder: OnnxProgram,
        layout: WhisperLayout,
        model: Any,
        *,
        tokenizer: Any = None,
        feature_extractor: Any = None,
        context_length: int,
        precision: str = "fp32",
    ) -> None:
        self.encoder, self.decoder, self.layout, self.model = encoder, decoder, layout, model
        self.tokenizer, self.feature_extractor = tokenizer, feature_extractor
        self.context_length, self.precision = context_length, precision

    def __repr__(self) -> str:
        return f"<Whisper {type(self.model).__name__}, {self.layout.num_layers} decoder layers, {self.precision}>"

    @property
    def programs(self) -> dict[str, OnnxProgram]:
        """The folder's models by file name."""
        return {ENCODER_FILE: self.encoder, DECODER_FILE: self.decoder}

    def encode(self, features: torch.Tensor) -> dict[str, Any]:
        """The encoder in ONNX Runtime: ``{"hidden_states": ..., "cross": [...]}``."""
        return self.encoder.run(features)

    def decode(self, input_ids: torch.Tensor, past: Sequence[torch.Tensor], cross: Sequence[torch.Tensor]) -> Any:
        """The decoder in ONNX Runtime: ``{"logits": ..., "present": [...]}``."""
        return self.decoder.run(input_ids, list(past), list(cross))

    def eager_encode(self, features: torch.Tensor) -> dict[str, Any]:
        """What transformers computes for :meth:`encode`."""
        with TRACING_LOCK, torch.no_grad():
            hidden = self.model.model.encoder(input_features=features).last_hidden_state
            return {"hidden_states": hidden, "cross": cross_keys_values(self.model, hidden)}

    def eager_decode(
        self, input_ids: torch.Tensor, past: Sequence[torch.Tensor], cross: Sequence[torch.Tensor]
    ) -> dict[str, Any]:
        """What transformers computes for :meth:`decode`: its decoder with an ``EncoderDecoderCache``
        holding ``past`` and ``cross`` as transformers builds one."""
        from transformers import DynamicCache, EncoderDecoderCache

        layers = range(self.layout.num_layers)
        mine = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in layers]) if past[0].shape[2] else DynamicCache()
        cache = EncoderDecoderCache(mine, DynamicCache([(cross[2 * i], cross[2 * i + 1]) for i in layers]))
        encoder = torch.zeros(input_ids.shape[0], 1, self.layout.hidden_size, dtype=self.layout.dtype)
        with TRACING_LOCK, torch.no_grad():
            out = self.model.model.decoder(
                input_ids=input_ids, encoder_hidden_states=encoder, past_key_values=cache, use_cache=True
            )
            logits = self.model.proj_out(out.last_hidden_state)
        return {"logits": logits, "present": presents(out.past_key_values.self_attention_cache)}

    def verify(
        self,
        shapes: Iterable[tuple[int, int, int]] = ((1, 1, 0), (1, 4, 0), (3, 1, 5), (3, 7, 5)),
        *,
        rtol: float = 1e-4,
        atol: float = 1e-4,
        seed: int = 0,
    ) -> list[OutputCheck]:
        """Compare with transformers: the encoder on random features (batch 1 and 2), the decoder on
        random tokens, caches and cross-attention keys and values of each ``(batch, sequence,
        past)`` in ``shapes``, and the whole model (features to a prefill's logits). Raises
        :class:`opreg.VerificationError` listing what differs; returns every check."""
        generator = torch.Generator().manual_seed(seed)
        layout, checks = self.layout, []
        for batch in (1, 2):
            features = torch.randn(batch, layout.num_mel_bins, layout.num_frames, generator=generator)
            checks += _compare(f"batch {batch}", layout.encoder_output_names, self.encode(features),
                               self.eager_encode(features), "hidden_states", "cross", rtol, atol)  # fmt: skip
        frames = layout.num_frames // 2
        for batch, length, past in runnable(self.decoder, shapes):
            ids = torch.randint(0, layout.vocab_size, (batch, length), generator=generator)
            cache, cross = layout.cache(batch, past, generator), layout.cache(batch, frames, generator)
            label = f"batch {batch}, sequence {length}, past {past}"
            checks += _compare(label, layout.decoder_output_names, self.decode(ids, cache, cross),
                               self.eager_decode(ids, cache, cross), "logits", "present", rtol, atol)  # fmt: skip
        checks.append(self._whole(generator, rtol, atol))
        return checked(checks, "Whisper", rtol, atol)

    def _whole(self, generator: torch.Generator, rtol: float, atol: float) -> OutputCheck:
        """Features of two rows through the encoder, then a 4-token prefill, against transformers'
        forward of the whole model."""
        layout = self.layout
        features = torch.randn(2, layout.num_mel_bins, layout.num_frames, generator=generator)
        ids = torch.randint(0, layout.vocab_size, (2, 4), generator=generator)
        logits = self.decode(ids, layout.cache(2, 0), self.encode(features)["cross"])["logits"]
        with TRACING_LOCK, torch.no_grad():
            expected = self.model(input_features=features, decoder_input_ids=ids).logits
        return compare_output("logits (features to a prefill, batch 2)", logits, expected, rtol, atol)

    def genai_config(self) -> dict[str, Any]:
        """``genai_config.json`` for this model (see :mod:`opreg.llm._whisper_genai`)."""
        return _whisper_genai.config(self)

    def write_folder(self, folder: str | os.PathLike[str], external_data: bool) -> SavedFolder:
        """Write ``encoder.onnx``, ``decoder.onnx``, ``genai_config.json``,
        ``audio_processor_config.json``, the tokenizer's and feature extractor's files (the weights
        in a side file per model unless ``external_data`` is false: three times faster to write)."""
        written, names = _whisper_genai.save(self, folder, external_data)
        return SavedFolder(written, tuple(names))


def _compare(
    label: str, names: list[str], got: Any, expected: Any, first: str, rest: str, rtol: float, atol: float
) -> list[OutputCheck]:
    """One check per output: ``got[first]`` then each of ``got[rest]``, named ``names``."""
    return compare_all(label, names, [got[first], *got[rest]], [expected[first], *expected[rest]], rtol, atol)


# -- exporting -------------------------------------------------------------------------------------


def export(request: Request) -> Whisper:
    """Whisper's export (:data:`opreg.llm._families.WHISPER`): the encoder and the decoder."""
    settings = request.quantized()
    model = request.load()
    layout = layout_of(model)
    options = request.settings
    with evaluating(model):
        encoder = _export_encoder(model, layout, settings)
        decoder = _export_decoder(model, layout, settings)
    check_quantized(encoder, options.precision, "encoder")
    check_quantized(decoder, options.precision, "decoder")
    extractor = options.feature_extractor if options.feature_extractor is not None else request.folder
    return Whisper(encoder, decoder, layout, model, tokenizer=options.tokenizer, feature_extractor=extractor,
                   context_length=options.context_length, precision=options.precision)  # fmt: skip


def _export_encoder(model: Any, layout: WhisperLayout, settings: ExportSettings) -> OnnxProgram:
    """The encoder, batch dynamic (the frames are fixed: Whisper's encoder takes 30 s)."""
    features = torch.randn(EXAMPLE[0], layout.num_mel_bins, layout.num_frames, dtype=layout.dtype)
    dims = {"audio_features": {0: torch.export.Dim(BATCH)}}
    plan = _layers.plan_layers(model, layout.encoder_layers, path="model.encoder.layers", hidden_only=True)
    settings = dataclasses.replace(settings, dynamic_shapes=dims)
    program = _layers.export_repeated(EncoderStep(model).eval(), (features,), None, settings, plan, "the encoder")
    program.rename({program.input_names[0]: WHISPER_LAYOUT["audio_features"]})
    program.rename(dict(zip(program.output_names, layout.encoder_output_names, strict=True)))
    graph = program.model.graph
    set_dims(graph.inputs[0], (BATCH, None, None))
    set_dims(graph.outputs[0], (BATCH, None, None))
    for value in graph.outputs[1:]:
        set_dims(value, (BATCH, None, None, None))
    return program


def _export_decoder(model: Any, layout: WhisperLayout, settings: ExportSettings) -> OnnxProgram:
    """The decoder: batch, sequence, past and encoder length dynamic; the lengths bounded by the
    decoder's table of positions."""
    Dim = torch.export.Dim
    batch, length, past = EXAMPLE
    bound = max(layout.max_target_positions, length + past)
    dims = {
        "input_ids": {0: Dim(BATCH), 1: Dim(SEQUENCE, max=bound)},
        "past": [{0: Dim(BATCH), 2: Dim(PAST, max=bound)}] * (2 * layout.num_layers),
        "cross": [{0: Dim(BATCH), 2: Dim(ENCODER_SEQUENCE)}] * (2 * layout.num_layers),
    }
    ids = torch.randint(0, layout.vocab_size, (batch, length))
    example = (ids, layout.cache(batch, past), layout.cache(batch, layout.num_frames // 2))
    own = functools.partial(_decoder_slots, layout.num_layers)
    plan = _layers.plan_layers(model, layout.num_layers, path="model.decoder.layers", own=own, hidden_only=True)
    step = DecoderStep(model, layout.num_layers).eval()
    settings = dataclasses.replace(settings, dynamic_shapes=dims)
    program = _layers.export_repeated(step, example, None, settings, plan, "the decoder")
    program.rename(dict(zip(program.input_names, layout.decoder_input_names, strict=True)))
    program.rename(dict(zip(program.output_names, layout.decoder_output_names, strict=True)))
    graph = program.model.graph
    set_dims(graph.inputs[0], (BATCH, SEQUENCE))
    for value in graph.inputs[1:]:
        cross = value.name.startswith("past_key_cross") or value.name.startswith("past_value_cross")
        set_dims(value, (BATCH, None, ENCODER_SEQUENCE if cross else PAST, None))
    set_dims(graph.outputs[0], (BATCH, SEQUENCE, None))
    for value in graph.outputs[1:]:
        set_dims(value, (BATCH, None, TOTAL, None))
    return program


def _decoder_slots(num_layers: int, layer: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Decoder layer ``layer``'s own inputs (its past key and value, its cross-attention key and
    value) and outputs (its present key and value), by index: the inputs are ``input_ids``, every
    layer's past, every layer's cross-attention (:attr:`WhisperLayout.decoder_input_names`)."""
    past, cross = 1 + 2 * layer, 1 + 2 * num_layers + 2 * layer
    return (past, past + 1, cross, cross + 1), (1 + 2 * layer, 2 + 2 * layer)
