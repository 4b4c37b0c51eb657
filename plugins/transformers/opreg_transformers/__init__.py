"""opreg pack for transformers: the torch custom ops it registers (``transformers::grouped_mm_fallback``),
capture patches for its model code torch.export cannot capture (:mod:`opreg_transformers.patches`),
and the checkpoint loaders of its folders and sentence-transformers' (``opreg export FOLDER``:
:mod:`opreg_transformers.loaders`, :mod:`opreg_transformers.sentence`).

Importing this module imports neither torch nor transformers: the hooks do (the loaders' module
imports neither either: its ``plan`` and build steps import transformers), and the op's impl is
checked against its schema only where transformers already defined it (importing transformers takes
seconds, which every registry build would pay).
"""

from __future__ import annotations

import opreg

OPREG_API_VERSION = 1
OPREG_REQUIRES_TORCH = ">=2.6"


@opreg.hookimpl
def opreg_register_ops(registry: opreg.Registrar) -> None:
    from opreg_transformers import ops

    registry.register_module(ops)
    registry.mark_unsupported(
        "transformers_msa::sparse_atten",
        "it wraps a CUDA kernel from the hub (CuTe-DSL) that transformers calls on GPUs only",
    )


@opreg.hookimpl
def opreg_samples():
    from opreg_transformers import ops

    return ops.samples()


@opreg.hookimpl
def opreg_capture_patches():
    from opreg_transformers import patches

    return patches.PATCHES


@opreg.hookimpl
def opreg_capture_samples():
    from opreg_transformers import detection

    return detection.patch_samples()


@opreg.hookimpl
def opreg_checkpoint_loaders():
    from opreg_transformers import loaders, sentence

    return [*loaders.LOADERS, sentence.LOADER]
