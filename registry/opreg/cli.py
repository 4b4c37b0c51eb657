"""The ``opreg`` command line.

Exit codes: 0 success; 1 the command ran and found problems (ops without an
impl, a model that does not match, an unusable file, a pack that failed or a
tie under ``--strict``); 2 bad input or an opreg error (one line on stderr);
130 interrupted (Ctrl-C or SIGTERM; ``export`` says what its output file holds:
unchanged, or the new model when the save had already switched to it, which a
save does atomically). ``--debug`` shows tracebacks and debug logs.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opreg.errors import OpregError, PluginError, PluginNotFoundError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
LOCATE_ROWS = 12
"""How many nodes out of tolerance ``export --locate``'s table shows (suspects first)."""
PIPE_WIDTH = 160
"""Columns for tables printed to a pipe (which has no terminal width): wide enough not to fold them."""
STATUS_STYLES = {
    "loaded": "green", "failed": "red", "incompatible": "red", "disabled": "dim",
    "chosen": "green", "usable": "", "unusable": "dim", "dropped": "dim", "conditional": "yellow", "outranked": "",
    "passed": "green", "skipped": "yellow",
}  # fmt: skip


class _UsageError(OpregError):
    pass


# -- the parser -------------------------------------------------------------------------


def _output_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    parent.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return parent


def _pack_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "-p", dest="plugin_args", action="append", default=[], metavar="NAME",
        help="load pack NAME (needed when OPREG_DISABLE_PLUGIN_AUTOLOAD=1); -p no:NAME leaves it out",
    )  # fmt: skip
    parent.add_argument(
        "--prefer", action="append", default=[], metavar="OP=PACK",
        help="when packs tie on OP, use PACK's impl (by default the core pack wins a tie)",
    )  # fmt: skip
    parent.add_argument(
        "--strict", action="store_true",
        help="fail if a selected pack fails, packs tie, or (export) a pack's rewrite raises or breaks the graph",
    )  # fmt: skip
    return parent


def _options(*flags: str, **settings: Any) -> argparse.ArgumentParser:
    """A parent parser holding one option."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(*flags, **settings)
    return parent


def _cache_options() -> argparse.ArgumentParser:
    return _options(
        "--no-cache", action="store_true",
        help="load the packs instead of reading what they declare from opreg's cache (see OPREG_NO_CACHE)",
    )  # fmt: skip


def _target_options() -> argparse.ArgumentParser:
    return _options(
        "--target", "-t", default="onnx",
        help="a profile (onnx, onnxruntime, ...), an ai.onnx version (18), or domain=version items "
        "(onnx,com.microsoft=1); default: onnx",
    )  # fmt: skip


def _patch_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--no-patches", dest="patches", action="store_false",
        help="capture the model's own code: install none of the packs' capture patches",
    )  # fmt: skip
    parent.add_argument(
        "--no-patch", dest="exclude_patches", action="append", default=[], metavar="NAME",
        help="leave out capture patch NAME (pack:name, as `opreg explain` lists them; repeatable)",
    )  # fmt: skip
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opreg", description="Inspect opreg's op packs, registry and resolution.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    output, packs, target = _output_options(), _pack_options(), _target_options()
    patches, cache = _patch_options(), _cache_options()
    model_help = (
        "path/to/file.py:factory (opreg runs that file, with its folder first on sys.path, as Python runs a "
        "script) or package.module:factory (imported); factory() returns (module, args[, kwargs])"
    )
    dynamic_help = "dynamic dims of a forward input: NAME:DIM=LABEL[,DIM=LABEL] (repeatable), e.g. x:0=batch"

    p = sub.add_parser(
        "plugins", parents=[output, packs, cache], help="installed packs: loaded, failed or disabled, and why"
    )
    p.set_defaults(run=_cmd_plugins)

    p = sub.add_parser("ops", parents=[output, packs, target, cache], help="registered ops and their impls")
    p.add_argument("pattern", nargs="?", help="only ops matching this glob or substring (e.g. 'aten::gelu*')")
    p.add_argument("--pack", action="append", default=[], help="only impls from this pack (repeatable)")
    p.set_defaults(run=_cmd_ops)

    p = sub.add_parser(
        "explain", parents=[output, packs, target, cache],
        help="how one op resolves for a target, and why; or what a capture patch patches and whether it applies",
    )  # fmt: skip
    p.add_argument(
        "op", help="torch op, e.g. aten::gelu or aten::add.Tensor; or a capture patch (pack:name, or 'patches' for all)"
    )
    p.set_defaults(run=_cmd_explain)

    p = sub.add_parser(
        "check", parents=[output, packs, target, patches],
        help="which ops of a model no pack covers at a target (exit 1 if any)",
    )  # fmt: skip
    p.add_argument("model", metavar="MODEL", help=model_help)
    p.add_argument("--dynamic", action="append", default=[], metavar="SPEC", help=dynamic_help)
    p.set_defaults(run=_cmd_check)

    p = sub.add_parser("export", parents=[output, packs, target, patches], help="export a model to an ONNX file")
    p.add_argument("model", metavar="MODEL", help=model_help)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the .onnx file to write")
    p.add_argument("--dynamic", action="append", default=[], metavar="SPEC", help=dynamic_help)
    p.add_argument("--verify", action="store_true", help="run the model and compare with eager PyTorch")
    p.add_argument(
        "--locate", action="store_true",
        help="with --verify, on a mismatch compare every intermediate value and name the impl or rule at fault",
    )  # fmt: skip
    p.add_argument("--rtol", type=float, default=1e-4, help="--verify's relative tolerance (default 1e-4)")
    p.add_argument("--atol", type=float, default=1e-4, help="--verify's absolute tolerance (default 1e-4)")
    p.add_argument("--keep-functions", action="store_true", help="keep script impls as model-local functions")
    p.add_argument(
        "--keep-weights", action="store_true",
        help="keep every weight as the state_dict has it (no batch norm folded, no weight stored transposed)",
    )  # fmt: skip
    p.add_argument(
        "--external-data", action="store_true",
        help="write weights to a side file FILE.<token>.data the model names (weights of up to 256 bytes stay inline)",
    )  # fmt: skip
    p.add_argument(
        "--state", choices=("error", "io", "drop"), default="error",
        help="a model that updates buffers or inputs in forward: refuse it (error, default), export each as an "
        "input and an output (io), or leave the updates out (drop)",
    )  # fmt: skip
    p.set_defaults(run=_cmd_export)

    p = sub.add_parser("llm", help="language and speech models: the folders ONNX Runtime GenAI runs")
    llm = p.add_subparsers(dest="llm_command", required=True, metavar="COMMAND")
    p = llm.add_parser(
        "export", parents=[output, packs, target],
        help="export a transformers checkpoint folder (a causal LM, Whisper) to a folder ONNX Runtime GenAI loads",
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
        help="Whisper: linear weights as ONNX Runtime's MatMulNBits (int8, int4; with -t onnxruntime)",
    )  # fmt: skip
    p.set_defaults(run=_cmd_llm_export)

    p = sub.add_parser("inspect", parents=[output], help="what an ONNX file holds, and whether it is usable")
    p.add_argument("file", metavar="FILE", help="an .onnx file")
    p.set_defaults(run=_cmd_inspect)

    p = sub.add_parser("new-pack", parents=[output], help="write a new, installable op pack to start from")
    p.add_argument("name", metavar="NAME", help="distribution name, e.g. opreg-mypack (import name opreg_mypack)")
    p.add_argument("--domain", help="custom ONNX domain of the pack's ops (default: NAME.ops without 'opreg-')")
    p.add_argument("-o", "--output", metavar="DIR", help="a new or empty directory (default: ./NAME)")
    p.set_defaults(run=_cmd_new_pack)

    p = sub.add_parser(
        "pack-check", parents=[output], help="run the conformance kit on an installed pack (exit 1 if a check fails)"
    )
    p.add_argument("pack", metavar="DIST_OR_MODULE", help="pack, distribution or module name, e.g. opreg-ort-contrib")
    p.set_defaults(run=_cmd_pack_check)
    return parser


def _version() -> str:
    from opreg import __version__

    return __version__


# -- shared pieces -------------------------------------------------------------------------


def _registry(args: argparse.Namespace, *, declared: bool = False) -> Any:
    """The registry of the packs ``args`` select; ``declared``: what they declare is enough (to list
    and explain, not to export), so it may come from :mod:`opreg.packcache` without loading them."""
    from opreg import plugins

    wanted = [a for a in args.plugin_args if not a.startswith("no:")]
    unwanted = [a[3:] for a in args.plugin_args if a.startswith("no:")]
    if any(not name for name in wanted + unwanted):
        raise _UsageError("-p needs a pack name: -p NAME or -p no:NAME")
    selection = wanted if plugins.autoload_disabled() else None
    if declared and not args.no_cache:
        from opreg import packcache

        prefer = _preferences(args.prefer)
        return packcache.registry(selection, unwanted, strict=args.strict, prefer=prefer, require=wanted + unwanted)
    plugins.require_installed(wanted)
    plugins.require_installed(unwanted)
    prefer = _preferences(args.prefer)
    return plugins.build_registry(selection, unwanted, strict=args.strict, prefer=prefer)


def _preferences(items: Sequence[str]) -> dict[str, str]:
    from opreg.opname import OpName

    prefer: dict[str, str] = {}
    for item in items:
        op, sep, pack = item.partition("=")
        if not sep or not op.strip() or not pack.strip():
            raise _UsageError(f"--prefer {item!r}: write OP=PACK, e.g. --prefer aten::gelu=ort_contrib")
        name = str(OpName.of(op.strip()))
        if name in prefer and prefer[name] != pack.strip():
            raise _UsageError(f"--prefer names two packs for {name}: {prefer[name]} and {pack.strip()}")
        prefer[name] = pack.strip()
    return prefer


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # A pipe gets no terminal width; do not fold tables to 80 columns there.
    return Console(stderr=stderr, soft_wrap=False, width=None if stream.isatty() else PIPE_WIDTH)


def _table(title: str, columns: Sequence[str], whole: Sequence[str] = ()) -> Any:
    """A table whose cells fold to fit, except those of the ``whole`` columns (paths to copy)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column in whole)
    return table


def _styled(text: str, style: str | None = None) -> Any:
    """A table cell or line as plain text (never read as markup: errors quote [brackets])."""
    from rich.text import Text

    return Text(text, style=style if style is not None else STATUS_STYLES.get(text, ""))


def _short_source(source: str) -> str:
    """``file:line`` relative to the ``sys.path`` entry it lies under (``opreg_core_ops/ops/activation.py:25``)."""
    import os

    roots = sorted((os.path.join(os.path.abspath(p), "") for p in sys.path if p), key=len, reverse=True)
    for root in roots:
        if source.startswith(root):
            return source[len(root) :]
    return source


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def _conflict_rows(registry: Any) -> list[tuple[str, str]]:
    """``(op, "pack:impl, pack:impl (winner ...)")`` for every tie between packs."""
    from opreg import plugins

    rows = []
    for group in plugins.pack_conflicts(registry.impls(), registry.preferences()):
        rows.append((str(group[0].op), ", ".join(i.label for i in group) + f"; {group[0].label} is used"))
    return rows


class _RequestedPackFailed(PluginError):
    """A pack asked for with ``-p NAME`` did not load (exit 1: the command found a problem)."""


def _report_failed_packs(registry: Any, args: argparse.Namespace) -> None:
    """A pack asked for with ``-p`` that did not load is an error; any other that did not
    load is a warning (its ops are missing from what the command reports or writes)."""
    from opreg.packset import FAILED, INCOMPATIBLE

    wanted = {a for a in args.plugin_args if not a.startswith("no:")}
    failed = [r for r in registry.packs if r.status in (FAILED, INCOMPATIBLE)]
    for report in failed:
        if report.name in wanted:
            raise _RequestedPackFailed(
                f"pack {report.name!r}, asked for with -p {report.name}, did not load: {_one_line_text(report.reason)}"
                f"; fix or reinstall it ({report.distribution}), or leave out -p {report.name}"
            )
    err = _console(stderr=True)
    for report in failed:
        err.print(_styled(
            f"warning: pack {report.name!r} did not load and is left out: {_one_line_text(report.reason)} "
            "(see opreg plugins)", "yellow",
        ), soft_wrap=True)  # fmt: skip


def _warn_conflicts(registry: Any) -> None:
    rows = _conflict_rows(registry)
    if rows:
        err = _console(stderr=True)
        for op, detail in rows:
            err.print(_styled(f"warning: packs tie on {op}: {detail} (settle it with --prefer {op}=PACK)", "yellow"))


def _warn_hook_failures(registry: Any) -> None:
    """Each pack hook that raised or broke its contract during the command, as the loader reports
    a failed pack (which pack, which hook, the error); ``--strict`` made it an error instead."""
    err = _console(stderr=True)
    for error in registry.packs.failures:
        err.print(_styled(f"warning: {error}; left out", "yellow"))


# -- commands ---------------------------------------------------------------------------------


def _cmd_plugins(args: argparse.Namespace) -> int:
    registry = _registry(args, declared=True)
    conflicts = _conflict_rows(registry)
    if args.json:
        rows = []
        for report in registry.packs:
            row = dataclasses.asdict(report)
            row["conflicts"] = [op for op, detail in conflicts if f"{report.name}:" in detail]
            rows.append(row)
        _print_json(rows)
        return EXIT_OK
    table = _table(
        "opreg packs", ["pack", "distribution", "version", "status", "impls", "domains", "profiles", "reason"]
    )
    for r in registry.packs:
        reason = r.reason + (f" (hook {r.hook})" if r.hook and r.status != "loaded" else "")
        table.add_row(r.name, r.distribution, r.version, _styled(r.status), str(r.impls), ", ".join(r.domains),
                      ", ".join(r.profiles), reason)  # fmt: skip
    console = _console()
    console.print(table)
    for r in registry.packs:
        for x in r.rejected:
            console.print(_styled(f"rejected {r.name}: {x.function} for {x.op}: {x.error}", "yellow"))
    if conflicts:
        console.print(
            _styled(f"{len(conflicts)} conflict(s): packs tie on the same op (use --prefer OP=PACK)", "yellow")
        )
        for op, detail in conflicts:
            console.print(_styled(f"  {op}: {detail}", "yellow"))
    return EXIT_OK


def _matches(op: str, pattern: str | None) -> bool:
    if not pattern:
        return True
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(op, pattern) or fnmatch.fnmatchcase(op, f"{pattern}.default")
    return pattern in op


def _cmd_ops(args: argparse.Namespace) -> int:
    from opreg.targets import domain_label

    registry = _registry(args, declared=True)
    target = registry.target(args.target)
    known_packs = {r.name for r in registry.packs} | {i.pack for i in registry.impls()}
    unknown = sorted(set(args.pack) - known_packs)
    if unknown:
        raise _UsageError(f"no pack named {', '.join(unknown)}; packs: {', '.join(sorted(known_packs))}")
    rows = []
    for op in registry.ops():
        if not _matches(str(op), args.pattern):
            continue
        chosen = registry.resolve(op, target)
        usable = set(registry.candidates(op, target))
        for impl in sorted(registry.impls(op), key=lambda i: i.sort_key()):
            if args.pack and impl.pack not in args.pack:
                continue
            status = "chosen" if impl is chosen else ("usable" if impl in usable else "unusable")
            rows.append((op, impl, status))
    if args.json:
        _print_json({
            "target": target.as_dict(),
            "impls": [
                {"op": str(op), "pack": i.pack, "function": i.name, "kind": i.kind, "onnx": str(i.requirement.onnx),
                 "domains": {domain_label(d): str(r) for d, r in i.requirement.domains},
                 "priority": i.priority, "predicate": i.predicate is not None, "status": status, "source": i.source}
                for op, i, status in rows
            ],
        })  # fmt: skip
        return EXIT_OK
    table = _table(f"impls at target {target}", ["op", "pack", "function", "kind", "requires", "priority", "status"])
    for op, impl, status in rows:
        table.add_row(str(op), impl.pack, impl.name, impl.kind, str(impl.requirement), str(impl.priority),
                      _styled(status))  # fmt: skip
    console = _console()
    console.print(table)
    console.print(f"{len({op for op, _, _ in rows})} ops, {len(rows)} impls", markup=False)
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    from opreg.opname import OpName

    if "::" not in args.op:  # a capture patch: whether it applies is the packs' hooks' to say
        return _explain_patches(args, _registry(args))
    registry = _registry(args, declared=True)
    op = OpName.of(args.op)
    explanation = registry.explain(op, args.target)
    if args.json:
        _print_json({
            "op": str(op),
            "target": explanation.target.as_dict(),
            "chosen": explanation.chosen.label if explanation.chosen else None,
            "conflicts": [i.label for i in explanation.conflicts],
            "candidates": [
                {"pack": c.impl.pack, "function": c.impl.name, "requires": str(c.impl.requirement),
                 "priority": c.impl.priority, "status": c.status, "reason": c.reason, "source": c.impl.source}
                for c in explanation.candidates
            ],
        })  # fmt: skip
        return EXIT_OK
    console = _console()
    if not explanation.candidates:
        similar = [str(o) for o in registry.ops() if o.name == op.name]
        hint = f" Registered overloads: {', '.join(similar)}." if similar else ""
        console.print(f"No impl is registered for {op}.{hint}", markup=False)
        return EXIT_OK
    table = _table(
        f"{op} at target {explanation.target}",
        ["status", "pack", "function", "requires", "priority", "reason", "defined at"],
        whole=["defined at"],
    )
    for c in explanation.candidates:
        table.add_row(_styled(c.status), c.impl.pack, c.impl.name, str(c.impl.requirement), str(c.impl.priority),
                      c.reason, _short_source(c.impl.source))  # fmt: skip
    console.print(table)
    if explanation.conflicts:
        names = ", ".join(i.label for i in explanation.conflicts)
        console.print(_styled(
            f"conflict: {explanation.chosen.label} ties with {names}; choose with --prefer {op}=PACK", "yellow"
        ))  # fmt: skip
    if explanation.chosen is None:
        console.print(_styled(f"No impl of {op} can serve target {explanation.target}.", "red"))
    return EXIT_OK


def _explain_patches(args: argparse.Namespace, registry: Any) -> int:
    """``opreg explain NAME`` for a capture patch (or ``patches``: every one the packs offer)."""
    from opreg import patching

    offer = patching.offered(registry)
    found = list(offer.patches) if args.op == "patches" else offer.find(args.op)
    if not found and args.op != "patches":
        known = ", ".join(offer.labels()) or "none"
        raise _UsageError(
            f"{args.op!r} is neither a torch op (namespace::name) nor a capture patch; the installed packs offer "
            f"these patches: {known}"
        )
    rows = []
    for pack, patch in found:
        version, fits = patching.installed_version(patch)
        if version is None:
            state = f"{patching.requirement(patch).name} is not installed: never applied"
        elif fits:
            state = f"{version} is installed: applied to models with modules from {', '.join(patch.scope)}"
        else:
            state = f"{version} is installed, outside {patch.versions}: not applied"
        rows.append({
            "patch": f"{pack}:{patch.name}", "pack": pack, "patches": patch.target, "versions": patch.versions,
            "installed": version, "applies": bool(fits), "used_by": list(patch.scope),
            "kind": "context" if patch.context is not None else "replacement", "reason": patch.reason, "state": state,
        })  # fmt: skip
    if args.json:
        _print_json({"capture_patches": rows, "problems": [str(p) for p in offer.problems]})
        return EXIT_OK
    console = _console()
    table = _table("capture patches", ["patch", "patches", "written for", "installed", "why"])
    for row in rows:
        table.add_row(row["patch"], row["patches"], row["versions"], row["state"], row["reason"])
    console.print(table)
    for problem in offer.problems:
        console.print(_styled(f"warning: {problem}", "yellow"))
    console.print("turn one off with --no-patch NAME (exclude_patches= in Python), all with --no-patches", markup=False)
    return EXIT_OK


def _load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    from opreg import _modelspec

    loaded = _modelspec.load(args.model)
    if not args.debug:  # torch is imported now (importing it resets its loggers' levels)
        # torch logs the tracebacks of errors it then raises, which opreg reports in one line
        logging.getLogger("torch").setLevel(logging.CRITICAL)
    return loaded, _modelspec.dynamic_shapes(loaded, args.dynamic)


def _missing_table(console: Any, missing: Sequence[Any], target: Any) -> None:
    table = _table(f"ops with no impl at target {target}", ["op", "nodes", "where", "why", "covered elsewhere by"])
    for m in missing:
        table.add_row(m.op, str(m.count), "\n".join(m.locations), m.reason, "\n".join(m.elsewhere))
    console.print(table)


def _cmd_check(args: argparse.Namespace) -> int:
    from opreg import exporter

    registry = _registry(args)
    target = registry.target(args.target)
    _report_failed_packs(registry, args)
    loaded, dynamic = _load_model(args)
    _warn_conflicts(registry)
    missing = exporter.plan_export(
        loaded.module, loaded.args, loaded.kwargs, target=target, dynamic_shapes=dynamic, registry=registry,
        patches=args.patches, exclude_patches=args.exclude_patches,
    )  # fmt: skip
    if args.json:
        rows = [dataclasses.asdict(m) for m in missing]
        _print_json({"model": args.model, "target": target.as_dict(), "missing": rows})
        return EXIT_FINDINGS if missing else EXIT_OK
    console = _console()
    if not missing:
        console.print(_styled(f"every op of {args.model} has an impl at target {target}", "green"))
        return EXIT_OK
    _missing_table(console, missing, target)
    console.print(
        _styled(f"{len(missing)} op(s) missing: install a pack that covers them or choose another target", "red")
    )
    return EXIT_FINDINGS


def _cmd_export(args: argparse.Namespace) -> int:
    import time

    from opreg import exporter
    from opreg.errors import UnsupportedOpsError, VerificationError
    from opreg.exporter._save import INLINE_LIMIT_BYTES, check_output_path, referenced_data
    from opreg.targets import domain_label

    err = _console(stderr=True)
    registry = _registry(args)
    target = registry.target(args.target)
    check_output_path(args.output, external_data=args.external_data)  # before the export, not after it
    _report_failed_packs(registry, args)
    _warn_conflicts(registry)
    started = time.perf_counter()
    with err.status("loading the model") as status:
        last = ["load", time.perf_counter()]

        def stage(name: str) -> None:
            err.print(_styled(f"done {last[0]} ({time.perf_counter() - last[1]:.2f} s)", "green"))
            last[0], last[1] = name, time.perf_counter()
            status.update(f"{name}...")

        loaded, dynamic = _load_model(args)
        try:
            program = exporter.export(
                loaded.module, loaded.args, loaded.kwargs, target=target, dynamic_shapes=dynamic,
                registry=registry, inline=not args.keep_functions, fold_weights=not args.keep_weights,
                strict=args.strict, state=args.state, patches=args.patches, exclude_patches=args.exclude_patches,
                progress=stage,
            )  # fmt: skip
            stage("save")
            path = program.save(args.output, external_data=True if args.external_data else None)
            if args.verify:
                stage("verify")
                result = program.verify(
                    *loaded.args, rtol=args.rtol, atol=args.atol, locate=args.locate, **loaded.kwargs
                )
            stage("")
        except UnsupportedOpsError as e:
            status.stop()
            _missing_table(err, e.missing, target)
            err.print(_styled(f"export failed: {len(e.missing)} op(s) have no impl at target {target}", "red"))
            return EXIT_FINDINGS
        except VerificationError as e:
            status.stop()
            location = getattr(e, "location", None)
            if args.json:
                checks = [dataclasses.asdict(c) for c in e.results]
                _print_json({
                    "file": str(Path(args.output).resolve()), "verified": False, "outputs": checks,
                    "location": location.to_dict() if location is not None else None,
                })  # fmt: skip
                return EXIT_FINDINGS
            if location is None:
                err.print(_styled(f"wrote {args.output}, but it does not match eager PyTorch:\n{e}", "red"))
                if args.verify and not args.locate:
                    err.print("rerun with --locate to find the impl or rewrite rule at fault")
                return EXIT_FINDINGS
            lines = "\n".join(f"  {c}" for c in e.results if not c.ok)
            err.print(_styled(f"wrote {args.output}, but it does not match eager PyTorch:\n{lines}", "red"))
            _location_table(_console(), location)
            return EXIT_FINDINGS
        except KeyboardInterrupt as e:
            status.stop()
            sys.stderr.write(f"opreg: interrupted: {_interrupted_export(e, last[0], args)}\n")
            return EXIT_INTERRUPTED
    _warn_hook_failures(registry)
    if args.json:
        _print_json({
            "file": str(Path(path).resolve()), "nodes": len(program.model.graph),
            "opsets": {domain_label(d): v for d, v in sorted(program.model.opset_imports.items())},
            "verified": bool(args.verify) or None,
            "outputs": [dataclasses.asdict(c) for c in result.outputs] if args.verify else [],
        })  # fmt: skip
        return EXIT_OK
    opsets = ", ".join(f"{domain_label(d)}={v}" for d, v in sorted(program.model.opset_imports.items()))
    console = _console()
    console.print(
        f"wrote {path} ({len(program.model.graph)} nodes; opsets {opsets}) in {time.perf_counter() - started:.1f} s",
        markup=False,
    )
    _print_patches(console, err, program.capture_patches)
    if args.external_data and not referenced_data(path):
        console.print(
            f"note: no weight is over {INLINE_LIMIT_BYTES} bytes, so every weight is inside {path} "
            "and --external-data wrote no data file",
            markup=False,
            soft_wrap=True,
        )
    if args.verify:
        worst = max((o.max_abs for o in result.outputs), default=0.0)
        console.print(
            f"verified with {result.runtime}: {len(result.outputs)} output(s) match eager PyTorch "
            f"(max abs {worst:.3g})",
            markup=False,
        )
    return EXIT_OK


def _cmd_llm_export(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from opreg.errors import VerificationError
    from opreg.llm import _families

    registry = _registry(args)
    target = registry.target(args.target)
    if not (Path(args.folder) / "config.json").is_file():
        raise _UsageError(f"{args.folder} is not a transformers checkpoint folder (no config.json)")
    _warn_conflicts(registry)
    if not args.debug:
        logging.getLogger("torch").setLevel(logging.CRITICAL)  # torch logs tracebacks of errors opreg reports
    started = time.perf_counter()
    err = _console(stderr=True)
    with err.status(f"exporting {args.folder}..."):
        precision = {} if args.precision is None else {"precision": args.precision}
        exported_model = _families.export_checkpoint(
            Path(args.folder), target=target, registry=registry, context_length=args.context_length, **precision
        )
        exported = time.perf_counter() - started
        folder = exported_model.save(args.output, external_data=True if args.external_data else None)
    checks = []
    if args.verify:
        with err.status("verifying..."):
            try:
                checks = exported_model.verify()
            except VerificationError as e:
                err.print(_styled(f"wrote {folder}, but the models do not match transformers:\n{e}", "red"))
                return EXIT_FINDINGS
    programs = exported_model.programs
    last = list(programs.values())[-1]  # the decoder
    summary = {
        "folder": str(folder),
        "files": sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")),
        "target": target.as_dict(),
        "layers": exported_model.layout.num_layers,
        "inputs": list(last.input_names),
        "outputs": list(last.output_names),
        "nodes": len(last.model.graph),
        "models": {
            name: {"inputs": list(p.input_names), "outputs": list(p.output_names), "nodes": len(p.model.graph)}
            for name, p in programs.items()
        },
        "export_seconds": round(exported, 2),
        "verified": len(checks),
        "max_abs": max((c.max_abs for c in checks), default=None),
    }
    if args.json:
        _print_json(summary)
        return EXIT_OK
    console = _console()
    nodes = ", ".join(f"{name} {info['nodes']} nodes" for name, info in summary["models"].items())
    console.print(
        f"wrote {folder} ({', '.join(summary['files'])}): {type(exported_model.model).__name__}, "
        f"{summary['layers']} layers, {nodes}, exported in {exported:.1f} s",
        markup=False,
    )
    if checks:
        console.print(
            f"verified: {len(checks)} outputs match transformers (max abs {summary['max_abs']:.3g})", markup=False
        )
    return EXIT_OK


def _location_table(console: Any, location: Any) -> None:
    """``program.locate``'s report: the nodes out of tolerance, the suspects first, then the verdict."""
    rows = sorted(location.divergences, key=lambda d: (not d.faulty, not d.first))[:LOCATE_ROWS]
    table = _table(
        f"where it goes wrong ({location.compared} values compared with eager, {location.runtime}, "
        f"rtol={location.rtol:g}, atol={location.atol:g})",
        ["node", "torch op", "impl / rule", "impl at", "model line", "error", "alone", "verdict"],
        whole=["impl / rule", "impl at"],
    )
    for d in rows:
        verdict = "WRONG" if d.faulty else ("first" if d.first else "carried")
        alone = _times(d.local.ratio) if d.local is not None else "?"
        table.add_row(
            d.node, d.torch_op, d.suspect, _short_source(d.impl_source), _short_source(d.source) or d.module,
            _times(d.error.ratio), alone, _styled(verdict, "red" if d.faulty else ""),
        )  # fmt: skip
    console.print(table)
    if len(location.divergences) > len(rows):
        console.print(
            f"... and {len(location.divergences) - len(rows)} more node(s) out of tolerance (--json lists all)"
        )
    console.print(_styled(location.summary(), "red" if location.verdict == "fault" else "yellow"), markup=False)
    console.print("error: x the tolerance (atol + rtol * |eager|); alone: the node on the model's own inputs to it")


def _times(ratio: float) -> str:
    return "inf" if ratio == float("inf") else f"{ratio:.3g} x"


def _print_patches(console: Any, err: Any, outcomes: Sequence[Any]) -> None:
    """The capture patches an export applied, and those that failed (a warning each)."""
    from opreg.patching import APPLIED, FAILED

    applied = [o for o in outcomes if o.status == APPLIED]
    if applied:
        names = ", ".join(o.label + (f" ({o.calls} calls)" if o.calls is not None else "") for o in applied)
        console.print(f"capture patches applied: {names}", markup=False)
    for o in outcomes:
        if o.status == FAILED:
            err.print(_styled(f"warning: capture patch {o.label} failed and was left out: {o.detail}", "yellow"))


def _interrupted_export(error: KeyboardInterrupt, stage: str, args: argparse.Namespace) -> str:
    """What an interrupt of ``opreg export`` during ``stage`` left at the output path."""
    from opreg.errors import InterruptedAfterSave

    if isinstance(error, InterruptedAfterSave) or stage in ("verify", ""):
        return f"{args.output} holds the new model (saved before the interrupt){', not verified' * args.verify}"
    return f"{args.output} was not changed" if os.path.lexists(args.output) else "nothing was written"


def _cmd_inspect(args: argparse.Namespace) -> int:
    from opreg import inspection

    report = inspection.inspect_file(args.file)
    code = EXIT_OK if report["usable"] else EXIT_FINDINGS
    if args.json:
        _print_json(report)
        return code
    console = _console()
    line = lambda text, style="": console.print(_styled(text, style))  # noqa: E731
    line(f"{report['file']} ({report['file_bytes']:,} bytes)", "bold")
    line(f"IR version {report['ir_version']}, produced by {report['producer'] or 'unknown'}")
    line("opsets: " + ", ".join(f"{d}={v}" for d, v in report["opset_imports"].items()))
    for kind in ("inputs", "outputs"):
        line(f"{kind}: " + ", ".join(f"{v['name']} {v['dtype']}{v['shape']}" for v in report[kind]))
    if report["constant_inputs"]:
        fixed = ", ".join(f"{name}={json.dumps(value)}" for name, value in report["constant_inputs"].items())
        line(f"constant inputs (fixed when exported; run() refuses other values): {fixed}")
    weights = report["initializers"]
    external = ", external data" if weights["external"] else ""
    line(f"initializers: {weights['count']} ({weights['bytes']:,} bytes{external})")
    table = _table(f"{report['node_count']} nodes by op (subgraphs included)", ["domain", "op", "count"])
    for row in report["ops"]:
        table.add_row(row["domain"], row["op"], str(row["count"]))
    console.print(table)
    if report["functions"]:
        line("functions: " + ", ".join(report["functions"]))
    if report["subgraphs"]:
        table = _table("subgraphs", ["owner", "op", "attribute", "nodes", "torch op", "where", "packs"])
        for row in report["subgraphs"]:
            where = " at ".join(p for p in (row["module"], row["source"]) if p)
            packs = ", ".join(f"{p} {n}" for p, n in sorted(row["packs"].items()))
            table.add_row(row["owner"], row["op"], row["attribute"], str(row["nodes"]), row["torch_op"], where, packs)
        console.print(table)
    if report["capture_patches"]:
        columns = ["patch", "patches", "written for", "installed", "calls"]
        table = _table("capture patches applied while capturing", columns)
        for entry in report["capture_patches"]:
            table.add_row(*(str(entry.get(key, "")) for key in ("patch", "patches", "versions", "installed", "calls")))
        console.print(table)
    if report["provenance"]["packs"]:
        table = _table("provenance", ["pack", "torch op", "onnx nodes"])
        for row in report["provenance"]["torch_ops"]:
            table.add_row(row["pack"], row["torch_op"], str(row["nodes"]))
        console.print(table)
    else:
        line("no provenance metadata (not exported by opreg)")
    for problem in report["problems"]:
        line(f"unusable: {problem}", "red")
    if report["usable"]:
        line("usable: onnx.checker accepts the model with its data", "green")
    return code


def _cmd_new_pack(args: argparse.Namespace) -> int:
    from opreg import scaffold

    names = scaffold.pack_names(args.name, args.domain)
    path = scaffold.new_pack(args.name, domain=args.domain, directory=args.output)
    if args.json:
        _print_json({"directory": str(path), **dataclasses.asdict(names), "files": sorted(scaffold.render(names))})
        return EXIT_OK
    console = _console()
    console.print(
        f"wrote pack {names.pack} ({names.distribution}, import {names.package}, domain {names.domain}) to {path}",
        markup=False,
    )
    console.print(
        f"next: pip install -e {path}  (--no-build-isolation if setuptools is installed); "
        f"opreg plugins; python -m pytest {path / 'tests'}",
        markup=False,
    )
    return EXIT_OK


def _cmd_pack_check(args: argparse.Namespace) -> int:
    from opreg.testing import check_pack

    if args.json:
        report = check_pack(args.pack)
        _print_json(report.as_dict())
        return EXIT_OK if report.ok else EXIT_FINDINGS
    console = _console()
    with console.status(f"checking pack {args.pack}..."):
        report = check_pack(args.pack)
    table = _table(
        f"conformance kit: pack {report.pack} ({report.distribution} {report.version})",
        ["check", "subject", "target", "status", "detail"],
    )
    for r in report.results:
        table.add_row(r.check, r.subject, r.target, _styled(r.status), r.detail)
    console.print(table)
    console.print(_styled(report.summary(), "green" if report.ok else "red"))
    return EXIT_OK if report.ok else EXIT_FINDINGS


# -- running ----------------------------------------------------------------------------------


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )

    previous = signal.signal(signal.SIGTERM, _terminate)  # SIGTERM ends a command as Ctrl-C does, cleanly
    try:
        return args.run(args)
    except OpregError as e:
        if args.debug:
            raise
        sys.stderr.write(f"opreg: error: {_one_line(e)}\n")
        strict = getattr(args, "strict", False) and not isinstance(e, PluginNotFoundError)
        found = isinstance(e, _RequestedPackFailed) or (isinstance(e, PluginError) and strict)
        return EXIT_FINDINGS if found else EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("opreg: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as e:
        if args.debug:
            raise
        sys.stderr.write(
            f"opreg: internal error: {type(e).__name__}: {_one_line(e)} (run with --debug for the traceback)\n"
        )
        return EXIT_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)


def _one_line(error: BaseException) -> str:
    """An error's message on one line (torch's multi-line reports folded)."""
    return _one_line_text(str(error))


def _one_line_text(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


if __name__ == "__main__":
    raise SystemExit(main())
