"""The shape of the code, kept by checks: import contracts, no private names across
modules, no repeated blocks of code."""

from __future__ import annotations

import ast
import dataclasses
import io
import keyword
import re
import subprocess
import sys
import tokenize
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "registry", ROOT / "core_ops")
MIN_DUPLICATE_LINES = 6


def python_files() -> list[Path]:
    return sorted(p for folder in SOURCES for p in folder.rglob("*.py"))


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT)
    parts = list(relative.with_suffix("").parts[1:])  # registry/opreg/x.py -> opreg.x
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_import_contracts_are_kept():
    """pyproject.toml's [tool.importlinter] contracts: no cycles among opreg's modules, opreg is one
    stack of layers (each importing only those below it), the exporter's stages import one way, and the
    core pack imports opreg's public API only."""
    command = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 kept, 0 broken" in done.stdout
    # imports under `if TYPE_CHECKING:` count too: a circle of type-only imports is a circle
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert settings["exclude_type_checking_imports"] is False


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _first_party(module: str) -> bool:
    return module == "opreg" or module.startswith(("opreg.", "opreg_core_ops"))


def private_uses(path: Path) -> list[str]:
    """The private names of other first-party modules that ``path`` uses (see :func:`private_uses_in`)."""
    return private_uses_in(path.read_text(), module_name(path), is_package=path.name == "__init__.py")


def private_uses_in(source: str, here: str, *, is_package: bool = False) -> list[str]:
    """Private names of first-party modules other than ``here`` that ``source`` uses, in any of
    these forms: ``from opreg.x import _name`` (relative ``from ._x import _name`` too), and
    ``_name`` reached through a module bound here, however it was bound (``import opreg.x._y``,
    ``import opreg.x as y``, ``from opreg import x``, ``from . import x``) and however long the
    chain (``opreg.exporter._save._pause``, ``exporter._save._pause``, ``plugins.REPORTS._cache``).
    Private *modules* (``opreg.exporter._plan``) may be named: what they hold may not."""
    tree = ast.parse(source)
    package = here if is_package else here.rpartition(".")[0]
    modules: dict[str, str] = {}  # local name -> first-party module it is bound to
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            if base is None or not _first_party(base):
                continue
            for alias in node.names:
                dotted = f"{base}.{alias.name}"
                if _is_module(dotted):
                    modules[alias.asname or alias.name] = dotted
                elif _private(alias.name) and base != here:
                    found.append((node.lineno, f"imports {dotted}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _first_party(alias.name):  # `import a.b.c` binds a; `import a.b.c as d` binds d to a.b.c
                    modules[alias.asname or alias.name.partition(".")[0]] = (
                        alias.name if alias.asname else (alias.name.partition(".")[0])
                    )
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        chain = _chain(node)
        if not chain or chain[0] not in modules:
            continue
        module, rest = modules[chain[0]], chain[1:]
        while rest and _is_module(f"{module}.{rest[0]}"):
            module, rest = f"{module}.{rest[0]}", rest[1:]
        if module != here and any(_private(name) and name not in PUBLIC_UNDERSCORED for name in rest):
            found.append((node.lineno, f"uses {module}.{'.'.join(rest)}"))
    return [f"{here}:{line}: {what}" for line, what in sorted(found)]


PUBLIC_UNDERSCORED = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
"""Public API that starts with an underscore: namedtuple's methods."""


def _absolute(module: str | None, level: int, package: str) -> str | None:
    """The absolute module an ``ImportFrom`` names (``from ..x import y`` in package ``a.b.c``: ``a.b.x``)."""
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else [])) or None


def _chain(node: ast.Attribute) -> list[str]:
    """``a.b.c`` as ``["a", "b", "c"]``; ``[]`` when the chain does not start at a plain name."""
    names = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        names.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return []
    return [current.id, *reversed(names)]


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of this repository."""
    top, _, rest = dotted.partition(".")
    base = ROOT / ("registry" if top == "opreg" else "core_ops") / top
    path = base.joinpath(*rest.split(".")) if rest else base
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_no_private_name_is_used_across_modules():
    """A ``_private`` name is its module's business: another module uses the public name
    (private *modules*, such as ``opreg.exporter._plan``, may be imported inside the package)."""
    found = [use for path in python_files() for use in private_uses(path)]
    assert not found, "private names used across modules:\n" + "\n".join(found)


PROBE = """
from opreg.exporter._recorder import _infer
from opreg.packs import plugins
plugins._warned
from ._recorder import _infer as infer
from ..packs import plugins as loader
loader._warned
from . import _save
_save._pause
import opreg.exporter._save
opreg.exporter._save._pause("staged")
import opreg.exporter as exporter_package
exporter_package._save._pause
from opreg import exporter
exporter._save._pause
plugins.REPORTS._cache
plugins.ENTRY_POINT_GROUP
exporter._plan
from ._plan import plan_nodes
_save.save_model
"""
"""Every form of a private use the lint must catch (a module in ``opreg.exporter`` is speaking),
then uses it must let be: public names, private *modules*."""


def test_the_private_name_check_catches_every_form():
    """The probe is checked as text, as if it were ``opreg/exporter/_probe.py``: nothing is written
    into the source tree."""
    found = [use.split(": ", 1)[1] for use in private_uses_in(PROBE, "opreg.exporter._probe")]
    assert found == [
        "imports opreg.exporter._recorder._infer",
        "uses opreg.packs.plugins._warned",
        "imports opreg.exporter._recorder._infer",
        "uses opreg.packs.plugins._warned",
        "uses opreg.exporter._save._pause",
        "uses opreg.exporter._save._pause",
        "uses opreg.exporter._save._pause",
        "uses opreg.exporter._save._pause",
        "uses opreg.packs.plugins.REPORTS._cache",
    ]
    assert private_uses_in("from ._x import _y\n_z = 1\n_z\n", "opreg._x") == []  # a module's own names


_TRIVIAL = re.compile(r"^[\s()\[\]{},:]*$")
_SKIPPED_TOKENS = {
    tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER
}  # fmt: skip
_CONSTANT_NAMES = {"True", "False", "None"}


@dataclasses.dataclass(frozen=True)
class CodeLine:
    """One line of code: its number, its text (white space folded) and its shape, the tokens
    with literals abstracted (``0``, ``S``) and with names of values marked ``None``, to be
    numbered consistently within a window (attribute names and called names are kept: they
    say what the code does; renaming a variable must not change the shape)."""

    number: int
    text: str
    shape: tuple[str | None, ...]
    names: tuple[str, ...]
    loose: tuple[str | None, ...] = ()
    identifiers: tuple[str, ...] = ()
    """``loose``: the shape with every identifier marked ``None``, the called and attribute names
    too; ``identifiers``: those names in order (see :func:`_normalized`)."""


def code_lines(source: str) -> list[CodeLine]:
    """The lines of ``source`` that are code: no blank lines, comments, docstrings, the text of
    multi-line strings (the templates of the files ``opreg new-pack`` writes), imports,
    decorators, lone brackets, function signatures (impls mirror ATen schemas, and two
    functions may rightly take the same parameters) or field declarations of a class
    (``name: type``, the same reason)."""
    tree = ast.parse(source)
    skipped = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                skipped.update(range(body[0].lineno, body[0].end_lineno + 1))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            skipped.update(range(node.lineno, node.body[0].lineno))  # the signature
        if isinstance(node, ast.ClassDef):
            for field in node.body:
                if isinstance(field, ast.AnnAssign) and field.value is None:
                    skipped.update(range(field.lineno, field.end_lineno + 1))
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in _SKIPPED_TOKENS]
    for token in tokens:  # the lines a multi-line string literal goes on to are its text (a template), not code
        if token.type == tokenize.STRING and token.end[0] > token.start[0]:
            skipped.update(range(token.start[0] + 1, token.end[0] + 1))
    shapes: dict[int, list[tuple[str | None, str, bool]]] = defaultdict(list)  # (shape, value name, identifier)
    for i, token in enumerate(tokens):
        before = tokens[i - 1].string if i else ""
        after = tokens[i + 1].string if i + 1 < len(tokens) else ""
        if token.type == tokenize.NAME and not keyword.iskeyword(token.string) and token.string not in _CONSTANT_NAMES:
            kept = before == "." or after == "("
            shapes[token.start[0]].append((token.string, "", True) if kept else (None, token.string, True))
        elif token.type == tokenize.NUMBER:
            shapes[token.start[0]].append(("0", "", False))
        elif token.type == tokenize.STRING:
            shapes[token.start[0]].append(("S", "", False))
        else:
            shapes[token.start[0]].append((token.string, "", False))
    kept = []
    for number, line in enumerate(source.splitlines(), 1):
        text = " ".join(line.split("#")[0].split()) if "#" in line and '"' not in line else " ".join(line.split())
        if number in skipped or not text or text.startswith(("#", "import ", "from ", "@")) or _TRIVIAL.match(text):
            continue
        shape = shapes.get(number, [])
        kept.append(CodeLine(
            number, text, tuple(k for k, _, _ in shape), tuple(n for k, n, _ in shape if k is None),
            tuple(None if named else k for k, _, named in shape), tuple(k or n for k, n, named in shape if named),
        ))  # fmt: skip
    return kept


def _normalized(window: list[CodeLine], *, loose: bool = False) -> tuple[tuple[str, ...], int]:
    """A window's shape with the names of values numbered in order of first use (``v0``, ``v1``,
    ...), and how many distinct line shapes it has, names not numbered (a table of like entries
    has one or two; code has more), not counting the items of a call's keyword arguments or of a
    dict (a table of records is data, not code).

    ``loose``: every identifier is numbered, the called and attribute names too, so ``op.Add(x, y)``
    and ``op.Mul(a, b)`` are alike: code that differs only by the op it calls, or by a parameter."""
    numbers: dict[str, str] = {}
    lines, flat = [], set()
    for line in window:
        shape, names = (line.loose, iter(line.identifiers)) if loose else (line.shape, iter(line.names))
        lines.append(" ".join(k if k is not None else numbers.setdefault(next(names), f"v{len(numbers)}")
                              for k in shape))  # fmt: skip
        if not _ITEM.match(line.text):
            flat.add(shape)
    return tuple(lines), len(flat)


MIN_DISTINCT_SHAPES = 4
"""A window alike only in shape counts when it has this many distinct line shapes: below, it is
a table of like entries (registrations, constants, dict items), which reads best as it is."""

_ITEM = re.compile(r"^(\w+=(?!=)|\*\*\w+,?$|(['\"]).*\2: )")
"""A line that is one item of a call's keyword arguments or of a dict (``name=value,``, ``"key": value,``)."""


def enclosing_functions(source: str) -> dict[int, str]:
    """Line number -> the qualified name of the innermost function or class around it."""
    found: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                for line in range(child.lineno, child.end_lineno + 1):
                    found[line] = name
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def duplicated_blocks(sources: dict[str, str], size: int = MIN_DUPLICATE_LINES) -> list[frozenset[tuple[str, str]]]:
    """Places where ``size`` consecutive code lines repeat, in one file or across files: the same
    text, or the same shape once names and literals are abstracted (see :func:`_normalized`).
    Each duplicate is the set of ``(file, enclosing function)`` it stands in (``""`` at module level)."""
    seen: dict[tuple, set[tuple[str, int]]] = defaultdict(set)
    for name, source in sources.items():
        lines = code_lines(source)
        for i in range(len(lines) - size + 1):
            window = lines[i : i + size]
            seen["text", tuple(line.text for line in window)].add((name, window[0].number))
            shape, distinct = _normalized(window)
            if distinct >= MIN_DISTINCT_SHAPES:
                seen["shape", shape].add((name, window[0].number))
            loose, distinct = _normalized(window, loose=True)
            if distinct >= MIN_DISTINCT_SHAPES:
                seen["loose", loose].add((name, window[0].number))
    functions = {name: enclosing_functions(source) for name, source in sources.items()}
    found = {frozenset((name, functions[name].get(line, "")) for name, line in places)
             for places in seen.values() if len(places) > 1}  # fmt: skip
    return sorted(found, key=sorted)


def python_sources() -> dict[str, str]:
    """The framework's code and the first-party packs' (``plugins/*/``), their tests left out."""
    packs = [p for p in (ROOT / "plugins").rglob("*.py") if "tests" not in p.relative_to(ROOT).parts]
    return {str(path.relative_to(ROOT)): path.read_text() for path in [*python_files(), *sorted(packs)]}


KNOWN_DUPLICATES: dict[frozenset[tuple[str, str]], str] = {
    frozenset(
        {
            ("plugins/ort_contrib/opreg_ort_contrib/schemas.py", "_multi_head_attention_schema"),
            ("plugins/ort_contrib/opreg_ort_contrib/schemas.py", "_group_query_attention_schema"),
        }
    ): (
        "data, not logic: the declarations of MultiHeadAttention's and GroupQueryAttention's schemas "
        "(com.microsoft), each a list of _input(name, type, doc) records in the op's order; two ops with "
        "like inputs (query, key, value, past_key, past_value) are written alike. A list of the inputs they "
        "share would not make one declaration: only query, key and value stand at the same places, and each "
        "op documents them in its own terms ((batch, sequence, hidden) against heads * head size)"
    ),
}
"""Duplicates the check finds in the framework's and packs' code, each with why it stays. A new one
fails the test, and so does an entry that is no longer duplicated (remove it)."""


def test_no_block_of_six_lines_is_duplicated():
    found = duplicated_blocks(python_sources())
    new = [", ".join(f"{path}:{function}" for path, function in sorted(d)) for d in found if d not in KNOWN_DUPLICATES]
    assert not new, f"blocks of {MIN_DUPLICATE_LINES}+ code lines alike (in text or shape):\n" + "\n".join(new)
    gone = [sorted(d) for d in KNOWN_DUPLICATES if d not in found]
    assert not gone, f"KNOWN_DUPLICATES lists blocks that are no longer duplicated: remove them: {gone}"


_SIGNATURES = (
    "the signatures of impls of different ATen schemas, which the check skips: each body is one call of a "
    "shared helper, and one function cannot serve both, as the schemas differ in an argument's name or place, "
    "in number or in outputs (a Tensor against a Scalar is no reason: one impl serves both, annotated with the union)"
)
_SCALAR_OVERLOADS = (
    "rows of short impls, each serving an op's .Tensor and .Scalar overloads (its annotation their union: "
    "`other: Tensor | float`) with one call of a different helper or ONNX op: lt, le, gt, ge; eq, ne and fmod, "
    "remainder"
)
_FIELDS = "field declarations of frozen dataclasses (which the check skips), then a one-line __str__ or __post_init__"
_TABLE = "data: a table of names, records or constants"
_FLAGS = "argparse declarations of different flags; the flags commands share are one function already (cli/_options.py)"
_HOOKS = (
    "a pack's pluggy hookimpls: pluggy finds each by its name in the pack's own module, and each imports its "
    "module on first call (so `import opreg` stays cheap). A helper building them from a 'module:function' "
    "string was weighed and not taken: pluggy reads a hookimpl's arguments from its code, so a plain helper "
    "serves only the hooks without arguments (not opreg_register_ops, which every pack has) and each pack "
    "would mix two forms; and a string hides from readers, linters and editors the module the import names"
)

REPEATS_KEPT: dict[frozenset[tuple[str, str]], str] = {
    frozenset(pair): reason
    for reason, pairs in {
        _SIGNATURES: [
            (("core_ops/opreg_core_ops/ops/pooling.py", "aten_max_pool2d"),
             ("core_ops/opreg_core_ops/ops/pooling.py", "aten_max_pool2d_with_indices")),
            (("core_ops/opreg_core_ops/ops/onnx_ops.py", "onnx_symbolic_symbolic"),
             ("core_ops/opreg_core_ops/ops/onnx_ops.py", "onnx_symbolic_symbolic_multi_out")),
            (("core_ops/opreg_core_ops/ops/spectral.py", "aten_stft"),
             ("core_ops/opreg_core_ops/ops/spectral.py", "aten_stft_center")),
            (("core_ops/opreg_core_ops/ops/creation.py", "aten_to_copy"),
             ("core_ops/opreg_core_ops/ops/creation.py", "aten_to_dtype_layout")),
            (("core_ops/opreg_core_ops/ops/attention.py", "aten_scaled_dot_product_attention"),
             ("core_ops/opreg_core_ops/ops/onnx_ops.py", "onnx_attention")),
            (("core_ops/opreg_core_ops/ops/onnx_ops.py", "onnx_attention"),
             ("core_ops/opreg_core_ops/ops/spectral.py", "aten_stft")),
            (("core_ops/opreg_core_ops/ops/binning.py", "aten_searchsorted"),
             ("core_ops/opreg_core_ops/ops/binning.py", "aten_searchsorted_scalar")),
            (("core_ops/opreg_core_ops/ops/quantization.py", "aten_fake_quantize_per_channel_affine"),
             ("core_ops/opreg_core_ops/ops/quantization.py", "aten_fake_quantize_per_channel_affine_cachemask")),
            (("core_ops/opreg_core_ops/ops/onnx_ops.py", "onnx_rotary_embedding"),
             ("core_ops/opreg_core_ops/ops/quantization.py", "qd_quantize_per_channel")),
            (("core_ops/opreg_core_ops/ops/convolution.py", "aten_conv"),
             ("core_ops/opreg_core_ops/ops/embedding_bag.py", "aten_embedding_bag")),
        ],
        "the signatures of torchvision's roi_align and ps_roi_align, which the check skips: one function cannot "
        "serve both, as the schemas differ in number (roi_align's `aligned`); both average their bins with one "
        "helper (_bin_averages), and ps_roi_align then picks each output channel's bins": [
            (("plugins/torchvision/opreg_torchvision/ops.py", "torchvision_roi_align"),
             ("plugins/torchvision/opreg_torchvision/ops.py", "torchvision_ps_roi_align")),
        ],
        "one schema, two bodies: LayerNorm and its decomposition, a real and a complex _to_copy": [
            (("core_ops/opreg_core_ops/ops/normalization.py", "aten_layer_norm"),
             ("core_ops/opreg_core_ops/ops/normalization.py", "aten_layer_norm_decomposed")),
            (("core_ops/opreg_core_ops/ops/complex.py", "aten_to_copy_complex"),
             ("core_ops/opreg_core_ops/ops/creation.py", "aten_to_copy")),
        ],
        _SCALAR_OVERLOADS: [
            (("core_ops/opreg_core_ops/ops/comparison.py", "aten_lt"),
             ("core_ops/opreg_core_ops/ops/comparison.py", "aten_gt")),
            (("core_ops/opreg_core_ops/ops/comparison.py", "aten_eq"),
             ("core_ops/opreg_core_ops/ops/elementwise.py", "aten_fmod")),
        ],
        "rows of short impls, each one call of a different op or helper (a table of what each op is)": [
            (("core_ops/opreg_core_ops/ops/elementwise.py", "aten_acos"),
             ("core_ops/opreg_core_ops/ops/elementwise.py", "aten_sqrt")),
            (("core_ops/opreg_core_ops/ops/reduction.py", "aten_any"),
             ("core_ops/opreg_core_ops/ops/reduction.py", "aten_all")),
            (("core_ops/opreg_core_ops/ops/padding.py", "aten_reflection_pad"),
             ("core_ops/opreg_core_ops/ops/padding.py", "aten_replication_pad")),
        ],
        "public signatures: the same keyword options on two ways in, both forwarding to one body": [
            (("registry/opreg/registry/registrar.py", "Registrar.register"),
             ("registry/opreg/registry/registry.py", "Registry.register")),
            (("registry/opreg/llm/__init__.py", "export_decoder"),
             ("registry/opreg/llm/_decoder.py", "export_decoder")),
            (("registry/opreg/llm/__init__.py", "export_whisper"), ("registry/opreg/llm/__init__.py", "export_vision")),
            (("registry/opreg/llm/_vision.py", "export_vision"), ("registry/opreg/llm/_whisper.py", "export_whisper")),
            (("registry/opreg/packs/plugins.py", "build"), ("registry/opreg/packs/plugins.py", "build_registry")),
            (("registry/opreg/exporter/__init__.py", "plan_export"), ("registry/opreg/exporter/__init__.py", "export")),
            (("registry/opreg/exporter/_capture.py", "capture"), ("registry/opreg/exporter/_dynamic.py", "capture")),
            (("registry/opreg/exporter/__init__.py", "run_export"), ("registry/opreg/exporter/_dynamic.py", "capture")),
            (("registry/opreg/exporter/__init__.py", "run_export"), ("registry/opreg/exporter/_capture.py", "capture")),
        ],
        "keyword arguments passed on by name (name=name, ...), one per field of the value built": [
            (("registry/opreg/exporter/_finish.py", "finish"), ("registry/opreg/registry/impls.py", "build_impl")),
        ],
        _FIELDS: [
            (("registry/opreg/exporter/_dynamic.py", "FixedDim"), ("registry/opreg/exporter/_grown.py", "GrownDim")),
            (("registry/opreg/exporter/_dynamic.py", "FixedDim"),
             ("registry/opreg/exporter/diagnosis/compare.py", "OutputCheck")),
            (("registry/opreg/exporter/_dynamic.py", "FixedDim"),
             ("registry/opreg/testing/_kit_report.py", "CheckResult")),
            (("registry/opreg/exporter/_grown.py", "GrownDim"),
             ("registry/opreg/exporter/diagnosis/compare.py", "OutputCheck")),
            (("registry/opreg/exporter/_grown.py", "GrownDim"),
             ("registry/opreg/testing/_kit_report.py", "CheckResult")),
            (("registry/opreg/exporter/diagnosis/compare.py", "OutputCheck"),
             ("registry/opreg/testing/_kit_report.py", "CheckResult")),
            (("registry/opreg/exporter/diagnosis/report.py", "Divergence"),
             ("registry/opreg/exporter/diagnosis/report.py", "Location")),
            (("registry/opreg/testing/_kit_report.py", "CheckResult"),
             ("registry/opreg/testing/_samples.py", "SampleResult")),
        ],
        _TABLE: [
            (("registry/opreg/exporter/_nodes.py", "Kind"), ("registry/opreg/packs/hookchecks.py", "Checked")),
            (("registry/opreg/registry/explanation.py", "Candidate"), ("registry/opreg/packs/host.py", "PackHost")),
            (("registry/opreg/llm/_whisper_genai.py", ""), ("registry/opreg/llm/_whisper_genai.py", "")),
            (("plugins/torchvision/opreg_torchvision/patches.py", ""),
             ("plugins/torchvision/opreg_torchvision/patches.py", "")),
            (("plugins/ort_contrib/opreg_ort_contrib/schemas.py", "_group_query_attention_schema"),
             ("plugins/ort_contrib/opreg_ort_contrib/schemas.py", "_packed_attention_schema")),
        ],
        _FLAGS: [
            (("registry/opreg/cli/export.py", "add_parser"), ("registry/opreg/cli/llm.py", "add_parser")),
            (("registry/opreg/cli/export.py", "add_parser"), ("registry/opreg/cli/export.py", "add_parser")),
            (("registry/opreg/cli/_options.py", "_pack_options"), ("registry/opreg/cli/llm.py", "add_parser")),
            (("registry/opreg/cli/_options.py", "_pack_options"), ("registry/opreg/cli/export.py", "add_parser")),
        ],
        "a __repr__, then read-only properties each returning a different attribute (one line each)": [
            (("registry/opreg/llm/_vision.py", "VisionLanguage"), ("registry/opreg/packs/packset.py", "PackSet")),
        ],
        "the template of a new pack's __init__.py (text `opreg new-pack` writes), one hookimpl per hook": [
            (("registry/opreg/authoring/_packcode.py", "init"), ("registry/opreg/authoring/_packcode.py", "init")),
        ],
        _HOOKS: [
            (("plugins/ort_contrib/opreg_ort_contrib/__init__.py", "opreg_samples"),
             ("plugins/test_customop/opreg_test_customop/__init__.py", "opreg_schemas")),
            (("plugins/test_customop/opreg_test_customop/__init__.py", "opreg_schemas"),
             ("plugins/torchvision/opreg_torchvision/__init__.py", "opreg_samples")),
            (("plugins/ort_contrib/opreg_ort_contrib/__init__.py", "opreg_samples"),
             ("plugins/torchvision/opreg_torchvision/__init__.py", "opreg_samples")),
        ],
    }.items()
    for pair in pairs
}  # fmt: skip
"""Repeats of six lines a wider comparison finds (one that, unlike :func:`duplicated_blocks`, counts
signatures, field declarations and tables, and compares shapes more loosely), each kept with why: the
logic they hold is already one piece of code, or they are declarations and data. Each names its two
places by file and function (``""``: module level); a place that no longer exists fails
:func:`test_the_repeats_kept_name_places_that_exist`, so the list is pruned as the code changes. The
repeats that were logic were removed instead (one impl serves the overloads whose body is the same, each
annotation the union of what they pass: conv1d/2d/3d, the pads, the linear upsamplings, an op's .Tensor and
.Scalar overloads, the adaptive pools; the placement arguments an impl never reads are left out;
``ExportSettings`` checks its registry and host with one helper)."""


def test_the_repeats_kept_name_places_that_exist():
    missing = []
    for pair in REPEATS_KEPT:
        for path, function in pair:
            source = (ROOT / path).read_text()
            if function and function not in set(enclosing_functions(source).values()):
                missing.append(f"{path}:{function}")
    assert not missing, f"REPEATS_KEPT names places that are gone: update or remove their entries: {missing}"


ORIGINAL = """
def f(values, scale):
    total = 0
    for value in values:
        if value > scale:
            total += value * scale
        else:
            total -= value
    result = total / len(values)
    return round(result, 2)
"""


def test_the_duplicate_check_catches_copies_renamed_and_with_other_literals():
    renamed = ORIGINAL
    for old, new in [("values", "items"), ("scale", "factor"), ("total", "acc"), ("value", "item"), ("result", "out")]:
        renamed = re.sub(rf"\b{old}\b", new, renamed)
    relabelled = ORIGINAL.replace("total = 0", "total = 1").replace("2)", "3)").replace("def f(", "def h(")
    for copy, function in [(ORIGINAL.replace("def f", "def g"), "g"), (renamed, "f"), (relabelled, "h")]:
        assert duplicated_blocks({"one.py": ORIGINAL, "two.py": copy}) == [
            frozenset({("one.py", "f"), ("two.py", function)})
        ], copy
    other = ORIGINAL.replace("value * scale", "max(value, scale)")  # in every window: another computation
    assert duplicated_blocks({"one.py": ORIGINAL, "two.py": other}) == []


CALLS = """
def f(op, x, weight, bias):
    scaled = op.Mul(x, weight)
    if bias is not None:
        scaled = op.Add(scaled, bias)
    shape = op.Shape(x, start=0, end=1)
    flat = op.Reshape(scaled, shape)
    return op.Relu(flat)
"""


def test_the_duplicate_check_catches_copies_that_call_another_op_or_pass_another_parameter():
    """Two bodies alike but for the op they call, the attribute they read or the names they use: one
    helper taking the op (or the parameter) can serve both."""
    other_op = CALLS.replace("op.Relu", "op.Sigmoid").replace("def f", "def g")
    renamed = CALLS.replace("op.", "opset.").replace("def f(op", "def g(opset").replace("end=1", "end=2")
    for copy in (other_op, renamed):
        assert duplicated_blocks({"one.py": CALLS, "two.py": copy}) == [frozenset({("one.py", "f"), ("two.py", "g")})]
    assert duplicated_blocks({"one.py": CALLS, "two.py": CALLS.replace("op.Relu(flat)", "(flat, shape)")}) == []


def test_a_table_of_records_is_not_a_duplicate():
    """Keyword arguments of a call and items of a dict, one a line, are data: two records with like fields
    are written alike."""
    record = "    Patch(\n        name={0!r},\n        module=m{0},\n        function={0!r},\n        versions=V,\n"
    record += "        replacement=r{0},\n        wraps=True,\n        reason={0!r},\n    ),\n"
    table = "PATCHES = (\n" + "".join(record.format(f"p{i}") for i in range(3)) + ")\n"
    assert duplicated_blocks({"one.py": table}) == []


def test_a_table_of_like_entries_is_not_a_duplicate():
    table = "".join(f'registry.register("aten::op{i}", op{i})\n' for i in range(8))
    assert duplicated_blocks({"one.py": table, "two.py": table.replace("op", "fn")}) == []


MEMO_UNDESCRIBED = frozenset({"const_value", "producer", "uses", "graph"})
"""What of a value the translation memo's description of a call does not cover (``opreg/exporter/_memo.py``)."""
STAMPS_ITS_NODES = frozenset({"core_ops/opreg_core_ops/ops/onnx_ops.py"})
"""Core modules whose impls stamp their nodes themselves: the memo never replays them."""


def test_core_impls_read_only_what_the_translation_memo_describes():
    """The translator replays a repeated call of a core impl instead of running it again: the nodes an impl
    makes may depend on its arguments' types, shapes, small constants and complex marks only, never on a
    weight's contents, or on where a value comes from or goes."""
    found = []
    for path in sorted((ROOT / "core_ops" / "opreg_core_ops").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in MEMO_UNDESCRIBED and relative not in STAMPS_ITS_NODES:
                found.append(f"{relative}:{node.lineno} reads .{node.attr}")
    assert not found, found


# -- limits: module size, function size, arrows back up ----------------------------------------------------------

FRAMEWORK = ROOT / "registry" / "opreg"
MAX_MODULE_LINES = 600
"""No module of the framework (``registry/opreg``) is longer: a longer one holds more than one concern."""
LONG_MODULES: dict[str, tuple[int, str]] = {
}  # fmt: skip
"""The framework modules over :data:`MAX_MODULE_LINES` today: ``path in registry/opreg -> (the size
it may not pass, why it is not split yet)``. A new long module fails, so does a listed one that grows
past its size, and so does one now within the limit (remove it): the list only shrinks."""

MAX_FUNCTION_LINES = 80
"""No function outside ``bench/`` and tests is longer, from its ``def`` to its last line (docstring included)."""
CODE = ("registry", "core_ops", "plugins", "tools", "examples")
"""Where the code the function limit holds lives (each package's ``tests`` folder left out)."""
LONG_FUNCTIONS: dict[str, tuple[int, str]] = {}
"""The functions over :data:`MAX_FUNCTION_LINES` today: ``path:qualified name -> (the size it may not
pass, why it is not split yet)``; kept like :data:`LONG_MODULES`."""


def _over_the_limit(sizes: dict[str, int], limit: int, known: dict[str, tuple[int, str]]) -> list[str]:
    """What breaks a size limit: a new entry over it, a known one grown past its listed size, a known
    one now within the limit or gone (the list must shrink with the code)."""
    broken = []
    for name, size in sorted(sizes.items()):
        if size > limit and name not in known:
            broken.append(f"{name}: {size} lines (limit {limit}): split it by concern")
        elif name in known and size > known[name][0]:
            broken.append(f"{name}: {size} lines, grown past the {known[name][0]} it is allowed: split it")
    for name, (size, _) in sorted(known.items()):
        if sizes.get(name, 0) <= limit:
            broken.append(f"{name}: listed at {size} lines but now within {limit} (or gone): remove its entry")
    return broken


def module_sizes() -> dict[str, int]:
    """``path in registry/opreg -> lines`` of every framework module."""
    return {p.relative_to(FRAMEWORK).as_posix(): len(p.read_text().splitlines()) for p in FRAMEWORK.rglob("*.py")}


def function_sizes(source: str, prefix: str) -> dict[str, int]:
    """``prefix:qualified name -> lines from def to end`` for every function in ``source``."""
    sizes = {}
    for line, name in enclosing_functions(source).items():
        sizes.setdefault(f"{prefix}:{name}", [line, line])[1] = line
    tree = ast.parse(source)
    functions = {node.lineno for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    return {name: last - first + 1 for name, (first, last) in sizes.items() if first in functions}


def code_function_sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if "tests" not in relative.parts and path.name != "conftest.py":
                sizes.update(function_sizes(path.read_text(), relative.as_posix()))
    return sizes


def test_no_framework_module_is_over_600_lines():
    broken = _over_the_limit(module_sizes(), MAX_MODULE_LINES, LONG_MODULES)
    assert not broken, "\n".join(broken)


def test_no_function_is_over_80_lines():
    broken = _over_the_limit(code_function_sizes(), MAX_FUNCTION_LINES, LONG_FUNCTIONS)
    assert not broken, "\n".join(broken)


def test_the_size_limits_catch_growth_new_entries_and_stale_ones():
    known = {"a.py": (700, "why"), "b.py": (650, "why")}
    assert _over_the_limit({"a.py": 700, "b.py": 640, "c.py": 600}, 600, known) == []
    assert _over_the_limit({"a.py": 701, "b.py": 600, "c.py": 601}, 600, known) == [
        "a.py: 701 lines, grown past the 700 it is allowed: split it",
        "c.py: 601 lines (limit 600): split it by concern",
        "b.py: listed at 650 lines but now within 600 (or gone): remove its entry",
    ]
    nested = "def f():\n    def g():\n        pass\n\n    return g\n\n\nclass C:\n    def m(self):\n        return 1\n"
    assert function_sizes(nested, "x.py") == {"x.py:f": 5, "x.py:f.g": 2, "x.py:C.m": 2}


def back_arrows(source: str, here: str, *, is_package: bool = False) -> list[str]:
    """Where ``source`` (module ``here``) takes a name from a package above it (``from opreg import
    __version__`` in ``opreg.exporter._finish``, ``from .. import LAYOUT``, ``import opreg``): a package's
    ``__init__`` is the facade over its modules and imports them, so a module that reaches up to it
    makes a circle through the facade. Submodules named through a package (``from opreg import
    hookspecs``) are plain downward imports."""
    package = here if is_package else here.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            if base is None or not here.startswith(f"{base}."):
                continue
            names = [alias.name for alias in node.names if not _is_module(f"{base}.{alias.name}")]
            found += [f"{here}:{node.lineno}: takes {name} from {base}" for name in names]
        elif isinstance(node, ast.Import):
            found += [
                f"{here}:{node.lineno}: imports {alias.name}"
                for alias in node.names
                if here.startswith(f"{alias.name}.")
            ]
    return found


BACK_ARROWS: dict[str, str] = {
    "opreg.llm._decoder": "LAYOUT, DECODER_OPTIONS live in opreg.llm's __init__: move them to a module of their own",
    "opreg.llm._cache": "LAYOUT, as for _decoder",
    "opreg.llm._genai": "LAYOUT, as for _decoder",
    "opreg.llm._vision": "LAYOUT, as for _decoder",
    "opreg.llm._vision_verify": "LAYOUT, as for _decoder",
}  # fmt: skip
"""Modules that still take a name from a package above them: ``module -> why, and the fix``."""


def test_no_import_runs_back_up_to_a_package_above():
    """A ``__main__`` runs its package (``python -m opreg``): that is its job, and it is let be."""
    found = defaultdict(list)
    for path in python_files():
        here = module_name(path)
        if path.name != "__main__.py":
            for arrow in back_arrows(path.read_text(), here, is_package=path.name == "__init__.py"):
                found[here].append(arrow)
    new = [arrow for module, arrows in found.items() if module not in BACK_ARROWS for arrow in arrows]
    assert not new, "imports running back up to a package above:\n" + "\n".join(new)
    gone = [module for module in BACK_ARROWS if module not in found]
    assert not gone, f"BACK_ARROWS lists modules that no longer import from above: remove them: {gone}"


def test_the_back_arrow_check_catches_every_form():
    probe = "from opreg import __version__, hookspecs\nfrom .. import LAYOUT\nfrom . import _save\nimport opreg\n"
    assert back_arrows(probe, "opreg.exporter._probe") == [
        "opreg.exporter._probe:1: takes __version__ from opreg",
        "opreg.exporter._probe:2: takes LAYOUT from opreg",
        "opreg.exporter._probe:4: imports opreg",
    ]
    assert back_arrows("from opreg.exporter import _save\nimport opreg.registry.targets\n", "opreg.exporter._x") == []


DIAGNOSIS = {
    "run": "(self, *args: 'Any', runtime: 'str' = 'onnxruntime', **kwargs: 'Any') -> 'Any'",
    "verify": "(self, *args: 'Any', rtol: 'float' = 0.0001, atol: 'float' = 0.0001, runtime: 'str' = 'auto', "
    "locate: 'bool' = False, **kwargs: 'Any') -> 'Verification'",
    "locate": "(self, *args: 'Any', rtol: 'float' = 0.0001, atol: 'float' = 0.0001, runtime: 'str' = 'auto', "
    "**kwargs: 'Any') -> 'Location'",
}
"""``OnnxProgram``'s diagnosis methods and their signatures, as users call them."""


def test_the_program_forwards_run_verify_and_locate_to_the_diagnosis_room():
    """``OnnxProgram`` holds the model, its names and ``save``: ``run``, ``verify`` and ``locate`` keep
    their signatures and are one line each (after the docstring), a call of a function the diagnosis
    room (``opreg.exporter.diagnosis``) defines (imported on the line before where an export needs
    none of it: ``locate``)."""
    import inspect

    from opreg.exporter import OnnxProgram

    tree = ast.parse((FRAMEWORK / "exporter" / "_program.py").read_text())
    imported = {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    program = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OnnxProgram")
    methods = {n.name: n for n in program.body if isinstance(n, ast.FunctionDef)}
    for name, signature in DIAGNOSIS.items():
        assert str(inspect.signature(getattr(OnnxProgram, name))) == signature, name
        body = methods[name].body[1:] if ast.get_docstring(methods[name]) else methods[name].body
        if len(body) == 2 and isinstance(body[0], ast.ImportFrom) and body[0].module:  # imported when called
            imported.update({alias.asname or alias.name: body[0].module for alias in body[0].names})
            body = body[1:]
        assert len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Call), name
        called = body[0].value.func
        assert isinstance(called, ast.Name), f"OnnxProgram.{name} calls {ast.unparse(called)}, not a diagnosis function"
        assert imported.get(called.id, "").startswith("opreg.exporter.diagnosis."), (name, called.id)
