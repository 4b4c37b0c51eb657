"""``opreg new-pack --op``: the schema is the author's text, copied from a README or an issue thread, and
the generated pack holds it as data. Whatever it holds (quotes, backslashes, escapes, ``__import__``,
unicode, names of 10,000 characters), every generated file parses, the text comes back unchanged, and
importing the pack runs nothing but the pack; a schema torch cannot read is a named error."""

from __future__ import annotations

import ast
import inspect
import itertools
import string
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opreg.authoring import scaffold

_numbers = itertools.count()
PAYLOAD = "+__import__('pathlib').Path({sentinel!r}).write_text('ran')+"
"""What issue 53 found running: a string default that, pasted between quotes, closes them and calls."""


def torch_string(text: str) -> str:
    """``text`` as a string literal of a torch schema (which reads ``\\\\``, ``\\"``, ``\\n``, ``\\t``)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def render(schema: str) -> dict[str, str] | None:
    """The pack's files for ``schema``, or None when it is refused with a named error."""
    try:
        return scaffold.render(scaffold.PackNames("opreg-hostile", "hostile", "opreg_hostile", "hostile.ops"), [schema])
    except scaffold.ScaffoldError:
        return None


def assert_parses(files: dict[str, str]) -> None:
    for path, text in files.items():
        if path.endswith(".py"):
            ast.parse(text, filename=path)  # a SyntaxError (or a NUL byte's ValueError) names the file


def default_of(files: dict[str, str], package: str, function: str, parameter: str) -> object:
    """The default the generated impl gives ``parameter``, read as data from its source."""
    tree = ast.parse(files[f"{package}/impls.py"])
    (found,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function]
    arguments = found.args.args + found.args.kwonlyargs
    defaults = dict(zip([a.arg for a in found.args.args][::-1], found.args.defaults[::-1], strict=False))
    defaults |= {a.arg: d for a, d in zip(found.args.kwonlyargs, found.args.kw_defaults, strict=True) if d}
    assert parameter in [a.arg for a in arguments]
    return ast.literal_eval(defaults[parameter])


hostile_text = st.lists(
    st.one_of(
        st.sampled_from(['"', "'", '"""', "'''", "\\", "\n", "\t", "\x00", "{", "}", "|", "`", "#", "é", "\u2028"]),
        st.sampled_from(["__import__('os').system('x')", "+", "\\N{BULLET}", "\\x41", "@"]),
        st.characters(codec="utf-8"),
    ),
    max_size=12,
).map("".join)
ascii_name = st.text(string.ascii_letters + string.digits + "_", min_size=0, max_size=10_000).map(lambda s: "a" + s)


@settings(max_examples=150, deadline=None)
@given(text=hostile_text)
@example(text="mean")
@example(text="'''\"\"\"\\")
@example(text=PAYLOAD.format(sentinel="X"))
def test_a_string_default_is_held_as_data(text):
    files = render(f"lib::f(Tensor x, str m={torch_string(text)}) -> Tensor")
    if files is None:  # torch refused the literal: a named error, nothing written
        return
    assert_parses(files)
    assert default_of(files, "opreg_hostile", "lib_f", "m") == text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(namespace=ascii_name, name=ascii_name, argument=ascii_name)
@example(namespace="lib", name="a" * 10_000, argument="b" * 10_000)
def test_long_names_are_held_as_data(namespace, name, argument):
    files = render(f"{namespace}::{name}(Tensor x, float {argument}=0.5) -> Tensor")
    if files is None:  # a keyword, a reserved namespace, a name torch rejects
        return
    assert_parses(files)
    assert f"def {namespace}_{name}(" in files["opreg_hostile/impls.py"]


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=30))
@example(text="lib::fé(Tensor x) -> Tensor")
@example(text="lib::f(Tensor xé) -> Tensor")
@example(text='lib::f(Tensor x, str m="a\nb") -> Tensor')
def test_any_text_is_a_named_refusal_or_a_pack_that_parses(text):
    files = render(text)
    if files is not None:
        assert_parses(files)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("lib::fé(Tensor x) -> Tensor", "names the op with letters torch does not read"),
        ("lib::f(Tensor xé) -> Tensor", "has a name torch does not read: name the arguments in ASCII"),
    ],
)
def test_a_unicode_name_is_a_named_error(tmp_path, schema, message):
    with pytest.raises(scaffold.ScaffoldError, match=message):
        scaffold.new_pack("opreg-mypack", ops=[schema], directory=tmp_path / "pack")
    assert list(tmp_path.iterdir()) == []


def import_pack(schema: str, folder: Path) -> tuple[object, set[str]]:
    """Write a pack for ``schema`` in ``folder``, import every module of it; its ``impls`` module and
    the modules the import added besides the pack's own."""
    import importlib

    import numpy  # noqa: F401  (what the pack imports, imported before the count)
    import onnx.defs
    import onnx.reference.op_run  # noqa: F401
    import onnxscript  # noqa: F401

    import opreg
    import opreg.ops

    for name in ("hookimpl", "impl", "Registrar", "newest_supported_opset"):  # opreg's names load lazily
        getattr(opreg, name)

    package = f"opreg_hostile{next(_numbers)}"
    scaffold.new_pack(package.replace("_", "-"), ops=[schema], directory=folder / "pack")
    sys.path.insert(0, str(folder / "pack"))
    before = set(sys.modules)
    try:
        parts = ("", ".impls", ".runtime", ".torch_ops", ".samples")
        modules = [importlib.import_module(f"{package}{part}") for part in parts]
        added = {m for m in set(sys.modules) - before if m != package and not m.startswith(f"{package}.")}
        return modules, added
    finally:
        sys.path.remove(str(folder / "pack"))
        for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
            del sys.modules[name]


@pytest.mark.parametrize(
    "text",
    [
        "mean",
        PAYLOAD,
        "\"+__import__('pathlib').Path({sentinel!r}).write_text('ran')+\"",
        "'''+__import__('pathlib').Path({sentinel!r}).write_text('ran')+'''",
        '"""\n__import__("pathlib").Path({sentinel!r}).write_text("ran")\n"""',
        "\\\"+__import__('pathlib').Path({sentinel!r}).write_text('ran')#",
    ],
    ids=["plain", "issue-53", "double", "triple-single", "triple-double", "backslash"],
)
def test_importing_the_pack_runs_nothing_but_the_pack(tmp_path, text):
    sentinel = tmp_path / "SENTINEL"
    text = text.replace("{sentinel!r}", repr(str(sentinel)))
    schema = f"hostilelib::f(Tensor x, str m={torch_string(text)}) -> Tensor"
    (init, impls, runtime, torch_ops, samples), added = import_pack(schema, tmp_path)
    assert not sentinel.exists() and added == set()
    assert inspect.signature(impls.hostilelib_f).parameters["m"].default == text
    written = "hostilelib::f" + torch_ops.SCHEMAS["hostilelib::f"]
    assert written == schema and impls.hostilelib_f.__doc__ == written + "."
    (onnx_schema,) = runtime.schemas()
    assert onnx_schema.doc == written
    assert init.DOMAIN == init.__name__.removeprefix("opreg_") + ".ops" and callable(samples.samples)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=hostile_text)
def test_importing_a_fuzzed_pack_runs_nothing_but_the_pack(text):
    with tempfile.TemporaryDirectory() as folder:
        sentinel = Path(folder) / "SENTINEL"
        text = text + PAYLOAD.format(sentinel=str(sentinel))
        schema = f"hostilelib::f(Tensor x, str m={torch_string(text)}) -> Tensor"
        if render(schema) is None:
            return
        (_, impls, *_), added = import_pack(schema, Path(folder))
        assert not sentinel.exists() and added == set()
        assert inspect.signature(impls.hostilelib_f).parameters["m"].default == text


@pytest.mark.parametrize(
    "value",
    [0, -1, 0.0, -0.0, 1e-300, 2.5, float("inf"), float("-inf"), True, False, None, "", "it's", 'say "hi"',
     "both ' and \"", "tab\tnul\x00", [1, 2], [0.5, True]],
)  # fmt: skip
def test_a_literal_evaluates_back_to_its_value(value):
    from opreg.authoring._packtext import literal

    text = literal(value)
    back = eval(text, {"__builtins__": {"float": float}})  # what the generated file holds, evaluated
    assert back == value and type(back) is type(value) and repr(back) == repr(value)


def test_a_literal_of_nan_is_nan_and_other_values_are_refused():
    import math

    from opreg.authoring._packtext import literal

    assert literal(float("nan")) == 'float("nan")' and math.isnan(eval(literal(float("nan")), {"float": float}))
    with pytest.raises(TypeError, match="no Python literal for object"):
        literal(object())


@pytest.mark.parametrize("width", [119, 120, 121])
def test_wrap_keeps_a_line_of_exactly_the_width_whole(width):
    """Both sides of ruff's line length: 120 columns fit, 121 do not."""
    from opreg.authoring._packtext import wrap

    item = "a" * (width - len("f(b, )"))
    text = wrap(0, "f(", ["b", item], ")")
    assert (text.count("\n") == 0) is (width <= 120), text


@pytest.mark.parametrize("width", [120, 121])
def test_wrap_keeps_the_items_on_one_line_of_their_own_at_exactly_the_width(width):
    from opreg.authoring._packtext import wrap

    item = "a" * (width - 4)  # the items' line: four spaces of indent, then the item
    text = wrap(0, "function_name(", [item], ")")
    one_line_of_items = f"function_name(\n    {item}\n)"
    assert (text == one_line_of_items) is (width <= 120), text
    assert text.endswith(",\n)") is (width > 120)  # else one item a line, with ruff's trailing comma
