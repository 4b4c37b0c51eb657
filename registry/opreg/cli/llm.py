"""``opreg llm``: language, speech and vision-language models; ``opreg llm export`` writes a
checkpoint as the folder ONNX Runtime GenAI runs for its family (a causal LM as a decoder,
Whisper as an encoder and decoder, a vision-language model as three models).

Its flags are :class:`opreg.llm.LLMSettings`' options, each added from its declaration; the
command calls :func:`opreg.llm.export_checkpoint`, which checks what can be checked before the
export (the checkpoint folder, the output folder, the context length, an option the family does
not take) and refuses it in one line; a folder without a tokenizer is exported with a warning
(``--no-tokenizer`` says none is wanted). The output folder is written whole (an interrupt leaves
the old folder or the complete new one, and says which)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from opreg.cli._common import (
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    console,
    packs,
    print_json,
    styled,
    warn_conflicts,
)
from opreg.cli._options import Parents
from opreg.registry.targets import domain_label
from opreg.registry.versions import opsets_text


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
        "--verify", action="store_true",
        help="compare the models with the transformers model (prefill, decode, left padding)",
    )  # fmt: skip
    add_settings(p)
    p.set_defaults(run=run)


def add_settings(parser: argparse.ArgumentParser) -> None:
    """A flag for each option of :class:`opreg.llm.LLMSettings` that has one, as its field declares
    it (two or more flags of one option: mutually exclusive)."""
    from opreg.llm import LLMSettings

    for field, option in LLMSettings.options():
        where = parser.add_mutually_exclusive_group() if len(option.flags) > 1 else parser
        for flag in option.flags:
            where.add_argument(
                *flag.names, dest=field.name, default=field.default, help=flag.help or option.help, **flag.argparse
            )


def settings_of(args: argparse.Namespace) -> Any:
    """The :class:`opreg.llm.LLMSettings` the flags give (checked: a bad value is refused now)."""
    from opreg.llm import LLMSettings

    return LLMSettings(
        **{field.name: getattr(args, field.name) for field, option in LLMSettings.options() if option.flags}
    )


def run(args: argparse.Namespace) -> int:
    """``opreg llm export``."""
    settings = settings_of(args)
    loaded = packs(args)  # the registry and the host of the packs -p selects
    warn_conflicts(loaded.registry)
    err = console(stderr=True)
    if not args.debug:
        logging.getLogger("torch").setLevel(logging.CRITICAL)  # torch logs tracebacks of errors opreg reports
        _quiet_transformers()
    stage = ["export"]
    try:
        with _warnings_shown(err):
            return _export(args, settings, loaded, err, stage)
    except KeyboardInterrupt as e:
        err.print(f"opreg: interrupted: {_interrupted(e, stage[0], args)}", markup=False, soft_wrap=True)
        return EXIT_INTERRUPTED


def _export(args: argparse.Namespace, settings: Any, loaded: Any, err: Any, stage: list[str]) -> int:
    import opreg.llm
    from opreg.errors import VerificationError

    started = time.perf_counter()
    with err.status(f"exporting {args.folder}..."):
        exported = opreg.llm.export_checkpoint(
            args.folder, args.output, settings, registry=loaded.registry, host=loaded.host
        )
        seconds = time.perf_counter() - started
    stage[0] = "verify"
    checks = []
    if args.verify:
        with err.status("verifying..."):
            try:
                checks = exported.verify()
            except VerificationError as e:
                err.print(
                    styled(f"wrote {exported.saved.folder}, but the models do not match transformers:\n{e}", "red")
                )
                return EXIT_FINDINGS
    _report(args, exported, seconds, checks)
    return EXIT_OK


def _precision(exported: Any) -> str:
    """The weights' precision, and the quantized checkpoint's format whose integers were written as they are."""
    stored = exported.stored_format
    return exported.precision if stored is None else f"{exported.precision} ({stored} checkpoint's integers)"


def _report(args: argparse.Namespace, exported: Any, seconds: float, checks: list) -> None:
    """What ``exported`` (an :class:`opreg.llm.ExportedModel`, of any family) is and where its save
    wrote it: a line, or ``--json``'s summary."""
    programs, (folder, files) = exported.programs, (exported.saved.folder, list(exported.saved.files))
    decoder = list(programs.values())[-1]
    layout, target = exported.layout, exported.target
    summary = {
        "folder": str(folder),
        "files": files,
        "target": target.name,
        "opsets": {domain_label(d): v for d, v in sorted(decoder.model.opset_imports.items())},
        "opset_floors": decoder.opset_floors,
        "precision": exported.precision,
        "stored_format": exported.stored_format,
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
        f"{nodes}, target {target.name} (opsets {opsets_text(summary['opsets'], decoder.opset_floors)}), "
        f"{_precision(exported)}, exported in {seconds:.1f} s",
        markup=False,
        soft_wrap=True,
    )
    if checks:
        out.print(
            f"verified: {len(checks)} outputs match transformers (max abs {summary['max_abs']:.3g})", markup=False
        )


class _Warnings(logging.Handler):
    """:mod:`opreg.llm`'s warnings (a checkpoint without a tokenizer) as ``warning:`` lines on stderr."""

    def __init__(self, err: Any) -> None:
        super().__init__(logging.WARNING)
        self.err = err

    def emit(self, record: logging.LogRecord) -> None:
        self.err.print(styled(f"warning: {record.getMessage()}", "yellow"), soft_wrap=True)


@contextlib.contextmanager
def _warnings_shown(err: Any) -> Iterator[None]:
    """Show :mod:`opreg.llm`'s warnings on ``err`` while the block runs (with ``--debug``, the
    log shows them too), and leave its logger as it was after."""
    logger = logging.getLogger("opreg.llm")
    handler, level = _Warnings(err), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    propagate, logger.propagate = logger.propagate, logging.getLogger().getEffectiveLevel() <= logging.WARNING
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


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
