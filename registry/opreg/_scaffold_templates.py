"""The files ``opreg new-pack`` writes; ``{{name}}`` stands for a field of
:class:`opreg.scaffold.PackNames` (or ``title``).

The generated pack is the guide's running example (docs/writing-packs.md, "Writing
an op pack"): change both together. ``tests/test_scaffold.py`` installs it and
runs its tests.
"""

PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{{distribution}}"
version = "0.1.0"
description = "opreg op pack {{pack}}: {{namespace}}::scaled_add and aten::add on {{domain}}::ScaledAdd"
readme = "README.md"
requires-python = ">=3.11"
# No upper pins on torch: the pack runs with whatever torch opreg runs with.
dependencies = ["opreg>=0.1", "onnxscript>=0.7.2,<0.8", "torch>=2.13"]

[project.optional-dependencies]
test = ["pytest"]

# What makes this an opreg pack: opreg finds it through this entry point.
[project.entry-points."opreg.plugins"]
{{pack}} = "{{package}}"

[tool.setuptools]
packages = ["{{package}}"]
"""

README = """
# {{distribution}}

An [opreg](https://pypi.org/project/opreg/) op pack, made with
`opreg new-pack`. It exports

- the custom torch op `{{namespace}}::scaled_add(x, y, alpha)` (`x + alpha * y`)
  to `{{domain}}::ScaledAdd`, and
- `aten::add.Tensor` on float tensors of one dtype to the same op, at targets
  that include `{{domain}}` (priority 1 and a dtype predicate, so it never ties
  with opreg's core impl).

`{{domain}}` runs three ways: the `onnx.reference` kernel
(`program.verify` uses it), the ONNX function definition
(`opreg.export(..., embed_functions=True)` runs in any ONNX runtime), or a
native kernel library registered in `opreg_configure_session`.

```
pip install -e .             # or: pip install --no-build-isolation -e .
opreg plugins                # {{pack}} is listed as loaded
python -m pytest tests       # export + compare with eager PyTorch, and opreg's conformance kit
```

Target profile `{{pack}}`: opreg's default ai.onnx opset and `{{domain}}: 1`.

```python
import torch
import opreg
from {{package}} import scaled_add


class Model(torch.nn.Module):
    def forward(self, x, y):
        return scaled_add(x, y, 0.5)


x, y = torch.randn(2, 3), torch.randn(2, 3)
program = opreg.export(Model(), (x, y), target="{{pack}}")
program.verify(x, y)
```

Layout: `torch_ops.py` defines the torch op, `impls.py` the ONNX impls,
`runtime.py` the schema, reference kernel and function definition,
`__init__.py` the hooks. When an op's ONNX schema changes, bump the domain
version and keep the old impl registered for the old version (see opreg's
docs/writing-packs.md, "Versioning a pack").
"""

INIT = '''
"""opreg op pack {{pack}}: ``{{namespace}}::scaled_add`` and ``aten::add`` on ``{{domain}}``.

Importing this module is cheap: it imports neither torch nor onnxscript. The
hooks import the rest when opreg builds a registry; the torch op is defined
then, or on first use of ``{{package}}.scaled_add``.
"""

from __future__ import annotations

from typing import Any

import opreg

OPREG_API_VERSION = 1  # the plugin API this pack is written for
OPREG_REQUIRES_TORCH = ">=2.6"  # torch versions it supports (PEP 440)

DOMAIN = "{{domain}}"
DOMAIN_VERSION = 1
"""The version of {{domain}} this pack's ops are at; bump it when an op's schema changes."""
PROFILE = "{{pack}}"
"""The target profile this pack contributes: opreg's default ai.onnx opset plus {{domain}}."""


def __getattr__(name: str) -> Any:
    if name == "scaled_add":
        from {{package}}.torch_ops import scaled_add

        return scaled_add
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@opreg.hookimpl
def opreg_register_ops(registry: opreg.Registrar) -> None:
    from {{package}} import impls, torch_ops  # noqa: F401 - torch_ops defines the torch op

    # ai.onnx >= 18 (the embedded function of ScaledAdd needs CastLike), {{domain}} >= 1.
    registry.register("{{namespace}}::scaled_add", impls.scaled_add, opset=18, domains={DOMAIN: DOMAIN_VERSION})
    # Outranks opreg's core impl (priority 0) where the target has {{domain}}, on the
    # nodes its predicate accepts; everywhere else the core impl serves aten::add.
    registry.register(
        "aten::add.Tensor",
        impls.aten_add_scaled,
        opset=18,
        domains={DOMAIN: DOMAIN_VERSION},
        priority=1,
        predicate=impls.same_float_dtype,
    )


@opreg.hookimpl
def opreg_targets():
    from opreg.targets import DEFAULT_ONNX_OPSET

    return {PROFILE: {"": DEFAULT_ONNX_OPSET, DOMAIN: DOMAIN_VERSION}}


@opreg.hookimpl
def opreg_schemas():
    from {{package}} import runtime

    return runtime.schemas()


@opreg.hookimpl
def opreg_reference_kernels():
    from {{package}} import runtime

    return runtime.reference_kernels()


@opreg.hookimpl
def opreg_functions():
    from {{package}} import runtime

    return runtime.functions()


# A pack with a native kernel library would also implement:
#
# @opreg.hookimpl
# def opreg_configure_session(options):
#     options.register_custom_ops_library(str(path_to_the_shared_library))


@opreg.hookimpl
def opreg_samples():
    import torch
    from opreg.testing import Sample

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    return {
        "{{namespace}}::scaled_add": [
            Sample.of(x, y, 0.5),
            Sample.of(x, y, -2.0),
            Sample.of(torch.randn(4, 1, 3), torch.randn(4, 1, 3), 1.0),
        ]
    }
'''

TORCH_OPS = '''
"""The torch side: ``{{namespace}}::scaled_add(x, y, alpha) = x + alpha * y``.

``torch.export`` keeps a custom op as one node (it does not trace into it),
which opreg then maps to {{domain}}::ScaledAdd. The fake impl gives the
output's shape and dtype without computing it.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("{{namespace}}::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y


@scaled_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)
'''

IMPLS = '''
"""The ONNX side: impls that emit {{domain}}::ScaledAdd.

- ``scaled_add`` is an ``@onnxscript.script`` function: compiled once, it
  can be kept as a model-local function (``inline=False``); its attribute
  ``alpha`` keeps the schema's name and has a type annotation.
- ``aten_add_scaled`` is trace-only (a plain Python function calling
  onnxscript ops): it runs at export time on each node, so it may branch on
  attribute values and dtypes.

aten::add.Tensor is also covered by opreg's core pack. Registering it at the
same priority without a predicate would tie with core's impl (a conflict,
and a conformance-kit failure), so this one declares {{domain}} (it only
applies at targets that include the domain), priority 1 (it wins there) and
a dtype predicate (ScaledAdd has no type promotion; core's impl does it).
"""

from __future__ import annotations

import onnxscript
from onnxscript.onnx_opset import opset18 as op18

from {{package}} import DOMAIN, DOMAIN_VERSION

custom = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)


@onnxscript.script(custom)
def scaled_add(x, y, alpha: float):
    """{{namespace}}::scaled_add(Tensor x, Tensor y, float alpha) -> Tensor: {{domain}}::ScaledAdd."""
    return custom.ScaledAdd(x, y, alpha=alpha)


def aten_add_scaled(self, other, alpha: float = 1.0):
    """add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: {{domain}}::ScaledAdd (Add for alpha=1)."""
    if alpha == 1:
        return op18.Add(self, other)
    return custom.ScaledAdd(self, other, alpha=float(alpha))


FLOAT_DTYPES = ("torch.float16", "torch.float32", "torch.float64")


def same_float_dtype(node) -> bool:
    """The node's tensor inputs are floats of one dtype (ScaledAdd's type constraint)."""
    values = [arg.meta.get("val") for arg in node.args[:2] if hasattr(arg, "meta")]
    dtypes = {str(getattr(v, "dtype", None)) for v in values}
    return len(dtypes) == 1 and dtypes <= set(FLOAT_DTYPES)
'''

RUNTIME = '''
"""Running {{domain}} without a native kernel library: the schema (for the
checker and shape inference), a reference kernel for ``onnx.reference`` and
an ONNX function definition to embed in models.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.reference.op_run import OpRun

from {{package}} import DOMAIN, DOMAIN_VERSION

FLOAT_TYPES = ["tensor(float16)", "tensor(float)", "tensor(double)"]


def schemas() -> list:
    from onnx.defs import OpSchema

    def same_as_x(ctx) -> None:
        ctx.set_output_type(0, ctx.get_input_type(0))

    scaled_add = OpSchema(
        "ScaledAdd",
        DOMAIN,
        DOMAIN_VERSION,
        "Z = X + alpha * Y, with numpy broadcasting.",
        inputs=[OpSchema.FormalParameter("X", "T"), OpSchema.FormalParameter("Y", "T")],
        outputs=[OpSchema.FormalParameter("Z", "T")],
        type_constraints=[("T", FLOAT_TYPES, "float tensors")],
        attributes=[OpSchema.Attribute("alpha", helper.make_attribute("alpha", 1.0), "the scale of Y")],
    )
    scaled_add.set_type_and_shape_inference_function(same_as_x)
    return [scaled_add]


class ScaledAdd(OpRun):
    """{{domain}}::ScaledAdd for the reference evaluator: X + alpha * Y in X's dtype."""

    op_domain = DOMAIN

    def _run(self, x, y, alpha=None):
        alpha = 1.0 if alpha is None else alpha
        return ((x + np.asarray(alpha, dtype=x.dtype) * y).astype(x.dtype),)


def reference_kernels() -> list[type[OpRun]]:
    return [ScaledAdd]


def functions(onnx_opset: int = 18) -> list[onnx.FunctionProto]:
    """ScaledAdd over standard ops (opreg sets the ai.onnx version to the model's)."""
    alpha = onnx.AttributeProto(name="value_float", ref_attr_name="alpha", type=onnx.AttributeProto.FLOAT)
    constant = helper.make_node("Constant", [], ["alpha"])
    constant.attribute.append(alpha)
    function = helper.make_function(
        DOMAIN,
        "ScaledAdd",
        ["X", "Y"],
        ["Z"],
        [
            constant,
            helper.make_node("CastLike", ["alpha", "X"], ["alpha_x"]),
            helper.make_node("Mul", ["alpha_x", "Y"], ["scaled"]),
            helper.make_node("Add", ["X", "scaled"], ["Z"]),
        ],
        [helper.make_opsetid("", onnx_opset)],
        attributes=["alpha"],
    )
    return [function]
'''

TESTS = '''
"""{{distribution}}: the pack's ops exported at its target and compared with eager PyTorch."""

from __future__ import annotations

import onnx
import opreg
import pytest
import torch

from {{package}} import DOMAIN, PROFILE, scaled_add


class ScaledAddModel(torch.nn.Module):
    def forward(self, x, y):
        return scaled_add(x, y, 0.5)


class AddModel(torch.nn.Module):
    def forward(self, x, y):
        return torch.add(x, y, alpha=2)


@pytest.fixture
def inputs():
    return torch.randn(2, 3), torch.randn(2, 3)


def ops(program) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in program.model_proto.graph.node]


def test_custom_op_exports_to_the_domain_and_matches_eager(inputs):
    program = opreg.export(ScaledAddModel(), inputs, target=PROFILE)
    assert ops(program) == [(DOMAIN, "ScaledAdd")]
    onnx.checker.check_model(program.model_proto, full_check=True)
    result = program.verify(*inputs)
    assert result.runtime == "reference"  # onnxruntime has no kernel for the domain


def test_embedded_function_runs_in_onnxruntime(inputs):
    program = opreg.export(ScaledAddModel(), inputs, target=PROFILE, embed_functions=True)
    assert [(f.domain, f.name) for f in program.model_proto.functions] == [(DOMAIN, "ScaledAdd")]
    assert program.verify(*inputs).runtime == "onnxruntime"


def test_aten_add_uses_the_domain_only_where_the_target_has_it(inputs):
    at_pack_target = opreg.export(AddModel(), inputs, target=PROFILE)
    assert ops(at_pack_target) == [(DOMAIN, "ScaledAdd")]
    at_pack_target.verify(*inputs)
    assert DOMAIN not in {d for d, _ in ops(opreg.export(AddModel(), inputs, target="onnx"))}
    # integers fail the dtype predicate: opreg's core impl serves them
    ints = tuple(t.round().to(torch.int64) for t in inputs)
    assert DOMAIN not in {d for d, _ in ops(opreg.export(AddModel(), ints, target=PROFILE))}


def test_conformance(opreg_pack_check):
    opreg_pack_check("{{pack}}").assert_ok()
'''
