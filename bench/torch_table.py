"""The core pack as torch.onnx's custom_translation_table: which impls torch.onnx takes.

Run: python bench/torch_table.py [--target 18] [--limit 3] [--only NAME] [--raw]

For each op the core pack's translation table holds at the target
(``Registry.translation_table``), PyTorch's OpInfo float32 samples (the first
``--limit`` of up to two OpInfos) are exported by ``torch.onnx.export(dynamo=True)``
as one-op models, once without a table (samples torch.onnx itself cannot export
are not counted) and once with the table's entry for that op, then run in ONNX
Runtime and compared with eager PyTorch. ``--raw`` hands torch.onnx the impls'
functions as they are instead of the table's entries, which shows what the
table's wrapper is for. Slow: about a second per sample.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opreg
from opreg.testing import OpCall, Sample, compare_outputs
from opreg.testing import opinfo as oi


def export_and_compare(info: Any, sample: Sample, table: dict | None, target: int) -> None:
    """Export ``info``'s op on ``sample`` with torch.onnx, run it, compare with eager as
    opreg's harness does (indices by what they pick, uninitialized results by shape)."""
    model, inputs = OpCall(info.op, [sample]), OpCall.inputs([sample])
    program = torch.onnx.export(
        model, inputs, dynamo=True, custom_translation_table=table, opset_version=target, verbose=False, optimize=False
    )
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)})
    got = [torch.from_numpy(np.asarray(value)) for value in got]
    expected = [t.detach() for t in model(*inputs)]
    if oi.full_name(info) in oi.UNINITIALIZED:
        problems = [f"output {i}" for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g.shape != e.shape]
    else:
        compare = oi.compare_for(info) or compare_outputs
        problems = compare(sample, got, expected, 1e-3, 1e-4)
    if problems:
        raise AssertionError("; ".join(problems))


def root_cause(error: BaseException) -> str:
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=int, default=18, help="ai.onnx version (default 18)")
    parser.add_argument("--limit", type=int, default=3, help="samples per OpInfo (default 3)")
    parser.add_argument("--only", default=None, help="only ops whose name contains this")
    parser.add_argument("--raw", action="store_true", help="the impls' own functions, not the table's entries")
    options = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")

    registry = opreg.default_registry(plugins=[])
    table = registry.translation_table(options.target)
    started = time.perf_counter()
    counts = {"passed": 0, "failed": 0, "no samples": 0}
    for overload, entry in table.items():
        name = str(opreg.OpName.of(overload))
        if options.only and options.only not in name:
            continue
        function = table.impls[name].function if options.raw else entry
        samples = []
        for info in oi.opinfos_for(name)[:2]:
            if torch.float32 in info.supported_dtypes("cpu"):
                samples += [(info, s) for s in oi.samples(info, torch.float32, limit=options.limit)]
        failure, tried = None, 0
        for info, sample in samples:
            try:
                export_and_compare(info, sample, None, options.target)
            except Exception:
                continue  # torch.onnx cannot export the sample on its own
            tried += 1
            try:
                export_and_compare(info, sample, {overload: function}, options.target)
            except Exception as e:
                failure = f"{sample.label}: {root_cause(e)}"
                break
        status = "no samples" if not tried else ("failed" if failure else "passed")
        counts[status] += 1
        if failure:
            print(f"{name:50} {table.impls[name].name:40} {failure}")
    kind = "functions as they are" if options.raw else "table entries"
    print(
        f"ai.onnx {options.target}, {kind}: {counts['passed']} ops passed, {counts['failed']} failed, "
        f"{counts['no samples']} without a sample torch.onnx exports alone ({time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
