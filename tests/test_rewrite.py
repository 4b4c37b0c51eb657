"""Packs' graph-level rewrites (opreg_rewrite_rules): gated by the target, applied after the
lean pass, provenance kept, wrong rules named; throwaway packs are real distributions."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opreg

SKIP_NORM = """
def _add_norm(op, x, skip, scale, bias):
    return op.LayerNormalization(op.Add(x, skip), scale, bias, axis=-1, _allow_other_attributes=True)

def _same_shape(context, x, skip, **_):
    return x.shape is not None and skip.shape is not None and list(x.shape) == list(skip.shape)

def _skip_norm(op, x, skip, scale, bias):
    return op.SkipLayerNormalization(x, skip, scale, bias, epsilon=1e-5, _domain="com.microsoft")

@opreg.hookimpl
def opreg_rewrite_rules(target):
    from onnxscript.rewriter import pattern  # here, not at import: the rewriter imports torch

    if target.get("com.microsoft") != 1:
        return []
    return [pattern.RewriteRule(_add_norm, _skip_norm, _same_shape, name="SkipNorm")]

@opreg.hookimpl
def opreg_targets():  # names the domain its rules make, so targets with it parse (no impl emits it)
    return {"skipnorm": {"": 23, "com.microsoft": 1}}
"""

ALWAYS = """
from onnxscript.rewriter import pattern

def _relu(op, x):
    return op.Relu(x)

def _custom(op, x):
    return op.FastRelu(x, _domain="my.kernels")

def _rms(op, x):
    return op.RMSNormalization(x, op.Constant(value_float=1.0))

RULES = {
    "custom": [pattern.RewriteRule(_relu, _custom, name="FastRelu")],
    "rms": [pattern.RewriteRule(_relu, _rms, name="Rms")],
    "unnamed": [pattern.RewriteRule(_relu, _custom)],
    "twice": [pattern.RewriteRule(_relu, _custom, name="A"), pattern.RewriteRule(_relu, _custom, name="A")],
    "junk": ["not a rule"],
}
KIND = "custom"

@opreg.hookimpl
def opreg_rewrite_rules(target):
    return RULES[KIND]
"""

A_PASS = """
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

class ReluToClip(InPlacePass):
    def call(self, model):
        modified = False
        for node in list(model.graph):
            if node.op_type == "Relu":
                zero = ir.node("Constant", [], attributes={"value": ir.tensor(0.0)})
                clip = ir.node("Clip", [node.inputs[0], zero.outputs[0]])
                clip.metadata_props.update(node.metadata_props)
                model.graph.insert_before(node, [zero, clip])
                clip.outputs[0].type, clip.outputs[0].shape = node.outputs[0].type, node.outputs[0].shape
                ir.convenience.replace_all_uses_with(node.outputs[0], clip.outputs[0], replace_graph_outputs=True)
                model.graph.remove(node, safe=True)
                modified = True
        return PassResult(model, modified)

@opreg.hookimpl
def opreg_rewrite_rules(target):
    return [ReluToClip()]
"""


class AddNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.linear(x) + x)


def _nodes(program) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in program.model_proto.graph.node]


def _props(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def test_a_rule_fires_where_the_target_allows_and_keeps_provenance(make_pack):
    make_pack("skipnorm", SKIP_NORM)
    x = torch.randn(2, 3, 16)
    model = AddNorm().eval()
    program = opreg.export(model, (x,), target="onnx,com.microsoft=1", plugins=["skipnorm"])
    assert ("com.microsoft", "SkipLayerNormalization") in _nodes(program)
    assert ("", "LayerNormalization") not in _nodes(program)
    assert {o.domain: o.version for o in program.model_proto.opset_import}["com.microsoft"] == 1
    (fused,) = [n for n in program.model_proto.graph.node if n.op_type == "SkipLayerNormalization"]
    props = _props(fused)
    assert props["opreg.rewrite"].startswith("skipnorm:SkipNorm")
    assert props["opreg.torch_op"] == "aten::add.Tensor+aten::layer_norm.default"
    assert props["opreg.pack"] == "core"
    assert props["opreg.impl"] == "aten_add+aten_layer_norm"
    assert props["opreg.module"] == "norm"  # the Add is the root module's (""), which is not joined
    assert "pkg.onnxscript.rewriter.rule_name" not in props
    metadata = {p.key: p.value for p in program.model_proto.metadata_props}
    assert metadata["opreg.rewrites"] == "skipnorm:SkipNorm=1"
    assert metadata["opreg.packs"] == "core,skipnorm"
    program.verify(x, atol=1e-5)


def test_export_asks_the_host_for_rules_and_the_program_runs_through_a_runner(make_pack):
    """Issue 40: the rules come from the host an export is given (by default the host of the packs the
    registry was built from; a copy keeps them), and the program is given a runner of that host, not
    the registry; a host with no packs has no pack code to ask."""
    from opreg.packs.host import PackHost

    make_pack("skipnorm", SKIP_NORM)
    x = torch.randn(2, 3, 16)
    model = AddNorm().eval()
    registry = opreg.default_registry(plugins=["skipnorm"])
    fused = opreg.export(model, (x,), target="onnx,com.microsoft=1", registry=registry.copy())
    assert ("com.microsoft", "SkipLayerNormalization") in _nodes(fused)
    host = opreg.default_host(plugins=["skipnorm"])
    assert fused.runner.host is host and not hasattr(fused, "registry")
    hostless = PackHost()  # the same impls and profiles, and no pack code behind them
    plain = opreg.export(model, (x,), target="onnx,com.microsoft=1", registry=registry.copy(), host=hostless)
    assert ("", "LayerNormalization") in _nodes(plain) and plain.runner.host is hostless
    plain.verify(x, atol=1e-5)
    with pytest.raises(opreg.InvalidArgumentError, match="host= takes an opreg.PackHost"):
        opreg.export(model, (x,), registry=registry, host=registry)


def test_the_target_gates_rules_and_rewrite_false_leaves_them_out(make_pack):
    make_pack("skipnorm", SKIP_NORM)
    x = torch.randn(2, 3, 16)
    model = AddNorm().eval()
    standard = opreg.export(model, (x,), target=18, plugins=["skipnorm"])
    assert ("", "LayerNormalization") in _nodes(standard)
    assert all(domain == "" for domain, _ in _nodes(standard))
    off = opreg.export(model, (x,), target="onnx,com.microsoft=1", plugins=["skipnorm"], rewrite=False)
    assert ("", "LayerNormalization") in _nodes(off)
    assert "opreg.rewrites" not in {p.key for p in off.model_proto.metadata_props}


def test_a_rule_making_a_domain_the_target_lacks_is_left_out_naming_it(make_pack):
    make_pack("always", ALWAYS)
    model, x = torch.nn.ReLU(), torch.randn(3)
    with pytest.warns(
        opreg.PackWarning, match=r"pack 'always': rewrite always:FastRelu made my\.kernels::FastRelu.*left out"
    ):
        program = opreg.export(model, (x,), target=18, plugins=["always"])
    assert _nodes(program) == [("", "Relu")]  # undone: the export goes on without the rule
    with pytest.raises(opreg.PluginError, match=r"rewrite always:FastRelu made my\.kernels::FastRelu.*strict"):
        opreg.export(model, (x,), target=18, plugins=["always"], strict=True)


def test_a_rule_making_an_ai_onnx_op_newer_than_the_target_is_left_out(make_pack):
    module = make_pack("always", ALWAYS)
    model, x = torch.nn.ReLU(), torch.randn(3)
    import importlib

    importlib.import_module(module).KIND = "rms"
    with pytest.warns(opreg.PackWarning, match=r"always:Rms made ai\.onnx::RMSNormalization, which ai\.onnx 18"):
        program = opreg.export(model, (x,), target=18, plugins=["always"])
    assert _nodes(program) == [("", "Relu")]
    with pytest.raises(opreg.PluginError, match=r"always:Rms made ai\.onnx::RMSNormalization, which ai\.onnx 18"):
        opreg.export(model, (x,), target=18, plugins=["always"], strict=True)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("unnamed", "returned a rule without a name"),
        ("twice", "two rewrites named 'A'"),
        ("junk", "neither an onnxscript RewriteRule"),
    ],
)
def test_invalid_rules_are_logged_and_left_out(make_pack, caplog, kind, message):
    module = make_pack("always", ALWAYS)
    import importlib

    importlib.import_module(module).KIND = kind
    model, x = torch.nn.ReLU(), torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="opreg"):
        program = opreg.export(model, (x,), target=18, plugins=["always"])
    assert _nodes(program) == [("", "Relu")]
    assert message in caplog.text and "pack 'always' failed in hook opreg_rewrite_rules: " in caplog.text


def test_a_pass_runs_and_its_nodes_record_it(make_pack):
    make_pack("clip", A_PASS)
    model, x = torch.nn.ReLU(), torch.randn(3, 4)
    program = opreg.export(model, (x,), target=18, plugins=["clip"])
    assert [op for _, op in _nodes(program)] == ["Clip"]
    props = _props(program.model_proto.graph.node[0])
    assert props["opreg.rewrite"] == "clip:ReluToClip"
    assert props["opreg.torch_op"] == "aten::relu.default"  # the pass copied them
    program.verify(x)


# -- a pack's faults are the pack's ---------------------------------------------------------------

FAULTY = """
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult
from onnxscript.rewriter import pattern

def _relu(op, x):
    return op.Relu(x)

def _neg(op, x):
    return op.Neg(x)

def _clip(op, x):
    return op.Clip(x, op.Constant(value_float=0.0))

def _relu_twice(op, x):  # its replacement matches its own pattern: onnxscript alone would never stop
    return op.Relu(op.Relu(x))

def _boom(context, x, **_):
    raise ValueError("boom in the check")

class Raises(InPlacePass):
    def call(self, model):
        raise ValueError("boom in the pass")

class Dangles(InPlacePass):
    \"\"\"Feeds the first Relu a value nothing defines (a Neg it never puts in the graph).\"\"\"

    def call(self, model):
        for node in model.graph:
            if node.op_type == "Relu":
                node.replace_input_with(0, ir.node("Neg", [node.inputs[0]]).outputs[0])
                return PassResult(model, True)
        return PassResult(model, False)

RULES = {
    "rule": [pattern.RewriteRule(_relu, _neg, _boom, name="Boom")],
    "set": [pattern.RewriteRuleSet([
        pattern.RewriteRule(_relu, _neg, _boom, name="Boom"), pattern.RewriteRule(_relu, _clip, name="ReluClip"),
    ])],
    "pass": [Raises()],
    "dangling": [Dangles()],
    "looping": [pattern.RewriteRule(_relu, _relu_twice, name="Twice")],
}
KIND = "rule"

@opreg.hookimpl
def opreg_rewrite_rules(target):
    return RULES[KIND]
"""


@pytest.mark.parametrize(
    ("kind", "label", "what"),
    [
        ("rule", "faulty:Boom", "raised ValueError: boom in the check"),
        ("pass", "faulty:Raises", "raised ValueError: boom in the pass"),
        (
            "looping",
            "faulty:Twice",
            r"fired 18 times on a graph of 1 nodes: it keeps matching the nodes it made \(its replacement matches",
        ),
        (
            "dangling",
            "faulty:Dangles",
            r"left node '.*' \(ai\.onnx::Relu\) reading an unnamed value \(made by ai\.onnx::Neg node None\), "
            "which nothing in the graph defines before it",
        ),
    ],
)
def test_a_faulty_rewrite_is_undone_and_left_out_naming_the_pack(make_pack, kind, label, what):
    """A PackWarning at the user's line, the program's ``pack_faults`` and the model's metadata."""
    import importlib

    importlib.import_module(make_pack("faulty", FAULTY)).KIND = kind
    model, x = torch.nn.ReLU(), torch.randn(3)
    with pytest.warns(opreg.PackWarning) as warned:
        program = opreg.export(model, (x,), target=18, plugins=["faulty"])
    assert _nodes(program) == [("", "Relu")]  # as if the pack offered no rewrite
    assert "opreg.rewrites" not in {p.key for p in program.model_proto.metadata_props}
    program.verify(x)
    (warning,) = warned
    assert re.fullmatch(
        rf"pack 'faulty': rewrite {label} {what}.*; it is left out, the export goes on", str(warning.message)
    )
    assert warning.filename == __file__
    (fault,) = program.pack_faults
    assert (fault.pack, fault.kind, fault.name, str(fault)) == ("faulty", "rewrite", label, str(warning.message))
    (entry,) = json.loads({p.key: p.value for p in program.model_proto.metadata_props}["opreg.pack_faults"])
    assert entry == {"pack": "faulty", "kind": "rewrite", "name": label, "detail": fault.detail}
    with pytest.raises(opreg.PluginError, match=rf"pack 'faulty': rewrite {label} {what}.*strict mode"):
        opreg.export(model, (x,), target=18, plugins=["faulty"], strict=True)


def test_the_command_line_shows_a_faulty_rewrite_on_a_cold_and_a_warm_cache(make_pack, capsys, tmp_path):
    """Round 4: the warning line showed only when the packs' declarations came from the cache.
    Now every run says it, --json lists it, and inspect reads it back from the model."""
    from tests.test_cli import run

    module = make_pack("faulty", FAULTY)
    models = tmp_path / "models.py"
    models.write_text(
        f"import torch, {module}\n{module}.KIND = 'pass'\ndef make():\n    return torch.nn.ReLU(), (torch.randn(3),)\n"
    )
    line = "warning: pack 'faulty': rewrite faulty:Raises raised ValueError: boom in the pass; it is left out"
    for cache in ("cold", "warm"):
        code, out, err = run(capsys, "export", f"{models}:make", "-o", str(tmp_path / f"{cache}.onnx"), "-t", "18")
        assert code == 0 and err.count(line) == 1, (cache, err)
        assert "PackWarning" not in err  # the line, not Python's warning text
    code, out, err = run(capsys, "export", f"{models}:make", "-o", str(tmp_path / "m.onnx"), "-t", "18", "--json")
    (fault,) = json.loads(out)["pack_faults"]
    assert code == 0 and fault["name"] == "faulty:Raises" and line in err
    code, out, _ = run(capsys, "inspect", str(tmp_path / "m.onnx"))
    assert code == 0 and "packs' faults worked around while exporting" in out and "faulty:Raises" in out


def test_a_raising_rule_of_a_set_is_left_out_and_the_others_apply(make_pack):
    import importlib

    importlib.import_module(make_pack("faulty", FAULTY)).KIND = "set"
    model, x = torch.nn.ReLU(), torch.randn(3)
    with pytest.warns(opreg.PackWarning, match="rewrite faulty:Boom raised ValueError: boom in the check"):
        program = opreg.export(model, (x,), target=18, plugins=["faulty"])
    assert [op for _, op in _nodes(program)] == ["Clip"]
    assert {p.key: p.value for p in program.model_proto.metadata_props}["opreg.rewrites"] == "faulty:ReluClip=1"
    program.verify(x)


def test_the_pipeline_lists_its_passes_and_the_packs_rewrites(make_pack):
    from opreg.exporter import _finish, _rewrite

    make_pack("skipnorm", SKIP_NORM)
    registry = opreg.default_registry()
    target = registry.target("onnx,com.microsoft=1")
    rewrites = _rewrite.collect(opreg.default_host().call(_rewrite.HOOK, target=target))
    lines = _finish.pipeline(weights=frozenset(), rewrites=rewrites, target=target, seed=3).describe()
    steps = [line.strip() for line in lines]
    assert steps[:3] == ["StripAuthoringAttributes", "InlinePass", "SeedRandomNodes"]
    assert steps.index("lean:") < steps.index("FoldWeightTransposes") < steps.index("packs' rewrites:")
    assert steps.index("packs' rewrites:") < steps.index("skipnorm: SkipNorm") < steps.index("lean again:")
    assert "exact rewrites (until nothing changes, at most 4 times):" in steps
    bare = [line.strip() for line in _finish.pipeline(weights=frozenset(), optimize=False, inline=False).describe()]
    assert "lean:" not in bare and "InlinePass" not in bare and "RemoveUnusedNodesPass" in bare


def test_an_exports_own_passes_run_after_the_packs_even_without_rewrite():
    namespace: dict = {}
    exec(A_PASS.partition("@opreg.hookimpl")[0], namespace)  # the pack's pass, given to this export alone
    model, x = torch.nn.ReLU(), torch.randn(3, 4)
    program = opreg.export(model, (x,), target=18, rewrite=False, passes=[namespace["ReluToClip"]()])
    assert [op for _, op in _nodes(program)] == ["Clip"]
    assert _props(program.model_proto.graph.node[0])["opreg.rewrite"] == "export:ReluToClip"
    metadata = {p.key: p.value for p in program.model_proto.metadata_props}
    assert metadata["opreg.rewrites"] == "export:ReluToClip=2"  # the Clip and its Constant
    program.verify(x)


def test_an_exports_own_faulty_pass_or_rule_fails_the_export_naming_it():
    """A rewrite the user asked for (``passes=``) is not left out as a pack's is: it fails the export,
    an OpsetConflictError when the target cannot run what it made, else an ExportError."""
    faulty: dict = {}
    exec(FAULTY.partition("@opreg.hookimpl")[0], faulty)
    always: dict = {}
    exec(ALWAYS.partition("@opreg.hookimpl")[0], always)
    model, x = torch.nn.ReLU(), torch.randn(3)
    raised = r"^opreg.export\(passes=...\): export:Raises raised ValueError: boom in the pass$"
    with pytest.raises(opreg.ExportError, match=raised) as caught:
        opreg.export(model, (x,), target=18, passes=faulty["RULES"]["pass"])
    assert not isinstance(caught.value, opreg.OpsetConflictError)
    made = r"^opreg.export\(passes=...\): export:FastRelu made my\.kernels::FastRelu"
    with pytest.raises(opreg.OpsetConflictError, match=made):
        opreg.export(model, (x,), target=18, passes=always["RULES"]["custom"])


@pytest.mark.parametrize("passes", ["ReluToClip", [print], [None]])
def test_passes_that_are_not_passes_or_rules_are_one_clear_error(passes):
    with pytest.raises(opreg.InvalidArgumentError, match=r"^passes"):
        opreg.export(torch.nn.ReLU(), (torch.randn(3, 4),), passes=passes)


def test_dims_given_a_max_are_recorded_as_the_models_dim_bounds():
    x = torch.randn(2, 5, 4)
    dims = {"input": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=64)}}
    program = opreg.export(torch.nn.ReLU(), (x,), dynamic_shapes=dims)
    metadata = {p.key: p.value for p in program.model_proto.metadata_props}
    assert json.loads(metadata["opreg.dim_bounds"]) == {"seq": [0, 64]}  # batch has no finite max


# -- the conformance kit ---------------------------------------------------------------------

SAMPLES = """

import torch

class AddNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.linear(x) + x)

@opreg.hookimpl
def opreg_targets():
    return {"skipnorm": {"": 18, "com.microsoft": 1}}

@opreg.hookimpl
def opreg_rewrite_samples():
    from opreg.testing import ModelSample

    return {"SkipNorm": [ModelSample.of(AddNorm(), torch.randn(2, 3, 16))]}
"""

WRONG_EPSILON = SKIP_NORM.replace("epsilon=1e-5", "epsilon=10.0")
NOT_FIRING = SAMPLES.replace("return self.norm(self.linear(x) + x)", "return self.norm(self.linear(x))")


def _rows(report, check="rewrites"):
    return [r for r in report.results if r.check == check]


def test_the_kit_sees_a_rule_fire_and_match_eager(make_pack):
    from opreg.testing import check_pack

    make_pack("skipnorm", SKIP_NORM + SAMPLES)
    report = check_pack("skipnorm")
    report.assert_ok()
    (row,) = _rows(report)
    assert (row.subject, row.status) == ("skipnorm:SkipNorm", "passed")
    assert "fired (com.microsoft::SkipLayerNormalization)" in row.detail
    assert [r.status for r in report.results if r.subject in ("opreg_rewrite_rules", "opreg_rewrite_samples")] == [
        "passed",
        "passed",
    ]


def test_the_kit_fails_a_rule_that_changes_the_numbers(make_pack):
    from opreg.testing import check_pack

    make_pack("skipnorm", WRONG_EPSILON + SAMPLES)
    (row,) = _rows(check_pack("skipnorm"))
    assert row.status == "failed"
    assert "differ from eager PyTorch" in row.detail
    assert "skipnorm:SkipNorm is wrong at node" in row.detail  # located: the rule, not the impls it replaced


def test_the_kit_fails_a_sample_in_which_the_rule_does_not_fire(make_pack):
    from opreg.testing import check_pack

    make_pack("skipnorm", SKIP_NORM + NOT_FIRING)
    (row,) = _rows(check_pack("skipnorm"))
    assert row.status == "failed"
    assert "the rule did not fire" in row.detail


def test_a_rule_without_samples_fails_assert_ok_naming_it(make_pack):
    from opreg.testing import check_pack

    make_pack(
        "skipnorm",
        SKIP_NORM.replace('{"skipnorm": {"": 23', '{"sn": {"": 18'),
    )
    report = check_pack("skipnorm")
    (row,) = _rows(report)
    assert (row.status, row.detail) == (
        "skipped",
        "no samples: provide models in which the rule fires with opreg_rewrite_samples",
    )
    with pytest.raises(AssertionError, match="these rewrite rules have no sample.*skipnorm:SkipNorm"):
        report.assert_ok()
    report.assert_ok(allow_unsampled=True)


def test_every_rule_of_the_lean_pass_is_tried_only_on_its_root_op():
    """onnxscript tries each rule of a set on every node; opreg gates each on its pattern's root op
    (commuted rules, whose pattern nodes carry no op identifier, included)."""
    from opreg.exporter.passes import lean, pipeline

    roots = {pipeline._root_op(rule) for rule in lean.RULES}
    assert None not in roots
    assert {"Mul", "Add", "Reshape", "Transpose"} <= roots


class _EveryLeanRule(torch.nn.Module):
    """Nodes the gated rules of the lean pass remove (constants of a shape they match, Reshape,
    Transpose and Squeeze/Unsqueeze pairs), and look-alikes they must keep."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.full((6,), 2.0))

    def forward(self, x):
        y = (x + 0.0) * 1.0 - 0.0
        y = y / 1.0 + self.bias  # a constant, but not a scalar: kept
        y = y.reshape(6, 4).reshape(4, 6).transpose(0, 1).transpose(0, 1)
        y = y * x[0, :1].squeeze(0).unsqueeze(0)  # a 1-D round trip
        return y * x.unsqueeze(0).unsqueeze(0)  # a product of two tensors: kept


def test_a_lean_rule_is_matched_only_on_nodes_whose_inputs_can_match(monkeypatch):
    """Each rule is tried only where the root node's inputs are what its pattern needs (a constant
    of its shape, an output of its op), read from the pattern: the model is the one the ungated
    rules make, node for node."""
    from opreg.exporter.passes import lean, pipeline

    gated = {pipeline._root_op(rule): pipeline._input_gates(rule) for rule in lean.RULES if pipeline._input_gates(rule)}
    assert gated.keys() == {"Mul", "Add", "Sub", "Div", "Cast", "Reshape", "Transpose", "Unsqueeze", "GatherND"}
    args = (torch.randn(4, 6),)
    model = _EveryLeanRule()
    gates_on = opreg.export(model, args, target=18)
    monkeypatch.setattr(pipeline, "_admits", lambda node, gates: True)
    gates_off = opreg.export(model, args, target=18)
    assert gates_on.model_proto.graph == gates_off.model_proto.graph
    ops = [n.op_type for n in gates_on.model_proto.graph.node]
    assert ops == ["Add", "Gather", "Slice", "Mul", "Unsqueeze", "Mul"]  # x[0, :1] is Gather and Slice
    gates_on.verify(*args)


class _RmsNorm(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)


def test_an_epsilon_onnxscript_takes_for_zero_is_kept():
    """onnxscript's ``add_0_rule`` matches a scalar within 1e-8 of 0: an RMS norm with Helium's
    epsilon of 1e-8 lost its Add, and a zero row (a padding token's embedding) became NaN."""
    x = torch.randn(3, 8)
    x[1] = 0.0
    program = opreg.export(_RmsNorm(), (x,))
    assert "Add" in [n.op_type for n in program.model_proto.graph.node]
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(got, _RmsNorm()(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_gate_turns_away_what_the_pattern_cannot_match():
    """A scalar pattern needs a 0-D constant, a list pattern a 1-D one of its length, a node output
    its op; an input the node lacks is the matcher's to judge."""
    import numpy as np
    import onnx_ir as ir

    from opreg.exporter.passes import pipeline

    x = ir.Value(name="x")
    scalar = ir.Value(name="zero", const_value=ir.Tensor(np.array(0.0, np.float32)))
    vector = ir.Value(name="bias", const_value=ir.Tensor(np.zeros(3, np.float32)))
    cast = ir.Node("", "Cast", [x], [ir.AttrInt64("to", 1)])
    assert pipeline._admits(ir.Node("", "Add", [x, scalar]), ((1, ()),))
    assert not pipeline._admits(ir.Node("", "Add", [x, vector]), ((1, ()),))
    assert pipeline._admits(ir.Node("", "Add", [x, vector]), ((1, (3,)),))
    assert not pipeline._admits(ir.Node("", "Add", [x, x]), ((1, ()),))
    assert pipeline._admits(ir.Node("", "Cast", [cast.outputs[0]]), ((0, "Cast"),))
    assert not pipeline._admits(ir.Node("", "Cast", [x]), ((0, "Cast"),))
    assert pipeline._admits(ir.Node("", "Add", [x]), ((1, ()),))


ALTERNATIVES = """
from onnxscript.rewriter import pattern

def _relu_of_either(op, x):  # a Neg under one alternative only: a match need not hold one
    return op.Relu(pattern.OrValue([op.Neg(x), x], tag_var="form"))

def _clip(op, x, form=None):
    return op.Clip(x, op.Constant(value_float=0.0))

def _tanh(op, x):
    return op.Tanh(x)

RULES = {
    "either": [pattern.RewriteRule(_relu_of_either, _clip, name="EitherClip")],
    "absent": [pattern.RewriteRule(_tanh, _tanh, name="NoTanhHere")],
}
KIND = "either"

@opreg.hookimpl
def opreg_rewrite_rules(target):
    return RULES[KIND]
"""


def test_a_packs_rule_is_tried_when_the_ops_every_match_holds_occur_an_alternatives_need_not():
    """A pack's rule is skipped where an op every match holds is absent; an op under one
    alternative of an ``OrValue`` is not such an op (the Relu below matches without its Neg)."""
    from opreg.exporter.passes import pipeline

    namespace: dict = {}
    exec(ALTERNATIVES.partition("@opreg.hookimpl")[0], namespace)
    (rule,) = namespace["RULES"]["either"]
    assert pipeline.pattern_ops(rule) == {"Relu"}
    model, x = torch.nn.ReLU(), torch.randn(3)
    program = opreg.export(model, (x,), target=18, passes=[rule])
    assert [op for _, op in _nodes(program)] == ["Clip"]
    program.verify(x)


def test_a_packs_rewrite_that_fires_nowhere_takes_no_undo_snapshot(make_pack, monkeypatch):
    """The undo snapshot (a clone of the model) is taken at a rule set's first firing, never for
    a rule whose ops are absent; one that fires and is undone leaves the model as it was."""
    import importlib

    from opreg.exporter import _rewrite

    taken = []
    snapshot = _rewrite._snapshot
    monkeypatch.setattr(_rewrite, "_snapshot", lambda model: taken.append(len(model.graph)) or snapshot(model))
    pack = importlib.import_module(make_pack("alternatives", ALTERNATIVES))
    pack.KIND = "absent"
    model, x = torch.nn.ReLU(), torch.randn(3)
    assert [op for _, op in _nodes(opreg.export(model, (x,), target=18, plugins=["alternatives"]))] == ["Relu"]
    assert taken == []
    pack.KIND = "either"
    assert [op for _, op in _nodes(opreg.export(model, (x,), target=18, plugins=["alternatives"]))] == ["Clip"]
    assert taken == [1]  # at the firing, before onnxscript changed the graph of one Relu


class _OwnPositions(torch.nn.Module):
    """``mask[arange(B)[:, None, None, None], arange(S)[None, None, None, :]]``, as transformers'
    mask functions read the 2-D attention mask; ``flip``: the columns read backwards (kept), as
    ``S - 1 - arange(S)``, whose shape is known as the arange's is."""

    def __init__(self, flip: bool = False) -> None:
        super().__init__()
        self.flip = flip

    def forward(self, x, mask):
        rows, columns = torch.arange(mask.shape[0]), torch.arange(mask.shape[1])
        columns = mask.shape[1] - 1 - columns if self.flip else columns
        return x * mask[rows[:, None, None, None], columns[None, None, None, :]]


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_a_gather_of_a_tensors_own_positions_becomes_an_unsqueeze(dynamic):
    """The grid of aranges (Ranges where the sizes are dynamic, constants where they are not) and
    its GatherND go; what reads the positions in another order keeps them."""
    args = (torch.randn(3, 1, 5, 7), torch.rand(3, 7))
    dims = {
        "x": {0: torch.export.Dim("b"), 3: torch.export.Dim("s")},
        "mask": {0: torch.export.Dim("b"), 1: torch.export.Dim("s")},
    }
    shapes = dims if dynamic else None
    program = opreg.export(_OwnPositions(), args, target=18, dynamic_shapes=shapes)
    ops = [n.op_type for n in program.model_proto.graph.node]
    assert ops == ["Unsqueeze", "Mul"]
    program.verify(*args)
    program.verify(torch.randn(2, 1, 5, 4), torch.rand(2, 4)) if dynamic else None
    flipped = opreg.export(_OwnPositions(flip=True), args, target=18, dynamic_shapes=shapes)
    assert "GatherND" in [n.op_type for n in flipped.model_proto.graph.node]
    flipped.verify(*args)
