"""``opreg ops``: the registered ops and their impls, at a target."""

from __future__ import annotations

import argparse
import fnmatch

from opreg.cli._common import EXIT_OK, UsageError, console, print_json, registry, requires, styled, table
from opreg.cli._options import Parents


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser(
        "ops", parents=[parents.output, parents.packs, parents.target, parents.cache],
        help="registered ops and their impls",
    )  # fmt: skip
    p.add_argument("pattern", nargs="?", help="only ops matching this glob or substring (e.g. 'aten::gelu*')")
    p.add_argument("--pack", action="append", default=[], help="only impls from this pack (repeatable)")
    p.set_defaults(run=run)


def _matches(op: str, pattern: str | None) -> bool:
    if not pattern:
        return True
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(op, pattern) or fnmatch.fnmatchcase(op, f"{pattern}.default")
    return pattern in op


def run(args: argparse.Namespace) -> int:
    from opreg.registry.targets import domain_label

    reg = registry(args, declared=True)
    target = reg.target(args.target)
    known_packs = {r.name for r in reg.packs} | {i.pack for i in reg.impls()}
    unknown = sorted(set(args.pack) - known_packs)
    if unknown:
        raise UsageError(f"no pack named {', '.join(unknown)}; packs: {', '.join(sorted(known_packs))}")
    rows = []
    for op in reg.ops():
        if not _matches(str(op), args.pattern):
            continue
        chosen = reg.resolve(op, target)
        usable = set(reg.candidates(op, target))
        for impl in sorted(reg.impls(op), key=lambda i: i.sort_key()):
            if args.pack and impl.pack not in args.pack:
                continue
            status = "chosen" if impl is chosen else ("usable" if impl in usable else "unusable")
            rows.append((op, impl, status))
    if args.json:
        print_json({
            "target": target.as_dict(),
            "impls": [
                {"op": str(op), "pack": i.pack, "function": i.name, "kind": i.kind, "onnx": str(i.requirement.onnx),
                 "domains": {domain_label(d): str(r) for d, r in i.requirement.domains},
                 "profiles": list(i.profiles), "priority": i.priority, "predicate": i.predicate is not None,
                 "status": status, "source": i.source}
                for op, i, status in rows
            ],
        })  # fmt: skip
        return EXIT_OK
    impls = table(f"impls at target {target}", ["op", "pack", "function", "kind", "requires", "priority", "status"])
    for op, impl, status in rows:
        impls.add_row(str(op), impl.pack, impl.name, impl.kind, requires(impl), str(impl.priority),
                      styled(status))  # fmt: skip
    out = console()
    out.print(impls)
    out.print(f"{len({op for op, _, _ in rows})} ops, {len(rows)} impls", markup=False)
    return EXIT_OK
