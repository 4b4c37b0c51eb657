"""Pre-quantized checkpoints, exported as they are: a GPTQ (gptqmodel, auto-gptq), an AWQ
(autoawq's GEMM layout) or a compressed-tensors ``pack-quantized`` (llmcompressor's W4A16)
checkpoint's linear layers become ONNX Runtime's ``MatMulNBits`` on the integers, scales and zero
points the checkpoint stores, repacked as the model is written: nothing is dequantized and
quantized again, so the calibration the checkpoint's author paid for is kept.

Each format stores a layer's integers packed into int32 words, lowest bits first; what differs
is the axis they are packed along and the order:

- GPTQ: ``qweight`` ``(K * bits / 32, N)`` packed along K; ``qzeros`` ``(groups, N * bits / 32)``
  packed along N, each zero point stored less one (``checkpoint_format`` ``gptq``; ``gptq_v2``
  stores it as it is); ``scales`` ``(groups, N)``; ``g_idx`` ``(K,)``, each input channel's group
  (act-order, ``desc_act``: not ``k // group_size``);
- AWQ (``version`` ``gemm``): ``qweight`` ``(K, N * bits / 32)`` and ``qzeros`` packed along N in
  AWQ's order (word position ``i`` holds column ``[0, 2, 4, 6, 1, 3, 5, 7][i]``); ``scales``
  ``(groups, N)``;
- compressed-tensors: ``weight_packed`` ``(N, K * bits / 32)`` packed along K, the values offset
  by ``2 ** (bits - 1)``; ``weight_scale`` ``(N, groups)``; ``weight_zero_point`` (asymmetric)
  ``(N * bits / 32, groups)`` packed along N; ``weight_shape`` ``[N, K]``; ``weight_g_idx``
  (act-order).

In every format a value is ``(q - zero_point) * scale``, MatMulNBits' own formula. A run of K
packed lowest bits first, on a little-endian host, is MatMulNBits' ``B`` byte for byte: a
compressed-tensors weight is its bytes, a GPTQ weight its bytes transposed; AWQ's is unpacked
and packed again. A group of a size that is a multiple of 16 but not a power of two (or a whole
row) is several MatMulNBits blocks with its scale and zero point repeated. Act-order's groups
are made contiguous by reordering the weight's input channels, and the layer's input by a
``Gather`` (``StoredBlocks.order``).

Refused before the export, naming the tensor or the config key: another method or format, a bit
width but 4 and 8 (MatMulNBits' CPU kernels that were measured), a group that is not a multiple
of 16 or does not divide K, act-order groups of unequal sizes, activations quantized too, a
missing tensor or one of another shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from opreg.errors import ExportError

METHODS = {"gptq": "GPTQ", "awq": "AWQ", "compressed-tensors": "compressed-tensors"}
"""The ``quant_method`` of the formats exported as they are, and their names in messages."""
BITS = (4, 8)
"""The bit widths written: MatMulNBits' CPU kernels in ONNX Runtime 1.32 measured for these."""
MAX_BLOCK = 128
"""The largest MatMulNBits block a stored group is cut into: the fastest measured for
round-to-nearest (:data:`opreg_ort_contrib.quantize.BLOCK_SIZE`)."""
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AWQ's GEMM packing: word position ``i`` holds column ``AWQ_ORDER[i]`` of its eight."""
MAIN = {"gptq": "qweight", "awq": "qweight", "compressed-tensors": "weight_packed"}
"""The tensor that marks a quantized layer in each format."""


@dataclasses.dataclass(frozen=True)
class Scheme:
    """What a checkpoint's ``quantization_config`` says about its linear layers.

    Fields:
        method: a key of :data:`METHODS`.
        bits: the bits of every quantized value.
        zero_offset: what is added to a stored zero point (GPTQ's ``gptq`` format stores it less one).
    """

    method: str
    bits: int
    zero_offset: int = 0

    @property
    def name(self) -> str:
        return METHODS[self.method]


def quantization_config(config: Any) -> dict[str, Any] | None:
    """The config's ``quantization_config`` as a dict, or ``None``."""
    found = getattr(config, "quantization_config", None)
    if found is None:
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        found = getattr(text, "quantization_config", None)
    if found is None or isinstance(found, dict):
        return found
    return found.to_dict() if hasattr(found, "to_dict") else dict(vars(found))


def scheme_of(config: Any, what: str) -> Scheme | None:
    """The :class:`Scheme` of a quantized checkpoint's config (``None``: not quantized), refused
    (naming the key) where opreg cannot write it as it is; ``what`` names the checkpoint."""
    settings = quantization_config(config)
    if settings is None:
        return None
    method = str(settings.get("quant_method", "")).lower()
    if method not in METHODS:
        _refuse(what, f"quant_method {method!r}", f"opreg exports {', '.join(METHODS.values())} checkpoints")
    if method == "compressed-tensors":
        bits = _compressed_bits(settings, what)
        return Scheme(method, bits)
    bits = settings.get("bits", settings.get("w_bit"))
    if bits not in BITS:
        _refuse(what, f"bits {bits!r}", f"MatMulNBits is written for {' and '.join(map(str, BITS))} bits")
    if method == "awq":
        version = str(settings.get("version", "gemm")).lower()
        if version != "gemm":
            _refuse(what, f"AWQ version {version!r}", "opreg reads AWQ's GEMM layout (version 'gemm')")
        if not settings.get("zero_point", True):
            _refuse(what, "AWQ zero_point false", "opreg reads AWQ's GEMM layout, which stores zero points")
        return Scheme(method, bits)
    layout = str(settings.get("checkpoint_format", settings.get("format", "gptq"))).lower()
    if layout not in ("gptq", "gptq_v2"):
        _refuse(what, f"GPTQ checkpoint_format {layout!r}", "opreg reads 'gptq' and 'gptq_v2' (not Marlin, BitBLAS)")
    return Scheme(method, bits, zero_offset=1 if layout == "gptq" else 0)


def _compressed_bits(settings: Mapping[str, Any], what: str) -> int:
    """The bits of a compressed-tensors config's weights, refused unless it is ``pack-quantized``
    weight-only integers of one bit width."""
    if settings.get("format") not in ("pack-quantized", None) and settings.get("config_groups") is None:
        _refuse(what, f"compressed-tensors format {settings.get('format')!r}", "opreg reads 'pack-quantized'")
    bits = set()
    for name, group in (settings.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        form = group.get("format") or settings.get("format")
        key = f"config_groups.{name}"
        if form != "pack-quantized":
            _refuse(what, f"{key}.format {form!r}", "opreg reads 'pack-quantized' (weights as packed integers)")
        if weights.get("type", "int") != "int" or weights.get("dynamic"):
            _refuse(what, f"{key}.weights (type {weights.get('type')!r})", "opreg reads static integer weights")
        if group.get("input_activations") or group.get("output_activations"):
            _refuse(what, f"{key}.input_activations", "MatMulNBits keeps activations float: a W4A16 checkpoint")
        if weights.get("strategy") not in ("group", "channel"):
            _refuse(what, f"{key}.weights.strategy {weights.get('strategy')!r}", "opreg reads 'group' and 'channel'")
        bits.add(weights.get("num_bits"))
    if len(bits) != 1 or not bits <= set(BITS):
        _refuse(what, f"num_bits {sorted(bits, key=str)}", f"MatMulNBits is written for one of {BITS} bits")
    return bits.pop()


def _refuse(what: str, found: str, why: str) -> None:
    raise ExportError(
        f"{what} is quantized with {found}: {why}; it cannot be exported as it is stored (dequantizing it and "
        "quantizing again would lose its calibration): give a checkpoint of a supported format, or its float one"
    )


# -- a request ------------------------------------------------------------------------------------------------


def check_request(config: Any, family: str, folder: Any, streaming: bool | None, what: str) -> Scheme | None:
    """The :class:`Scheme` of a checkpoint ``folder``'s config (``None``: not quantized, or a model
    given), refused before anything is loaded where its family or the options cannot export it
    as it is stored."""
    if folder is None:
        return None
    scheme = scheme_of(config, what)
    if scheme is None:
        return None
    if family != "causal":
        raise ExportError(
            f"{what} is a {scheme.name} checkpoint: opreg exports the quantized checkpoints of causal LMs only "
            "(export_decoder); give this model's float checkpoint"
        )
    if streaming is False:
        raise ExportError(
            f"{what} is a {scheme.name} checkpoint: streaming=False would load it through transformers, which "
            "dequantizes its weights; leave streaming on (the default) to write its integers as they are"
        )
    return scheme
