"""opreg pack for torchvision: its C++ ops to standard ONNX, and capture patches for its detectors.

- impls (:mod:`opreg_torchvision.ops`) for ``torchvision::nms``, ``roi_align``,
  ``roi_pool``, ``ps_roi_align``, ``ps_roi_pool`` and ``deform_conv2d``;
- capture patches (:mod:`opreg_torchvision.patches`) for the Python of
  ``torchvision.models.detection`` that ``torch.export`` cannot capture, so
  Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS, SSD and SSDlite export with a
  data-dependent number of detections.

Importing this module imports neither torch nor torchvision: the hooks do.
"""

from __future__ import annotations

import opreg

OPREG_API_VERSION = 1
OPREG_REQUIRES_TORCH = ">=2.6"


@opreg.hookimpl
def opreg_register_ops(registry: opreg.Registrar) -> None:
    from opreg_torchvision import keypoints, ops

    # Neither is torchvision imported here (seconds, paid by every registry build) nor the pack's own op
    # defined (the capture patch defines it when it patches a model): opreg checks each impl against its
    # op's schema where the op exists, at registration or when an export first plans the impl (the
    # pack's tests check them all, after importing torchvision and defining the op)
    registry.register_module(ops, keypoints)


@opreg.hookimpl
def opreg_capture_patches():
    from opreg_torchvision import patches

    return patches.PATCHES


@opreg.hookimpl
def opreg_samples():
    from opreg_torchvision import samples

    return samples.op_samples()


@opreg.hookimpl
def opreg_capture_samples():
    from opreg_torchvision import samples

    return samples.patch_samples()
