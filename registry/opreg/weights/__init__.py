"""Weights read when the model is written: lazy initializers, and the checkpoints they come from.

A model too large for memory is exported from a ``meta``-device module (no weight data) and a
checkpoint (``opreg.export(model, args, weights=...)``). Each of its initializers is then a
:class:`LazyWeight`: a dtype, a shape and a way to compute any run of its rows (slices along its
first dim). Nothing is read until the model is written; then each initializer is computed a
chunk of rows at a time (:attr:`LazyWeight.chunk_bytes`), written to the external-data file and dropped.

Every transform an export applies to a weight is one function here, on lazy values, so the
in-memory export and the streamed one run the same code and write the same bytes:

- :func:`finite`: refused where a row holds a NaN or an infinity (before block quantization);
- :func:`cast`: another dtype (a bfloat16 checkpoint into a float32 model), as ``Tensor.to`` casts;
- :func:`transpose`: stored transposed (the weight-transpose folding of ``fold_weights``);
- :func:`concat`: several weights as one (ONNX Runtime's packed query, key and value projection);
- :func:`scaled`: scaled per output channel (batch norm folded into the convolution before it);
- :func:`low_rank_added`: a LoRA adapter's ``scale * B @ A`` added (an adapter merged into its model);
- :func:`rowwise`: any function of a run of rows giving rows of one or more new tensors (block
  quantization to MatMulNBits: each output row comes from one row of the ``(N, K)`` weight).

A weight a quantized checkpoint stores as integers carries them (:attr:`LazyWeight.stored`, a
:class:`StoredBlocks`), which a pass writes as they are instead of the weight's values.

Checkpoints: :func:`open_weights` takes safetensors files (a file, a folder of them, or a list),
read tensor by tensor and run of rows by run of rows (their headers parsed, the bytes asked for read
with ``os.pread``: no mapping holds pages or address space), or a mapping of names to tensors (torch tensors,
``onnx_ir`` tensors, lazy ones). :func:`restore_ties` ties again the weights a checkpoint keeps
under another name because they were one tensor when it was saved (a BART's ``embed_tokens``), which
transformers would make random.

Importing this module is cheap; torch is imported when a weight is read.
"""

from typing import TYPE_CHECKING, Any

from opreg.weights._lazy import (
    CACHED_ELEMENTS,
    LazyWeight,
    StoredBlocks,
    TensorSpec,
    cast,
    concat,
    finite,
    lazy,
    low_rank_added,
    release_freed_memory,
    rowwise,
    scaled,
    transpose,
)
from opreg.weights._ties import restore_ties

if TYPE_CHECKING:
    from opreg.weights._checkpoint import Weights, bind, checkpoint_files, open_weights

_CHECKPOINTS = ("Weights", "bind", "checkpoint_files", "open_weights")
"""Names of :mod:`opreg.weights._checkpoint`, imported when first used: an export without ``weights=``
transforms lazy values (a folded transpose) and never opens a checkpoint."""


def __getattr__(name: str) -> Any:
    if name in _CHECKPOINTS:
        from opreg.weights import _checkpoint

        return getattr(_checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CACHED_ELEMENTS",
    "LazyWeight",
    "StoredBlocks",
    "TensorSpec",
    "Weights",
    "bind",
    "cast",
    "checkpoint_files",
    "concat",
    "finite",
    "lazy",
    "low_rank_added",
    "open_weights",
    "release_freed_memory",
    "restore_ties",
    "rowwise",
    "scaled",
    "transpose",
]
