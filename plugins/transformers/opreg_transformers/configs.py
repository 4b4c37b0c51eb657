"""A transformers folder's ``config.json`` built as transformers builds it, or, when an older
transformers wrote a field the installed one's typed config refuses, built again with that field
at the class's default, saying so in a log line.

The known fields: DETR's ``dilation`` and ``backbone_kwargs``, which transformers 4.57 writes as
``null`` (their defaults then) and transformers 5's ``DetrConfig`` refuses: a strict dataclass,
``dilation: bool = False`` fails with ``Field 'dilation' expected bool, got NoneType``, and its
``__post_init__`` reads ``backbone_kwargs`` as a dict. A ``null`` there meant the default, so the
default is what the model is built with.

And a backbone's stage names that are not its layers': a config whose ``num_hidden_layers`` was
changed after it was built (tiny test checkpoints: a BEiT of 2 layers whose ``stage_names`` and
``out_features`` still say 12) is written by transformers 4.57 as it is, and transformers 5
refuses it (``out_features must be a subset of stage_names``). Those fields choose the feature
maps a model used as a backbone gives; no head exported here reads them, so they are read as the
class's defaults (the stages its layers have). Any other error is raised as it was.

And a config class whose ``num_labels`` is a field with a default (transformers 5's
``PvtConfig``: 1000) reads a file without ``num_labels`` (transformers 4.57 writes ``id2label``
only) as 1000 labels, and the checkpoint's classifier then does not fit: the labels are
``id2label``'s, as the file meant (:func:`labelled`).

Imports transformers: imported by a plan, never at recognition.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LENIENT = ("dilation", "backbone_kwargs")
"""Fields an older transformers wrote as ``null`` where the installed one's config wants its
default's type: read as absent (the class's default) when ``null``."""
STAGES = ("stage_names", "out_features", "out_indices")
"""A backbone's stage fields, read as absent (the stages of the config's layers) when
transformers refuses them as :data:`STAGE_ERROR` says."""
STAGE_ERROR = "out_features must be a subset of stage_names"


def read(path: Path) -> tuple[Any, tuple[str, ...]]:
    """The transformers config of the folder ``path``, the :data:`LENIENT` fields' ``null``
    read as the class's default when transformers refuses them (logged, and said in the note
    returned beside the config: the export's notes)."""
    import transformers

    try:
        return labelled(path, transformers.AutoConfig.from_pretrained(path, trust_remote_code=False)), ()
    except Exception as e:
        refused, read_as = _refused(path, e)
        if not refused:
            raise
        error = e
    values = json.loads((path / "config.json").read_text())
    for name in refused:
        del values[name]
    config_class = transformers.CONFIG_MAPPING[values["model_type"]]
    note = (
        f"{path / 'config.json'}: transformers {transformers.__version__} refuses it ({type(error).__name__}: "
        f"{str(error).splitlines()[0]}); read {read_as} as {config_class.__name__}'s defaults, as the "
        f"transformers {values.get('transformers_version', '')} that wrote the file meant"
    )
    log.warning("%s", note)
    return labelled(path, config_class.from_dict(values)), (note,)


def labelled(path: Path, config: Any) -> Any:
    """``config``, its ``num_labels`` set to the number of ``config.json``'s ``id2label`` when the
    file gives no ``num_labels`` and the class's default says otherwise."""
    values = json.loads((path / "config.json").read_text())
    labels = values.get("id2label")
    if "num_labels" not in values and labels and config.num_labels != len(labels):
        log.info("%s: %d labels (its id2label), not %s's default %d", path, len(labels), type(config).__name__,
                 config.num_labels)  # fmt: skip
        config.num_labels = len(labels)
    return config


def _refused(path: Path, error: Exception) -> tuple[list[str], str]:
    """The fields to read as the defaults, and how the note names them: the :data:`LENIENT` fields
    ``config.json`` holds as ``null`` if ``error`` names one of them, the :data:`STAGES` it holds if
    ``error`` is :data:`STAGE_ERROR`; else ``[]``."""
    try:
        values = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return [], ""
    if STAGE_ERROR in str(error):
        stages = [name for name in STAGES if name in values]
        return stages, f"{', '.join(stages)} (not the stages of its {values.get('num_hidden_layers')} layers)"
    nulls = [name for name in LENIENT if name in values and values[name] is None]
    if any(f"'{name}'" in str(error) for name in nulls):
        return nulls, " and ".join(f"{n}: null" for n in nulls)
    return [], ""
