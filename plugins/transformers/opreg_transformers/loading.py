"""A checkpoint's model as transformers loads it, with none of its weights made up.

transformers makes a weight its checkpoint lacks random and says so only in its load report; an
export verified against that same model would pass. Every model the transformers pack exports or
compares against is loaded by :func:`load`:

- a weight the checkpoint keeps under another name, because the two were one tensor when it was saved
  (a BART's ``embed_tokens`` and ``shared``, an LM head tied to the embeddings), is tied again
  (:func:`opreg.weights.restore_ties`);
- any other weight missing from a checkpoint saved from the class loaded (``config.json``'s
  ``architectures`` name it) is refused, naming the weights;
- a head the task adds to a checkpoint of another class (``--task text-classification`` on a
  ``BertForMaskedLM`` folder) is new, so random as transformers makes it: an
  :class:`opreg.WeightsWarning` names it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import opreg


def load(path: str | os.PathLike[str], auto: str, config: Any = None, **options: Any) -> Any:
    """The model of the checkpoint at ``path`` by transformers' ``auto`` class (an Auto class or a model
    class), in eval mode; ``config`` and ``options`` go to ``from_pretrained``. Raises
    :class:`opreg.CheckpointError` for a weight the checkpoint should hold and does not."""
    import transformers

    from opreg.weights import restore_ties

    if config is not None:
        options["config"] = config
    model, info = getattr(transformers, auto).from_pretrained(
        path, output_loading_info=True, trust_remote_code=False, **options
    )
    missing = sorted(set(info.get("missing_keys") or ()) - restore_ties(model, info.get("missing_keys") or ()).keys())
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        saved_as = getattr(model.config, "architectures", None) or ()
        if type(model).__name__ in saved_as:
            raise opreg.CheckpointError(
                f"{path} lacks {len(missing)} of {type(model).__name__}'s weights ({shown}): transformers "
                f"{transformers.__version__} would make them random; give the complete checkpoint (every file its "
                "index names), or the transformers release it was written with"
            )
        warnings.warn(
            f"{path} has no {shown} (it was saved as {', '.join(saved_as) or 'a model of no named class'}): "
            "transformers makes them random, as for any head new to a task; fine-tune the model before using "
            "their outputs",
            opreg.WeightsWarning,
            stacklevel=2,
        )
    return model.eval()
