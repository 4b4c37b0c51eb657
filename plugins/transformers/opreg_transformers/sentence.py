"""The checkpoint loader of sentence-transformers folders: ``modules.json`` listing a text
``Transformer`` at the folder's root (its ``config.json`` and weights), a ``Pooling`` and optionally a
``Normalize``, exported as one model whose graph holds the whole pipeline: ``input_ids``,
``attention_mask`` -> ``token_embeddings``, ``sentence_embedding`` (pooled and normalised), as
optimum-onnx 0.1.0 exports it.

The pipeline is read from the folder's own files (``1_Pooling/config.json``: the pooling modes, in
sentence-transformers 6's form or the older ``pooling_mode_*_tokens`` flags) and built by
:mod:`opreg_transformers.pooling`, so exporting needs transformers only (optimum needs
sentence-transformers, and its scikit-learn). Its priority is above the transformers loader's, which
also recognises the folder's ``config.json``.
"""

from __future__ import annotations

from typing import Any

import opreg
from opreg_transformers import encoders, loaders

LIBRARY = "sentence_transformers"
TASKS = (encoders.FEATURE_EXTRACTION, "sentence-similarity")
"""optimum's tasks for these folders: both export the same model."""
OUTPUTS = ("token_embeddings", "sentence_embedding")
FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")
"""sentence-transformers' own files, copied beside the model with each module's config (a reader of the
folder sees the pipeline)."""
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""The flags of ``1_Pooling/config.json`` before sentence-transformers 6, in the order it concatenates them."""


def _modules(checkpoint: opreg.Checkpoint) -> list[dict[str, Any]] | None:
    modules = checkpoint.json("modules.json", list)
    if modules is not None and not all(isinstance(m, dict) for m in modules):
        raise opreg.CheckpointError(f"{checkpoint.file('modules.json')} is not sentence-transformers' list of modules")
    return modules


def _kind(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def recognise(checkpoint: opreg.Checkpoint) -> opreg.Recognition | None:
    """A sentence-transformers folder: ``modules.json``; exported when it is a text ``Transformer`` at the
    folder's root, a ``Pooling``, and optionally a ``Normalize``, of a family the transformers loader knows."""
    modules = _modules(checkpoint)
    if modules is None:
        return None
    kinds = [_kind(m) for m in modules]
    evidence = f"modules.json: {' -> '.join(kinds)}"
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]) or modules[0].get("path"):
        return opreg.Recognition(
            LIBRARY, (), None, evidence,
            refusal=f"{evidence}: opreg-transformers exports Transformer -> Pooling [-> Normalize] pipelines whose "
            "Transformer is the folder's root (other modules, and CLIP or other modalities, are not exported yet)",
        )  # fmt: skip
    inner = loaders.recognise(checkpoint)
    if inner is None or inner.refusal:
        refusal = inner.refusal if inner is not None else "its Transformer has no config.json with a model_type"
        return opreg.Recognition(LIBRARY, (), None, evidence, refusal=refusal)
    return opreg.Recognition(LIBRARY, TASKS, encoders.FEATURE_EXTRACTION, f"{evidence}; {inner.evidence}")


def pooling_modes(checkpoint: opreg.Checkpoint, path: str) -> tuple[str, ...]:
    """The pooling modes of the ``Pooling`` module at ``path``, in the order they are concatenated."""
    name = f"{path}/config.json" if path else "config.json"
    config = checkpoint.json(name)
    if config is None:
        raise opreg.CheckpointError(
            f"{checkpoint.file(name)} is missing: save the model again with sentence-transformers"
        )
    mode = config.get("pooling_mode")
    modes = (mode,) if isinstance(mode, str) else tuple(mode or ())
    modes = modes or tuple(m for key, m in LEGACY_MODES.items() if config.get(key))
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise opreg.CheckpointError(
            f"{checkpoint.file(name)}: pooling {unknown or 'none'} is not one of sentence-transformers' "
            f"{', '.join(MODES)}: fix the file"
        )
    return modes


def plan(checkpoint: opreg.Checkpoint, task: str) -> opreg.ExportPlan:
    """One component: the whole pipeline, ``model.onnx``."""
    config = checkpoint.json("config.json")
    modules = _modules(checkpoint)
    assert config is not None and modules is not None  # recognised
    loaders.require_weights(checkpoint)
    paths = [str(m.get("path", "")) for m in modules]
    modes = pooling_modes(checkpoint, paths[1])
    normalize = len(modules) > 2
    family = encoders.FAMILIES[config["model_type"]]
    shape = ("batch_size", "sequence_length")
    component = opreg.Component(
        name="model",
        file="model.onnx",
        build=lambda: _build(checkpoint, modes, normalize),
        inputs=(
            opreg.ModelInput("input_ids", shape, fill="ids", high=int(config["vocab_size"])),
            opreg.ModelInput("attention_mask", shape, fill="mask"),
        ),
        outputs=OUTPUTS,
        dims=loaders.text_dims(family, config, encoders.FEATURE_EXTRACTION),
    )
    configs = [opreg.FileCopy(f"{path}/config.json") for path in paths[1:] if path]
    files = (*loaders.files(), *(opreg.FileCopy(name) for name in FILES), *configs)
    note = f"pooling {' + '.join(modes)}" + (", normalised" if normalize else "") + ", in the graph"
    return opreg.ExportPlan(LIBRARY, task, (component,), files, notes=(note,))


def _build(checkpoint: opreg.Checkpoint, modes: tuple[str, ...], normalize: bool) -> Any:
    from opreg_transformers import loading
    from opreg_transformers.pooling import SentenceEmbedding

    encoder = loading.load(checkpoint.path, "AutoModel")
    return SentenceEmbedding(encoder, modes, normalize).eval()


LOADER = opreg.CheckpointLoader(
    name="sentence_transformers",
    library=LIBRARY,
    looks_for="modules.json (sentence-transformers)",
    recognise=recognise,
    plan=plan,
    priority=10,
)
