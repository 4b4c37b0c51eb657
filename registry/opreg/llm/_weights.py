"""The weights' precision of a language-model export: float32, or the linear layers' weights in 8
or 4 bits as ONNX Runtime's ``com.microsoft::MatMulNBits`` (``opreg-ort-contrib``'s
:class:`~opreg_ort_contrib.MatMulNBitsQuantization`, with the settings of ONNX Runtime GenAI's
builder for ``-p int4 -e cpu``: blocks of 32, symmetric, accuracy level 4)."""

from __future__ import annotations

from typing import Any

from opreg.errors import ExportError, InvalidArgumentError

PRECISIONS = {"fp32": None, "int8": 8, "int4": 4}
"""Each precision and its bits (``None``: the weights as they are, float32)."""
BLOCK_SIZE, ACCURACY_LEVEL = 32, 4


def passes(precision: str, target: Any, embeddings: bool = False) -> list[Any]:
    """The export passes that give linear weights ``precision`` at ``target`` (an :class:`opreg.Target`);
    ``embeddings``: an embedding table no linear layer reads too (``GatherBlockQuantized``)."""
    if precision not in PRECISIONS:
        raise InvalidArgumentError(f"precision={precision!r}: give one of {', '.join(PRECISIONS)}")
    bits = PRECISIONS[precision]
    if bits is None:
        return []
    if "com.microsoft" not in target.as_dict():
        raise InvalidArgumentError(
            f"precision={precision!r} stores linear weights as ONNX Runtime's MatMulNBits (com.microsoft), which the "
            f"target {target.as_dict()} does not have: export with target='onnxruntime'"
        )
    try:
        from opreg_ort_contrib import MatMulNBitsQuantization
    except ImportError as e:
        raise ExportError(
            f"precision={precision!r} stores linear weights as ONNX Runtime's MatMulNBits, which the opreg-ort-contrib "
            "pack writes: install it (pip install opreg-ort-contrib)"
        ) from e
    return [MatMulNBitsQuantization(bits=bits, block_size=BLOCK_SIZE, symmetric=True, accuracy_level=ACCURACY_LEVEL,
                                    embeddings=embeddings)]  # fmt: skip


def check(program: Any, precision: str, what: str) -> None:
    """Refuse a ``precision`` the export could not give: no linear layer of ``what`` became a
    MatMulNBits (a target without ONNX Runtime's domain keeps them as Gemm or MatMul)."""
    if PRECISIONS[precision] is None:
        return
    if not any(node.op_type == "MatMulNBits" for node in program.model.graph):
        raise ExportError(
            f"precision={precision!r} quantized none of the {what}'s linear layers: MatMulNBits is ONNX Runtime's "
            "kernel; export with target='onnxruntime'"
        )


def export_settings(function: str, precision: str, settings: Any, options: dict[str, Any]) -> tuple[Any, Any]:
    """The :class:`opreg.ExportSettings` of a language-model export's call (``function``: its name,
    in messages; :func:`opreg.llm._decoder.settings_of`) with the target resolved by the registry,
    and the same with the passes that give ``precision`` after the call's own."""
    import dataclasses

    from opreg.llm._decoder import settings_of
    from opreg.packs.plugins import default_registry

    settings = settings_of(function, settings, options)
    registry = settings.registry or default_registry(plugins=settings.plugins, exclude=settings.exclude)
    settings = dataclasses.replace(settings, target=registry.target(settings.target))
    quantized = dataclasses.replace(settings, passes=[*settings.passes, *passes(precision, settings.target)])
    return settings, quantized
