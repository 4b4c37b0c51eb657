"""The ``opreg`` command line: one module per command, each with ``add_parser(subparsers,
parents)`` and ``run(args) -> int``; :data:`COMMANDS` lists them in the order ``opreg --help``
shows them. A new command is one new module and one entry there.

Exit codes: 0 success; 1 the command ran and found problems (ops without an
impl, a model that does not match, an unusable file, a pack that failed or a
tie under ``--strict``); 2 bad input or an opreg error (one line on stderr);
130 interrupted (Ctrl-C or SIGTERM; ``export`` says what its output file holds:
unchanged, or the new model when the save had already switched to it, which a
save does atomically). ``--debug`` shows tracebacks and debug logs.

A command's module imports what is heavy (torch, the registry, rich) inside ``run``, so
``opreg --help`` and the commands answered from the pack cache start fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import warnings
from collections.abc import Sequence

from opreg import _heap
from opreg.cli import check, explain, export, inspect, llm, new_pack, ops, pack_check, plugins
from opreg.cli._common import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    RequestedPackFailed,
    one_line,
    one_line_text,
)
from opreg.cli._options import Parents
from opreg.errors import OpregError, PackWarning, PluginError, PluginNotFoundError, ShapeGuardWarning, WeightsWarning

__all__ = ["COMMANDS", "EXIT_ERROR", "EXIT_FINDINGS", "EXIT_INTERRUPTED", "EXIT_OK", "build_parser", "main", "script"]

COMMANDS = (plugins, ops, explain, check, export, llm, inspect, new_pack, pack_check)
"""The commands' modules, in the order ``opreg --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opreg", description="Inspect opreg's op packs, registry and resolution.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parents = Parents.build()
    for command in COMMANDS:
        command.add_parser(subparsers, parents)
    return parser


def _version() -> str:
    import importlib.metadata

    return importlib.metadata.version("opreg")


def _show(caught: Sequence[warnings.WarningMessage]) -> None:
    """The warnings a command met: a pack's fault (:class:`opreg.PackWarning`: a rewrite left out, a
    capture patch left out or put back) and a shape guard the model does not check
    (:class:`opreg.ShapeGuardWarning`), and a checkpoint's weight tied again or new to the task
    (:class:`opreg.WeightsWarning`) as one ``warning:`` line on stderr; the others as Python
    shows them."""
    for record in caught:
        if issubclass(record.category, (PackWarning, ShapeGuardWarning, WeightsWarning)):
            sys.stderr.write(f"warning: {one_line_text(str(record.message))}\n")
        else:
            warnings.showwarning(record.message, record.category, record.filename, record.lineno)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process's own command line, ``sys.argv[1:]``) and
    return its exit code. The collector stays off what the command imports and builds while it runs
    (:func:`opreg._heap.quiet`) and is as it was after; the ``opreg`` script (:func:`script`) also
    leaves the process's objects frozen for its exit."""
    return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )

    previous = signal.signal(signal.SIGTERM, _terminate)  # SIGTERM ends a command as Ctrl-C does, cleanly
    caught: list[warnings.WarningMessage] = []
    try:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", PackWarning)  # each pack fault of the command, as a line of its own
                warnings.simplefilter("always", ShapeGuardWarning)
                with _heap.quiet():  # the collector off what the command imports and builds (opreg/_heap.py)
                    return args.run(args)
        finally:
            _show(caught)  # outside the recording: there, showing a warning would record it again, endlessly
    except OpregError as e:
        if args.debug:
            raise
        sys.stderr.write(f"opreg: error: {one_line(e)}\n")
        strict = getattr(args, "strict", False) and not isinstance(e, PluginNotFoundError)
        found = isinstance(e, RequestedPackFailed) or (isinstance(e, PluginError) and strict)
        return EXIT_FINDINGS if found else EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("opreg: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as e:
        if args.debug:
            raise
        sys.stderr.write(
            f"opreg: internal error: {type(e).__name__}: {one_line(e)} (run with --debug for the traceback)\n"
        )
        return EXIT_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)


ONE_COMMAND = "OPREG_LEAN_IMPORTS"
"""Set to ``1`` by :func:`script` unless set already: the process runs one command and exits, so
packs may leave out imports their libraries make only for other uses (opreg-transformers: torchao,
scipy and torchvision when the checkpoint needs none of them; docs/exporting-checkpoints.md).
``0`` turns it off; :func:`main`, called in a process that lives on, leaves it alone."""


def script() -> int:
    """The ``opreg`` console script (and ``python -m opreg``, ``python -m opreg.cli``): :data:`ONE_COMMAND`
    set, :func:`main`, then the process's objects left out of the interpreter's last collections
    (:func:`opreg._heap.exiting`)."""
    os.environ.setdefault(ONE_COMMAND, "1")
    code = main()
    _heap.exiting()
    return code
