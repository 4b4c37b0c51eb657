"""The models and the decoding the MatMulNBits tests share (test_quantize.py, test_int4_algos.py)."""

from __future__ import annotations

import numpy as np
import torch


class MLP(torch.nn.Module):
    def __init__(self, tied: bool = False, vocab: int = 50) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 64)
        self.up, self.down = torch.nn.Linear(64, 96), torch.nn.Linear(96, 64, bias=False)
        self.head = torch.nn.Linear(64, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.down(torch.relu(self.up(self.embed(ids)))))


def nodes(program, op_type: str):
    return [n for n in program.model.graph if n.op_type == op_type]


def dequantized(program) -> dict[str, np.ndarray]:
    """Each MatMulNBits' weight as (K, N) floats, decoded from its packed bytes, scales and zero points."""
    weights = {}
    for node in nodes(program, "MatMulNBits"):
        attributes = {a.name: a.value for a in node.attributes.values()}
        bits, k, n = attributes["bits"], attributes["K"], attributes["N"]
        packed, scales = (v.const_value.numpy() for v in node.inputs[1:3])
        values = packed if bits == 8 else np.stack([packed & 15, packed >> 4], -1).reshape(*packed.shape[:2], -1)
        blocks = values.shape[1]
        zero = np.full((n, blocks), 1 << (bits - 1))
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            raw = node.inputs[3].const_value.numpy()
            zero = (raw if bits == 8 else np.stack([raw & 15, raw >> 4], -1).reshape(n, -1))[:, :blocks]
        weight = (values.astype(np.float32) - zero[..., None]) * scales.reshape(n, blocks)[..., None]
        weights[node.name] = weight.reshape(n, -1)[:, :k].T.astype(np.float32)
    return weights
