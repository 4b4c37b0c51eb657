"""The test shim's kernels for torchvision's ops (tests/torchvision_shim), on cases computed by hand and
against scalar transcriptions of torchvision's CPU kernels: they are the eager reference the
opreg-torchvision pack is verified against, so they must be what the C++ kernels compute."""

from __future__ import annotations

import math

import pytest
import torch

torchvision = pytest.importorskip("torchvision")
ops = torch.ops.torchvision


def grid(height: int = 4, width: int = 4, channels: int = 1) -> torch.Tensor:
    """``value = 100 * channel + row * width + column``: every pixel names itself."""
    plane = torch.arange(height * width, dtype=torch.float32).reshape(height, width)
    return torch.stack([plane + 100 * c for c in range(channels)])[None]


# -- nms -----------------------------------------------------------------------------------------------


def test_nms_keeps_the_best_of_each_overlapping_group():
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], dtype=torch.float32)
    # IoU(0, 1) = 81 / 119 = 0.68
    assert ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist() == [0, 2]
    assert ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.7).tolist() == [0, 1, 2]
    assert ops.nms(boxes, torch.tensor([0.7, 0.8, 0.9]), 0.5).tolist() == [2, 1]


def test_nms_breaks_ties_by_index_and_takes_no_boxes():
    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 10.5], [50, 50, 60, 60], [0, 0, 10, 10]])
    assert ops.nms(boxes, torch.full((4,), 0.5), 0.5).tolist() == [0, 2]
    assert ops.nms(torch.zeros(0, 4), torch.zeros(0), 0.5).tolist() == []


def test_nms_is_greedy_nms_on_random_boxes():
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(300, 2, generator=generator) * 100
    boxes = torch.cat([corners, corners + torch.rand(300, 2, generator=generator) * 30 + 1], dim=1)
    scores = torch.rand(300, generator=generator)
    expected, order = [], scores.argsort(descending=True, stable=True).tolist()
    while order:  # the textbook loop: keep the best, drop what overlaps it by more than the threshold
        best = order.pop(0)
        expected.append(best)
        order = [i for i in order if torchvision.ops.box_iou(boxes[[best]], boxes[[i]]).item() <= 0.4]
    assert ops.nms(boxes, scores, 0.4).tolist() == expected


# -- roi_align ------------------------------------------------------------------------------------------


def bilinear(plane: torch.Tensor, y: float, x: float) -> float:
    """torchvision's RoIAlign ``bilinear_interpolate``, transcribed on Python floats."""
    height, width = plane.shape
    if not (-1.0 <= y <= height and -1.0 <= x <= width):
        return 0.0
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_low = y_high = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_low = x_high = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    p = plane.double()
    return float(hy * hx * p[y_low, x_low] + hy * lx * p[y_low, x_high] + ly * hx * p[y_high, x_low]
                 + ly * lx * p[y_high, x_high])  # fmt: skip


def roi_align_reference(x, rois, scale, pooled_h, pooled_w, sampling, aligned, position_sensitive=False):
    """``roi_align_forward_kernel_impl`` (``ps_roi_align`` with ``position_sensitive``), on Python floats."""
    channels = x.shape[1] // (pooled_h * pooled_w) if position_sensitive else x.shape[1]
    out = torch.zeros(len(rois), channels, pooled_h, pooled_w, dtype=torch.float64)
    offset = 0.5 if aligned or position_sensitive else 0.0
    for k, (batch, *corners) in enumerate(rois.tolist()):
        x1, y1, x2, y2 = (v * scale - offset for v in corners)
        height, width = y2 - y1, x2 - x1
        if not aligned and not position_sensitive:
            height, width = max(height, 1.0), max(width, 1.0)
        grid_h = sampling if sampling > 0 else math.ceil(height / pooled_h)
        grid_w = sampling if sampling > 0 else math.ceil(width / pooled_w)
        count = grid_h * grid_w if position_sensitive else max(grid_h * grid_w, 1)
        for c in range(channels):
            for ph in range(pooled_h):
                for pw in range(pooled_w):
                    source = (c * pooled_h + ph) * pooled_w + pw if position_sensitive else c
                    total = sum(
                        bilinear(x[int(batch), source], y1 + ph * height / pooled_h + (iy + 0.5) * height / pooled_h
                                 / grid_h, x1 + pw * width / pooled_w + (ix + 0.5) * width / pooled_w / grid_w)
                        for iy in range(max(grid_h, 0))
                        for ix in range(max(grid_w, 0))
                    )  # fmt: skip
                    out[k, c, ph, pw] = total / count if count else math.nan
    return out


def test_roi_align_samples_bilinearly_by_hand():
    x = grid()
    roi = torch.tensor([[0, 0.0, 0.0, 3.0, 3.0]])
    # not aligned: one sample at the centre (1.5, 1.5) of the 3 x 3 box: 1.5 * 4 + 1.5
    assert ops.roi_align(x, roi, 1.0, 1, 1, 1, False).item() == pytest.approx(7.5)
    # aligned: the box starts at -0.5, its centre is pixel (1, 1)
    assert ops.roi_align(x, roi, 1.0, 1, 1, 1, True).item() == pytest.approx(5.0)
    # a box wholly left of the map samples nothing: 0
    assert ops.roi_align(x, torch.tensor([[0, -9.0, 0.0, -5.0, 3.0]]), 1.0, 1, 1, 2, False).item() == 0.0


@pytest.mark.parametrize(("scale", "pooled", "sampling", "aligned"), [
    (1.0, (3, 3), 2, False), (0.5, (2, 4), -1, True), (2.0, (3, 2), 1, True), (1.0, (2, 2), 0, False),
])  # fmt: skip
def test_roi_align_is_torchvisions_kernel(scale, pooled, sampling, aligned):
    from opreg_torchvision.samples import _generator, _rois

    generator = _generator(3)
    x, rois = torch.randn(2, 3, 10, 12, generator=generator), _rois(generator)
    expected = roi_align_reference(x, rois, scale, *pooled, sampling, aligned)
    torch.testing.assert_close(ops.roi_align(x, rois, scale, *pooled, sampling, aligned), expected.float())


def test_ps_roi_align_reads_each_bins_own_channel():
    x = torch.arange(4, dtype=torch.float32).reshape(1, 4, 1, 1).expand(1, 4, 6, 6).contiguous()
    output, mapping = ops.ps_roi_align(x, torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]]), 1.0, 2, 2, 2)
    assert output[0, 0].tolist() == [[0.0, 1.0], [2.0, 3.0]]  # bin (ph, pw) of a constant channel ph * 2 + pw
    assert mapping[0, 0].tolist() == [[0, 1], [2, 3]] and mapping.dtype == torch.int32


def test_ps_roi_align_is_torchvisions_kernel():
    from opreg_torchvision.samples import _generator, _rois

    generator = _generator(4)
    x, rois = torch.randn(2, 8, 10, 12, generator=generator), _rois(generator)
    for scale, sampling in ((1.0, 2), (0.5, -1)):
        output, _ = ops.ps_roi_align(x, rois, scale, 2, 2, sampling)
        expected = roi_align_reference(x, rois, scale, 2, 2, sampling, True, position_sensitive=True)
        torch.testing.assert_close(output, expected.float(), equal_nan=True)
    # a point box with adaptive sampling has no sample: 0 / 0
    point, _ = ops.ps_roi_align(x, torch.tensor([[1, 2.5, 3.5, 2.5, 3.5]]), 1.0, 2, 2, -1)
    assert torch.isnan(point).all()


# -- roi_pool, ps_roi_pool ---------------------------------------------------------------------------------------


def test_roi_pool_takes_each_bins_first_maximum():
    output, argmax = ops.roi_pool(grid(), torch.tensor([[0, 0.0, 0.0, 3.0, 3.0]]), 1.0, 2, 2)
    # the box spans 4 x 4 pixels (end - start + 1): bins [0, 2) and [2, 4)
    assert output[0, 0].tolist() == [[5.0, 7.0], [13.0, 15.0]]
    assert argmax[0, 0].tolist() == [[5, 7], [13, 15]] and argmax.dtype == torch.int32


def test_roi_pool_rounds_halves_away_from_zero_and_empties_bins_off_the_map():
    x = grid()
    output, _ = ops.roi_pool(x, torch.tensor([[0, 1.5, 1.5, 2.5, 2.5]]), 1.0, 1, 1)
    assert output.item() == 15.0  # corners 2 and 3 (round half to even gives 2 and 2: pixel 10)
    output, argmax = ops.roi_pool(x, torch.tensor([[0, -10.0, -10.0, -8.0, -8.0]]), 1.0, 2, 2)
    assert output.abs().sum() == 0 and (argmax == -1).all()
    ties = torch.ones(1, 1, 4, 4)
    _, argmax = ops.roi_pool(ties, torch.tensor([[0, 0.0, 0.0, 3.0, 3.0]]), 1.0, 1, 1)
    assert argmax.item() == 0  # the first of equal maxima


def test_ps_roi_pool_averages_each_bin_clipped_to_the_last_row_but_one():
    x = grid(channels=4)
    output, mapping = ops.ps_roi_pool(x, torch.tensor([[0, 0.0, 0.0, 4.0, 4.0]]), 1.0, 2, 2)
    # size max(4 - 0, 1) = 4, bins [0, 2) and [2, 4) clipped to [2, 3): torchvision clips at H - 1
    assert output[0, 0, 0, 0].item() == pytest.approx((0 + 1 + 4 + 5) / 4)  # channel 0, rows/cols 0-1
    assert output[0, 0, 1, 1].item() == pytest.approx(300 + 10.0)  # channel 3, pixel (2, 2) alone
    assert output[0, 0, 0, 1].item() == pytest.approx(100 + (2 + 6) / 2)  # channel 1, rows 0-1, column 2
    assert mapping[0, 0].tolist() == [[0, 1], [2, 3]]


# -- deform_conv2d -------------------------------------------------------------------------------------------------


def deform(x, weight, offset, mask=None, bias=None, stride=1, padding=0, dilation=1):
    return torchvision.ops.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)


@pytest.mark.parametrize(("stride", "padding", "dilation", "groups"), [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 2)])
def test_deform_conv2d_without_offsets_is_conv2d(stride, padding, dilation, groups):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 8, generator=generator)
    weight, bias = torch.randn(6, 4 // groups, 3, 3, generator=generator), torch.randn(6, generator=generator)
    conv = torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
    offset = torch.zeros(2, 18, *conv.shape[2:])
    mask = torch.ones(2, 9, *conv.shape[2:])
    torch.testing.assert_close(deform(x, weight, offset, mask, bias, stride, padding, dilation), conv)
    torch.testing.assert_close(deform(x, weight, offset, None, bias, stride, padding, dilation), conv)


def test_deform_conv2d_samples_at_its_offsets():
    x = grid(5, 5)
    one = torch.ones(1, 1, 1, 1)
    # a 1 x 1 kernel at output (1, 1) of a 3 x 3 output (padding 0): offsets move the sample
    offset = torch.zeros(1, 2, 5, 5)
    offset[0, :, 1, 1] = torch.tensor([1.0, 2.0])  # (dy, dx): pixel (2, 3)
    offset[0, :, 2, 2] = torch.tensor([0.5, 0.0])  # half way between rows 2 and 3: (12 + 17) / 2
    offset[0, :, 0, 0] = torch.tensor([-1.5, 0.0])  # row -1.5: off the map, 0
    offset[0, :, 4, 4] = torch.tensor([0.5, 0.5])  # corners off the map count 0: 24 / 4
    out = deform(x, one, offset)
    assert out[0, 0, 1, 1].item() == 13.0
    assert out[0, 0, 2, 2].item() == pytest.approx(14.5)
    assert out[0, 0, 0, 0].item() == 0.0
    assert out[0, 0, 4, 4].item() == pytest.approx(6.0)
    mask = torch.full((1, 1, 5, 5), 0.5)
    assert deform(x, one, offset, mask)[0, 0, 1, 1].item() == 6.5
