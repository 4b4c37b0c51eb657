"""The ``opreg`` command line.

Exit codes: 0 success; 1 the command ran and found problems (a pack failed
under ``--strict``); 2 bad input or an opreg error (one line on stderr).
``--debug`` shows tracebacks and debug logs.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from opreg.errors import OpregError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2


class _UsageError(OpregError):
    pass


def _common(parser: argparse.ArgumentParser, target: bool = False) -> None:
    parser.add_argument(
        "-p", dest="plugin_args", action="append", default=[], metavar="NAME",
        help="load pack NAME (needed when OPREG_DISABLE_PLUGIN_AUTOLOAD=1); -p no:NAME leaves it out",
    )  # fmt: skip
    parser.add_argument("--strict", action="store_true", help="fail if any selected pack fails to load")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    if target:
        parser.add_argument(
            "--target", "-t", default="onnx",
            help="profile name, ai.onnx version, or domain=version list (default: onnx)",
        )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opreg", description="Inspect opreg's op packs, registry and resolution.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("plugins", help="installed packs: loaded, failed or disabled, and why")
    _common(p)
    p.set_defaults(run=_cmd_plugins)

    p = sub.add_parser("ops", help="registered ops and their impls")
    p.add_argument("pattern", nargs="?", help="only ops matching this glob or substring (e.g. 'aten::gelu*')")
    p.add_argument("--pack", action="append", default=[], help="only impls from this pack (repeatable)")
    _common(p, target=True)
    p.set_defaults(run=_cmd_ops)

    p = sub.add_parser("explain", help="how one op resolves for a target, and why")
    p.add_argument("op", help="torch op, e.g. aten::gelu or aten::add.Tensor")
    _common(p, target=True)
    p.set_defaults(run=_cmd_explain)

    model_help = "path/to/file.py:factory or package.module:factory; factory() returns (module, args[, kwargs])"
    dynamic_help = "dynamic dims of a forward input: NAME:DIM=LABEL[,DIM=LABEL] (repeatable), e.g. x:0=batch"

    p = sub.add_parser("check", help="which ops of a model no pack covers at a target (exit 1 if any)")
    p.add_argument("model", metavar="MODEL", help=model_help)
    p.add_argument("--dynamic", action="append", default=[], metavar="SPEC", help=dynamic_help)
    _common(p, target=True)
    p.set_defaults(run=_cmd_check)

    p = sub.add_parser("export", help="export a model to an ONNX file")
    p.add_argument("model", metavar="MODEL", help=model_help)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the .onnx file to write")
    p.add_argument("--dynamic", action="append", default=[], metavar="SPEC", help=dynamic_help)
    p.add_argument("--verify", action="store_true", help="run the model and compare with eager PyTorch")
    p.add_argument("--keep-functions", action="store_true", help="keep script impls as model-local functions")
    p.add_argument(
        "--external-data",
        action="store_true",
        help="write weights to a side file FILE.<token>.data that the model names",
    )
    _common(p, target=True)
    p.set_defaults(run=_cmd_export)

    p = sub.add_parser("inspect", help="what an ONNX file holds: opsets, ops, provenance, weights")
    p.add_argument("file", metavar="FILE", help="an .onnx file")
    p.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.set_defaults(run=_cmd_inspect)

    p = sub.add_parser("new-pack", help="write a new, installable op pack to start from")
    p.add_argument("name", metavar="NAME", help="distribution name, e.g. opreg-mypack (import name opreg_mypack)")
    p.add_argument("--domain", help="custom ONNX domain of the pack's ops (default: NAME.ops without 'opreg-')")
    p.add_argument("-o", "--output", metavar="DIR", help="a new or empty directory (default: ./NAME)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.set_defaults(run=_cmd_new_pack)

    p = sub.add_parser("pack-check", help="run the conformance kit on an installed pack (exit 1 if a check fails)")
    p.add_argument("pack", metavar="DIST_OR_MODULE", help="pack, distribution or module name, e.g. opreg-ort-contrib")
    p.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.set_defaults(run=_cmd_pack_check)
    return parser


def _version() -> str:
    from opreg import __version__

    return __version__


def _registry(args: argparse.Namespace) -> Any:
    from opreg import plugins

    wanted = [a for a in args.plugin_args if not a.startswith("no:")]
    unwanted = [a[3:] for a in args.plugin_args if a.startswith("no:")]
    if any(not name for name in wanted + unwanted):
        raise _UsageError("-p needs a pack name: -p NAME or -p no:NAME")
    plugins.require_installed(wanted)
    selection = wanted if plugins.autoload_disabled() else None
    return plugins.build_registry(selection, unwanted, strict=args.strict)


def _console() -> Any:
    from rich.console import Console

    # A pipe gets no terminal width; do not fold tables to 80 columns there.
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def _table(title: str, columns: Sequence[str]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _cmd_plugins(args: argparse.Namespace) -> int:
    registry = _registry(args)
    reports = registry.packs
    if args.json:
        _print_json([
            {
                "name": r.name, "distribution": r.distribution, "version": r.version, "value": r.value,
                "status": r.status, "reason": r.reason, "hook": r.hook, "impls": r.impls,
                "domains": list(r.domains), "profiles": list(r.profiles),
                "rejected": [{"op": x.op, "function": x.function, "error": x.error} for x in r.rejected],
            }
            for r in reports
        ])  # fmt: skip
        return EXIT_OK
    table = _table(
        "opreg packs", ["pack", "distribution", "version", "status", "impls", "domains", "profiles", "reason"]
    )
    styles = {"loaded": "green", "failed": "red", "incompatible": "red", "disabled": "dim"}
    for r in reports:
        status = f"[{styles.get(r.status, '')}]{r.status}[/]"
        reason = r.reason + (f" (hook {r.hook})" if r.hook and r.status != "loaded" else "")
        table.add_row(r.name, r.distribution, r.version, status, str(r.impls), ", ".join(r.domains),
                      ", ".join(r.profiles), reason)  # fmt: skip
    console = _console()
    console.print(table)
    for r in reports:
        for x in r.rejected:
            console.print(f"[yellow]rejected[/] {r.name}: {x.function} for {x.op}: {x.error}", markup=True)
    return EXIT_OK


def _matches(op: str, pattern: str | None) -> bool:
    if not pattern:
        return True
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(op, pattern) or fnmatch.fnmatchcase(op, f"{pattern}.default")
    return pattern in op


def _cmd_ops(args: argparse.Namespace) -> int:
    registry = _registry(args)
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
                {"op": str(op), "pack": i.pack, "function": i.name, "kind": i.kind,
                 "onnx": str(i.requirement.onnx), "domains": {d: str(r) for d, r in i.requirement.domains},
                 "priority": i.priority, "predicate": i.predicate is not None, "status": status}
                for op, i, status in rows
            ],
        })  # fmt: skip
        return EXIT_OK
    table = _table(f"impls at target {target}", ["op", "pack", "function", "kind", "requires", "priority", "status"])
    styles = {"chosen": "green", "usable": "", "unusable": "dim"}
    for op, impl, status in rows:
        table.add_row(str(op), impl.pack, impl.name, impl.kind, str(impl.requirement), str(impl.priority),
                      f"[{styles[status]}]{status}[/]" if styles[status] else status)  # fmt: skip
    console = _console()
    console.print(table)
    console.print(f"{len({op for op, _, _ in rows})} ops, {len(rows)} impls")
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    from opreg.opname import OpName

    registry = _registry(args)
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
                 "priority": c.impl.priority, "status": c.status, "reason": c.reason}
                for c in explanation.candidates
            ],
        })  # fmt: skip
        return EXIT_OK
    console = _console()
    if not explanation.candidates:
        similar = [str(o) for o in registry.ops() if o.name == op.name]
        hint = f" Registered overloads: {', '.join(similar)}." if similar else ""
        console.print(f"No impl is registered for {op}.{hint}")
        return EXIT_OK
    table = _table(
        f"{op} at target {explanation.target}", ["status", "pack", "function", "requires", "priority", "reason"]
    )
    styles = {"chosen": "green", "dropped": "dim", "conditional": "yellow", "outranked": ""}
    for c in explanation.candidates:
        style = styles[c.status]
        table.add_row(f"[{style}]{c.status}[/]" if style else c.status, c.impl.pack, c.impl.name,
                      str(c.impl.requirement), str(c.impl.priority), c.reason)  # fmt: skip
    console.print(table)
    if explanation.conflicts:
        names = ", ".join(i.label for i in explanation.conflicts)
        console.print(f"[yellow]conflict[/]: {explanation.chosen.label} ties with {names}; raise one's priority")
    if explanation.chosen is None:
        console.print(f"[red]No impl of {op} can serve target {explanation.target}.[/]")
    return EXIT_OK


def _load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    from opreg import _modelspec

    loaded = _modelspec.load(args.model)
    return loaded, _modelspec.dynamic_shapes(loaded, args.dynamic)


def _missing_json(missing: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {
            "op": m.op,
            "count": m.count,
            "locations": list(m.locations),
            "reason": m.reason,
            "elsewhere": list(m.elsewhere),
        }
        for m in missing
    ]


def _missing_table(console: Any, missing: Sequence[Any], target: Any) -> None:
    table = _table(f"ops with no impl at target {target}", ["op", "nodes", "where", "why", "covered elsewhere by"])
    for m in missing:
        table.add_row(m.op, str(m.count), "\n".join(m.locations), m.reason, "\n".join(m.elsewhere))
    console.print(table)


def _cmd_check(args: argparse.Namespace) -> int:
    from opreg import exporter

    registry = _registry(args)
    target = registry.target(args.target)
    loaded, dynamic = _load_model(args)
    missing = exporter.plan_export(
        loaded.module, loaded.args, loaded.kwargs, target=target, dynamic_shapes=dynamic, registry=registry
    )
    if args.json:
        _print_json({"model": args.model, "target": target.as_dict(), "missing": _missing_json(missing)})
        return EXIT_FINDINGS if missing else EXIT_OK
    console = _console()
    if not missing:
        console.print(f"[green]every op of {args.model} has an impl at target {target}[/]")
        return EXIT_OK
    _missing_table(console, missing, target)
    console.print(f"[red]{len(missing)} op(s) missing[/]: install a pack that covers them or choose another target")
    return EXIT_FINDINGS


def _cmd_export(args: argparse.Namespace) -> int:
    import time

    from rich.console import Console

    from opreg import exporter
    from opreg.errors import UnsupportedOpsError, VerificationError
    from opreg.exporter._save import check_output_path

    err = Console(stderr=True, soft_wrap=False, width=None if sys.stderr.isatty() else 160)
    registry = _registry(args)
    target = registry.target(args.target)
    check_output_path(args.output)  # before the export, not after it
    started = time.perf_counter()
    with err.status("loading the model") as status:
        last = ["load", time.perf_counter()]

        def stage(name: str) -> None:
            err.print(f"[green]done[/] {last[0]} ({time.perf_counter() - last[1]:.2f} s)")
            last[0], last[1] = name, time.perf_counter()
            status.update(f"{name}...")

        loaded, dynamic = _load_model(args)
        try:
            program = exporter.export(
                loaded.module, loaded.args, loaded.kwargs, target=target, dynamic_shapes=dynamic,
                registry=registry, inline=not args.keep_functions, progress=stage,
            )  # fmt: skip
            stage("save")
            path = program.save(args.output, external_data=True if args.external_data else None)
            if args.verify:
                stage("verify")
                result = program.verify(*loaded.args, **loaded.kwargs)
            stage("")
        except UnsupportedOpsError as e:
            status.stop()
            _missing_table(err, e.missing, target)
            err.print(f"[red]export failed: {len(e.missing)} op(s) have no impl at target {target}[/]")
            return EXIT_FINDINGS
        except VerificationError as e:
            status.stop()
            err.print(f"[red]wrote {args.output}, but it does not match eager PyTorch:[/]\n{e}")
            return EXIT_FINDINGS
    opsets = ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in sorted(program.model.opset_imports.items()))
    console = _console()
    console.print(
        f"wrote {path} ({len(program.model.graph)} nodes; opsets {opsets}) in {time.perf_counter() - started:.1f} s"
    )
    if args.verify:
        worst = max((o.max_abs for o in result.outputs), default=0.0)
        console.print(
            f"verified with {result.runtime}: {len(result.outputs)} output(s) match eager PyTorch (max abs {worst:.3g})"
        )
    return EXIT_OK


def _cmd_inspect(args: argparse.Namespace) -> int:
    from opreg import inspection

    report = inspection.inspect_file(args.file)
    if args.json:
        _print_json(report)
        return EXIT_OK
    console = _console()
    console.print(f"[bold]{report['file']}[/] ({report['file_bytes']:,} bytes)")
    console.print(f"IR version {report['ir_version']}, produced by {report['producer'] or 'unknown'}")
    console.print("opsets: " + ", ".join(f"{d}={v}" for d, v in report["opset_imports"].items()))
    for kind in ("inputs", "outputs"):
        console.print(f"{kind}: " + ", ".join(f"{v['name']} {v['dtype']}{v['shape']}" for v in report[kind]))
    console.print(
        f"initializers: {report['initializers']['count']} ({report['initializers']['bytes']:,} bytes"
        + (", external data" if report["initializers"]["external"] else "")
        + ")"
    )
    table = _table(f"{report['node_count']} nodes by op", ["domain", "op", "count"])
    for row in report["ops"]:
        table.add_row(row["domain"], row["op"], str(row["count"]))
    console.print(table)
    if report["functions"]:
        console.print("functions: " + ", ".join(report["functions"]))
    if report["provenance"]["packs"]:
        table = _table("provenance", ["pack", "torch op", "onnx nodes"])
        for row in report["provenance"]["torch_ops"]:
            table.add_row(row["pack"], row["torch_op"], str(row["nodes"]))
        console.print(table)
    else:
        console.print("no provenance metadata (not exported by opreg)")
    return EXIT_OK


def _cmd_new_pack(args: argparse.Namespace) -> int:
    import dataclasses

    from opreg import scaffold

    names = scaffold.pack_names(args.name, args.domain)
    path = scaffold.new_pack(args.name, domain=args.domain, directory=args.output)
    if args.json:
        _print_json({"directory": str(path), **dataclasses.asdict(names), "files": sorted(scaffold.render(names))})
        return EXIT_OK
    console = _console()
    console.print(f"wrote pack [bold]{names.pack}[/] ({names.distribution}, import {names.package}, "
                  f"domain {names.domain}) to {path}")  # fmt: skip
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
    styles = {"passed": "green", "failed": "red", "skipped": "yellow"}
    for r in report.results:
        # Details quote errors, which may hold [brackets]: only the status is markup.
        table.add_row(*(_escape(c) for c in (r.check, r.subject, r.target)), f"[{styles[r.status]}]{r.status}[/]",
                      _escape(r.detail))  # fmt: skip
    console.print(table)
    console.print(report.summary(), style="green" if report.ok else "red")
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.run(args)
    except OpregError as e:
        if args.debug:
            raise
        sys.stderr.write(f"opreg: error: {e}\n")
        return EXIT_FINDINGS if e.__class__.__name__ == "PluginError" and args.strict else EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("opreg: interrupted\n")
        return 130
    except Exception as e:
        if args.debug:
            raise
        sys.stderr.write(f"opreg: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)\n")
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
