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
    p.add_argument(
        "--op", dest="ops", action="append", default=[], metavar="SCHEMA",
        help="a torch op the pack translates, as torch.library defines it: "
        "'mylib::fused_swish(Tensor x, float beta) -> Tensor' (repeatable)",
    )  # fmt: skip
    p.add_argument("--empty", action="store_true", help="a pack with no ops yet (instead of --op)")
    p.add_argument("--domain", help="custom ONNX domain of the pack's ops (default: NAME.ops without 'opreg-')")
    p.add_argument("-o", "--output", metavar="DIR", help="a new or empty directory (default: ./NAME)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opreg.authoring import _packfiles, scaffold

    names = scaffold.pack_names(args.name, args.domain)
    path = scaffold.new_pack(args.name, ops=args.ops, empty=args.empty, domain=args.domain, directory=args.output)
    edit = f"{names.package}/{_packfiles.EDITED}"
    if args.json:
        files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
        ops = [op.split("(", 1)[0].strip() for op in args.ops]
        print_json({"directory": str(path), **dataclasses.asdict(names), "ops": ops, "edit": edit, "files": files})
        return EXIT_OK
    out = console()
    lines = [
        f"wrote pack {names.pack} ({names.distribution}, import {names.package}, domain {names.domain}) to {path}",
        f"edit: {path / edit}" + (" (write each impl's body)" if args.ops else " (add impls)"),
        "next:",
        f"  pip install -e {path}",
        "  opreg plugins",
        f"  opreg pack-check {names.pack}",
    ]
    for line in lines:  # whole lines, never folded: each command can be pasted
        out.print(line, markup=False, soft_wrap=True)
    return EXIT_OK
