"""opreg pack for diffusers: the checkpoint loader of its pipeline folders (``opreg export FOLDER``:
:mod:`opreg_diffusers.loaders`): Stable Diffusion 1.x/2.x, SDXL, SD3 and Flux, exported one folder
per model as optimum-onnx lays them out, checked by a denoising loop in ONNX Runtime against the
diffusers pipeline.

Importing this module imports neither torch nor diffusers, and neither does the loaders' module:
planning an export imports the components' libraries, building a model imports torch.
"""

from __future__ import annotations

import opreg

OPREG_API_VERSION = 1
OPREG_REQUIRES_TORCH = ">=2.6"


@opreg.hookimpl
def opreg_checkpoint_loaders():
    from opreg_diffusers import loaders

    return loaders.LOADERS
