"""Complex numbers and Fourier transforms: complex tensors travel as real tensors with a
trailing dimension of 2 (docs/design.md, "An export"), the model's complex inputs and outputs too, and
``run``/``verify`` convert at the boundary. Every check is at the lowest and the newest
supported opset, in ONNX Runtime against eager PyTorch: complex results within
``|onnx - eager| <= atol + rtol * |eager|`` (complex magnitudes, as torch measures them)."""

from __future__ import annotations

import pytest
import torch
from onnxscript.onnx_opset import opset18 as op18
from torch import nn

import opreg
from opreg.values import has_complex
from tests.optest import OPSETS, Lambda, check, onnx_ops

torch.manual_seed(0)

FFT_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
"""float32 DFTs of up to 64 points, summed in another order than pocketfft's (observed <= 2e-5)."""


def _complex(*shape, dtype=torch.complex64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


# -- the boundary -------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", OPSETS)
def test_complex_inputs_and_outputs_are_real_pairs_in_the_model(opset):
    z, x = _complex(3, 4), torch.randn(3, 4)
    program = check(lambda z, x: (z * x, (z * z).abs()), z, x, opset=opset)
    paired = program.model.graph.inputs[0]
    assert paired.dtype == opreg_dtype("FLOAT") and list(paired.shape) == [3, 4, 2]
    assert list(program.model.graph.outputs[0].shape) == [3, 4, 2]
    product, magnitude = program.run(z, x)
    assert product.dtype == torch.complex64 and magnitude.dtype == torch.float32
    (pair, real) = program.adapt_torch_inputs_to_onnx(z, x)
    assert torch.equal(pair, torch.view_as_real(z)) and real is x
    with pytest.raises(opreg.InvalidInputError, match="must be a complex tensor, got torch.float32"):
        program.run(torch.view_as_real(z), x)


def opreg_dtype(name: str):
    import onnx_ir as ir

    return getattr(ir.DataType, name)


@pytest.mark.parametrize("opset", OPSETS)
def test_complex128_and_complex_parameters(opset):
    class Rotate(nn.Module):
        def __init__(self):
            super().__init__()
            self.turn = nn.Parameter(torch.polar(torch.ones(4, dtype=torch.float64), torch.arange(4.0).double()))

        def forward(self, z):
            return z * self.turn

    program = check(Rotate(), _complex(2, 4, dtype=torch.complex128), opset=opset, rtol=1e-10, atol=1e-10)
    assert program.model.graph.initializers["turn"].shape == [4, 2]


# -- elementwise ops ----------------------------------------------------------------------------


def elementwise(z: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        z * w,
        z + w,
        z - 2 * w,
        torch.add(z, w, alpha=1 - 2j),
        z / w,
        z * x,
        x * 1.5j,
        z.abs(),
        z.angle(),
        z.real,
        z.imag,
        z.conj() * w,
        torch.conj_physical(z),
        torch.exp(z),
        torch.complex(x, x.flip(0)),
        torch.polar(x.abs(), x),
        torch.view_as_real(z),
        torch.view_as_complex(torch.stack([x, -x], -1)),
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_elementwise_ops_on_complex_values(opset):
    check(elementwise, _complex(3, 5), _complex(3, 5), torch.randn(3, 5), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_views_and_copies_of_complex_values(opset):
    def views(z):
        return (
            z.permute(2, 0, 1),
            z.transpose(0, -1).reshape(4, -1),
            z.unsqueeze(-1).expand(2, 3, 4, 2),
            z[1:, ::2, -1],
            z.flip(-1).squeeze(0),
            torch.cat([z, z * 1j], dim=-1),
            torch.stack([z, z.conj()], dim=-1),
            z.to(torch.complex128),
            z.clone().view(6, 4),
        )

    check(views, _complex(2, 3, 4), opset=opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_complex_inputs_with_a_dynamic_dim(opset):
    batch = torch.export.Dim("batch")
    model = Lambda(lambda z: torch.fft.ifft(z * z.shape[0]).reshape(z.shape[0], -1))
    program = opreg.export(model, (_complex(3, 8),), target=opset, dynamic_shapes=(({0: batch},),))
    for size in (2, 5):
        z = _complex(size, 8)
        program.verify(z, **FFT_TOLERANCE)


def test_a_complex_node_needs_an_impl_for_complex_values():
    """sin of a pair would be the sin of its parts, which is not sin(z): refused, with the reason."""
    with pytest.raises(opreg.UnsupportedOpsError, match=r"aten::sin\.default.*complex values.*complex=True"):
        opreg.export(Lambda(torch.sin), (_complex(3),))


def test_complex_impls_serve_complex_nodes_only():
    registry = opreg.default_registry()
    real, paired = (registry.resolve("aten::mul.Tensor", 18, node) for node in _mul_nodes())
    assert not real.complex and paired.complex and paired.name == "aten_mul_complex"
    assert registry.resolve("aten::mul.Tensor", 18) is real  # no node: complex impls are conditional
    assert not [c for c in registry.conflicts(18) if str(c.op).startswith("aten::mul")]
    why = str(registry.explain("aten::mul.Tensor", 18, _mul_nodes()[0]))
    assert "for complex values only; the node has none" in why


def _mul_nodes() -> list:
    nodes = []
    for dtype in (torch.float32, torch.complex64):
        program = torch.export.export(Lambda(torch.mul), (torch.ones(2, dtype=dtype), torch.ones(2, dtype=dtype)))
        (node,) = [n for n in program.graph.nodes if n.op == "call_function"]
        assert has_complex(node) == dtype.is_complex
        nodes.append(node)
    return nodes


def test_a_pack_can_serve_complex_values():
    """A user impl for complex nodes, registered with complex=True, takes the pair and knows it."""
    from opreg.values import is_complex

    def aten_sin_complex(self):
        assert is_complex(self)
        real = op18.Gather(self, op18.Constant(value_int=0), axis=-1)
        imaginary = op18.Gather(self, op18.Constant(value_int=1), axis=-1)
        pair = [op18.Mul(op18.Sin(real), op18.Cosh(imaginary)), op18.Mul(op18.Cos(real), op18.Sinh(imaginary))]
        return op18.Concat(*(op18.Unsqueeze(p, [-1]) for p in pair), axis=-1)

    registry = opreg.default_registry().copy()
    registry.register("aten::sin", aten_sin_complex, complex=True)
    z = _complex(6)
    opreg.export(Lambda(torch.sin), (z,), registry=registry, target=18).verify(z, rtol=1e-5, atol=1e-5)


# -- Fourier transforms ----------------------------------------------------------------------------


def ffts(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.fft.rfft(x),
        torch.fft.rfft(x, n=10, norm="ortho"),
        torch.fft.irfft(torch.fft.rfft(x)),
        torch.fft.irfft(z, n=9, norm="forward"),
        torch.fft.fft(x, dim=0),
        torch.fft.fft(z),
        torch.fft.ifft(z, norm="ortho"),
        torch.fft.fft2(z),
        torch.fft.rfftn(x),
        torch.fft.irfftn(torch.fft.rfftn(x), s=x.shape),
        torch.fft.hfft(z),
        torch.fft.ihfft(x),
        torch.fft.fftshift(torch.fft.fft(x)),
    )


@pytest.mark.parametrize("opset", OPSETS)
def test_fourier_transforms(opset):
    program = check(ffts, torch.randn(4, 12), _complex(4, 7), opset=opset, **FFT_TOLERANCE)
    assert "DFT" in onnx_ops(program)


@pytest.mark.parametrize(
    ("opset", "form"), [(18, "attribute"), (19, "attribute"), (20, "input"), (OPSETS[-1], "input")]
)
def test_dft_axis_is_an_attribute_until_opset_20(opset, form):
    program = opreg.export(Lambda(torch.fft.rfft), (torch.randn(3, 8),), target=opset)
    (dft,) = [n for n in program.model_proto.graph.node if n.op_type == "DFT"]
    has_axis_input = len(dft.input) == 3
    assert has_axis_input == (form == "input")
    assert ("axis" in [a.name for a in dft.attribute]) == (form == "attribute")


@pytest.mark.parametrize("opset", OPSETS)
def test_stft_and_istft(opset):
    window = torch.hann_window(16)

    def transforms(x):
        spectrum = torch.stft(x, 16, hop_length=4, window=window, return_complex=True)
        return (
            spectrum,
            torch.stft(x[0], 12, hop_length=5, win_length=8, center=False, normalized=True, return_complex=True),
            torch.stft(x, 16, window=window, pad_mode="constant", onesided=False, return_complex=True),
            torch.istft(spectrum, 16, hop_length=4, window=window),
            torch.istft(spectrum, 16, hop_length=4, window=window, length=70),
        )

    program = check(transforms, torch.randn(2, 64), opset=opset, **FFT_TOLERANCE)
    ops = onnx_ops(program)
    assert "STFT" in ops and "Col2Im" in ops


# -- a real model: an audio front end ------------------------------------------------------------------


class AudioFrontEnd(nn.Module):
    """Waveform -> log-magnitude spectrogram (stft) -> a small conv classifier."""

    def __init__(self, n_fft: int = 64, hop: int = 16, classes: int = 5):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.conv = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
        )
        self.head = nn.Linear(8, classes)

    def forward(self, waveform):
        spectrum = torch.stft(waveform, self.n_fft, self.hop, window=self.window, return_complex=True)
        features = torch.log1p(spectrum.abs()).unsqueeze(1)  # [batch, 1, bins, frames]
        pooled = self.conv(features).mean(dim=(2, 3))
        return self.head(pooled)


@pytest.mark.parametrize("opset", OPSETS)
def test_audio_front_end(opset):
    model = AudioFrontEnd().eval()
    batch = torch.export.Dim("batch")
    waveform = torch.randn(2, 400)
    program = opreg.export(model, (waveform,), target=opset, dynamic_shapes={"waveform": {0: batch}})
    for size in (2, 5):
        x = torch.randn(size, 400)
        assert program.verify(x, **FFT_TOLERANCE).runtime == "onnxruntime"
    assert "STFT" in onnx_ops(program)
