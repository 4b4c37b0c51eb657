"""While an export runs, Python's collector leaves the long-lived objects alone (opreg/_heap.py),
and the process's collector is as it was once the export returns."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import opreg


class Small(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def _export(progress=None):
    return opreg.export(Small(), (torch.randn(2, 3),), target=18, progress=progress)


@pytest.fixture(autouse=True)
def _no_freeze_of_our_own():
    gc.unfreeze()  # a test before may have left none, but be sure
    yield
    gc.unfreeze()


def test_frozen_while_exporting_and_handed_back_after():
    seen: dict[str, int] = {}
    _export(progress=lambda stage: seen.setdefault(stage, gc.get_freeze_count()))
    assert seen["capture"] > 0 and seen["plan"] >= seen["capture"]  # the captured program joins them
    assert gc.get_freeze_count() == 0


def test_full_collections_are_rarer_while_exporting_and_the_thresholds_put_back():
    from opreg import _heap

    before = gc.get_threshold()
    gc.set_threshold(500, 7, 3)
    try:
        seen: list[tuple[int, int, int]] = []
        _export(progress=lambda stage: seen.append(gc.get_threshold()))
        assert set(seen) == {(500, 7, _heap.FULL_EVERY)}
        assert gc.get_threshold() == (500, 7, 3)
    finally:
        gc.set_threshold(*before)


def test_handed_back_when_the_export_fails():
    class Bad(torch.nn.Module):
        def forward(self, x):
            raise ValueError("broken forward")

    with pytest.raises(opreg.ExportError, match="broken forward"):
        opreg.export(Bad(), (torch.randn(1),), target=18)
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_is_left_as_it_is():
    gc.freeze()
    mine, threshold = gc.get_freeze_count(), gc.get_threshold()
    seen: list[int] = []
    _export(progress=lambda stage: seen.append(gc.get_freeze_count()))
    # nothing of the export's added to them (a few of theirs may be freed meanwhile) ...
    assert seen and max(seen) <= mine
    assert gc.get_freeze_count() > mine // 2  # ... and theirs not unfrozen
    assert gc.get_threshold() == threshold


def test_a_process_with_the_collector_off_is_left_as_it_is():
    gc.disable()
    try:
        seen: list[int] = []
        _export(progress=lambda stage: seen.append(gc.get_freeze_count()))
        assert seen and set(seen) == {0} and not gc.isenabled()
    finally:
        gc.enable()


def test_handed_back_only_when_the_last_of_several_threads_is_done():
    started, release = threading.Event(), threading.Event()

    def hold(stage: str) -> None:
        if stage == "finish":
            started.set()
            release.wait(60)

    slow = threading.Thread(target=_export, kwargs={"progress": hold})
    slow.start()
    assert started.wait(120)
    _export()  # starts and ends while the other is still running
    assert gc.get_freeze_count() > 0
    release.set()
    slow.join(120)
    assert gc.get_freeze_count() == 0


def test_the_opreg_command_freezes_its_objects_before_the_process_exits():
    """Python's shutdown would walk every object still tracked (over a second of CPU after a
    language model's export): ``opreg`` leaves them frozen, its atexit functions still run."""
    import subprocess
    import sys

    code = (
        "import atexit, gc, sys\n"
        "from opreg.cli import script\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
        "sys.argv = ['opreg', 'plugins']\n"
        "print('frozen before:', gc.get_freeze_count() > 0)\n"
        "sys.exit(script())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "frozen before: False" in done.stdout and "frozen at exit: True" in done.stdout


FULL_COLLECTIONS_AT = """
import gc, importlib, sys, threading
import opreg
import opreg._heap  # small, but compiled anew where bytecode is not written: its compilation alone may collect

keep = [[i] for i in range(100_000)]  # objects made to last: a full collection comes due
gc.set_threshold(100, 1, 1)
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "start" and info["generation"] == 2 else None)
{lookup}
print(len(full))
"""


@pytest.mark.parametrize(
    ("lookup", "expected"),
    [
        ("opreg.export", 0),  # the first lookup imports opreg.export's module, the collector off the heap
        ("opreg.ExportSettings", 0),
        ("importlib.import_module('opreg._export')", 1),  # the same import, outside: the full collection due runs
    ],
)
def test_the_first_lookup_of_export_leaves_a_full_collection_due_to_after_the_export(lookup, expected):
    """``opreg.export``'s module is imported when it is first looked up, before the export starts: a
    full collection the process has come due for (a quarter of a second of CPU after a language
    model's library and torch were imported) landed in that import. The lookup keeps the collector
    off the objects alive before it, as the export does (opreg/_heap.py); the import outside shows the
    collection was due."""
    import subprocess
    import sys

    code = FULL_COLLECTIONS_AT.format(lookup=lookup)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == expected
