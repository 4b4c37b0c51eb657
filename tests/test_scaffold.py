"""``opreg new-pack``: the pack it writes installs, loads and passes its own tests;
names and directories it cannot use are refused without writing anything."""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest

from opreg.authoring import scaffold

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str | os.PathLike[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPREG_DISABLE_PLUGIN_AUTOLOAD")}
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def layered_venv(venv: Path) -> Path:
    """A new venv that sees this environment's packages (torch, opreg, pip) behind its own, so a
    pack installed into it is installed nowhere else; returns its python.

    ``venv --system-site-packages`` would not do: run from inside a venv, it links the *base*
    interpreter's site-packages, where opreg is not installed. A ``.pth`` file that adds this
    environment's site directories (running their ``.pth`` files too, for editable installs)
    works the same from a venv and from a system Python.
    """
    made = run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv.parent)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    found = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=venv.parent)
    outer = [p for p in [*site.getsitepackages(), site.getusersitepackages()] if Path(p).is_dir()]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in outer)
    (Path(found.stdout.strip()) / "_outer_environment.pth").write_text(lines)
    return python


SWISH = "swishlib::fused_swish(Tensor x, float beta) -> Tensor"
MIXED = (
    "scaffoldlib::mix.out(Tensor x, Tensor? weight=None, float scale=1.0, *, int[] dims=[1], bool keep=False, "
    "str mode='sum') -> (Tensor, Tensor)"
)
"""An op with every kind of argument a new pack takes: an overload, an optional tensor, keyword-only
attributes with defaults, two outputs."""


SWISHLIB = """
import torch


@torch.library.custom_op("swishlib::fused_swish", mutates_args=())
def fused_swish(x: torch.Tensor, beta: float) -> torch.Tensor:
    return x * torch.sigmoid(beta * x)


@fused_swish.register_fake
def _(x, beta):
    return torch.empty_like(x)
"""
"""The library that defines ``swishlib::fused_swish`` (docs/writing-packs.md's walk has its own copy)."""


def installed(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the pack in ``pack`` importable and discovered, as ``pip install -e`` would (its
    distribution's metadata and entry point, its folder on ``sys.path``)."""
    import tomllib

    import opreg.packs.plugins

    project = tomllib.loads((pack / "pyproject.toml").read_text())["project"]
    info = pack / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    entry = project["entry-points"]["opreg.plugins"]
    (info / "entry_points.txt").write_text("[opreg.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items()))
    monkeypatch.syspath_prepend(str(pack))
    opreg.packs.plugins.clear_cache()


@pytest.fixture
def unload():
    """Forget the packs a test imported from its temporary folder."""
    import opreg.packs.plugins

    yield
    opreg.packs.plugins.clear_cache()
    for name in [m for m in sys.modules if m.startswith(("opreg_swishpack", "opreg_mixpack", "opreg_emptypack"))]:
        del sys.modules[name]


def test_new_pack_reports_what_it_wrote(tmp_path):
    made = run(sys.executable, "-m", "opreg", "new-pack", "opreg-mypack", "--op", SWISH, "--json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    pack = tmp_path / "opreg-mypack"
    assert created["directory"] == str(pack)
    assert (created["pack"], created["package"], created["domain"]) == ("mypack", "opreg_mypack", "mypack.ops")
    assert created["ops"] == ["swishlib::fused_swish"] and created["edit"] == "opreg_mypack/impls.py"
    assert sorted(str(p.relative_to(pack)) for p in pack.rglob("*") if p.is_file()) == created["files"]
    assert created["files"] == [
        ".github/workflows/opreg-pack.yml",
        "README.md",
        "opreg_mypack/__init__.py",
        "opreg_mypack/impls.py",
        "opreg_mypack/runtime.py",
        "opreg_mypack/samples.py",
        "opreg_mypack/torch_ops.py",
        "pyproject.toml",
        "tests/test_mypack.py",
    ]
    assert 'mypack = "opreg_mypack"' in (pack / "pyproject.toml").read_text()


def test_the_next_steps_are_whole_lines_to_paste(tmp_path):
    """Each command ``new-pack`` suggests is one line, however long its path and narrow the terminal
    (issue 39: the hint used to wrap a path onto a line of its own)."""
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 6)
    deep.mkdir(parents=True)
    pack = deep / "opreg-mypack"
    env_run = run(
        sys.executable, "-c", "import os, sys; os.environ['COLUMNS'] = '60'; from opreg.cli import main; "
        "sys.exit(main(sys.argv[1:]))", "new-pack", "opreg-mypack", "--op", SWISH, "-o", pack, cwd=tmp_path,
    )  # fmt: skip
    assert env_run.returncode == 0, env_run.stderr
    lines = env_run.stdout.splitlines()
    assert lines[1] == f"edit: {pack}/opreg_mypack/impls.py (write each impl's body)"
    assert lines[2:] == ["next:", f"  pip install -e {pack}", "  opreg plugins", "  opreg pack-check mypack"]


def test_new_pack_without_ops_says_how_to_give_them(tmp_path):
    refused = run(sys.executable, "-m", "opreg", "new-pack", "opreg-mypack", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == "" and list(tmp_path.iterdir()) == []
    assert refused.stderr == (
        "opreg: error: name the ops the pack translates, --op 'mylib::fused_swish(Tensor x, float beta) -> Tensor' "
        "(repeatable; ops=[...] in Python), or pass --empty for a pack with no ops yet\n"
    )
    made = run(sys.executable, "-m", "opreg", "new-pack", "opreg-mypack", "--empty", "--json", cwd=tmp_path)
    assert made.returncode == 0 and json.loads(made.stdout)["ops"] == []


def test_the_pack_is_written_for_its_ops(tmp_path, monkeypatch, unload):
    """Each op gets an impl stub whose signature opreg accepts against the op's torch schema, an ONNX
    schema with an input per tensor and an attribute per other argument, a reference kernel, samples."""
    import torch

    import opreg

    lib = torch.library.Library("scaffoldlib", "DEF")  # the op as its library defines it
    lib.define(MIXED.removeprefix("scaffoldlib::"))
    pack = scaffold.new_pack("opreg-mixpack", ops=[SWISH, MIXED], directory=tmp_path / "pack")
    impls = (pack / "opreg_mixpack" / "impls.py").read_text()
    assert "def swishlib_fused_swish(x: Tensor, beta: float):" in impls
    assert (
        "def scaffoldlib_mix_out(\n    x: Tensor,\n    weight: Tensor | None = None,\n    scale: float = 1.0,\n    *,\n"
        '    dims: Sequence[int] = [1],\n    keep: bool = False,\n    mode: str = "sum",\n):'
    ) in impls
    assert impls.count("raise NotImplementedError(") == 2
    installed(pack, monkeypatch)
    from opreg_mixpack import impls as module
    from opreg_mixpack import runtime

    registrar = opreg.Registrar("mixpack")
    mix = registrar.register_module(module)[1]
    assert registrar.rejected == [] and mix.schema_checked and str(mix.op) == "scaffoldlib::mix.out"
    _, mixed = runtime.schemas()
    assert (mixed.name, mixed.domain, mixed.since_version) == ("MixOut", "mixpack.ops", 1)
    assert [i.name for i in mixed.inputs] == ["x", "weight"] and len(mixed.outputs) == 2
    assert {name: a.required for name, a in mixed.attributes.items()} == {
        "scale": False, "dims": False, "keep": False, "mode": False
    }  # fmt: skip
    assert [k.__name__ for k in runtime.reference_kernels()] == ["FusedSwish", "MixOut"]
    assert runtime.functions() == []
    del lib


def test_the_metadata_agrees_with_the_guide(tmp_path):
    """No upper pins (the guide's "Publishing"), public API only, and a description of the author's pack."""
    pack = scaffold.new_pack("opreg-mypack", ops=[SWISH], directory=tmp_path / "pack")
    project = (pack / "pyproject.toml").read_text()
    dependencies = re.search(r"^dependencies = \[(.*)\]$", project, flags=re.M).group(1)
    assert "<" not in dependencies and "torch>=" in dependencies and "opreg>=" in dependencies
    assert 'description = "opreg op pack: exports swishlib::fused_swish to ONNX (domain mypack.ops)"' in project
    code = "\n".join(p.read_text() for p in pack.rglob("*.py"))
    assert "OPREG_REQUIRES_TORCH" not in code and "opreg.newest_supported_opset()" in code
    private = re.findall(r"(?:from|import) opreg[\w.]*\._\w+|from opreg(?:\.\w+)* import _\w+|opreg\.targets", code)
    assert private == []
    assert "addandround" not in code and "mylibrary" not in code  # not a renamed tutorial


def test_until_the_body_is_written_the_kit_fails_naming_the_function(tmp_path, monkeypatch, unload):
    from opreg.testing import check_pack

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "swishlib.py").write_text(SWISHLIB)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    pack = scaffold.new_pack("opreg-swishpack", ops=[SWISH], directory=tmp_path / "pack")
    installed(pack, monkeypatch)
    report = check_pack("swishpack")
    failures = report.failures()
    assert len(failures) == 1, [str(r) for r in failures]
    (failure,) = failures
    assert failure.check == "samples"
    assert failure.subject == "swishpack:swishlib_fused_swish for swishlib::fused_swish.default"
    code = (pack / "opreg_swishpack" / "impls.py").read_text().splitlines()
    line = code.index('@opreg.impl("swishlib::fused_swish")') + 1
    where = f"opreg_swishpack/impls.py:{line}"
    assert failure.detail == f"not written yet: write the body of swishlib_fused_swish ({where})"


def test_an_empty_pack_loads_and_passes_the_kit(tmp_path, monkeypatch, unload):
    from opreg.testing import check_pack

    pack = scaffold.new_pack("opreg-emptypack", empty=True, directory=tmp_path / "pack")
    assert sorted(str(p.relative_to(pack)) for p in pack.rglob("*") if p.is_file()) == [
        ".github/workflows/opreg-pack.yml", "README.md", "opreg_emptypack/__init__.py", "opreg_emptypack/impls.py",
        "pyproject.toml", "tests/test_emptypack.py",
    ]  # fmt: skip
    description = 'description = "opreg op pack: exports its ops (none yet) to ONNX (domain emptypack.ops)"'
    assert description in (pack / "pyproject.toml").read_text()
    installed(pack, monkeypatch)
    report = check_pack("emptypack")
    report.assert_ok()
    assert [r.detail for r in report.results if r.check == "load"] == ["0 impl(s); domains ; profiles emptypack"]


@pytest.mark.parametrize(
    ("ops", "empty", "message"),
    [
        ((), False, "name the ops the pack translates, --op 'mylib::fused_swish(Tensor x, float beta) -> Tensor'"),
        ((SWISH,), True, "--op and --empty exclude each other"),
        (("swishlib::fused_swish(Tensor x",), False, "is not a torch op schema"),
        (("aten::gelu(Tensor self) -> Tensor",), False, "aten is torch's own namespace"),
        (("mylib::scale_(Tensor(a!) x) -> Tensor(a!)",), False, "writes to an argument ((a!))"),
        (("mylib::cat(Tensor[] xs) -> Tensor",), False, "argument 'xs' is a List[Tensor]"),
        (("mylib::count(Tensor x) -> int",), False, "returns int"),
        ((SWISH, SWISH), False, "give one op, 'swishlib::fused_swish': give each once"),
    ],
)
def test_ops_it_cannot_write_a_pack_for_are_refused(tmp_path, ops, empty, message):
    with pytest.raises(scaffold.ScaffoldError, match=re.escape(message)):
        scaffold.new_pack("opreg-mypack", ops=list(ops), empty=empty, directory=tmp_path / "pack")
    assert list(tmp_path.iterdir()) == []


def test_the_wheel_ships_what_new_pack_needs(tmp_path):
    """Built as a user installs it, opreg's wheel holds the list of well-known names (and no template)."""
    import shutil
    import zipfile

    source = tmp_path / "source"  # a copy: pip builds in the tree it is given
    leftovers = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".*")
    for part in ("pyproject.toml", "README.md", "registry", "core_ops"):
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, source / part, ignore=leftovers)
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(ROOT / part, source / part)
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, source,
                cwd=tmp_path, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("opreg-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "opreg/authoring/well_known_names.txt",
        "opreg/authoring/_opspec.py",
        "opreg/authoring/_packcode.py",
        "opreg/authoring/_packfiles.py",
    } <= names
    assert not [n for n in names if "_template" in n]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["my pack"], "not a valid distribution name"),
        (["mypack-"], "not a valid distribution name"),
        (["opreg"], "opreg's own distribution"),
        (["opreg-3d"], "not a Python identifier"),
        (["opreg-class"], "Python keyword"),
        (["core"], "taken by opreg"),
        # opreg's own packages, whichever way the name is written (issue 27, defect 4)
        (["opreg-core-ops"], "one of opreg's own packages"),
        (["opreg_core_ops"], "one of opreg's own packages"),
        (["core-ops"], "'opreg_core_ops', one of opreg's own packages"),
        (["opreg-ort-contrib"], "one of opreg's own packages"),
        (["ort_contrib"], "one of opreg's own packages"),
        (["opreg-test-customop"], "one of opreg's own packages"),
        # installed distributions, importable names, well-known projects
        (["onnxscript"], "a distribution installed here"),
        (["pluggy"], "a distribution installed here"),
        (["boto3"], "a well-known PyPI project"),
        (["scikit_learn"], "a well-known PyPI project"),  # canonical name scikit-learn
        (["Flask"], "a well-known PyPI project"),
        (["opreg-dev-torchvision-shim"], "a distribution installed here"),
        (["dev-torchvision-shim"], "import name 'opreg_dev_torchvision_shim' of 'dev-torchvision-shim' is already"),
        (["mypack", "--domain", "my..ops"], "not dotted identifiers"),
        (["mypack", "--domain", "my-company.ops"], "not dotted identifiers"),
        (["mypack", "--domain", "ai.onnx"], "belongs to ai.onnx"),
        (["mypack", "--domain", "com.microsoft.nchwc"], "belongs to com.microsoft"),
        # ops it cannot write a pack for, given on the command line
        (["mypack", "--op", "swishlib::fused_swish(Tensor x"], "is not a torch op schema"),
        (["mypack", "--op", "mylib::count(Tensor x) -> int"], "returns int"),
        (["mypack", "--op", SWISH, "--empty"], "--op and --empty exclude each other"),
    ],
)
def test_unusable_names_are_refused_and_nothing_is_written(tmp_path, args, message):
    refused = run(sys.executable, "-m", "opreg", "new-pack", *args, cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.startswith("opreg: error: ") and message in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_non_empty_directory_is_refused_and_left_alone(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("")
    for target in ("taken", "file"):
        refused = run(sys.executable, "-m", "opreg", "new-pack", "mypack", "--empty", "-o", target, cwd=tmp_path)
        assert refused.returncode == 2 and "-o DIR" in refused.stderr, refused.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["file", "notes.txt", "taken"]


def test_an_empty_directory_is_filled(tmp_path):
    (tmp_path / "empty").mkdir()
    path = scaffold.new_pack("mypack", empty=True, domain="com.example.mypack", directory=tmp_path / "empty")
    assert path == tmp_path / "empty"
    assert 'DOMAIN = "com.example.mypack"' in (path / "opreg_mypack" / "__init__.py").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]


def test_a_failed_write_leaves_nothing(tmp_path):
    # a valid name whose package directory is longer than a file name may be
    long = "opreg-" + "a" * 300
    failed = run(sys.executable, "-m", "opreg", "new-pack", long, "--empty", "-o", "out", cwd=tmp_path)
    assert failed.returncode == 2 and "could not write" in failed.stderr, failed.stderr
    assert list(tmp_path.iterdir()) == []


def test_names_derive_from_the_distribution():
    names = scaffold.pack_names("Opreg.My_Pack")
    assert (names.pack, names.package, names.domain) == ("my_pack", "opreg_my_pack", "my_pack.ops")
    assert scaffold.pack_names("mypack").package == "opreg_mypack"


REDUCE = 'reducelib::reduce_it(Tensor x, str reduction="mean") -> Tensor'
"""A string default in double quotes, as torch's own schemas write them (issue 53: the pack did not parse)."""


@pytest.mark.parametrize("ops", [(), (SWISH, MIXED, REDUCE)], ids=["empty", "ops"])
def test_generated_code_is_lint_clean(tmp_path, ops):
    pytest.importorskip("ruff")
    path = scaffold.new_pack("opreg-mypack", ops=list(ops), empty=not ops, directory=tmp_path / "pack")
    # from inside the pack, as its author runs ruff, with the pack's own settings: opreg is third-party there
    for command in (["check", "--no-cache"], ["format", "--check"]):
        linted = run(sys.executable, "-m", "ruff", *command, ".", cwd=path)
        assert linted.returncode == 0, linted.stdout


def test_falsy_options_given_are_not_taken_as_left_out(tmp_path):
    """Issue 53, both sides: ``domain=""`` is a domain given (refused), not the default; ``empty=False`` with
    ops and ``ops=()`` with ``empty=True`` are the same as leaving the other out."""
    with pytest.raises(scaffold.ScaffoldError, match="domain '' is not dotted identifiers"):
        scaffold.new_pack("opreg-mypack", ops=[SWISH], domain="", directory=tmp_path / "refused")
    assert list(tmp_path.iterdir()) == []
    with_ops = scaffold.new_pack("opreg-mypack", ops=[SWISH], empty=False, directory=tmp_path / "ops")
    assert (with_ops / "opreg_mypack" / "runtime.py").is_file()
    empty = scaffold.new_pack("opreg-mypack", ops=(), empty=True, directory=tmp_path / "empty")
    assert not (empty / "opreg_mypack" / "runtime.py").exists()


def test_optional_and_required_arguments_of_a_generated_schema(tmp_path, monkeypatch, unload):
    """Both sides of each: a required input and attribute (SWISH's x, beta), an optional input and
    attributes with defaults (MIXED's weight, scale...); the samples pass the optional input as None and as
    a tensor."""
    from onnx.defs import OpSchema

    pack = scaffold.new_pack("opreg-mixpack", ops=[SWISH, MIXED], directory=tmp_path / "pack")
    installed(pack, monkeypatch)
    from opreg_mixpack import runtime

    swish, mixed = runtime.schemas()
    single, optional = OpSchema.FormalParameterOption.Single, OpSchema.FormalParameterOption.Optional
    assert [i.option for i in swish.inputs] == [single] and swish.attributes["beta"].required
    assert [i.option for i in mixed.inputs] == [single, optional]
    assert not any(a.required for a in mixed.attributes.values())
    samples = (pack / "opreg_mixpack" / "samples.py").read_text()
    mix = samples[samples.index('"scaffoldlib::mix.out"') :]
    first, second = mix.split("Sample.of(")[1:3]
    assert "torch.randn(2, 3, generator=generator), None, 1.0," in first  # weight left out, scale its default
    assert "torch.randn(4, generator=generator),\n" in second and "1.25," in second  # given, and another scale


def test_the_samples_give_each_argument_two_values():
    """The first sample: every default, an optional argument left out, every tensor of the first tensor's shape;
    the second: a bool default flipped, a float default moved, an optional argument given, a later tensor of
    the last dim only (broadcast, as a weight), the first tensor of its whole shape."""
    op = "scaffoldlib::opt(Tensor x, Tensor w, bool b, int n, float? g=None, bool flag=True, float eps=1e-05) -> Tensor"
    samples = scaffold.render(scaffold.pack_names("opreg-mypack"), [op])["opreg_mypack/samples.py"]
    import ast

    calls = [n for n in ast.walk(ast.parse(samples)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "Sample.of"]
    first, second = ([ast.unparse(a) for a in call.args] for call in calls)
    randn = "torch.randn({}, generator=generator)"
    assert first == [randn.format("2, 3"), randn.format("2, 3"), "False", "1", "None", "True", "1e-05"]
    assert second == [randn.format("3, 1, 4"), randn.format("4"), "True", "1", "3.0", "False", "0.25001"]


def test_symint_and_scalar_arguments_become_int_and_float_attributes():
    from opreg.authoring import _opspec

    op = _opspec.parse("lib::f(Tensor x, SymInt n, Scalar s, int[] d, float[] w) -> Tensor")
    assert [(a.name, a.kind, a.annotation) for a in op.attributes] == [
        ("n", "int", "int"), ("s", "float", "float"), ("d", "ints", "Sequence[int]"), ("w", "floats", "Sequence[float]")
    ]  # fmt: skip
