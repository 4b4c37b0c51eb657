"""Vision-language models for ONNX Runtime GenAI: three models, as GenAI's multimodal pipeline runs them.

- The vision encoder (``vision.onnx``) takes the pixels its image processor makes and returns
  the image features, already projected into the language model's hidden size.
- The embedding model (``embedding.onnx``) takes the prompt's token ids and the image features
  and returns the language model's input embeddings: the tokens' embeddings, each image token's
  replaced by the next image feature (none are left for a decode step: it gets no features).
- The decoder (``model.onnx``) is the language model on those embeddings, with its KV cache as
  inputs and outputs in :data:`opreg.llm.LAYOUT`'s names and layout; it also takes the token ids
  where the architecture reads them (Gemma-3 lets an image's tokens see each other).

Each is captured with torch.export from a module calling the transformers model's own parts
(``get_image_features``, ``get_input_embeddings``, its ``forward`` on ``inputs_embeds``); what
differs between architectures is in :mod:`opreg.llm._vision_models`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch

from opreg.exporter import OnnxProgram, OutputCheck
from opreg.exporter._capture import TRACING_LOCK
from opreg.llm import _cache, _layers, _vision_genai, _vision_verify
from opreg.llm._cache import BATCH, PAST, SEQUENCE, TOTAL
from opreg.llm._capture import EXAMPLE, evaluating, export_shaped, set_dims
from opreg.llm._compare import checked
from opreg.llm._decoder import DecoderLayout, layout_of
from opreg.llm._family import Request
from opreg.llm._layout import LAYOUT
from opreg.llm._precision import check_quantized
from opreg.llm._result import ExportedModel, SavedFolder
from opreg.llm._vision_genai import DECODER_FILE, EMBEDDING_FILE, VISION_FILE
from opreg.llm._vision_models import architecture_of
from opreg.settings import ExportSettings

IMAGE_TOKENS = "num_image_tokens"


# -- the modules torch.export captures ---------------------------------------------------------


class VisionStep(torch.nn.Module):
    """``forward(pixel_values, image_grid_thw=None)``: the image features, as the architecture
    computes them (``image_grid_thw``: each image's patches, where the architecture takes them)."""

    def __init__(self, model: torch.nn.Module, architecture: Any) -> None:
        super().__init__()
        self.model, self.architecture = model, architecture

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor | None = None) -> torch.Tensor:
        grid = () if image_grid_thw is None else (image_grid_thw,)
        return self.architecture.captured_features(self.model, pixel_values, *grid)


class EmbeddingStep(torch.nn.Module):
    """``forward(input_ids, image_features)``: the tokens' embeddings with each image token's
    replaced, in order, by a row of ``image_features`` (of any leading shape; none for a decode step)."""

    def __init__(self, model: torch.nn.Module, architecture: Any) -> None:
        super().__init__()
        self.model, self.architecture = model, architecture

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        return merge_images(self.model, input_ids, image_features, self.architecture)


def merge_images(model: Any, input_ids: torch.Tensor, features: torch.Tensor, architecture: Any) -> torch.Tensor:
    """What the transformers model does before its language model: embed the tokens, then scatter
    the image features over the image tokens' embeddings (``masked_scatter``)."""
    embeds = architecture.token_embeddings(model, input_ids)
    mask = (input_ids == architecture.image_token_id(model)).unsqueeze(-1).expand_as(embeds)
    return embeds.masked_scatter(mask, features.reshape(-1, embeds.shape[-1]).to(embeds.dtype))


class DecoderStep(torch.nn.Module):
    """``forward(inputs_embeds, attention_mask, position_ids, past, input_ids=None)``: the language
    model on ``inputs_embeds`` after ``past`` (each layer's cache, in the order of ``layout.cache``),
    returning ``{"logits": ..., "present": [...]}``; ``input_ids`` are given where the architecture reads them."""

    def __init__(self, model: torch.nn.Module, layout: DecoderLayout, architecture: Any) -> None:
        super().__init__()
        self.model, self.layers, self.architecture = model, layout.layers, architecture

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: Sequence[torch.Tensor],
        input_ids: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        cache = _cache.capture_cache(self.layers, past)
        logits = self.architecture.decoder_logits(
            self.model, inputs_embeds, input_ids, capturing=True, attention_mask=attention_mask,
            position_ids=position_ids, past_key_values=cache, use_cache=True,
        )  # fmt: skip
        return {"logits": logits, "present": _cache.present(self.layers, cache)}


# -- the result -------------------------------------------------------------------------------------


class VisionLanguage(ExportedModel):
    """An exported vision-language model: a vision encoder, an embedding model and a decoder (an
    :class:`opreg.llm.ExportedModel`).

    Attributes:
        vision, embedding, decoder: the three :class:`opreg.OnnxProgram` (named as GenAI reads them).
        program: the decoder (as :class:`opreg.llm.Decoder` names it).
        layout: the language model's :class:`opreg.llm.DecoderLayout`.
        architecture: what differs by architecture (:mod:`opreg.llm._vision_models`).
        model: the transformers model they were exported from.
        tokenizer, image_processor: what :meth:`save` writes beside them (either may be ``None``).
        context_length, precision: the longest sequence GenAI may generate; the weights' precision.
    """

    def __init__(self, programs: Sequence[OnnxProgram], layout: DecoderLayout, architecture: Any, model: Any,
                 **attributes: Any) -> None:  # fmt: skip
        self.vision, self.embedding, self.decoder = programs
        self.layout, self.architecture, self.model = layout, architecture, model
        self.tokenizer = attributes.get("tokenizer")
        self.image_processor = attributes.get("image_processor")
        self.context_length: int = attributes["context_length"]
        self.precision: str = attributes.get("precision", "fp32")

    def __repr__(self) -> str:
        return f"<VisionLanguage {type(self.model).__name__}, {self.layout.num_layers} layers, {self.precision}>"

    @property
    def program(self) -> OnnxProgram:
        return self.decoder

    @property
    def programs(self) -> dict[str, OnnxProgram]:
        """The folder's models by file name."""
        return {VISION_FILE: self.vision, EMBEDDING_FILE: self.embedding, DECODER_FILE: self.decoder}

    @property
    def image_token_id(self) -> int:
        return self.architecture.image_token_id(self.model)

    def eager_vision(self, *pixels: torch.Tensor) -> torch.Tensor:
        with TRACING_LOCK, torch.no_grad():
            return self.architecture.image_features(self.model, *pixels)

    def eager_embedding(self, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        with TRACING_LOCK, torch.no_grad():
            return merge_images(self.model, input_ids, features, self.architecture)

    def eager_decoder(self, input_ids: torch.Tensor, embeds: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                      past: Sequence[torch.Tensor]) -> dict[str, Any]:  # fmt: skip
        """What transformers computes for the decoder: the model's forward on the embeddings, its
        cache transformers' own layers holding ``past`` (empty for a prefill)."""
        layers = self.layout.layers
        cache = _cache.eager_cache(layers, past, prefill=self.layout.past_length(past) == 0)
        with TRACING_LOCK, torch.no_grad():
            logits = self.architecture.decoder_logits(self.model, embeds, input_ids, capturing=False,
                                                      attention_mask=mask, position_ids=positions,
                                                      past_key_values=cache, use_cache=True)  # fmt: skip
        return {"logits": logits, "present": _cache.present(layers, cache, eager=True)}

    def verify(self, *, rtol: float = 1e-4, atol: float = 1e-4, seed: int = 0) -> list[OutputCheck]:
        """Compare each model with transformers (:mod:`opreg.llm._vision_verify`), and the three
        together (pixels and a prompt to a prefill's logits) with the model's own forward. Raises
        :class:`opreg.VerificationError` listing what differs; returns every check."""
        return checked(
            _vision_verify.checks(self, torch.Generator().manual_seed(seed), rtol, atol), "model", rtol, atol
        )

    def generate(self, input_ids: torch.Tensor, pixels: Sequence[torch.Tensor], length: int) -> list[int]:
        """Greedy generation in plain ONNX Runtime (the three models in the order GenAI runs them):
        ``input_ids`` (one row, image tokens already expanded) and the vision encoder's inputs; the
        prompt and what follows, ``length`` tokens in all."""
        return _vision_verify.greedy(self, input_ids, pixels, length)

    def genai_config(self) -> dict[str, Any]:
        """``genai_config.json`` for these models (see :mod:`opreg.llm._vision_genai`)."""
        return _vision_genai.config(self)

    def write_folder(self, folder: str | os.PathLike[str], external_data: bool) -> SavedFolder:
        """Write ``vision.onnx``, ``embedding.onnx``, ``model.onnx``, ``genai_config.json``,
        ``processor_config.json`` (GenAI's image recipe) and the tokenizer's and image processor's
        files (the weights in a side file per model unless ``external_data`` is false)."""
        written, names = _vision_genai.save(self, folder, external_data)
        return SavedFolder(written, tuple(names))


# -- exporting --------------------------------------------------------------------------------------


def export(request: Request) -> VisionLanguage:
    """A vision-language model's export (:data:`opreg.llm._families.VISION`): its three models."""
    options = request.settings
    # the embedding model's table quantized as the decoder's weights (GatherBlockQuantized); the vision encoder
    # stays float32: at int4 it measured slower and its features 10-12% off (docs/language-models.md)
    tables = request.quantized(embeddings=True)
    model = request.load()
    architecture = architecture_of(model)
    processor = options.image_processor if options.image_processor is not None else request.folder
    architecture.check_processor(model, _vision_genai.image_processor_of(processor, architecture, model))
    with evaluating(model):
        layout = layout_of(model)
        programs = (
            _export_vision(model, architecture, request.export),
            _export_embedding(model, architecture, layout, tables),
            _export_decoder(model, architecture, layout, options.context_length, request.quantized()),
        )
    check_quantized(programs[2], options.precision, "decoder")
    return VisionLanguage(
        programs, layout, architecture, model, tokenizer=options.tokenizer, image_processor=processor,
        context_length=options.context_length, precision=options.precision,
    )  # fmt: skip


def _export_vision(model: Any, architecture: Any, settings: ExportSettings) -> OnnxProgram:
    example, dims, names, output_dims = architecture.vision_example(model)
    layers = architecture.vision_layers(model)
    plan = (
        None if layers is None else _layers.plan_layers(model, layers.count, path=layers.path, differs=layers.differs)
    )
    step = (architecture.vision_step(model) or VisionStep(model, architecture)).eval()
    settings = dataclasses.replace(settings, dynamic_shapes=dims)
    program = _layers.export_repeated(step, example, None, settings, plan, "the vision encoder")
    program.rename(dict(zip(program.input_names, names, strict=True)))
    program.rename({program.output_names[0]: "image_features"})
    graph = program.model.graph
    for value, dims in zip(graph.inputs, architecture.vision_input_dims, strict=True):
        set_dims(value, dims)
    set_dims(graph.outputs[0], output_dims)
    return program


def _export_embedding(model: Any, architecture: Any, layout: DecoderLayout, settings: ExportSettings) -> OnnxProgram:
    """The embedding: batch, sequence and the number of image features dynamic."""
    Dim = torch.export.Dim
    image = architecture.image_token_id(model)
    batch, length = EXAMPLE[0], 6
    ids = torch.randint(0, layout.vocab_size, (batch, length))
    ids[:, 1:4] = image  # three image tokens a row
    rank = len(architecture.feature_dims)
    width = architecture.embeds_width(model, layout.hidden_size)
    features = torch.randn(*([batch] if rank == 3 else []), 3 * (1 if rank == 3 else batch), width)
    feature_dims = {i: Dim(name) for i, name in enumerate(architecture.feature_dims) if name is not None}
    dims = {"input_ids": {0: Dim(BATCH), 1: Dim(SEQUENCE)}, "image_features": feature_dims}
    step = EmbeddingStep(model, architecture).eval()
    program = export_shaped(step, (ids, features.to(layout.dtype)), settings, dims)
    program.rename({program.output_names[0]: "inputs_embeds"})
    graph = program.model.graph
    set_dims(graph.inputs[0], (BATCH, SEQUENCE))
    set_dims(graph.inputs[1], architecture.feature_dims)
    set_dims(graph.outputs[0], (BATCH, SEQUENCE, None))
    return program


def _export_decoder(
    model: Any, architecture: Any, layout: DecoderLayout, context_length: int, settings: ExportSettings
) -> OnnxProgram:
    """The language model on embeddings, named as :data:`opreg.llm.LAYOUT` names the text decoder's
    (``inputs_embeds`` for ``input_ids``), every length dynamic."""
    Dim = torch.export.Dim
    batch, length, past = EXAMPLE
    bound = max(context_length, length + past)
    seq, past_dim = Dim(SEQUENCE, max=bound), Dim(PAST, max=bound)
    ids = torch.randint(0, layout.vocab_size, (batch, length))
    ids[:, 1] = architecture.image_token_id(model)
    embeds = torch.randn(batch, length, architecture.embeds_width(model, layout.hidden_size), dtype=layout.dtype)
    mask = torch.ones(batch, past + length, dtype=torch.int64)
    positions = architecture.positions(past, length, batch)
    cache = [torch.randn(tensor.shape(batch, past), dtype=layout.dtype) for _, tensor in layout.cache]
    position_dims = {0: Dim(BATCH), 1: seq} if positions.dim() == 2 else {1: Dim(BATCH), 2: seq}
    named = {BATCH: Dim(BATCH), PAST: past_dim}
    past_dims = [{i: named[d] for i, d in enumerate(t.dims) if isinstance(d, str)} for _, t in layout.cache]
    dims = {
        "inputs_embeds": {0: Dim(BATCH), 1: seq}, "attention_mask": {0: Dim(BATCH), 1: Dim.AUTO},
        "position_ids": position_dims, "past": past_dims, "input_ids": {0: Dim(BATCH), 1: seq},
    }  # fmt: skip
    step = DecoderStep(model, layout, architecture).eval()
    reads_ids = architecture.reads_input_ids
    if not reads_ids:
        del dims["input_ids"]
    # the past keys and values follow the embeddings, the mask and the positions
    plan = _layers.plan_layers(model, layout.num_layers, 3, path=architecture.text_layers)
    settings = dataclasses.replace(settings, dynamic_shapes=dims)
    example = (embeds, mask, positions, cache)
    program = _layers.export_repeated(
        step, example, {"input_ids": ids} if reads_ids else {}, settings, plan, "the decoder"
    )
    past_names = [tensor.past % layer for layer, tensor in layout.cache]
    names = ["inputs_embeds", LAYOUT["attention_mask"], LAYOUT["position_ids"], *past_names]
    program.rename(dict(zip(program.input_names, [*names, "input_ids"] if reads_ids else names, strict=True)))
    program.rename(dict(zip(program.output_names, layout.output_names, strict=True)))
    position_names = (BATCH, SEQUENCE) if positions.dim() == 2 else (None, BATCH, SEQUENCE)
    shapes = {"input_ids": (BATCH, SEQUENCE), "inputs_embeds": (BATCH, SEQUENCE, None),
              LAYOUT["attention_mask"]: (BATCH, TOTAL), LAYOUT["position_ids"]: position_names}  # fmt: skip
    for layer, tensor in layout.cache:
        shapes[tensor.past % layer] = tuple(d if isinstance(d, str) else None for d in tensor.dims)
        shapes[tensor.present % layer] = tuple(d if isinstance(d, str) else None for d in tensor.present_dims)
    graph = program.model.graph
    for value in [*graph.inputs, *graph.outputs]:
        set_dims(value, shapes.get(value.name, (BATCH, SEQUENCE, None)))  # the logits by default
    return program
