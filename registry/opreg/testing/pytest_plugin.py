"""The ``opreg`` pytest plugin: the conformance kit as a fixture for op packs' tests.

Registered under the ``pytest11`` entry point, so every pytest run in an
environment with opreg loads it: importing it imports neither torch, onnx nor
onnxruntime. Use it in a pack's tests::

    def test_conformance_kit(opreg_pack_check):
        opreg_pack_check("my_pack").assert_ok()
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from opreg.testing._kit_report import PackCheck


@pytest.fixture(scope="session")
def opreg_pack_check() -> Callable[[str], PackCheck]:
    """``opreg_pack_check(name) -> opreg.testing.PackCheck``: run the conformance
    kit on the installed pack ``name`` (pack, distribution or module name), once
    per session per name; call ``.assert_ok()`` on the result."""
    cache: dict[tuple[str, tuple[str, ...]], PackCheck] = {}

    def check(name: str) -> PackCheck:
        key = (name, tuple(sys.path))  # a test may put another pack of that name on sys.path
        if key not in cache:
            from opreg.testing._kit import check_pack

            cache[key] = check_pack(name)
        return cache[key]

    return check
