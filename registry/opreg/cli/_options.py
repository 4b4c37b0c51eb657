"""The options several commands share, as argparse parent parsers (:class:`Parents`), the
arguments that name a model (:func:`add_model`, :func:`add_dynamic`), and the parser of a command
that captures one (:func:`add_model_command`)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

_MODEL_HELP = (
    "path/to/file.py:factory (opreg runs that file, with its folder first on sys.path, as Python runs a "
    "script) or package.module:factory (imported); factory() returns (module, args[, kwargs])"
)
_DYNAMIC_HELP = (
    "dynamic dims of a forward input: NAME:DIM=LABEL[,DIM=LABEL] (repeatable), e.g. x:0=batch (its example size "
    "may be 1); or 'auto': every dim of every tensor input, the ones torch.export fixes reported"
)


_SOURCE_HELP = (
    "a checkpoint folder (its library and task inferred by the installed packs' loaders), a hub id (owner/name, "
    "resolved by huggingface_hub), or " + _MODEL_HELP
)


def add_model(parser: argparse.ArgumentParser, *, checkpoints: bool = False) -> None:
    """``MODEL``: the factory of the model a command exports or checks (:mod:`opreg.cli._modelspec`);
    ``checkpoints``: or a checkpoint folder or hub id (``SOURCE``, :mod:`opreg.checkpoint.source`)."""
    if checkpoints:
        parser.add_argument("model", metavar="SOURCE", help=_SOURCE_HELP)
    else:
        parser.add_argument("model", metavar="MODEL", help=_MODEL_HELP)


def add_dynamic(parser: argparse.ArgumentParser) -> None:
    """``--dynamic NAME:DIM=LABEL``: the model's dynamic dims."""
    parser.add_argument("--dynamic", action="append", default=[], metavar="SPEC", help=_DYNAMIC_HELP)


def add_model_command(
    subparsers: argparse._SubParsersAction, parents: Parents, name: str, help: str, *, checkpoints: bool = False
) -> argparse.ArgumentParser:
    """The parser of a command that captures a model (``check``, ``export``): ``MODEL`` (``SOURCE``
    with ``checkpoints``), ``--dynamic``, and the output, pack, target and patch options."""
    parser = subparsers.add_parser(
        name, parents=[parents.output, parents.packs, parents.target, parents.patches], help=help
    )
    add_model(parser, checkpoints=checkpoints)
    add_dynamic(parser)
    return parser


@dataclasses.dataclass(frozen=True)
class Parents:
    """The parent parsers a command's parser may take (``parents=[parents.output, ...]``).

    Attributes:
        output: ``--json``, ``--debug``.
        packs: ``-p NAME``, ``--prefer OP=PACK``, ``--strict``.
        target: ``--target``/``-t`` (default ``onnx``).
        patches: ``--no-patches``, ``--no-patch NAME``.
        cache: ``--no-cache``.
    """

    output: argparse.ArgumentParser
    packs: argparse.ArgumentParser
    target: argparse.ArgumentParser
    patches: argparse.ArgumentParser
    cache: argparse.ArgumentParser

    @classmethod
    def build(cls) -> Parents:
        return cls(_output_options(), _pack_options(), _target_options(), _patch_options(), _cache_options())


def _output_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    parent.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return parent


def _pack_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "-p", dest="plugin_args", action="append", default=[], metavar="NAME",
        help="load pack NAME (needed when OPREG_DISABLE_PLUGIN_AUTOLOAD=1); -p no:NAME leaves it out",
    )  # fmt: skip
    parent.add_argument(
        "--prefer", action="append", default=[], metavar="OP=PACK",
        help="when packs tie on OP, use PACK's impl (by default the core pack wins a tie)",
    )  # fmt: skip
    parent.add_argument(
        "--strict", action="store_true",
        help="fail if a selected pack fails, packs tie, or (export) a pack's rewrite raises or breaks the graph",
    )  # fmt: skip
    return parent


def _options(*flags: str, **settings: Any) -> argparse.ArgumentParser:
    """A parent parser holding one option."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(*flags, **settings)
    return parent


def _cache_options() -> argparse.ArgumentParser:
    return _options(
        "--no-cache", action="store_true",
        help="load the packs instead of reading what they declare from opreg's cache (see OPREG_NO_CACHE)",
    )  # fmt: skip


def _target_options() -> argparse.ArgumentParser:
    return _options(
        "--target", "-t", default="onnx",
        help="a profile (onnx, onnxruntime, ...; a ceiling: the model imports the opset its nodes need), an "
        "ONNX Runtime release (onnxruntime==1.22, onnx@onnxruntime==1.22), an ai.onnx version (18, pinned), or "
        "domain=version items (onnx,com.microsoft=1); default: onnx",
    )  # fmt: skip


def _patch_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--no-patches", dest="patches", action="store_false",
        help="capture the model's own code: install none of the packs' capture patches",
    )  # fmt: skip
    parent.add_argument(
        "--no-patch", dest="exclude_patches", action="append", default=[], metavar="NAME",
        help="leave out capture patch NAME (pack:name, as `opreg explain` lists them; repeatable)",
    )  # fmt: skip
    return parent
