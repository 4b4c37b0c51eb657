"""Importing transformers' model code without the optional packages an export never uses.

transformers' model code (``transformers.modeling_layers``) imports, when they are installed,
torchao (through its quantizers: 0.4 s of CPU), scipy (through the object-detection losses'
Hungarian matcher: 0.35 s) and torchvision (through the image and video utilities: 0.15-0.3 s). Exporting a checkpoint
uses none of them unless the checkpoint is quantized (torchao) or is a vision model (torchvision).

Leaving them out changes the process for good: the modules imported meanwhile lack those names,
so later uses of them there (quantizing with ``TorchAoConfig``, training a DETR) would fail. So it
is done only in a process that runs one export and exits: ``opreg export`` sets
:data:`ENVIRONMENT` for its own process (``OPREG_LEAN_IMPORTS=0`` turns it off); the Python API
leaves the process as it is unless the caller sets it.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

logger = logging.getLogger(__name__)

ENVIRONMENT = "OPREG_LEAN_IMPORTS"
"""Set to ``1`` by ``opreg export`` for its own process; unset or ``0``: transformers imports as usual."""
MODEL_CODE = "transformers.modeling_layers"
"""The module every model's code imports first, and which imports the optional packages (through
``transformers.modeling_utils`` and ``transformers.processing_utils``)."""


def unused_packages(config: dict[str, Any], vision: bool) -> tuple[str, ...]:
    """The optional packages (transformers' ``is_<name>_available`` names) the export of ``config``
    does not need: scipy always (training losses only), torchao unless the config is quantized,
    torchvision unless the model takes images (``vision``)."""
    unused = ["scipy"]
    if "quantization_config" not in config:
        unused.append("torchao")
    if not vision:
        unused.append("torchvision")
    return tuple(unused)


def import_model_code(config: dict[str, Any], vision: bool) -> tuple[str, ...]:
    """Import transformers' model code leaving out :func:`unused_packages` when :data:`ENVIRONMENT` is
    on and that code is not imported yet; what was left out (``()``: nothing, transformers
    imported as usual or already)."""
    if os.environ.get(ENVIRONMENT, "0") in ("", "0") or MODEL_CODE in sys.modules:
        return ()
    from transformers import utils
    from transformers.utils import import_utils

    unused = unused_packages(config, vision)
    names = [f"is_{name}_available" for name in unused]
    saved = [(module, name, getattr(module, name)) for module in (utils, import_utils) for name in names]
    for module, name, _ in saved:
        setattr(module, name, _unavailable)
    try:
        importlib.import_module(MODEL_CODE)
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    logger.debug("imported %s without %s (%s)", MODEL_CODE, ", ".join(unused), ENVIRONMENT)
    return unused


def _unavailable(*args: Any, **kwargs: Any) -> bool:
    return False
