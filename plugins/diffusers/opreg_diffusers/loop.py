"""The denoising loop check: the written folder run as a runtime runs it, against the diffusers pipeline.

Two pipelines of the task's class (diffusers' ``AutoPipelineFor...`` mappings) run the same call
(a prompt, a fixed seed, a few steps, the smallest image the models take; an image, and a mask for
inpainting):

- the eager one: the checkpoint's models as opreg exported them (:class:`~opreg_diffusers.parts.Parts`),
  its scheduler and tokenizers;
- the runtime's: each model an ONNX Runtime session of the folder's ``model.onnx`` behind the
  interface the pipeline calls (:class:`Session` and the stand-ins, as optimum's
  ``ORTDiffusionPipeline`` wraps them), the scheduler, tokenizers and configs read from the folder.

Their images (``output_type="np"``, values in [0, 1]) must agree within :data:`TOLERANCE`. The safety
checker is left out of both (optimum does not export it).

Imports torch, onnxruntime, diffusers and transformers: imported when the check runs.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import logging
import math
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import diffusers
import numpy as np
import onnxruntime
import torch
from diffusers.configuration_utils import FrozenDict
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from diffusers.pipelines import auto_pipeline
from transformers.utils import ModelOutput

import opreg
from opreg_diffusers import pipelines
from opreg_diffusers.parts import Parts

logger = logging.getLogger(__name__)

TOLERANCE = 1 / 510
"""The largest difference allowed between the two images, whose values lie in [0, 1]: half a level
of an 8-bit image, so the PNGs saved from them differ by at most one level."""
PROMPT = "a cat sat on the mat"
SEED = 0
STEPS = {pipelines.TEXT_TO_IMAGE: 2, pipelines.IMAGE_TO_IMAGE: 4, pipelines.INPAINTING: 4}
"""Denoising steps; from an image, at strength 0.5, half of them run."""
STRENGTH = 0.5
LATENT_SIDE = 8
"""The image's height is the first size its models take from 8 latents on, its width one step more
(not square, so that a swap of height and width shows)."""
_TASKS = {
    pipelines.TEXT_TO_IMAGE: auto_pipeline.AUTO_TEXT2IMAGE_PIPELINES_MAPPING,
    pipelines.IMAGE_TO_IMAGE: auto_pipeline.AUTO_IMAGE2IMAGE_PIPELINES_MAPPING,
    pipelines.INPAINTING: auto_pipeline.AUTO_INPAINT_PIPELINES_MAPPING,
}
_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(float16)": np.float16,
}


def check(context: opreg.CheckContext, parts: Parts, family: pipelines.Family) -> str:
    """Run the task's pipeline on the folder and on the checkpoint; a one-line summary, or
    :class:`opreg.VerificationError` when the images differ by more than :data:`TOLERANCE`."""
    assert context.folder is not None  # a loop check runs on the written folder
    index = context.checkpoint.json("model_index.json") or {}
    task = context.plan.task
    kind = task_class(index["_class_name"], task)
    eager = _pipeline(kind, index, {name: parts.model(name) for name in parts.entries}, context.checkpoint.path)
    height, width = _image_size(eager, family)
    try:
        want = eager(**_call(kind, task, height, width)).images
    except Exception as e:
        raise opreg.CheckpointError(
            f"diffusers' {kind.__name__} fails on {context.checkpoint.path} itself ({type(e).__name__}: {e}): the "
            f"folder is written and its models verified, but its {task} loop has nothing to be compared with; "
            "choose another --task, or skip the checks with --no-verify"
        ) from e
    try:
        runtime = _pipeline(kind, index, stand_ins(context.folder, family), context.folder)
        got = runtime(**_call(kind, task, height, width)).images
    except opreg.VerificationError:
        raise
    except Exception as e:
        raise opreg.VerificationError(
            f"{context.folder}: diffusers' {kind.__name__} fails on the folder (its models in ONNX Runtime, its "
            f"scheduler, tokenizers and configs) with {type(e).__name__}: {e}, where it runs on the checkpoint"
        ) from e
    difference = float(np.abs(want - got).max()) if want.shape == got.shape else float("inf")
    summary = (
        f"{kind.__name__}, {STEPS[task]} steps at {height}x{width}: the folder's image in ONNX Runtime within "
        f"{difference:.1e} of diffusers' (tolerance {TOLERANCE:.1e})"
    )
    if not difference <= TOLERANCE or not np.isfinite(got).all():
        raise opreg.VerificationError(f"{context.folder}: {summary.replace('within', 'NOT within')}")
    return summary


def task_class(class_name: str, task: str) -> type:
    """The pipeline class of ``task`` for the family of pipeline ``class_name`` (as diffusers'
    ``AutoPipelineFor...`` classes map them)."""
    for mapping in _TASKS.values():
        for model_type, kind in mapping.items():
            if kind.__name__ == class_name:
                return _TASKS[task][model_type]
    raise opreg.CheckpointError(f"diffusers {diffusers.__version__} maps no {task} pipeline for {class_name}")


def _pipeline(kind: type, index: Mapping[str, Any], models: Mapping[str, Any], folder: Path) -> Any:
    """A pipeline of class ``kind`` made of ``models`` and of the scheduler and tokenizers in ``folder``."""
    arguments: dict[str, Any] = {}
    for name, parameter in inspect.signature(kind.__init__).parameters.items():
        entry = index.get(name)
        if name in models:
            arguments[name] = models[name]
        elif name in pipelines.COPIED and isinstance(entry, list) and entry[0] is not None:
            loader = getattr(importlib.import_module(entry[0]), entry[1])
            arguments[name] = loader.from_pretrained(folder / name)
        elif name in ("requires_safety_checker", "add_watermarker"):
            arguments[name] = False
        elif name in index and not isinstance(entry, list):
            arguments[name] = entry
        elif parameter.default is inspect.Parameter.empty and name != "self":
            arguments[name] = None
    pipeline = kind(**arguments)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _image_size(pipeline: Any, family: pipelines.Family) -> tuple[int, int]:
    """The smallest image from :data:`LATENT_SIDE` latents on whose sides the pipeline and its
    denoiser take: multiples of 8 (Stable Diffusion's pipelines ask it) and of the VAE's scale
    times the denoiser's multiple (its upsampling factor, its patch, Flux's packing)."""
    if family.denoiser == "unet":
        multiple = 2 ** (len(pipeline.unet.config.block_out_channels) - 1)
    elif family is pipelines.FLUX:
        multiple = 2  # its latents are packed 2 x 2
    else:
        multiple = 2 * pipeline.transformer.config.patch_size  # SD3's transformer is exported for even patches
    step = math.lcm(8, pipeline.vae_scale_factor * multiple)
    height = -(-LATENT_SIDE * pipeline.vae_scale_factor // step) * step
    return height, height + step


def _call(kind: type, task: str, height: int, width: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(SEED)
    call = {"prompt": PROMPT, "num_inference_steps": STEPS[task], "height": height, "width": width}
    if task != pipelines.TEXT_TO_IMAGE:
        image = torch.rand((1, 3, height, width), generator=torch.Generator().manual_seed(SEED + 1))
        call.update(image=image, strength=STRENGTH)
    if task == pipelines.INPAINTING:
        mask = torch.zeros((1, 1, height, width))
        mask[..., width // 2 :] = 1
        call["mask_image"] = mask
    if "max_sequence_length" in inspect.signature(kind.__call__).parameters:
        call["max_sequence_length"] = 32  # T5's prompt: the default (256, 512) only pads
    return {**call, "generator": generator, "output_type": "np"}


# -- the folder's models behind the interface the pipeline calls --------------------------------------


class Session:
    """One ``model.onnx`` of the folder in ONNX Runtime, called with torch tensors by input name
    (each cast to the dtype the model declares; ``None`` left out)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: _NUMPY[i.type] for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def __call__(self, **tensors: Any) -> dict[str, torch.Tensor]:
        given = {name: value for name, value in tensors.items() if value is not None}
        unknown = sorted(set(given) - set(self.inputs))
        if unknown:
            raise opreg.VerificationError(
                f"the pipeline passed {', '.join(unknown)} to {self.path}, which takes {', '.join(self.inputs)}"
            )
        feed = {name: np.asarray(value.detach().cpu().numpy(), self.inputs[name]) for name, value in given.items()}
        return dict(zip(self.outputs, (torch.from_numpy(v) for v in self.session.run(None, feed)), strict=True))


def _config(folder: Path) -> FrozenDict:
    """The model's ``config.json`` in the folder, as diffusers' models hold their config."""
    return FrozenDict(json.loads((folder / "config.json").read_text(encoding="utf-8")))


class _Model:
    """What the pipelines ask of any model beside calling it: its dtype, its device, its submodules
    (none: diffusers looks for offloading hooks there)."""

    dtype = torch.float32
    device = torch.device("cpu")

    def modules(self) -> Iterator[Any]:
        return iter(())

    def to(self, *args: Any, **kwargs: Any) -> _Model:
        """Staying float32 on the CPU, where the folder's models run (SDXL upcasts its VAE so)."""
        return self


class TextEncoder(_Model):
    """A text encoder as the pipelines call it: ``input_ids`` (an attention mask only when it is all
    ones: the encoders optimum exports take none) -> a ``ModelOutput`` with the hidden states as a tuple."""

    def __init__(self, folder: Path) -> None:
        import transformers

        self.session = Session(folder / "model.onnx")
        self.config = transformers.AutoConfig.from_pretrained(folder)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: Any) -> ModelOutput:
        if attention_mask is not None and not bool(attention_mask.all()):
            raise opreg.VerificationError(f"{self.session.path} takes no attention mask, and the pipeline masks tokens")
        outputs = self.session(input_ids=input_ids)
        layers = sorted((k for k in outputs if k.startswith("hidden_states.")), key=lambda k: int(k.split(".")[1]))
        hidden = tuple(outputs.pop(k) for k in layers)
        return ModelOutput(**outputs, **({"hidden_states": hidden} if hidden else {}))


class Denoiser(_Model):
    """The UNet or the transformer as the pipelines call it: its inputs by name (the UNet's
    ``added_cond_kwargs`` flattened), its prediction first of a tuple."""

    def __init__(self, folder: Path, positional: tuple[str, ...]) -> None:
        self.session = Session(folder / "model.onnx")
        self.config = _config(folder)
        self.positional = positional
        self.add_embedding = types.SimpleNamespace(
            linear_1=types.SimpleNamespace(in_features=self.config.get("projection_class_embeddings_input_dim"))
        )  # SDXL's pipeline checks its time ids against it

    def __call__(self, *args: Any, return_dict: bool = True, **inputs: Any) -> Any:
        inputs.update(zip(self.positional, args, strict=False))
        inputs.update(inputs.pop("added_cond_kwargs", None) or {})
        for unused in ("cross_attention_kwargs", "joint_attention_kwargs", "attention_kwargs"):
            if inputs.pop(unused, None):
                raise opreg.VerificationError(f"the pipeline passed {unused}, which {self.session.path} cannot take")
        (prediction,) = self.session(**inputs).values()
        return (prediction,) if not return_dict else types.SimpleNamespace(sample=prediction)

    def cache_context(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Flux's pipeline names each call's cache; the ONNX model has none."""
        return contextlib.nullcontext()


class Vae(_Model):
    """The VAE as the pipelines call it: ``encode`` -> its latent distribution (rebuilt from the
    encoder's ``latent_parameters``), ``decode`` -> the image, ``config`` from ``vae_decoder/``."""

    def __init__(self, folder: Path) -> None:
        self.encoder = Session(folder / "vae_encoder" / "model.onnx")
        self.decoder = Session(folder / "vae_decoder" / "model.onnx")
        self.config = _config(folder / "vae_decoder")

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> Any:
        distribution = DiagonalGaussianDistribution(self.encoder(sample=x)["latent_parameters"])
        return types.SimpleNamespace(latent_dist=distribution) if return_dict else (distribution,)

    def decode(self, z: torch.Tensor, return_dict: bool = True, generator: Any = None) -> Any:
        image = self.decoder(latent_sample=z)["sample"]
        return types.SimpleNamespace(sample=image) if return_dict else (image,)


def stand_ins(folder: Path, family: pipelines.Family) -> dict[str, Any]:
    """The folder's models as the pipeline's components, by their names in ``model_index.json``."""
    models: dict[str, Any] = {"vae": Vae(folder)}
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        if (folder / name / "model.onnx").is_file():
            models[name] = TextEncoder(folder / name)
    positional = ("sample", "timestep", "encoder_hidden_states") if family.denoiser == "unet" else ()
    models[family.denoiser] = Denoiser(folder / family.denoiser, positional)
    return models
