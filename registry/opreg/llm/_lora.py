"""LoRA adapters (PEFT's folders): read and checked against the model before the export, then
merged into the weights (``adapter=``) or given to the decoder as inputs (``adapters=``,
:mod:`opreg.llm._lora_inputs`).

A PEFT LoRA adapter folder holds ``adapter_config.json`` and ``adapter_model.safetensors``: for
each adapted linear layer (``out, in``) of the base model, ``lora_A`` ``(rank, in)`` and
``lora_B`` ``(out, rank)``, and the layer computes ``x @ W.T + scale * (x @ A.T) @ B.T`` with
``scale = lora_alpha / rank`` (``lora_alpha / sqrt(rank)`` with ``use_rslora``). What PEFT's LoRA
does beyond that (DoRA's magnitudes, trained biases, whole modules saved beside the adapter,
per-module alphas, adapted embeddings or convolutions) is refused, naming the setting, before
the model is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opreg.errors import ExportError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""What PEFT puts before the base model's own module names in an adapter's tensor names."""
REFUSED = {
    "use_dora": "DoRA's magnitude vectors (use_dora)",
    "modules_to_save": "whole modules trained beside the adapter (modules_to_save)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "fan_in_fan_out": "Conv1D layers stored (in, out) (fan_in_fan_out)",
}
"""Adapter settings whose non-empty value the export refuses, and what each is."""


@dataclasses.dataclass(frozen=True)
class Pair:
    """One adapted linear layer: its module name in the base model, the adapter's ``A`` ``(rank,
    in)`` and ``B`` ``(out, rank)`` as lazy weights, and the scale of their product."""

    module: str
    down: Any
    up: Any
    scale: float

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])


@dataclasses.dataclass(frozen=True)
class Adapter:
    """A PEFT LoRA adapter: its ``name`` (its folder's), ``folder``, and its :class:`Pair` by module."""

    name: str
    folder: Path
    pairs: Mapping[str, Pair]


def read_adapter(folder: str | os.PathLike[str]) -> Adapter:
    """The LoRA adapter in ``folder`` (``adapter_config.json``, ``adapter_model.safetensors``),
    refused with the reason where the export cannot hold it; only the tensors' headers are read."""
    from opreg.weights import open_weights

    folder = Path(folder)
    config = _config(folder)
    if not (folder / WEIGHTS_FILE).is_file():
        raise ExportError(
            f"{folder} has no {WEIGHTS_FILE}: save the adapter with PEFT's save_pretrained (safe_serialization, "
            "its default)"
        )
    tensors = open_weights(folder / WEIGHTS_FILE)
    pairs: dict[str, dict[str, Any]] = {}
    for key in tensors:
        module, kind = _module_of(folder, key)
        pairs.setdefault(module, {})[kind] = tensors[key]
    if not pairs:
        raise ExportError(f"{folder / WEIGHTS_FILE} holds no lora_A/lora_B weights: it is not a LoRA adapter")
    alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    made = {}
    for module, found in sorted(pairs.items()):
        if set(found) != {"lora_A", "lora_B"}:
            raise ExportError(f"{folder / WEIGHTS_FILE} holds {' and '.join(found)} of {module} without its pair")
        down, up = found["lora_A"], found["lora_B"]
        if len(down.shape) != 2 or len(up.shape) != 2 or up.shape[1] != down.shape[0]:
            raise ExportError(
                f"{folder}: {module}'s lora_A {list(down.shape)} and lora_B {list(up.shape)} are not (rank, in) "
                "and (out, rank): a LoRA adapter of a linear layer"
            )
        rank = int(down.shape[0])
        scale = alpha / math.sqrt(rank) if rslora else alpha / rank
        made[module] = Pair(module, down, up, scale)
    return Adapter(folder.name, folder, made)


def _config(folder: Path) -> dict[str, Any]:
    """``adapter_config.json`` of ``folder``, refused unless it is a LoRA adapter the export holds."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ExportError(f"{folder} is not a PEFT adapter folder (no {CONFIG_FILE}): give one saved by PEFT")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"could not read {path}: {type(e).__name__}: {e}") from e
    if config.get("peft_type") != "LORA":
        raise ExportError(f"{path} is a {config.get('peft_type')!r} adapter: the export takes LoRA adapters only")
    refused = [what for key, what in REFUSED.items() if config.get(key)]
    if config.get("bias", "none") != "none":
        refused.append(f"trained biases (bias={config['bias']!r})")
    if refused:
        raise ExportError(
            f"{path} uses {', '.join(refused)}, which the export does not hold: merge the adapter with PEFT "
            "(merge_and_unload) and export the merged checkpoint"
        )
    return config


def _module_of(folder: Path, key: str) -> tuple[str, str]:
    """The base model's module name and ``lora_A``/``lora_B`` of the adapter tensor ``key``."""
    name = key.removeprefix(PEFT_PREFIX)
    for kind in ("lora_A", "lora_B"):
        for suffix in (f".{kind}.weight", f".{kind}.default.weight"):
            if name.endswith(suffix):
                return name[: -len(suffix)], kind
    raise ExportError(
        f"{folder / WEIGHTS_FILE} holds {key!r}, not a linear layer's lora_A or lora_B (an adapted embedding's "
        "or convolution's, a trained bias): the export adapts linear layers only"
    )


def check_against(adapter: Adapter, model: Any) -> None:
    """Refuse ``adapter`` where a module it adapts is not a linear layer of ``model`` (a model on
    ``meta`` will do: only shapes are read) of the shape its ``A`` and ``B`` need."""
    import torch

    for module, pair in adapter.pairs.items():
        try:
            layer = model.get_submodule(module)
        except AttributeError:
            layer = None
        if not isinstance(layer, torch.nn.Linear):
            what = "no module" if layer is None else f"a {type(layer).__name__}"
            raise ExportError(
                f"adapter {adapter.folder} adapts {module}, {what} of {type(model).__name__}: an adapter of another "
                "base model? (its adapter_config.json names base_model_name_or_path)"
            )
        if (int(pair.up.shape[0]), int(pair.down.shape[1])) != (layer.out_features, layer.in_features):
            raise ExportError(
                f"adapter {adapter.folder}: {module}'s lora_B {list(pair.up.shape)} and lora_A "
                f"{list(pair.down.shape)} do not fit its Linear({layer.in_features}, {layer.out_features}): an "
                "adapter of another base model?"
            )


def merged_weights(adapter: Adapter, weights: Mapping[str, Any]) -> dict[str, Any]:
    """The adapted layers' weights of ``weights`` (the base model's, lazy or not, by name) with
    the adapter's product added (:func:`opreg.weights.low_rank_added`), by name."""
    from opreg.weights import low_rank_added

    merged = {}
    for module, pair in adapter.pairs.items():
        name = f"{module}.weight"
        merged[name] = low_rank_added(weights[name], pair.up, pair.down, pair.scale, name=name)
    return merged


def merge_in_memory(adapter: Adapter, model: Any) -> None:
    """Add the adapter's products to ``model``'s weights in place (a model loaded with its weights)."""
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in merged_weights(adapter, params).items():
            params[name].copy_(value.torch())
