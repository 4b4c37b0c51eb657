"""What the commands share: exit codes, the errors a command raises, the registry the ``-p`` /
``--prefer`` / ``--strict`` options select, warnings about packs, and rich output (tables, styled
lines, JSON). rich and the registry are imported when first used."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from opreg.errors import OpregError, PluginError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
PIPE_WIDTH = 160
"""Columns for tables printed to a pipe (which has no terminal width): wide enough not to fold them."""
STATUS_STYLES = {
    "loaded": "green", "failed": "red", "incompatible": "red", "disabled": "dim",
    "chosen": "green", "usable": "", "unusable": "dim", "dropped": "dim", "conditional": "yellow", "outranked": "",
    "passed": "green", "skipped": "yellow",
}  # fmt: skip


class UsageError(OpregError):
    """A command's arguments do not make sense (exit 2)."""


class RequestedPackFailed(PluginError):
    """A pack asked for with ``-p NAME`` did not load (exit 1: the command found a problem)."""


# -- the registry ------------------------------------------------------------------------------


def registry(args: argparse.Namespace, *, declared: bool = False) -> Any:
    """The registry of the packs ``args`` select; ``declared``: what they declare is enough (to list
    and explain, not to export), so it may come from :mod:`opreg.packs.packcache` without loading them."""
    if declared and not args.no_cache:
        return _declared(args)
    return packs(args).registry


def _declared(args: argparse.Namespace) -> Any:
    from opreg.packs import plugins

    wanted, unwanted = _pack_args(args)
    selection = wanted if plugins.autoload_disabled() else None
    prefer = preferences(args.prefer)
    return plugins.declared_registry(selection, unwanted, strict=args.strict, prefer=prefer, require=wanted + unwanted)


def _pack_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    wanted = [a for a in args.plugin_args if not a.startswith("no:")]
    unwanted = [a[3:] for a in args.plugin_args if a.startswith("no:")]
    if any(not name for name in wanted + unwanted):
        raise UsageError("-p needs a pack name: -p NAME or -p no:NAME")
    return wanted, unwanted


def packs(args: argparse.Namespace) -> Any:
    """The packs ``args`` select, loaded: their registry and the host that calls their hooks
    (:class:`opreg.packs.plugins.Loaded`); ``--no-cache``: without :mod:`opreg.packs.packcache`."""
    import contextlib

    from opreg.packs import packcache, plugins

    wanted, unwanted = _pack_args(args)
    selection = wanted if plugins.autoload_disabled() else None
    plugins.require_installed(wanted)
    plugins.require_installed(unwanted)
    prefer = preferences(args.prefer)
    with packcache.off() if getattr(args, "no_cache", False) else contextlib.nullcontext():
        return plugins.build(selection, unwanted, strict=args.strict, prefer=prefer)


def preferences(items: Sequence[str]) -> dict[str, str]:
    """``--prefer OP=PACK`` items as ``{op: pack}``."""
    from opreg.registry.opname import OpName

    prefer: dict[str, str] = {}
    for item in items:
        op, sep, pack = item.partition("=")
        if not sep or not op.strip() or not pack.strip():
            raise UsageError(f"--prefer {item!r}: write OP=PACK, e.g. --prefer aten::gelu=ort_contrib")
        name = str(OpName.of(op.strip()))
        if name in prefer and prefer[name] != pack.strip():
            raise UsageError(f"--prefer names two packs for {name}: {prefer[name]} and {pack.strip()}")
        prefer[name] = pack.strip()
    return prefer


def conflict_rows(registry: Any) -> list[tuple[str, str]]:
    """``(op, "pack:impl, pack:impl (winner ...)")`` for every tie between packs."""
    from opreg.packs import plugins

    rows = []
    for group in plugins.pack_conflicts(registry.impls(), registry.preferences()):
        rows.append((str(group[0].op), ", ".join(i.label for i in group) + f"; {group[0].label} is used"))
    return rows


def report_failed_packs(registry: Any, args: argparse.Namespace) -> None:
    """A pack asked for with ``-p`` that did not load is an error; any other that did not
    load is a warning (its ops are missing from what the command reports or writes)."""
    from opreg.packs.packset import FAILED, INCOMPATIBLE

    wanted = {a for a in args.plugin_args if not a.startswith("no:")}
    failed = [r for r in registry.packs if r.status in (FAILED, INCOMPATIBLE)]
    for report in failed:
        if report.name in wanted:
            raise RequestedPackFailed(
                f"pack {report.name!r}, asked for with -p {report.name}, did not load: {one_line_text(report.reason)}"
                f"; fix or reinstall it ({report.distribution}), or leave out -p {report.name}"
            )
    err = console(stderr=True)
    for report in failed:
        err.print(styled(
            f"warning: pack {report.name!r} did not load and is left out: {one_line_text(report.reason)} "
            "(see opreg plugins)", "yellow",
        ), soft_wrap=True)  # fmt: skip


def warn_conflicts(registry: Any) -> None:
    rows = conflict_rows(registry)
    if rows:
        err = console(stderr=True)
        for op, detail in rows:
            err.print(styled(f"warning: packs tie on {op}: {detail} (settle it with --prefer {op}=PACK)", "yellow"))


def warn_hook_failures(host: Any) -> None:
    """Each pack hook of ``host`` that raised or broke its contract during the command, as the loader
    reports a failed pack (which pack, which hook, the error); ``--strict`` made it an error instead."""
    err = console(stderr=True)
    for error in host.packs.failures:
        err.print(styled(f"warning: {error}; left out", "yellow"))


# -- models -------------------------------------------------------------------------------------


def load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model ``args.model`` names (:mod:`opreg.cli._modelspec`), and its ``--dynamic`` shapes."""
    from opreg.cli import _modelspec

    loaded = _modelspec.load(args.model)
    if not args.debug:  # torch is imported now (importing it resets its loggers' levels)
        # torch logs the tracebacks of errors it then raises, which opreg reports in one line
        logging.getLogger("torch").setLevel(logging.CRITICAL)
    return loaded, _modelspec.dynamic_shapes(loaded, args.dynamic)


def export_settings(args: argparse.Namespace, packs: Any, target: Any, dynamic: Any, **more: Any) -> Any:
    """The :class:`opreg.ExportSettings` of ``check`` and ``export``: the registry and host of the
    packs (:func:`packs`) and the target the pack and target options chose, the model's ``--dynamic``
    shapes, ``--strict``, ``--no-patches`` and ``--no-patch``; ``more``: the command's own options."""
    from opreg.settings import ExportSettings

    return ExportSettings(
        target=target, dynamic_shapes=dynamic, registry=packs.registry, host=packs.host, strict=args.strict,
        patches=args.patches, exclude_patches=tuple(args.exclude_patches), **more,
    )  # fmt: skip


def missing_table(out: Any, missing: Sequence[Any], target: Any) -> None:
    """The ops of a model no impl covers at ``target``, printed to the console ``out``."""
    table_ = table(f"ops with no impl at target {target}", ["op", "nodes", "where", "why", "covered elsewhere by"])
    for m in missing:
        table_.add_row(m.op, str(m.count), "\n".join(m.locations), m.reason, "\n".join(m.elsewhere))
    out.print(table_)


# -- output -------------------------------------------------------------------------------------


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # A pipe gets no terminal width; do not fold tables to 80 columns there.
    return Console(stderr=stderr, soft_wrap=False, width=None if stream.isatty() else PIPE_WIDTH)


def table(title: str, columns: Sequence[str], whole: Sequence[str] = ()) -> Any:
    """A table whose cells fold to fit, except those of the ``whole`` columns (paths to copy)."""
    from rich.table import Table

    table_ = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table_.add_column(column, overflow="fold", no_wrap=column in whole)
    return table_


def styled(text: str, style: str | None = None) -> Any:
    """A table cell or line as plain text (never read as markup: errors quote [brackets])."""
    from rich.text import Text

    return Text(text, style=style if style is not None else STATUS_STYLES.get(text, ""))


def short_source(source: str) -> str:
    """``file:line`` relative to the ``sys.path`` entry it lies under (``opreg_core_ops/ops/activation.py:25``)."""
    from opreg.registry._inspect import short_source as relative

    return relative(source)


def requires(impl: Any) -> str:
    """What an impl needs of a target, as ``ops`` and ``explain`` show it: its opset requirement, and
    the profiles it is for (``ai.onnx>=20; for profile onnxruntime``)."""
    profiles = f"; for profile {', '.join(impl.profiles)}" if impl.profiles else ""
    return f"{impl.requirement}{profiles}"


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def one_line(error: BaseException) -> str:
    """An error's message on one line (torch's multi-line reports folded)."""
    return one_line_text(str(error))


def one_line_text(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def print_fixed_dims(out: Any, fixed: Sequence[Any]) -> None:
    """The dims asked to be dynamic that an export fixed, each with its guard and line (dicts of
    ``opreg.FixedDim``'s fields: ``opreg export``'s and ``opreg inspect``'s)."""
    if not fixed:
        return
    rows = table("dims asked to be dynamic, fixed by torch.export", ["input", "dim", "size", "guard", "where"])
    for item in fixed:
        entry = item if isinstance(item, dict) else {"guard": str(item)}
        rows.add_row(*(str(entry.get(key, "")) for key in ("input", "dim", "size", "guard", "source")))
    out.print(rows)
