"""The checkpoint loader of transformers folders (``opreg_checkpoint_loaders``): a ``config.json``
with a ``model_type`` it knows (:mod:`opreg_transformers.encoders`; vision, vision-text and audio
families: :mod:`opreg_transformers.media`, their inputs :mod:`opreg_transformers.shapes`), exported
as optimum lays it out: ``model.onnx`` beside the config and the tokenizer's or processor's files.

Recognising reads ``config.json`` only; ``plan`` imports transformers to build the config (a config
it cannot build is refused there, before any export), and each component's ``build`` loads the
weights.
"""

from __future__ import annotations

from typing import Any

import opreg
from opreg_transformers import causal, causal_heads, decoders, encoders, lean, media, seq2seq, seq2seq_heads, shapes

LIBRARY = "transformers"
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
"""The files that hold a transformers checkpoint's weights (one of them, or a sharded index)."""
SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "preprocessor_config.json",
    "processor_config.json",
)
"""The checkpoint's files runtimes read beside the model (transformers.js, optimum's ORTModel), copied when present."""
BATCH = shapes.BATCH
CHOICES = opreg.DynamicDim("num_choices", example=4, other=3)


def _config(checkpoint: opreg.Checkpoint) -> dict[str, Any] | None:
    config = checkpoint.json("config.json")
    if config is None or "model_type" not in config:
        return None
    if "architecture" in config or "pretrained_cfg" in config or "_diffusers_version" in config:
        return None  # timm's and diffusers' config.json: theirs, not transformers'
    return config


def recognise(checkpoint: opreg.Checkpoint) -> opreg.Recognition | None:
    """A transformers folder: ``config.json`` with a ``model_type``; its tasks if the family is known."""
    config = _config(checkpoint)
    if config is None:
        return None
    model_type = config["model_type"]
    architectures = list(config.get("architectures") or [])
    evidence = f"config.json: model_type {model_type!r}" + (f", architectures {architectures}" if architectures else "")
    if model_type in seq2seq.FAMILIES:
        return seq2seq.recognition(seq2seq.FAMILIES[model_type], architectures, evidence)
    other = media.FAMILIES.get(model_type)
    if other is not None:
        task = media.task_of(other, architectures) or other.tasks[0]
        return opreg.Recognition(LIBRARY, other.tasks, task, evidence)
    family = encoders.FAMILIES.get(model_type)
    heads = causal_heads.FAMILIES.get(model_type)
    if family is None and heads is not None and causal_heads.is_text(config):
        return causal_heads.recognition(LIBRARY, heads, config, evidence)
    if family is None and causal.is_causal(config):
        return causal.recognition(LIBRARY, evidence)
    if model_type in decoders.LANGUAGE_MODEL_OF:
        return opreg.Recognition(LIBRARY, (decoders.TASK,), decoders.TASK, evidence)
    if family is None:
        known = ", ".join(sorted({*encoders.FAMILIES, *media.FAMILIES, *seq2seq.FAMILIES}))
        return opreg.Recognition(
            LIBRARY, (), None, evidence,
            refusal=f"model_type {model_type!r} ({evidence}) is not a family opreg-transformers exports yet (it "
            f"exports {known}, text-only causal LMs, a ...ForCausalLM, and the other heads of "
            f"{', '.join(causal_heads.FAMILIES)}); Whisper or a vision-language model: "
            "`opreg llm export`",
        )  # fmt: skip
    inferred = encoders.task_of(architectures)
    task = inferred if inferred in family.tasks else encoders.FEATURE_EXTRACTION
    return opreg.Recognition(LIBRARY, family.tasks, task, evidence)


def plan(checkpoint: opreg.Checkpoint, task: str) -> opreg.ExportPlan:
    """The export of ``task``: one component, ``model.onnx``, and the config and tokenizer's files."""
    config = _config(checkpoint)
    assert config is not None  # recognised
    require_weights(checkpoint)
    lean.import_model_code(config, vision=config["model_type"] in media.FAMILIES)
    known = {*encoders.FAMILIES, *media.FAMILIES, *seq2seq.FAMILIES}
    if task == decoders.TASK:  # a causal LM, or a ...ForCausalLM of an encoder-decoder family, without past
        return decoders.plan(checkpoint, _buildable(checkpoint, "AutoModelForCausalLM", task)[0], files())
    heads = causal_heads.FAMILIES.get(config["model_type"])
    if heads is not None and task == causal.FEATURES:  # a causal LM's base model, its cache out
        text = _buildable(checkpoint, "AutoModel", task)[0].get_text_config(decoder=True)
        positions = None if causal_heads.takes_positions(heads, text) else False  # as optimum's config takes them
        return causal.plan(LIBRARY, checkpoint, features=True, position_ids=positions)
    if heads is not None and task in heads.tasks:  # a causal LM's other heads, without past
        built, notes = _buildable(checkpoint, encoders.TASKS[task][0], task)
        return causal_heads.plan(checkpoint, heads, built, task, files(), notes)
    if config["model_type"] not in known and causal.is_causal(config):
        return causal.plan(LIBRARY, checkpoint)
    if config["model_type"] in seq2seq.FAMILIES and task == seq2seq.CAUSAL_WITH_PAST:  # its ...ForCausalLM
        _buildable(checkpoint, "AutoModelForCausalLM", task)
        return causal.plan(LIBRARY, checkpoint, streaming=False)
    if config["model_type"] in seq2seq.FAMILIES and task in seq2seq_heads.HEADS:  # BART's and mBART's heads
        built, notes = _buildable(checkpoint, seq2seq_heads.HEADS[task][0], task)
        return seq2seq_heads.plan(checkpoint, built, task, files())
    if config["model_type"] in seq2seq.FAMILIES:
        _buildable(checkpoint, seq2seq.auto_of(task), task)
        return seq2seq.plan(checkpoint, task, files())
    other = media.FAMILIES.get(config["model_type"])
    auto, outputs = (media.TASKS if other else encoders.TASKS)[task]
    built, notes = _buildable(checkpoint, auto, task)
    if other is not None and other.sides.processor:  # its sides are its processor's
        config = {**config, "image_size": list(media.processor_size(checkpoint.json("preprocessor_config.json")))}
    if other is not None:
        inputs, dims = shapes.signature(other, config, task)
        outputs = other.outputs_of(task)
    else:
        family = encoders.FAMILIES[config["model_type"]]
        inputs, dims = _inputs(family, config, task), text_dims(family, config, task)
    component = opreg.Component(
        name="model",
        file="model.onnx",
        build=lambda: _load(checkpoint, auto, built),
        inputs=inputs,
        outputs=outputs,
        dims=dims,
    )
    return opreg.ExportPlan(LIBRARY, task, (component,), files(), notes=notes)


def files() -> tuple[opreg.FileCopy, ...]:
    """The config (required) and the side files runtimes read (when present)."""
    return (opreg.FileCopy("config.json", required=True), *(opreg.FileCopy(name) for name in SIDE_FILES))


def require_weights(checkpoint: opreg.Checkpoint) -> None:
    """Refuse a folder without weights (transformers would make random ones), before any export."""
    if not any(checkpoint.has(name) for name in WEIGHTS):
        raise opreg.CheckpointError(
            f"{checkpoint.path} has no weights ({', '.join(WEIGHTS)}): transformers would make random ones; save the "
            "model with model.save_pretrained(FOLDER), or name the folder that holds them"
        )


def _buildable(checkpoint: opreg.Checkpoint, auto: str, task: str) -> tuple[Any, tuple[str, ...]]:
    """The transformers config and its notes (:func:`opreg_transformers.configs.read`); refuse, before any
    export, a config transformers cannot build, or a task it has no head for."""
    import transformers

    from opreg_transformers import configs

    try:
        config, notes = configs.read(checkpoint.path)
    except Exception as e:
        raise opreg.CheckpointError(
            f"{checkpoint.file('config.json')} cannot be built by transformers {transformers.__version__}: "
            f"{type(e).__name__}: {e}; fix the config, or install the transformers release it was written for"
        ) from e
    if type(config) not in getattr(transformers, auto)._model_mapping:
        raise opreg.CheckpointError(
            f"transformers {transformers.__version__} has no {auto} for {type(config).__name__} ({checkpoint.path}), "
            f"so it cannot do {task}: choose another task with --task"
        )
    return config, notes


def _load(checkpoint: opreg.Checkpoint, auto: str, config: Any) -> Any:
    from opreg_transformers import loading

    return loading.load(checkpoint.path, auto, config)


def _text_shape(task: str) -> tuple[str, ...]:
    if task == encoders.MULTIPLE_CHOICE:
        return (BATCH.name, CHOICES.name, "sequence_length")
    return (BATCH.name, "sequence_length")


def _inputs(family: encoders.Family, config: dict[str, Any], task: str) -> tuple[opreg.ModelInput, ...]:
    shape = _text_shape(task)
    inputs = [opreg.ModelInput("input_ids", shape, fill="ids", high=int(config["vocab_size"]))]
    if family.bbox:
        high = int(config.get("max_2d_position_embeddings", 1024))
        inputs.append(opreg.ModelInput("bbox", (*shape, 4), fill="bbox", high=high))
    if family.xpaths:
        depth = (*shape, int(config.get("max_depth", 50)))
        inputs.append(opreg.ModelInput("xpath_tags_seq", depth, high=int(config["max_xpath_tag_unit_embeddings"])))
        inputs.append(opreg.ModelInput("xpath_subs_seq", depth, high=int(config["max_xpath_subs_unit_embeddings"])))
    inputs.append(opreg.ModelInput("attention_mask", shape, fill="mask"))
    types = int(config.get("type_vocab_size") or 0)
    if family.token_type_ids is True or (family.token_type_ids == "config" and types > 0):
        inputs.append(opreg.ModelInput("token_type_ids", shape, fill="ids", high=max(types, 1)))
    return tuple(inputs)


def text_dims(family: encoders.Family, config: dict[str, Any], task: str) -> tuple[opreg.DynamicDim, ...]:
    """``batch_size`` (and ``num_choices``) and ``sequence_length``, bounded as the config's positions (and
    the family's capture, :class:`opreg_transformers.encoders.Family`) allow."""
    longest = encoders.max_sequence(family, config)
    sequence = opreg.DynamicDim(
        "sequence_length", example=min(16, longest), other=min(7, longest), min=family.shortest, max=longest
    )
    return (BATCH, CHOICES, sequence) if task == encoders.MULTIPLE_CHOICE else (BATCH, sequence)


LOADERS = (
    opreg.CheckpointLoader(
        name="transformers",
        library=LIBRARY,
        looks_for="config.json with a model_type",
        recognise=recognise,
        plan=plan,
    ),
)
