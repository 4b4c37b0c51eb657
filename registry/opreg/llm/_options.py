"""What a decoder is exported for when the caller does not say: the fastest installed target, and
the precision's quantization settings.

Defaults are the fast path (bench/llm.py measures them as users run them):

- the target: the first of :data:`FASTEST_TARGETS` the installed packs offer. ``onnxruntime``
  (with opreg-ort-contrib: GroupQueryAttention on the cache in place, rotary inside it, packed
  q/k/v) decodes 1.13-1.26x faster than the plain ``onnx`` target's decoder on the 55M Llama;
  ``onnx`` is the portable standard-ONNX decoder, and what is left without the pack.
- int4 and int8 weights: ONNX Runtime's ``com.microsoft::MatMulNBits``, through the pack's
  ``MatMulNBitsQuantization`` pass; its block size, symmetry and accuracy level default to the
  pass's own defaults (measured there), so the command line, ``export_decoder`` and the pass
  agree. A tied embedding then reads the quantized weights (``GatherBlockQuantized``).
"""

from __future__ import annotations

import importlib
from typing import Any

from opreg.errors import InvalidArgumentError, NoImplementationError
from opreg.registry.registry import Registry
from opreg.registry.targets import Target, TargetLike

FASTEST_TARGETS = ("onnxruntime", "onnx")
"""Target profiles from the fastest decoder on CPU to the slowest (bench/llm.py); the first one
installed is the default."""
PRECISIONS = ("fp32", "int8", "int4")
"""What ``precision=`` takes: float32 weights, or weights of 8 or 4 bits (MatMulNBits)."""
QUANTIZATION_PASS = ("opreg_ort_contrib.quantize", "MatMulNBitsQuantization")
"""The module and class of the pass that quantizes weights to MatMulNBits (the opreg-ort-contrib pack)."""
CONTRIB_DOMAIN = "com.microsoft"


def default_target(registry: Registry) -> str:
    """The fastest target profile ``registry``'s packs offer (:data:`FASTEST_TARGETS`)."""
    profiles = registry.profiles
    return next((name for name in FASTEST_TARGETS if name in profiles or name == "onnx"), "onnx")


def resolve_target(target: TargetLike | None, registry: Registry) -> Target:
    """``target``, or the fastest installed one when ``None``, as a :class:`opreg.Target`."""
    return registry.target(default_target(registry) if target is None else target)


def quantization(
    precision: str, target: Target, *, block_size: int | None, symmetric: bool | None, accuracy_level: int | None
) -> Any:
    """The pass that quantizes the decoder's weights to ``precision`` (``None`` for ``fp32``); the
    settings not given (``None``) are the pass's defaults. Refuses settings without a quantized
    precision, and a quantized precision at a target without ONNX Runtime's kernels."""
    if precision not in PRECISIONS:
        raise InvalidArgumentError(f"precision= takes one of {', '.join(PRECISIONS)}, got {precision!r}")
    given = {
        name: value
        for name, value in (("block_size", block_size), ("symmetric", symmetric), ("accuracy_level", accuracy_level))
        if value is not None
    }
    if precision == "fp32":
        if given:
            raise InvalidArgumentError(
                f"{', '.join(given)} set{'s' * (len(given) == 1)} how weights are quantized: give precision='int4' "
                "or 'int8' (--precision int4) with it, or leave it out for float32 weights"
            )
        return None
    if CONTRIB_DOMAIN not in target.as_dict():
        raise InvalidArgumentError(
            f"precision {precision!r} stores weights for ONNX Runtime's com.microsoft::MatMulNBits, which target "
            f"{target.name!r} does not allow: export for target 'onnxruntime' (the default with opreg-ort-contrib)"
        )
    module, name = QUANTIZATION_PASS
    try:
        quantizer = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise NoImplementationError(
            f"precision {precision!r} needs the opreg-ort-contrib pack (pip install opreg-ort-contrib)"
        ) from e
    return quantizer(bits=int(precision.removeprefix("int")), **given)
