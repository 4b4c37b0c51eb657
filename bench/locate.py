"""What locating a mismatch costs: program.locate() against a plain program.verify() on the
zoo's models, and torch.onnx's own intermediate comparison (verify_onnx_program(...,
compare_intermediates=True)) against its plain verify_onnx_program, in the same run.

Each figure is the best of --repeat runs after one warm-up (sessions are made per call, as
a user's first call makes them). locate() runs the exported program once in eager PyTorch
keeping every value, and the model once in ONNX Runtime with those values as extra outputs,
then replays each node out of tolerance; a correct model has none to replay.

Run: python bench/locate.py [--models tutorial_cnn,resnet18,bert,gpt2] [--repeat 3] [--exporters opreg]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from tests.real_models import FACTORIES

DEFAULT_MODELS = "tutorial_cnn,resnet18,mobilenet,bert,gpt2,vit"


def best(repeat: int, call) -> float:
    call()  # warm-up: imports, caches
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def fresh(program: opreg.OnnxProgram) -> opreg.OnnxProgram:
    program._sessions.clear()  # each call pays its session, as a user's first call does
    return program


def opreg_row(case, repeat: int) -> tuple[float, float, int]:
    program = opreg.export(case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes)
    plain = best(repeat, lambda: fresh(program).verify(*case.args, **case.kwargs, rtol=1e-3, atol=1e-3))
    located = best(repeat, lambda: fresh(program).locate(*case.args, **case.kwargs, rtol=1e-3, atol=1e-3))
    compared = program.locate(*case.args, **case.kwargs, rtol=1e-3, atol=1e-3).compared
    return plain, located, compared


def torch_row(case, repeat: int) -> tuple[float, float, int]:
    from torch.onnx.verification import verify_onnx_program

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            case.model, case.args, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes, dynamo=True
        )

        def verify(intermediates: bool):
            program.release()  # its session is made again, as opreg's is
            return verify_onnx_program(program, case.args, case.kwargs, compare_intermediates=intermediates)

        plain = best(repeat, lambda: verify(False))
        located = best(repeat, lambda: verify(True))
        compared = len(verify(True))
    return plain, located, compared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated names from tests/real_models.py")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--exporters", default="opreg,torch.onnx", help="which rows: opreg, torch.onnx or both")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, opreg {opreg.__version__}; best of {args.repeat}, 1 thread")
    header = f"{'model':<14} {'exporter':<10} {'values':>6} {'verify s':>9} {'locate s':>9} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        case = FACTORIES[name]()
        for exporter, row in (("opreg", opreg_row), ("torch.onnx", torch_row)):
            if exporter not in args.exporters.split(","):
                continue
            try:
                plain, located, compared = row(case, args.repeat)
                cells = f"{compared:>6} {plain:>9.3f} {located:>9.3f} {located / plain:>6.1f}"
            except Exception as e:  # a peer that cannot do it is a row, not a crash
                cells = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:60]}"
            print(f"{name:<14} {exporter:<10} {cells}", flush=True)


if __name__ == "__main__":
    main()
