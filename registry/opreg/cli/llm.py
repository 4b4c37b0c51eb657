"""``opreg llm``: language models; ``opreg llm export`` writes a causal LM as a decoder, in a
folder ONNX Runtime GenAI runs."""

from __future__ import annotations

import argparse
import logging
import time

from opreg.cli._common import (
    EXIT_FINDINGS,
    EXIT_OK,
    UsageError,
    console,
    print_json,
    registry,
    styled,
    warn_conflicts,
)
from opreg.cli._options import Parents


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser("llm", help="language models: a causal LM as a decoder ONNX Runtime GenAI runs")
    llm = p.add_subparsers(dest="llm_command", required=True, metavar="COMMAND")
    p = llm.add_parser(
        "export", parents=[parents.output, parents.packs, parents.target],
        help="export a transformers checkpoint folder to a folder ONNX Runtime GenAI loads",
    )  # fmt: skip
    p.add_argument("folder", metavar="FOLDER", help="a transformers checkpoint (config.json, weights, tokenizer)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write (created if missing)")
    p.add_argument(
        "--verify", action="store_true",
        help="compare the decoder with the transformers model (prefill, decode, left padding)",
    )  # fmt: skip
    p.add_argument("--context-length", type=int, metavar="N", help="the longest sequence GenAI may generate")
    p.add_argument("--external-data", action="store_true", help="write the weights to a side file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``opreg llm export``."""
    from pathlib import Path

    from opreg.errors import VerificationError
    from opreg.llm import _decoder

    reg = registry(args)
    target = reg.target(args.target)
    if not (Path(args.folder) / "config.json").is_file():
        raise UsageError(f"{args.folder} is not a transformers checkpoint folder (no config.json)")
    warn_conflicts(reg)
    if not args.debug:
        logging.getLogger("torch").setLevel(logging.CRITICAL)  # torch logs tracebacks of errors opreg reports
    started = time.perf_counter()
    err = console(stderr=True)
    with err.status(f"exporting {args.folder}..."):
        decoder = _decoder.export_decoder(args.folder, target=target, registry=reg, context_length=args.context_length)
        exported = time.perf_counter() - started
        folder = decoder.save(args.output, external_data=True if args.external_data else None)
    checks = []
    if args.verify:
        with err.status("verifying..."):
            try:
                checks = decoder.verify()
            except VerificationError as e:
                err.print(styled(f"wrote {folder}, but the decoder does not match transformers:\n{e}", "red"))
                return EXIT_FINDINGS
    layout = decoder.layout
    summary = {
        "folder": str(folder),
        "files": sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")),
        "target": target.as_dict(),
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
        return EXIT_OK
    out = console()
    out.print(
        f"wrote {folder} ({', '.join(summary['files'])}): {type(decoder.model).__name__}, {layout.num_layers} layers, "
        f"{summary['nodes']} nodes, exported in {exported:.1f} s",
        markup=False,
    )
    if checks:
        out.print(
            f"verified: {len(checks)} outputs match transformers (max abs {summary['max_abs']:.3g})", markup=False
        )
    return EXIT_OK
