"""The options of a language-model export, declared once: :class:`LLMSettings`.

Each field of :class:`LLMSettings` is one option: its type and default are the field's, and its
:class:`Option` (the field's metadata, made by :func:`option`) says what it does, which families
take it, how ``opreg llm export`` spells it and what a value must be. From the fields are built:

- the keyword parameters of :func:`opreg.llm.export_decoder`, :func:`~opreg.llm.export_whisper`,
  :func:`~opreg.llm.export_vision` and :func:`~opreg.llm.export_checkpoint`
  (:func:`takes_llm_settings`: each function the options of its family);
- the flags of ``opreg llm export`` (:mod:`opreg.cli.llm` adds each :class:`Flag`);
- the checks of a value (:meth:`LLMSettings.__post_init__`), and the refusal of an option the
  checkpoint's family does not take (:mod:`opreg.llm._export`, from :attr:`Option.families`);
- the class's docstring; docs/language-models.md's table ("Options") is held to them by
  tests/test_llm_settings.py.

A new option is one field here and one row in that table (and its use where it acts).
torch-free, and without :mod:`opreg.settings` until a signature is built: ``opreg llm export``'s
parser adds its flags from this module.
"""

import argparse
import dataclasses
import inspect
import os
import textwrap
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opreg.errors import InvalidArgumentError
from opreg.registry.targets import TargetLike

FAMILIES = {"causal": "causal LM", "whisper": "Whisper model", "vision": "vision-language model"}
"""The families by key (:attr:`opreg.llm._family.Family.key`), as options name them, and what each
exports, in messages (:attr:`opreg.llm._family.Family.name`)."""
PRECISIONS = ("fp32", "int8", "int4")
"""What ``precision=`` takes: float32 weights, or weights of 8 or 4 bits (MatMulNBits)."""
INT4_ALGOS = ("rtn", "k_quant", "hqq", "gptq")
"""What ``int4_algo=`` takes: the opreg-ort-contrib pack's ``int4_algos.ALGORITHMS``, and ``gptq``
(:mod:`opreg.llm._gptq`, computed before the capture and written by the pack's stored pass)."""
LAYOUTS = ("genai", "optimum")
"""What ``layout=`` takes: the folder ONNX Runtime GenAI loads, or (a causal LM) the folder optimum-onnx
writes for ``text-generation-with-past``, which optimum's ORTModelForCausalLM and transformers.js load."""
INT32_MAX = 2**31 - 1
"""GenAI keeps lengths in int32 (GroupQueryAttention's ``seqlens_k`` and ``total_sequence_length``)."""
DECODER_OPTIONS = ("dynamic_shapes", "state")
"""The options of :class:`opreg.ExportSettings` a family's layout sets: the language-model exports
do not take them."""


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag of an option.

    Fields:
        names: its spellings (``("--target", "-t")``).
        argparse: the rest of ``argparse.ArgumentParser.add_argument``'s keywords (``action``,
            ``type``, ``choices``, ``metavar``, ``const``); ``dest`` is the field and ``default``
            its default.
        help: what the flag does where it is only part of the option (``--no-tokenizer``);
            ``None``: the option's help.
    """

    names: tuple[str, ...]
    argparse: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    help: str | None = None


@dataclasses.dataclass(frozen=True)
class Option:
    """What one field of :class:`LLMSettings` is, besides its type and default.

    Fields:
        help: what it does (one paragraph: the docstring, ``--help`` and the docs' table say it).
        families: the keys of the families that take it (:data:`FAMILIES`); another family's export
            refuses it when given.
        flags: its command-line flags, ``()`` for an option of the Python API only; two or more
            are mutually exclusive (``--symmetric``/``--asymmetric``).
        check: the value's check: ``None`` when good, else what is wrong (the error's message).
        quantizes: it sets how weights are quantized: given only with a quantized precision, and
            passed on to the quantization pass by name.
    """

    help: str
    families: tuple[str, ...] = tuple(FAMILIES)
    flags: tuple[Flag, ...] = ()
    check: Callable[[Any], str | None] | None = None
    quantizes: bool = False

    def spelled(self, name: str) -> str:
        """The option as a caller may have given it: its name and its flags (``block_size (--block-size)``)."""
        flags = "/".join(n for flag in self.flags for n in flag.names if n.startswith("--"))
        return f"{name} ({flags})" if flags else name


def option(default: Any, help: str, **declared: Any) -> Any:
    """A field of :class:`LLMSettings`: its default, and its :class:`Option` (``help`` and the rest
    by keyword) as the field's metadata."""
    return dataclasses.field(default=default, metadata={"option": Option(" ".join(help.split()), **declared)})


def _one_of(name: str, values: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda value: None if value in values else f"{name}= takes one of {', '.join(values)}, got {value!r}"


def _context_length(value: Any) -> str | None:
    """A ``context_length`` no model can have (not an int, below 1, above int32)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"context_length= takes a positive int (or None), got {value!r}"
    if value < 1:
        return f"context_length must be at least 1, got {value}: GenAI generates up to it"
    if value > INT32_MAX:
        return f"context_length {value} is above {INT32_MAX}, the longest sequence ONNX Runtime GenAI counts (int32)"
    return None


def _folder(name: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None or isinstance(value, (str, os.PathLike)):
            return None
        return f"{name}= takes a folder (a path), got {type(value).__name__}"

    return check


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.split(",") if part)


def _folders(value: Any) -> str | None:
    """``adapters``: a non-empty list of folders of distinct names (each names its adapter file)."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)) or not all(isinstance(v, (str, os.PathLike)) for v in value):
        return f"adapters= takes a list of adapter folders, got {value!r}"
    names = [os.path.basename(os.path.normpath(v)) for v in value]
    if not names:
        return "adapters= takes at least one adapter folder"
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"adapters= names two adapters {', '.join(twice)} (each is named by its folder): rename a folder"
    return None


def _value(names: tuple[str, ...], **argparse: Any) -> Flag:
    return Flag(names, argparse)


_BLOCKS = "int8/int4 only"
_CAUSAL = ("causal",)


@dataclasses.dataclass(frozen=True)
class LLMSettings:
    target: TargetLike | None = option(
        None, """what the models must run on: 'onnxruntime' (with opreg-ort-contrib: ONNX Runtime's fused kernels,
        the cache written in place) or 'onnx' (portable standard ONNX: attention as Attention or MatMul/Softmax, the
        cache a Concat of past and new), or any target opreg.export takes; default the fastest installed
        ('onnxruntime' with opreg-ort-contrib, else 'onnx')""",
        flags=(_value(("--target", "-t")),),
    )  # fmt: skip
    layout: str = option(
        "genai", """the folder's layout: 'genai', the models, genai_config.json and processors ONNX Runtime GenAI
        loads; 'optimum' (a causal LM only), model.onnx with config.json, generation_config.json and the tokenizer
        as optimum-onnx writes text-generation-with-past, which optimum's ORTModelForCausalLM and transformers.js
        load""",
        flags=(_value(("--layout",), choices=LAYOUTS),), check=_one_of("layout", LAYOUTS),
    )  # fmt: skip
    precision: str = option(
        "fp32", """the linear layers' weights: 'fp32' (as the model has them), 'int8' or 'int4' (block-wise, ONNX
        Runtime's MatMulNBits, at a target with com.microsoft; a tied embedding table is then stored once, quantized,
        read by GatherBlockQuantized). Whisper and vision-language models are quantized as GenAI's builder does for
        CPU (blocks of 32, symmetric, accuracy level 4; a vision encoder stays float32)""",
        flags=(_value(("--precision",), choices=PRECISIONS),), check=_one_of("precision", PRECISIONS),
    )  # fmt: skip
    block_size: int | None = option(
        None, f"{_BLOCKS}: values per block, a power of two of at least 16; default MatMulNBitsQuantization's (128, "
        "the fastest measured)",
        families=_CAUSAL, flags=(_value(("--block-size",), type=int, metavar="N"),), quantizes=True,
    )  # fmt: skip
    symmetric: bool | None = option(
        None, f"{_BLOCKS}: values around 0, no zero points (True, the default), or a zero point per block (False)",
        families=_CAUSAL, quantizes=True, flags=(
            Flag(("--symmetric",), {"action": "store_const", "const": True},
                 f"{_BLOCKS}: values around 0, no zero points (the default)"),
            Flag(("--asymmetric",), {"action": "store_const", "const": False}, f"{_BLOCKS}: a zero point per block"),
        ),
    )  # fmt: skip
    accuracy_level: int | None = option(
        None, f"""{_BLOCKS}: MatMulNBits' accuracy_level, the lowest precision its input is computed in (default 4:
        int8, the fastest on CPU; 0: float)""",
        families=_CAUSAL, flags=(_value(("--accuracy-level",), type=int, choices=range(5), metavar="{0-4}"),),
        quantizes=True,
    )  # fmt: skip
    int4_algo: str | None = option(
        None, """int4 only: how the int4 values are chosen: 'rtn' (round to nearest, the default: the fastest to
        run and to export), 'k_quant' (ONNX Runtime's k-quant search of each block's scale and zero point, the head
        and the most sensitive projections in int8, as GenAI's builder's k_quant_mixed: more accurate, larger and
        slower), 'hqq' (ONNX Runtime's HQQ, its zero points rounded to integers: no more accurate than rtn on the
        model measured) or 'gptq' (opreg's GPTQ on random-token calibration, symmetric: rtn's size and speed, more
        accurate; loads the float checkpoint once to calibrate)""",
        families=_CAUSAL, flags=(_value(("--int4-algo",), choices=INT4_ALGOS),),
        check=lambda value: None if value is None else _one_of("int4_algo", INT4_ALGOS)(value), quantizes=True,
    )  # fmt: skip
    tokenizer: Any = option(
        None, """what to save beside the models: a transformers tokenizer, or a folder holding one; default the
        checkpoint folder's (a warning when it has none: GenAI needs one to encode text); False: none""",
        flags=(Flag(("--no-tokenizer",), {"action": "store_const", "const": False},
                    "write no tokenizer (and no warning when the checkpoint has none)"),),
    )  # fmt: skip
    external_data: bool = option(
        True, """the weights in a file beside each model (the default, as GenAI's builder writes them: saved faster,
        without a serialized copy in memory), else inside it (False, --no-external-data: a model of up to 2 GB)""",
        flags=(_value(("--external-data",), action=argparse.BooleanOptionalAction),),
    )  # fmt: skip
    context_length: int | None = option(
        None, """the longest sequence GenAI may generate (genai_config.json's context_length and search.max_length,
        and the bound of the sequence and past dims), from 1 to 2**31 - 1; default the model's position limit
        (max_position_embeddings, Whisper's max_target_positions), and above it only with allow_longer_context""",
        flags=(_value(("--context-length",), type=int, metavar="N"),), check=_context_length,
    )  # fmt: skip
    allow_longer_context: bool = option(
        False, "allow a context_length above the model's position limit (for positions that extrapolate)",
        flags=(_value(("--allow-longer-context",), action="store_true"),),
    )  # fmt: skip
    streaming: bool | None = option(
        None, """for a checkpoint folder: build the model on meta and read each weight from its safetensors only as
        model.onnx is written (cast, packed, quantized there: the same bytes, in a fraction of the memory); False:
        load the model with its weights first; default: when the folder holds safetensors""",
        families=_CAUSAL, flags=(Flag(("--no-streaming",), {"action": "store_false"},
                                      "load the model with its weights first (default: stream them from the "
                                      "safetensors files as model.onnx is written)"),),
    )  # fmt: skip
    adapter: Any = option(
        None, """a PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) merged into the weights:
        W + scale * B @ A computed as model.onnx is written, read from the lazy weights; a checkpoint folder only""",
        families=_CAUSAL, flags=(_value(("--adapter",), metavar="FOLDER"),), check=_folder("adapter"),
    )  # fmt: skip
    adapters: Any = option(
        None, """PEFT LoRA adapter folders (a list; the flag: comma-separated) the base model takes as inputs (each
        adapted linear layer's A and B, empty by default: the base model), each written as <folder name>.onnx_adapter
        beside model.onnx, which GenAI's Adapters load and switch per request""",
        families=_CAUSAL, flags=(_value(("--adapters",), type=_comma_list, metavar="A,B,..."),), check=_folders,
    )  # fmt: skip
    features: bool = option(
        False, """a causal LM's base model (transformers' AutoModel: a ...Model checkpoint, no LM head) as optimum-onnx
        writes feature-extraction-with-past: input_ids, attention_mask (and position_ids where the model takes them)
        in, last_hidden_state and every layer's present keys and values out, no past in; layout 'optimum' only""",
        families=_CAUSAL,
    )  # fmt: skip
    position_ids: bool | None = option(
        None, """whether the decoder takes position_ids: default when the model's forward takes them; False: never,
        the model numbering the new tokens after the past itself, as optimum-onnx's export of a family whose config
        takes none (Gemma, BLOOM, MPT): a left-padded row's positions then count its padding; True: refused where the
        model takes none""",
        families=_CAUSAL,
    )  # fmt: skip
    feature_extractor: Any = option(
        None, """a transformers WhisperFeatureExtractor, or a folder holding one; default the checkpoint folder's, else
        Whisper's defaults for the model's mel bins""",
        families=("whisper",),
    )  # fmt: skip
    image_processor: Any = option(
        None, """a transformers image processor, or a folder holding one; default the checkpoint folder's, else the
        architecture's default for the model's image size""",
        families=("vision",),
    )  # fmt: skip

    def __post_init__(self) -> None:
        for field, option_ in self.options():
            wrong = option_.check(getattr(self, field.name)) if option_.check is not None else None
            if wrong is not None:
                raise InvalidArgumentError(wrong)
        if self.adapter is not None and self.adapters is not None:
            raise InvalidArgumentError(
                "adapter= (--adapter) merges one adapter into the weights and adapters= (--adapters) makes them "
                "inputs: give one of them"
            )
        if self.int4_algo not in (None, "rtn") and self.precision != "int4":
            raise InvalidArgumentError(
                f"int4_algo={self.int4_algo!r} chooses int4 weights: give precision='int4' (--precision int4) with "
                "it, or leave it out"
            )
        if self.int4_algo == "gptq" and (self.symmetric is False or self.streaming is False):
            wrong = "symmetric=False" if self.symmetric is False else "streaming=False"
            raise InvalidArgumentError(
                f"int4_algo='gptq' writes symmetric blocks into the streamed checkpoint's weights: leave {wrong} out"
            )
        if self.features and (self.layout != "optimum" or self.adapter or self.adapters or self.int4_algo == "gptq"):
            raise InvalidArgumentError(
                "features=True exports a base model's hidden states and cache as optimum's "
                "feature-extraction-with-past: give layout='optimum' (--layout optimum), without adapter, adapters or "
                "int4_algo='gptq' (they are for a causal LM's generation)"
            )
        given = [name for name in self.quantization() if name not in STORED_OPTIONS]
        if given and self.precision == "fp32":
            raise float_weights(given)

    @classmethod
    def options(cls) -> list[tuple[dataclasses.Field, Option]]:
        """Every field with its :class:`Option`, in order (how ``opreg llm export`` adds its flags)."""
        return [(field, field.metadata["option"]) for field in dataclasses.fields(cls)]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options' names, in the order of the fields."""
        return tuple(field.name for field in dataclasses.fields(cls))

    def given(self) -> dict[str, Any]:
        """The options set to other than their default, by name."""
        return {field.name: getattr(self, field.name) for field, _ in self.options()
                if not _is_default(getattr(self, field.name), field.default)}  # fmt: skip

    def quantization(self) -> dict[str, Any]:
        """The options that set how weights are quantized, those given, by name."""
        return {
            f.name: getattr(self, f.name)
            for f, o in self.options()
            if o.quantizes and getattr(self, f.name) is not None
        }


STORED_OPTIONS = ("accuracy_level",)
"""The quantization options a quantized checkpoint takes at ``fp32`` too (how MatMulNBits computes
on its stored integers: :mod:`opreg.llm._quantized`); a float checkpoint's export refuses them
without a quantized precision (:func:`float_weights`)."""


def float_weights(given: list[str]) -> InvalidArgumentError:
    """The refusal of quantization options ``given`` (names) where the weights stay float."""
    return InvalidArgumentError(
        f"{', '.join(given)} set{'s' * (len(given) == 1)} how weights are quantized: give precision='int4' "
        "or 'int8' (--precision int4) with it, or leave it out for float32 weights"
    )


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def refuse_others(family: str, values: Mapping[str, Any]) -> None:
    """Refuse the options of ``values`` (by name) given (not their default) that the family
    ``family`` (a key) does not take, naming the families that do."""
    declared = {field.name: (field.default, option_) for field, option_ in LLMSettings.options()}
    others = {n: declared[n][1] for n, v in values.items() if not _is_default(v, declared[n][0])}
    others = {n: option_ for n, option_ in others.items() if family not in option_.families}
    if not others:
        return
    takers = [name for key, name in FAMILIES.items() if any(key in o.families for o in others.values())]
    one = len(others) == 1
    raise InvalidArgumentError(
        f"a {FAMILIES[family]} does not take {', '.join(o.spelled(n) for n, o in others.items())}: "
        f"{'it is' if one else 'they are'} for a {' or '.join(takers)} only; leave {'it' if one else 'them'} out"
    )


def takes(family: str | None) -> list[str]:
    """The options a family takes, by name (``None``: any family's, every option)."""
    return [field.name for field, option_ in LLMSettings.options() if family is None or family in option_.families]


def _docstring() -> str:
    """:class:`LLMSettings`' docstring, each attribute's text its :attr:`Option.help`."""
    lines = [
        "How to export a language model: the options of :func:`opreg.llm.export_checkpoint` (and, each",
        "family's, of ``export_decoder``, ``export_whisper``, ``export_vision``; the flags of ``opreg llm",
        'export``). Every value is checked when the settings are made; docs/language-models.md ("Options")',
        "has them as a table.",
        "",
        "Attributes:",
    ]
    for field, option_ in LLMSettings.options():
        families = "" if option_.families == tuple(FAMILIES) else f" Taken by: {', '.join(option_.families)}."
        flags = ", ".join(n for flag in option_.flags for n in flag.names)
        text = f"{field.name}: {option_.help}. Default ``{field.default!r}``.{families}"
        text += f" Flags: {flags}." if flags else " Python only."
        lines += textwrap.wrap(text, 100, initial_indent="    ", subsequent_indent="        ")
    return "\n".join(lines)


LLMSettings.__doc__ = _docstring()

F = TypeVar("F", bound=Callable[..., Any])


def takes_llm_settings(family: str | None) -> Callable[[F], F]:
    """Give a function written ``f(..., [settings=None,] **options)`` the signature
    ``inspect.signature`` shows: its own parameters, then as keyword-only parameters (type and
    default) the options ``family`` takes (``None``: every option) and :class:`opreg.ExportSettings`'
    fields but the layouts' (:data:`DECODER_OPTIONS`) and ``target`` (an option here), then a
    keyword-only ``settings``. The function itself sorts ``options`` out."""
    llm = set(takes(family))

    def decorate(function: F) -> F:
        from opreg.settings import ExportSettings

        own = inspect.signature(function)
        keyword_settings = [p for p in own.parameters.values() if p.name == "settings" and p.kind == p.KEYWORD_ONLY]
        keep = [p for p in own.parameters.values() if p.kind != p.VAR_KEYWORD and p not in keyword_settings]
        left_out = {*DECODER_OPTIONS, "target"}
        fields = [f for f, _ in LLMSettings.options() if f.name in llm]
        fields += [f for f in dataclasses.fields(ExportSettings) if f.name not in left_out]
        keywords = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
                    for f in fields]  # fmt: skip
        function.__signature__ = own.replace(parameters=[*keep, *keywords, *keyword_settings])  # type: ignore[attr-defined]
        return function

    return decorate
