"""``GatherND`` of a 2-D tensor at an index grid of its own positions: the tensor with unit axes.

``mask[arange(B)[:, None, None, None], arange(S)[None, None, None, :]]``, how transformers' mask
functions read the 2-D attention mask (``padding_mask[batch_idx, kv_idx]``), becomes (aten::index's
impl) two Ranges broadcast against each other, stacked, and a ``GatherND`` of them: eleven nodes
run at every inference, for what is ``Unsqueeze(mask, [1, 2])``. The rules check that each index
is ``Range(0, n, 1)`` (or a constant arange) along one axis of the grid, of the size of the
tensor's own dim, the row index on an axis before the column index's, and the result the grid's
shape; or, where static sizes folded the grid into a constant, that the constant is that grid.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern


def _const(value: ir.Value | None) -> np.ndarray | None:
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def _is_arange(value: ir.Value) -> bool:
    """``value`` (1-D) counts 0, 1, 2, ...: a ``Range(0, n, 1)`` or a constant such."""
    array = _const(value)
    if array is not None:
        return array.ndim == 1 and np.array_equal(array, np.arange(array.size))
    node = value.producer()
    if node is None or node.op_type != "Range" or node.domain:
        return False
    start, delta = _const(node.inputs[0]), _const(node.inputs[2])
    return start is not None and delta is not None and start.size == delta.size == 1 and start == 0 and delta == 1


def _counting_axis(value: ir.Value) -> int | None:
    """The axis along which ``value`` counts 0, 1, ... (every other dim 1): the Unsqueezes of an
    arange, or a constant such; ``None`` if it is not one."""
    shape = value.shape
    if shape is None:
        return None
    wide = [axis for axis, dim in enumerate(shape) if dim != 1]
    if len(wide) != 1:
        return None
    source = value
    while (node := source.producer()) is not None and node.op_type == "Unsqueeze" and not node.domain:
        source = node.inputs[0]
    array = _const(value)
    counts = np.array_equal(array.reshape(-1), np.arange(array.size)) if array is not None else _is_arange(source)
    return wide[0] if counts else None


def _index_grid(op, data, rows, columns, shape_r, shape_c, axis_r, axis_c):
    index = op.Concat(
        op.Unsqueeze(op.Expand(rows, shape_r), axis_r), op.Unsqueeze(op.Expand(columns, shape_c), axis_c), axis=-1
    )
    return op.GatherND(data, index, _allow_other_attributes=True)


def _reads_itself(context, data, rows, columns, axis_r, axis_c, **_) -> bool:
    """``GatherND(data, grid)`` is ``data`` with unit axes: see the module docstring."""
    (node,) = [n for n in context.nodes if n.op_type == "GatherND"]
    if node.attributes.get_int("batch_dims", 0) != 0 or [_const(a) for a in (axis_r, axis_c)] != [[-1], [-1]]:
        return False
    out, dims = context.output_values[0].shape, data.shape
    if out is None or dims is None or len(dims) != 2 or rows.shape is None or columns.shape is None:
        return False
    r, c = _counting_axis(rows), _counting_axis(columns)
    if r is None or c is None or not r < c or len(rows.shape) != len(out) or len(columns.shape) != len(out):
        return False
    expected = [1] * len(out)
    expected[r], expected[c] = dims[0], dims[1]
    known = all(isinstance(d, int) or d.value is not None for d in expected)
    return known and list(out) == expected and rows.shape[r] == dims[0] and columns.shape[c] == dims[1]


def _unsqueezed(op, data, rank: int, kept: tuple[int, int]):
    axes = [axis for axis in range(rank) if axis not in kept]
    return op.Unsqueeze(data, op.Constant(value=ir.tensor(np.array(axes, dtype=np.int64))))


def _of_grid(op, data, rows, columns, **_):
    return _unsqueezed(op, data, len(rows.shape), (_counting_axis(rows), _counting_axis(columns)))


def _gather(op, data, index):
    return op.GatherND(data, index, _allow_other_attributes=True)


def _constant_grid_axes(data: ir.Value, index: ir.Value) -> tuple[int, int] | None:
    """The axes ``(r, c)``, ``r < c``, of the grid of ``data``'s own positions the constant
    ``index`` is (every other axis of size 1), or ``None``."""
    grid, dims = _const(index), data.shape
    if grid is None or dims is None or len(dims) != 2 or not all(isinstance(d, int) for d in dims):
        return None
    shape = list(grid.shape[:-1])
    if grid.ndim < 3 or grid.shape[-1] != 2:
        return None
    for r in range(len(shape)):
        for c in range(r + 1, len(shape)):
            along = [[dims[i] if axis == kept else 1 for axis in range(len(shape))] for i, kept in enumerate((r, c))]
            if shape != [max(a, b) for a, b in zip(*along, strict=True)]:
                continue
            rows, columns = (np.arange(dims[i]).reshape(along[i]) for i in (0, 1))
            if np.array_equal(grid, np.stack(np.broadcast_arrays(rows, columns), -1)):
                return r, c
    return None


def _reads_its_constant_grid(context, data, index, **_) -> bool:
    (node,) = context.nodes
    return node.attributes.get_int("batch_dims", 0) == 0 and _constant_grid_axes(data, index) is not None


def _of_constant_grid(op, data, index):
    return _unsqueezed(op, data, _const(index).ndim - 1, _constant_grid_axes(data, index))


GATHER_OF_OWN_POSITIONS = (
    pattern.RewriteRule(_index_grid, _of_grid, _reads_itself, name="GatherOfOwnPositions"),
    pattern.RewriteRule(_gather, _of_constant_grid, _reads_its_constant_grid, name="GatherOfOwnPositionsFolded"),
)
"""The rules, for the lean pass's exact rewrites."""
