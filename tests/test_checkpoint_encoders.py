"""The encoder tasks of ``opreg export FOLDER`` over the families opreg-transformers knows, and
sentence-transformers folders: each a tiny random checkpoint written with ``save_pretrained``,
exported, laid out as optimum-onnx 0.1.0 lays it out (input and output names, dim names, which
models take ``token_type_ids``) and verified against eager PyTorch at two sizes by the export.

Every family is exported here for at least one task and every task for at least three families
(BERT's in tests/test_checkpoint_export.py too); ``bench/checkpoint_tasks.py`` exports every pair."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import transformers

import opreg
from tests.encoder_models import CONFIGS

HEADS = {
    "feature-extraction": ("AutoModel", ["last_hidden_state"]),
    "fill-mask": ("AutoModelForMaskedLM", ["logits"]),
    "text-classification": ("AutoModelForSequenceClassification", ["logits"]),
    "token-classification": ("AutoModelForTokenClassification", ["logits"]),
    "question-answering": ("AutoModelForQuestionAnswering", ["start_logits", "end_logits"]),
    "multiple-choice": ("AutoModelForMultipleChoice", ["logits"]),
}
TOKEN_TYPES = {
    "albert", "bert", "convbert", "electra", "flaubert", "layoutlm", "markuplm", "megatron-bert", "mobilebert",
    "nystromformer", "rembert", "roformer", "splinter", "squeezebert", "xlm",
}  # fmt: skip
"""The families optimum gives a ``token_type_ids`` input (its ``BertOnnxConfig`` subclasses); DeBERTa
only when ``type_vocab_size`` > 0, the others never (``DistilBertOnnxConfig``'s, ESM's)."""
BOXES = {"layoutlm", "lilt"}
"""The families that take a ``bbox`` after ``input_ids`` (a box per token: ``(batch, sequence, 4)``)."""
XPATHS = {"markuplm"}
XPATH_INPUTS = ["xpath_tags_seq", "xpath_subs_seq"]
"""The families that take ``xpath_tags_seq`` and ``xpath_subs_seq`` after ``input_ids``, ``(batch, sequence,
max_depth)``: optimum's order, its model's ``forward``'s."""
LONGEST = {"big_bird": 22}
"""The longest sequence where it is not 40: BigBird's attention is full (and exported) up to 22 tokens."""
CASES = [
    ("albert", "multiple-choice"),
    ("bert", "fill-mask"),
    ("bert", "token-classification"),
    ("bert", "question-answering"),
    ("bert", "multiple-choice"),
    ("big_bird", "question-answering"),
    ("camembert", "question-answering"),
    ("convbert", "token-classification"),
    ("data2vec-text", "fill-mask"),
    ("deberta", "text-classification"),
    ("deberta-v2", "feature-extraction"),
    ("deberta-v2", "multiple-choice"),
    ("distilbert", "question-answering"),
    ("electra", "text-classification"),
    ("esm", "fill-mask"),
    ("flaubert", "fill-mask"),
    ("ibert", "token-classification"),
    ("layoutlm", "token-classification"),
    ("lilt", "question-answering"),
    ("markuplm", "token-classification"),
    ("megatron-bert", "multiple-choice"),
    ("mobilebert", "question-answering"),
    ("modernbert", "token-classification"),
    ("mpnet", "multiple-choice"),
    ("nystromformer", "fill-mask"),
    ("rembert", "fill-mask"),
    ("roberta", "feature-extraction"),
    ("roberta", "text-classification"),
    ("roformer", "question-answering"),
    ("splinter", "question-answering"),
    ("squeezebert", "text-classification"),
    ("xlm", "question-answering"),
    ("xlm-roberta", "token-classification"),
]


def save(folder: Path, family: str, task: str) -> Path:
    config = CONFIGS[family]()
    config.num_labels = 2 if task == "question-answering" else 3
    torch.manual_seed(0)
    getattr(transformers, HEADS[task][0]).from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("family", "task"), CASES)
def test_a_family_exports_a_task_as_optimum_lays_it_out(family, task, tmp_path):
    result = opreg.export_checkpoint(save(tmp_path / "ckpt", family, task), tmp_path / "out")
    assert (result.task, result.inferred) == (task, True)  # from config.json's architectures
    assert result.verified and len(result.models[0].verified) == 2  # the example and the second sizes
    model = onnx.load(tmp_path / "out" / "model.onnx")
    names = ["input_ids", *(["bbox"] if family in BOXES else []), *(XPATH_INPUTS if family in XPATHS else [])]
    names += ["attention_mask", *(["token_type_ids"] if family in TOKEN_TYPES else [])]
    assert [i.name for i in model.graph.input] == names
    assert [o.name for o in model.graph.output] == HEADS[task][1]
    dims = (
        ["batch_size", "num_choices", "sequence_length"]
        if task == "multiple-choice"
        else ["batch_size", "sequence_length"]
    )
    for i in model.graph.input:
        last = {"bbox": [4], "xpath_subs_seq": [4], "xpath_tags_seq": [4]}.get(i.name, [])  # boxes, MarkupLM's depth
        assert [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] == dims + last
    bounds = json.loads({p.key: p.value for p in model.metadata_props}["opreg.dim_bounds"])
    assert bounds["sequence_length"][1] == LONGEST.get(family, 40)  # 42 positions starting after the padding index


def test_every_family_and_task_has_a_case():
    from opreg_transformers import encoders

    assert set(CONFIGS) == set(encoders.FAMILIES) == {family for family, _ in CASES}
    for task in HEADS:
        assert sum(t == task for _, t in CASES) + (task in ("feature-extraction", "text-classification")) >= 3, task


def test_a_task_the_family_has_no_head_for_is_refused_listing_those_it_has(tmp_path, capsys):
    from opreg import cli

    folder = save(tmp_path / "ckpt", "modernbert", "fill-mask")
    assert cli.main(["export", str(folder), "-o", str(tmp_path / "out"), "--task", "multiple-choice"]) == 2
    err = capsys.readouterr().err
    assert "cannot be exported for task 'multiple-choice'" in err
    assert "the tasks it can do are feature-extraction, fill-mask, text-classification, token-classification" in err


def test_a_bbox_input_is_refused_without_a_last_dim_of_4_or_a_high():
    """``fill="bbox"``'s boxes are checked where LayoutLM's case runs: its eager model looks up each box's
    width and height, which fails on an unsorted box."""
    with pytest.raises(opreg.InvalidArgumentError, match=r"fill='bbox' needs a last dim of 4 \(x0, y0, x1, y1\)"):
        opreg.ModelInput("bbox", ("batch_size", "sequence_length"), fill="bbox", high=64)
    with pytest.raises(opreg.InvalidArgumentError, match="fill='bbox' needs high="):
        opreg.ModelInput("bbox", ("batch_size", "sequence_length", 4), fill="bbox")


# -- sentence-transformers ----------------------------------------------------------------------

MODULES = "sentence_transformers.sentence_transformer.modules"


def save_sentence_model(folder: Path, pooling: dict, normalize: bool = True) -> Path:
    """A sentence-transformers folder as the library saves it (``SentenceTransformer.save``, 6.3: the
    Transformer at the root, ``modules.json``, each module's config), written here without it."""
    torch.manual_seed(0)
    transformers.MPNetModel(CONFIGS["mpnet"]()).save_pretrained(folder)
    words = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", *"abcdefghijklmnopqrstuvwxyz"]
    special = dict(cls_token="<s>", pad_token="<pad>", sep_token="</s>", unk_token="<unk>", mask_token="<mask>")
    transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, **special).save_pretrained(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{MODULES}.pooling.Pooling"},
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.base.modules.normalize.Normalize",
            }
        )
        (folder / "2_Normalize").mkdir()
        (folder / "2_Normalize" / "config.json").write_text("{}")
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 32, **pooling}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    return folder


def pooled(tokens: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """sentence-transformers' pooling, written again in numpy (right padding)."""
    weights = mask[..., None].astype(np.float32)
    if mode == "cls":
        return tokens[:, 0]
    if mode == "max":
        return np.where(weights > 0, tokens, -np.inf).max(axis=1)
    total, count = (tokens * weights).sum(axis=1), np.maximum(weights.sum(axis=1), 1e-9)
    if mode == "mean":
        return total / count
    if mode == "mean_sqrt_len_tokens":
        return total / np.sqrt(count)
    positions = np.arange(1, tokens.shape[1] + 1, dtype=np.float32)[None, :, None] * weights
    if mode == "weightedmean":
        return (tokens * positions).sum(axis=1) / positions.sum(axis=1)
    last = mask.sum(axis=1) - 1
    return tokens[np.arange(len(tokens)), last]  # lasttoken


POOLINGS = [
    ({"pooling_mode": "mean"}, ("mean",), True),
    ({"pooling_mode": "cls"}, ("cls",), True),
    ({"pooling_mode": ["max", "mean_sqrt_len_tokens"]}, ("max", "mean_sqrt_len_tokens"), False),
    ({"pooling_mode": "weightedmean"}, ("weightedmean",), True),
    ({"pooling_mode": "lasttoken"}, ("lasttoken",), True),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, ("cls", "mean"), True),  # before 6.0
]


@pytest.mark.parametrize(("pooling", "modes", "normalize"), POOLINGS)
def test_a_sentence_transformers_folder_holds_its_pooling_and_normalisation_in_the_graph(
    tmp_path, pooling, modes, normalize
):
    """``sentence_embedding`` from ONNX Runtime, on padded inputs, equals the pooling computed again from
    transformers' own encoder (bench/sentence_transformers_check.py compares with the library itself)."""
    folder = save_sentence_model(tmp_path / "st", pooling, normalize)
    result = opreg.export_checkpoint(folder, tmp_path / "out")
    assert (result.library, result.task, result.loader) == (
        "sentence_transformers", "feature-extraction", "transformers:sentence_transformers",
    )  # fmt: skip
    assert result.others == ("transformers:transformers",)  # the folder's config.json: a lower priority
    assert {"modules.json", "1_Pooling/config.json", "model.onnx", "tokenizer.json"} <= set(result.files)
    ids = torch.randint(5, 31, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = mask[2, 3:] = 0
    with torch.no_grad():
        tokens = transformers.AutoModel.from_pretrained(folder)(input_ids=ids, attention_mask=mask)[0].numpy()
    want = np.concatenate([pooled(tokens, mask.numpy(), mode) for mode in modes], axis=-1)
    if normalize:
        want = want / np.linalg.norm(want, axis=-1, keepdims=True)
    session = onnxruntime.InferenceSession(tmp_path / "out" / "model.onnx", providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["token_embeddings", "sentence_embedding"]
    _, got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_sentence_transformers_folder_exports_as_plain_transformers_when_asked(tmp_path):
    folder = save_sentence_model(tmp_path / "st", {"pooling_mode": "mean"})
    result = opreg.export_checkpoint(folder, tmp_path / "out", library="transformers", verify=False)
    assert result.loader == "transformers:transformers"
    assert [o.name for o in result.models[0].program.model.graph.outputs] == ["last_hidden_state"]


def test_a_pipeline_it_cannot_export_is_refused_naming_its_modules(tmp_path):
    folder = save_sentence_model(tmp_path / "st", {"pooling_mode": "mean"})
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": f"{MODULES}.dense.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(opreg.CheckpointError, match="Transformer -> Pooling -> Normalize -> Dense: opreg-transformers"):
        opreg.export_checkpoint(folder, tmp_path / "out")
    (folder / "modules.json").write_text(json.dumps(modules[:2]))
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode": "median"}')
    with pytest.raises(opreg.CheckpointError, match=r"pooling \['median'\] is not one of"):
        opreg.export_checkpoint(folder, tmp_path / "out")
