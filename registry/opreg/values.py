"""Complex values, as they cross from torch to ONNX (docs/design.md, "An export").

ONNX Runtime has no complex kernels worth the name, so a complex tensor travels
as a real tensor with a trailing dimension of 2 (real, imaginary), as ONNX's
DFT and STFT take and return it: a ``complex64`` tensor of shape ``[3, 4]`` is
a ``FLOAT`` tensor of shape ``[3, 4, 2]`` in the model, ``complex128`` is
``DOUBLE`` and ``complex32`` is ``FLOAT16``. The model's inputs and outputs
are such pairs too; ``OnnxProgram.run``/``verify`` convert at the boundary.

A pair looks like any real tensor whose last dim is 2, so two things say which
values are complex:

- for resolution, :func:`has_complex` on the FX node: an impl registered with
  ``complex=True`` serves exactly the nodes with a complex input or output
  (and impls registered without it never see one);
- inside an impl, :func:`is_complex` on each ``onnx_ir.Value`` it receives
  (``mul(z, x)`` may multiply a complex ``z`` by a real ``x``).

Nothing here imports torch: it reads the FX node's fake-tensor metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

COMPLEX_KEY = "opreg.complex"
"""Set to ``True`` in ``onnx_ir.Value.meta`` by the exporter on values that carry complex tensors."""


def is_complex(value: Any) -> bool:
    """Whether ``value`` (an ``onnx_ir.Value`` an impl receives) carries a complex tensor as a
    real one with a trailing dimension of 2; ``False`` for anything else (numbers, lists, ``None``)."""
    meta = getattr(value, "meta", None)
    return bool(meta is not None and meta.get(COMPLEX_KEY, False))


def has_complex(node: Any) -> bool:
    """Whether the FX ``node`` has a complex tensor among its inputs or outputs (from their
    ``meta["val"]``), or a complex Python number among its arguments (anything but an FX node: no)."""
    if not hasattr(node, "meta") or not hasattr(node, "all_input_nodes"):
        return False
    values = [node.meta.get("val")]
    values += [getattr(arg, "meta", {}).get("val") for arg in node.all_input_nodes]
    arguments = [*node.args, *node.kwargs.values()]
    return any(_complex(v) for v in _leaves(values)) or any(isinstance(a, complex) for a in _leaves(arguments))


def _complex(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return bool(getattr(dtype, "is_complex", False)) or isinstance(value, complex)


def _leaves(values: Iterable[Any]) -> Iterable[Any]:
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _leaves(value)
        else:
            yield value
