"""Discovery and isolation on real installed distributions (throwaway ones in a temp dir)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import opreg
import opreg.packs.plugins
from opreg import PluginError, PluginNotFoundError
from opreg.packs.plugins import AUTOLOAD_ENV, build_registry, default_registry, discover

GOOD = """
from onnxscript.onnx_opset import opset18 as op18


def aten_neg(self):
    return op18.Neg(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::neg", aten_neg, opset=18, priority=1)  # outranks the core pack's
"""


def report(registry, name):
    (found,) = [r for r in registry.packs if r.name == name]
    return found


def test_installed_first_party_packs_load():
    registry = build_registry()
    core = report(registry, "core")
    assert (core.distribution, core.status, core.value) == ("opreg", "loaded", "opreg_core_ops")
    assert core.impls >= 5 and core.domains == ("ai.onnx",)
    contrib = report(registry, "ort_contrib")
    assert (contrib.distribution, contrib.status) == ("opreg-ort-contrib", "loaded")
    assert contrib.profiles == ("onnxruntime",) and "com.microsoft" in contrib.domains
    custom = report(registry, "test_customop")
    assert (custom.distribution, custom.status) == ("opreg-test-customop", "loaded")
    assert registry.target("onnxruntime").get("com.microsoft") == 1
    assert registry.target("test_customop").get("test.customop") == 1
    assert registry.resolve("mylibrary::addandround_op", "test_customop").pack == "test_customop"


def _relu_model(version: int):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    opsets = [helper.make_opsetid("", version)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=onnx.helper.find_min_ir_version_for(opsets))


def test_the_onnxruntime_probe_finds_the_newest_opset_onnxruntime_loads():
    import onnx.defs
    import onnxruntime

    newest = opreg.newest_onnxruntime_opset()
    onnxruntime.InferenceSession(_relu_model(newest).SerializeToString(), providers=["CPUExecutionProvider"])
    if newest < onnx.defs.onnx_opset_version():  # the probe tries every opset onnx defines
        with pytest.raises(Exception, match="(?i)opset|IR version"):  # the opset, or the IR version it needs
            onnxruntime.InferenceSession(
                _relu_model(newest + 1).SerializeToString(), providers=["CPUExecutionProvider"]
            )


def test_the_onnxruntime_profile_is_the_newest_opset_opreg_builds_and_onnxruntime_runs():
    supported = opreg.newest_supported_opset()
    assert supported == min(opreg.newest_onnxruntime_opset(), opreg.onnx_opset_range()[1])
    assert build_registry().target("onnxruntime").as_dict() == {"": supported, "com.microsoft": 1}


def test_an_opset_onnx_defines_but_onnxscript_cannot_build_is_refused_with_the_reason():
    import onnx.defs

    high = opreg.onnx_opset_range()[1]
    if high == onnx.defs.onnx_opset_version():
        pytest.skip(f"onnxscript has a module for every opset onnx defines (up to {high})")
    with pytest.raises(opreg.InvalidTargetError, match=rf"onnxscript .* has opset modules up to {high}"):
        opreg.Target.of(high + 1)


def test_importing_opreg_is_lazy():
    code = (
        "import sys, json, opreg, opreg.packs.plugins; opreg.packs.plugins.discover();"
        "print(json.dumps(sorted(m for m in ('torch', 'onnxruntime', 'onnxscript', 'onnx', 'opreg_core_ops',"
        " 'opreg_ort_contrib', 'opreg_test_customop') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_importing_first_party_packs_is_cheap():
    code = (
        "import sys, json, opreg_core_ops, opreg_ort_contrib, opreg_test_customop;"
        "print(json.dumps(sorted(m for m in ('torch', 'onnxruntime', 'onnxscript') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_a_good_throwaway_pack_is_discovered(make_pack):
    module = make_pack("good", GOOD, version="1.2.3")
    assert "good" in {ep.name for ep in discover()}
    registry = build_registry()
    good = report(registry, "good")
    assert (good.status, good.distribution, good.version, good.value) == (
        "loaded",
        "opreg-testpack-good",
        "1.2.3",
        module,
    )
    assert good.impls == 1
    assert registry.resolve("aten::neg", 18).pack == "good"


@pytest.mark.parametrize(
    ("body", "header", "status", "hook", "reason"),
    [
        ("raise ImportError('no such thing')", None, "failed", None, "import of .* failed: ImportError: no such thing"),
        ("", "import opreg\n", "incompatible", None, "declares no OPREG_API_VERSION"),
        ("", "import opreg\nOPREG_API_VERSION = 99\n", "incompatible", None, "written for plugin API 99"),
        (
            "",
            "import opreg\nOPREG_API_VERSION = 1\nOPREG_REQUIRES_TORCH = '<2.0'\n",
            "incompatible",
            None,
            r"supports torch<2.0, installed torch is 2\.13",
        ),
        (
            "",
            "import opreg\nOPREG_API_VERSION = 1\nOPREG_REQUIRES_TORCH = 'two'\n",
            "incompatible",
            None,
            "not a PEP 440 specifier",
        ),
        (
            "@opreg.hookimpl\ndef opreg_register_opps(registry):\n    pass\n",
            None,
            "failed",
            None,
            "unknown hook.*opreg_register_opps.*opreg_register_ops",
        ),
        (
            GOOD.replace(
                "    registry.register(",
                "    registry.register('aten::abs', aten_neg)\n    1 / 0\n    registry.register(",
            ),
            None,
            "failed",
            "opreg_register_ops",
            "ZeroDivisionError",
        ),
        (
            "@opreg.hookimpl\ndef opreg_targets():\n    return ['not', 'a', 'dict']\n",
            None,
            "failed",
            "opreg_targets",
            "must return a dict",
        ),
        (
            GOOD.replace(
                'registry.register("aten::neg", aten_neg, opset=18, priority=1)', 'registry.register("aten::neg", 42)'
            ),
            None,
            "failed",
            "opreg_register_ops",
            "all 1 impl.* rejected",
        ),
    ],
    ids=[
        "import-error",
        "no-api",
        "future-api",
        "torch-range",
        "bad-specifier",
        "unknown-hook",
        "hook-raises",
        "bad-targets",
        "all-rejected",
    ],
)
def test_broken_pack_is_reported_and_left_out(make_pack, body, header, status, hook, reason):
    kwargs = {"header": header} if header is not None else {}
    make_pack("broken", body, **kwargs)
    make_pack("good", GOOD)
    registry = build_registry()
    broken = report(registry, "broken")
    assert broken.status == status
    assert broken.hook == hook
    assert broken.distribution == "opreg-testpack-broken" and broken.version == "0.1"
    import re

    assert re.search(reason, broken.reason), broken.reason
    assert broken.impls == 0
    # The rest are untouched: nothing of the broken pack is registered.
    assert report(registry, "good").status == "loaded"
    assert report(registry, "core").status == "loaded"
    assert {i.pack for i in registry.impls()} >= {"good", "core"}
    assert "broken" not in {i.pack for i in registry.impls()}
    assert registry.resolve("aten::relu", 18).pack == "core"
    with pytest.raises(PluginError, match="broken"):
        build_registry(strict=True)


def test_malformed_entry_point_value_is_explained(make_pack):
    make_pack("quoted", GOOD)
    (info,) = make_pack.root.glob("opreg_testpack_quoted-*.dist-info")
    text = (info / "entry_points.txt").read_text()
    (info / "entry_points.txt").write_text(text.replace("= ", '= "').rstrip() + '"\n')
    quoted = report(build_registry(), "quoted")
    assert quoted.status == "failed" and "is not of the form 'module' or 'module:attr'" in quoted.reason


def test_partially_rejected_pack_keeps_its_good_impls(make_pack):
    body = GOOD + (
        "\n@opreg.hookimpl(specname='opreg_register_ops')\n"
        "def more(registry):\n"
        "    registry.register('aten::gelu', aten_neg)\n"  # misses nothing: gelu's approximate has a default
        "    registry.register('aten::add.Tensor', aten_neg)\n"  # misses 'other'
    )
    make_pack("partial", body)
    registry = build_registry()
    partial = report(registry, "partial")
    assert partial.status == "loaded" and partial.impls == 2
    (rejection,) = partial.rejected
    assert rejection.op == "aten::add.Tensor" and "required argument" in rejection.error
    assert "1 impl(s) rejected" in partial.reason
    with pytest.raises(PluginError, match="partial"):
        build_registry(strict=True)


def test_duplicate_profile_is_rejected_but_the_pack_loads(make_pack):
    body = GOOD + "\n@opreg.hookimpl\ndef opreg_targets():\n    return {'onnxruntime': {'': 18}, 'mine': {'': 20}}\n"
    make_pack("zz_dupe", body)  # loads after ort_contrib, which keeps its profile
    registry = build_registry()
    dupe = report(registry, "zz_dupe")
    assert dupe.status == "loaded" and dupe.profiles == ("mine",)
    assert "profile 'onnxruntime' rejected" in dupe.reason and "already defined by ort_contrib" in dupe.reason
    assert registry.target("onnxruntime").get("com.microsoft") == 1


def test_duplicate_pack_name_is_reported(make_pack):
    make_pack("twin", GOOD, dist="opreg-testpack-twin-a")
    make_pack("twin", GOOD, dist="opreg-testpack-twin-b")
    reports = [r for r in build_registry().packs if r.name == "twin"]
    assert [r.status for r in reports] == ["loaded", "failed"]
    assert "already taken by opreg-testpack-twin-a" in reports[1].reason


def test_allow_and_deny_lists(make_pack):
    make_pack("extra", GOOD)
    only = build_registry(plugins=["extra"])
    status = {r.name: r.status for r in only.packs}
    assert status["core"] == status["extra"] == "loaded"
    others = {name: state for name, state in status.items() if name not in ("core", "extra")}
    assert {"ort_contrib", "test_customop"} <= others.keys() and set(others.values()) == {"disabled"}
    assert "onnxruntime" not in only.profiles
    without = build_registry(exclude=["extra", "core"])
    assert report(without, "core").status == "disabled"
    assert "excluded" in report(without, "extra").reason
    assert "core" not in {i.pack for i in without.impls()}
    with pytest.raises(PluginNotFoundError, match=r"no installed pack named 'nope'.*core, (\w+, )*extra"):
        build_registry(plugins=["nope"])


def test_autoload_env_loads_only_core_and_requested(make_pack, monkeypatch):
    make_pack("extra", GOOD)
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    registry = build_registry()
    assert report(registry, "core").status == "loaded"
    assert report(registry, "extra").status == "disabled"
    assert AUTOLOAD_ENV in report(registry, "extra").reason
    assert report(build_registry(plugins=["extra"]), "extra").status == "loaded"


def test_default_registry_is_cached_per_selection_and_installed_packs(make_pack):
    first = default_registry()
    assert default_registry() is first
    assert first.frozen
    assert default_registry(exclude=["ort_contrib"]) is not first
    make_pack("late", GOOD)  # a new pack on sys.path is a new plugin set
    assert "late" in {r.name for r in default_registry().packs}


def test_runtime_hooks_are_called_per_pack_and_isolated(make_pack):
    body = GOOD + (
        "\n@opreg.hookimpl\ndef opreg_configure_session(options):\n    options.append('configured')\n"
        "\n@opreg.hookimpl\ndef opreg_reference_kernels():\n    raise RuntimeError('kernels broke')\n"
    )
    make_pack("runtime", body)
    host = opreg.packs.plugins.build().host
    options: list[str] = []
    assert host.call("opreg_configure_session", options=options) == []  # None results are not listed
    assert options == ["configured"]
    # the raising pack is logged and left out; the others still answer
    answered = [pack for pack, _ in host.call("opreg_reference_kernels")]
    assert "runtime" not in answered and "test_customop" in answered
    assert opreg.packs.plugins.host_of(opreg.Registry()).call("opreg_reference_kernels") == []  # no packs by hand


def test_schemas_hook_registers_custom_schemas_once(make_pack):
    body = GOOD + (
        "\nimport onnx.defs\n"
        "@opreg.hookimpl\ndef opreg_schemas():\n"
        "    return [onnx.defs.OpSchema('TestOnlyDouble', 'opreg.test.schemas', 1,\n"
        "        inputs=[onnx.defs.OpSchema.FormalParameter('x', 'T')],\n"
        "        outputs=[onnx.defs.OpSchema.FormalParameter('y', 'T')],\n"
        "        type_constraints=[('T', ['tensor(float)'], '')])]\n"
    )
    make_pack("schemas", body)
    import onnx.defs

    build_registry()
    build_registry()  # idempotent: a second build does not re-register
    assert onnx.defs.has("TestOnlyDouble", 1, "opreg.test.schemas")


TIE_WITH_CORE = """
from onnxscript.onnx_opset import opset18 as op18


def aten_relu(self):
    return op18.Relu(self)


@opreg.hookimpl
def opreg_register_ops(registry):
    registry.register("aten::relu", aten_relu, opset=18)  # same priority and requirement as the core pack's
"""


def test_a_tie_with_the_core_pack_goes_to_core_and_is_reported(make_pack):
    # "aaa" sorts before "core": a tie must not be settled by the sort order of names
    make_pack("aaa", TIE_WITH_CORE)
    registry = build_registry()
    assert registry.resolve("aten::relu", 18).pack == "core"
    explanation = str(registry.explain("aten::relu", 18))
    assert "the core pack wins ties unless another pack is preferred" in explanation
    (group,) = [g for g in opreg.packs.plugins.pack_conflicts(registry.impls()) if str(g[0].op) == "aten::relu.default"]
    assert [i.pack for i in group] == ["core", "aaa"]
    with pytest.raises(PluginError, match=r"aten::relu.default: core:aten_relu, aaa:aten_relu tie .*prefer="):
        build_registry(strict=True)


def test_prefer_settles_a_tie_for_the_pack_the_user_names(make_pack):
    make_pack("aaa", TIE_WITH_CORE)
    registry = build_registry(prefer={"aten::relu": "aaa"}, strict=True)  # settled: strict passes
    assert registry.resolve("aten::relu", 18).pack == "aaa"
    assert "pack 'aaa' is preferred" in str(registry.explain("aten::relu", 18))
    assert registry.conflicts(18)[0].preferred
    copy = default_registry().copy()
    copy.prefer("aten::relu", "aaa")
    assert copy.resolve("aten::relu", 18).pack == "aaa"
    with pytest.raises(opreg.NoImplementationError, match="cannot prefer pack 'core' for aten::gelu_backward"):
        copy.prefer("aten::gelu_backward", "core")
    with pytest.raises(PluginNotFoundError, match="no installed pack to prefer named 'nosuch'"):
        build_registry(prefer={"aten::relu": "nosuch"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"plugins": "ort_contrib"}, r"plugins= takes a list of pack names, got the string 'ort_contrib'"),
        ({"exclude": "core"}, r"exclude= takes a list of pack names, got the string 'core'"),
        ({"plugins": [None]}, r"plugins= takes pack names \(non-empty strings\), got None"),
    ],
)
def test_a_selection_of_the_wrong_type_is_named(kwargs, message):
    with pytest.raises(opreg.InvalidArgumentError, match=message):
        default_registry(**kwargs)


def test_an_export_of_a_built_registry_uses_the_host_built_beside_it():
    """``build_registry()`` then an export given it and no ``host=``: the packs load once (the host
    built with the registry answers, for a copy too), not a second time for the default host."""
    import torch

    opreg.packs.plugins.clear_cache()
    loaded = opreg.packs.plugins.build()
    assert opreg.packs.plugins.host_of(loaded.registry) is loaded.host
    assert opreg.packs.plugins.host_of(loaded.registry.copy()) is loaded.host
    registry = build_registry()
    program = opreg.export(torch.nn.ReLU(), (torch.randn(2, 3),), target=18, registry=registry)
    assert [n.op_type for n in program.model.graph] == ["Relu"]
    assert opreg.packs.plugins._loaded_cache == {}  # no default registry and host were loaded beside it
