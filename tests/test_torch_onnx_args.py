"""torch.onnx.export's arguments in opreg.export and the compat layer (issue 50): input_names,
output_names, dynamic_axes, string dim names, opset_version, and a path as the third argument."""

from __future__ import annotations

import onnx
import onnxruntime
import pytest
import torch

import opreg
from tests.test_cli import run


class Pair(torch.nn.Module):
    """Two inputs, one nested: the ONNX inputs are x, pair_0, pair_1."""

    def forward(self, x, pair):
        return x.sum(1), pair[1] * 2 + pair[0].sum(1, keepdim=True)


def _pair_inputs(batch: int = 3):
    return torch.randn(batch, 4), (torch.randn(batch, 5), torch.randn(batch, 2))


def _dims(values) -> list[list[object]]:
    return [[d if isinstance(d, int) else str(d) for d in v.shape] for v in values]


def test_input_names_rename_the_flattened_inputs_and_dynamic_axes_name_their_dims():
    x, pair = _pair_inputs()
    program = opreg.export(
        Pair(), (x, pair), input_names=["inp", "a", "b"], output_names=["s"],
        dynamic_axes={"inp": {0: "batch"}, "a": {0: "rows"}, "b": [0], "s": {0: "batch"}},  # "s": an output, ignored
    )  # fmt: skip
    graph = program.model.graph
    assert [v.name for v in graph.inputs] == ["inp", "a", "b"]
    assert [v.name for v in graph.outputs] == ["s", "output_1"]  # fewer names: the first ones renamed
    assert _dims(graph.inputs) == [["batch", 4], ["rows", 5], ["rows", 2]]  # b's dim is a's: the add ties them
    x2, pair2 = _pair_inputs(5)
    got = program.run(x2, pair2)
    want = Pair()(x2, pair2)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1.3e-6, atol=1e-5)
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["inp", "a", "b"]


def test_dynamic_axes_without_input_names_are_keyed_by_forward_parameters():
    x, pair = _pair_inputs()
    program = opreg.export(Pair(), (x, pair), dynamic_axes={"x": {0: "batch"}})
    assert _dims(program.model.graph.inputs) == [["batch", 4], [3, 5], [3, 2]]
    program = opreg.export(Pair(), (x, pair), dynamic_axes={"x": [0]})  # a list: torch.onnx names the dim itself
    assert _dims(program.model.graph.inputs)[0] == ["x_dim0", 4]


def test_string_dim_names_in_dynamic_shapes_are_dynamic_dims_named_so():
    x, pair = _pair_inputs()
    program = opreg.export(Pair(), (x, pair), dynamic_shapes={"x": {0: "batch"}, "pair": ({0: "n"}, {0: "n"})})
    assert _dims(program.model.graph.inputs) == [["batch", 4], ["n", 5], ["n", 2]]
    program.verify(*_pair_inputs(6))


def test_a_string_dim_torch_fixes_is_an_error_naming_the_input():
    class Tied(torch.nn.Module):
        def forward(self, x, y):
            return x + y  # y's batch is fixed, so x's is too

    with pytest.raises(opreg.ExportError, match=r"x.*size\(\)\[0\]|x\.shape\[0\]"):
        opreg.export(Tied(), (torch.randn(3, 2), torch.randn(3, 2)), dynamic_axes={"x": {0: "batch"}})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dynamic_axes": {"y": [0]}}, r"dynamic_axes names 'y', which is no input: the inputs are \['x'\]"),
        ({"dynamic_axes": {"pair": [0]}}, r"dynamic_axes names 'pair'.*pass input_names= for others"),
        ({"input_names": ["a", "b", "c", "d"]}, r"input_names= gives 4 names, but the model has 3 tensor input"),
        ({"input_names": ["a", "b", "c"]}, None),  # exactly as many: the boundary
        ({"output_names": ["a", "b", "c"]}, r"output_names= gives 3 names, but the model has 2 output"),
        ({"output_names": ["a", "b"]}, None),
        ({"input_names": "x"}, r"input_names= takes a list of names"),
        ({"input_names": ["a", "a"]}, r"names 'a' twice"),
        ({"output_names": [""]}, r"takes non-empty strings"),
        ({"dynamic_axes": {"x": {"0": "b"}}}, r"dynamic_axes\['x'\] takes \{dim: 'name'\} or \[dim, ...\]"),
        ({"dynamic_axes": [("x", [0])]}, r"dynamic_axes= takes \{input name"),
        ({"dynamic_axes": {"x": [0]}, "dynamic_shapes": {"x": {0: "b"}}}, r"pass dynamic_shapes= or dynamic_axes="),
        ({"opset_version": 18, "target": "onnxruntime"}, r"pass target= or opset_version=, not both"),
        ({"opset_version": "18"}, r"opset_version= takes an ai.onnx version"),
        ({"opset_version": True}, r"opset_version= takes an ai.onnx version"),
        ({"opset_version": 18, "target": 18}, None),
    ],
)
def test_torch_onnx_arguments_are_checked(options, message):
    x, pair = _pair_inputs()
    if message is None:
        opreg.export(Pair(), (x, pair), **options)
        return
    with pytest.raises(opreg.InvalidArgumentError, match=message):
        opreg.export(Pair(), (x, pair), **options)


def test_bad_torch_onnx_arguments_are_refused_before_the_capture():
    stages = []
    x, pair = _pair_inputs()
    with pytest.raises(opreg.InvalidArgumentError):
        opreg.export(Pair(), (x, pair), input_names=["a", "b", "c", "d"], progress=stages.append)
    assert stages == []


def test_opset_version_is_the_target():
    x, pair = _pair_inputs()
    assert opreg.export(Pair(), (x, pair), opset_version=18).model.opset_imports[""] == 18
    assert opreg.ExportSettings(opset_version=20).target == 20


def test_a_path_as_the_third_argument_is_torch_onnx_export_f(tmp_path):
    x, pair = _pair_inputs()
    path = tmp_path / "pair.onnx"
    program = opreg.export(Pair(), (x, pair), str(path), input_names=["inp"], dynamic_axes={"inp": {0: "batch"}})
    saved = onnx.load(str(path))
    assert [i.name for i in saved.graph.input] == ["inp", "pair_0", "pair_1"]
    assert saved.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert program.input_names == ("inp", "pair_0", "pair_1")


def test_a_bad_path_is_refused_before_the_export(tmp_path):
    stages = []
    with pytest.raises(opreg.SaveError):
        opreg.export(Pair(), _pair_inputs(), str(tmp_path), progress=stages.append)  # a folder
    assert stages == []


def test_the_compat_layer_takes_torch_onnx_arguments():
    x, pair = _pair_inputs()
    options = opreg.ExportOptions(
        opset_version=18, input_names=["inp"], output_names=["total"], dynamic_axes={"inp": {0: "batch"}}
    )
    program = opreg.dynamo_export(Pair(), x, pair, export_options=options)
    assert program.model.opset_imports[""] == 18
    assert program.input_names[0] == "inp" and program.output_names[0] == "total"
    assert _dims(program.model.graph.inputs)[0] == ["batch", 4]
    with pytest.raises(opreg.InvalidArgumentError, match="pass one"):
        opreg.dynamo_export(Pair(), x, pair, export_options=opreg.ExportOptions(opset_version=18, target=20))


def test_cli_export_takes_input_and_output_names(capsys, tmp_path):
    model_file = tmp_path / "pair.py"
    model_file.write_text(
        "import torch\n\n\nclass Two(torch.nn.Module):\n    def forward(self, x, y):\n        return x + y, x * y\n\n\n"
        "def make():\n    return Two(), (torch.randn(2, 3), torch.randn(2, 3))\n"
    )
    output = tmp_path / "two.onnx"
    code, _, err = run(
        capsys, "export", f"{model_file}:make", "-o", str(output), "--input-names", "a,b", "--output-names", "sum",
        "--dynamic", "x:0=batch", "--dynamic", "y:0=batch", "--verify",
    )  # fmt: skip
    assert code == 0, err
    saved = onnx.load(str(output))
    assert [i.name for i in saved.graph.input] == ["a", "b"]
    assert [o.name for o in saved.graph.output] == ["sum", "output_1"]
    with pytest.raises(SystemExit) as exit_:
        run(capsys, "export", f"{model_file}:make", "-o", str(output), "--input-names", "a,,b")
    assert exit_.value.code == 2 and "write the names separated by commas" in capsys.readouterr().err
