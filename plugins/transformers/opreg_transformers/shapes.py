"""The inputs and dynamic dims of a vision, vision-text or audio family's model
(:mod:`opreg_transformers.media`), named as optimum-onnx 0.1.0 names them: ``pixel_values``
``[batch_size, num_channels, height, width]``, ``input_ids`` and ``attention_mask``
``[text_batch_size, sequence_length]`` beside ``pixel_values`` ``[image_batch_size, ...]``,
``input_values`` ``[batch_size, sequence_length]`` (raw audio; a spectrogram's
``[batch_size, max_length, num_mel_bins]``, its frames fixed).

A dim the model fixes is written as its size (a ViT's sides), not as a name; the example and the
second size of each dim are chosen off the cases a model special-cases (a square image, the
config's own image size, a multiple of a convolution's stride), so neither capture nor
verification follows a path other sizes would not take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import opreg
from opreg_transformers import media

BATCH = opreg.DynamicDim("batch_size", example=2, other=3)
TEXT_BATCH = opreg.DynamicDim("text_batch_size", example=2, other=3)
IMAGE_BATCH = opreg.DynamicDim("image_batch_size", example=3, other=2)

Signature = tuple[tuple[opreg.ModelInput, ...], tuple[opreg.DynamicDim, ...]]


def signature(family: media.Family, config: Mapping[str, Any], task: str) -> Signature:
    """The model's inputs for ``task``, in optimum's order, and the dims they name."""
    if family.modality == media.AUDIO:
        return _audio(config, media.frames_needed(config, task))
    if family.modality == media.SPECTROGRAM:
        frames = (int(config.get("max_length", 1024)), int(config.get("num_mel_bins", 128)))
        return (opreg.ModelInput("input_values", (BATCH.name, *frames), "float32", "normal"),), (BATCH,)
    if family.modality == media.IMAGE_TEXT and task == media.IMAGE_CLASSIFICATION:  # the vision tower's head
        return _image(family, config["vision_config"], BATCH)
    if family.modality == media.IMAGE_TEXT:
        text, text_dims = _text(family, config["text_config"])
        (pixels,), image_dims = _image(family, config["vision_config"], IMAGE_BATCH)
        return (text[0], pixels, *text[1:]), (*text_dims, *image_dims)
    return _image(family, config, BATCH)


def _image(family: media.Family, config: Mapping[str, Any], batch: opreg.DynamicDim) -> Signature:
    channels = int(config.get("num_channels", 3))
    step = family.sides.step
    if step is None:
        height, width = media.image_size(config)
        pixels = opreg.ModelInput("pixel_values", (batch.name, channels, height, width), "float32", "normal")
        return (pixels,), (batch,)
    size = step(config)
    largest = family.sides.largest(config) if family.sides.largest else None
    if family.sides.exact:  # multiples, never square: a square of the config's size takes a shortcut
        sides = (
            opreg.DynamicDim("height", example=2 * size, other=3 * size, min=size, max=largest, multiple=size),
            opreg.DynamicDim("width", example=3 * size, other=2 * size, min=size, max=largest, multiple=size),
        )
    else:  # off the multiples: a floor division then rounds
        sides = (
            opreg.DynamicDim("height", example=2 * size + 3, other=3 * size - 5, min=size, max=largest),
            opreg.DynamicDim("width", example=3 * size - 5, other=2 * size + 3, min=size, max=largest),
        )
    pixels = opreg.ModelInput("pixel_values", (batch.name, channels, "height", "width"), "float32", "normal")
    return (pixels,), (batch, *sides)


def _text(family: media.Family, config: Mapping[str, Any]) -> Signature:
    longest = int(config.get("max_position_embeddings", 77))
    sequence = opreg.DynamicDim("sequence_length", example=min(16, longest), other=min(7, longest), max=longest)
    shape = (TEXT_BATCH.name, sequence.name)
    inputs = [opreg.ModelInput("input_ids", shape, fill="ids", high=int(config["vocab_size"]))]
    if family.attention_mask:
        inputs.append(opreg.ModelInput("attention_mask", shape, fill="mask"))
    return tuple(inputs), (TEXT_BATCH, sequence)


def _audio(config: Mapping[str, Any], frames: int) -> Signature:
    """Raw audio of any length from ``frames`` frames up (torch.export cannot prove the feature
    encoder's floor divisions over a range: the length is captured as ``Dim.AUTO``)."""
    field, stride = media.audio_span(config)
    shortest = field + (frames - 1) * stride
    sequence = opreg.DynamicDim(
        "sequence_length", example=2 * shortest + 13, other=3 * shortest + 7, min=shortest, auto=True
    )
    values = opreg.ModelInput("input_values", (BATCH.name, sequence.name), "float32", "normal")
    return (values,), (BATCH, sequence)
