"""``opreg llm``: language models; ``opreg llm export`` writes a causal LM as a decoder, in a
folder ONNX Runtime GenAI runs.

What can be checked before the export is, and refused in one line: the checkpoint folder, the
output folder (a file, a missing parent), ``--context-length``, the precision's options; a folder
without a tokenizer is exported with a warning (``--no-tokenizer`` says none is wanted). The output
folder is written whole (an interrupt leaves the old folder or the complete new one, and says
which)."""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from opreg.cli._common import (
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    UsageError,
    console,
    print_json,
    registry,
    styled,
    warn_conflicts,
)
from opreg.cli._options import Parents

PRECISIONS = ("fp32", "int8", "int4")


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser("llm", help="language models: a causal LM as a decoder ONNX Runtime GenAI runs")
    llm = p.add_subparsers(dest="llm_command", required=True, metavar="COMMAND")
    p = llm.add_parser(
        "export", parents=[parents.output, parents.packs],
        help="export a transformers checkpoint folder to a folder ONNX Runtime GenAI loads",
    )  # fmt: skip
    p.add_argument("folder", metavar="FOLDER", help="a transformers checkpoint (config.json, weights, tokenizer)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write (created if missing)")
    p.add_argument(
        "--target", "-t", default=None,
        help="onnxruntime (ONNX Runtime's fused kernels), onnx (portable standard ONNX), or any target "
        "opreg export takes; default: the fastest installed (onnxruntime with opreg-ort-contrib, else onnx)",
    )  # fmt: skip
    _add_precision(p)
    p.add_argument(
        "--verify", action="store_true",
        help="compare the decoder with the transformers model (prefill, decode, left padding)",
    )  # fmt: skip
    p.add_argument(
        "--context-length", type=int, metavar="N",
        help="the longest sequence GenAI may generate (default: the model's position limit)",
    )  # fmt: skip
    p.add_argument(
        "--allow-longer-context", action="store_true",
        help="allow a --context-length above the model's position limit (for positions that extrapolate)",
    )  # fmt: skip
    p.add_argument(
        "--no-tokenizer", action="store_true",
        help="write no tokenizer (and no warning when the checkpoint has none)",
    )  # fmt: skip
    p.add_argument(
        "--external-data", action=argparse.BooleanOptionalAction, default=True,
        help="the weights in a file beside model.onnx (the default, as GenAI's builder writes them); "
        "--no-external-data: inside model.onnx (a model of up to 2 GB)",
    )  # fmt: skip
    p.add_argument(
        "--no-streaming", dest="streaming", action="store_false", default=None,
        help="load the model with its weights first (default: stream them from the safetensors files as "
        "model.onnx is written; the same file, in a fraction of the memory)",
    )  # fmt: skip
    p.set_defaults(run=run)


def _add_precision(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--precision", choices=PRECISIONS, default="fp32",
        help="the linear layers' weights: fp32 (as they are), int8 or int4 (block-wise, ONNX Runtime's "
        "MatMulNBits; a tied embedding table stored once); default fp32",
    )  # fmt: skip
    p.add_argument(
        "--block-size", type=int, metavar="N",
        help="int8/int4: values per block, a power of two of at least 16 (default 128, the fastest measured)",
    )  # fmt: skip
    symmetry = p.add_mutually_exclusive_group()
    symmetry.add_argument(
        "--symmetric", dest="symmetric", action="store_const", const=True,
        help="int8/int4: values around 0, no zero points (the default)",
    )  # fmt: skip
    symmetry.add_argument(
        "--asymmetric", dest="symmetric", action="store_const", const=False,
        help="int8/int4: a zero point per block",
    )  # fmt: skip
    p.add_argument(
        "--accuracy-level", type=int, choices=range(5), metavar="{0-4}",
        help="int8/int4: MatMulNBits' accuracy_level, the lowest precision its input is computed in "
        "(default 4: int8, the fastest on CPU; 0: float)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """``opreg llm export``."""
    from pathlib import Path

    from opreg.llm import _checkpoint, _folder

    if not (Path(args.folder) / "config.json").is_file():
        raise UsageError(f"{args.folder} is not a transformers checkpoint folder (no config.json)")
    _folder.check_folder(args.output)  # refused now, not after the export
    _checkpoint.check_context_length_value(args.context_length)
    reg = registry(args)
    warn_conflicts(reg)
    err = console(stderr=True)
    tokenizer = False if args.no_tokenizer else None
    if tokenizer is None and not _checkpoint.has_tokenizer(args.folder):
        err.print(styled(f"warning: {_checkpoint.no_tokenizer_warning(args.folder)}", "yellow"), soft_wrap=True)
        tokenizer = False
    if not args.debug:
        logging.getLogger("torch").setLevel(logging.CRITICAL)  # torch logs tracebacks of errors opreg reports
        _quiet_transformers()
    stage = ["export"]
    try:
        return _export(args, reg, tokenizer, err, stage)
    except KeyboardInterrupt as e:
        err.print(f"opreg: interrupted: {_interrupted(e, stage[0], args)}", markup=False, soft_wrap=True)
        return EXIT_INTERRUPTED


def _export(args: argparse.Namespace, reg: Any, tokenizer: Any, err: Any, stage: list[str]) -> int:
    from opreg.errors import VerificationError
    from opreg.llm import _decoder, _genai

    started = time.perf_counter()
    with err.status(f"exporting {args.folder}..."):
        decoder = _decoder.export_decoder(
            args.folder, target=args.target, registry=reg, context_length=args.context_length,
            allow_longer_context=args.allow_longer_context, tokenizer=tokenizer, precision=args.precision,
            block_size=args.block_size, symmetric=args.symmetric, accuracy_level=args.accuracy_level,
            streaming=args.streaming,
        )  # fmt: skip
        exported = time.perf_counter() - started
        stage[0] = "save"
        folder, files = _genai.save(decoder, args.output, external_data=args.external_data)
    stage[0] = "verify"
    checks = []
    if args.verify:
        with err.status("verifying..."):
            try:
                checks = decoder.verify()
            except VerificationError as e:
                err.print(styled(f"wrote {folder}, but the decoder does not match transformers:\n{e}", "red"))
                return EXIT_FINDINGS
    _report(args, decoder, folder, files, exported, checks)
    return EXIT_OK


def _report(args: argparse.Namespace, decoder: Any, folder: Any, files: list[str], exported: float, checks) -> None:
    layout, target = decoder.layout, decoder.program.target
    summary = {
        "folder": str(folder),
        "files": files,
        "target": target.name,
        "opsets": target.as_dict(),
        "precision": decoder.precision,
        "layers": layout.num_layers,
        "inputs": list(decoder.program.input_names),
        "outputs": list(decoder.program.output_names),
        "nodes": len(decoder.program.model.graph),
        "export_seconds": round(exported, 2),
        "verified": len(checks),
        "max_abs": max((c.max_abs for c in checks), default=None),
    }
    if args.json:
        print_json(summary)
        return
    out = console()
    out.print(
        f"wrote {folder} ({', '.join(files)}): {type(decoder.model).__name__}, {layout.num_layers} layers, "
        f"{summary['nodes']} nodes, target {target.name}, {decoder.precision}, exported in {exported:.1f} s",
        markup=False,
        soft_wrap=True,
    )
    if checks:
        out.print(
            f"verified: {len(checks)} outputs match transformers (max abs {summary['max_abs']:.3g})", markup=False
        )


def _interrupted(error: KeyboardInterrupt, stage: str, args: argparse.Namespace) -> str:
    """What an interrupt during ``stage`` left at the output folder."""
    from opreg.errors import InterruptedAfterSave

    if isinstance(error, InterruptedAfterSave) or stage == "verify":
        return f"{args.output} holds the new model folder (saved before the interrupt){', not verified' * args.verify}"
    return f"{args.output} was not changed" if os.path.lexists(args.output) else "nothing was written"


def _quiet_transformers() -> None:
    """No progress bars of transformers' loading under opreg's status line."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
