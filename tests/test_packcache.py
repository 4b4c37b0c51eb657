"""The cache of what packs declare (opreg.packs.packcache): ``opreg plugins``, ``ops`` and ``explain``
answer from it without importing torch, and it never serves data older than the installed
distributions or the packs' source files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import opreg
import opreg.packs.plugins
from opreg.cli import main
from opreg.errors import OpregError, PluginError
from opreg.packs import declaration, fingerprint, packcache
from opreg.packs.plugins import Selection
from tests.test_plugins import GOOD
from tests.test_scaffold import layered_venv
from tests.test_scaffold import run as run_clean

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
from opreg.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
heavy = sorted(m for m in ("torch", "onnx", "onnxscript", "onnxruntime") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
sys.exit(code)
"""
"""Runs the CLI in a fresh process, then says on stderr which heavy modules it imported."""


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def entries(root: Path) -> list[Path]:
    """The entries in the cache whose root folder (``OPREG_CACHE_DIR``) is ``root``."""
    return sorted((root / packcache.SUBDIR).glob("*.json"))


def probe(python: Path | str, cache: Path, *argv: str, cwd: Path, timeout: float = 300) -> tuple[str, dict]:
    """``opreg ARGV`` in a fresh ``python`` with cache ``cache``: its stdout, and what it imported."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPREG_DISABLE_PLUGIN_AUTOLOAD")}
    env[packcache.CACHE_ENV] = str(cache)
    env.pop(packcache.NO_CACHE_ENV, None)
    proc = subprocess.run(
        [str(python), "-c", PROBE, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(proc.stderr.strip().splitlines()[-1])


def without_seconds(text: str) -> list[dict]:
    """``opreg plugins --json`` rows without the import time (each loading run measures its own)."""
    return [{k: v for k, v in row.items() if k != "seconds"} for row in json.loads(text)]


def test_a_second_run_reads_the_cache_and_imports_no_torch(tmp_path):
    cache = tmp_path / "cache"
    for argv in (["plugins", "--json"], ["ops", "aten::gelu*", "--json", "-t", "onnx"],
                 ["ops", "aten::gelu*", "--json", "-t", "onnxruntime"],
                 ["explain", "aten::gelu", "--json", "-t", "onnxruntime"]):  # fmt: skip
        first, _ = probe(sys.executable, cache, *argv, "--no-cache", cwd=tmp_path)
        second, cached = probe(sys.executable, cache, *argv, cwd=tmp_path)
        if argv[0] == "plugins":  # the first command run with the cache loads the packs and fills it
            assert "torch" in cached["heavy"]
            second, cached = probe(sys.executable, cache, *argv, cwd=tmp_path)
        if "onnxruntime" in argv:  # a release target: resolution reads the ops each impl emits (onnxscript)
            assert cached["code"] == 0 and "torch" not in cached["heavy"], argv
        else:
            assert cached == {"code": 0, "heavy": []}, argv
        if argv[0] == "plugins":
            assert without_seconds(second) == without_seconds(first)
        else:
            assert second == first, argv
    assert len(entries(cache)) == 1  # one selection, one interpreter: one entry


def test_a_cached_registry_resolves_and_explains_as_the_loaded_one():
    selection = Selection.of()
    loaded = opreg.packs.plugins.declared_registry()  # loads the packs and fills the cache
    assert len(entries(Path(os.environ[packcache.CACHE_ENV]))) == 1 and packcache.read(selection) is not None
    cached = opreg.packs.plugins.declared_registry()
    assert cached.packs == loaded.packs and cached.packs.loaded  # reports, as data: no pack code behind either
    assert len(cached) == len(loaded) and cached.ops() == loaded.ops()
    assert list(cached.packs) == list(loaded.packs) and cached.profiles == loaded.profiles
    assert cached.unsupported() == loaded.unsupported()
    for target in ("onnx", "onnxruntime", "18", "test_customop"):
        for op in ("aten::gelu", "aten::add.Tensor", "aten::scaled_dot_product_attention", "mylibrary::addandround_op"):
            assert str(cached.explain(op, target)) == str(loaded.explain(op, target)), (op, target)
        assert [str(c) for c in cached.conflicts(target)] == [str(c) for c in loaded.conflicts(target)]
    impl = cached.resolve("aten::gelu", "onnx")
    assert impl.source == loaded.resolve("aten::gelu", "onnx").source and impl.source.endswith(".py:24")
    with pytest.raises(OpregError, match="read from opreg's cache of what packs declare"):
        impl.function()


def test_preferences_and_strict_apply_to_cached_data(capsys, make_pack):
    make_pack("extra", GOOD.replace("priority=1", "priority=0"))  # ties with the core pack on aten::neg
    cli(capsys, "plugins")  # fills the cache
    code, out, _ = cli(capsys, "explain", "aten::neg", "--json", "--prefer", "aten::neg=extra")
    assert code == 0 and json.loads(out)["chosen"].startswith("extra:")
    code, _, err = cli(capsys, "plugins", "--strict")
    assert code == 1 and "tie" in err
    code, _, err = cli(capsys, "explain", "aten::neg", "--prefer", "aten::gelu=extra")
    assert code == 2 and "cannot prefer pack 'extra' for aten::gelu.default" in err
    code, _, err = cli(capsys, "plugins", "-p", "no:nosuch")
    assert code == 2 and "no installed pack named 'nosuch'" in err


def test_a_new_or_changed_pack_on_the_path_is_seen(capsys, make_pack):
    cli(capsys, "plugins")
    make_pack("later", GOOD)
    _, out, _ = cli(capsys, "plugins", "--json")
    assert {r["name"]: r["status"] for r in json.loads(out)}["later"] == "loaded"


def test_an_edit_of_a_source_pack_is_seen(capsys, tmp_path, monkeypatch):
    """A pack whose package is a source tree on the path (as an editable install's is)."""
    source = tmp_path / "src"
    module = source / "opreg_testpack_edited"
    module.mkdir(parents=True)
    site = tmp_path / "site"
    info = site / "opreg_testpack_edited-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: opreg-testpack-edited\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[opreg.plugins]\nedited = opreg_testpack_edited\n")
    (module / "__init__.py").write_text("import opreg\nOPREG_API_VERSION = 1\n" + GOOD)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(source))
    try:
        _, out, _ = cli(capsys, "ops", "aten::neg", "--json", "--pack", "edited")
        assert [r["priority"] for r in json.loads(out)["impls"]] == [1]
        del sys.modules["opreg_testpack_edited"]
        (module / "__init__.py").write_text(
            "import opreg\nOPREG_API_VERSION = 1\n" + GOOD.replace("=1)", "=17)")
        )  # size differs: pyc checks whole seconds
        _, out, _ = cli(capsys, "ops", "aten::neg", "--json", "--pack", "edited")
        assert [r["priority"] for r in json.loads(out)["impls"]] == [17]
    finally:
        sys.modules.pop("opreg_testpack_edited", None)


def test_the_cache_is_left_alone_when_a_pack_changes_while_it_loads(tmp_path):
    source = tmp_path / "pack.py"
    source.write_text("x = 1\n")
    before = fingerprint.file_state([str(source)])
    source.write_text("x = 22\n")  # what a pack's edit during the loading looks like
    packcache.write(Selection.of(), opreg.packs.plugins.Declared((), ()), before, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
    packcache.write(
        Selection.of(),
        opreg.packs.plugins.Declared((), ()),
        fingerprint.file_state([str(source)]),
        tmp_path / "c" / packcache.SUBDIR,
    )
    assert len(entries(tmp_path / "c")) == 1


def test_location_and_switches(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv(packcache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert packcache.cache_dir() == tmp_path / "xdg" / "opreg" / "declared"
    monkeypatch.setenv(packcache.CACHE_ENV, str(tmp_path / "mine"))
    assert packcache.cache_dir() == tmp_path / "mine" / "declared"
    cli(capsys, "plugins", "--no-cache")
    assert not (tmp_path / "mine").exists()
    monkeypatch.setenv(packcache.NO_CACHE_ENV, "1")
    assert packcache.cache_dir() is None
    cli(capsys, "ops", "gelu")
    assert not (tmp_path / "mine").exists()
    monkeypatch.delenv(packcache.NO_CACHE_ENV)
    cli(capsys, "explain", "aten::gelu")
    (entry,) = entries(tmp_path / "mine")
    entry.write_text("{not json")  # a damaged entry is loaded over, never an error
    code, out, _ = cli(capsys, "plugins", "--json")
    assert code == 0 and "core" in out and json.loads(entry.read_text())["key"]["format"] == packcache.FORMAT


def test_a_cache_that_cannot_be_written_is_no_error(capsys, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(packcache.CACHE_ENV, str(blocked / "cache"))
    code, out, _ = cli(capsys, "plugins", "--json")
    assert code == 0 and "core" in out


def test_cached_failures_read_as_loaded_ones(capsys, make_pack):
    make_pack("broken", "raise ImportError('missing dependency frob')")
    for _ in range(2):  # loaded, then cached
        code, out, err = cli(capsys, "plugins")
        assert code == 0 and "missing dependency frob" in out
        code, _, err = cli(capsys, "plugins", "--strict")
        assert code == 1 and err.startswith("opreg: error: strict mode: pack 'broken'")
    with pytest.raises(PluginError):
        opreg.packs.plugins.declared_registry(strict=True)


PACK_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "opreg-cachedpack"
version = "{version}"

[project.entry-points."opreg.plugins"]
cachedpack = "opreg_cachedpack"

[tool.setuptools]
packages = ["opreg_cachedpack"]
"""

PACK_MODULE = """\
import sys

from onnxscript.onnx_opset import opset18 as op18

import opreg

OPREG_API_VERSION = 1


@opreg.impl("aten::neg", opset=18, priority={priority})
def cached_neg(self):
    return op18.Neg(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register_module(sys.modules[__name__])
"""


def write_source(source: Path, version: str, priority: int) -> None:
    (source / "opreg_cachedpack").mkdir(parents=True, exist_ok=True)
    (source / "pyproject.toml").write_text(PACK_PYPROJECT.format(version=version))
    (source / "opreg_cachedpack" / "__init__.py").write_text(PACK_MODULE.format(priority=priority))


def test_pip_install_reinstall_edit_and_uninstall_are_never_served_stale(tmp_path):
    """A real distribution, installed by pip into a venv of its own: each change is seen by the next run."""
    python = layered_venv(tmp_path / "venv")
    cache, source = tmp_path / "cache", tmp_path / "source"

    def pip(*args: str) -> None:
        done = run_clean(python, "-m", "pip", *args, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr

    def pack() -> tuple[dict | None, dict]:
        out, imported = probe(python, cache, "ops", "aten::neg", "--json", cwd=tmp_path)
        rows = [r for r in json.loads(out)["impls"] if r["pack"] == "cachedpack"]
        return (rows[0] if rows else None), imported

    def version() -> str | None:
        out, _ = probe(python, cache, "plugins", "--json", cwd=tmp_path)
        return {r["name"]: r["version"] for r in json.loads(out)}.get("cachedpack")

    install = ("install", "-q", "--no-deps", "--no-build-isolation", "--no-index")
    assert pack()[0] is None
    write_source(source, "0.1", priority=1)
    pip(*install, str(source))
    row, imported = pack()
    assert row["priority"] == 1 and row["status"] == "chosen" and imported["heavy"]
    row, imported = pack()
    assert row["priority"] == 1 and imported["heavy"] == []  # nothing changed: read from the cache
    assert version() == "0.1"

    write_source(source, "0.1", priority=2)  # the same version, other code, installed again
    pip(*install, "--force-reinstall", str(source))
    assert pack()[0]["priority"] == 2

    write_source(source, "0.2", priority=3)  # an upgrade
    pip(*install, "--upgrade", str(source))
    assert pack()[0]["priority"] == 3 and version() == "0.2"

    pip("uninstall", "-y", "-q", "opreg-cachedpack")
    assert pack()[0] is None and version() is None

    pip(*install, "-e", str(source))  # editable: an edit of its source is seen without reinstalling
    assert pack()[0]["priority"] == 3
    (source / "opreg_cachedpack" / "__init__.py").write_text(PACK_MODULE.format(priority=4))
    assert pack()[0]["priority"] == 4
    row, imported = pack()
    assert row["priority"] == 4 and imported["heavy"] == []


def test_the_docs_say_where_the_cache_lives_and_how_to_turn_it_off():
    text = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md")) + (ROOT / "README.md").read_text()
    for needle in (packcache.CACHE_ENV, packcache.NO_CACHE_ENV, "--no-cache", "~/.cache/opreg"):
        assert needle in text, needle


def test_cached_reports_keep_their_fields(tmp_path):
    declared, _ = opreg.packs.plugins.load_packs(Selection.of())
    selection = Selection.of()
    packcache.write(selection, declared, [], tmp_path)
    again = packcache.read(selection, tmp_path)
    assert again is not None and again.reports == declared.reports
    assert [declaration.impl_data(i) for i in again.impls] == [declaration.impl_data(i) for i in declared.impls]
    assert again.profiles == tuple((n, dict(v), p) for n, v, p in declared.profiles)
    assert again.unsupported == declared.unsupported


WRONG_TYPES = {
    "report-name-a-list": lambda d: d["reports"][0].update(name=[]),
    "report-impls-a-string": lambda d: d["reports"][0].update(impls="460"),
    "report-rejected-a-dict": lambda d: d["reports"][0].update(rejected={}),
    "report-missing-a-field": lambda d: d["reports"][0].pop("status"),
    "impl-onnx-a-number": lambda d: d["impls"][0].update(onnx=18),
    "impl-priority-a-bool": lambda d: d["impls"][0].update(priority=True),
    "impl-domain-too-short": lambda d: d["impls"][0].update(domains=[["com.microsoft", 1]]),
    "profile-versions-a-list": lambda d: d["profiles"].append(["p", [1], "core"]),
    "unsupported-a-number": lambda d: d["unsupported"].append(3),
    "reports-an-object": lambda d: d.update(reports={}),
}


def test_an_entry_of_wrong_types_is_rebuilt(capsys, tmp_path, monkeypatch):
    """Round 4: a well-formed JSON entry whose values have other types than opreg writes is loaded
    over, as a truncated one is, never an internal error of every later command."""
    monkeypatch.setenv(packcache.CACHE_ENV, str(tmp_path))
    cli(capsys, "plugins", "--json")
    (entry,) = entries(tmp_path)
    good = entry.read_text()
    for name, spoil in WRONG_TYPES.items():
        data = json.loads(good)
        spoil(data["declared"])
        entry.write_text(json.dumps(data))
        assert packcache.read(Selection.of(), tmp_path / packcache.SUBDIR) is None, name
    entry.write_text(good)
    assert packcache.read(Selection.of(), tmp_path / packcache.SUBDIR) is not None
    data = json.loads(good)
    WRONG_TYPES["report-name-a-list"](data["declared"])  # the case found: every command was an internal error
    entry.write_text(json.dumps(data))
    for argv in (["plugins", "--json"], ["explain", "aten::relu", "--json"], ["ops", "aten::relu", "--json"]):
        code, out, err = cli(capsys, *argv)
        assert (code, err) == (0, "") and "core" in out, (argv, err)
    rebuilt = json.loads(entry.read_text())["declared"]
    assert declaration.shape_problem(rebuilt, declaration.SHAPE, "declared") is None
    assert rebuilt["reports"][0]["name"] == "core"


FOR_ONNXRUNTIME = """
from onnxscript.onnx_opset import opset20 as op20


@opreg.impl("aten::gelu", priority=11, profiles=("onnxruntime",))
def aten_gelu_tanh(self, approximate: str = "none"):
    return op20.Gelu(self, approximate="tanh")


@opreg.hookimpl
def opreg_register_ops(registry):
    import sys

    registry.register_module(sys.modules[__name__])
"""


def test_an_impl_for_a_profile_resolves_alike_from_the_cache(make_pack):
    make_pack("forort", FOR_ONNXRUNTIME)
    loaded = opreg.packs.plugins.declared_registry()
    cached = opreg.packs.plugins.declared_registry()
    assert loaded.packs == cached.packs and "forort" in cached.packs.loaded
    for registry in (loaded, cached):
        (impl,) = [i for i in registry.impls("aten::gelu") if i.pack == "forort"]
        assert impl.profiles == ("onnxruntime",)
        assert registry.resolve("aten::gelu", "onnxruntime").pack == "forort"
        assert registry.resolve("aten::gelu", "onnx,com.microsoft=1").pack == "forort"  # what the profile names
        assert registry.resolve("aten::gelu", "onnx").pack == "core"
    for target in ("onnx", "onnxruntime"):
        assert str(cached.explain("aten::gelu", target)) == str(loaded.explain("aten::gelu", target))
    (row,) = [c for c in cached.explain("aten::gelu", "onnx").candidates if c.impl.pack == "forort"]
    assert (row.status, row.reason) == ("dropped", "only for profile onnxruntime, which needs com.microsoft=1")


def test_ops_and_explain_show_the_profiles_an_impl_is_for(capsys, make_pack):
    make_pack("forort", FOR_ONNXRUNTIME)
    code, out, _ = cli(capsys, "ops", "aten::gelu", "--pack", "forort", "--json", "-t", "onnxruntime")
    (row,) = json.loads(out)["impls"]
    assert code == 0 and (row["profiles"], row["status"]) == (["onnxruntime"], "chosen")
    code, out, _ = cli(capsys, "ops", "aten::gelu", "--pack", "forort", "-t", "onnxruntime")
    assert code == 0 and "; for profile" in out  # the requires column: ai.onnx>=20; for profile onnxruntime
    code, out, _ = cli(capsys, "explain", "aten::gelu", "-t", "onnx", "--json")
    (row,) = [c for c in json.loads(out)["candidates"] if c["pack"] == "forort"]
    assert (row["profiles"], row["status"]) == (["onnxruntime"], "dropped")
    assert row["reason"] == "only for profile onnxruntime, which needs com.microsoft=1"


# -- a registry build takes what its packs' impls were found to be from the cache --------------


def _analysed(registry: opreg.Registry) -> list[tuple]:
    """Every impl of ``registry`` with what it was found to be: the impl (functions and predicates by
    identity) and its parameters, which an impl does not compare."""
    return [(impl, impl.params) for impl in registry.impls()]


def test_a_build_takes_its_impls_from_the_cache_and_they_are_what_reading_them_gives(caplog):
    with packcache.off():
        read = opreg.packs.plugins.build()  # every impl's function read
    assert entries(Path(os.environ[packcache.CACHE_ENV])) == []
    opreg.packs.plugins.build()  # no entry yet: reads every function and writes one
    assert len(entries(Path(os.environ[packcache.CACHE_ENV]))) == 1
    with caplog.at_level("DEBUG", logger="opreg.packs.plugins"):
        cached = opreg.packs.plugins.build()
    count = len(read.registry)
    assert f"{count} of {count} impls as the pack cache knew them" in caplog.text
    assert _analysed(cached.registry) == _analysed(read.registry) and count > 400
    assert [i.params for i in cached.registry.impls()] == [i.params for i in read.registry.impls()]
    assert cached.registry.unsupported() == read.registry.unsupported()
    assert cached.registry.profiles == read.registry.profiles
    assert [r.name for r in cached.registry.packs] == [r.name for r in read.registry.packs]


EDITED_PACK = """import sys

import opreg
from onnxscript.onnx_opset import opset{version} as op

OPREG_API_VERSION = 1


@opreg.impl("aten::neg", priority=1)
def edited_neg(self{extra}):{padding}
    return op.Neg(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register_module(sys.modules[__name__])
"""


def editable_pack(tmp_path: Path, monkeypatch, name: str) -> Path:
    """An installed pack ``name`` (entry point ``name = opreg_testpack_NAME``) whose code lives in a
    folder on ``sys.path``, as an editable install's does: the returned package folder, empty."""
    source, site = tmp_path / "src", tmp_path / "site"
    module = source / f"opreg_testpack_{name}"
    module.mkdir(parents=True)
    info = site / f"opreg_testpack_{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: opreg-testpack-{name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[opreg.plugins]\n{name} = opreg_testpack_{name}\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(source))
    return module


def test_an_edited_pack_is_read_again_by_a_build(tmp_path, monkeypatch, caplog):
    """The same impl (op, name, declaration), its code edited: the build reads it again, never the
    cache's requirement or parameters from before the edit."""
    module = editable_pack(tmp_path, monkeypatch, "edited")

    def build(version: int, extra: str = "", padding: str = "") -> opreg.Registry:
        text = EDITED_PACK.format(version=version, extra=extra, padding=padding)
        init = module / "__init__.py"
        if not init.exists() or init.read_text() != text:
            init.write_text(text)
        sys.modules.pop("opreg_testpack_edited", None)
        opreg.packs.plugins.clear_cache()
        caplog.clear()
        with caplog.at_level("DEBUG", logger="opreg"):
            return opreg.packs.plugins.build(plugins=["edited"], exclude=["core"]).registry

    def neg(registry: opreg.Registry) -> opreg.Impl:
        (impl,) = registry.impls("aten::neg")
        assert impl.function.__module__ == "opreg_testpack_edited"
        return impl

    known = "1 of 1 impls as the pack cache knew them"
    try:
        assert str(neg(build(18)).requirement) == "ai.onnx>=18" and known not in caplog.text
        assert str(neg(build(18)).requirement) == "ai.onnx>=18" and known in caplog.text  # as the cache knew it
        edited = neg(build(20))  # opset20's Neg: the requirement is read from the code again
        assert str(edited.requirement) == "ai.onnx>=20"
        assert "changed since it was written" in caplog.text and known not in caplog.text
        assert neg(build(20)).requirement == edited.requirement and known in caplog.text  # the new entry
        widened = neg(build(20, extra=", alpha: float = 1.0"))  # a parameter more: read anew
        assert known not in caplog.text and [p.name for p in widened.params.params] == ["self", "alpha"]
        assert [p.name for p in neg(build(20)).params.params] == ["self"] and known not in caplog.text
    finally:
        sys.modules.pop("opreg_testpack_edited", None)
        opreg.packs.plugins.clear_cache()


LATE_PACK = """import sys

import opreg
from onnxscript.onnx_opset import opset18 as op

OPREG_API_VERSION = 1


@opreg.impl("opregtest_late::twice")
def late_twice(x):
    return op.Add(x, x)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register_module(sys.modules[__name__])
"""


def test_an_impl_cached_before_its_op_was_defined_is_checked_once_torch_knows_the_op(tmp_path, monkeypatch, caplog):
    """A pack's custom op defined with ``torch.library`` only after a build (as torchvision's are when a
    model's module is imported): the next build checks the impl against the schema instead of taking
    the cache's "not checked"."""
    import torch

    (editable_pack(tmp_path, monkeypatch, "late") / "__init__.py").write_text(LATE_PACK)

    def late() -> opreg.Impl:
        sys.modules.pop("opreg_testpack_late", None)
        opreg.packs.plugins.clear_cache()
        caplog.clear()
        with caplog.at_level("DEBUG", logger="opreg"):
            (impl,) = opreg.packs.plugins.build(plugins=["late"], exclude=["core"]).registry.impls(
                "opregtest_late::twice"
            )
        return impl

    library = None
    try:
        assert not late().schema_checked
        assert not late().schema_checked and "1 of 1 impls as the pack cache knew them" in caplog.text
        library = torch.library.Library("opregtest_late", "DEF")
        library.define("twice(Tensor x) -> Tensor")
        assert late().schema_checked and "0 of 1 impls as the pack cache knew them" in caplog.text
    finally:
        if library is not None:
            library._destroy()
        sys.modules.pop("opreg_testpack_late", None)
        opreg.packs.plugins.clear_cache()


def test_the_module_files_watched_are_those_whose_real_path_is_outside_the_installed_folders(tmp_path, monkeypatch):
    """An entry watches the imported modules that are not installed copies, by the real path of their
    file (what os.path.realpath gives), though each folder's real path is found once: a module reached
    through a linked folder, a linked file, or a link into an installed folder is judged where it is."""
    import types

    site, mine = tmp_path / "site", tmp_path / "mine"
    (site / "pkg").mkdir(parents=True)
    (mine / "deep").mkdir(parents=True)
    for path in (site / "pkg" / "a.py", mine / "b.py", mine / "deep" / "c.py"):
        path.write_text("")
    (tmp_path / "to_site").symlink_to(site)  # a linked folder into the installed one
    (tmp_path / "to_mine").symlink_to(mine / "deep")  # a linked folder out of it
    (site / "link_out.py").symlink_to(mine / "b.py")  # an installed-looking file that is the user's
    (mine / "link_in.py").symlink_to(site / "pkg" / "a.py")  # a user-looking file that is installed
    (mine / "dangling.py").symlink_to(mine / "gone.py")
    files = {
        "site_a": site / "pkg" / "a.py", "via_site": tmp_path / "to_site" / "pkg" / "a.py", "mine_b": mine / "b.py",
        "via_mine": tmp_path / "to_mine" / "c.py", "link_out": site / "link_out.py", "link_in": mine / "link_in.py",
        "dangling": mine / "dangling.py", "folder": mine / "deep", "relative": Path(os.path.relpath(mine / "b.py")),
    }  # fmt: skip
    for name, path in files.items():
        module = types.ModuleType(f"opreg_test_watched_{name}")
        module.__file__ = str(path)
        monkeypatch.setitem(sys.modules, module.__name__, module)
    roots = (os.path.join(os.path.realpath(site), ""),)
    watched = {Path(f) for f in fingerprint.module_files(roots)} & set(files.values())
    expected = {p for p in files.values() if os.path.isfile(p) and not os.path.realpath(p).startswith(roots)}
    assert watched == expected == {files[n] for n in ("mine_b", "via_mine", "link_out", "relative")}
