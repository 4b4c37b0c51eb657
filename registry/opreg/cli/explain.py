"""``opreg explain``: how one op resolves for a target, and why; or what a capture patch patches
and whether it applies."""

from __future__ import annotations

import argparse
from typing import Any

from opreg.cli._common import (
    EXIT_OK,
    UsageError,
    console,
    packs,
    print_json,
    registry,
    requires,
    short_source,
    styled,
    table,
)
from opreg.cli._options import Parents


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser(
        "explain", parents=[parents.output, parents.packs, parents.target, parents.cache],
        help="how one op resolves for a target, and why; or what a capture patch patches and whether it applies",
    )  # fmt: skip
    p.add_argument(
        "op", help="torch op, e.g. aten::gelu or aten::add.Tensor; or a capture patch (pack:name, or 'patches' for all)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opreg.registry.opname import OpName

    if "::" not in args.op:  # a capture patch: whether it applies is the packs' hooks' to say
        return _explain_patches(args, packs(args))
    reg = registry(args, declared=True)
    op = OpName.of(args.op)
    explanation = reg.explain(op, args.target)
    if args.json:
        print_json({
            "op": str(op),
            "target": explanation.target.as_dict(),
            "chosen": explanation.chosen.label if explanation.chosen else None,
            "conflicts": [i.label for i in explanation.conflicts],
            "elsewhere": explanation.elsewhere,
            "candidates": [
                {"pack": c.impl.pack, "function": c.impl.name, "requires": str(c.impl.requirement),
                 "profiles": list(c.impl.profiles), "priority": c.impl.priority, "status": c.status,
                 "reason": c.reason, "source": c.impl.source}
                for c in explanation.candidates
            ],
        })  # fmt: skip
        return EXIT_OK
    out = console()
    if not explanation.candidates:
        similar = [str(o) for o in reg.ops() if o.name == op.name]
        hint = f" Registered overloads: {', '.join(similar)}." if similar else ""
        out.print(f"No impl is registered for {op}.{hint}", markup=False)
        return EXIT_OK
    candidates = table(
        f"{op} at target {explanation.target}",
        ["status", "pack", "function", "requires", "priority", "reason", "defined at"],
        whole=["defined at"],
    )
    for c in explanation.candidates:
        candidates.add_row(styled(c.status), c.impl.pack, c.impl.name, requires(c.impl), str(c.impl.priority),
                           c.reason, short_source(c.impl.source))  # fmt: skip
    out.print(candidates)
    if explanation.conflicts:
        names = ", ".join(i.label for i in explanation.conflicts)
        out.print(styled(
            f"conflict: {explanation.chosen.label} ties with {names}; choose with --prefer {op}=PACK", "yellow"
        ))  # fmt: skip
    if explanation.chosen is None:
        out.print(styled(f"No impl of {op} can serve target {explanation.target}.", "red"), soft_wrap=True)
        if explanation.elsewhere:
            out.print(styled(f"It is {explanation.elsewhere}.", "yellow"), soft_wrap=True)
    return EXIT_OK


def _explain_patches(args: argparse.Namespace, loaded: Any) -> int:
    """``opreg explain NAME`` for a capture patch (or ``patches``: every one the packs offer)."""
    from opreg.packs import patching

    offer = patching.offered(loaded.host, loaded.registry.capture_patches())
    found = list(offer.patches) if args.op == "patches" else offer.find(args.op)
    if not found and args.op != "patches":
        known = ", ".join(offer.labels()) or "none"
        raise UsageError(
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
        print_json({"capture_patches": rows, "problems": [str(p) for p in offer.problems]})
        return EXIT_OK
    out = console()
    patches = table("capture patches", ["patch", "patches", "written for", "installed", "why"])
    for row in rows:
        patches.add_row(row["patch"], row["patches"], row["versions"], row["state"], row["reason"])
    out.print(patches)
    for problem in offer.problems:
        out.print(styled(f"warning: {problem}", "yellow"))
    out.print("turn one off with --no-patch NAME (exclude_patches= in Python), all with --no-patches", markup=False)
    return EXIT_OK
