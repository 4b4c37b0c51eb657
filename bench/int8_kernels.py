"""int8 or uint8 weights in a QDQ model: what each costs in ONNX Runtime on this CPU, and whether it is exact.

Run: python bench/int8_kernels.py [--rounds 15] [--runs 5]

A pt2e-quantized model (X86InductorQuantizer's defaults: uint8 activations, int8 weights per
channel) exported by ``opreg.export`` at its defaults keeps the int8 weights torch computed.
The same model with every int8 weight stored as uint8 and its zero point moved by 128 holds the
same real values and makes ONNX Runtime choose its u8u8 kernels instead of the u8s8 ones. On x86
CPUs without VNNI the u8s8 kernels saturate pairs of products in 16 bits (docs/quantization.md,
"Integer kernels on x86 CPUs without VNNI"); the u8u8 ones do not. This measures the price of the
exact form on the CPU it runs on: two models (a 768-3072-768 MLP at batch 64, four 64-channel 3x3
convolutions on 2x64x56x56), each form run by ONNX Runtime at one thread, in turns; the table
gives the median CPU time per run, the ratio, and each form's largest difference from eager.

Timings on shared machines are noisy: read the ratios within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from opreg.exporter.diagnosis import _intkernels


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(768, 3072), torch.nn.Linear(3072, 768)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Convs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(64, 64, 3, padding=1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.relu(conv(x))
        return x


MODELS = {"mlp": (MLP, (64, 768)), "convs": (Convs, (2, 64, 56, 56))}


def quantized(make: type[torch.nn.Module], shape: tuple[int, ...]) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model after pt2e's prepare, four calibration batches and convert, and an input."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    torch.manual_seed(0)
    example = torch.randn(shape)
    captured = torch.export.export(make().eval(), (example,), strict=False)
    quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(captured.module(), quantizer)
    for _ in range(4):
        prepared(torch.randn(shape))
    return convert_pt2e(prepared), example


def unsigned_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each int8 weight a DequantizeLinear reads stored as uint8 + 128, its zero point too."""
    model = onnx.shape_inference.infer_shapes(model)
    from onnxscript import optimizer

    model = optimizer.optimize(model, input_size_limit=1 << 30, output_size_limit=1 << 30)  # fold the zero points
    initializers = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in initializers:
            continue
        for name in node.input[0], node.input[2]:
            tensor = initializers[name]
            if tensor.data_type == onnx.TensorProto.INT8:
                moved = numpy_helper.to_array(tensor).astype(np.int16) + 128
                tensor.CopyFrom(numpy_helper.from_array(moved.astype(np.uint8), name))
    return model


def session(path: Path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure(name: str, rounds: int, runs: int, folder: Path) -> dict[str, float]:
    make, shape = MODELS[name]
    model, example = quantized(make, shape)
    expected = model(example).detach().numpy()
    signed = opreg.export(model, (example,), target=18).save(folder / f"{name}.onnx")
    unsigned = folder / f"{name}_u8.onnx"
    onnx.save(unsigned_weights(onnx.load(signed)), unsigned)
    sessions = {"int8": session(signed), "uint8": session(unsigned)}
    feeds = {s.get_inputs()[0].name: example.numpy() for s in sessions.values()}
    times: dict[str, list[float]] = {form: [] for form in sessions}
    errors = {}
    for form, s in sessions.items():
        errors[form] = float(np.abs(s.run(None, feeds)[0] - expected).max())
    for _ in range(rounds):
        for form, s in sessions.items():
            started = time.process_time()
            for _ in range(runs):
                s.run(None, feeds)
            times[form].append((time.process_time() - started) / runs * 1e3)
    medians = {form: statistics.median(t) for form, t in times.items()}
    return {**{f"{f} ms": v for f, v in medians.items()}, "ratio": medians["uint8"] / medians["int8"],
            **{f"{f} error": v for f, v in errors.items()}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    options = parser.parse_args()
    saturates = _intkernels.integer_products_saturate()
    print(f"ONNX Runtime {onnxruntime.__version__}; its u8s8 kernels here {'saturate' if saturates else 'are exact'}")
    print("| model | int8 weights (u8s8), ms | uint8 weights (u8u8), ms | uint8 / int8 | max abs error int8 | uint8 |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for name in options.models:
            row = measure(name, options.rounds, options.runs, Path(scratch))
            print(f"| {name} | {row['int8 ms']:.2f} | {row['uint8 ms']:.2f} | {row['ratio']:.2f}x "
                  f"| {row['int8 error']:.2g} | {row['uint8 error']:.2g} |")  # fmt: skip


if __name__ == "__main__":
    main()
