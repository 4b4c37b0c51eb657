"""``opreg llm``: language, speech and vision-language models; ``opreg llm export`` writes a
checkpoint as the folder ONNX Runtime GenAI runs for its family (a causal LM as a decoder,
Whisper as an encoder and decoder, a vision-language model as three models).

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
from pathlib import Path
from typing import Any

from opreg.cli._common import (
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    UsageError,
    console,
    packs,
    print_json,
    styled,
    warn_conflicts,
)
from opreg.cli._options import Parents

PRECISIONS = ("fp32", "int8", "int4")


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser("llm", help="language, speech and vision-language models as ONNX Runtime GenAI runs them")
    llm = p.add_subparsers(dest="llm_command", required=True, metavar="COMMAND")
    p = llm.add_parser(
        "export", parents=[parents.output, parents.packs],
        help="export a transformers checkpoint folder (a causal LM, Whisper, a vision-language model) to a folder "
        "ONNX Runtime GenAI loads",
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
        help="compare the models with the transformers model (prefill, decode, left padding)",
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
    from opreg.llm import _checkpoint, _folder

    if not (Path(args.folder) / "config.json").is_file():
        raise UsageError(f"{args.folder} is not a transformers checkpoint folder (no config.json)")
    _folder.check_folder(args.output)  # refused now, not after the export
    _checkpoint.check_context_length_value(args.context_length)
    loaded = packs(args)  # the registry and the host of the packs -p selects
    warn_conflicts(loaded.registry)
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
        return _export(args, loaded, tokenizer, err, stage)
    except KeyboardInterrupt as e:
        err.print(f"opreg: interrupted: {_interrupted(e, stage[0], args)}", markup=False, soft_wrap=True)
        return EXIT_INTERRUPTED


def _export(args: argparse.Namespace, loaded: Any, tokenizer: Any, err: Any, stage: list[str]) -> int:
    from opreg.errors import VerificationError
    from opreg.llm import _families

    family = _families.family_of(_families.read_config(Path(args.folder))) or _families.TEXT
    started = time.perf_counter()
    with err.status(f"exporting {args.folder}..."):
        if family is _families.TEXT:
            exported_model, folder, files = _export_decoder(args, loaded, tokenizer, stage)
        else:
            exported_model, folder, files = _export_family(args, loaded, family, stage)
        exported = time.perf_counter() - started
    stage[0] = "verify"
    checks = []
    if args.verify:
        with err.status("verifying..."):
            try:
                checks = exported_model.verify()
            except VerificationError as e:
                err.print(styled(f"wrote {folder}, but the models do not match transformers:\n{e}", "red"))
                return EXIT_FINDINGS
    _report(args, exported_model, folder, files, exported, checks)
    return EXIT_OK


def _export_decoder(args: argparse.Namespace, loaded: Any, tokenizer: Any, stage: list[str]) -> tuple[Any, Any, list]:
    """A causal LM's decoder, exported and saved: the decoder, the folder and the names written."""
    from opreg.llm import _decoder, _genai

    decoder = _decoder.export_decoder(
        args.folder, target=args.target, registry=loaded.registry, host=loaded.host, context_length=args.context_length,
        allow_longer_context=args.allow_longer_context, tokenizer=tokenizer, precision=args.precision,
        block_size=args.block_size, symmetric=args.symmetric, accuracy_level=args.accuracy_level,
        streaming=args.streaming,
    )  # fmt: skip
    stage[0] = "save"
    folder, files = _genai.save(decoder, args.output, external_data=args.external_data)
    return decoder, folder, files


def _export_family(args: argparse.Namespace, loaded: Any, family: Any, stage: list[str]) -> tuple[Any, Any, list]:
    """Whisper's or a vision-language model's models, exported and saved (quantized as GenAI's
    builder does for CPU: the block options are the causal LM's only)."""
    from opreg.llm import _families, _options

    given = [flag for flag, value in (("--block-size", args.block_size), ("--symmetric/--asymmetric", args.symmetric),
                                      ("--accuracy-level", args.accuracy_level)) if value is not None]  # fmt: skip
    if given:
        raise UsageError(f"{', '.join(given)}: for causal LMs only; a {family.name} takes --precision alone")
    exported_model = _families.export_checkpoint(
        Path(args.folder), target=_options.resolve_target(args.target, loaded.registry), registry=loaded.registry,
        host=loaded.host, context_length=args.context_length, precision=args.precision,
    )  # fmt: skip
    stage[0] = "save"
    folder = exported_model.save(args.output, external_data=args.external_data)
    return exported_model, folder, sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def _report(args: argparse.Namespace, exported: Any, folder: Any, files: list[str], seconds: float, checks) -> None:
    programs = exported.programs  # by file name, the decoder last
    decoder = list(programs.values())[-1]
    layout, target = exported.layout, decoder.target
    precision = getattr(exported, "precision", args.precision)
    summary = {
        "folder": str(folder),
        "files": files,
        "target": target.name,
        "opsets": target.as_dict(),
        "precision": precision,
        "layers": layout.num_layers,
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
    if args.json:
        print_json(summary)
        return
    out = console()
    nodes = ", ".join(f"{name} {info['nodes']} nodes" for name, info in summary["models"].items())
    out.print(
        f"wrote {folder} ({', '.join(files)}): {type(exported.model).__name__}, {layout.num_layers} layers, "
        f"{nodes}, target {target.name}, {precision}, exported in {seconds:.1f} s",
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
