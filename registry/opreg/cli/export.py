"""``opreg export``: export a model to an ONNX file, with progress, and verify it on request; or a
checkpoint folder (or hub id) into a folder, as the installed packs' loaders plan it
(:func:`opreg.export_checkpoint`), verified by default."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opreg.cli._common import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    UsageError,
    console,
    export_settings,
    load_model,
    missing_table,
    one_line,
    packs,
    print_fixed_dims,
    print_json,
    report_failed_packs,
    short_source,
    styled,
    table,
    warn_conflicts,
    warn_hook_failures,
)
from opreg.cli._options import Parents, add_model_command

LOCATE_ROWS = 12
"""How many nodes out of tolerance ``export --locate``'s table shows (suspects first)."""


def add_parser(subparsers: argparse._SubParsersAction, parents: Parents) -> None:
    p = add_model_command(
        subparsers, parents, "export", help="export a checkpoint folder, or a model from a factory, to ONNX",
        checkpoints=True,
    )  # fmt: skip
    p.add_argument(
        "-o", "--output", required=True, metavar="FILE|DIR",
        help="the .onnx file to write (a factory), or the folder (a checkpoint; created if missing, written whole)",
    )  # fmt: skip
    p.add_argument(
        "--verify", action=argparse.BooleanOptionalAction, default=None,
        help="run the model and compare with eager PyTorch (default: on for a checkpoint, at two sizes of its "
        "dynamic dims, with its loader's loop checks; off for a factory)",
    )  # fmt: skip
    p.add_argument(
        "--task", metavar="TASK",
        help="a checkpoint: the task to export (feature-extraction, fill-mask, ...; default: inferred from the folder)",
    )  # fmt: skip
    p.add_argument(
        "--library", metavar="NAME",
        help="a checkpoint: the loader to use when several recognise it (a library, a loader, or pack:loader)",
    )  # fmt: skip
    p.add_argument(
        "--layout", metavar="LAYOUT",
        help="a checkpoint whose export writes several layouts (a causal LM): optimum (its default) or genai",
    )  # fmt: skip
    p.add_argument(
        "--locate", action="store_true",
        help="with --verify, on a mismatch compare every intermediate value and name the impl or rule at fault",
    )  # fmt: skip
    p.add_argument(
        "--rtol", type=float, default=None,
        help="--verify's relative tolerance (default: by each output's dtype, torch.testing's: float32 1.3e-6, "
        "float16 1e-3, bfloat16 1.6e-2)",
    )  # fmt: skip
    p.add_argument(
        "--atol", type=float, default=None,
        help="--verify's absolute tolerance (default: by each output's dtype, torch.testing's: 1e-5 for "
        "float32, float16 and bfloat16)",
    )  # fmt: skip
    p.add_argument("--keep-functions", action="store_true", help="keep script impls as model-local functions")
    p.add_argument(
        "--embed-functions", action="store_true",
        help="add the packs' ONNX function definitions of the custom ops the model uses, so runtimes without "
        "the packs' kernels run it (ONNX Runtime a model that mixes com.microsoft ops with a pack's)",
    )  # fmt: skip
    p.add_argument(
        "--keep-weights", action="store_true",
        help="keep every weight as the state_dict has it (no batch norm folded, no weight stored transposed)",
    )  # fmt: skip
    p.add_argument(
        "--external-data", action="store_true",
        help="write weights to a side file FILE.<token>.data the model names (weights of up to 256 bytes stay inline)",
    )  # fmt: skip
    p.add_argument(
        "--weights", metavar="CHECKPOINT",
        help="the values of a meta-device model's weights: a safetensors file or a folder of them, read as the "
        "model is written (weights=)",
    )  # fmt: skip
    p.add_argument(
        "--keep-float32", action="store_true",
        help="compute in float32 the bfloat16 ops ONNX Runtime's CPU provider has no kernel for (MatMul, Gemm, "
        "Add, ...), each input cast from bfloat16 and each result back (keep_float32=)",
    )  # fmt: skip
    p.add_argument(
        "--input-names", metavar="A,B", type=_names, default=None,
        help="a factory: names for the ONNX inputs in order, the tensors among forward's inputs flattened "
        "(input_names=, as torch.onnx.export takes them)",
    )  # fmt: skip
    p.add_argument(
        "--output-names", metavar="A,B", type=_names, default=None,
        help="a factory: names for the ONNX outputs in order (output_names=)",
    )  # fmt: skip
    p.add_argument(
        "--state", choices=("error", "io", "drop"), default="error",
        help="a model that updates buffers or inputs in forward: refuse it (error, default), export each as an "
        "input and an output (io), or leave the updates out (drop)",
    )  # fmt: skip
    p.set_defaults(run=run)


def _names(text: str) -> list[str]:
    """``--input-names a,b``: the names, in order."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: write the names separated by commas, e.g. input_ids,mask")
    return names


def run(args: argparse.Namespace) -> int:
    from opreg.checkpoint.source import is_factory
    from opreg.errors import OpregError, UnsupportedOpsError, VerificationError
    from opreg.exporter._save import check_output_path

    if not is_factory(args.model):
        return _run_checkpoint(args)
    if args.task or args.library or args.layout:
        raise UsageError(f"--task, --library and --layout are for a checkpoint folder; {args.model} names a factory")
    args.verify = bool(args.verify)
    err = console(stderr=True)
    loaded_packs = packs(args)
    reg = loaded_packs.registry
    target = reg.target(args.target)
    check_output_path(args.output, external_data=args.external_data)  # before the export, not after it
    report_failed_packs(reg, args)
    warn_conflicts(reg)
    started = time.perf_counter()
    with err.status("loading the model") as status:
        stages = _Stages(err, status)
        loaded, dynamic = load_model(args)
        try:
            program, path, result = _export(args, loaded_packs, target, loaded, dynamic, stages)
        except UnsupportedOpsError as e:
            return _unsupported(err, status, e, target)
        except VerificationError as e:
            status.stop()
            return _mismatch(args, err, e)
        except OpregError as e:
            if stages.current != "verify":
                raise
            status.stop()
            return _unverified(args, e)
        except KeyboardInterrupt as e:
            status.stop()
            sys.stderr.write(f"opreg: interrupted: {_interrupted_export(e, stages.current, args)}\n")
            return EXIT_INTERRUPTED
    warn_hook_failures(loaded_packs.host)
    return _report(args, err, program, path, result, started)


_FACTORY_ONLY = (
    ("dynamic", []), ("weights", None), ("external_data", False), ("locate", False), ("input_names", None),
    ("output_names", None),
)  # fmt: skip
"""Flags for a factory only, with their defaults: for a checkpoint, its loader decides the dims and weights."""


def _run_checkpoint(args: argparse.Namespace) -> int:
    """``opreg export SOURCE -o DIR`` for a checkpoint folder or hub id: :func:`opreg.export_checkpoint`."""
    from opreg.checkpoint import export_checkpoint
    from opreg.errors import UnsupportedOpsError, VerificationError

    for flag, default in _FACTORY_ONLY:
        if getattr(args, flag) != default:
            raise UsageError(
                f"--{flag.replace('_', '-')} is for a factory (file.py:make); a checkpoint's loader decides its "
                "models' dims, weights and files"
            )
    err = console(stderr=True)
    loaded_packs = packs(args)
    target = loaded_packs.registry.target(args.target)
    report_failed_packs(loaded_packs.registry, args)
    warn_conflicts(loaded_packs.registry)
    started = time.perf_counter()
    with err.status(f"exporting {args.model}...") as status:
        stages = _Stages(err, status)
        settings = export_settings(
            args, loaded_packs, target, None, inline=not args.keep_functions, fold_weights=not args.keep_weights,
            state=args.state, progress=stages, embed_functions=args.embed_functions,
        )  # fmt: skip
        try:
            result = export_checkpoint(
                args.model, args.output, task=args.task, library=args.library, layout=args.layout,
                verify=args.verify is not False, settings=settings,
            )  # fmt: skip
        except UnsupportedOpsError as e:
            return _unsupported(err, status, e, target)
        except VerificationError as e:
            status.stop()
            err.print(styled(f"wrote {args.output}, but {e}", "red"), soft_wrap=True)
            return EXIT_FINDINGS
        except KeyboardInterrupt as e:
            status.stop()
            sys.stderr.write(f"opreg: interrupted: {_interrupted_folder(e, args)}\n")
            return EXIT_INTERRUPTED
        stages("")
    warn_hook_failures(loaded_packs.host)
    return _report_checkpoint(args, result, time.perf_counter() - started)


def _report_checkpoint(args: argparse.Namespace, result: Any, seconds: float) -> int:
    """What a checkpoint's export wrote and verified, as JSON or lines."""
    from opreg.registry.targets import domain_label

    def ir(program: Any) -> Any:  # an OnnxProgram's model; a post-step's (a merged decoder) is one already
        return getattr(program, "model", program)

    def opsets(program: Any) -> dict[str, int]:
        return {domain_label(d): v for d, v in sorted(ir(program).opset_imports.items())}

    models = [
        {"name": m.name, "file": m.file, "nodes": len(ir(m.program).graph), "opsets": opsets(m.program),
         "verified": [dataclasses.asdict(c) for v in m.verified for c in v.outputs]}
        for m in result.models
    ]  # fmt: skip
    if args.json:
        print_json({
            "folder": str(result.folder), "source": result.source, "loader": result.loader, "library": result.library,
            "task": result.task, "inferred": result.inferred, "evidence": result.evidence, "models": models,
            "files": list(result.files), "verified": result.verified, "checks": list(result.checks),
            "others": list(result.others), "notes": list(result.notes),
        })  # fmt: skip
        return EXIT_OK
    out = console()
    how = f"inferred from {result.evidence}; --task to choose" if result.inferred else "asked"
    out.print(f"{result.loader}: {result.library}, task {result.task} ({how})", markup=False, soft_wrap=True)
    if result.others:
        out.print(f"also recognised by {', '.join(result.others)} (--library to choose)", markup=False)
    for note in result.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    for model in models:
        labels = ", ".join(f"{d}={v}" for d, v in model["opsets"].items())
        out.print(f"wrote {model['file']} ({model['nodes']} nodes; opsets {labels})", markup=False)
    out.print(f"wrote {result.folder} in {seconds:.1f} s: {', '.join(result.files)}", markup=False, soft_wrap=True)
    if result.verified:
        checks = [c for m in result.models for v in m.verified for c in v.outputs]
        worst = max((c.max_abs for c in checks), default=0.0)
        out.print(
            f"verified: {len(result.models)} model(s) match eager PyTorch at two sizes of their dynamic dims "
            f"(max abs {worst:.3g})",
            markup=False,
        )
    for check in result.checks:
        out.print(f"checked {check}", markup=False, soft_wrap=True)
    return EXIT_OK


def _interrupted_folder(error: KeyboardInterrupt, args: argparse.Namespace) -> str:
    from opreg.errors import InterruptedAfterSave

    if isinstance(error, InterruptedAfterSave):
        return f"{args.output} holds the new folder (written before the interrupt)"
    return f"{args.output} was not changed" if os.path.lexists(args.output) else "nothing was written"


def _unsupported(err: Any, status: Any, error: Any, target: Any) -> int:
    """Ops no impl covers: the table of them, and exit 1 (the command found a problem)."""
    status.stop()
    missing_table(err, error.missing, target)
    err.print(styled(f"export failed: {len(error.missing)} op(s) have no impl at target {target}", "red"))
    return EXIT_FINDINGS


class _Stages:
    """The export's ``progress``: says how long each stage took, and shows the next one."""

    def __init__(self, err: Any, status: Any) -> None:
        self.err, self.status = err, status
        self.current, self.started = "load", time.perf_counter()

    def __call__(self, name: str) -> None:
        self.err.print(styled(f"done {self.current} ({time.perf_counter() - self.started:.2f} s)", "green"))
        self.current, self.started = name, time.perf_counter()
        self.status.update(f"{name}...")


def _export(args: argparse.Namespace, packs: Any, target: Any, loaded: Any, dynamic: Any, stage: _Stages) -> Any:
    """Export, save and (``--verify``) verify: ``(program, path, verification or None)``."""
    from opreg import exporter

    settings = export_settings(
        args, packs, target, dynamic, inline=not args.keep_functions, fold_weights=not args.keep_weights,
        state=args.state, progress=stage, embed_functions=args.embed_functions, weights=args.weights,
        keep_float32=args.keep_float32, input_names=args.input_names, output_names=args.output_names,
    )  # fmt: skip
    program = exporter.export(loaded.module, loaded.args, loaded.kwargs, settings=settings)
    for joined in program.joined_domains:  # before the save and the verify, which may fail
        stage.err.print(styled(f"note: {joined.note}", "yellow"), soft_wrap=True)
    stage("save")
    path = program.save(args.output, external_data=True if args.external_data else None)
    result = None
    if args.verify:
        stage("verify")
        result = program.verify(*loaded.args, rtol=args.rtol, atol=args.atol, locate=args.locate, **loaded.kwargs)
    stage("")
    return program, path, result


def _unverified(args: argparse.Namespace, error: Exception) -> int:
    """The model was written, and could not be run to verify it (ONNX Runtime refused it): say both."""
    if args.json:
        print_json({"file": str(Path(args.output).resolve()), "verified": False, "error": one_line(error)})
    else:
        sys.stderr.write(f"opreg: error: wrote {args.output}, but could not verify it: {one_line(error)}\n")
    return EXIT_ERROR


def _mismatch(args: argparse.Namespace, err: Any, error: Any) -> int:
    """A saved model that does not match eager PyTorch: the outputs out of tolerance, and with
    ``--locate`` the nodes at fault."""
    location = getattr(error, "location", None)
    if args.json:
        checks = [dataclasses.asdict(c) for c in error.results]
        print_json({
            "file": str(Path(args.output).resolve()), "verified": False, "outputs": checks,
            "location": location.to_dict() if location is not None else None,
        })  # fmt: skip
        return EXIT_FINDINGS
    if location is None:
        err.print(styled(f"wrote {args.output}, but it does not match eager PyTorch:\n{error}", "red"))
        if args.verify and not args.locate:
            err.print("rerun with --locate to find the impl or rewrite rule at fault")
        return EXIT_FINDINGS
    lines = "\n".join(f"  {c}" for c in error.results if not c.ok)
    err.print(styled(f"wrote {args.output}, but it does not match eager PyTorch:\n{lines}", "red"))
    _location_table(console(), location)
    return EXIT_FINDINGS


def _report(args: argparse.Namespace, err: Any, program: Any, path: Any, result: Any, started: float) -> int:
    """What was written (and verified), as JSON or lines."""
    from opreg.exporter._save import INLINE_LIMIT_BYTES, referenced_data
    from opreg.registry.targets import domain_label
    from opreg.registry.versions import opsets_text

    if args.json:
        print_json({
            "file": str(Path(path).resolve()), "nodes": len(program.model.graph),
            "opsets": {domain_label(d): v for d, v in sorted(program.model.opset_imports.items())},
            "opset_floors": program.opset_floors,
            "verified": bool(args.verify) or None,
            "outputs": [dataclasses.asdict(c) for c in result.outputs] if args.verify else [],
            "pack_faults": [f.record() for f in program.pack_faults],
            "fixed_dims": [dataclasses.asdict(f) for f in program.fixed_dims],
            "shape_guards": [dataclasses.asdict(g) for g in program.shape_guards],
            "grown_dims": [dataclasses.asdict(g) for g in program.grown_dims],
            "refined_dims": [dataclasses.asdict(r) for r in program.refined_dims],
        })  # fmt: skip
        return EXIT_OK
    opsets = opsets_text(
        {domain_label(d): v for d, v in sorted(program.model.opset_imports.items())}, program.opset_floors
    )
    out = console()
    out.print(
        f"wrote {path} ({len(program.model.graph)} nodes; opsets {opsets}) in {time.perf_counter() - started:.1f} s",
        markup=False,
    )
    _print_patches(out, program.capture_patches)
    print_fixed_dims(out, [dataclasses.asdict(f) for f in program.fixed_dims])
    for note in (*program.grown_dims, *program.refined_dims):
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    if args.external_data and not referenced_data(path):
        out.print(
            f"note: no weight is over {INLINE_LIMIT_BYTES} bytes, so every weight is inside {path} "
            "and --external-data wrote no data file",
            markup=False,
            soft_wrap=True,
        )
    if args.verify:
        worst = max((o.max_abs for o in result.outputs), default=0.0)
        out.print(
            f"verified with {result.runtime}: {len(result.outputs)} output(s) match eager PyTorch "
            f"(max abs {worst:.3g}; {result.tolerances()})",
            markup=False,
        )
    return EXIT_OK


def _location_table(out: Any, location: Any) -> None:
    """``program.locate``'s report: the nodes out of tolerance, the suspects first, then the verdict."""
    from opreg.exporter.diagnosis.report import tolerance_text

    rows = sorted(location.divergences, key=lambda d: (not d.faulty, not d.first))[:LOCATE_ROWS]
    nodes = table(
        f"where it goes wrong ({location.compared} values compared with eager, {location.runtime}, "
        f"{tolerance_text(location.rtol, location.atol)})",
        ["node", "torch op", "impl / rule", "impl at", "model line", "error", "alone", "verdict"],
        whole=["impl / rule", "impl at"],
    )
    for d in rows:
        verdict = "WRONG" if d.faulty else ("first" if d.first else "carried")
        alone = _times(d.local.ratio) if d.local is not None else "?"
        nodes.add_row(
            d.node, d.torch_op, d.suspect, short_source(d.impl_source), short_source(d.source) or d.module,
            _times(d.error.ratio), alone, styled(verdict, "red" if d.faulty else ""),
        )  # fmt: skip
    out.print(nodes)
    if len(location.divergences) > len(rows):
        out.print(f"... and {len(location.divergences) - len(rows)} more node(s) out of tolerance (--json lists all)")
    out.print(styled(location.summary(), "red" if location.verdict == "fault" else "yellow"), markup=False)
    out.print("error: x the tolerance (atol + rtol * |eager|); alone: the node on the model's own inputs to it")


def _times(ratio: float) -> str:
    return "inf" if ratio == float("inf") else f"{ratio:.3g} x"


def _print_patches(out: Any, outcomes: Sequence[Any]) -> None:
    """The capture patches an export applied (one that failed is a pack fault: a ``warning:`` line,
    as every :class:`opreg.PackWarning` of a command is)."""
    from opreg.packs.patching import APPLIED

    applied = [o for o in outcomes if o.status == APPLIED]
    if applied:
        names = ", ".join(o.label + (f" ({o.calls} calls)" if o.calls is not None else "") for o in applied)
        out.print(f"capture patches applied: {names}", markup=False)


def _interrupted_export(error: KeyboardInterrupt, stage: str, args: argparse.Namespace) -> str:
    """What an interrupt of ``opreg export`` during ``stage`` left at the output path."""
    from opreg.errors import InterruptedAfterSave

    if isinstance(error, InterruptedAfterSave) or stage in ("verify", ""):
        return f"{args.output} holds the new model (saved before the interrupt){', not verified' * args.verify}"
    return f"{args.output} was not changed" if os.path.lexists(args.output) else "nothing was written"
