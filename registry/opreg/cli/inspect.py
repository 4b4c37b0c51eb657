"""``opreg inspect``: what an ONNX file holds, and whether it is usable."""

from __future__ import annotations

import argparse
import json
from typing import Any

from opreg.cli._common import EXIT_FINDINGS, EXIT_OK, console, print_fixed_dims, print_json, styled, table
from opreg.cli._options import Parents
from opreg.registry.versions import opsets_text

_PATCH_KEYS = ("patch", "patches", "versions", "installed", "calls")


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = subparsers.add_parser(
        "inspect", parents=[parents.output], help="what an ONNX file holds, and whether it is usable"
    )
    p.add_argument("file", metavar="FILE", help="an .onnx file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opreg.cli import _inspection

    report = _inspection.inspect_file(args.file)
    code = EXIT_OK if report["usable"] else EXIT_FINDINGS
    if args.json:
        print_json(report)
        return code
    out = console()
    line = lambda text, style="": out.print(styled(text, style))  # noqa: E731
    line(f"{report['file']} ({report['file_bytes']:,} bytes)", "bold")
    line(f"IR version {report['ir_version']}, produced by {report['producer'] or 'unknown'}")
    line("opsets: " + opsets_text(report["opset_imports"], report["opset_floors"]))
    for kind in ("inputs", "outputs"):
        line(f"{kind}: " + ", ".join(f"{v['name']} {v['dtype']}{v['shape']}" for v in report[kind]))
    if report["constant_inputs"]:
        fixed = ", ".join(f"{name}={json.dumps(value)}" for name, value in report["constant_inputs"].items())
        line(f"constant inputs (fixed when exported; run() refuses other values): {fixed}")
    print_fixed_dims(out, report["fixed_dims"])
    for guard in report["shape_guards"]:
        where = f" ({guard.get('source')})" if guard.get("source") else ""
        dims = ", ".join(guard.get("dims", ()))
        line(f"shape guard the model does not check: {dims}: {guard.get('guard')}{where}", "yellow")
    for grown in report["grown_dims"]:
        where = f" ({grown.get('source')})" if grown.get("source") else ""
        line(
            f"note: {grown.get('input')}.shape[{grown.get('dim')}]: captured from an example with it at "
            f"{grown.get('captured_at')}, not {grown.get('size')}: {grown.get('guard')}{where}"
        )
    weights = report["initializers"]
    external = ", external data" if weights["external"] else ""
    line(f"initializers: {weights['count']} ({weights['bytes']:,} bytes{external})")
    ops = table(f"{report['node_count']} nodes by op (subgraphs included)", ["domain", "op", "count"])
    for row in report["ops"]:
        ops.add_row(row["domain"], row["op"], str(row["count"]))
    out.print(ops)
    if report["functions"]:
        line("functions: " + ", ".join(report["functions"]))
    _print_details(out, report)
    if not report["provenance"]["packs"]:
        line("no provenance metadata (not exported by opreg)")
    for problem in report["problems"]:
        line(f"unusable: {problem}", "red")
    if report["usable"]:
        line("usable: onnx.checker accepts the model with its data", "green")
    return code


def _print_details(out: Any, report: dict[str, Any]) -> None:
    """The tables of subgraphs, capture patches, pack faults and provenance, where the model has them."""
    if report["subgraphs"]:
        subgraphs = table("subgraphs", ["owner", "op", "attribute", "nodes", "torch op", "where", "packs"])
        for row in report["subgraphs"]:
            where = " at ".join(p for p in (row["module"], row["source"]) if p)
            packs = ", ".join(f"{p} {n}" for p, n in sorted(row["packs"].items()))
            subgraphs.add_row(
                row["owner"], row["op"], row["attribute"], str(row["nodes"]), row["torch_op"], where, packs
            )
        out.print(subgraphs)
    if report["capture_patches"]:
        columns = ["patch", "patches", "written for", "installed", "calls"]
        patches = table("capture patches applied while capturing", columns)
        for entry in report["capture_patches"]:
            patches.add_row(*(str(entry.get(key, "")) for key in _PATCH_KEYS))
        out.print(patches)
    if report["pack_faults"]:
        faults = table("packs' faults worked around while exporting", ["pack", "what", "name", "detail"])
        for entry in report["pack_faults"]:
            faults.add_row(*(str(entry.get(key, "")) for key in ("pack", "kind", "name", "detail")))
        out.print(faults)
    if report["provenance"]["packs"]:
        provenance = table("provenance", ["pack", "torch op", "onnx nodes"])
        for row in report["provenance"]["torch_ops"]:
            provenance.add_row(row["pack"], row["torch_op"], str(row["nodes"]))
        out.print(provenance)
