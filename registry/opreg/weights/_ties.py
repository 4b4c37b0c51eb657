"""Weights a checkpoint keeps under another name because they were one tensor when it was saved, tied again.

``save_pretrained`` keeps a tensor that several parameters share under one of their names. Loading
the checkpoint, transformers ties the other names again only where the model's class and config
declare the tie now, and makes the rest random, saying so only in its load report:

- a BART-like model saved with ``tie_word_embeddings: false``: its encoder's and decoder's
  ``embed_tokens`` were its ``shared`` table when it was saved, and the checkpoint holds
  ``shared`` alone; transformers 4.57 and 5.17 both load them random;
- an LM head that transformers 4 tied to the input embeddings (its ``tie_weights``, whenever the
  text config's ``tie_word_embeddings`` is set) in a class that declares no tie in transformers 5
  (``BigBirdPegasusForCausalLM``).

:func:`restore_ties` ties each such missing weight to the tensor it shared when saved. A weight
missing for any other reason stays missing, for the caller to refuse. Importing this module
imports nothing heavy.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from opreg.errors import WeightsWarning, user_stacklevel


def restore_ties(model: Any, missing: Iterable[str]) -> dict[str, str]:
    """Tie each parameter of ``model`` (a transformers model, on any device) named in ``missing``
    (absent from its checkpoint) that its class shares with another parameter (its declared ties,
    whatever the config says; its LM head by transformers 4's rule) to that parameter, when the
    checkpoint holds it. Returns ``{tied name: source name}``; an :class:`opreg.WeightsWarning` names them."""
    missing = set(missing)
    parameters = dict(model.named_parameters(remove_duplicate=False))
    tied = {}
    for name in sorted(missing & parameters.keys()):
        source = _shared_with(model, name, parameters)
        if source is None or source in missing or source not in parameters:
            continue
        owner, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(owner), attribute, parameters[source])
        tied[name] = source
    if tied:
        them = "them" if len(tied) > 1 else "it"
        warnings.warn(
            f"the checkpoint leaves out {', '.join(tied)}, which {type(model).__name__} shares with "
            f"{', '.join(sorted(set(tied.values())))}: tied to {them} again, as the model was saved (transformers "
            f"{_transformers_version()} would make {them} random)",
            WeightsWarning,
            stacklevel=user_stacklevel(),
        )
    return tied


def _shared_with(model: Any, name: str, parameters: dict[str, Any]) -> str | None:
    """The name of the parameter the parameter ``name`` shares, if any."""
    output, embeddings = _embedding_weights(model)
    if output is not None and embeddings is not None and parameters[name] is output and _ties_word_embeddings(model):
        return next((n for n, p in parameters.items() if p is embeddings), None)
    for prefix, module in model.named_modules(remove_duplicate=False):
        declared = getattr(module, "_tied_weights_keys", None)
        if not isinstance(declared, dict):
            continue
        at = f"{prefix}." if prefix else ""
        for target, source in declared.items():
            if at + target == name:
                return at + source
    return None


def _embedding_weights(model: Any) -> tuple[Any, Any]:
    try:
        output, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None, None
    return getattr(output, "weight", None), getattr(embeddings, "weight", None)


def _ties_word_embeddings(model: Any) -> bool:
    """transformers 4's rule: the LM head is tied unless the text config sets ``tie_word_embeddings`` false."""
    config = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return getattr(text, "tie_word_embeddings", True) is not False


def _transformers_version() -> str:
    import transformers

    return transformers.__version__
