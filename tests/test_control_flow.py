"""Control flow: torch's higher-order ops become ONNX If, Loop and Scan whose subgraphs are
translated by the same registry and target; context-only HOPs are translated through their
bodies. Every model is verified against eager PyTorch for inputs that take every branch."""

from __future__ import annotations

import collections
import inspect
import math

import onnx
import pytest
import torch
from onnxscript.onnx_opset import opset18 as op18
from torch._higher_order_ops.map import map as torch_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import opreg
from opreg.exporter import _plan
from tests.optest import OPSETS

ATOL = 1e-5


def export(module, args, opset, **options):
    return opreg.export(module.eval(), args, target=opset, **options)


def subgraphs(proto_graph: onnx.GraphProto, op_type: str) -> list[onnx.GraphProto]:
    """The graph attributes of every ``op_type`` node of ``proto_graph``, in order."""
    return [
        onnx.helper.get_attribute_value(a)
        for n in proto_graph.node
        if n.op_type == op_type
        for a in n.attribute
        if a.type == onnx.AttributeProto.GRAPH
    ]


def ops(graph: onnx.GraphProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in graph.node)


class Branches(torch.nn.Module):
    """cond whose true branch reads a weight (an enclosing-scope initializer) and both operands."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, y):
        def true_fn(x, y):
            return self.lin(x).sin() + y

        def false_fn(x, y):
            return x.cos() - y

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y))


@pytest.mark.parametrize("opset", OPSETS)
def test_cond_becomes_if_and_both_branches_match_eager(opset):
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    batch = torch.export.Dim("batch")
    program = export(Branches(), (x, y), opset, dynamic_shapes={"x": {0: batch}, "y": {0: batch}})
    proto = program.model_proto
    then_branch, else_branch = subgraphs(proto.graph, "If")
    assert ops(then_branch)["Gemm"] == 1 and ops(then_branch)["Sin"] == 1 and ops(else_branch)["Cos"] == 1
    assert not then_branch.input and not else_branch.input  # operands are read from the enclosing graph
    assert [d.dim_param for d in proto.graph.output[0].type.tensor_type.shape.dim][:1] == ["batch"]
    for sign in (1, -1):  # each branch, at another batch size (dynamic shapes survive)
        x = sign * torch.rand(4, 3) + sign
        assert program.verify(x, torch.randn(4, 3), atol=ATOL).max_abs <= ATOL


class Nested(torch.nn.Module):
    def forward(self, x):
        def inner_true(x):
            return x * 2

        def inner_false(x):
            return x * 3

        def outer_true(x):
            return torch.cond(x.mean() > 0.5, inner_true, inner_false, (x,))

        def outer_false(x):
            return x - 1

        return torch.cond(x.sum() > 0, outer_true, outer_false, (x,))


@pytest.mark.parametrize("opset", OPSETS)
def test_nested_cond(opset):
    program = export(Nested(), (torch.rand(3),), opset)
    (outer_then, _) = subgraphs(program.model_proto.graph, "If")
    assert ops(outer_then)["If"] == 1
    for x in (torch.ones(3), torch.full((3,), 0.1), -torch.ones(3)):  # all three paths
        program.verify(x, atol=ATOL)


class CondInLoop(torch.nn.Module):
    """A data-dependent trip count (``n``) with a branch in the body."""

    def forward(self, x, n):
        def keep_going(i, x):
            return i < n

        def body(i, x):
            def grow(x):
                return x * 2

            def shrink(x):
                return x - 1

            return i + 1, torch.cond(x.sum() < 10, grow, shrink, (x,))

        return while_loop(keep_going, body, (torch.zeros((), dtype=torch.int64), x))


@pytest.mark.parametrize("opset", OPSETS)
def test_while_loop_with_a_data_dependent_trip_count_and_a_cond_inside(opset):
    program = export(CondInLoop(), (torch.ones(3), torch.tensor(4)), opset)
    (body,) = subgraphs(program.model_proto.graph, "Loop")
    assert ops(body)["If"] == 1
    for n in (0, 1, 3, 9):  # zero trips, and enough to take both branches
        program.verify(torch.ones(3), torch.tensor(n), atol=ATOL)


class Scanned(torch.nn.Module):
    """scan with two carries, two stacked outputs, and a closure over a weight."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def forward(self, a, b, xs):
        def combine(carry, x):
            a, b = carry
            new_a = a + x * self.scale
            new_b = b * 0.5 + x
            return (new_a, new_b), (new_a * 2, new_b.sum(0, keepdim=True))

        return scan(combine, (a, b), xs)


@pytest.mark.parametrize("opset", OPSETS)
def test_scan_with_several_carries_and_stacked_outputs(opset):
    args = (torch.randn(3), torch.randn(3), torch.randn(5, 3))
    program = export(Scanned(), args, opset)
    (scan_node,) = [n for n in program.model_proto.graph.node if n.op_type == "Scan"]
    assert len(scan_node.input) == 3 and len(scan_node.output) == 4
    program.verify(*args, atol=ATOL)
    program.verify(torch.randn(3), torch.randn(3), torch.randn(5, 3) * 10, atol=1e-4)


class Mapped(torch.nn.Module):
    def forward(self, xs, y):
        return torch_map(lambda x, y: (x + y).relu(), xs, y)


@pytest.mark.parametrize("opset", OPSETS)
def test_map_becomes_a_scan_without_state(opset):
    program = export(Mapped(), (torch.randn(4, 3), torch.randn(3)), opset)
    (scan_node,) = [n for n in program.model_proto.graph.node if n.op_type == "Scan"]
    assert len(scan_node.input) == 1 and len(scan_node.output) == 1
    program.verify(torch.randn(4, 3), torch.randn(3), atol=ATOL)


class ContextOnly(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            y = x * 2
        with torch.autocast("cpu", enabled=False):
            z = y.sin()
        return z + 1


@pytest.mark.parametrize("opset", OPSETS)
def test_context_only_hops_are_translated_through_their_bodies_without_decomposition(opset):
    module = ContextOnly().eval()
    captured = torch.export.export(module, (torch.randn(3),), strict=False)
    hops = {n.target.__name__ for n in captured.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)}
    assert hops == {"wrap_with_set_grad_enabled", "wrap_with_autocast"}
    registry = opreg.default_registry()
    program, _ = _plan.prepare(captured, registry, registry.target(opset))
    assert program is captured  # the fast path: translated as captured, not decomposed
    program = export(module, (torch.randn(3),), opset)
    assert [n.op_type for n in program.model_proto.graph.node] == ["Mul", "Sin", "Add"]
    program.verify(torch.randn(3), atol=ATOL)


def cos_by_sin(self):
    """cos(Tensor self) -> Tensor: Sin(x + pi/2), so the test can see it was used."""
    return op18.Sin(op18.Add(self, op18.CastLike(math.pi / 2, self)))


@pytest.mark.parametrize("opset", OPSETS)
def test_an_impl_registered_on_the_registry_applies_inside_a_branch(opset):
    registry = opreg.default_registry().copy()
    registry.register("aten::cos", cos_by_sin, opset=18)
    program = opreg.export(Branches().eval(), (torch.randn(3), torch.randn(3)), target=opset, registry=registry)
    _, else_branch = subgraphs(program.model_proto.graph, "If")
    assert ops(else_branch)["Cos"] == 0 and ops(else_branch)["Sin"] == 1
    impls = {p.value for n in else_branch.node for p in n.metadata_props if p.key == "opreg.impl"}
    assert "cos_by_sin" in impls
    program.verify(-torch.ones(3), torch.randn(3), atol=ATOL)


@pytest.mark.parametrize("opset", OPSETS)
def test_nodes_inside_subgraphs_record_where_they_came_from(opset):
    program = export(Branches(), (torch.randn(2, 3), torch.randn(2, 3)), opset)
    then_branch, _ = subgraphs(program.model_proto.graph, "If")
    meta = {n.op_type: {p.key: p.value for p in n.metadata_props} for n in then_branch.node}
    assert meta["Gemm"]["opreg.torch_op"].startswith("aten::") and meta["Gemm"]["opreg.pack"] == "core"
    assert meta["Sin"]["opreg.torch_op"] == "aten::sin.default"
    # torch records the branches' nodes at the torch.cond call
    lines, first = inspect.getsourcelines(Branches.forward)
    call = first + next(i for i, line in enumerate(lines) if "torch.cond(" in line)
    assert meta["Sin"]["opreg.source"] == f"{__file__}:{call}"
    (if_node,) = [n for n in program.model_proto.graph.node if n.op_type == "If"]
    assert {p.key: p.value for p in if_node.metadata_props}["opreg.torch_op"] == "cond"


class MissingInBranch(torch.nn.Module):
    def forward(self, x):
        def true_fn(x):
            return torch.special.zeta(x, 2.0)

        def false_fn(x):
            return x.clone()

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


def test_a_missing_op_in_a_branch_is_listed_with_its_location():
    with pytest.raises(opreg.UnsupportedOpsError) as caught:
        export(MissingInBranch(), (torch.rand(3),), 18)
    (missing,) = caught.value.missing
    assert missing.op.startswith("aten::special_zeta")
    assert "in the true branch of cond" in missing.locations[0] and f"{__file__}:" in missing.locations[0]
    assert opreg.exporter.plan_export(MissingInBranch().eval(), (torch.rand(3),), target=18) == [missing]


def _block(x, w):
    return (torch.relu(x @ w) + 1,)


class Reused(torch.nn.Module):
    """One subgraph invoked twice (what torch's nested compile regions leave as invoke_subgraph)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))
        self.block = torch.fx.symbolic_trace(_block)

    def forward(self, x):
        from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

        (y,) = invoke_subgraph(self.block, "block", x, self.w)
        (z,) = invoke_subgraph(self.block, "block", y, self.w)
        return z


@pytest.mark.parametrize("opset", OPSETS)
def test_invoke_subgraph_is_translated_through_its_body_at_each_call(opset):
    captured = torch.export.export(Reused().eval(), (torch.randn(2, 4),), strict=False)
    hops = [n.target for n in captured.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)]
    assert hops == [torch.ops.higher_order.invoke_subgraph] * 2
    program = export(Reused(), (torch.randn(2, 4),), opset)
    assert ops(program.model_proto.graph) == collections.Counter({"MatMul": 2, "Relu": 2, "Add": 2})
    program.verify(torch.randn(2, 4), atol=ATOL)
