"""A pack's own domain joins the target: an export of a model that uses an op only a pack's custom
domain covers, at a target that does not name the domain, adds it at the version the pack declares,
says so in one line and records it in the model; when it cannot, the refusal gives the target to use.
And a model that mixes ONNX Runtime's own ops with a pack's is verified once its functions are embedded."""

from __future__ import annotations

import json
import logging

import onnx
import onnxscript
import pytest
import torch

import opreg
from opreg import exporter
from opreg.registry.impls import USER_PACK

CUSTOM = "test.customop"


class RoundThenGelu(torch.nn.Module):
    """test_customop's op (test.customop only) beside a gelu (com.microsoft at onnxruntime)."""

    def forward(self, x):
        from opreg_test_customop import addandround_op

        return torch.nn.functional.gelu(addandround_op(x).float())


@pytest.fixture
def x():
    return torch.tensor([[0.25, 0.75, -1.25, 1.3], [-0.4, 2.6, 0.1, -3.0]])


def test_the_domain_joins_the_target_in_one_line_and_is_recorded(x, caplog):
    with caplog.at_level(logging.WARNING, logger="opreg"):
        program = opreg.export(RoundThenGelu(), (x,), target="onnxruntime")
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "\n" not in line
    assert line.startswith("target onnxruntime (") and "names no test.customop" in line
    assert "added test.customop=1, the version the pack declares (-t onnxruntime,test.customop=1 says so)" in line
    assert program.target.spec == "onnxruntime,test.customop=1" and program.target.get("com.microsoft") == 1
    (joined,) = program.joined_domains
    assert (joined.domain, joined.version, joined.packs) == (CUSTOM, 1, ("test_customop",))
    assert joined.ops == ("mylibrary::addandround_op.default",)
    metadata = program.model.metadata_props
    assert metadata["opreg.joined_domains"] == "test.customop=1 (pack test_customop: mylibrary::addandround_op.default)"
    assert metadata["opreg.target"].startswith("onnxruntime,test.customop=1 (")
    imports = program.model.opset_imports
    assert imports[CUSTOM] == 1 and imports["com.microsoft"] == 1
    assert {(n.domain, n.op_type) for n in program.model.graph} >= {(CUSTOM, "CustomOpOne"), ("com.microsoft", "Gelu")}


def test_a_target_that_names_the_domain_is_kept(x, caplog):
    with caplog.at_level(logging.WARNING, logger="opreg"):
        program = opreg.export(RoundThenGelu(), (x,), target="onnxruntime,test.customop=1")
    assert program.joined_domains == () and "opreg.joined_domains" not in program.model.metadata_props
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_check_sees_the_joined_domain(x):
    assert exporter.plan_export(RoundThenGelu(), (x,), target="onnx") == []


def test_explain_names_the_target_and_profile_that_serve_the_op():
    explanation = opreg.default_registry().explain("mylibrary::addandround_op", "onnxruntime")
    assert explanation.chosen is None
    assert explanation.elsewhere == (
        "served at -t onnxruntime,test.customop=1 by test_customop:custom_addandround (an export adds "
        "test.customop=1 by itself, the version pack test_customop declares); served by profile test_customop"
    )
    assert explanation.elsewhere in str(explanation)
    assert opreg.default_registry().explain("aten::relu", "onnx").elsewhere == ""  # served: nothing to add


mine = onnxscript.values.Opset("my.dom", 1)
mine2 = onnxscript.values.Opset("my.dom", 2)


def relu_mine(self):
    """relu(Tensor self) -> Tensor: my.dom::Relu."""
    return onnxscript.values.Op(mine, "Relu")(self)  # my.dom has no ONNX schema: an Op needs none


def relu_mine2(self):
    """relu(Tensor self) -> Tensor: my.dom::Relu version 2."""
    return onnxscript.values.Op(mine2, "Relu")(self)


def sigmoid_mine(self):
    """sigmoid(Tensor self) -> Tensor: my.dom::Sigmoid."""
    return onnxscript.values.Op(mine, "Sigmoid")(self)


class ReluSigmoid(torch.nn.Module):
    def forward(self, x):
        return torch.sigmoid(torch.relu(x))


def registry(declared: int, *impls) -> opreg.Registry:
    """A registry of ``impls`` alone, whose user pack declares ``my.dom`` at ``declared`` (a profile)."""
    built = opreg.Registry()
    built.add_profile("mine", {"": 23, "my.dom": declared})
    for op, function, domains in impls:
        built.register(op, function, domains=domains)
    return built


def test_a_domain_the_impl_does_not_take_at_the_declared_version_is_refused_with_the_target_to_use(x):
    reg = registry(1, ("aten::relu", relu_mine2, {"my.dom": 2}), ("aten::sigmoid", sigmoid_mine, {"my.dom": 1}))
    with pytest.raises(opreg.OpsetConflictError) as caught:
        opreg.export(ReluSigmoid(), (x,), target="onnx", registry=reg)
    message = str(caught.value)
    assert "\n" not in message
    assert f"aten::relu.default needs my.dom>=2 ({USER_PACK}:relu_mine2), and its pack declares my.dom=1" in message
    assert message.endswith("Export with -t onnx,my.dom=2")
    assert opreg.export(ReluSigmoid(), (x,), target="onnx,my.dom=2", registry=reg).target.get("my.dom") == 2


def test_ops_that_need_versions_no_one_version_serves_are_refused_with_a_target_each(x):
    reg = registry(1, ("aten::relu", relu_mine2, {"my.dom": 2}), ("aten::sigmoid", sigmoid_mine, {"my.dom": (1, 1)}))
    with pytest.raises(opreg.OpsetConflictError, match="No one version serves them all") as caught:
        opreg.export(ReluSigmoid(), (x,), target="onnx", registry=reg)
    assert str(caught.value).endswith(
        "(-t onnx,my.dom=2 for aten::relu.default, -t onnx,my.dom=1 for aten::sigmoid.default)"
    )


def test_the_reference_evaluators_refusal_names_embed_functions_and_they_work(x):
    program = opreg.export(RoundThenGelu(), (x,), target="onnxruntime")
    with pytest.raises(opreg.RuntimeUnavailableError) as caught:
        program.verify(x)
    message = str(caught.value)
    assert message.startswith("the reference evaluator has no kernel for com.microsoft::Gelu")
    assert message.endswith(
        "ONNX Runtime runs com.microsoft::Gelu, and pack test_customop defines test.customop::CustomOpOne, "
        "test.customop::CustomOpTwo as ONNX functions: export with embed_functions=True "
        "(opreg export --embed-functions) and ONNX Runtime runs the whole model"
    )
    embedded = opreg.export(RoundThenGelu(), (x,), target="onnxruntime", embed_functions=True)
    assert embedded.verify(x).runtime == "onnxruntime"


MODEL = """
import torch


class RoundThenGelu(torch.nn.Module):
    def forward(self, x):
        from opreg_test_customop import addandround_op

        return torch.nn.functional.gelu(addandround_op(x).float())


def make():
    return RoundThenGelu(), (torch.tensor([[0.25, 0.75, -1.25, 1.3], [-0.4, 2.6, 0.1, -3.0]]),)
"""


def test_opreg_export_says_what_joined_and_embeds_functions_on_request(capsys, tmp_path):
    from opreg.cli import main

    (tmp_path / "model.py").write_text(MODEL)
    model, output = f"{tmp_path / 'model.py'}:make", str(tmp_path / "model.onnx")
    code = main(["export", model, "-o", output, "-t", "onnxruntime", "--verify"])
    out, err = capsys.readouterr()
    (note,) = [line for line in err.splitlines() if line.startswith("note: ")]  # one line
    assert note.startswith("note: target onnxruntime (") and note.endswith(
        "added test.customop=1, the version the pack declares (-t onnxruntime,test.customop=1 says so)"
    )
    (error,) = [line for line in err.splitlines() if line.startswith("opreg: error: ")]
    assert code == 2 and "export with embed_functions=True (opreg export --embed-functions)" in error
    code = main(["export", model, "-o", output, "-t", "onnxruntime", "--embed-functions", "--verify"])
    out, err = capsys.readouterr()
    assert code == 0 and "verified with onnxruntime" in out, err
    assert [f.name for f in onnx.load(output).functions] == ["CustomOpOne", "CustomOpTwo"]


def test_opreg_explain_names_the_target_that_serves_an_op(capsys):
    from opreg.cli import main

    code = main(["explain", "mylibrary::addandround_op", "-t", "onnxruntime"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "It is served at -t onnxruntime,test.customop=1 by test_customop:custom_addandround" in out
    code = main(["explain", "mylibrary::addandround_op", "-t", "onnxruntime", "--json"])
    data = json.loads(capsys.readouterr()[0])
    assert data["chosen"] is None and data["elsewhere"].startswith("served at -t onnxruntime,test.customop=1")


@pytest.mark.parametrize(
    ("plugins", "exclude", "why"),
    [
        (None, ["test_customop", "ort_contrib"], "excluded (exclude= / -p no:NAME)"),
        (["ort_contrib"], [], "not among the requested packs (plugins= / -p NAME)"),
    ],
    ids=["excluded", "not-requested"],
)
def test_an_installed_pack_left_out_is_named_with_how_to_include_it(x, plugins, exclude, why):
    """Issue 53: ``-p no:PACK`` said "No installed pack implements it" of an installed pack it excluded. The
    left-out pack that implements the op is named, with how to include it; one that does not (ort_contrib) is
    not."""
    import opreg.packs.plugins

    registry = opreg.packs.plugins.build_registry(plugins=plugins, exclude=exclude)
    with pytest.raises(opreg.UnsupportedOpsError) as raised:
        opreg.export(RoundThenGelu(), (x,), target=20, registry=registry)
    (entry,) = raised.value.missing
    assert entry.reason == (
        f"Installed pack 'test_customop' implements it, but this export leaves it out: {why}; include it (drop -p "
        "no:test_customop or exclude=, or request it with -p test_customop)."
    )


@pytest.mark.parametrize("target", [20, "ai.onnx=20"], ids=["int", "versions"])
def test_a_domain_joins_a_target_that_is_no_profile(x, caplog, target):
    """The other side of the first test (issue 53: a domain joined without a profile): a bare ai.onnx version
    gets the pack's domain the same way, and says so, and records it."""
    with caplog.at_level(logging.WARNING, logger="opreg"):
        program = opreg.export(RoundThenGelu(), (x,), target=target)
    (joined,) = program.joined_domains
    assert (joined.domain, joined.version, joined.packs) == (CUSTOM, 1, ("test_customop",))
    assert (
        program.target.get("") == 20 and program.target.get(CUSTOM) == 1 and program.target.get("com.microsoft") is None
    )
    assert program.model.metadata_props["opreg.joined_domains"] == (
        "test.customop=1 (pack test_customop: mylibrary::addandround_op.default)"
    )
    assert [r.getMessage() for r in caplog.records if "test.customop=1" in r.getMessage()], caplog.text
    program.verify(x, runtime="reference")
