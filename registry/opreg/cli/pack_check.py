"""``opreg pack-check``: run the conformance kit on an installed pack."""

from __future__ import annotations

import argparse

from opreg.cli._common import EXIT_FINDINGS, EXIT_OK, console, print_json, styled, table
from opreg.cli._options import Parents


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser(
        "pack-check", parents=[parents.output],
        help="run the conformance kit on an installed pack (exit 1 if a check fails)",
    )  # fmt: skip
    p.add_argument("pack", metavar="DIST_OR_MODULE", help="pack, distribution or module name, e.g. opreg-ort-contrib")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opreg.testing import check_pack

    if args.json:
        report = check_pack(args.pack)
        print_json(report.as_dict())
        return EXIT_OK if report.ok else EXIT_FINDINGS
    out = console()
    with out.status(f"checking pack {args.pack}..."):
        report = check_pack(args.pack)
    results = table(
        f"conformance kit: pack {report.pack} ({report.distribution} {report.version})",
        ["check", "subject", "target", "status", "detail"],
    )
    for r in report.results:
        results.add_row(r.check, r.subject, r.target, styled(r.status), r.detail)
    out.print(results)
    for r in report.failures():  # each on one line, whatever the table folded
        where = f" at {r.target}" if r.target else ""
        out.print(styled(f"failed: [{r.check}] {r.subject}{where}: {r.detail}", "red"), soft_wrap=True)
    out.print(styled(report.summary(), "green" if report.ok else "red"))
    return EXIT_OK if report.ok else EXIT_FINDINGS
