"""The checkpoint loader of sentence-transformers folders: ``modules.json`` whose first module is a
text ``Transformer`` (the folder's own ``config.json``) followed by ``Pooling``, ``Normalize`` and
the like, exported as one model whose graph holds the whole pipeline: ``input_ids``,
``attention_mask`` -> ``token_embeddings``, ``sentence_embedding`` (the pooled and normalised
embedding), as optimum-onnx 0.1.0 exports it.

The model is sentence-transformers' own (``SentenceTransformer(folder)``), so pooling and
normalisation are exactly the library's; its priority is above the transformers loader's, which
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
FILES = (
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
    "2_Normalize/config.json",
    "2_Dense/config.json",
)
"""sentence-transformers' own files, copied beside the model (a reader of the folder sees the pipeline)."""


def _modules(checkpoint: opreg.Checkpoint) -> list[dict[str, Any]] | None:
    modules = checkpoint.json("modules.json", list)
    if modules is not None and not all(isinstance(m, dict) for m in modules):
        raise opreg.CheckpointError(f"{checkpoint.file('modules.json')} is not sentence-transformers' list of modules")
    return modules


def recognise(checkpoint: opreg.Checkpoint) -> opreg.Recognition | None:
    """A sentence-transformers folder: ``modules.json``, its first module a ``Transformer`` at the folder's root."""
    modules = _modules(checkpoint)
    if modules is None:
        return None
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    evidence = f"modules.json: {' -> '.join(kinds)}"
    if not kinds or kinds[0] != "Transformer" or modules[0].get("path", "") != "":
        return opreg.Recognition(
            LIBRARY, (), None, evidence,
            refusal=f"{evidence}: opreg-transformers exports sentence-transformers folders whose first module is a "
            "text Transformer at the folder's root (CLIP and other modalities are not exported yet)",
        )  # fmt: skip
    inner = loaders.recognise(checkpoint)
    if inner is None or inner.refusal:
        return opreg.Recognition(LIBRARY, (), None, evidence, refusal=inner.refusal if inner else "no config.json")
    return opreg.Recognition(LIBRARY, TASKS, encoders.FEATURE_EXTRACTION, f"{evidence}; {inner.evidence}")


def plan(checkpoint: opreg.Checkpoint, task: str) -> opreg.ExportPlan:
    """One component: the whole pipeline, ``model.onnx``."""
    config = checkpoint.json("config.json")
    assert config is not None  # recognised
    loaders.require_weights(checkpoint)
    family = encoders.FAMILIES[config["model_type"]]
    shape = ("batch_size", "sequence_length")
    component = opreg.Component(
        name="model",
        file="model.onnx",
        build=lambda: _build(checkpoint),
        inputs=(
            opreg.ModelInput("input_ids", shape, fill="ids", high=int(config["vocab_size"])),
            opreg.ModelInput("attention_mask", shape, fill="mask"),
        ),
        outputs=OUTPUTS,
        dims=loaders.text_dims(family, config, encoders.FEATURE_EXTRACTION),
    )
    files = (*loaders.files(), *(opreg.FileCopy(name) for name in FILES))
    return opreg.ExportPlan(LIBRARY, task, (component,), files)


def _build(checkpoint: opreg.Checkpoint) -> Any:
    try:
        import sentence_transformers
    except ImportError as e:
        raise opreg.CheckpointError(
            f"{checkpoint.path} is a sentence-transformers folder, whose pooling and normalisation are exported from "
            "the library's own modules: pip install sentence-transformers"
        ) from e
    import torch

    class Embeddings(torch.nn.Module):
        """The pipeline called as its modules are: features in, features out (the embeddings picked by name)."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
            return self.model({"input_ids": input_ids, "attention_mask": attention_mask})

    return Embeddings(sentence_transformers.SentenceTransformer(str(checkpoint.path), device="cpu")).eval()


LOADER = opreg.CheckpointLoader(
    name="sentence_transformers",
    library=LIBRARY,
    looks_for="modules.json (sentence-transformers)",
    recognise=recognise,
    plan=plan,
    priority=10,
)
