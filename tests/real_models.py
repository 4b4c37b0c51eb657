"""Real model architectures for the end-to-end tests and the export benchmark.

Every factory returns a :class:`Case`: a model in ``eval()`` mode with random
weights (seeded), example inputs, and the dynamic dims it has. The transformers
models are built from tiny configs written here: nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests.models import TutorialCNN

VOCAB = 96
BATCH = torch.export.Dim("batch", max=64)
SEQ = torch.export.Dim("seq", max=128)


@dataclasses.dataclass
class Case:
    """A model to export and the inputs to export it with.

    Fields:
        name: short id (test ids, benchmark rows).
        model: the module, in ``eval()`` mode.
        args / kwargs: example inputs, as ``model(*args, **kwargs)`` takes them.
        dynamic_shapes: for ``torch.export``; ``None`` when every dim is static.
        other_inputs: ``(args, kwargs)`` of another shape the dynamic dims allow,
            to prove the exported model is not specialised to the example.
    """

    name: str
    model: nn.Module
    args: tuple
    kwargs: dict[str, Any]
    dynamic_shapes: Any = None
    other_inputs: tuple[tuple, dict[str, Any]] | None = None


# -- CNNs written here (no torchvision: its registry build needs CUDA here) ------------------


class BasicBlock(nn.Module):
    """ResNet's two-conv residual block, with a 1x1 projection when the shape changes."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision's ResNet-18 layout (layers [2, 2, 2, 2]) with ``width`` base channels."""

    def __init__(self, width: int = 8, num_classes: int = 10, layers: tuple[int, ...] = (2, 2, 2, 2)):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages = []
        inplanes = width
        for index, blocks in enumerate(layers):
            planes = width * 2**index
            stride = 1 if index == 0 else 2
            stage = [BasicBlock(inplanes, planes, stride)]
            stage += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class SqueezeExcite(nn.Module):
    """MobileNetV3's squeeze-and-excite: pool, reduce, ReLU, expand, hardsigmoid, scale."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.relu = nn.ReLU()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.scale = nn.Hardsigmoid()

    def forward(self, x):
        return x * self.scale(self.fc2(self.relu(self.fc1(self.avgpool(x)))))


class InvertedResidual(nn.Module):
    """Expand (1x1), depthwise (kxk, groups=channels), optional SE, project (1x1);
    a residual connection when the shape is kept."""

    def __init__(self, cin: int, expanded: int, cout: int, kernel: int, stride: int, se: bool, act: type[nn.Module]):
        super().__init__()
        layers: list[nn.Module] = []
        if expanded != cin:
            layers += [nn.Conv2d(cin, expanded, 1, bias=False), nn.BatchNorm2d(expanded), act()]
        layers += [
            nn.Conv2d(expanded, expanded, kernel, stride, kernel // 2, groups=expanded, bias=False),
            nn.BatchNorm2d(expanded),
            act(),
        ]
        if se:
            layers.append(SqueezeExcite(expanded, max(8, expanded // 4)))
        layers += [nn.Conv2d(expanded, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = self.block(x)
        return x + out if self.residual else out


class MobileNet(nn.Module):
    """A MobileNetV3-small-shaped network: hardswish stem, inverted residuals with
    ReLU6 or hardswish, squeeze-excite with hardsigmoid, pooled classifier head."""

    # kernel, expanded, out, squeeze-excite, activation, stride
    SETTINGS = (
        (3, 16, 16, True, nn.ReLU6, 2),
        (3, 48, 24, False, nn.ReLU6, 2),
        (3, 64, 24, False, nn.ReLU6, 1),
        (5, 96, 40, True, nn.Hardswish, 2),
        (5, 160, 40, True, nn.Hardswish, 1),
        (5, 160, 48, True, nn.Hardswish, 1),
    )

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish()]
        cin = 16
        for kernel, expanded, cout, se, act, stride in self.SETTINGS:
            layers.append(InvertedResidual(cin, expanded, cout, kernel, stride, se, act))
            cin = cout
        layers += [nn.Conv2d(cin, 6 * cin, 1, bias=False), nn.BatchNorm2d(6 * cin), nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(6 * cin, 64), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(64, num_classes)
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def _randomize_batch_norm(model: nn.Module) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so batch norm is tested."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.normal_(module.bias, std=0.1)
            module.running_mean.normal_(std=0.1)
            module.running_var.uniform_(0.5, 1.5)
    return model


# -- factories --------------------------------------------------------------------------------


def tutorial_cnn() -> Case:
    torch.manual_seed(0)
    return Case(
        "tutorial_cnn",
        TutorialCNN().eval(),
        (torch.randn(2, 1, 32, 32),),
        {},
        {"x": {0: BATCH}},
        ((torch.randn(5, 1, 32, 32),), {}),
    )


def resnet18() -> Case:
    torch.manual_seed(0)
    model = _randomize_batch_norm(ResNet18(width=8)).eval()
    return Case(
        "resnet18",
        model,
        (torch.randn(2, 3, 64, 64),),
        {},
        {"x": {0: BATCH}},
        ((torch.randn(3, 3, 64, 64),), {}),
    )


def mobilenet() -> Case:
    torch.manual_seed(0)
    model = _randomize_batch_norm(MobileNet()).eval()
    return Case(
        "mobilenet",
        model,
        (torch.randn(2, 3, 64, 64),),
        {},
        {"x": {0: BATCH}},
        ((torch.randn(3, 3, 64, 64),), {}),
    )


def _text_inputs(batch: int, seq: int) -> dict[str, torch.Tensor]:
    """Random token ids and an attention mask: the first row padded on the right, the
    second on the left (so causal models have query rows with every key masked)."""
    ids = torch.randint(1, VOCAB, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, -2:] = 0
    if batch > 1:
        mask[1, :2] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _text_case(name: str, model: nn.Module) -> Case:
    dims = {"input_ids": {0: BATCH, 1: SEQ}, "attention_mask": {0: BATCH, 1: SEQ}}
    example = _text_inputs(2, 8)
    other = _text_inputs(3, 5)
    return Case(name, model.eval(), (), example, dims, ((), other))


def bert() -> Case:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        type_vocab_size=2,
        use_cache=False,
    )
    return _text_case("bert", BertModel(config))


def distilbert() -> Case:
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128
    )
    return _text_case("distilbert", DistilBertModel(config))


def gpt2() -> Case:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=128,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        use_cache=False,
    )
    return _text_case("gpt2", GPT2LMHeadModel(config))


def llama() -> Case:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_cache=False,
    )
    return _text_case("llama", LlamaForCausalLM(config))


def vit() -> Case:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=10,
    )
    model = ViTForImageClassification(config).eval()
    return Case(
        "vit",
        model,
        (),
        {"pixel_values": torch.randn(2, 3, 32, 32)},
        {"pixel_values": {0: BATCH}},
        ((), {"pixel_values": torch.randn(3, 3, 32, 32)}),
    )


# -- data-dependent control flow -------------------------------------------------------------


class GreedyDecoder(nn.Module):
    """A recurrent decoder that emits tokens greedily until it emits EOS or fills its buffer:
    the trip count depends on the data (``while_loop``), and each step branches on whether the
    token is EOS (``torch.cond``), so a finished row stops changing."""

    def __init__(self, vocab: int = 24, hidden: int = 16, max_len: int = 12, eos: int = 0):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.Linear(2 * hidden, hidden)
        self.head = nn.Linear(hidden, vocab)
        self.max_len, self.eos = max_len, eos

    def forward(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from torch._higher_order_ops.while_loop import while_loop

        hidden = torch.tanh(context.mean(1))  # [batch, hidden]
        tokens = torch.full((context.shape[0], self.max_len), -1, dtype=torch.int64)
        step = torch.zeros((), dtype=torch.int64)
        done = torch.zeros((), dtype=torch.bool)

        def keep_going(step, hidden, tokens, done):
            return (step < self.max_len) & ~done

        def decode(step, hidden, tokens, done):
            token = self.head(hidden).argmax(-1)  # [batch]
            tokens = tokens.index_put((torch.arange(tokens.shape[0]), step.expand(tokens.shape[0])), token)

            def advance(hidden, token):
                return torch.tanh(self.cell(torch.cat([hidden, self.embed(token)], -1)))

            def hold(hidden, token):
                return hidden.clone()

            finished = (token == self.eos).all()
            hidden = torch.cond(finished, hold, advance, (hidden, token))
            return step + 1, hidden, tokens, finished

        steps, _, tokens, _ = while_loop(keep_going, decode, (step, hidden, tokens, done))
        return tokens, steps


def greedy_decoder() -> Case:
    torch.manual_seed(0)
    model = GreedyDecoder().eval()
    with torch.no_grad():  # make EOS likely after a few steps, so the trip count varies with the input
        model.head.bias[0] = 0.8
    return Case(
        "greedy_decoder",
        model,
        (torch.randn(2, 5, 16),),
        {},
        {"context": {0: BATCH, 1: SEQ}},
        ((torch.randn(3, 7, 16) * 3,), {}),
    )


class EarlyExit(nn.Module):
    """A classifier that answers from a cheap head when it is confident, and runs a deeper
    stack otherwise (``torch.cond`` on a value computed from the input)."""

    def __init__(self, width: int = 32, classes: int = 10, threshold: float = 0.5):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.quick = nn.Linear(width, classes)
        self.deep = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(), nn.Linear(width, classes))
        self.threshold = threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.stem(x)
        quick = self.quick(features)
        confident = quick.softmax(-1).amax(-1).min() > self.threshold

        def exit_early(features, quick):
            return quick.clone()

        def go_deeper(features, quick):
            return self.deep(features) + quick

        return torch.cond(confident, exit_early, go_deeper, (features, quick))


def early_exit() -> Case:
    torch.manual_seed(0)
    model = EarlyExit().eval()
    # the example is confident (a large logit), the other input is not: both branches are verified
    confident = torch.randn(2, 32) * 40
    return Case(
        "early_exit",
        model,
        (confident,),
        {},
        {"x": {0: BATCH}},
        ((torch.randn(3, 32) * 0.01,), {}),
    )


FACTORIES: dict[str, Callable[[], Case]] = {
    "tutorial_cnn": tutorial_cnn,
    "resnet18": resnet18,
    "mobilenet": mobilenet,
    "bert": bert,
    "distilbert": distilbert,
    "gpt2": gpt2,
    "vit": vit,
    "llama": llama,
    "greedy_decoder": greedy_decoder,
    "early_exit": early_exit,
}
"""Every real model, by name."""
