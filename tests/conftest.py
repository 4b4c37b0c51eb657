"""Shared fixtures: throwaway packs as real installed distributions."""

from __future__ import annotations

import itertools
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import opreg.packs.packcache
import opreg.packs.plugins
import opreg.registry.targets

_counter = itertools.count()


def write_pack(
    root: Path,
    name: str,
    body: str,
    *,
    dist: str | None = None,
    version: str = "0.1",
    header: str = "import opreg\nOPREG_API_VERSION = 1\n",
    attr: str | None = None,
) -> str:
    """Write a distribution with one module and an ``opreg.plugins`` entry point
    (naming the module, or its attribute ``attr``).

    Returns the (unique) module name. The module text is ``header`` + ``body``.
    """
    module = f"opreg_testpack_{name}_{next(_counter)}"
    dist = dist or f"opreg-testpack-{name}"
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(header + textwrap.dedent(body))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    target = f"{module}:{attr}" if attr else module
    (info / "entry_points.txt").write_text(f"[opreg.plugins]\n{name} = {target}\n")
    return module


@pytest.fixture
def make_pack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Create throwaway packs on ``sys.path`` for one test; caches are reset around it."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    opreg.packs.plugins.clear_cache()

    def make(name: str, body: str = "", **kwargs) -> str:
        module = write_pack(root, name, body, **kwargs)
        opreg.packs.plugins.clear_cache()
        return module

    make.root = root  # type: ignore[attr-defined]
    yield make
    opreg.packs.plugins.clear_cache()
    for mod in [m for m in sys.modules if m.startswith("opreg_testpack_")]:
        del sys.modules[mod]


@pytest.fixture(autouse=True, scope="session")
def _opreg_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """opreg's per-user cache in a folder of the session's, not the home of whoever runs the suite."""
    patch = pytest.MonkeyPatch()
    patch.setenv(opreg.registry.targets.CACHE_ENV, str(tmp_path_factory.mktemp("opreg-cache")))
    yield
    patch.undo()


@pytest.fixture(autouse=True, scope="session")
def _interruptible_children() -> None:
    """The tests that interrupt a child (test_save, test_llm_folder) need its SIGINT to raise
    KeyboardInterrupt. A run started where SIGINT is ignored (a shell's background job, nohup) would
    pass that on: an ignored signal stays ignored across exec, and the child would sleep through the
    test's signal. So SIGINT is Python's own in this process for the session (a handler is reset to
    the default in a child)."""
    import signal

    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def _no_autoload_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start with autoload on, whatever the calling shell has set."""
    monkeypatch.delenv(opreg.packs.plugins.AUTOLOAD_ENV, raising=False)


@pytest.fixture(autouse=True)
def _own_pack_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test has its own, empty cache of what packs declare (never the user's), turned on."""
    monkeypatch.setenv(opreg.packs.packcache.CACHE_ENV, str(tmp_path_factory.mktemp("opreg-cache")))
    monkeypatch.delenv(opreg.packs.packcache.NO_CACHE_ENV, raising=False)


@pytest.fixture(scope="session")
def transformersjs() -> Path:
    """transformers.js's folder (tests/transformersjs_runtime.py: ``OPREG_TJS_DIR``, or npm installs it
    into build/tjs once). Skipped, with the reason, where node or npm is missing; a failure instead
    when ``OPREG_REQUIRE_TJS=1`` (CI sets it once it has installed node)."""
    from tests import transformersjs_runtime

    reason = transformersjs_runtime.missing()
    if reason and os.environ.get("OPREG_REQUIRE_TJS") == "1":
        pytest.fail(f"OPREG_REQUIRE_TJS=1 but {reason}")
    if reason:
        pytest.skip(reason)
    return transformersjs_runtime.install()
