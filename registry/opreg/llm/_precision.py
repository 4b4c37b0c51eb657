"""The linear layers' weights at the precision asked: float32 as they are, or 8 or 4 bits as ONNX
Runtime's ``com.microsoft::MatMulNBits``, written by the opreg-ort-contrib pack's
``MatMulNBitsQuantization`` pass after the caller's passes.

Its block size, symmetry and accuracy level are the options given (a causal LM's
``--block-size``, ``--symmetric``, ``--accuracy-level``), else the family's
(:attr:`opreg.llm._family.Family.quantization`: Whisper and vision-language models as GenAI's
builder quantizes them for CPU: blocks of 32, symmetric, accuracy level 4), else the pass's own
defaults, the fastest measured, so the command line, the Python API and the pass agree. A tied
embedding table then reads the quantized weights (``GatherBlockQuantized``).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from opreg.errors import ExportError, InvalidArgumentError, NoImplementationError
from opreg.llm._settings import LLMSettings
from opreg.registry.targets import Target
from opreg.settings import ExportSettings

BITS = {"fp32": None, "int8": 8, "int4": 4}
"""Each precision's bits (``None``: the weights as they are, float32); its keys are
:data:`opreg.llm._settings.PRECISIONS`."""
QUANTIZATION_PASS = ("opreg_ort_contrib.quantize", "MatMulNBitsQuantization")
"""The module and class of the pass that quantizes weights to MatMulNBits (the opreg-ort-contrib pack)."""
STORED_PASS = ("opreg_ort_contrib.stored", "StoredBlocksToMatMulNBits")
"""The module and class of the pass that writes a quantized checkpoint's stored integers as
MatMulNBits (:mod:`opreg.llm._quantized`)."""
CONTRIB_DOMAIN = "com.microsoft"


def quantization(
    settings: LLMSettings, target: Target, defaults: Mapping[str, Any] = {}, embeddings: bool = False
) -> Any:
    """The pass that quantizes the linear layers' weights to ``settings.precision`` at ``target``
    (``None`` for ``fp32``), with the quantization options given, else ``defaults``
    (``embeddings``: an embedding table no linear layer reads, as ``GatherBlockQuantized``).
    Refuses a quantized precision at a target without ONNX Runtime's kernels."""
    precision, bits = settings.precision, BITS[settings.precision]
    if bits is None:
        return None
    if CONTRIB_DOMAIN not in target.as_dict():
        raise InvalidArgumentError(
            f"precision {precision!r} stores weights for ONNX Runtime's com.microsoft::MatMulNBits, which target "
            f"{target.name!r} does not allow: export for target 'onnxruntime' (the default with opreg-ort-contrib)"
        )
    quantizer = _pack_pass(QUANTIZATION_PASS, f"precision {precision!r}")
    table = {"embeddings": True} if embeddings else {}
    given = settings.quantization()
    if given.get("int4_algo") == "gptq":  # GPTQ's blocks are stored before the capture: the rest (a tied head) rtn
        given["int4_algo"] = "rtn"
    return quantizer(bits=bits, **{**defaults, **given}, **table)


def stored_quantization(settings: LLMSettings, target: Target, what: str) -> Any:
    """The pass that writes a quantized checkpoint's (``what``) stored integers as MatMulNBits,
    with the accuracy level given (else the pass's default), refused at a target without ONNX
    Runtime's kernels."""
    if CONTRIB_DOMAIN not in target.as_dict():
        raise InvalidArgumentError(
            f"{what} stores its weights as integers, which opreg writes as ONNX Runtime's com.microsoft::MatMulNBits: "
            f"target {target.name!r} does not allow it; export for target 'onnxruntime' (the default with "
            "opreg-ort-contrib)"
        )
    writer = _pack_pass(STORED_PASS, what)
    level = settings.accuracy_level
    return writer() if level is None else writer(accuracy_level=level)


def _pack_pass(where: tuple[str, str], what: str) -> Any:
    """The class of opreg-ort-contrib's pass at ``where`` (its module and name), which ``what`` needs."""
    module, name = where
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise NoImplementationError(f"{what} needs the opreg-ort-contrib pack (pip install opreg-ort-contrib)") from e


def with_precision(
    export: ExportSettings,
    settings: LLMSettings,
    defaults: Mapping[str, Any] = {},
    embeddings: bool = False,
    stored: str | None = None,
) -> ExportSettings:
    """``export`` with the precision's pass (:func:`quantization`) after its own passes, which it
    quantizes the weights they leave; ``stored`` (a quantized checkpoint, named): first the pass
    writing its stored integers (:func:`stored_quantization`), the precision's then quantizing the
    layers it left float (a head the checkpoint keeps float)."""
    quantize = quantization(settings, export.target, defaults, embeddings)
    first = [] if stored is None else [stored_quantization(settings, export.target, stored)]
    added = first + ([] if quantize is None else [quantize])
    return dataclasses.replace(export, passes=[*export.passes, *added]) if added else export


def check_quantized(program: Any, precision: str, what: str) -> None:
    """Refuse a ``precision`` the export could not give: no linear layer of ``what`` became a
    MatMulNBits (a target without ONNX Runtime's domain keeps them as Gemm or MatMul)."""
    if BITS[precision] is None:
        return
    if not any(node.op_type == "MatMulNBits" for node in program.model.graph):
        raise ExportError(
            f"precision={precision!r} quantized none of the {what}'s linear layers: MatMulNBits is ONNX Runtime's "
            "kernel; export with target='onnxruntime'"
        )
