"""The optimum side of bench/optimum_compare.py, run by that script with the side venv's python
(transformers 4.57.3, optimum-onnx 0.1.0): it lists the (model_type, task) pairs optimum-onnx's
TasksManager exports with the ONNX exporter, and writes the tiny random checkpoints both exporters
then read, so that the files come from the OLDER transformers.

    python bench/optimum_side.py pairs                # JSON: [[model_type, task, optimum's config class], ...]
    python bench/optimum_side.py write JOBS.json      # JOBS: [{"model_type", "task", "folder"[, "wide"]}, ...]

``write`` writes each folder whole (under another name first) with a ``bench.json`` holding
``{"model_class"}`` or ``{"error"}``, and prints it as a JSON line with ``"folder"``.
The configs: the tests' tiny configs where opreg-transformers knows the family (tests/encoder_models.py,
tests/media_checkpoints.py, tests/seq2seq_models.py, which import transformers only), otherwise the
family's default config shrunk to hidden 32, two layers, two heads (:func:`shrink`).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
    d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
    encoder_ffn_dim=64, decoder_ffn_dim=64, n_embd=32, n_layer=2, n_head=2, n_inner=64, num_layers=2,
    num_heads=2, d_ff=64, d_kv=16, head_dim=16, embedding_size=32, dim=32, n_layers=2, n_heads=2,
    hidden_dim=64, projection_dim=16, max_position_embeddings=64, n_positions=64, num_local_experts=4,
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, vocab_size=99, num_labels=3,
)  # fmt: skip
"""What :func:`shrink` sets on a default config, where the config has the attribute."""
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id")
IMAGE_PROCESSOR = dict(
    image_processor_type="ViTImageProcessor", do_resize=True, resample=2, do_rescale=True, rescale_factor=1 / 255,
    do_normalize=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
)  # fmt: skip
"""ViTImageProcessor's ``preprocessor_config.json``, written as JSON: the side venv may lack Pillow."""
SUBCONFIGS = ("text_config", "vision_config", "audio_config", "encoder", "decoder")


def pairs() -> list[list[str]]:
    """optimum-onnx's (model_type, task, config class) for the transformers library."""
    import optimum.exporters.onnx.model_configs  # noqa: F401  (registers the ONNX configs)
    from optimum.exporters.tasks import TasksManager

    table = TasksManager._LIBRARY_TO_SUPPORTED_MODEL_TYPES["transformers"]
    return [
        [model_type, task, getattr(maker, "func", maker).__name__]
        for model_type in sorted(table)
        if "onnx" in table[model_type]
        for task, maker in sorted(table[model_type]["onnx"].items())
    ]


def shrink(config: Any) -> Any:
    """``config`` made tiny: :data:`SMALL`'s sizes where it has those attributes (and in its text,
    vision, audio, encoder and decoder configs), special token ids kept inside the vocabulary."""
    for name, value in SMALL.items():
        if hasattr(config, name) and isinstance(getattr(config, name), int):
            setattr(config, name, value)
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(getattr(config, "layer_types", None), list) and isinstance(layers, int):
        config.layer_types = config.layer_types[:layers]  # one per layer, as the config validates
    for name in TOKEN_IDS:
        if isinstance(getattr(config, name, None), int) and getattr(config, name) >= SMALL["vocab_size"]:
            setattr(config, name, 2)
    for name in SUBCONFIGS:
        if getattr(config, name, None) is not None and hasattr(getattr(config, name), "to_dict"):
            shrink(getattr(config, name))
    return config


def _known(model_type: str) -> Any:
    """The tests' tiny config of ``model_type``, or ``None`` when the tests have none."""
    from tests import encoder_models, media_checkpoints, seq2seq_models

    if model_type in seq2seq_models.FAMILIES:
        return seq2seq_models.config(model_type)
    if model_type in encoder_models.CONFIGS:
        return encoder_models.CONFIGS[model_type]()
    for _, make, _ in media_checkpoints.CHECKPOINTS.values():
        try:
            config = make()
        except ImportError:  # RT-DETR's tiny config is opreg-transformers', which this venv lacks
            continue
        if config.model_type == model_type:
            return config
    return None


WIDE = dict(
    hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=4, max_position_embeddings=512
)
"""BERT-base's width (4 of its 12 layers): the ``--wide`` checkpoint of bench/optimum_compare.py."""


def write(model_type: str, task: str, folder: Path, wide: bool = False) -> str:
    """Write a tiny random ``model_type`` checkpoint for ``task`` into ``folder`` (``wide``: at
    :data:`WIDE`'s sizes); its class name."""
    import torch
    import transformers
    from optimum.exporters.tasks import TasksManager

    from tests import seq2seq_models

    config = _known(model_type) or shrink(transformers.AutoConfig.for_model(model_type))
    for name, value in (WIDE if wide else {}).items():
        setattr(config, name, value)
    config.num_labels = 2 if task == "question-answering" else 3
    auto = TasksManager.get_model_class_for_task(task, model_type=model_type)
    model_class = auto._model_mapping[type(config)] if hasattr(auto, "_model_mapping") else auto
    torch.manual_seed(0)
    model = model_class(config)
    model.save_pretrained(folder)
    text = getattr(config, "text_config", config)
    if getattr(text, "vocab_size", 0) >= seq2seq_models.VOCAB:
        seq2seq_models.tokenizer().save_pretrained(folder)
    if getattr(config, "conv_kernel", None) is not None:
        transformers.Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000).save_pretrained(folder)
    elif hasattr(getattr(config, "vision_config", config), "image_size"):
        side = getattr(config, "vision_config", config).image_size
        side = side if isinstance(side, int) else side[0]
        (folder / "preprocessor_config.json").write_text(
            json.dumps(IMAGE_PROCESSOR | {"size": {"height": side, "width": side}})
        )
    return model_class.__name__


def main() -> int:
    if sys.argv[1] == "pairs":
        print(json.dumps(pairs()))
        return 0
    for job in json.loads(Path(sys.argv[2]).read_text()):
        folder = Path(job["folder"])
        partial = folder.with_name(folder.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            done = {"model_class": write(job["model_type"], job["task"], partial, job.get("wide", False))}
        except Exception as e:  # one row of the bench, not the end of the batch
            partial.mkdir(parents=True, exist_ok=True)
            done = {"error": f"{type(e).__name__}: {e}"[:300]}
        (partial / "bench.json").write_text(json.dumps(done))
        try:
            partial.rename(folder)  # whole or absent: shards running at once share the checkpoints
        except OSError:  # another shard wrote it meanwhile (the same seed: the same files)
            shutil.rmtree(partial)
        print(json.dumps({"folder": job["folder"], **done}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
