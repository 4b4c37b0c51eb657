"""opreg pack for timm: the checkpoint loader of its folders (``opreg export FOLDER``:
:mod:`opreg_timm.loaders`).

Importing this module imports neither torch nor timm: the loader's ``plan`` and build step do.
"""

from __future__ import annotations

import opreg

OPREG_API_VERSION = 1
OPREG_REQUIRES_TORCH = ">=2.6"


@opreg.hookimpl
def opreg_checkpoint_loaders():
    from opreg_timm import loaders

    return loaders.LOADERS
