"""The conformance kit (opreg.testing.check_pack), its pytest plugin and `opreg pack-check`:
first-party packs pass; throwaway packs with one real mistake each fail, naming it."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from opreg.cli import main
from opreg.errors import PluginNotFoundError
from opreg.testing import CheckResult, PackCheck, check_pack
from opreg.testing._kit import CHECKS, find_pack, impl_targets

RELU_LIKE_CORE = """
from onnxscript.onnx_opset import opset18 as op18


def aten_relu_tied(self):
    \"\"\"relu(Tensor self) -> Tensor, exactly as the core pack's (same opset, same priority).\"\"\"
    return op18.Relu(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::relu", aten_relu_tied, opset=18)
"""

WRONG_RELU = """
from onnxscript.onnx_opset import opset18 as op18


def aten_relu_wrong(self):
    \"\"\"relu(Tensor self) -> Tensor, written as Abs by mistake.\"\"\"
    return op18.Abs(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::relu", aten_relu_wrong, opset=18, priority=5)
"""

NO_KERNEL = """
import onnxscript
from onnxscript.onnx_opset import opset18 as op18

fast = onnxscript.values.Opset("my.kernels", 1)


def aten_relu_fast(self):
    \"\"\"relu(Tensor self) -> Tensor on a kernel nobody ships.\"\"\"
    return onnxscript.values.Op(fast, "FastRelu")(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::relu", aten_relu_fast, opset=18, domains={"my.kernels": 1}, priority=5)
"""

WRONG_HOOK_TYPES = """
@opreg.hookimpl
def opreg_reference_kernels():
    return ["not a kernel class"]


@opreg.hookimpl
def opreg_samples():
    return [1, 2, 3]
"""


def failed(report: PackCheck, check: str) -> list[CheckResult]:
    assert check in CHECKS
    return [r for r in report.results if r.check == check and r.status == "failed"]


# -- the API ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["test_customop", "opreg-test-customop", "opreg_test_customop", "OPREG.test-customop"])
def test_a_pack_is_found_by_pack_distribution_or_module_name(name):
    assert find_pack(name).name == "test_customop"


def test_an_unknown_pack_is_an_error_listing_the_installed_ones():
    with pytest.raises(PluginNotFoundError, match=r"no installed pack named 'nope'.*ort_contrib \(opreg-ort-contrib\)"):
        check_pack("nope")


@pytest.mark.parametrize("pack", ["test_customop"])
def test_first_party_packs_pass(opreg_pack_check, pack):
    """Each first-party pack runs the kit in its own tests (``plugins/*/tests``); this reads the
    report of the smallest one closely. ``ort_contrib``'s (a minute and a half on a busy machine)
    is read in ``plugins/ort_contrib/tests/test_ort_contrib.py``, not run a second time here."""
    report = opreg_pack_check(pack)
    report.assert_ok()
    assert report.ok and report.pack == pack
    assert {r.check for r in report.results} == set(CHECKS)
    samples = [r for r in report.results if r.check == "samples"]
    assert samples and all(r.status == "passed" for r in samples)
    # Every impl at the lowest and the highest ai.onnx version it claims.
    import opreg

    impls = [i for i in opreg.default_registry(plugins=[pack]).impls() if i.pack == pack]
    expected = {f"ai.onnx={target['']}" for impl in impls for target in impl_targets(impl)}
    assert {"ai.onnx=18", f"ai.onnx={_newest()}"} <= expected
    assert {r.target.split(",")[0] for r in samples} == expected
    text = str(report)
    assert text.splitlines()[0] == report.summary()
    assert "check" in text.splitlines()[1] and "detail" in text.splitlines()[1]


def _newest() -> int:
    from opreg import newest_supported_opset

    return newest_supported_opset()


def test_custom_ops_are_driven_with_the_packs_samples(opreg_pack_check):
    report = opreg_pack_check("test_customop")
    (row, *_) = [r for r in report.results if r.check == "samples"]
    assert row.subject == "test_customop:custom_addandround for mylibrary::addandround_op.default"
    assert row.detail.startswith("opreg_samples: 4 sample(s) match")
    kernels = [r for r in report.results if r.check == "kernels" and r.subject != "onnxruntime"]
    (kernels,) = kernels  # the runtime's table has its own row
    assert kernels.subject == "test.customop" and "reference kernels CustomOpOne, CustomOpTwo" in kernels.detail


def test_impl_targets_cover_both_ends_of_every_range():
    from opreg import Registry

    def custom_thing(self):
        """custom: no torch schema."""
        return self

    registry = Registry()
    impl = registry.register("mylib::thing", custom_thing, opset=(17, 20), domains={"a.b": (1, 3), "c.d": 2})
    assert impl_targets(impl) == [
        {"": 18, "a.b": 1, "c.d": 2},
        {"": 18, "a.b": 3, "c.d": 2},
        {"": 20, "a.b": 1, "c.d": 2},
        {"": 20, "a.b": 3, "c.d": 2},
    ]


# -- throwaway packs, one mistake each ----------------------------------------------


def test_a_pack_importing_onnxruntime_at_import_time_fails(make_pack):
    make_pack("eager", "import onnxruntime  # at module level: every registry build pays for it\n")
    report = check_pack("eager")
    (row,) = failed(report, "import")
    assert row.subject.startswith("eager = opreg_testpack_eager") and "imports onnxruntime" in row.detail
    assert not report.ok
    with pytest.raises(AssertionError, match=r"(?s)1 failed.*\[import\] eager = .*imports onnxruntime"):
        report.assert_ok()


def test_a_pack_importing_torch_passes_with_a_note(make_pack):
    make_pack("torchy", "import torch\n")
    (row,) = [r for r in check_pack("torchy").results if r.check == "import"]
    assert row.status == "passed" and "imports torch" in row.detail


def test_a_hook_returning_the_wrong_type_fails_naming_the_hook(make_pack):
    make_pack("badhooks", WRONG_HOOK_TYPES)
    rows = failed(check_pack("badhooks"), "hooks")
    by_hook = {r.subject: r.detail for r in rows}
    assert by_hook == {
        "opreg_reference_kernels": "'not a kernel class' is not an onnx.reference.op_run.OpRun subclass",
        "opreg_samples": "must return a dict {torch_op: [Sample, ...]}, got list",
    }


def test_a_hook_that_raises_fails(make_pack):
    make_pack("raises", "@opreg.hookimpl\ndef opreg_configure_session(options):\n    raise OSError('no lib.so')\n")
    (row,) = failed(check_pack("raises"), "hooks")
    assert row.subject == "opreg_configure_session" and row.detail == "raised OSError: no lib.so"


def test_a_silent_tie_with_the_core_pack_fails(make_pack):
    make_pack("tied", RELU_LIKE_CORE)
    report = check_pack("tied")
    rows = failed(report, "conflicts")
    assert {r.target for r in rows} == {"ai.onnx=18", f"ai.onnx={_newest()}"}
    assert rows[0].subject == "tied:aten_relu_tied for aten::relu.default"
    assert "ties with core:aten_relu" in rows[0].detail and "raise priority or add a predicate" in rows[0].detail
    # The impl itself is right: its samples pass.
    assert not failed(report, "samples")


def test_a_custom_domain_without_a_kernel_fails(make_pack):
    make_pack("nokernel", NO_KERNEL)
    report = check_pack("nokernel")
    (row,) = failed(report, "kernels")
    assert row.subject == "my.kernels" and "opreg_reference_kernels" in row.detail
    # And its samples cannot run anywhere.
    rows = failed(report, "samples")
    assert rows and all("my.kernels::FastRelu" in r.detail for r in rows)


RANDOM_22 = """
from onnxscript.onnx_opset import opset22 as op22


def aten_randn_like_22(self, dtype: int | None = None):
    \"\"\"randn_like(Tensor self, *, ScalarType? dtype=None) -> Tensor: RandomNormalLike-22.\"\"\"
    return op22.RandomNormalLike(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::randn_like", aten_randn_like_22, opset=22, priority=5)
"""


def test_an_impl_whose_op_the_installed_runtime_has_no_kernel_for_fails_naming_it(make_pack):
    """RandomNormalLike-22 has no CPU kernel in any ONNX Runtime release: the pack author hears it from
    the kit, with the impl, the op and the release, not from a user's failed session."""
    from opreg.registry import runtimes

    make_pack("random22", RANDOM_22)
    report = check_pack("random22")
    (row,) = [r for r in failed(report, "kernels") if r.subject.startswith("random22:")]
    assert row.subject == "random22:aten_randn_like_22 for aten::randn_like.default"
    assert row.detail.startswith(
        f"emits RandomNormalLike-22 (ai.onnx), which onnxruntime {runtimes.installed_version()} has no CPU kernel"
    )
    assert "onnxruntime" in row.target


def test_an_impl_whose_ops_the_runtime_has_passes_the_kernel_table_check(make_pack):
    make_pack("tied", RELU_LIKE_CORE)
    rows = [r for r in check_pack("tied").results if r.check == "kernels"]
    assert [r.status for r in rows if r.subject == "onnxruntime"] == ["passed"]


CONTRIB_BY_NAME = """
import sys

from onnxscript.values import Opset

msft = Opset("com.microsoft", 1)


@opreg.impl("aten::gelu", domains={"com.microsoft": 1}, priority=11)
def aten_gelu_msft(self, approximate: str = "none"):
    \"\"\"gelu(Tensor self, *, str approximate='none') -> Tensor: com.microsoft's, by the name its schema gives.\"\"\"
    return msft.FastGelu(self) if approximate == "tanh" else msft.Gelu(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register_module(sys.modules[__name__])
"""


def test_an_op_whose_schema_another_installed_pack_registers_works_and_rows_name_the_pack(make_pack):
    """The kit sees what an export with the installed packs sees: opreg-ort-contrib registers
    com.microsoft::Gelu's schema, so ``msft.Gelu(x)`` works (issue 39, friction 1); the details name
    the impl as its pack does, not as the kit's override (``<user>:``, friction 6)."""
    make_pack("byname", CONTRIB_BY_NAME)
    report = check_pack("byname")
    samples = [r for r in report.results if r.check == "samples"]
    assert samples and all(r.status == "passed" for r in samples), [str(r) for r in samples]
    assert {r.target.split(",")[1] for r in samples} == {"com.microsoft=1"}
    assert not [r for r in report.results if "<user>" in r.detail]


FOR_A_PROFILE = """
import sys

from onnxscript.onnx_opset import opset20 as op20


@opreg.impl("aten::gelu", priority=11, profiles=("onnxruntime",))
def aten_gelu_for_ort(self, approximate: str = "none"):
    \"\"\"gelu(Tensor self, *, str approximate='none') -> Tensor: ai.onnx's Gelu, where ONNX Runtime runs it.\"\"\"
    return op20.Gelu(self, approximate=approximate)


@opreg.impl("aten::relu", priority=11, profiles=("nosuchprofile",))
def aten_relu_nowhere(self):
    \"\"\"relu(Tensor self) -> Tensor.\"\"\"
    return op20.Relu(self)


@opreg.impl("aten::tanh", priority=11, profiles=("onnx",))
def aten_tanh_everywhere(self):
    \"\"\"tanh(Tensor self) -> Tensor.\"\"\"
    return op20.Tanh(self)


@opreg.impl("aten::sigmoid", priority=11)
def aten_sigmoid_todo(self):
    \"\"\"sigmoid(Tensor self) -> Tensor.\"\"\"
    raise NotImplementedError("write me")


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register_module(sys.modules[__name__])
"""


def test_impls_for_a_profile_are_checked_where_it_applies_and_stubs_fail_in_one_line(make_pack):
    module = make_pack("forprofile", FOR_A_PROFILE)
    report = check_pack("forprofile")
    rows = {}
    for r in report.results:
        if r.check == "samples":
            rows.setdefault(r.subject.split(" for ")[0], []).append(r)
    gelu = rows["forprofile:aten_gelu_for_ort"]
    assert all(r.status == "passed" for r in gelu) and {r.target.split(",")[1] for r in gelu} == {"com.microsoft=1"}
    (nowhere,) = rows["forprofile:aten_relu_nowhere"]
    assert nowhere.status == "failed" and nowhere.detail.startswith(
        "for profile nosuchprofile, which no installed pack defines: it applies at no target"
    )
    (everywhere,) = rows["forprofile:aten_tanh_everywhere"]
    assert everywhere.status == "failed" and "for profile onnx, which names no custom domain" in everywhere.detail
    (todo,) = rows["forprofile:aten_sigmoid_todo"]
    source = (make_pack.root / module / "__init__.py").read_text().splitlines()
    line = source.index('@opreg.impl("aten::sigmoid", priority=11)') + 1
    assert todo.status == "failed"
    assert todo.detail == f"not written yet: write the body of aten_sigmoid_todo ({module}/__init__.py:{line})"


def test_a_numerically_wrong_impl_fails_naming_impl_target_and_sample(make_pack):
    make_pack("wrong", WRONG_RELU)
    report = check_pack("wrong")
    rows = failed(report, "samples")
    assert {r.target for r in rows} == {"ai.onnx=18", f"ai.onnx={_newest()}"}
    assert all(r.subject == "wrong:aten_relu_wrong for aten::relu.default" for r in rows)
    assert all(r.detail.startswith("opinfo nn.functional.relu sample ") for r in rows)
    assert any("(float32[5,5]): output 0: " in r.detail and "max abs" in r.detail for r in rows)
    message = _assertion(report)
    assert "wrong:aten_relu_wrong" in message and "ai.onnx=18" in message and "opinfo nn.functional.relu" in message
    assert not failed(report, "conflicts")  # priority 5: it outranks core instead of tying


def test_an_impl_rejected_against_the_torch_schema_fails_the_load_check(make_pack):
    make_pack(
        "mismatch",
        """
        from onnxscript.onnx_opset import opset18 as op18


        def aten_relu_extra(self, inplace: bool, alpha: float):
            return op18.Relu(self)


        def aten_abs(self):
            return op18.Abs(self)


        @opreg.hookimpl
        def opreg_register_ops(registry):
            registry.register("aten::relu", aten_relu_extra, opset=18)
            registry.register("aten::abs", aten_abs, opset=18, priority=1)
        """,
    )
    rows = failed(check_pack("mismatch"), "load")
    assert len(rows) == 1
    assert rows[0].subject == "aten_relu_extra for aten::relu"
    assert rows[0].detail.startswith("impl rejected: SignatureMismatchError: ") and "(inplace, alpha)" in rows[0].detail


def test_a_custom_op_without_samples_is_skipped_asking_for_them(make_pack):
    make_pack(
        "nosamples",
        """
        import onnxscript
        from onnxscript.onnx_opset import opset18 as op18


        def twice(x):
            return op18.Add(x, x)


        @opreg.hookimpl
        def opreg_register_ops(registry):
            registry.register("kitlib::twice", twice, opset=18)
        """,
    )
    (row,) = [r for r in check_pack("nosamples").results if r.check == "samples"]
    assert row.status == "skipped" and row.detail == "no samples: provide them with opreg_samples"


UNSAMPLED = """
from onnxscript.onnx_opset import opset18 as op18


def twice(x):
    return op18.Add(x, x)


def thrice(x):
    return op18.Mul(x, 3.0)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("kitlib::twice", twice, opset=18)
    registry.register("kitlib::thrice", thrice, opset=18)
"""


def test_a_pack_none_of_whose_impls_has_samples_fails_assert_ok_unless_allowed(make_pack):
    """Nothing compared is not a pass: every other check passes, yet assert_ok asks for samples."""
    make_pack("unsampled", UNSAMPLED)
    report = check_pack("unsampled")
    assert report.ok and not report.failures()
    assert report.unsampled == (
        "unsampled:twice for kitlib::twice.default",
        "unsampled:thrice for kitlib::thrice.default",
    )
    message = _assertion(report)
    assert "none of its 2 impl(s) was driven with a sample" in message
    assert "opreg_samples" in message and "assert_ok(allow_unsampled=True)" in message
    assert "[samples] unsampled:twice for kitlib::twice.default: skipped: no samples" in message
    report.assert_ok(allow_unsampled=True)
    assert report.as_dict()["unsampled"] == list(report.unsampled)


def test_a_pack_with_some_impls_sampled_passes_assert_ok(make_pack):
    """One sampled impl is enough: the unsampled one stays visible as a skipped row."""
    body = UNSAMPLED.replace(
        'registry.register("kitlib::thrice", thrice, opset=18)',
        'registry.register("aten::relu", aten_relu_fast, opset=18, priority=5)',
    )
    body += '''

def aten_relu_fast(self):
    """relu(Tensor self) -> Tensor: Relu, outranking core's."""
    return op18.Relu(self)
'''
    make_pack("halfsampled", body)
    report = check_pack("halfsampled")
    report.assert_ok()
    assert report.unsampled == ("halfsampled:twice for kitlib::twice.default",)


def test_an_impl_whose_samples_compare_no_value_is_not_a_pass(make_pack):
    """empty_like's results are uninitialized: its OpInfo samples are compared by shape and dtype
    only, so the row says so and is skipped, not passed; the impl was still driven (not unsampled)."""
    make_pack(
        "uninit",
        """
        from onnxscript.onnx_opset import opset18 as op18


        def aten_empty_like_ones(self, dtype: int | None = None, layout: int | None = None, device: str | None = None,
                                 pin_memory: bool | None = None, memory_format: str | None = None):
            \"\"\"empty_like(Tensor self, *, ...) -> Tensor: ones (any value will do).\"\"\"
            like = self if dtype is None else op18.Cast(self, to=dtype)
            return op18.Expand(op18.CastLike(1, like), op18.Shape(self))


        @opreg.hookimpl
        def opreg_register_ops(registry):
            registry.register("aten::empty_like", aten_empty_like_ones, opset=18, priority=5)
        """,
    )
    report = check_pack("uninit")
    rows = [r for r in report.results if r.check == "samples"]
    assert rows and all(r.status == "skipped" for r in rows), rows
    assert all("values not compared" in r.detail and "by shape and dtype only" in r.detail for r in rows)
    assert report.unsampled == ()
    report.assert_ok()


def _assertion(report: PackCheck) -> str:
    with pytest.raises(AssertionError) as caught:
        report.assert_ok()
    return str(caught.value)


# -- the pytest plugin ----------------------------------------------------------------


def test_pytest_plugin_is_registered_and_imports_nothing_heavy():
    (ep,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "opreg"]
    assert ep.value == "opreg.testing.pytest_plugin"
    code = (
        f"import sys; import {ep.value}; print(sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_fixture_fails_a_packs_test_listing_the_failures(make_pack, pytester):
    """A pack author's test session (pytester, in this process: the session, its plugins and the
    ``opreg`` plugin's fixture are its own; the modules already imported are shared, which spares
    a fresh interpreter's minute of imports on a busy machine)."""
    make_pack("eagerfix", "import onnxruntime\n")
    pytester.makepyfile(
        test_pack="""
        def test_conformance_kit(opreg_pack_check):
            assert opreg_pack_check("eagerfix") is opreg_pack_check("eagerfix")  # cached
            opreg_pack_check("eagerfix").assert_ok()
        """
    )
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "-p", "no:xdist")
    assert result.ret == 1, result.stdout.str()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "AssertionError" in text and "[import] eagerfix = " in text
    assert "imports onnxruntime" in text


# -- opreg pack-check -------------------------------------------------------------------


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_pack_check_passes_a_good_pack(capsys):
    code, out, _ = run(capsys, "pack-check", "opreg-test-customop")
    assert code == 0
    assert "conformance kit: pack test_customop (opreg-test-customop" in out
    for column in ("check", "subject", "target", "status", "detail"):
        assert column in out
    assert "mylibrary::addandround_op" in out and "failed" not in out.replace(", 0 failed", "")


def test_cli_pack_check_exits_1_on_failure_with_json(capsys, make_pack):
    make_pack("clibad", WRONG_RELU)
    code, out, _ = run(capsys, "pack-check", "clibad", "--json")
    assert code == 1
    data = json.loads(out)
    assert data["pack"] == "clibad" and data["ok"] is False
    bad = [r for r in data["results"] if r["status"] == "failed"]
    assert bad and all(r["check"] == "samples" and r["subject"].startswith("clibad:aten_relu_wrong") for r in bad)
    code, out, _ = run(capsys, "pack-check", "opreg-testpack-clibad")
    assert code == 1 and "aten_relu_wrong" in out and "failed" in out


def test_cli_pack_check_unknown_pack_exits_2_listing_installed_packs(capsys):
    code, out, err = run(capsys, "pack-check", "no-such-pack")
    assert code == 2 and out == ""
    assert err.startswith("opreg: error: no installed pack named 'no-such-pack'")
    assert "test_customop (opreg-test-customop)" in err and err.count("\n") == 1


TWO_MARKS = """
from onnxscript.onnx_opset import opset18 as op18


def aten_relu_marked_twice(self):
    \"\"\"relu(Tensor self) -> Tensor, one function registered for two opset ranges.\"\"\"
    return op18.Relu(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::relu", aten_relu_marked_twice, opset=(18, 19), priority=5)
    registry.register("aten::relu", aten_relu_marked_twice, opset=20, priority=5)
"""


def test_two_opset_marks_of_one_function_are_told_apart_by_their_requirement(make_pack):
    make_pack("twomarks", TWO_MARKS)
    report = check_pack("twomarks")
    subjects = {r.subject for r in report.results if r.check == "samples"}
    assert subjects == {
        "twomarks:aten_relu_marked_twice at ai.onnx18..19 for aten::relu.default",
        "twomarks:aten_relu_marked_twice at ai.onnx>=20 for aten::relu.default",
    }
    report.assert_ok()
