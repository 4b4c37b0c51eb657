"""Small models the export tests share (plain torch, random init)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TutorialCNN(nn.Module):
    """The image classifier of the PyTorch ONNX tutorial (seeds/000), verbatim."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), (2, 2))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


class Nested(nn.Module):
    """Keyword inputs (one a dict), nested dict/tuple outputs, a buffer."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)
        self.register_buffer("scale", torch.full((3,), 0.5))

    def forward(self, x, *, extra):
        h = self.proj(x) * self.scale
        return {"logits": F.gelu(h), "pair": (F.relu(h - extra["shift"]), extra["bias"] + 1.0)}


class Sequence(nn.Module):
    """Batch and sequence dims that change at run time."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        batch, seq, _ = x.shape
        h = F.gelu(self.embed(x))
        flat = h.reshape(batch * seq, 16)
        return self.head(flat).view(batch, seq, 4)


@torch.library.custom_op("opreg_tests::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    """A custom torch op no pack implements."""
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


class Uncovered(nn.Module):
    """Two ops the default target does not cover: a custom op no pack implements
    (once) and matrix inverse (twice; only opreg-ort-contrib covers it)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        a = torch.inverse(self.inner(x))
        b = mystery(x)
        return torch.inverse(a) + b


class AddModel(nn.Module):
    """The tutorial's first scenario: one aten::add.Tensor."""

    def forward(self, input_x, input_y):
        return torch.ops.aten.add(input_x, input_y)
