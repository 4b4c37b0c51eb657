"""The package of a new pack, written for the ops it translates (:mod:`opreg.authoring._opspec`): its hooks,
the impls to write (``impls.py``), its ONNX ops (schemas, reference kernels, definitions), the
library that defines the torch ops, and samples. :mod:`opreg.authoring._packfiles` writes the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

from opreg.authoring._opspec import ATTRIBUTES, OpSpec
from opreg.authoring._packtext import block, code, literal, wrap

EDITED = "impls.py"
"""The file of the package the author writes in."""
TENSOR_TYPES = (
    "float", "double", "float16", "bfloat16", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64", "bool",
)  # fmt: skip
"""The tensor types the pack's ONNX ops accept (the torch schema says nothing narrower)."""


def init(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    what = ", ".join(op.qualified for op in ops) or "its ops (none yet)"
    return code(f'''
        """opreg pack {distribution}: exports {what} to ONNX.

        Its ONNX ops are in domain ``{domain}``; its target profile ``{pack}`` is opreg's
        newest supported ai.onnx with that domain. Importing this module is cheap (no torch,
        no onnxruntime): each hook imports what it needs. The file to edit is ``{EDITED}``.
        """

        from __future__ import annotations

        import opreg

        OPREG_API_VERSION = 1

        DOMAIN = {literal(domain)}
        DOMAIN_VERSION = 1
        """The version of the pack's ONNX domain: bump it when one of its ops changes (opreg's
        docs/writing-packs.md, "Versioning a pack")."""


        @opreg.hookimpl
        def opreg_targets():
            return {{{literal(pack)}: {{"": opreg.newest_supported_opset(), DOMAIN: DOMAIN_VERSION}}}}


        @opreg.hookimpl
        def opreg_register_ops(registry: opreg.Registrar) -> None:
            from {package} import impls

            registry.register_module(impls)  # every @opreg.impl of the module
    ''') + (
        block(f"""
        @opreg.hookimpl
        def opreg_schemas():
            from {package} import runtime

            return runtime.schemas()


        @opreg.hookimpl
        def opreg_reference_kernels():
            from {package} import runtime

            return runtime.reference_kernels()


        @opreg.hookimpl
        def opreg_functions():
            from {package} import runtime

            return runtime.functions()


        @opreg.hookimpl
        def opreg_samples():
            from {package} import samples

            return samples.samples()
    """)
        if ops
        else ""
    )


def impls(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    example = ops[0] if ops else None
    if example is None:
        return code(f'''
            """What each torch op becomes in ONNX: the file of {distribution} to edit.

            Mark each impl with ``@opreg.impl``: opreg's docs/writing-packs.md shows how, e.g.::

                @opreg.impl("mylib::fused_swish")  # mylib::fused_swish(Tensor x, float beta) -> Tensor
                def mylib_fused_swish(x: Tensor, beta: float):
                    return op18.Mul(x, op18.Sigmoid(op18.Mul(x, op18.CastLike(beta, x))))

            ``opreg new-pack NAME --op SCHEMA`` writes such a stub, its samples and its schema for you.
            """
        ''')
    call = ", ".join(
        [a.python_name for a in example.tensors] + [f"{a.name}={a.python_name}" for a in example.attributes]
    )
    sequence = any(a.kind in ("ints", "floats") for op in ops for a in op.arguments)
    stubs = "".join(_stub(op) for op in ops)
    return (
        code(
            f'''
        """What each torch op becomes in ONNX: the file of {distribution} to edit.

        Write each impl's body with onnxscript ops (opreg's docs/writing-packs.md, "Writing impls"):

        - standard ONNX, which every runtime runs (``from onnxscript.onnx_opset import opset18 as op18``,
          then ``op18.Mul(...)``, ``op18.Sigmoid(...)``);
        - or the pack's own op, ``custom.{example.onnx_name}({call})``, for a runtime with a kernel for
          it. Its ONNX schema and reference kernel are in runtime.py (``verify`` runs the reference
          kernel where ONNX Runtime has no kernel). To run it where no kernel is, also define it here
          in standard ONNX as an ``@onnxscript.script(custom)`` function named ``{example.onnx_name}``:
          ``opreg export --embed-functions`` puts that definition in the model.

        Until a body is written, ``opreg pack-check {pack}`` fails naming it.
        """

        from __future__ import annotations
        @SEQUENCE@
        import onnxscript
        import opreg
        from opreg.ops import Tensor

        from {package} import DOMAIN, DOMAIN_VERSION

        custom = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)
        """The pack's ONNX domain: ``custom.{example.onnx_name}(...)`` emits its op."""
    ''',
            SEQUENCE="\nfrom collections.abc import Sequence\n" if sequence else "",
        )
        + stubs
    )


def _stub(op: OpSpec) -> str:
    message = literal(f"write the ONNX that {op.qualified} becomes: the body of {op.function}")
    return block(
        f"""
        @opreg.impl({literal(op.qualified)})
        @DEF@
            {literal(op.schema + ".")}
        @RAISE@
    """,
        DEF=wrap(0, f"def {op.function}(", op.parameters(), "):"),
        RAISE=wrap(4, "raise NotImplementedError(", [message], ")"),
    )


def runtime(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    """``runtime.py``: the ONNX ops' schemas, a reference kernel per op (running the torch op) and the
    ops' definitions in standard ONNX."""
    kernels = "".join(_kernel(op) for op in ops)
    return _runtime_schemas(package, ops, domain) + _runtime_torch(package) + kernels + _runtime_functions(package, ops)


def _runtime_schemas(package: str, ops: Sequence[OpSpec], domain: str) -> str:
    types = "".join(f'\n    "tensor({t})",' for t in TENSOR_TYPES) + "\n"
    listed = "".join(_schema(op) for op in ops)
    names = ", ".join(literal(op.onnx_name) for op in ops) + ("," if len(ops) == 1 else "")
    return code(
        f'''
        """The pack's own ONNX ops (domain ``{domain}``), beside the impls that emit them: their
        schemas, so ONNX's checker and shape inference know them; reference kernels, what
        ``verify`` runs where ONNX Runtime has no kernel for them; and their definitions in
        standard ONNX, what ``opreg export --embed-functions`` puts in a model.
        """

        from __future__ import annotations

        from typing import Any

        import numpy as np
        from onnx.defs import OpSchema
        from onnx.reference.op_run import OpRun

        from {package} import DOMAIN, DOMAIN_VERSION

        TENSOR_TYPES = [@TYPES@]
        OPS = ({names})
        """The pack's ONNX ops, one per torch op."""


        def schemas() -> list[OpSchema]:
            """Each op's ONNX schema: an input per Tensor argument, an attribute per other argument."""
            return [@SCHEMAS@
            ]


        def _schema(name: str, doc: str, inputs: list[Any], outputs: int, attributes: list[Any]) -> OpSchema:
            return OpSchema(
                name, DOMAIN, DOMAIN_VERSION, doc, inputs=inputs,
                outputs=[OpSchema.FormalParameter(f"output_{{i}}", f"R{{i}}") for i in range(outputs)],
                type_constraints=[(f"T{{i}}", TENSOR_TYPES, "") for i in range(len(inputs))]
                + [(f"R{{i}}", TENSOR_TYPES, "") for i in range(outputs)],
                attributes=attributes,
            )  # fmt: skip


        def _input(name: str, index: int, optional: bool = False) -> Any:
            option = OpSchema.FormalParameterOption.Optional if optional else OpSchema.FormalParameterOption.Single
            return OpSchema.FormalParameter(name, f"T{{index}}", param_option=option)


        def _attribute(name: str, kind: str, required: bool) -> Any:
            return OpSchema.Attribute(name, getattr(OpSchema.AttrType, kind), "", required=required)
    ''',
        TYPES=types,
        SCHEMAS=listed,
    )


def _runtime_torch(package: str) -> str:
    return block(f'''
        def _torch(op: str, *args: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
            """Run torch op ``op`` on a kernel's inputs (numpy arrays) and attributes: the reference
            kernels below define the pack's ONNX ops as the torch ops they stand for."""
            import torch

            from {package} import torch_ops

            torch_ops.define()
            namespace, _, name = op.partition("::")
            name, _, overload = name.partition(".")
            function = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")

            def value(v: Any) -> Any:
                if isinstance(v, np.ndarray):
                    return torch.as_tensor(np.array(v))
                return v.decode() if isinstance(v, bytes) else v

            result = function(*map(value, args), **{{k: value(v) for k, v in kwargs.items()}})
            return tuple(r.numpy() for r in (result if isinstance(result, tuple) else (result,)))
    ''')


def _runtime_functions(package: str, ops: Sequence[OpSpec]) -> str:
    kernel_names = ", ".join(op.onnx_name for op in ops)
    return block(f'''
        def reference_kernels() -> list[type[OpRun]]:
            return [{kernel_names}]


        def functions() -> list[Any]:
            """The pack's ONNX ops defined in standard ONNX: the ``@onnxscript.script(custom)`` functions
            of impls.py named like them (none until you write one)."""
            import onnxscript

            from {package} import impls

            found = [getattr(impls, name, None) for name in OPS]
            return [f for f in found if isinstance(f, onnxscript.OnnxFunction) and f.opset.domain == DOMAIN]
    ''')


def _schema(op: OpSpec) -> str:
    inputs = [
        f"_input({literal(a.name)}, {i}{', optional=True' if a.optional else ''})" for i, a in enumerate(op.tensors)
    ]
    attributes = [
        f"_attribute({literal(a.name)}, {literal(ATTRIBUTES[a.kind])}, required={a.required})" for a in op.attributes
    ]
    lines = [
        "        _schema(",
        f"            {literal(op.onnx_name)},",
        f"            {literal(op.schema)},",
        wrap(12, "inputs=[", inputs, "],"),
        f"            outputs={op.outputs},",
        wrap(12, "attributes=[", attributes, "],"),
        "        ),",
    ]
    return "\n" + "\n".join(lines)


def _kernel(op: OpSpec) -> str:
    parameters = ["self", *(a.python_name for a in op.tensors), *(f"{a.python_name}=None" for a in op.attributes)]
    positional, keywords = [], []
    for a in op.arguments:
        value = f"bool({a.python_name})" if a.kind == "bool" and not a.optional else a.python_name
        (keywords if a.keyword_only else positional).append(f"{a.name}={value}" if a.keyword_only else value)
    return block(
        f'''
        class {op.onnx_name}(OpRun):
            """{op.onnx_name}: {op.qualified} itself, run by torch. Rewrite ``_run`` with numpy to
            verify models without torch."""

            op_domain = DOMAIN

        @RUN@
        @RETURN@
    ''',
        RUN=wrap(4, "def _run(", parameters, "):"),
        RETURN=wrap(8, "return _torch(", [literal(op.qualified), *positional, *keywords], ")"),
    )


def torch_ops(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    libraries = "".join(f"    {literal(ns)}: {literal(ns)},\n" for ns in sorted({op.namespace for op in ops}))
    schemas = "".join(f"    {literal(op.qualified)}: {literal(op.signature)},\n" for op in ops)
    return (
        code(f'''
        """The torch ops {distribution} translates, and the libraries that define them.

        ``define()`` imports each op's library (``LIBRARIES``: by default the module named like the
        op's namespace), which defines the op with ``torch.library``, and checks that torch then
        knows every op of ``SCHEMAS``. opreg calls it for the samples and the reference kernels;
        a model that calls the ops has imported their library already. If a library's module is
        named otherwise (or the ops are defined in this package), change ``LIBRARIES``.
        """

        from __future__ import annotations

        import importlib

        LIBRARIES: dict[str, str] = {{
        ''')
        + libraries
        + "}\n"
        + code('''
        """Op namespace -> the module whose import defines its ops."""
        SCHEMAS: dict[str, str] = {
        ''')
        + schemas
        + "}\n"
        + code('''
        """Each op and its schema, as the library defines it."""


        def define() -> None:
            """Import the libraries that define the ops; raise ``ImportError`` saying what is missing."""
            import torch

            for namespace, module in LIBRARIES.items():
                try:
                    importlib.import_module(module)
                except ImportError as e:
                    raise ImportError(
                        f"the ops of {namespace} are defined by {module!r}, which does not import ({e}): install "
                        f"the library, or set LIBRARIES[{namespace!r}] in {__name__} to the module that defines them"
                    ) from e
            for op in SCHEMAS:
                namespace, _, name = op.partition("::")
                if not hasattr(getattr(torch.ops, namespace), name.partition(".")[0]):
                    raise ImportError(f"importing {LIBRARIES[namespace]!r} does not define {op}: fix {__name__}")
        ''')
    )


def samples(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    entries = "".join(_samples_of(op) for op in ops)
    return code(
        f'''
        """Sample inputs of the pack's torch ops: what opreg's conformance kit (``opreg pack-check``)
        and the pack's tests drive each op with. A starting point: give each op the inputs it is
        meant for (shapes, dtypes, attribute values), and add the cases that once went wrong.
        """

        from __future__ import annotations

        from typing import Any


        def samples() -> dict[str, list[Any]]:
            import torch
            from opreg.testing import Sample

            from {package} import torch_ops

            torch_ops.define()  # the samples call the ops
            generator = torch.Generator().manual_seed(0)
            return {{@ENTRIES@
            }}
        ''',
        ENTRIES=entries,
    )


def _samples_of(op: OpSpec) -> str:
    def call(which: int, shape: tuple[int, ...]) -> str:
        values = []
        for position, a in enumerate(op.arguments):
            value = a.sample(which, position, shape)
            values.append(f"{a.name}={value}" if a.keyword_only else value)
        return wrap(12, "Sample.of(", values, "),")

    return f"\n        {literal(op.qualified)}: [\n{call(0, (2, 3))}\n{call(1, (3, 1, 4))}\n        ],"
