"""``opreg llm``: language, speech and vision-language models; ``opreg llm export`` writes a
checkpoint as the folder ONNX Runtime GenAI runs for its family (a causal LM as a decoder,
Whisper as an encoder and decoder, a vision-language model as three models)."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

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
    p = subparsers.add_parser("llm", help="language, speech and vision-language models as ONNX Runtime GenAI runs them")
    llm = p.add_subparsers(dest="llm_command", required=True, metavar="COMMAND")
    p = llm.add_parser(
        "export", parents=[parents.output, parents.packs, parents.target],
        help="export a transformers checkpoint folder (a causal LM, Whisper, a vision-language model) to a folder "
        "ONNX Runtime GenAI loads",
    )  # fmt: skip
    p.add_argument("folder", metavar="FOLDER", help="a transformers checkpoint (config.json, weights, tokenizer)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write (created if missing)")
    p.add_argument(
        "--verify", action="store_true",
        help="compare the models with the transformers model (prefill, decode, left padding)",
    )  # fmt: skip
    p.add_argument("--context-length", type=int, metavar="N", help="the longest sequence GenAI may generate")
    p.add_argument("--external-data", action="store_true", help="write the weights to a side file")
    p.add_argument(
        "--precision", choices=("fp32", "int8", "int4"), default=None,
        help="Whisper and vision-language models: linear weights as ONNX Runtime's MatMulNBits (int8, int4; with "
        "-t onnxruntime)",
    )  # fmt: skip
    p.add_argument(
        "--no-streaming", dest="streaming", action="store_false", default=None,
        help="load the model with its weights first (default: stream them from the safetensors files as "
        "model.onnx is written; the same file, in a fraction of the memory)",
    )  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``opreg llm export``."""
    from pathlib import Path

    from opreg.errors import VerificationError
    from opreg.llm import _families

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
        exported_model = _families.export_checkpoint(Path(args.folder), **_options(args, target, reg))
        exported = time.perf_counter() - started
        folder = exported_model.save(args.output, external_data=True if args.external_data else None)
    checks = []
    if args.verify:
        with err.status("verifying..."):
            try:
                checks = exported_model.verify()
            except VerificationError as e:
                err.print(styled(f"wrote {folder}, but the models do not match transformers:\n{e}", "red"))
                return EXIT_FINDINGS
    summary = _summary(exported_model, folder, target, exported, checks)
    if args.json:
        print_json(summary)
        return EXIT_OK
    nodes = ", ".join(f"{name} {info['nodes']} nodes" for name, info in summary["models"].items())
    console().print(
        f"wrote {folder} ({', '.join(summary['files'])}): {type(exported_model.model).__name__}, "
        f"{summary['layers']} layers, {nodes}, exported in {exported:.1f} s",
        markup=False,
    )
    if checks:
        console().print(
            f"verified: {len(checks)} outputs match transformers (max abs {summary['max_abs']:.3g})", markup=False
        )
    return EXIT_OK


def _options(args: argparse.Namespace, target: Any, reg: Any) -> dict[str, Any]:
    """The keyword arguments of the checkpoint's family's export: ``--no-streaming`` for a causal
    LM (the others load their model), ``--precision`` for the others."""
    from pathlib import Path

    from opreg.llm import _families

    options: dict[str, Any] = {"target": target, "registry": reg, "context_length": args.context_length}
    if _families.family_of(_families.read_config(Path(args.folder))) in (None, _families.TEXT):
        if args.precision is not None:
            raise UsageError("--precision is for Whisper and vision-language checkpoints; a causal LM takes none yet")
        options["streaming"] = args.streaming
    elif args.precision is not None:
        options["precision"] = args.precision
    return options


def _summary(exported_model: Any, folder: Any, target: Any, seconds: float, checks: list) -> dict[str, Any]:
    """What ``--json`` prints: the folder, its files, each model's inputs, outputs and node count
    (``inputs``, ``outputs``, ``nodes``: the decoder's), the export's time and the checks."""
    programs = exported_model.programs
    decoder = list(programs.values())[-1]
    return {
        "folder": str(folder),
        "files": sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")),
        "target": target.as_dict(),
        "layers": exported_model.layout.num_layers,
        "inputs": list(decoder.input_names),
        "outputs": list(decoder.output_names),
        "nodes": len(decoder.model.graph),
        "models": {
            name: {"inputs": list(p.input_names), "outputs": list(p.output_names), "nodes": len(p.model.graph)}
            for name, p in programs.items()
        },
        "export_seconds": round(seconds, 2),
        "verified": len(checks),
        "max_abs": max((c.max_abs for c in checks), default=None),
    }
