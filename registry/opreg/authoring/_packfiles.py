"""The files of a new pack, written for the ops it translates (:mod:`opreg.authoring._opspec`).

:func:`render` gives ``{relative path: text}``: the distribution's metadata,
a README, a CI workflow, the package (hooks, impls, ONNX schemas and
reference kernels, the torch ops' library, samples) and a test. The author
edits ``impls.py`` alone: until an impl's body is written (it raises
``NotImplementedError``), ``opreg pack-check`` fails naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from opreg.authoring._opspec import OpSpec
from opreg.authoring._packcode import EDITED, impls, init, runtime, samples, torch_ops
from opreg.authoring._packtext import code, literal

WORKFLOW = ".github/workflows/opreg-pack.yml"
"""The CI workflow of the pack's repository."""


def _requirement(name: str) -> str:
    """``name``'s lower bound as opreg's own metadata requires it (``torch>=2.13``): a pack needs what
    opreg needs, and pins no upper bound (docs/writing-packs.md, "Publishing")."""
    import importlib.metadata

    from packaging.requirements import Requirement

    for line in importlib.metadata.requires("opreg") or ():
        requirement = Requirement(line)
        if requirement.name == name and requirement.marker is None:
            lows = [s.version for s in requirement.specifier if s.operator == ">="]
            return f"{name}>={lows[0]}" if lows else name
    return name


def _torch_releases() -> list[str]:
    """Each torch release (``2.13.*``) the installed opreg supports: the CI workflow's matrix."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    for line in importlib.metadata.requires("opreg") or ():
        requirement = Requirement(line)
        if requirement.name != "torch":
            continue
        lows = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        highs = [Version(s.version) for s in requirement.specifier if s.operator == "<"]
        if not lows:
            break
        low = lows[0]
        if not highs:
            return [f"{low.major}.{low.minor}.*"]
        high = highs[0]
        return [f"{low.major}.{minor}.*" for minor in range(low.minor, high.minor if high.major == low.major else 100)]
    return ["*"]


def pyproject(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    import importlib.metadata

    what = ", ".join(op.qualified for op in ops) or "its ops (none yet)"
    libraries = sorted({op.namespace for op in ops})
    dependencies = [
        f"opreg>={importlib.metadata.version('opreg')}",
        _requirement("onnxscript"),
        _requirement("torch"),
        "numpy",
    ]
    listed = ", ".join(json.dumps(d) for d in dependencies)
    library_note = ""
    if libraries:  # the library's distribution is the author's to name
        provides = "it" if len(libraries) == 1 else "them"
        library_note = f"# The ops come from {', '.join(libraries)}: add the distribution that provides {provides}.\n"
    return code(
        f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = {json.dumps(distribution)}
        version = "0.1.0"
        description = {json.dumps(f"opreg op pack: exports {what} to ONNX (domain {domain})")}
        readme = "README.md"
        requires-python = ">=3.11"
        # No upper bounds: opreg's own requirements say which torch and onnxscript releases it supports.
        @LIBRARY@dependencies = [{listed}]

        [project.optional-dependencies]
        test = ["pytest"]

        # What makes this an opreg pack: opreg finds it through this entry point.
        [project.entry-points."opreg.plugins"]
        {pack} = {json.dumps(package)}

        [tool.setuptools]
        packages = [{json.dumps(package)}]

        [tool.ruff]
        line-length = 120
        target-version = "py311"

        [tool.ruff.lint]
        select = ["E", "F", "W", "I", "B", "UP", "RUF"]
        ignore = ["E501"]  # an op's schema is one string, however long

        [tool.ruff.lint.isort]
        known-first-party = [{json.dumps(package)}]
    """,
        LIBRARY=library_note,
    )


def readme(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    rows = "".join(f"| {_cell(op.schema)} | `{domain}::{op.onnx_name}` | `{op.function}` |\n" for op in ops)
    table = (
        f"| torch op | its ONNX op | impl |\n|---|---|---|\n{rows}"
        if ops
        else "It has no ops yet: add impls to `impls.py` (see opreg's docs/writing-packs.md).\n"
    )
    return code(
        f"""
        # {distribution}

        An [opreg](https://pypi.org/project/opreg/) op pack: once it is installed, `opreg.export` and
        `opreg export` translate the ops below to ONNX. Its ONNX ops are in domain `{domain}`; its
        target profile `{pack}` is opreg's newest ai.onnx with that domain.

        @TABLE@
        ```
        pip install -e .             # or: pip install --no-build-isolation -e .
        opreg plugins                # {pack} is listed as loaded
        opreg pack-check {pack}{" " * max(1, 12 - len(pack))}# opreg's conformance kit
        python -m pytest tests       # each op exported and compared with eager PyTorch
        ```

        Layout: `{package}/{EDITED}` holds the impls, what each torch op becomes in ONNX (the
        file to edit); `runtime.py` the ONNX schemas of the pack's own ops, their reference kernels
        and their definitions in standard ONNX; `torch_ops.py` names the library that defines the
        torch ops; `samples.py` the inputs opreg's conformance kit drives each op with;
        `__init__.py` the hooks. `{WORKFLOW}` runs `opreg pack-check` and the tests on each
        torch release opreg supports.
    """,
        TABLE=table,
    )


def _cell(text: str) -> str:
    """``text`` as code in a Markdown table cell: a fence longer than any run of backticks in it, ``|``
    escaped, control characters as their escapes."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text).replace("|", "\\|")
    return f"{fence} {shown} {fence}"


def tests(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    if not ops:
        return code(f'''
            """{distribution}'s tests: opreg's conformance kit."""


            def test_the_conformance_kit_passes(opreg_pack_check):
                opreg_pack_check({literal(pack)}).assert_ok()
            ''')
    return code(f'''
        """{distribution}'s tests: each op exported at the pack's profile and compared with eager
        PyTorch, and opreg's conformance kit."""

        from __future__ import annotations

        import opreg
        import pytest
        import torch

        from {package} import samples, torch_ops


        class Call(torch.nn.Module):
            """A model that calls one op."""

            def __init__(self, op):
                super().__init__()
                self.op = op

            def forward(self, *args, **kwargs):
                return self.op(*args, **kwargs)


        def torch_op(op: str):
            namespace, _, name = op.partition("::")
            name, _, overload = name.partition(".")
            return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")


        @pytest.mark.parametrize("op", sorted(torch_ops.SCHEMAS))
        def test_an_export_matches_eager_pytorch(op):
            for sample in samples.samples()[op]:
                program = opreg.export(Call(torch_op(op)), sample.args, sample.kwargs, target={literal(pack)})
                program.verify(*sample.args, **sample.kwargs)


        def test_the_conformance_kit_passes(opreg_pack_check):
            opreg_pack_check({literal(pack)}).assert_ok()
        ''')


def workflow(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> str:
    releases = ", ".join(json.dumps(r) for r in _torch_releases())
    return code(f"""
        # {distribution}'s checks on each torch release opreg supports, at the lowest and the newest
        # releases of everything else that pyproject.toml allows (as opreg's tools/try_releases.py
        # checks opreg): opreg's conformance kit, then the pack's tests.
        name: opreg pack
        on:
          push:
          pull_request:
          schedule:
            - cron: "0 6 * * 1"  # weekly: a new release of a dependency is found here, not by a user
        jobs:
          check:
            runs-on: ubuntu-latest
            strategy:
              fail-fast: false
              matrix:
                torch: [{releases}]
                resolution: [lowest-direct, highest]
            steps:
              - uses: actions/checkout@v4
              - uses: actions/setup-python@v5
                with:
                  python-version: "3.11"
              - name: install
                run: |
                  python -m pip install uv
                  uv pip install --system --resolution ${{{{ matrix.resolution }}}} \\
                    --extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match \\
                    "torch==${{{{ matrix.torch }}}}" -e ".[test]"
              - name: opreg plugins
                run: opreg plugins
              - name: opreg pack-check
                run: opreg pack-check {pack}
              - name: tests
                run: python -m pytest tests
        """)


FILES = {
    "pyproject.toml": pyproject,
    "README.md": readme,
    WORKFLOW: workflow,
    "{package}/__init__.py": init,
    f"{{package}}/{EDITED}": impls,
    "{package}/runtime.py": runtime,
    "{package}/torch_ops.py": torch_ops,
    "{package}/samples.py": samples,
    "tests/test_{pack}.py": tests,
}
"""Each file of a new pack (its path, with the pack's names in braces) and the function that writes it."""
EMPTY = ("pyproject.toml", "README.md", WORKFLOW, "{package}/__init__.py", f"{{package}}/{EDITED}",
         "tests/test_{pack}.py")  # fmt: skip
"""The files of a pack with no ops yet (``--empty``)."""


def render(distribution: str, pack: str, package: str, ops: Sequence[OpSpec], domain: str) -> dict[str, str]:
    """A new pack's files, ``{relative path: text}``, for ``ops`` (none: the files of an empty pack)."""
    paths = FILES if ops else {path: FILES[path] for path in EMPTY}
    return {
        path.format(package=package, pack=pack): write(distribution, pack, package, ops, domain)
        for path, write in paths.items()
    }
