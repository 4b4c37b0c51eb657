"""Python calls on symbolic sizes that torch.export leaves in a graph: every ``torch.sym_*``
function torch.onnx translates (``sym_float``, ``sym_max``, ``sym_min``, ``sym_not``, ``sym_sum``,
``sym_ite``) and ``sym_int``, each exported with dynamic dims and run at sizes other than the
example's, against eager PyTorch."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import opreg

DYNAMIC = {0: Dim.DYNAMIC, 1: Dim.DYNAMIC}


class SymNot(torch.nn.Module):
    def forward(self, x):
        return torch.sym_not(x.shape[0] == x.shape[1])


class SymIte(torch.nn.Module):
    def forward(self, x):
        wide = torch.sym_not(x.shape[0] >= x.shape[1])
        return x * torch.sym_ite(wide, x.shape[1], x.shape[0])


class SymSum(torch.nn.Module):
    def forward(self, x, y):
        return torch.zeros(torch.sym_sum([x.shape[0], y.shape[0], x.shape[1]])) + 1


class SymSumOfOne(torch.nn.Module):
    def forward(self, x):
        return x.new_ones(torch.sym_sum([x.shape[0]]))


class SymMaxMinFloat(torch.nn.Module):
    def forward(self, x):
        return x * torch.sym_float(torch.sym_max(*x.shape)) + torch.sym_min(*x.shape) + torch.sym_int(x.shape[0] / 2)


class ItemOfBool(torch.nn.Module):
    def forward(self, x):
        return x.any().item()  # torch.export spells the bool's range check with torch.sym_ite(b, 1, 0)


CASES = [
    (SymNot(), ((2, 2),), (DYNAMIC,), [((2, 2),), ((2, 3),), ((4, 1),)], {"Not"}),
    (SymIte(), ((2, 3),), (DYNAMIC,), [((2, 3),), ((3, 2),), ((4, 4),)], {"Not", "Where"}),
    (SymSum(), ((3, 2), (4,)), (DYNAMIC, {0: Dim.DYNAMIC}), [((3, 2), (4,)), ((1, 5), (2,))], {"Add"}),
    (SymSumOfOne(), ((3,),), ({0: Dim.DYNAMIC},), [((3,),), ((7,),)], set()),
    (SymMaxMinFloat(), ((2, 3),), (DYNAMIC,), [((2, 3),), ((5, 4),), ((3, 3),)], {"Max", "Min"}),
]


@pytest.mark.parametrize(
    ("model", "example", "dynamic", "sizes", "ops"), CASES, ids=[type(c[0]).__name__ for c in CASES]
)
def test_sym_functions_export_and_match_eager_at_other_sizes(model, example, dynamic, sizes, ops):
    program = opreg.export(model, tuple(torch.rand(s) for s in example), dynamic_shapes=dynamic)
    assert ops <= {n.op_type for n in program.model.graph}, [n.op_type for n in program.model.graph]
    for shapes in sizes:
        inputs = tuple(torch.rand(s) for s in shapes)
        got, expected = program.run(*inputs), model(*inputs)
        if isinstance(expected, torch.Tensor):
            torch.testing.assert_close(got, expected)
        else:  # a SymBool the model returns comes back as a 0-d bool tensor
            assert got.dtype == torch.bool and got.dim() == 0 and bool(got) == expected, (shapes, got, expected)


def test_the_bool_of_item_exports_through_sym_ite():
    """``Tensor.item()`` of a bool: torch.export checks the value's range through ``torch.sym_ite``
    (OpInfo ``item`` at bool, formerly a known failure of tests/test_opdb.py)."""
    program = opreg.export(ItemOfBool(), (torch.tensor([False, True]),))
    for value in ([False, False], [True, False], [False, True]):
        x = torch.tensor(value)
        assert bool(program.run(x)) == ItemOfBool()(x)
