"""The decoder export: a transformers causal LM with its KV cache as inputs and outputs.

The model is wrapped in a module whose ``forward`` takes the cache as tensors, fills a
transformers ``DynamicCache`` with them, calls the model, and returns the logits and every
layer's cache after the call. torch.export captures that with dynamic batch, sequence and
past lengths; opreg exports it; the inputs and outputs are then named as ONNX Runtime GenAI
reads them (:data:`opreg.llm.LAYOUT`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from opreg.errors import ExportError, InvalidArgumentError, StreamingError
from opreg.exporter import OnnxProgram, OutputCheck
from opreg.exporter._capture import TRACING_LOCK
from opreg.exporter.diagnosis.compare import compare_output
from opreg.llm import _cache, _checkpoint, _genai, _lora, _lora_inputs, _meta, _optimum, _quantized
from opreg.llm._cache import BATCH, PAST, SEQUENCE, TOTAL, CacheTensor, KeyValueCache, LayerCache
from opreg.llm._capture import EXAMPLE, set_dims
from opreg.llm._compare import checked, runnable
from opreg.llm._family import Request
from opreg.llm._genai import text_config
from opreg.llm._layout import LAYOUT
from opreg.llm._lora import Adapter
from opreg.llm._lora_inputs import LoraInput
from opreg.llm._result import ExportedModel, SavedFolder
from opreg.llm._trimmed import export_step
from opreg.weights import Weights, bind, open_weights


@dataclasses.dataclass(frozen=True)
class DecoderLayout:
    """The shape of an exported decoder, as ``genai_config.json`` describes it.

    Fields:
        num_layers: layers.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads of the cache (fewer than the query heads with
            grouped-query attention; the cache holds them unrepeated).
        head_size: the last dim of the cache.
        hidden_size, vocab_size: the model's.
        position_ids: whether the decoder takes ``position_ids``.
        dtype: the cache's and logits' element type (``torch.float32``).
        layers: what each layer caches (:mod:`opreg.llm._cache`): a :class:`KeyValueCache`
            (``past_key_values.%d.key``/``.value`` in, ``present.%d.key``/``.value`` out) or a
            short convolution's :class:`~opreg.llm._cache.ConvState` (``past.%d.conv`` in,
            ``present.%d.conv`` out); by default keys and values of ``num_key_value_heads`` x
            ``head_size`` in every layer.
        lora: the linear layers that take LoRA adapters' ``A`` and ``B`` as inputs, after the
            cache (:mod:`opreg.llm._lora_inputs`); none by default.
        features: the base model's (transformers' ``AutoModel``): ``last_hidden_state`` out
            instead of ``logits``, and no cache in: a prefill returning its cache, as optimum-onnx
            0.1.0 writes ``feature-extraction-with-past`` (:attr:`opreg.llm.LLMSettings.features`).
    """

    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_size: int
    hidden_size: int
    vocab_size: int
    position_ids: bool
    dtype: torch.dtype
    layers: tuple[LayerCache, ...] = ()
    lora: tuple[LoraInput, ...] = ()
    features: bool = False

    def __post_init__(self) -> None:
        if not self.layers:
            every = (KeyValueCache(self.num_key_value_heads, self.head_size),) * self.num_layers
            object.__setattr__(self, "layers", every)
        if len(self.layers) != self.num_layers:
            raise ValueError(f"{len(self.layers)} layer kinds for {self.num_layers} layers")

    @property
    def cache(self) -> list[tuple[int, CacheTensor]]:
        """Every cache tensor with its layer, in the order of the decoder's inputs and outputs."""
        return [(index, tensor) for index, kind in enumerate(self.layers) for tensor in kind.tensors]

    @property
    def layer_types(self) -> list[str]:
        """Each layer's kind as ``genai_config.json`` names it (``full_attention``, ``conv``)."""
        return [kind.layer_type for kind in self.layers]

    @property
    def input_names(self) -> list[str]:
        names = [LAYOUT["input_ids"], LAYOUT["attention_mask"]]
        if self.position_ids:
            names.append(LAYOUT["position_ids"])
        if not self.features:
            names += [tensor.past % layer for layer, tensor in self.cache]
        return names + [name for slot in self.lora for name in slot.names]

    @property
    def output(self) -> str:
        """The first output's name, the transformers output's attribute it is: ``logits``, or
        ``last_hidden_state`` (:attr:`features`)."""
        return _optimum.FEATURES_OUTPUT if self.features else LAYOUT["logits"]

    @property
    def output_names(self) -> list[str]:
        return [self.output] + [tensor.present % layer for layer, tensor in self.cache]

    def empty_cache(self, batch: int) -> list[torch.Tensor]:
        """Every layer's cache for a prefill: no keys and values, zeros for a convolution's state
        (its left padding)."""
        return [torch.zeros(tensor.shape(batch, 0), dtype=self.dtype) for _, tensor in self.cache]

    def past_length(self, past: Sequence[torch.Tensor]) -> int:
        """The tokens before the new ones in ``past`` (the cache tensors, in order)."""
        for (_, tensor), value in zip(self.cache, past, strict=True):
            if tensor.grows:
                return int(value.shape[tensor.dims.index(PAST)])
        raise ValueError("the layout caches no keys and values")


def decoder_inputs(
    layout: DecoderLayout,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    past: Sequence[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The inputs of a decoder of ``layout`` for ``input_ids`` after ``past`` (default: none, a
    prefill): the mask all ones where not given (it covers past and new tokens), the position
    ids as transformers' ``generate`` makes them (a padding token counts no position). A
    :attr:`DecoderLayout.features` decoder takes no past (``past`` empty)."""
    batch, length = input_ids.shape
    past = list(past) if past is not None else layout.empty_cache(batch)
    if layout.features and layout.past_length(past):
        raise InvalidArgumentError("a decoder of the base model's features (features=True) takes no past")
    if attention_mask is None:
        attention_mask = torch.ones(batch, layout.past_length(past) + length, dtype=torch.int64)
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
    if layout.position_ids:
        positions = attention_mask.long().cumsum(-1) - 1
        inputs["position_ids"] = positions.masked_fill(attention_mask == 0, 1)[:, -length:].contiguous()
    if not layout.features:
        inputs["past_key_values"] = past
    if layout.lora:  # no adapter active: every A and B empty
        inputs["lora"] = [tensor for slot in layout.lora for tensor in slot.empty(layout.dtype)]
    return inputs


# -- the module torch.export captures -------------------------------------------------------


class DecoderStep(torch.nn.Module):
    """``model`` with its cache as tensors: ``forward(input_ids, attention_mask, position_ids,
    past_key_values)`` returns ``{"logits": ..., "present": [...]}``, the cache tensors in the
    order of ``layout.cache`` (key 0, value 0, key 1, ... for keys and values); a
    :attr:`DecoderLayout.features` one ``{"last_hidden_state": ..., "present": [...]}`` after an
    empty cache."""

    def __init__(self, model: torch.nn.Module, layout: DecoderLayout) -> None:
        super().__init__()
        self.model = model
        self.layers = layout.layers
        self.layout = layout
        self.lora: list[torch.Tensor] = []  # the LoRA inputs of the call, read by the adapted layers' hooks

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key_values: Sequence[torch.Tensor] = (),
        lora: Sequence[torch.Tensor] = (),
    ) -> dict[str, Any]:
        self.lora[:] = lora
        if self.layout.features:  # a prefill: every layer's cache empty, its length the new tokens'
            past_key_values = self.layout.empty_cache(input_ids.shape[0])
        cache = _cache.capture_cache(self.layers, past_key_values)
        extra = {} if position_ids is None else {"position_ids": position_ids}
        try:
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True, **extra
            )
        finally:
            self.lora.clear()  # no tensor left on the module after the call (torch.export would warn of it)
        output = self.layout.output
        return {output: getattr(out, output), "present": _cache.present(self.layers, cache)}


# -- the result ----------------------------------------------------------------------------


class Decoder(ExportedModel):
    """An exported causal LM: one decoder for prefill and decode (an :class:`opreg.llm.ExportedModel`).

    Attributes:
        program: the :class:`opreg.OnnxProgram` (inputs and outputs named as :data:`opreg.llm.LAYOUT`).
        layout: its :class:`DecoderLayout`.
        model: the transformers model it was exported from (on the ``meta`` device when its
            weights were streamed from the checkpoint).
        tokenizer: what :meth:`save` writes beside the model (a tokenizer, a folder holding one;
            ``None`` or ``False``: none).
        context_length: what ``genai_config.json`` allows GenAI to generate up to.
        precision: its weights' precision (``"fp32"``, ``"int8"``, ``"int4"``; a quantized
            checkpoint's: the bits it stores).
        stored_format: the quantized checkpoint's format written as it is stored (``"GPTQ"``, ...), else ``None``.
        folder: the checkpoint folder it came from, if any.
        folder_layout: the folder :meth:`save` writes (:attr:`opreg.llm.LLMSettings.layout`):
            ``"genai"`` or ``"optimum"`` (:mod:`opreg.llm._optimum`).
        adapters: the LoRA adapters its inputs take (:attr:`DecoderLayout.lora`), each written
            as ``<name>.onnx_adapter`` by :meth:`save`.
        merged: the LoRA adapter merged into its weights, if any (:meth:`eager` merges it too).
    """

    def __init__(
        self,
        program: OnnxProgram,
        layout: DecoderLayout,
        model: Any,
        tokenizer: Any,
        context_length: int,
        precision: str = "fp32",
        folder: Path | None = None,
        folder_layout: str = "genai",
        adapters: Sequence[Adapter] = (),
        merged: Adapter | None = None,
        stored_format: str | None = None,
    ) -> None:
        self.program = program
        self.stored_format = stored_format
        self.adapters = tuple(adapters)
        self.merged = merged
        self.layout = layout
        self.model = model
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.precision = precision
        self.folder = folder
        self.folder_layout = folder_layout
        self._eager: Any = None

    def __repr__(self) -> str:
        return f"<Decoder {type(self.model).__name__}, {self.layout.num_layers} layers, {self.program!r}>"

    @property
    def programs(self) -> dict[str, OnnxProgram]:
        """The folder's models by file name: the decoder."""
        return {_genai.MODEL_FILE: self.program}

    def inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past: Sequence[torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """The decoder's inputs for ``input_ids`` after ``past`` (see :func:`decoder_inputs`)."""
        return decoder_inputs(self.layout, input_ids, attention_mask, past)

    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The decoder in ONNX Runtime on :meth:`inputs`: ``{"logits": ..., "present": [...]}``."""
        return self.program.run(**inputs)

    def eager(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """What the transformers model computes for :meth:`inputs`, its cache a ``DynamicCache``
        holding the past (every layer keeps every position, as the decoder's do: a sliding-window
        layer's attention is limited by the mask, not by cutting its cache). A decoder streamed from
        its checkpoint loads the model, weights and all, for this (:func:`opreg.llm._meta.load_eager`)."""
        model = self.model
        if _meta.on_meta(model):  # streamed: loaded once, weights and all
            if self._eager is None:
                self._eager = _meta.load_eager(self.folder, model, self.layout.features)
                if self.merged is not None:
                    _lora.merge_in_memory(self.merged, self._eager)
            model = self._eager

        layers = self.layout.layers
        prefill = inputs["attention_mask"].shape[1] == inputs["input_ids"].shape[1]
        past = inputs.get("past_key_values", self.layout.empty_cache(inputs["input_ids"].shape[0]))
        cache = _cache.eager_cache(layers, past, prefill)
        extra = {"position_ids": inputs["position_ids"]} if self.layout.position_ids else {}
        with TRACING_LOCK, torch.no_grad():  # transformers reads torch's compiling flag, set while a thread captures
            out = model(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], past_key_values=cache,
                use_cache=True, **extra,
            )  # fmt: skip
        output = self.layout.output
        return {output: getattr(out, output), "present": _cache.present(layers, out.past_key_values, eager=True)}

    def verify(
        self,
        shapes: Iterable[tuple[int, int, int]] = ((1, 1, 0), (1, 7, 0), (3, 1, 5), (3, 7, 5)),
        *,
        left_padding: bool = True,
        rtol: float = 1e-4,
        atol: float = 1e-4,
        seed: int = 0,
    ) -> list[OutputCheck]:
        """Compare the decoder in ONNX Runtime with the transformers model on random tokens and
        caches of each ``(batch, sequence, past)`` in ``shapes``, and on a left-padded batch
        (positions of padding are not compared: the model may compute anything there). A model
        whose metadata says a batch of prompts after a cache runs one row at a time
        (``opreg.one_row_after_a_cache``: opreg-ort-contrib's GroupQueryAttention below ONNX Runtime 1.32) is
        checked on one row there; a :attr:`DecoderLayout.features` decoder, which takes no past, at
        each shape's batch and sequence after none. Raises :class:`opreg.VerificationError` listing
        what differs; returns every check."""
        shapes = runnable(self.program, shapes)
        if self.layout.features:
            shapes = list(dict.fromkeys((batch, length, 0) for batch, length, _ in shapes))
        generator = torch.Generator().manual_seed(seed)
        checks: list[OutputCheck] = []
        cases = [(f"batch {b}, sequence {s}, past {p}", self._random(b, s, p, generator)) for b, s, p in shapes]
        if left_padding:
            cases.append(("left padding", self._left_padded(generator)))
        names, first = self.layout.output_names, self.layout.output
        sequence_dims = [0] + [tensor.sequence_dim for _, tensor in self.layout.cache]  # logits, then the cache
        for label, (inputs, rows) in cases:
            got, expected = self.run(inputs), self.eager(inputs)
            pairs = zip(
                names, sequence_dims, [got[first], *got["present"]], [expected[first], *expected["present"]],
                strict=True,
            )  # fmt: skip
            for name, seq_dim, g, e in pairs:
                for row, (what, keep) in enumerate(rows):  # padding positions are not compared
                    mine, theirs = g[row], e[row]
                    if keep is not None and seq_dim is not None:
                        mine, theirs = mine.index_select(seq_dim, keep), theirs.index_select(seq_dim, keep)
                    checks.append(compare_output(f"{name} ({label}{what})", mine, theirs, rtol, atol))
        return checked(checks, "decoder", rtol, atol)

    def _random(self, batch: int, length: int, past: int, generator: torch.Generator) -> tuple[dict[str, Any], list]:
        """Random tokens after a random cache (after no tokens, the cache of a prefill); every row
        and position compared."""
        ids = torch.randint(0, self.layout.vocab_size, (batch, length), generator=generator)
        cache = self.layout.empty_cache(batch)
        if past:
            dtype = self.layout.dtype
            cache = [torch.randn(t.shape(batch, past), generator=generator).to(dtype) for _, t in self.layout.cache]
        return self.inputs(ids, past=cache), [(f", row {r}" if batch > 1 else "", None) for r in range(batch)]

    def _left_padded(self, generator: torch.Generator) -> tuple[dict[str, Any], list]:
        """A prefill of two rows, the second padded on the left by 3 tokens: its padding not compared."""
        ids = torch.randint(0, self.layout.vocab_size, (2, 6), generator=generator)
        mask = torch.ones(2, 6, dtype=torch.int64)
        mask[1, :3] = 0
        return self.inputs(ids, mask), [(", row 0", None), (", row 1's tokens", torch.arange(3, 6))]

    def genai_config(self) -> dict[str, Any]:
        """``genai_config.json`` for this decoder (see :mod:`opreg.llm._genai`)."""
        return _genai.config(self)

    def write_folder(self, folder: str | os.PathLike[str], external_data: bool) -> SavedFolder:
        """Write ``model.onnx`` (its weights in ``model.onnx.<token>.data`` beside it, unless
        ``external_data`` is false), ``genai_config.json`` and the tokenizer's files as ``folder``
        (:func:`opreg.llm._genai.save`), or for the optimum layout ``config.json`` and
        ``generation_config.json`` instead of ``genai_config.json`` (:func:`opreg.llm._optimum.save`)."""
        save = _optimum.save if self.folder_layout == "optimum" else _genai.save
        written, names = save(self, folder, external_data=external_data)
        return SavedFolder(written, tuple(names))


# -- exporting -----------------------------------------------------------------------------


def load(request: Request, adapter: Adapter | None = None) -> tuple[Any, Weights | None]:
    """The causal LM of ``request`` and, when its weights are streamed (``streaming``; ``None``:
    when the folder holds safetensors), the checkpoint's weights, the model then built on the
    ``meta`` device. A state-space or hybrid cache is refused from the config first, before any
    weight is read; a model loaded in memory is refused if weights are missing
    (:mod:`opreg.llm._checkpoint`; a streamed one when its weights are bound, before the capture).
    ``adapter``: a LoRA adapter merged into the weights (``adapter=``)."""
    config, folder = request.config, request.folder
    if folder is None:
        if adapter is not None:
            raise InvalidArgumentError(
                "adapter= merges an adapter into a checkpoint folder's weights as they are written: give the "
                "checkpoint folder, or merge it into the model given with PEFT (merge_and_unload)"
            )
        _checkpoint.check_cache(config, type(request.model).__name__)
        return request.model, None
    _checkpoint.check_cache(config, (getattr(config, "architectures", None) or [config.model_type])[0])
    streaming, features = request.settings.streaming, request.settings.features
    if streaming is None:
        streaming = _meta.streamable(folder)
    if streaming:
        meta_model, weights = _meta.load_meta(folder, features)
        if adapter is not None:  # W + scale * B @ A, computed as each weight is written
            _lora.check_against(adapter, meta_model)
            weights = weights.with_tensors(_lora.merged_weights(adapter, weights))
        bind(meta_model, weights)  # a missing weight refused now, by the checkpoint's name for it
        return meta_model, weights
    model = _checkpoint.load_weights(folder, features)
    if adapter is not None:
        _lora.check_against(adapter, model)
        _lora.merge_in_memory(adapter, model)
    return model, None


def layout_of(model: Any, features: bool = False, position_ids: bool | None = None) -> DecoderLayout:
    """Read the cache's layout from one eager call: what each layer stores, as the model stores it
    (``features``: a base model's, :attr:`DecoderLayout.features`); ``position_ids`` an input when
    the model's ``forward`` takes them, unless ``position_ids`` is false
    (:attr:`opreg.llm.LLMSettings.position_ids`; true: refused when it does not)."""
    text = text_config(model)
    output = _optimum.FEATURES_OUTPUT if features else LAYOUT["logits"]
    ids = torch.zeros(1, 2, dtype=torch.int64)
    # a model on meta computes shapes only: no mask, whose all-ones check would read a value
    mask = {} if _meta.on_meta(model) else {"attention_mask": torch.ones_like(ids)}
    try:
        with torch.no_grad():
            out = model(input_ids=ids.to(next(model.parameters()).device), use_cache=True, **mask)
    except Exception as e:
        error = StreamingError if _meta.on_meta(model) else ExportError
        raise error(f"{type(model).__name__} does not run on token ids: {type(e).__name__}: {e}") from e
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache_params", None)  # state-space models'
    layers, first = getattr(cache, "layers", None), getattr(out, output, None)
    if first is None or not layers:
        raise ExportError(
            f"{type(model).__name__} returns no {output} and key/value cache (transformers' Cache) with "
            "use_cache=True: export_decoder exports causal LMs with a key/value cache"
            + (" (features=True: their base models, transformers' AutoModel)" if features else "")
        )
    name = type(model).__name__
    kinds = tuple(_cache.of_layer(layer, index, name) for index, layer in enumerate(layers))
    shapes = sorted({(kind.kv_heads, kind.head_size) for kind in kinds if isinstance(kind, KeyValueCache)})
    if len(shapes) != 1:
        raise ExportError(
            f"{name}'s layers cache keys and values of {len(shapes)} shapes {shapes}: ONNX Runtime GenAI needs one "
            "(heads, head size) for every attention layer"
        )
    ((kv_heads, head_size),) = shapes
    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    if position_ids and not takes_positions:
        raise ExportError(f"{name}'s forward takes no position_ids: leave position_ids=True out")
    takes_positions = takes_positions and position_ids is not False
    return DecoderLayout(
        num_layers=len(layers),
        num_attention_heads=int(getattr(text, "num_attention_heads", kv_heads)),
        num_key_value_heads=kv_heads,
        head_size=head_size,
        hidden_size=int(getattr(text, "hidden_size", 0)),
        vocab_size=int(getattr(text, "vocab_size", 0)) if features else int(first.shape[-1]),
        position_ids=takes_positions,
        dtype=first.dtype,
        layers=kinds,
        features=features,
    )


def export(request: Request) -> Decoder:
    """The causal LM's export (:data:`opreg.llm._families.CAUSAL`): the model captured as one
    decoder, its cache as inputs and outputs, every length dynamic and bounded by the context."""
    stored = _quantized.scheme_of(request.config, str(request.folder)) if request.folder is not None else None
    rounded = request.settings.int4_algo == "gptq"
    named = f"{request.folder} ({stored.name})" if stored is not None else "GPTQ blocks" if rounded else None
    settings = request.quantized(stored=named)
    merged = None if request.settings.adapter is None else _lora.read_adapter(request.settings.adapter)
    adapters = [_lora.read_adapter(folder) for folder in request.settings.adapters or ()]
    model, streamed = load(request, merged)
    if rounded:
        streamed = calibrated(request, streamed, merged)
    for adapter in adapters:
        _lora.check_against(adapter, model)
    if settings.weights is not None:  # a meta model of the caller's, and its checkpoint
        streamed = open_weights(settings.weights)
    context_length = request.settings.context_length
    was_training = model.training
    model.eval()
    try:
        layout = layout_of(model, request.settings.features, request.settings.position_ids)
        layout = dataclasses.replace(layout, lora=_lora_inputs.lora_inputs(adapters, model))
        if request.settings.layout == "optimum":
            _optimum.check_layers(layout, type(model).__name__)
        step = DecoderStep(model, layout).eval()
        batch, length, past = EXAMPLE
        past = 0 if layout.features else past  # a prefill: no cache in
        drawn = torch.Generator().manual_seed(0)  # not the process's generator: the user's draws stay theirs
        example = decoder_inputs(
            layout,
            torch.randint(0, layout.vocab_size, (batch, length), generator=drawn),
            past=[
                torch.randn(tensor.shape(batch, past), dtype=layout.dtype, generator=drawn)
                for _, tensor in layout.cache
            ],
        )
        if layout.lora:
            example["lora"] = _lora_inputs.example(layout.lora, layout.dtype, drawn)
        shapes = _dynamic_shapes(layout, context_length)
        weights = None if streamed is None else streamed.renamed("model.")  # DecoderStep's names
        settings = dataclasses.replace(settings, dynamic_shapes=shapes, weights=weights)
        with _lora_inputs.hooked(model, layout.lora, step.lora):
            program = export_step(step, example, settings, layout)
    finally:
        model.train(was_training)
    total = _optimum.TOTAL if request.settings.layout == "optimum" else TOTAL
    _name(program, layout, total)
    _lora_inputs.add_defaults(program.model.graph, layout.lora)
    precision = request.settings.precision if stored is None else f"int{stored.bits}"  # what its layers store
    return Decoder(program, layout, model, request.settings.tokenizer, context_length, precision=precision,
                   folder=request.folder, folder_layout=request.settings.layout, adapters=adapters, merged=merged,
                   stored_format=None if stored is None else stored.name)  # fmt: skip


def calibrated(request: Request, streamed: Weights | None, merged: Adapter | None) -> Weights:
    """The streamed weights with each linear layer's replaced by its GPTQ blocks (``int4_algo='gptq'``,
    :mod:`opreg.llm._gptq`), calibrated on the checkpoint's float model, loaded for it and dropped."""
    from opreg.llm import _gptq

    if streamed is None:
        raise InvalidArgumentError(
            "int4_algo='gptq' rounds the weights of a checkpoint folder streamed as it is written: give the "
            "checkpoint folder (of safetensors) rather than a model"
        )
    model = _checkpoint.load_weights(request.folder)
    if merged is not None:
        _lora.merge_in_memory(merged, model)
    block_size = request.settings.block_size or _gptq.BLOCK_SIZE
    return _gptq.gptq_weights(model.eval(), streamed, block_size)


def _dynamic_shapes(layout: DecoderLayout, context_length: int) -> dict[str, Any]:
    """Batch, sequence and past length dynamic; the lengths bounded by the context GenAI is
    allowed (packs may size tables by a dim's bound: a rotary table in a fused attention)."""
    Dim = torch.export.Dim
    bound = max(context_length, EXAMPLE[1] + EXAMPLE[2])
    # no past: one token short of the positions (a model may special-case a prompt filling them, MPT's ALiBi slice)
    longest = bound - 1 if layout.features else bound
    batch, length, past = Dim(BATCH), Dim(SEQUENCE, max=longest), Dim(PAST, max=bound)
    # the mask covers past and new tokens: torch.export derives it from the model's own checks (no past: the new)
    mask = length if layout.features else Dim.AUTO
    shapes: dict[str, Any] = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: mask}}
    if layout.position_ids:
        shapes["position_ids"] = {0: batch, 1: length}
    if not layout.features:
        shapes["past_key_values"] = [
            {index: {BATCH: batch, PAST: past}[dim] for index, dim in enumerate(tensor.dims) if isinstance(dim, str)}
            for _, tensor in layout.cache
        ]
    if layout.lora:
        shapes["lora"] = _lora_inputs.dynamic_shapes(layout.lora)
    return shapes


def _name(program: OnnxProgram, layout: DecoderLayout, total: str = TOTAL) -> None:
    """Name the inputs, outputs and their dims as ONNX Runtime GenAI reads them (past and new tokens
    together ``total``: optimum names them ``past_sequence_length + sequence_length``), and refuse a
    decoder whose lengths torch.export fixed."""
    program.rename(dict(zip(program.input_names, layout.input_names, strict=True)))
    program.rename(dict(zip(program.output_names, layout.output_names, strict=True)))
    graph = program.model.graph

    def named(dims: Iterable[Any]) -> tuple[str | None, ...]:
        return tuple((total if dim == TOTAL else dim) if isinstance(dim, str) else None for dim in dims)

    mask = (BATCH, SEQUENCE) if layout.features else named((BATCH, TOTAL))  # no past: the new tokens' mask
    dims = {LAYOUT["input_ids"]: (BATCH, SEQUENCE), LAYOUT["attention_mask"]: mask}
    if layout.position_ids:
        dims[LAYOUT["position_ids"]] = (BATCH, SEQUENCE)
    for layer, tensor in layout.cache:
        dims[tensor.past % layer] = named(tensor.dims)
        dims[tensor.present % layer] = named(tensor.present_dims)
    dims[layout.output] = (BATCH, SEQUENCE, None)
    dims.update(_lora_inputs.dims(layout.lora))
    for value in [*graph.inputs, *graph.outputs]:
        set_dims(value, dims[value.name])
