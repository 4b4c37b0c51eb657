"""What the transformers loader knows of encoder-decoder language models (T5, BART, Marian,
M2M100 and NLLB, which is an M2M100): the tasks optimum exports them for and their layout, as
optimum-onnx 0.1.0 writes it (``TextSeq2SeqOnnxConfig`` and ``OnnxSeq2SeqConfigWithPast`` in
``optimum/exporters/onnx/``, ``merge_decoders`` in ``optimum/onnx/graph_transformations.py``):

- ``encoder_model.onnx``: ``input_ids``, ``attention_mask`` -> ``last_hidden_state``;
- ``decoder_model.onnx``: ``encoder_attention_mask``, ``input_ids``, ``encoder_hidden_states`` ->
  ``logits``, ``present.{i}.decoder.key``/``.value``, ``present.{i}.encoder.key``/``.value``;
- with past (``text2text-generation-with-past``, inferred as optimum infers it):
  ``decoder_with_past_model.onnx`` (``past_key_values.{i}.decoder.*``, ``.encoder.*`` in; the
  self-attention's presents out) and ``decoder_model_merged.onnx``, the two decoders in one graph
  behind an ``If`` on ``use_cache_branch`` (:mod:`opreg_transformers.merging`), which
  transformers.js loads.

``translation`` and ``summarization`` are optimum's synonyms of ``text2text-generation``;
``feature-extraction`` (and its ``-with-past``, inferred for a bare ``...Model``) is the same
layout with the decoder's ``last_hidden_state`` for ``logits``. The plan's loop check
(:mod:`opreg_transformers.generation`) runs the written folder's decoding in ONNX Runtime against
transformers: greedy generation against ``generate``, or the decoder's states step by step. Importing
this module imports neither torch nor transformers: ``plan`` imports transformers, the build steps
torch (:mod:`opreg_transformers.seq2seq_steps`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import opreg
from opreg_transformers import encoders

TEXT2TEXT = "text2text-generation"
FEATURES = "feature-extraction"
PAST_SUFFIX = "-with-past"
HEADS = {TEXT2TEXT: ("AutoModelForSeq2SeqLM", "logits"), FEATURES: ("AutoModel", "last_hidden_state")}
"""``{task: (transformers auto class, the decoder's first output)}``."""
SYNONYMS = {"translation": TEXT2TEXT, "summarization": TEXT2TEXT}
"""optimum's synonyms (``TasksManager._SYNONYM_TASK_MAP``): each exported as the task it names."""
TASKS = (*(task + PAST_SUFFIX for task in HEADS), *HEADS, *SYNONYMS)
CAUSAL = "text-generation"
CAUSAL_WITH_PAST = CAUSAL + PAST_SUFFIX
"""optimum's tasks of a BART-like family's ``...ForCausalLM`` decoder: without its cache
(:mod:`opreg_transformers.decoders`), and with it, inferred (:mod:`opreg_transformers.causal`)."""
FILES = ("source.spm", "target.spm")
"""Marian's sentencepiece models, copied beside the tokenizer files every transformers folder gets."""

ENCODER, DECODER, WITH_PAST_DECODER, MERGED = (
    "encoder_model", "decoder_model", "decoder_with_past_model", "decoder_model_merged",
)  # fmt: skip

RELATIVE = "relative"
LEARNED = "learned"
SINUSOIDAL = "sinusoidal"


@dataclasses.dataclass(frozen=True)
class Family:
    """One encoder-decoder family (a config's ``model_type``), read from its transformers config.

    Fields:
        layers, heads: the config's attributes holding the decoder's layers and attention heads.
        head_size: the attribute holding the size of a head (T5's ``d_kv``); ``None``:
            ``d_model // heads``.
        positions: how long its sequences may be: ``relative`` (T5's buckets: no limit),
            ``learned`` (a table of ``max_position_embeddings``: BART's, Marian's sinusoids kept
            as one), ``sinusoidal`` (M2M100's, computed and regrown: exported with a table of
            twice ``max_position_embeddings``, so a past and new tokens each up to it fit).
        more: the tasks it takes besides :data:`TASKS`, one ``model.onnx`` each (its
            ``...ForCausalLM`` decoder's ``text-generation`` and ``-with-past``; BART's and
            mBART's heads).
    """

    layers: str
    heads: str
    head_size: str | None
    positions: str
    more: tuple[str, ...] = ()


_BART_LIKE = {"layers": "decoder_layers", "heads": "decoder_attention_heads", "head_size": None}
_T5_LIKE = {"layers": "num_decoder_layers", "heads": "num_heads", "head_size": "d_kv"}
_DECODER = {**_BART_LIKE, "positions": LEARNED, "more": (CAUSAL_WITH_PAST, CAUSAL)}
_CLASSIFIERS = {**_DECODER, "more": (*_DECODER["more"], "text-classification", "question-answering")}
FAMILIES: dict[str, Family] = {
    "bart": Family(**_CLASSIFIERS),
    "blenderbot": Family(**_DECODER),
    "blenderbot-small": Family(**_DECODER),
    "m2m_100": Family(**_BART_LIKE, positions=SINUSOIDAL),
    "marian": Family(**_DECODER),
    "mbart": Family(**_CLASSIFIERS),
    "mt5": Family(**_T5_LIKE, positions=RELATIVE),
    "pegasus": Family(**_DECODER),
    "t5": Family(**_T5_LIKE, positions=RELATIVE),
}
"""``{model_type: Family}``: the families exported, each verified by tests/test_checkpoint_seq2seq.py."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """The sizes an export and its generation loop need, read from the transformers config.

    Fields:
        layers, heads, head_size: the decoder's (its cache is ``[batch, heads, length, head_size]``).
        hidden: ``d_model``, the encoder's output size.
        vocab, decoder_vocab: the token ids the encoder and the decoder take (Marian's may differ).
        longest: the longest sequence (and past plus new tokens) the positions hold; ``None``: no limit.
        start: the decoder's first token (``decoder_start_token_id``).
    """

    layers: int
    heads: int
    head_size: int
    hidden: int
    vocab: int
    decoder_vocab: int
    longest: int | None
    start: int


def layout_of(family: Family, config: Any, generation: dict[str, Any] | None = None) -> Layout:
    """The :class:`Layout` of a transformers config of ``family``; the decoder's first token from
    ``generation`` (``generation_config.json``'s object) where it sets one, as ``generate`` takes it."""
    heads = int(getattr(config, family.heads))
    size = getattr(config, family.head_size) if family.head_size else config.d_model // heads
    longest = None if family.positions == RELATIVE else int(config.max_position_embeddings)
    start = (generation or {}).get("decoder_start_token_id", config.decoder_start_token_id)
    if not isinstance(start, int):
        raise opreg.CheckpointError(
            f"neither config.json nor generation_config.json of this {config.model_type} sets an integer "
            f"decoder_start_token_id (the decoder's first token; got {start!r}): add the model's to config.json"
        )
    vocab = int(config.vocab_size)
    return Layout(
        int(getattr(config, family.layers)), heads, int(size), int(config.d_model), vocab,
        int(getattr(config, "decoder_vocab_size", None) or vocab), longest, int(start),
    )  # fmt: skip


def recognition(family: Family, architectures: list[str], evidence: str) -> opreg.Recognition:
    """The tasks of an encoder-decoder folder; with past, as optimum infers when no task is asked:
    ``feature-extraction-with-past`` for a bare ``...Model`` (``T5Model``; Marian's ``MarianMTModel``
    is its language model), ``text2text-generation-with-past`` else; a ``...ForCausalLM`` decoder's
    ``text-generation-with-past``."""
    causal = architectures and all(name.endswith("ForCausalLM") for name in architectures)
    if causal and CAUSAL_WITH_PAST in family.more:
        return opreg.Recognition("transformers", (*TASKS, *family.more), CAUSAL_WITH_PAST, evidence)
    head = encoders.task_of(architectures)  # ...ForSequenceClassification, ...ForQuestionAnswering
    if head in family.more:
        return opreg.Recognition("transformers", (*TASKS, *family.more), head, evidence)
    heads = [name.endswith("Model") and not name.endswith("MTModel") for name in architectures]
    task = FEATURES if heads and all(heads) else TEXT2TEXT
    return opreg.Recognition("transformers", (*TASKS, *family.more), task + PAST_SUFFIX, evidence)


def task_parts(task: str) -> tuple[str, bool]:
    """``(the task of HEADS, with past)`` of ``task``, a synonym read as optimum reads it."""
    task = SYNONYMS.get(task, task)
    return task.removesuffix(PAST_SUFFIX), task.endswith(PAST_SUFFIX)


def auto_of(task: str) -> str:
    """The transformers auto class of ``task``'s model."""
    return HEADS[task_parts(task)[0]][0]


# -- the plan ---------------------------------------------------------------------------------------


def plan(checkpoint: opreg.Checkpoint, task: str, files: tuple[opreg.FileCopy, ...]) -> opreg.ExportPlan:
    """The export of ``task``: the encoder, the decoder and, with past, the decoder with past and
    the merged decoder; ``files`` and Marian's sentencepiece models copied; the greedy loop checked."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(checkpoint.path, trust_remote_code=False)
    family = FAMILIES[config.model_type]
    layout = layout_of(family, config, checkpoint.json("generation_config.json"))
    head, past = task_parts(task)
    auto, output = HEADS[head]
    model = functools.cache(functools.partial(_load, checkpoint, family, layout, auto))
    components = [_encoder(layout, model), _decoder(layout, model, output)]
    steps: tuple[opreg.PostStep, ...] = ()
    if past:
        components.append(_decoder_with_past(layout, model, output))
        steps = (opreg.PostStep(MERGED, f"{MERGED}.onnx", _merge),)
    name = "greedy" if head == TEXT2TEXT else "decoding"
    check = opreg.LoopCheck(name, functools.partial(_decoding, layout, model, past, output))
    copies = (*files, *(opreg.FileCopy(name) for name in FILES))
    return opreg.ExportPlan("transformers", task, tuple(components), copies, steps, (check,), _notes(layout))


def _load(checkpoint: opreg.Checkpoint, family: Family, layout: Layout, auto: str) -> Any:
    """The model, loaded once for every component and the loop check."""
    from opreg_transformers import loading

    model = loading.load(checkpoint.path, auto)
    if family.positions == SINUSOIDAL:
        from opreg_transformers.seq2seq_steps import grow_sinusoidal_positions

        assert layout.longest is not None
        grow_sinusoidal_positions(model, 2 * layout.longest)
    return model


def _dims(layout: Layout) -> dict[str, opreg.DynamicDim]:
    """The dims by name: the examples and second sizes within what the positions hold."""
    longest = layout.longest

    def dim(name: str, example: int, other: int, room: int = 0) -> opreg.DynamicDim:
        top = None if longest is None else longest - room
        bound = top if top is not None else max(example, other)
        return opreg.DynamicDim(name, min(example, bound), min(other, bound), max=top)

    return {
        d.name: d
        for d in (
            opreg.DynamicDim("batch_size", example=2, other=3),
            dim("encoder_sequence_length", 16, 7),
            dim("decoder_sequence_length", 5, 3),
            dim("past_decoder_sequence_length", 6, 19, room=1),  # a past leaves room for a new token
        )
    }


def _encoder(layout: Layout, model: Any) -> opreg.Component:
    dims = _dims(layout)
    shape = ("batch_size", "encoder_sequence_length")
    return opreg.Component(
        ENCODER, f"{ENCODER}.onnx", functools.partial(_step, "EncoderStep", model),
        (opreg.ModelInput("input_ids", shape, high=layout.vocab), opreg.ModelInput("attention_mask", shape, fill="mask")),
        ("last_hidden_state",), (dims["batch_size"], dims["encoder_sequence_length"]),
    )  # fmt: skip


SELF, CROSS = "decoder", "encoder"
"""The two parts of a layer's cache in optimum's names: the self-attention's and the cross-attention's."""
PAST, PRESENT = "past_key_values", "present"


def cache_names(prefix: str, layers: int, parts: tuple[str, ...] = (SELF, CROSS)) -> tuple[str, ...]:
    """``{prefix}.{i}.{part}.key`` and ``.value`` for each layer ``i`` and part, in optimum's order."""
    return tuple(f"{prefix}.{i}.{part}.{kind}" for i in range(layers) for part in parts for kind in ("key", "value"))


def _decoder_inputs(layout: Layout) -> list[opreg.ModelInput]:
    return [
        opreg.ModelInput("encoder_attention_mask", ("batch_size", "encoder_sequence_length"), fill="mask"),
        opreg.ModelInput("input_ids", ("batch_size", "decoder_sequence_length"), high=layout.decoder_vocab),
    ]


def _decoder(layout: Layout, model: Any, output: str) -> opreg.Component:
    dims = _dims(layout)
    hidden = opreg.ModelInput(
        "encoder_hidden_states", ("batch_size", "encoder_sequence_length", layout.hidden), "float32", "normal"
    )
    return opreg.Component(
        DECODER, f"{DECODER}.onnx", functools.partial(_step, "DecoderStep", model, output),
        (*_decoder_inputs(layout), hidden), (output, *cache_names(PRESENT, layout.layers)),
        (dims["batch_size"], dims["encoder_sequence_length"], dims["decoder_sequence_length"]),
    )  # fmt: skip


def _decoder_with_past(layout: Layout, model: Any, output: str) -> opreg.Component:
    dims = _dims(layout)
    lengths = {SELF: "past_decoder_sequence_length", CROSS: "encoder_sequence_length"}
    past = [
        opreg.ModelInput(name, ("batch_size", layout.heads, lengths[name.split(".")[2]], layout.head_size),
                         "float32", "normal")
        for name in cache_names(PAST, layout.layers)
    ]  # fmt: skip
    build = functools.partial(_step, "DecoderWithPastStep", model, output, layout.layers)
    return opreg.Component(
        WITH_PAST_DECODER, f"{WITH_PAST_DECODER}.onnx", build, (*_decoder_inputs(layout), *past),
        (output, *cache_names(PRESENT, layout.layers, (SELF,))), tuple(dims.values()),
    )  # fmt: skip


def _step(kind: str, model: Any, *args: Any) -> Any:
    """The build step of a component: the loaded model behind :mod:`opreg_transformers.seq2seq_steps`' ``kind``."""
    from opreg_transformers import seq2seq_steps

    return getattr(seq2seq_steps, kind)(model(), *args)


def _merge(context: opreg.CheckContext) -> Any:
    from opreg_transformers.merging import merge_decoders

    return merge_decoders(context.programs[DECODER].model, context.programs[WITH_PAST_DECODER].model)


def _decoding(layout: Layout, model: Any, past: bool, output: str, context: opreg.CheckContext) -> str:
    from opreg_transformers import generation

    assert context.folder is not None  # a loop check runs on the folder written
    return generation.check(context.folder, layout, model(), past, output)


def _notes(layout: Layout) -> tuple[str, ...]:
    if layout.longest is None:
        return ()
    return (
        f"sequences of at most {layout.longest} tokens (max_position_embeddings); the decoder's past and new "
        "tokens together too: more is an index out of range in ONNX Runtime",
    )
