"""A checkpoint folder as a model without weights and the weights it will be written from.

``export_decoder(folder)`` builds the model from the folder's config on the ``meta`` device
(transformers' ``from_config`` under ``torch.device("meta")``: no weight is allocated), and reads
its safetensors files only when the ONNX model is written (:mod:`opreg.weights`): capture and
translation never read a weight, and peak memory does not grow with the model. The buffers a
model computes at init and keeps out of its checkpoint (rotary frequencies) are computed on the
CPU, as ``from_pretrained`` does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.weights import Weights, open_weights

logger = logging.getLogger(__name__)


def streamable(folder: Path) -> bool:
    """Whether ``folder``'s weights are safetensors files, which can be read tensor by tensor."""
    return any(folder.glob("*.safetensors"))


def load_meta(folder: Path) -> tuple[Any, Weights]:
    """The causal LM of ``folder``'s config on the ``meta`` device, in float32 (as the in-memory
    export loads it), its generation config read from the folder; and its checkpoint's weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception as e:
        raise ExportError(f"transformers could not build a causal LM from {folder}: {type(e).__name__}: {e}") from e
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model.eval(), open_weights(folder).with_tensors(computed_buffers(model))


def computed_buffers(model: Any) -> dict[str, torch.Tensor]:
    """The values of ``model``'s non-persistent buffers (not in a checkpoint: rotary frequencies),
    computed by the model's own initialisation on the CPU, as ``from_pretrained`` does. The buffers
    stay on ``meta`` (the whole capture is on one device, as the in-memory one is) and are read
    from these values as the weights are."""
    values = {}
    for key, buffer in list(model.named_non_persistent_buffers()):
        owner_name, _, attribute = key.rpartition(".")
        owner = model.get_submodule(owner_name)
        if buffer is None or buffer.device.type != "meta":
            continue
        owner._buffers[attribute] = torch.empty_like(buffer, device="cpu")
        model._init_weights(owner)
        values[key] = owner._buffers[attribute]
        owner._buffers[attribute] = buffer
        logger.debug("computed the buffer %s at init", key)
    return values


def on_meta(model: Any) -> bool:
    """Whether ``model`` has parameters on the ``meta`` device (no weights to run it eagerly)."""
    return any(p.device.type == "meta" for p in model.parameters())


def load_eager(folder: Path | None, model: Any) -> Any:
    """The model on ``meta`` with its weights, for an eager comparison: loaded from ``folder`` in
    float32 (all its weights in memory)."""
    if folder is None:
        raise ExportError(
            f"{type(model).__name__} is on the meta device: give its checkpoint folder to compare it eagerly"
        )
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
