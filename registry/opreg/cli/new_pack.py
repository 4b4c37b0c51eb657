"""``opreg new-pack``: write a new, installable op pack to start from."""

from __future__ import annotations

import argparse
import dataclasses

from opreg.cli._common import EXIT_OK, console, print_json
from opreg.cli._options import Parents


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser(
        "new-pack", parents=[parents.output], help="write a new, installable op pack to start from"
    )
    p.add_argument("name", metavar="NAME", help="distribution name, e.g. opreg-mypack (import name opreg_mypack)")
    p.add_argument("--domain", help="custom ONNX domain of the pack's ops (default: NAME.ops without 'opreg-')")
    p.add_argument("-o", "--output", metavar="DIR", help="a new or empty directory (default: ./NAME)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opreg import scaffold

    names = scaffold.pack_names(args.name, args.domain)
    path = scaffold.new_pack(args.name, domain=args.domain, directory=args.output)
    if args.json:
        print_json({"directory": str(path), **dataclasses.asdict(names), "files": sorted(scaffold.render(names))})
        return EXIT_OK
    out = console()
    out.print(
        f"wrote pack {names.pack} ({names.distribution}, import {names.package}, domain {names.domain}) to {path}",
        markup=False,
    )
    out.print(
        f"next: pip install -e {path}  (--no-build-isolation if setuptools is installed); "
        f"opreg plugins; python -m pytest {path / 'tests'}",
        markup=False,
    )
    return EXIT_OK
