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
import contextlib
import logging
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence

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
from opreg.errors import OpregError, PackWarning, PluginError, PluginNotFoundError, ShapeGuardWarning

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
    (:class:`opreg.ShapeGuardWarning`) as one ``warning:`` line on stderr; the others as Python
    shows them."""
    for record in caught:
        if issubclass(record.category, (PackWarning, ShapeGuardWarning)):
            sys.stderr.write(f"warning: {one_line_text(str(record.message))}\n")
        else:
            warnings.showwarning(record.message, record.category, record.filename, record.lineno)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process's own command line, ``sys.argv[1:]``) and
    return its exit code. Without ``argv``, as the ``opreg`` script and ``python -m opreg`` call
    it, the command is the process's whole life, and its heap is kept as a short-lived process's
    (:func:`_one_shot_heap`)."""
    if argv is not None:
        return _run(argv)
    with _one_shot_heap():
        return _run(argv)


@contextlib.contextmanager
def _one_shot_heap() -> Iterator[None]:
    """Python's cyclic collector for a process that exits after the block (measured on ``opreg llm
    export`` of a small Whisper, bench/whisper.py: 8.2 s of CPU before, 5.5 s after):

    - a full collection waits for :data:`opreg._heap.FULL_EVERY` collections of the middle
      generation (Python's default is 10), as it does while an export runs: importing torch,
      transformers and the packs and loading a model walked the growing heap in full 4 times;
    - after the block, every object alive is frozen (``gc.freeze``): at exit the interpreter
      collects the modules' cycles, which took 1.3-1.9 s of CPU with torch, transformers and sympy
      imported; frozen, they are left to the operating system. Exit handlers run as before.

    A process that turned the collector off or froze objects of its own is left as it is."""
    import gc

    from opreg._heap import FULL_EVERY

    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, max(full, FULL_EVERY))
    try:
        yield
    finally:
        gc.freeze()


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


def script() -> int:
    """The ``opreg`` console script (and ``python -m opreg``): :func:`main`, then the process's
    objects left out of the interpreter's last collections (:func:`opreg._heap.exiting`)."""
    code = main()
    _heap.exiting()
    return code
