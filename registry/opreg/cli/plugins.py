"""``opreg plugins``: the installed packs, loaded, failed or disabled, and why."""

from __future__ import annotations

import argparse
import dataclasses

from opreg.cli._common import EXIT_OK, conflict_rows, console, print_json, registry, styled, table
from opreg.cli._options import Parents


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser(
        "plugins", parents=[parents.output, parents.packs, parents.cache],
        help="installed packs: loaded, failed or disabled, and why",
    )  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    reg = registry(args, declared=True)
    conflicts = conflict_rows(reg)
    if args.json:
        rows = []
        for report in reg.packs:
            row = dataclasses.asdict(report)
            row["conflicts"] = [op for op, detail in conflicts if f"{report.name}:" in detail]
            rows.append(row)
        print_json(rows)
        return EXIT_OK
    packs = table(
        "opreg packs", ["pack", "distribution", "version", "status", "impls", "domains", "profiles", "reason"]
    )
    for r in reg.packs:
        reason = r.reason + (f" (hook {r.hook})" if r.hook and r.status != "loaded" else "")
        packs.add_row(r.name, r.distribution, r.version, styled(r.status), str(r.impls), ", ".join(r.domains),
                      ", ".join(r.profiles), reason)  # fmt: skip
    out = console()
    out.print(packs)
    for r in reg.packs:
        for x in r.rejected:
            out.print(styled(f"rejected {r.name}: {x.function} for {x.op}: {x.error}", "yellow"))
    if conflicts:
        out.print(styled(f"{len(conflicts)} conflict(s): packs tie on the same op (use --prefer OP=PACK)", "yellow"))
        for op, detail in conflicts:
            out.print(styled(f"  {op}: {detail}", "yellow"))
    return EXIT_OK
