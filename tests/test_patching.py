"""Capture patches (opreg_capture_patches): installed only while a model that uses the patched code is
captured, reverted after, recorded, turned off by the user, failures reported against their pack, checked
by the kit. The patched library and the packs are real installed distributions written to a temp dir."""

from __future__ import annotations

import itertools
import json
import sys
import textwrap

import pytest
import torch

import opreg
from opreg.cli import main
from opreg.packs import patching
from opreg.testing import check_pack

_counter = itertools.count()

LIBRARY = """
import torch

def positive_sum(x):
    kept = x[x > 0]
    if kept.numel() == 0:  # a branch on a data-dependent size: torch.export cannot capture it
        return x.new_zeros(1)
    return kept.sum().reshape(1)

def double(x):
    return x * 2

class Scale:
    factor = 3.0

    def apply(self, x):
        if (x > 100).any():  # data-dependent control flow again
            return x
        return x * self.factor

class Model(torch.nn.Module):
    def forward(self, x):
        return double(positive_sum(x))

class Scaled(torch.nn.Module):
    def forward(self, x):
        return Scale().apply(x)
"""


@pytest.fixture
def library(make_pack):
    """Install a library distribution ``opreg-testlib-N`` 1.4 (module ``testlib_N``) and return its module name."""
    name = f"testlib_{next(_counter)}"
    root = make_pack.root
    (root / f"{name}.py").write_text(textwrap.dedent(LIBRARY))
    info = root / f"opreg_{name}-1.4.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: opreg-{name.replace('_', '-')}\nVersion: 1.4\n")
    (info / "top_level.txt").write_text(f"{name}\n")  # what it installs, as a wheel records it
    __import__(name)
    yield name
    sys.modules.pop(name, None)


def patch_pack(library: str, patches: str, extra: str = "") -> str:
    """The body of a pack offering ``patches`` (Python expressions of CapturePatch objects) for ``library``,
    with ``extra`` module-level code."""
    dist = f"opreg-{library.replace('_', '-')}"
    head = textwrap.dedent(f"""
        import torch
        from opreg import CapturePatch

        LIB = "{library}"
        VERSIONS = "{dist}>=1.0,<2"

        def positive_sum(x):
            return torch.where(x > 0, x, torch.zeros_like(x)).sum().reshape(1)

        def scale_apply(original, self, x):
            return torch.where((x > 100).any(), x, x * self.factor)

        def failing(x):
            raise RuntimeError("this replacement is broken")
    """)
    hook = f"\n@opreg.hookimpl\ndef opreg_capture_patches():\n    return [{patches}]\n"
    return head + textwrap.dedent(extra) + hook


POSITIVE = 'CapturePatch(name="positive_sum", module=LIB, function="positive_sum", versions=VERSIONS, ' \
    'replacement=positive_sum, reason="branches on kept.numel()")'  # fmt: skip


def model_of(library: str, name: str = "Model") -> torch.nn.Module:
    return getattr(sys.modules[library], name)()


def outcome(program, name: str) -> patching.PatchOutcome:
    (found,) = [o for o in program.capture_patches if o.name == name]
    return found


# -- applied, recorded, reverted --------------------------------------------------------------------------


def test_a_patch_makes_a_model_capturable_and_is_recorded(make_pack, library):
    make_pack("patcher", patch_pack(library, POSITIVE))
    x = torch.tensor([-1.0, 2.0, 3.0, -4.0])
    original = sys.modules[library].positive_sum
    with pytest.raises(opreg.ExportError, match="GuardOnDataDependentSymNode"):
        opreg.export(model_of(library), (x,), patches=False)
    program = opreg.export(model_of(library), (x,))
    applied = outcome(program, "positive_sum")
    assert (applied.status, applied.calls, applied.pack, applied.installed) == ("applied", 1, "patcher", "1.4")
    assert applied.target == f"{library}.positive_sum"
    (entry,) = json.loads(program.model.metadata_props[patching.METADATA_KEY])
    versions = f"opreg-{library.replace('_', '-')}>=1.0,<2"
    assert entry == {"patch": "patcher:positive_sum", "patches": f"{library}.positive_sum", "versions": versions,
                     "installed": "1.4", "calls": 1}  # fmt: skip
    assert "patcher" in program.model.metadata_props["opreg.packs"]
    program.verify(x)
    program.verify(-x.abs())  # no positive value: the eager branch the patch removed
    assert sys.modules[library].positive_sum is original  # reverted


def test_a_patch_is_reverted_when_the_capture_fails(make_pack, library):
    make_pack("patcher", patch_pack(library, POSITIVE))
    lib = sys.modules[library]
    original = lib.positive_sum

    class Broken(torch.nn.Module):
        def forward(self, x):
            lib.positive_sum(x)
            raise ValueError("the model itself is broken")

    with pytest.raises(opreg.ExportError, match="the model itself is broken"):
        opreg.export(Broken(), (torch.ones(3),))
    assert lib.positive_sum is original


def test_functions_imported_by_name_elsewhere_are_patched_too_and_restored(make_pack, library):
    make_pack("patcher", patch_pack(library, POSITIVE))
    lib = sys.modules[library]
    importer = type(sys)("opreg_test_importer")
    importer.positive_sum = lib.positive_sum  # `from testlib import positive_sum`
    sys.modules[importer.__name__] = importer
    seen = []

    class UsesTheCopy(torch.nn.Module):
        def forward(self, x):
            seen.append(importer.positive_sum)
            return importer.positive_sum(x)

    try:
        program = opreg.export(UsesTheCopy(), (torch.tensor([1.0, -2.0]),))
        assert outcome(program, "positive_sum").status == "applied"
        assert seen[0] is not lib.positive_sum and importer.positive_sum is lib.positive_sum
    finally:
        del sys.modules[importer.__name__]


def test_a_method_patch_can_wrap_the_original(make_pack, library):
    scale = ('CapturePatch(name="scale", module=LIB, function="Scale.apply", versions=VERSIONS, '
             'replacement=scale_apply, wraps_original=True)')  # fmt: skip
    make_pack("patcher", patch_pack(library, scale))
    original = sys.modules[library].Scale.__dict__["apply"]
    program = opreg.export(model_of(library, "Scaled"), (torch.tensor([1.0, 200.0]),))
    assert outcome(program, "scale").status == "applied"
    program.verify(torch.tensor([1.0, 2.0]))
    program.verify(torch.tensor([1.0, 200.0]))
    assert sys.modules[library].Scale.__dict__["apply"] is original


# -- applied only where the model uses the code ---------------------------------------------------------------


def test_a_patch_is_installed_only_for_models_that_use_the_code(make_pack, library):
    make_pack("patcher", patch_pack(library, POSITIVE))
    lib = sys.modules[library]

    class Unrelated(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class CallsIt(torch.nn.Module):  # not a module of the library, but its forward calls the function
        def forward(self, x):
            return lib.positive_sum(x)

    assert outcome(opreg.export(Unrelated(), (torch.ones(2),)), "positive_sum").status == "unused"
    assert outcome(opreg.export(CallsIt(), (torch.ones(2),)), "positive_sum").status == "applied"


def test_a_patch_for_other_versions_or_a_missing_library_is_not_installed(make_pack, library):
    wrong = POSITIVE.replace("versions=VERSIONS", 'versions=VERSIONS.replace(">=1.0,<2", ">=2")')
    missing = POSITIVE.replace('name="positive_sum"', 'name="missing"').replace(
        "versions=VERSIONS", 'versions="opreg-no-such-library>=1"'
    )
    make_pack("patcher", patch_pack(library, f"{wrong}, {missing}"))
    x = torch.tensor([1.0, -2.0])
    with pytest.raises(opreg.ExportError):
        opreg.export(model_of(library), (x,))
    explained = opreg.export(torch.nn.ReLU(), (x,)).capture_patches
    by_name = {o.name: o for o in explained}
    assert by_name["positive_sum"].status == "incompatible" and "1.4 is installed" in by_name["positive_sum"].detail
    assert by_name["missing"].status == "unused" and "not installed" in by_name["missing"].detail


def test_an_unreached_patch_is_installed_but_not_recorded(make_pack, library):
    never = POSITIVE.replace('name="positive_sum"', 'name="scale"').replace('function="positive_sum"',
                                                                            'function="Scale.apply"')  # fmt: skip
    make_pack("patcher", patch_pack(library, f"{POSITIVE}, {never}"))
    program = opreg.export(model_of(library), (torch.tensor([1.0, -2.0]),))
    assert outcome(program, "scale").status == "unreached"
    assert [e["patch"] for e in json.loads(program.model.metadata_props[patching.METADATA_KEY])] == [
        "patcher:positive_sum"
    ]


# -- turned off by the user ----------------------------------------------------------------------------------------


def test_users_turn_patches_off_all_or_by_name(make_pack, library):
    make_pack("patcher", patch_pack(library, POSITIVE))
    x = torch.tensor([1.0, -2.0])
    for options in ({"patches": False}, {"exclude_patches": ["patcher:positive_sum"]},
                    {"exclude_patches": [f"{library}.positive_sum"]}):  # fmt: skip
        with pytest.raises(opreg.ExportError, match="GuardOnDataDependentSymNode"):
            opreg.export(model_of(library), (x,), **options)
    program = opreg.export(torch.nn.ReLU(), (x,), exclude_patches=["positive_sum"])
    assert outcome(program, "positive_sum").status == "disabled"
    with pytest.raises(opreg.InvalidArgumentError, match=r"no capture patch is named 'nope'.*patcher:positive_sum"):
        opreg.export(model_of(library), (x,), exclude_patches=["nope"])
    with pytest.raises(opreg.InvalidArgumentError, match="list of patch names"):
        opreg.export(model_of(library), (x,), exclude_patches="patcher:positive_sum")


def test_a_registry_copy_takes_patches_of_ones_own(library):
    lib = sys.modules[library]
    registry = opreg.default_registry().copy()
    registry.add_capture_patch(opreg.CapturePatch(
        name="mine", module=library, function="positive_sum", versions=f"opreg-{library.replace('_', '-')}",
        replacement=lambda x: torch.where(x > 0, x, torch.zeros_like(x)).sum().reshape(1),
    ))  # fmt: skip
    with pytest.raises(opreg.InvalidArgumentError, match="already added"):
        registry.add_capture_patch(registry.capture_patches()[0][1])
    with pytest.raises(opreg.FrozenRegistryError):
        opreg.default_registry().add_capture_patch(registry.capture_patches()[0][1])
    program = opreg.export(lib.Model(), (torch.tensor([3.0, -1.0]),), registry=registry)
    assert outcome(program, "mine").label == "<user>:mine"


# -- failures are reported against their pack; the capture goes on without them ---------------------------------


def test_a_patch_that_raises_is_reported_and_the_capture_goes_on_without_it(make_pack, library):
    broken = ('CapturePatch(name="double", module=LIB, function="double", versions=VERSIONS, '
              'replacement=failing)')  # fmt: skip
    absent = 'CapturePatch(name="absent", module=LIB, function="no_such_function", versions=VERSIONS, ' \
        'replacement=failing)'  # fmt: skip
    make_pack("patcher", patch_pack(library, f"{POSITIVE}, {broken}, {absent}"))
    x = torch.tensor([1.0, -2.0, 5.0])
    with pytest.warns(opreg.PackWarning) as warned:
        program = opreg.export(model_of(library), (x,))
    double, absent_ = outcome(program, "double"), outcome(program, "absent")
    assert double.status == "failed" and "this replacement is broken" in double.detail
    assert "captured again without it" in double.detail
    assert absent_.status == "failed" and "has no no_such_function" in absent_.detail
    assert outcome(program, "positive_sum").status == "applied"
    messages = [str(w.message) for w in warned]
    assert any(m.startswith("pack 'patcher': capture patch patcher:double left out: it raised") for m in messages)
    assert all(w.filename == __file__ for w in warned)  # the user's line, not opreg's
    assert {f.name for f in program.pack_faults} == {"patcher:double", "patcher:absent"}
    recorded = json.loads(program.model.metadata_props["opreg.pack_faults"])
    assert {e["name"] for e in recorded} == {"patcher:double", "patcher:absent"}
    program.verify(x)
    assert sys.modules[library].double.__name__ == "double" and sys.modules[library].double(2) == 4


CONTEXTS = """
import contextlib, sys

def _replace_double():
    sys.modules[LIB].double = lambda x: x * 2

@contextlib.contextmanager
def bad_exit():  # patches, and raises instead of reverting
    original = sys.modules[LIB].double
    _replace_double()
    yield
    raise OSError("cannot put it back")

@contextlib.contextmanager
def never_reverts():
    _replace_double()
    yield

@contextlib.contextmanager
def bad_enter():  # patches, then fails before it is entered
    _replace_double()
    raise RuntimeError("cannot install")
    yield

@contextlib.contextmanager
def interrupted_enter():
    _replace_double()
    raise KeyboardInterrupt
    yield
"""


def _context_patches(library: str, *names: str) -> str:
    return ", ".join(
        f'CapturePatch(name="{name}", module=LIB, function="double", versions=VERSIONS, context={name})'
        for name in names
    )


@pytest.mark.parametrize("name", ["bad_exit", "never_reverts", "bad_enter"])
def test_a_context_patch_is_reverted_whatever_it_does(make_pack, library, name):
    """Round 4: a context patch that raises in __enter__ after patching, raises in __exit__, or
    never reverts: the library's function is put back after the capture and the patch is
    reported by name (a PackWarning, the outcome, the model's metadata). One the capture ran
    with is ``applied``: the model holds it."""
    make_pack("patcher", patch_pack(library, f"{POSITIVE}, {_context_patches(library, name)}", CONTEXTS))
    lib = sys.modules[library]
    original = lib.double
    with pytest.warns(opreg.PackWarning, match=rf"pack 'patcher': capture patch patcher:{name} "):
        program = opreg.export(model_of(library), (torch.tensor([1.0, -2.0]),))
    assert lib.double is original
    found = outcome(program, name)
    put_back = f"it left {library}.double changed after the capture; opreg put the original back"
    expected = {
        "bad_exit": (
            "applied",
            f"installed for the capture; reverting it raised OSError: cannot put it back; {put_back}",
        ),
        "never_reverts": ("applied", f"installed for the capture; {put_back}"),
        "bad_enter": ("failed", f"installing it raised RuntimeError: cannot install; {put_back}"),
    }[name]
    assert (found.status, found.detail) == expected
    (fault,) = program.pack_faults
    assert (fault.pack, fault.kind, fault.name) == ("patcher", "capture patch", f"patcher:{name}")
    assert put_back in fault.detail
    (entry,) = json.loads(program.model.metadata_props["opreg.pack_faults"])
    assert entry["name"] == f"patcher:{name}" and put_back in entry["detail"]


def test_an_interrupt_while_a_patch_installs_leaves_the_library_as_it_was(make_pack, library):
    make_pack("patcher", patch_pack(library, f"{POSITIVE}, {_context_patches(library, 'interrupted_enter')}", CONTEXTS))
    lib = sys.modules[library]
    originals = lib.double, lib.positive_sum
    with pytest.raises(KeyboardInterrupt):
        opreg.export(model_of(library), (torch.tensor([1.0, -2.0]),))
    assert (lib.double, lib.positive_sum) == originals


class _ReadOnly(type(sys)):
    """A module that refuses new attributes (as some lazy-loading modules do)."""

    def __setattr__(self, name, value):
        raise AttributeError(f"module {self.__name__!r} is read-only")


def test_a_patch_whose_install_fails_halfway_is_reverted_by_its_own_revert(make_pack, library):
    """Round 4, the mutation survivor: the patch replaced the library's function, then a module
    that imported it by name refused the replacement. Its own revert puts the first back (the
    after-capture check then finds nothing to restore, and does not say it had to)."""
    double = (
        'CapturePatch(name="double", module=LIB, function="double", versions=VERSIONS, replacement=lambda x: x * 2)'
    )
    make_pack("patcher", patch_pack(library, f"{POSITIVE}, {double}"))
    lib = sys.modules[library]
    original = lib.double
    importer = _ReadOnly("opreg_test_read_only")
    vars(importer)["double"] = original  # `from testlib import double`
    sys.modules[importer.__name__] = importer
    try:
        with pytest.warns(opreg.PackWarning, match="capture patch patcher:double left out: installing it raised"):
            program = opreg.export(model_of(library), (torch.tensor([1.0, -2.0]),))
    finally:
        del sys.modules[importer.__name__]
    found = outcome(program, "double")
    assert found.status == "failed"
    assert found.detail == "installing it raised AttributeError: module 'opreg_test_read_only' is read-only"
    assert lib.double is original and importer.double is original
    assert outcome(program, "positive_sum").status == "applied"


def test_versions_must_name_the_distribution_that_installed_the_patched_code(make_pack, library):
    """Round 4: ``versions="torch>=2"`` on the library's function is checked against torch's version
    although the library is another distribution's: refused, with the distribution to name."""
    foreign = POSITIVE.replace('name="positive_sum"', 'name="foreign"').replace(
        "versions=VERSIONS", 'versions="torch>=2"'
    )
    make_pack("patcher", patch_pack(library, f"{POSITIVE}, {foreign}"))
    with pytest.warns(opreg.PackWarning, match="capture patch patcher:foreign left out: versions='torch>=2' names"):
        program = opreg.export(model_of(library), (torch.tensor([1.0, -2.0]),))
    found = outcome(program, "foreign")
    dist = f"opreg-{library.replace('_', '-')}"
    assert found.status == "failed"
    assert found.detail == (
        f"versions='torch>=2' names the distribution 'torch', but {library} is installed by {dist}: a patch's "
        f"versions are those of the code it patches (e.g. '{dist}>=...'); the patch is not installed"
    )
    assert outcome(program, "positive_sum").status == "applied"
    assert sys.modules[library].positive_sum.__module__ == library


def test_the_kits_installed_block_restores_what_a_patch_left(make_pack, library):
    make_pack("patcher", patch_pack(library, _context_patches(library, "never_reverts"), CONTEXTS))
    lib = sys.modules[library]
    original = lib.double
    offer = patching.offered(opreg.default_host())
    patched = patching.PatchedCapture(offer)
    with (
        pytest.warns(opreg.PackWarning, match="patcher:never_reverts it left"),
        patched.installed(model_of(library)) as outcomes,
    ):
        assert lib.double is not original
    assert lib.double is original
    assert "opreg put the original back" in outcomes[0].detail


def test_a_hook_that_raises_or_returns_junk_costs_its_pack_its_patches_only(make_pack, library):
    make_pack("patcher", patch_pack(library, POSITIVE))
    make_pack("junk", "@opreg.hookimpl\ndef opreg_capture_patches():\n    return ['not a patch']\n")
    make_pack("raiser", "@opreg.hookimpl\ndef opreg_capture_patches():\n    raise KeyError('boom')\n")
    program = opreg.export(model_of(library), (torch.tensor([1.0, -2.0]),))
    assert outcome(program, "positive_sum").status == "applied"
    problems = {o.pack: o for o in program.capture_patches if o.status == "failed"}
    assert "'not a patch' is not an opreg.CapturePatch" in problems["junk"].detail
    assert "KeyError" in problems["raiser"].detail


@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "a:b"}, "name must be"),
    ({"module": "not a module"}, "module must be a dotted name"),
    ({"replacement": None}, "exactly one of replacement= and context="),
    ({"versions": "just words here"}, "versions must name the distribution"),
    ({"used_by": "torchvision"}, "used_by must be a tuple"),
])  # fmt: skip
def test_a_malformed_patch_says_what_to_fix(fields, message):
    good = {"name": "p", "module": "lib.mod", "function": "f", "versions": "lib>=1", "replacement": abs}
    with pytest.raises(opreg.InvalidArgumentError, match=message):
        opreg.CapturePatch(**{**good, **fields})


# -- the command line ---------------------------------------------------------------------------------------


def test_cli_explains_patches_and_turns_them_off(make_pack, library, capsys, tmp_path):
    make_pack("patcher", patch_pack(library, POSITIVE))
    code = main(["explain", "patches", "--json"])
    out = json.loads(capsys.readouterr().out)
    (row,) = [r for r in out["capture_patches"] if r["patch"] == "patcher:positive_sum"]
    assert code == 0 and row["applies"] and row["installed"] == "1.4" and row["reason"] == "branches on kept.numel()"
    assert main(["explain", "patcher:positive_sum"]) == 0
    assert "patcher:positive_sum" in capsys.readouterr().out
    assert main(["explain", "nothing-like-this"]) == 2
    assert "neither a torch op" in capsys.readouterr().err

    models = tmp_path / "models.py"
    models.write_text(
        f"import torch, {library}\ndef make():\n    return {library}.Model(), (torch.tensor([1.0, -2.0]),)\n"
    )
    out_file = tmp_path / "m.onnx"
    assert main(["export", f"{models}:make", "-o", str(out_file), "--no-patches"]) == 2
    assert "GuardOnDataDependentSymNode" in capsys.readouterr().err
    assert main(["export", f"{models}:make", "-o", str(out_file), "--no-patch", "patcher:positive_sum"]) == 2
    capsys.readouterr()
    assert main(["export", f"{models}:make", "-o", str(out_file)]) == 0
    assert "capture patches applied: patcher:positive_sum (1 calls)" in capsys.readouterr().out
    assert main(["inspect", str(out_file)]) == 0
    inspected = capsys.readouterr().out
    assert "capture patches applied while capturing" in inspected and f"{library}.positive_sum" in inspected


# -- the conformance kit ------------------------------------------------------------------------------------


def test_the_kit_compares_each_patch_on_its_samples(make_pack, library):
    wrong = """
    def off_by_one(x):
        return torch.where(x > 0, x, torch.zeros_like(x)).sum().reshape(1) + 1
    """
    patches = (
        f"{POSITIVE}, "
        + POSITIVE.replace('name="positive_sum"', 'name="wrong"').replace(
            "replacement=positive_sum", "replacement=off_by_one"
        )
        + ', CapturePatch(name="lonely", module=LIB, function="double", versions=VERSIONS, replacement=lambda x: x * 2)'
    )
    samples = """
    @opreg.hookimpl
    def opreg_capture_samples():
        import sys
        from opreg.testing import ModelSample
        model = sys.modules[LIB].Model()
        unrelated = torch.nn.ReLU()
        mixed = torch.tensor([1.0, -2.0])
        return {"positive_sum": [ModelSample.of(model, mixed), ModelSample.of(model, -torch.ones(3))],
                "wrong": [ModelSample.of(model, mixed), ModelSample.of(unrelated, torch.ones(2))]}
    """
    make_pack("patcher", patch_pack(library, patches, wrong) + textwrap.dedent(samples))
    report = check_pack("patcher")
    rows = {}
    for r in report.results:
        if r.check == "patches":
            rows.setdefault(r.subject, []).append(r)
    assert [r.status for r in rows["patcher:positive_sum"]] == ["passed", "passed"]
    assert "called 1 time(s)" in rows["patcher:positive_sum"][0].detail
    wrong_rows = rows["patcher:wrong"]
    assert wrong_rows[0].status == "failed" and "output 0" in wrong_rows[0].detail
    assert wrong_rows[1].status == "failed" and "does not reach the patch" in wrong_rows[1].detail
    assert rows["patcher:lonely"][0].status == "skipped"
    with pytest.raises(AssertionError, match="failures"):
        report.assert_ok()
    assert "patch patcher:lonely" in report.unsampled
