"""``opreg check``: which ops of a model no pack covers at a target."""

from __future__ import annotations

import argparse
import dataclasses

from opreg.cli import _common
from opreg.cli._options import Parents, add_model_command


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = add_model_command(
        subparsers, parents, "check", help="which ops of a model no pack covers at a target (exit 1 if any)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opreg import exporter

    packs = _common.packs(args)
    reg = packs.registry
    target = reg.target(args.target)
    _common.report_failed_packs(reg, args)
    loaded, dynamic = _common.load_model(args)
    _common.warn_conflicts(reg)
    settings = _common.export_settings(args, packs, target, dynamic)
    missing = exporter.plan_export(loaded.module, loaded.args, loaded.kwargs, settings=settings)
    if args.json:
        rows = [dataclasses.asdict(m) for m in missing]
        _common.print_json({"model": args.model, "target": target.as_dict(), "missing": rows})
        return _common.EXIT_FINDINGS if missing else _common.EXIT_OK
    out = _common.console()
    if not missing:
        out.print(_common.styled(f"every op of {args.model} has an impl at target {target}", "green"))
        return _common.EXIT_OK
    _common.missing_table(out, missing, target)
    out.print(
        _common.styled(f"{len(missing)} op(s) missing: install a pack that covers them or choose another target", "red")
    )
    return _common.EXIT_FINDINGS
