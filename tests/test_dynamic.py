"""Dynamic shapes as users write them (``opreg/exporter/_dynamic.py``): a batch-1 example with a
dynamic batch, ``dynamic_shapes="auto"`` and its report of the dims torch.export fixed, equal
dims sharing a name. Each exported model is run at other sizes than its example's and compared
with eager PyTorch."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import threading
import warnings

import onnx_ir as ir
import pytest
import torch
from torch.export import Dim

import opreg
from opreg.exporter import _guards
from tests import real_models

ATOL = 1e-4


def _dims(value: ir.Value) -> list[int | str]:
    return [d if isinstance(d, int) else d.value for d in value.shape]


def _shapes(program) -> dict[str, list[int | str]]:
    graph = program.model.graph
    return {v.name: _dims(v) for v in [*graph.inputs, *graph.outputs]}


def _line(function, text: str) -> str:
    """``test_dynamic.py:N in function``: where ``text`` is in ``function``'s source (a report gives
    the file relative to the working folder)."""
    lines, first = inspect.getsourcelines(function)
    number = first + next(i for i, line in enumerate(lines) if text in line)
    return f"test_dynamic.py:{number} in {function.__name__}"


def _at(source: str, function, text: str) -> bool:
    return source.endswith(_line(function, text)) and "/" not in source.replace("tests/", "", 1)


def test_a_batch_of_one_with_a_dynamic_batch():
    """The issue's smallest repro: torch.export fixes a dim of size 1 ("0/1 specialized") unless
    it reasons size-obliviously, as torch.onnx captures."""
    model = torch.nn.Linear(4, 2)
    program = opreg.export(model, (torch.rand(1, 4),), dynamic_shapes={"input": {0: Dim.DYNAMIC}})
    assert _shapes(program) == {"input": ["input_dim0", 4], "output": ["input_dim0", 2]}
    assert program.fixed_dims == ()
    for batch in (3, 5, 1):
        program.verify(torch.rand(batch, 4), atol=ATOL)
    assert not _guards.size_oblivious_now()  # torch's setting is back


def test_named_dims_from_a_batch_of_one_on_a_cnn():
    """A named ``Dim`` (what ``--dynamic x:0=batch`` makes) on a CNN, from one image."""
    case = real_models.mobilenet()
    image = case.args[0][:1]
    program = opreg.export(case.model, (image,), dynamic_shapes={"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}})
    assert _shapes(program)["x"] == ["batch", 3, "h", "w"]
    assert program.shape_guards == ()  # its conv's "1 < 3*h*w" holds at every size
    for shape in ((3, 3, 64, 64), (5, 3, 48, 80)):
        program.verify(torch.randn(shape), atol=ATOL)


def test_a_transformers_encoder_from_a_batch_of_one():
    """BERT from one sequence, batch and sequence length dynamic, run at (3, 5) and (5, 11)."""
    case = real_models.bert()
    program = opreg.export(case.model, (), real_models._text_inputs(1, 8), dynamic_shapes=case.dynamic_shapes)
    assert _shapes(program)["input_ids"] == ["batch", "seq"]
    for batch, seq in ((3, 5), (5, 11)):
        program.verify(**real_models._text_inputs(batch, seq), atol=ATOL)


class OnePath(torch.nn.Module):
    """Takes a path of its own for a batch of one."""

    def forward(self, x):
        if x.shape[0] == 1:
            return x * 2
        return x * 3


def test_a_dynamic_dim_the_model_fixes_at_its_example_size_is_named_with_its_guard():
    """From a batch of one, the size-oblivious capture follows the model's batch-1 branch: kept
    dynamic, the model would double at every batch size. The export says so, with the guard."""
    with pytest.raises(opreg.ExportError) as error:
        opreg.export(OnePath(), (torch.rand(1, 4),), dynamic_shapes={"x": {0: Dim.DYNAMIC}})
    message = str(error.value)
    assert "x.shape[0] (example size 1): guard x.shape[0] == 1" in message
    assert f"{_line(OnePath.forward, '== 1')})" in message
    assert not _guards.size_oblivious_now()  # restored after the error too
    # from a larger example, the model's general path: right at every size but 1
    program = opreg.export(OnePath(), (torch.rand(2, 4),), dynamic_shapes={"x": {0: Dim.DYNAMIC}})
    for batch in (3, 5):
        program.verify(torch.rand(batch, 4), atol=ATOL)


class Broadcast(torch.nn.Module):
    """Expands a row to the other input's batch: torch checks the row's size is 1 (its ``expand``)."""

    def forward(self, row, rows):
        return row.expand(rows.shape[0], -1) + rows


def test_a_check_inside_torch_does_not_fix_a_dim_marked_dynamic(caplog):
    """torch's ``expand`` (and its strides of a batch of one) guard a size against 1 in torch's own
    code: the graph holds the op, as general as ONNX's Expand, so the dim stays dynamic (said in
    a warning); only a guard in the model's code fixes one (above)."""
    spec = {"row": {0: Dim.DYNAMIC}, "rows": {0: Dim.DYNAMIC}}
    with caplog.at_level(logging.WARNING, logger="opreg.exporter._dynamic"):
        program = opreg.export(Broadcast(), (torch.rand(1, 4), torch.rand(5, 4)), dynamic_shapes=spec)
    assert _shapes(program)["row"] == ["row_dim0", 4]
    assert any("row.shape[0]: torch.export narrowed" in r.getMessage() for r in caplog.records)
    program.verify(torch.rand(3, 4), torch.rand(3, 4), atol=ATOL)
    program.verify(torch.rand(1, 4), torch.rand(2, 4), atol=ATOL)


class Guarded(torch.nn.Module):
    """A CNN whose code guards on sizes: a branch for one image, a view needing 8 channels."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.scale = torch.nn.Parameter(torch.randn(8, 1, 1))

    def forward(self, x, bias):
        y = self.conv(x) * self.scale
        if y.shape[0] == 1:
            y = y * 0.5
        return y.flatten(2).mean(-1) + bias


def test_auto_on_a_cnn_keeps_batch_and_image_size_and_reports_the_channels():
    """The tutorial CNN flattens 16x5x5 features into its first Linear: torch keeps the image size
    dynamic, guarded to the sizes that pool to 25 positions (32 to 35 square, or 16 by 112), and
    fixes the one input channel."""
    model = real_models.tutorial_cnn().model
    with pytest.warns(opreg.ShapeGuardWarning, match=r"x\.shape\[2\], x\.shape\[3\]: .* == 400"):
        program = opreg.export(model, (torch.randn(1, 1, 32, 32),), dynamic_shapes="auto")
    assert _shapes(program)["x"] == ["x_dim0", 1, "x_dim2", "x_dim3"]
    (guard,) = program.shape_guards  # the sizes that pool to 25 positions: the model does not check it
    assert guard.dims == ("x.shape[2]", "x.shape[3]") and guard.guard.endswith(" == 400")
    assert guard.source.startswith("tests/models.py:")
    (channels,) = program.fixed_dims
    assert (channels.input, channels.dim, channels.size) == ("x", 1, 1)
    assert channels.guard == "guard x.shape[1] == 1"
    assert channels.source.startswith("tests/models.py:") and channels.source.endswith("in forward")
    metadata = json.loads(program.model.metadata_props["opreg.fixed_dims"])
    assert metadata == [dataclasses.asdict(channels)]
    for shape in ((3, 1, 32, 32), (5, 1, 35, 33), (2, 1, 16, 112)):
        program.verify(torch.randn(shape), atol=ATOL)


def test_auto_reports_each_guard_with_its_line_and_keeps_the_rest_dynamic():
    """From one image, "auto" keeps batch and image size dynamic, fixes the channels (the conv's
    weight) and, where the model branches on a batch of one, the batch, naming each guard."""
    image, bias = torch.randn(1, 3, 10, 12), torch.randn(8)
    program = opreg.export(Guarded(), (image, bias), dynamic_shapes="auto")
    assert _shapes(program)["x"] == [1, 3, "x_dim2", "x_dim3"]
    fixed = {(f.input, f.dim): f for f in program.fixed_dims}
    assert set(fixed) == {("x", 0), ("x", 1), ("bias", 0)}
    assert fixed["x", 0].guard == "guard x.shape[0] == 1" and _at(fixed["x", 0].source, Guarded.forward, "== 1")
    assert fixed["x", 1].guard == "guard x.shape[1] == 3" and _at(fixed["x", 1].source, Guarded.forward, "conv")
    assert str(fixed["x", 0]) == f"x.shape[0] fixed at 1: guard x.shape[0] == 1 ({fixed['x', 0].source})"
    program.verify(torch.randn(1, 3, 7, 20), bias, atol=ATOL)
    # from two images the batch stays dynamic: the model's general path
    program = opreg.export(Guarded(), (torch.randn(2, 3, 10, 12), bias), dynamic_shapes="auto")
    assert _shapes(program)["x"] == ["x_dim0", 3, "x_dim2", "x_dim3"]
    program.verify(torch.randn(5, 3, 6, 6), bias, atol=ATOL)


class Blur(torch.nn.Module):
    """Picks a blur from a sigma computed from the image height, as kornia's ``resize(antialias=True)``
    does: torch.export keeps the float guard ``4 * sigma < 3`` (true below 80 rows), which its range
    constraints cannot hold, and checks it only when the captured program runs."""

    def forward(self, x):
        sigma = (x.shape[2] / 32 - 1.0) / 2.0
        if 4.0 * sigma < 3.0:
            return x * 2
        return x + 1


def test_a_guard_beyond_the_dims_range_is_reported_with_its_line():
    """On a ``Dim.DYNAMIC`` (or ``Dim.AUTO``) the ONNX model cannot check such a guard: the export
    warns with it, in the input's dims and with the model's line, and keeps it on the program and in
    the model's metadata. The model is right where the guard holds and wrong where it does not.
    Bounded to where it holds, nothing is reported; a named ``Dim`` beyond it torch refuses."""
    spec = {"x": {0: Dim.DYNAMIC, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC}}
    with pytest.warns(opreg.ShapeGuardWarning, match=r"x\.shape\[2\]: 4\.0\*.* < 3\.0 \(.*test_dynamic") as caught:
        program = opreg.export(Blur(), (torch.rand(1, 3, 64, 64),), dynamic_shapes=spec)
    assert [w.filename for w in caught] == [__file__]  # the user's export call
    (guard,) = program.shape_guards
    assert (guard.guard, guard.dims) == ("4.0*((((-1.0) + (x.shape[2] / 32)) / 2.0)) < 3.0", ("x.shape[2]",))
    assert _at(guard.source, Blur.forward, "< 3.0")
    assert str(guard) == f"x.shape[2]: {guard.guard} ({guard.source})"
    (saved,) = json.loads(program.model.metadata_props["opreg.shape_guards"])
    assert saved == {"guard": guard.guard, "dims": ["x.shape[2]"], "source": guard.source}
    program.verify(torch.rand(2, 3, 72, 40), atol=ATOL)
    with pytest.raises(opreg.VerificationError):
        program.verify(torch.rand(1, 3, 96, 96), atol=ATOL)  # the example's branch, at 96 rows
    with warnings.catch_warnings():
        warnings.simplefilter("error", opreg.ShapeGuardWarning)
        program = opreg.export(Blur(), (torch.rand(1, 3, 64, 64),), dynamic_shapes={"x": {2: Dim("h", max=79)}})
    assert program.shape_guards == () and "opreg.shape_guards" not in program.model.metadata_props
    with pytest.raises(opreg.ExportError, match=r"Constraints violated \(h\)"):
        opreg.export(Blur(), (torch.rand(1, 3, 64, 64),), dynamic_shapes={"x": {2: Dim("h")}})


class Picks(torch.nn.Module):
    """Sums the first rows, as many as a value of its input says: a size known only from data,
    guarded against the input's size (``torch._check``)."""

    def forward(self, x, count):
        n = count.max().item()
        torch._check(n >= 0)
        torch._check(n < x.shape[0])
        return x[: n + 1].sum(0) * 2


def test_auto_on_a_model_with_a_data_dependent_guard():
    """A guard on a value read from the data relates it to an input's size without fixing the
    size: "auto" keeps every dim dynamic, and the model is right at other sizes and values."""
    program = opreg.export(Picks(), (torch.randn(6, 4), torch.tensor([2, 3])), dynamic_shapes="auto")
    assert _shapes(program) == {"x": ["x_dim0", "x_dim1"], "count": ["count_dim0"], "output": ["x_dim1"]}
    assert program.fixed_dims == ()
    program.verify(torch.randn(9, 3), torch.tensor([7, 1, 0]), atol=ATOL)
    program.verify(torch.randn(1, 5), torch.tensor([0]), atol=ATOL)


class Attention(torch.nn.Module):
    """One attention layer with a key/value cache: the new keys and values come from one input."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(8, 8) for _ in range(3))

    def heads(self, x):
        return x.view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)

    def forward(self, hidden, past_key, past_value):
        key = torch.cat([past_key, self.heads(self.k(hidden))], 2)
        value = torch.cat([past_value, self.heads(self.v(hidden))], 2)
        attended = torch.nn.functional.scaled_dot_product_attention(self.heads(self.q(hidden)), key, value)
        return attended, key, value


@pytest.mark.parametrize("spec", ["auto", "dynamic"])
def test_equal_dims_share_a_name(spec):
    """Past keys and values have one length: torch's attention does not compare them, so torch
    gives each a symbol; the export names them as one, in the inputs and in the outputs (the
    present keys and values). Dims torch proves equal (every input's batch) share one too."""
    D = Dim.DYNAMIC
    shapes = spec if spec == "auto" else {
        "hidden": {0: D, 1: D}, "past_key": {0: D, 2: D}, "past_value": {0: D, 2: D}
    }  # fmt: skip
    args = (torch.rand(1, 3, 8), torch.rand(1, 2, 5, 4), torch.rand(1, 2, 5, 4))
    program = opreg.export(Attention(), args, dynamic_shapes=shapes)
    dims = _shapes(program)
    assert dims["past_key"] == dims["past_value"] == ["hidden_dim0", 2, "past_key_dim2", 4]
    assert dims["output_1"] == dims["output_2"] == ["hidden_dim0", 2, "hidden_dim1 + past_key_dim2", 4]
    for batch, new, past in ((3, 1, 7), (5, 4, 0)):
        program.verify(torch.rand(batch, new, 8), torch.rand(batch, 2, past, 4), torch.rand(batch, 2, past, 4))


def test_a_users_name_wins_over_a_made_up_one():
    named = {"hidden": {0: Dim("batch")}, "past_key": {0: Dim("batch"), 2: Dim.DYNAMIC}}
    shapes = {**named, "past_value": {0: Dim("batch"), 2: Dim("past")}}
    args = (torch.rand(2, 3, 8), torch.rand(2, 2, 5, 4), torch.rand(2, 2, 5, 4))
    dims = _shapes(opreg.export(Attention(), args, dynamic_shapes=shapes))
    assert dims["past_key"] == dims["past_value"] == ["batch", 2, "past", 4]


def test_a_cache_input_flattens_with_its_attribute_names():
    """transformers' caches as inputs: torch.export names where each tensor comes from by the
    pytree keys opreg registers them with (it refused keys of another class)."""
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache

    from opreg.exporter import _pytrees

    _pytrees.register_known_types()
    cache = DynamicCache(config=transformers.LlamaConfig(num_hidden_layers=1))
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 0)

    class ReadsCache(torch.nn.Module):
        def forward(self, x, cache):
            return x + cache.layers[0].keys.sum(-1) - cache.layers[0].values.sum(-1)

    x = torch.rand(1, 2, 3)
    program = opreg.export(ReadsCache(), (x, cache), dynamic_shapes="auto")
    assert _shapes(program) == {
        "x": ["x_dim0", "x_dim1", "x_dim2"],
        "cache_layers_0_keys": ["x_dim0", "x_dim1", "x_dim2", "cache_layers_0_keys_dim3"],
        "cache_layers_0_values": ["x_dim0", "x_dim1", "x_dim2", "cache_layers_0_values_dim3"],
        "output": ["x_dim0", "x_dim1", "x_dim2"],
    }
    program.verify(x, cache, atol=ATOL)


def test_an_auto_dim_torch_cannot_keep_at_size_one_is_fixed_with_the_error():
    """Broadcasting against a weight of 3 rows: from one row torch cannot keep the batch dynamic
    (size-obliviously it must be 3): "auto" fixes it at 1, as eager broadcasting computes it."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(3, 4))

        def forward(self, x):
            return x * self.weight

    program = opreg.export(Scaled(), (torch.rand(1, 4),), dynamic_shapes="auto")
    (batch, features) = program.fixed_dims
    assert (batch.input, batch.dim, batch.size) == ("x", 0, 1)
    assert "torch.export fails" in batch.guard and "must match the size of tensor b (3)" in batch.guard
    assert batch.source.startswith("test_dynamic.py:") or batch.source.startswith("tests/test_dynamic.py:")
    assert features.guard == "guard x.shape[1] == 4"
    program.verify(torch.rand(1, 4), atol=ATOL)


def test_wrong_dynamic_shapes_strings_are_refused_before_the_capture():
    with pytest.raises(opreg.InvalidArgumentError, match="dynamic_shapes='Auto': give 'auto'"):
        opreg.export(torch.nn.Linear(4, 2), (torch.rand(1, 4),), dynamic_shapes="Auto")


def test_torchs_setting_and_logger_are_left_as_they_were_from_threads():
    """Exports with batch-1 dynamic dims from four threads at once (captures take turns behind the
    capture lock): every result is right, and torch's size-oblivious setting and its shape
    logger's level and filters are as before, in the threads and after them."""
    logger = logging.getLogger(_guards.SHAPES_LOGGER)
    level, filters = logger.level, list(logger.filters)
    models = [torch.nn.Linear(4, 2) for _ in range(4)]
    errors: list[BaseException] = []

    def run(model):
        try:
            program = opreg.export(model, (torch.rand(1, 4),), dynamic_shapes={"input": {0: Dim.DYNAMIC}})
            program.verify(torch.rand(3, 4), atol=ATOL)
            with pytest.raises(opreg.ExportError):
                opreg.export(OnePath(), (torch.rand(1, 4),), dynamic_shapes={"x": {0: Dim.DYNAMIC}})
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(m,)) for m in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert not _guards.size_oblivious_now()
    assert (logger.level, logger.filters) == (level, filters)


def test_a_transformers_decoder_from_a_batch_of_one():
    """A causal LM called as ``generate`` calls it (with its cache) exports from one sequence and
    is right at other batch sizes and lengths, one included. Without the cache transformers looks
    for packed sequences, comparing the batch with the position ids' and the length with 1 (its
    masking_utils): from a batch of one torch.export refuses the dynamic batch, and the error says
    where the model's code guards it. (``opreg llm export`` captures its decoder at batch 2,
    sequence 3, past 4; tests/test_llm.py runs it at batch 1, sequence 1 and past 0.)"""
    from tests import language_models

    model = language_models.causal_lm("llama")
    dims = {"input_ids": {0: Dim("batch"), 1: Dim("seq")}, "use_cache": None}
    ids = torch.randint(3, language_models.VOCAB, (1, 8))
    program = opreg.export(model, (), {"input_ids": ids, "use_cache": True}, dynamic_shapes=dims)
    assert _shapes(program)["input_ids"] == ["batch", "seq"]
    for shape in ((3, 5), (1, 1)):
        program.verify(input_ids=torch.randint(3, language_models.VOCAB, shape), use_cache=True)
    with pytest.raises(opreg.ExportError) as error:
        opreg.export(model, (), {"input_ids": ids, "use_cache": False}, dynamic_shapes=dims)
    message = str(error.value)
    assert "Constraints violated (batch)" in message
    assert "Where the model's code guards the dims marked dynamic:\n- input_ids.shape[0] == 1 (transformers/" in message


def test_a_dim_the_graph_has_at_its_example_size_after_a_guard_is_found():
    """A guard in torch's code narrows a batch of one without a branch of the model's, yet torch
    then gives an op's output batch 1 where its input has the batch (a diffusers UNet from one image,
    image size dynamic: its group norm's reshape then merged the batch into one row, silently
    wrong). The graph's pointwise ops are searched for one; slices, reductions, reshapes and
    convolutions, which may give a dim a size of their own, are not (bench/models_sweep.py
    --dynamic runs the UNet)."""
    from opreg.exporter import _capture, _narrowing

    class Views(torch.nn.Module):
        def forward(self, x):
            return x[:1] + x.sum(0, keepdim=True), x.reshape(1, -1), x.view(1, 4) * 2

    spec = {"x": {0: Dim.DYNAMIC}}
    program = _capture.capture(Views(), (torch.rand(1, 4),), None, spec, oblivious=True)
    (symbol,) = program.range_constraints
    assert _narrowing._baked(program, symbol) == "size 1 (dim 0 of aten.mul.Tensor's output)"  # after the view
    # torch's expand check narrows the row's batch, and every op keeps it (kept dynamic, above)
    spec = {"row": {0: Dim.DYNAMIC}, "rows": {0: Dim.DYNAMIC}}
    program = _capture.capture(Broadcast(), (torch.rand(1, 4), torch.rand(5, 4)), None, spec, oblivious=True)
    assert all(_narrowing._baked(program, symbol) is None for symbol in program.range_constraints)


class AttendTwice(torch.nn.Module):
    """A diffusers UNet's pattern, small: an attention over an image's pixels whose output is
    reshaped back to an image (channels-last strides), then a group norm and a convolution; from
    one image torch's convolution narrows the batch (its memory format), a view's strides fix it at
    1, and the division after the next attention's residual has batch 1 in the graph. A branch on
    the number of elements (its VAEs') does not narrow the batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.mix = torch.nn.Linear(8, 8)
        self.mid = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.out = torch.nn.Conv2d(8, 3, 3, padding=1)

    def attend(self, h):
        b, c, height, width = h.shape
        pixels = self.mix(self.norm(h).view(b, c, height * width).transpose(1, 2))
        return (pixels.transpose(-1, -2).reshape(b, c, height, width) + h) / 2.0

    def forward(self, x):
        h = self.attend(self.conv(x))
        if h.numel() * 4 > 2**31:  # diffusers' upsampling: a guard on the batch, true at 2 as at 1
            h = h.contiguous()
        h = self.attend(self.mid(torch.nn.functional.silu(self.norm(h))))
        h = self.mid(torch.nn.functional.silu(self.norm(h)))
        return self.out(self.attend(self.attend(h)))


def test_a_batch_of_one_torchs_code_fixes_is_captured_again_at_two(caplog, capsys, tmp_path):
    """Issue 38's UNet2DModel: from one image (batch Dim.DYNAMIC, image size Dim.AUTO) the first
    capture has the batch at 1 after a guard in torch's code only; the export captures again from
    the image repeated to a batch of 2, says so, and the model is right at batches 1, 2 and 3."""
    spec = {"x": {0: Dim.DYNAMIC, 2: Dim.AUTO, 3: Dim.AUTO}}
    with caplog.at_level(logging.WARNING, logger="opreg.exporter._dynamic"), pytest.warns(opreg.ShapeGuardWarning):
        program = opreg.export(AttendTwice().eval(), (torch.rand(1, 3, 16, 16),), dynamic_shapes=spec)
    # captured size-obliviously again: torch's checks of the views' strides leave no guard at batch 2;
    # the model's branch on its number of elements is reported
    (guard,) = program.shape_guards
    assert guard.guard.endswith(" <= 2147483648") and _at(guard.source, AttendTwice.forward, "h.numel()")
    (grown,) = program.grown_dims
    assert (grown.input, grown.dim, grown.size, grown.captured_at) == ("x", 0, 1, 2)
    assert grown.guard.startswith("guard x.shape[0] == 1 in torch's code, after which the graph has it at size 1")
    assert _at(grown.source, AttendTwice.attend, "self.norm(h).view")
    assert str(grown) in caplog.text
    assert json.loads(program.model.metadata_props["opreg.grown_dims"])[0]["captured_at"] == 2
    program.save(tmp_path / "m.onnx")  # opreg inspect shows it, as it shows the fixed dims
    from opreg.cli import main

    assert main(["inspect", str(tmp_path / "m.onnx")]) == 0
    assert f"note: {grown}" in " ".join(capsys.readouterr().out.split())
    assert _shapes(program)["x"] == ["x_dim0", 3, "x_dim2", "x_dim3"]
    for batch, size in ((1, 16), (2, 16), (3, 24)):
        program.verify(torch.rand(batch, 3, size, size), atol=ATOL)


class Squeezes(torch.nn.Module):
    def forward(self, x, y):
        return x.squeeze() * 2, y.squeeze(1) + 1


def test_a_squeeze_that_keeps_a_dim_of_example_size_one_is_reported():
    """No guard: size-obliviously torch does not know the dim is 1, so ``squeeze`` keeps it; eager
    removes it at size 1. Reported as a guard the model does not check, with the model's line; a
    squeeze of a static 1 is not."""
    spec = {"x": {0: Dim.DYNAMIC}, "y": {0: Dim.DYNAMIC}}
    with pytest.warns(opreg.ShapeGuardWarning, match=r"x.shape\[0\] != 1 \(a squeeze keeps the dim") as caught:
        program = opreg.export(Squeezes(), (torch.rand(1, 4), torch.rand(1, 1, 3)), dynamic_shapes=spec)
    (guard,) = program.shape_guards
    assert guard.dims == ("x.shape[0]",)
    assert guard.guard == "x.shape[0] != 1 (a squeeze keeps the dim, which eager PyTorch removes at size 1)"
    assert _at(guard.source, Squeezes.forward, "x.squeeze()")
    assert len(caught) == 1
    assert _shapes(program)["output_0"] == ["x_dim0", 4]  # eager: (4,) at batch 1
    program.verify(torch.rand(3, 4), torch.rand(3, 1, 3), atol=ATOL)
    assert json.loads(program.model.metadata_props["opreg.shape_guards"])[0]["dims"] == ["x.shape[0]"]


def test_a_guard_true_at_every_size_is_not_reported():
    """kornia's ``filter2d`` leaves ``3*w*b*(h + 2) % (w*(3*h + 6)) == 0``, a multiple of its modulus at
    every size: torch's bounds cannot prove that, sympy's ``Mod`` can; a decoder's ``repeat_kv`` leaves
    a ``Min`` sympy proves with the sizes positive."""
    import sympy
    from torch.utils._sympy.functions import Mod
    from torch.utils._sympy.value_ranges import ValueRanges

    from opreg.exporter import _guards

    b, h, w = sympy.symbols("s0 s1 s2", integer=True, positive=True)
    sizes = dict.fromkeys((b, h, w), ValueRanges(2, 1000))
    assert _guards.holds(sympy.Eq(Mod(3 * w * b * (h + 2), w * (3 * h + 6)), 0), sizes)
    assert _guards.holds(h + w > 3, sizes)  # torch's bounds
    # transformers' repeat_kv: true for positive sizes, which torch's interval bounds cannot relate
    # (torch's size symbols are integers, not declared positive: sympy would settle the Min on its own)
    p, q = sympy.symbols("s3 s4", integer=True)
    pair = dict.fromkeys((p, q), ValueRanges(2, 1000))
    assert _guards.holds(sympy.Eq(sympy.Min(16 * p + 16 * q, 32 * p + 32 * q), 16 * p + 16 * q), pair)
    assert not _guards.holds(sympy.Eq(Mod(w * b, h), 0), sizes)
    assert not _guards.holds(h < 80, sizes)


def test_a_relation_of_cells_after_floor_divisions_is_settled_from_its_sides_difference():
    """wav2vec2's feature encoder leaves ``b*(L//10 - 1) != b`` and ``b % (b*(L//10 - 1)) != 0``
    (two frames or more), DETR's backbone ``n % (n*m) != 0`` (a map of more than one cell): true
    over the ranges the loaders give, which bounds of each side alone cannot show; false where a
    range lets the map be one cell."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod
    from torch.utils._sympy.value_ranges import ValueRanges

    from opreg.exporter import _guards

    b, length, h, w = sympy.symbols("s0 s1 s2 s3", integer=True, positive=True)
    sizes = {b: ValueRanges(2, 1024), length: ValueRanges(30, sympy.oo), **dict.fromkeys((h, w), ValueRanges(33, 4096))}
    frames = FloorDiv(length, 10) - 1
    rows, columns = 1 + FloorDiv(h - 1, 8), 1 + FloorDiv(w - 1, 8)
    assert _guards.holds(sympy.Ne(b * frames, b), sizes)
    assert _guards.holds(sympy.Ne(Mod(b, b * frames), 0), sizes)
    assert _guards.holds(sympy.Ne(Mod(rows, rows * columns), 0), sizes)
    assert _guards.holds(sympy.Ne(Mod(1, rows * columns), 0), sizes)
    assert _guards.holds(rows * columns - rows > 0, sizes)
    assert not _guards.holds(sympy.Ne(b * frames, b), {**sizes, length: ValueRanges(20, sympy.oo)})  # L in 20..29
    assert not _guards.holds(sympy.Ne(Mod(rows, rows * columns), 0), {**sizes, w: ValueRanges(2, 8)})  # one column
    assert not _guards.holds(sympy.Ne(Mod(rows, columns), 0), sizes)  # no relation between the two


def test_a_min_or_max_of_sizes_is_settled_without_simplify_where_one_argument_is_proven_the_least():
    """torch builds ``repeat_kv``'s guard unevaluated, its symbols positive integers: sympy's own
    ``Min`` does not settle it, ``sympy.simplify`` does at a tenth of a CPU second; the argument
    proven no greater than the others settles it at once. Undecided ones are left as they are."""
    import sympy

    from opreg.exporter import _guards

    p, q = sympy.symbols("s3 s4", integer=True, positive=True)
    small, large = 64 * p + 64 * q, 256 * p + 256 * q
    guard = sympy.Eq(sympy.Min(small, large, evaluate=False), small, evaluate=False)
    assert guard is not sympy.true
    assert _guards.min_max_decided(guard) is sympy.true
    assert _guards.min_max_decided(sympy.Max(small, large, evaluate=False)) == large
    undecided = sympy.Min(p, q, evaluate=False)
    assert _guards.min_max_decided(undecided) == undecided
    assert _guards.min_max_decided(sympy.Eq(sympy.Max(2 * p + q, p, evaluate=False), p)) is sympy.false
