"""The checkpoint loader of timm folders: a ``config.json`` holding timm's ``architecture`` and
``pretrained_cfg`` (as ``timm.models.push_to_hf_hub`` and ``save_for_hf`` write it), exported for
image classification as optimum-onnx 0.1.0 lays a timm model out (``TimmDefaultOnnxConfig``:
``model.onnx``, ``pixel_values`` ``[batch_size, num_channels, height, width]`` → ``logits``).

Recognising reads ``config.json`` only; ``plan`` imports timm to check it knows the architecture,
and the build step creates the model from the folder (``timm.create_model("local-dir:...")``).
"""

from __future__ import annotations

from typing import Any

import opreg

LIBRARY = "timm"
TASK = "image-classification"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
"""The files timm reads a folder's weights from (``local-dir:``), the first found."""
SMALLEST = 33
"""The smallest side a timm network of convolutions is exported for: one more than its usual
downsampling (32), which leaves a 1 x 1 map that torch.export captures apart from larger ones."""


def _config(checkpoint: opreg.Checkpoint) -> dict[str, Any] | None:
    config = checkpoint.json("config.json")
    if config is None or not isinstance(config.get("architecture"), str) or "pretrained_cfg" not in config:
        return None
    return config


def recognise(checkpoint: opreg.Checkpoint) -> opreg.Recognition | None:
    """A timm folder: ``config.json`` with an ``architecture`` and a ``pretrained_cfg``."""
    config = _config(checkpoint)
    if config is None:
        return None
    evidence = f"config.json: architecture {config['architecture']!r} with timm's pretrained_cfg"
    return opreg.Recognition(LIBRARY, (TASK,), TASK, evidence)


def plan(checkpoint: opreg.Checkpoint, task: str) -> opreg.ExportPlan:
    """``model.onnx`` and the folder's ``config.json``."""
    config = _config(checkpoint)
    assert config is not None  # recognised
    weights = [name for name in WEIGHTS if checkpoint.has(name)]
    if not weights:
        raise opreg.CheckpointError(
            f"{checkpoint.path} has no weights ({', '.join(WEIGHTS)}): timm would make random ones; save the model "
            "with timm.models.save_for_hf(model, FOLDER), or name the folder that holds them"
        )
    _known(checkpoint, config["architecture"])
    component = opreg.Component(
        name="model",
        file="model.onnx",
        build=lambda: _load(checkpoint),
        inputs=(opreg.ModelInput("pixel_values", _shape(config), "float32", "normal"),),
        outputs=("logits",),
        dims=_dims(config),
    )
    return opreg.ExportPlan(LIBRARY, task, (component,), (opreg.FileCopy("config.json", required=True),))


def _known(checkpoint: opreg.Checkpoint, architecture: str) -> None:
    import timm

    if not timm.is_model(architecture):
        raise opreg.CheckpointError(
            f"{checkpoint.file('config.json')} names architecture {architecture!r}, which timm {timm.__version__} "
            "does not have: install the timm release the checkpoint was saved with"
        )


def _shape(config: dict[str, Any]) -> tuple[str | int, ...]:
    """``pixel_values``' shape: the sides at the checkpoint's input size where timm says the model
    takes no other (``fixed_input_size``: a ViT's position embeddings), else named."""
    channels, height, width = (int(n) for n in config["pretrained_cfg"].get("input_size", (3, 224, 224)))
    if config["pretrained_cfg"].get("fixed_input_size", False):
        return ("batch_size", channels, height, width)
    return ("batch_size", channels, "height", "width")


def _dims(config: dict[str, Any]) -> tuple[opreg.DynamicDim, ...]:
    batch = opreg.DynamicDim("batch_size", example=2, other=3)
    if config["pretrained_cfg"].get("fixed_input_size", False):
        return (batch,)
    # Off the multiples of the downsampling, so a floor division rounds; never square.
    sides = [
        opreg.DynamicDim(n, example=e, other=o, min=SMALLEST) for n, e, o in (("height", 67, 91), ("width", 91, 67))
    ]
    return (batch, *sides)


def _load(checkpoint: opreg.Checkpoint) -> Any:
    from opreg_timm.classifier import Classifier

    return Classifier.from_folder(checkpoint.path)


LOADERS = (
    opreg.CheckpointLoader(
        name="timm",
        library=LIBRARY,
        looks_for="config.json with timm's architecture and pretrained_cfg",
        recognise=recognise,
        plan=plan,
    ),
)
