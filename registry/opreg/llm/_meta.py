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
import re
from pathlib import Path
from typing import Any

import torch

from opreg.errors import ExportError
from opreg.llm import _quantized, _quantized_read
from opreg.weights import Weights, bind, checkpoint_files, open_weights, restore_ties

logger = logging.getLogger(__name__)


def streamable(folder: Path) -> bool:
    """Whether the weights transformers reads from ``folder`` are safetensors files, which can be read
    tensor by tensor: the same files (:func:`opreg.weights.checkpoint_files`)."""
    return checkpoint_files(folder) is not None


def auto_class(features: bool) -> str:
    """The transformers Auto class of a checkpoint's decoder: the causal LM's, or (``features``) the
    base model's, without its head (:attr:`opreg.llm.LLMSettings.features`)."""
    return "AutoModel" if features else "AutoModelForCausalLM"


def load_meta(folder: Path, features: bool = False) -> tuple[Any, Weights]:
    """The causal LM (``features``: its base model) of ``folder``'s config on the ``meta`` device,
    in float32 (as the in-memory export loads it), its generation config read from the folder;
    and its checkpoint's weights."""
    import transformers
    from transformers import AutoConfig, GenerationConfig

    what = "base model" if features else "causal LM"
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
        with torch.device("meta"):
            model = getattr(transformers, auto_class(features)).from_config(config, dtype=torch.float32)
    except Exception as e:
        raise ExportError(f"transformers could not build a {what} from {folder}: {type(e).__name__}: {e}") from e
    if not features and (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    weights = open_weights(folder)
    restore_ties(model, [name for name, _ in model.named_parameters(remove_duplicate=False) if name not in weights])
    scheme = _quantized.scheme_of(config, str(folder))
    if scheme is not None:  # each quantized layer's tensors as its weight, carrying them (checked now)
        weights = _quantized_read.stored_weights(weights, scheme, str(folder))
    warn_unexpected(folder, model, unexpected(model, weights))
    return model.eval(), weights.with_tensors(computed_buffers(model))


def unexpected(model: Any, weights: Weights) -> list[str]:
    """The tensors of ``weights`` that ``model`` (a transformers model) does not declare, less those
    transformers leaves out of its own report (``PreTrainedModel._adjust_missing_and_unexpected_keys``:
    the class's ``_keys_to_ignore_on_load_unexpected``, and a checkpoint's old rotary frequencies and
    position ids where the model now computes them)."""
    declared = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    declared |= {name for name, _ in model.named_buffers(remove_duplicate=False)}
    patterns = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    if any(name.endswith("rotary_emb.inv_freq") for name, _ in model.named_buffers()):
        patterns.add(r"rotary_emb\.inv_freq")
    if any(name.endswith("position_ids") for name, _ in model.named_buffers()):
        patterns.add(r"(^|\.)position_ids$")
    ignored = re.compile("|".join(f"({pattern})" for pattern in patterns)) if patterns else None
    return sorted(n for n in weights if n not in declared and (ignored is None or ignored.search(n) is None))


def warn_unexpected(folder: Path, model: Any, names: list[str]) -> None:
    """Say which tensors of the checkpoint at ``folder`` ``model`` does not declare (``names``): the
    export leaves them out, as transformers does when it loads the checkpoint (and warns of them)."""
    if names:
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        logger.warning(
            "%s holds %d tensor%s that %s does not declare: %s; the export leaves %s out, as transformers does (a "
            "checkpoint of another config or model class?)",
            folder, len(names), "s" if len(names) > 1 else "", type(model).__name__, shown,
            "them" if len(names) > 1 else "it",
        )  # fmt: skip


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


def load_eager(folder: Path | None, model: Any, features: bool = False) -> Any:
    """The model on ``meta`` with its weights, for an eager comparison: loaded from ``folder`` in
    float32 (all its weights in memory; a quantized checkpoint's as :func:`opreg.llm._quantized.eager_model`;
    ``features``: the base model, by :func:`auto_class`)."""
    if folder is None:
        raise ExportError(
            f"{type(model).__name__} is on the meta device: give its checkpoint folder to compare it eagerly"
        )
    import transformers

    scheme = _quantized.scheme_of(transformers.AutoConfig.from_pretrained(folder), str(folder))
    if scheme is not None:
        return eager_quantized(folder, scheme, features)
    model, info = getattr(transformers, auto_class(features)).from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True, trust_remote_code=False
    )
    # tied as the export tied them before binding its weights (which refused any other missing one)
    restore_ties(model, info.get("missing_keys") or ())
    return model.eval()


def eager_quantized(folder: Path, scheme: _quantized.Scheme, features: bool = False) -> Any:
    """The causal LM of a quantized checkpoint ``folder`` for an eager comparison: transformers'
    own loading of a compressed-tensors checkpoint (the ``compressed-tensors`` package
    dequantizes it on the CPU); GPTQ's and AWQ's loaders (gptqmodel) need CUDA to install, so
    theirs is the model built from the config with every layer's weight ``(q - zero_point) *
    scale`` of its stored tensors, the formula their readers apply."""
    if scheme.method == "compressed-tensors":
        import transformers

        auto = getattr(transformers, auto_class(features))
        return auto.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False).eval()
    model, weights = load_meta(folder, features)
    bound = bind(model, weights)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, tensor in bound.items():
            owner, _, attribute = name.rpartition(".")
            module = model.get_submodule(owner)
            getattr(module, attribute).copy_(tensor.torch())
    return model.eval()
