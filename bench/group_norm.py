"""Group norm in ONNX Runtime, spelled three ways: which one the core pack uses is chosen here.

Run: python bench/group_norm.py [--runs 50] [--latent 32]

A diffusers VAE decoder (AutoencoderKL, small random-init config: every block
normalizes with GroupNorm) is exported by opreg with each spelling of
``aten::group_norm`` forced (a registry copy where the spelling's impl has the
highest priority), at ai.onnx 18 and 21, and by torch.onnx.export(dynamo=True);
ONNX Runtime runs each at one thread, in turns, and the table gives median latency
and the ratio to torch.onnx's model at the same opset:

- ``instance``: InstanceNormalization of the (N, groups, -1) view, then the
  per-channel scale and shift (what torch.onnx writes, and the core pack from 18);
- ``decomposed``: ReduceMean/Sub/Mul/Sqrt over the grouped view;
- ``group21``: GroupNormalization-21 (ai.onnx 21 and up).

Timings on shared machines are noisy: read the ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from opreg_core_ops.ops import normalization


class Decoder(torch.nn.Module):
    """A diffusers VAE decoder: latents in, image out."""

    def __init__(self) -> None:
        super().__init__()
        from diffusers import AutoencoderKL

        torch.manual_seed(0)
        self.vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=16, sample_size=64,
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            block_out_channels=(32, 64), layers_per_block=1,
        ).eval()  # fmt: skip

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(z).sample


def _decomposed(input, num_groups: int, weight=None, bias=None, eps: float = 1e-05, cudnn_enabled: bool = True):
    """group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enabled=True) -> Tensor: decomposition."""  # noqa: E501
    return normalization._group_norm_decomposed(input, weight, bias, num_groups, eps)[0]


def _instance(input, num_groups: int, weight=None, bias=None, eps: float = 1e-05, cudnn_enabled: bool = True):
    """group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enabled=True) -> Tensor: InstanceNormalization."""  # noqa: E501
    return normalization._group_norm_instance(input, weight, bias, num_groups, eps)


def _group21(input, num_groups: int, weight=None, bias=None, eps: float = 1e-05, cudnn_enabled: bool = True):
    """group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enabled=True) -> Tensor: GroupNormalization-21."""  # noqa: E501
    return normalization._group_norm_21(input, weight, bias, num_groups, eps)


SPELLINGS = {"instance": (_instance, 18), "decomposed": (_decomposed, 18), "group21": (_group21, 21)}


def _registry(spelling: str) -> opreg.Registry:
    function, opset = SPELLINGS[spelling]
    registry = opreg.default_registry().copy()
    registry.register("aten::group_norm", function, opset=opset, priority=100)
    return registry


def _session(proto: bytes) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(proto, options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--latent", type=int, default=32, help="latent height and width (the image is 2x)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    model = Decoder()
    z = torch.randn(1, 4, args.latent, args.latent)
    with torch.no_grad():
        expected = model(z).numpy()
    runs: dict[str, tuple[onnxruntime.InferenceSession, int]] = {}
    for opset in (18, 21):
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = torch.onnx.export(model, (z,), dynamo=True, opset_version=opset)
        runs[f"torch.onnx@{opset}"] = (_session(theirs.model_proto.SerializeToString()), opset)
        for spelling, (_, lowest) in SPELLINGS.items():
            if opset >= lowest:
                ours = opreg.export(model, (z,), target=opset, registry=_registry(spelling))
                runs[f"{spelling}@{opset}"] = (_session(ours.model_proto.SerializeToString()), opset)
    feeds = {name: {session.get_inputs()[0].name: z.numpy()} for name, (session, _) in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    worst: dict[str, float] = {}
    for name, (session, _) in runs.items():  # warm-up, and the outputs against eager
        worst[name] = float(abs(session.run(None, feeds[name])[0] - expected).max())
    for _ in range(args.runs):
        for name, (session, _) in runs.items():
            start = time.perf_counter()
            session.run(None, feeds[name])
            times[name].append(time.perf_counter() - start)
    shape = f"4x{args.latent}x{args.latent}"
    print(f"diffusers VAE decoder, latents {shape}; ONNX Runtime {onnxruntime.__version__}, 1 thread")
    print(f"{'spelling@opset':<18} {'ms':>8} {'vs torch.onnx':>13} {'max abs':>9}")
    for name, (_, opset) in runs.items():
        median = statistics.median(times[name])
        base = statistics.median(times[f"torch.onnx@{opset}"])
        print(f"{name:<18} {median * 1e3:>8.2f} {median / base:>12.2f}x {worst[name]:>9.1e}")


if __name__ == "__main__":
    main()
