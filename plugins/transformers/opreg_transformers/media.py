"""What the transformers loader knows of vision, vision-text and audio families: the tasks each
exports, what sizes its images or its audio may take, as optimum-onnx 0.1.0 lays them out (its
``ViTOnnxConfig``, ``DetrOnnxConfig``, ``CLIPOnnxConfig``, ``HubertOnnxConfig``... in
``optimum/exporters/onnx/model_configs.py``, the outputs of ``OnnxConfig._TASK_TO_COMMON_OUTPUTS``).

Data only, as :mod:`opreg_transformers.encoders`: importing it imports neither torch nor
transformers. Each family here is verified by tests/test_checkpoint_media.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

FEATURE_EXTRACTION = "feature-extraction"
IMAGE_CLASSIFICATION = "image-classification"
OBJECT_DETECTION = "object-detection"
SEMANTIC_SEGMENTATION = "semantic-segmentation"
IMAGE_SEGMENTATION = "image-segmentation"
DEPTH_ESTIMATION = "depth-estimation"
ZERO_SHOT = "zero-shot-image-classification"
SPEECH_RECOGNITION = "automatic-speech-recognition"
AUDIO_CLASSIFICATION = "audio-classification"
MASKED_IM = "masked-im"
AUDIO_FRAMES = "audio-frame-classification"
XVECTOR = "audio-xvector"

IMAGE = "image"
IMAGE_TEXT = "image-text"
AUDIO = "audio"
SPECTROGRAM = "spectrogram"

TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    FEATURE_EXTRACTION: ("AutoModel", ("last_hidden_state",)),
    IMAGE_CLASSIFICATION: ("AutoModelForImageClassification", ("logits",)),
    OBJECT_DETECTION: ("AutoModelForObjectDetection", ("logits", "pred_boxes")),
    SEMANTIC_SEGMENTATION: ("AutoModelForSemanticSegmentation", ("logits",)),
    IMAGE_SEGMENTATION: ("AutoModelForSemanticSegmentation", ("logits",)),  # optimum's other name for it here
    DEPTH_ESTIMATION: ("AutoModelForDepthEstimation", ("predicted_depth",)),
    MASKED_IM: ("AutoModelForMaskedImageModeling", ("reconstruction",)),
    ZERO_SHOT: (
        "AutoModelForZeroShotImageClassification",
        ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"),
    ),
    SPEECH_RECOGNITION: ("AutoModelForCTC", ("logits",)),
    AUDIO_CLASSIFICATION: ("AutoModelForAudioClassification", ("logits",)),
    AUDIO_FRAMES: ("AutoModelForAudioFrameClassification", ("logits",)),
    XVECTOR: ("AutoModelForAudioXVector", ("logits", "embeddings")),
}
"""``{task: (transformers auto class, output names)}``, tasks and outputs as optimum names them
(``image-segmentation``: optimum takes the first auto class with the family, for DPT and SegFormer
``AutoModelForSemanticSegmentation``'s, and names the output ``logits`` as for semantic segmentation)."""

HEADS: dict[str, tuple[tuple[str, str], ...]] = {
    IMAGE: (
        ("ForImageClassification", IMAGE_CLASSIFICATION),
        ("ForObjectDetection", OBJECT_DETECTION),
        ("ForSemanticSegmentation", SEMANTIC_SEGMENTATION),
        ("ForSemanticSegmentation", IMAGE_SEGMENTATION),
        ("ForDepthEstimation", DEPTH_ESTIMATION),
        ("ForMaskedImageModeling", MASKED_IM),
        ("Model", FEATURE_EXTRACTION),
    ),
    IMAGE_TEXT: (("ForImageClassification", IMAGE_CLASSIFICATION), ("Model", ZERO_SHOT)),
    AUDIO: (
        ("ForCTC", SPEECH_RECOGNITION),
        ("ForSequenceClassification", AUDIO_CLASSIFICATION),
        ("ForAudioFrameClassification", AUDIO_FRAMES),
        ("ForXVector", XVECTOR),
        ("Model", FEATURE_EXTRACTION),
    ),
    SPECTROGRAM: (("ForAudioClassification", AUDIO_CLASSIFICATION), ("Model", FEATURE_EXTRACTION)),
}
"""Per modality, an ``architectures`` entry's suffix and the task it says (``CLIPModel`` is the
joint model, zero-shot image classification; ``CLIPForImageClassification`` its vision tower
with a classifier, which takes images only)."""


@dataclasses.dataclass(frozen=True)
class Sides:
    """How an image family's height and width may vary.

    Fields:
        step: ``step(config) -> int``, the size its sides are counted in (a patch, the
            downsampling of its stages); ``None``: the sides are the config's ``image_size``,
            fixed (learned position embeddings a size other than the config's does not fit).
        exact: the sides are multiples of the step (the model reshapes by it); else any size
            from one step up (a network of convolutions that floors), verified off the multiples.
        processor: fixed sides (``step`` ``None``) are the image processor's ``size``, not the
            config's ``image_size`` (:func:`processor_size`).
        largest: ``largest(config) -> int``, the largest side, or ``None``: no bound.
    """

    step: Callable[[Mapping[str, Any]], int] | None = None
    exact: bool = True
    processor: bool = False
    largest: Callable[[Mapping[str, Any]], int] | None = None


FIXED = Sides()


def _patch(config: Mapping[str, Any]) -> int:
    return int(config.get("patch_size", 16))


def _stages(config: Mapping[str, Any]) -> int:
    """ConvNeXt: a patch stem, then a halving per stage after the first."""
    return _patch(config) * 2 ** (int(config.get("num_stages", 4)) - 1)


def _strides(config: Mapping[str, Any]) -> int:
    """GLPN: its encoder's strides multiplied (its decoder adds each stage to the one above)."""
    return math.prod(int(s) for s in config.get("strides", (4, 2, 2, 2)))


def _keys_strided(config: Mapping[str, Any]) -> int:
    """CvT: its patch strides multiplied, by its last stage's key stride, twice (a last stage whose
    keys are one cell is a case its code takes apart)."""
    strides = math.prod(int(s) for s in config.get("patch_stride", (4, 2, 2)))
    return 2 * strides * int(config.get("stride_kv", (2, 2, 2))[-1])


@dataclasses.dataclass(frozen=True)
class Family:
    """One vision, vision-text or audio family (a config's ``model_type``).

    Fields:
        modality: ``image``, ``image-text`` (a text and an image model with a joint head), ``audio`` (raw
            audio) or ``spectrogram`` (log-mel frames, ``[batch, max_length, num_mel_bins]``, fixed
            but for the batch: the Audio Spectrogram Transformer's position embeddings fit its
            config's patches only).
        tasks: the tasks optimum exports it for (and transformers 5.17 has a head for).
        sides: how its images may be sized (``image`` and ``image-text``).
        attention_mask: its text takes an attention mask (SigLIP's does not: it pads to a fixed length).
        outputs: ``{task: output names}`` where they differ from :data:`TASKS`' (a vision tower's
            feature extraction gives its pooled output too).
    """

    modality: str
    tasks: tuple[str, ...]
    sides: Sides = FIXED
    attention_mask: bool = True
    outputs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def outputs_of(self, task: str) -> tuple[str, ...]:
        """The output names of ``task``'s model."""
        return self.outputs.get(task) or TASKS[task][1]


_CLASSIFIER = (FEATURE_EXTRACTION, IMAGE_CLASSIFICATION)
_DETECTOR = (FEATURE_EXTRACTION, OBJECT_DETECTION)
_DEPTH = (FEATURE_EXTRACTION, DEPTH_ESTIMATION)
_JOINT = (FEATURE_EXTRACTION, ZERO_SHOT)
_TOWER = {FEATURE_EXTRACTION: ("last_hidden_state", "pooler_output")}
_SPEECH = (FEATURE_EXTRACTION, SPEECH_RECOGNITION, AUDIO_CLASSIFICATION)
_CONVOLUTIONS = Sides(lambda config: 32, exact=False)
_TWO_CELLS = Sides(lambda config: 64, exact=False)  # downsampled 32 times to two cells or more (one is special-cased)
_POOLED = Sides(lambda config: 64, exact=False, largest=lambda config: 32 * int(config.get("hidden_dim", 2560)))

FAMILIES: dict[str, Family] = {
    "vit": Family(IMAGE, (*_CLASSIFIER, MASKED_IM)),
    "convnext": Family(IMAGE, _CLASSIFIER, Sides(_stages)),
    "swin": Family(IMAGE, (*_CLASSIFIER, MASKED_IM)),
    "dinov2": Family(IMAGE, _CLASSIFIER, Sides(_patch)),
    "detr": Family(IMAGE, _DETECTOR, _CONVOLUTIONS),
    "yolos": Family(IMAGE, _DETECTOR, Sides(_patch)),
    "rt_detr": Family(IMAGE, (OBJECT_DETECTION,), Sides(processor=True)),
    "segformer": Family(IMAGE, (*_CLASSIFIER, SEMANTIC_SEGMENTATION, IMAGE_SEGMENTATION), _CONVOLUTIONS),
    "dpt": Family(IMAGE, (*_DEPTH, SEMANTIC_SEGMENTATION, IMAGE_SEGMENTATION)),
    "glpn": Family(IMAGE, _DEPTH, Sides(_strides)),
    "clip": Family(IMAGE_TEXT, (*_JOINT, IMAGE_CLASSIFICATION), outputs={FEATURE_EXTRACTION: TASKS[ZERO_SHOT][1]}),
    "siglip": Family(IMAGE_TEXT, _JOINT, attention_mask=False, outputs={FEATURE_EXTRACTION: TASKS[ZERO_SHOT][1]}),
    "clip_vision_model": Family(IMAGE, (FEATURE_EXTRACTION,), outputs=_TOWER),
    "siglip_vision_model": Family(IMAGE, (FEATURE_EXTRACTION,), outputs=_TOWER),
    "wav2vec2": Family(AUDIO, (*_SPEECH, AUDIO_FRAMES, XVECTOR)),
    "hubert": Family(AUDIO, _SPEECH),
    "deit": Family(IMAGE, (*_CLASSIFIER, MASKED_IM)),
    "beit": Family(IMAGE, _CLASSIFIER),
    "data2vec-vision": Family(IMAGE, _CLASSIFIER),
    "vit_msn": Family(IMAGE, _CLASSIFIER),
    "convnextv2": Family(IMAGE, _CLASSIFIER, Sides(_stages)),
    "resnet": Family(IMAGE, _CLASSIFIER, _TWO_CELLS),
    "regnet": Family(IMAGE, _CLASSIFIER, _TWO_CELLS),
    "efficientnet": Family(IMAGE, _CLASSIFIER, _POOLED),
    "mobilenet_v1": Family(IMAGE, _CLASSIFIER),
    "mobilenet_v2": Family(IMAGE, _CLASSIFIER),
    "levit": Family(IMAGE, _CLASSIFIER),
    "poolformer": Family(IMAGE, _CLASSIFIER, _TWO_CELLS),
    "pvt": Family(IMAGE, _CLASSIFIER),
    "cvt": Family(IMAGE, _CLASSIFIER, Sides(_keys_strided, exact=False)),
    "swinv2": Family(IMAGE, (*_CLASSIFIER, MASKED_IM)),
    "hiera": Family(IMAGE, _CLASSIFIER),
    "mobilevit": Family(IMAGE, (*_CLASSIFIER, IMAGE_SEGMENTATION)),
    "table-transformer": Family(IMAGE, _DETECTOR, _CONVOLUTIONS),
    "rt_detr_v2": Family(IMAGE, (OBJECT_DETECTION,), Sides(processor=True)),
    "wavlm": Family(AUDIO, (*_SPEECH, AUDIO_FRAMES, XVECTOR)),
    "unispeech": Family(AUDIO, _SPEECH),
    "unispeech-sat": Family(AUDIO, (*_SPEECH, AUDIO_FRAMES, XVECTOR)),
    "sew": Family(AUDIO, _SPEECH),
    "sew-d": Family(AUDIO, _SPEECH),
    "data2vec-audio": Family(AUDIO, (*_SPEECH, AUDIO_FRAMES, XVECTOR)),
    "wav2vec2-conformer": Family(AUDIO, (*_SPEECH, AUDIO_FRAMES, XVECTOR)),
    "audio-spectrogram-transformer": Family(SPECTROGRAM, (FEATURE_EXTRACTION, AUDIO_CLASSIFICATION)),
}
"""``{model_type: Family}``. The image sides are fixed where the model's position embeddings fit
the config's ``image_size`` only (ViT, Swin, DPT and CLIP's and SigLIP's vision towers: optimum
names those dims ``height`` and ``width``, but its models fail at any other size); a multiple of
the patch where the model interpolates them (DINOv2, YOLOS); a multiple of the downsampling where
the model adds stages to each other (ConvNeXt, GLPN); any size for DETR and SegFormer, whose
processors resize to any size; the processor's size for RT-DETR, which builds its anchors from its
feature maps' sizes as Python ints (torch.export fixes them).

Fixed too: DeiT, BEiT, data2vec-vision, ViT-MSN, Swinv2, PVT, Hiera (their position embeddings),
LeViT (its attention biases), MobileNet v1 and v2 (optimum fixes them), MobileViT (exported with
its sides multiples of 32 it fails in ONNX Runtime, a Concat of mismatched sizes). ResNet, RegNet,
PoolFormer, EfficientNet: any side from 64, their last map two cells or more (one is a case their
code takes apart; EfficientNet's up to its pooling kernel, ``hidden_dim`` cells); CvT from twice
its strides by its keys' stride. The Audio Spectrogram Transformer's frames are fixed (its
position embeddings fit its config's patches). RT-DETRv2 as RT-DETR (its capture patch too).
Left out: D-FINE, which captures with the same patch, but whose ``F.linear`` of a 1-D weight (its
distribution's projection) core's ``aten::linear`` impl does not take (a Transpose of a vector);
BEiT's and data2vec-vision's
masked-im and semantic segmentation, which optimum does not list."""


def task_of(family: Family, architectures: list[str]) -> str | None:
    """The task an ``architectures`` entry says (its head), or ``None``."""
    for name in architectures:
        for suffix, task in HEADS[family.modality]:
            if name.endswith(suffix) and task in family.tasks:
                return task
    return None


def image_size(config: Mapping[str, Any]) -> tuple[int, int]:
    """The config's ``image_size`` (an int, or ``[height, width]``) as ``(height, width)``."""
    size = config.get("image_size", 224)
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def processor_size(processor: Mapping[str, Any] | None) -> tuple[int, int]:
    """The sides an image processor resizes to, ``(height, width)``: its ``size``
    (``{"height", "width"}``, or ``{"shortest_edge"}`` for a square), else RT-DETR's 640."""
    size = (processor or {}).get("size") or {}
    if "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    side = int(size.get("shortest_edge", 640))
    return side, side


def audio_span(config: Mapping[str, Any]) -> tuple[int, int]:
    """``(receptive field, stride)`` of an audio family's feature encoder, in samples: the
    shortest input giving one frame, and the samples between two frames."""
    field, stride = 1, 1
    for kernel, step in zip(config.get("conv_kernel", ()), config.get("conv_stride", ()), strict=True):
        field += (int(kernel) - 1) * stride
        stride *= int(step)
    return field, stride


def frames_needed(config: Mapping[str, Any], task: str) -> int:
    """The fewest frames an audio model takes for ``task``: two (one is a special case the
    feature encoder's code guards), more for an x-vector head, whose time-delay layers each
    need ``(kernel - 1) * dilation`` frames more than they give."""
    if task != XVECTOR:
        return 2
    kernels, dilations = config.get("tdnn_kernel", ()), config.get("tdnn_dilation", ())
    return max(2, 1 + sum((int(k) - 1) * int(d) for k, d in zip(kernels, dilations, strict=True)))
