"""What a checkpoint must hold before its export starts, each refusal naming the problem.

A checkpoint folder is checked from its ``config.json`` first (cheap: no weight is read), then
while its weights load, so that a bad one is refused in seconds, not after a capture:

- ``context_length``: at most the model's position limit (``max_position_embeddings`` or its
  older names; Whisper's ``max_target_positions``) unless the caller says to go beyond it;
- the cache: every layer must cache keys and values (a state-space or hybrid model, whose layers
  hold convolution and recurrent state, is refused with the layers' kinds);
- the weights: every parameter the model declares must be in the checkpoint (transformers would
  make a missing one random and say so only in a log);
- the tokenizer: a folder without one is exported, with a warning that GenAI needs one to encode
  text (``tokenizer=False`` says none is wanted).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from opreg.errors import ExportError, InvalidArgumentError

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT = 4096
"""The context length of a model that states no position limit (ALiBi, no positions at all)."""
POSITION_LIMITS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "seq_length",
    "max_target_positions",
)  # fmt: skip
"""Config attributes naming how many positions a model was built for, in the order they are read
(of the text decoder's config: a vision-language model's language model's, Whisper's decoder's)."""
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
"""Files that hold a tokenizer's vocabulary: a folder with none of them has no tokenizer."""


def read_config(folder: Path) -> Any:
    """The transformers config of the checkpoint at ``folder``."""
    if not (folder / "config.json").is_file():
        raise ExportError(
            f"{folder} is not a transformers checkpoint folder (no config.json): give a folder saved with "
            "save_pretrained"
        )
    refuse_custom_code(folder)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception as e:
        raise ExportError(f"transformers could not read {folder / 'config.json'}: {type(e).__name__}: {e}") from e


def refuse_custom_code(folder: Path) -> None:
    """Refuse a checkpoint whose config maps transformers' auto classes to its own code (``auto_map``),
    before transformers reads it: transformers would ask on stdin whether to run that code, and opreg runs
    no code a checkpoint carries."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # transformers names what is wrong with it
    mapped = config.get("auto_map") if isinstance(config, dict) else None
    if mapped:
        classes = ", ".join(f"{k} -> {v}" for k, v in sorted(mapped.items()) if isinstance(v, str)) or str(mapped)
        raise ExportError(
            f"{folder / 'config.json'} maps transformers' classes to code in the checkpoint (auto_map: {classes}); "
            "opreg runs no code a checkpoint carries: read that code, load the model yourself "
            "(from_pretrained(..., trust_remote_code=True)) and export the model object (opreg.llm.export_decoder)"
        )


def text_config(config: Any) -> Any:
    """The config of the text decoder (the model's own, unless it is multimodal)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def position_limit(config: Any) -> tuple[str, int] | None:
    """The config attribute naming how many positions the model was built for, and its value;
    ``None`` if the config does not say."""
    text = text_config(config)
    for name in POSITION_LIMITS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def context_length(config: Any, value: int | None, allow_longer: bool) -> int:
    """``value`` (an int from 1 to 2**31 - 1, :class:`opreg.llm.LLMSettings` checks it) checked
    against the model's position limit (default: that limit), whatever the family."""
    limit = position_limit(config)
    if value is None:
        return limit[1] if limit is not None else DEFAULT_CONTEXT
    if limit is not None and value > limit[1] and not allow_longer:
        raise InvalidArgumentError(
            f"context_length {value} is above the model's position limit ({limit[0]} {limit[1]}): past it its "
            "outputs are not what it was trained for (a learned position table has no row there at all); give at "
            "most that, or allow_longer_context=True (--allow-longer-context) if its positions extrapolate"
        )
    return value


def check_cache(config: Any, name: str) -> None:
    """Refuse a state-space model (every layer a state-space one: Mamba's, Jamba's tiny one) or one
    with hybrid layers (keys and values and a state-space layer's states at once: Falcon-H1's), read
    from the cache transformers makes for its config, before any weight is loaded or the model runs
    (its eager call can be large). A state-space layer beside attention layers (LFM2's short
    convolutions) is laid out, or refused, from one eager call (``opreg.llm._cache``)."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import LinearAttentionCacheLayerMixin

        layers = DynamicCache(config=config).layers
    except Exception:  # a config the cache cannot read: the eager call of layout_of decides
        logger.debug("could not lay out %s's cache from its config", name, exc_info=True)
        return
    linear = [type(layer).__name__ for layer in layers if isinstance(layer, LinearAttentionCacheLayerMixin)]
    hybrid = [kind for kind in linear if "FullAttention" in kind]
    if hybrid:
        what, odd = "a hybrid cache: state-space (convolution and recurrent) state beside keys and values", hybrid
    elif layers and len(linear) == len(layers):
        what, odd = "a state-space cache: convolution and recurrent state, not keys and values", linear
    else:
        return
    raise ExportError(
        f"{name} has {what} ({', '.join(sorted(set(odd)))} in {len(odd)} of {len(layers)} layers): export_decoder "
        "lays out key/value caches and short convolutions' states only, the kinds GenAI's decoder feeds back; its "
        "forward alone (logits, no cache) exports with opreg.export"
    )


def load_model(folder: Path, auto_class: str, name: str) -> Any:
    """The model of the checkpoint at ``folder``, loaded in float32 by transformers' ``auto_class``
    (``name``: what it is, in the error)."""
    import torch
    import transformers

    try:
        loaded = getattr(transformers, auto_class).from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
    except Exception as e:
        if auto_class in FALLBACK:
            with contextlib.suppress(ExportError):  # both failing: the family's own class's error
                return load_model(folder, FALLBACK[auto_class], name)
        raise ExportError(f"transformers could not load a {name} from {folder}: {type(e).__name__}: {e}") from e
    return loaded.eval()


FALLBACK = {"AutoModelForImageTextToText": "AutoModelForCausalLM"}
"""The Auto class tried when a family's does not load the checkpoint: Phi-4-multimodal is a causal LM
holding its vision and audio encoders (``Phi4MultimodalForCausalLM``)."""


def load_weights(folder: Path, features: bool = False) -> Any:
    """The causal LM (``features``: its base model) of the checkpoint at ``folder`` in float32,
    refused if the checkpoint lacks any of its weights."""
    import torch
    import transformers

    from opreg.llm._meta import auto_class
    from opreg.weights import checkpoint_files, restore_ties

    checkpoint_files(folder)  # shards named outside the folder refused, as the streamed export refuses them
    what = "base model" if features else "causal LM"
    try:
        model, info = getattr(transformers, auto_class(features)).from_pretrained(
            folder, dtype=torch.float32, output_loading_info=True, trust_remote_code=False
        )
    except Exception as e:
        raise ExportError(f"transformers could not load a {what} from {folder}: {type(e).__name__}: {e}") from e
    missing = sorted(set(info.get("missing_keys") or ()) - restore_ties(model, info.get("missing_keys") or ()).keys())
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ExportError(
            f"{folder} lacks {len(missing)} of {type(model).__name__}'s weights ({shown}): transformers would make "
            "them random; give the complete checkpoint (every shard its index names)"
        )
    from opreg.llm._meta import warn_unexpected

    warn_unexpected(folder, model, sorted(info.get("unexpected_keys") or ()))
    return model.eval()


def has_tokenizer(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a tokenizer's vocabulary."""
    return any((Path(folder) / name).is_file() for name in VOCABULARY_FILES)


def no_tokenizer_warning(folder: str | os.PathLike[str] | None = None) -> str:
    """What to say when the folder written will have no tokenizer: the checkpoint ``folder`` has
    none, or (``None``) a model was given without one."""
    why = (
        f"{folder} has no tokenizer (none of {', '.join(VOCABULARY_FILES)})"
        if folder is not None
        else "no tokenizer was given with the model"
    )
    return (
        f"{why}: the model folder will have none, and ONNX Runtime GenAI needs one to encode text; give one "
        "(tokenizer=), or say none is wanted (tokenizer=False, --no-tokenizer)"
    )
