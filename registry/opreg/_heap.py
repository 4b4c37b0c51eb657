"""Python's cyclic garbage collector while an export runs.

An export runs in a process that already holds millions of objects (torch, sympy, the model's
library, the model) and makes many more as it imports and captures. Each full collection walks
every one of them: at the default thresholds a cold export of a small CNN spent a third of its
CPU time in the collector, and ``torch.export`` alone a quarter (``bench/capture_overhead.py``).

While an export runs, the objects alive when it started are moved to the collector's permanent
generation (``gc.freeze``); :func:`settle` moves there too what the export has made to last (the
modules it imported, the registry, the captured program). When the last export running in the
process ends, they are handed back (``gc.unfreeze``) and are collected as before: nothing is kept
that would have been freed, it is only not walked again and again while the export runs.

Freezing shrinks what the collector counts as long-lived, and Python starts a full collection when
the objects made since the last one exceed a quarter of that: a capture of 256 stacked blocks still
spent 0.8 s of CPU in full collections of its own objects. So while exports run, a full collection
waits for :data:`FULL_EVERY` collections of the middle generation (Python's default is 10); the
thresholds are put back with the heap. Measured, peak memory did not change.

``opreg``'s names are imported on first use (PEP 562) inside :func:`quiet` too: ``opreg.export``'s
first lookup imports its module before the export starts, and a full collection the caller's
process has come due for would otherwise run there.

A process that froze objects of its own (``gc.get_freeze_count() > 0``: a forking server, say) or
turned the collector off is left exactly as it is.

A process about to exit (the ``opreg`` command, once its command is done) calls :func:`exiting`:
Python's shutdown collects every object it still tracks, over a second of CPU time after an
export of a language model (a million objects of torch, transformers, sympy and the program),
to free memory the system frees at the exit anyway.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

FULL_EVERY = 100
"""While exports run: collections of the middle generation per full collection (at least)."""


class _Exports:
    """The exports running in this process (threads may export at once), and whether the first
    of them froze the heap (so the last hands it back)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.frozen = False
        self.thresholds: tuple[int, int, int] | None = None


_EXPORTS = _Exports()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep the collector off the objects that outlive the export, for the ``with`` block."""
    state = _EXPORTS
    with state.lock:
        if state.running == 0:
            state.frozen = gc.isenabled() and gc.get_freeze_count() == 0
            if state.frozen:
                gc.freeze()
                young, middle, full = state.thresholds = gc.get_threshold()
                gc.set_threshold(young, middle, max(full, FULL_EVERY))
        state.running += 1
    try:
        yield
    finally:
        with state.lock:
            state.running -= 1
            if state.running == 0 and state.frozen:
                gc.unfreeze()
                if state.thresholds is not None:
                    gc.set_threshold(*state.thresholds)
                state.frozen, state.thresholds = False, None


def settle() -> None:
    """Inside :func:`quiet`: what exists now lasts until the export ends; stop walking it.
    The young garbage is collected first, so it is not kept until then."""
    state = _EXPORTS
    with state.lock:
        if state.running and state.frozen:
            gc.collect(1)
            gc.freeze()


def exiting() -> None:
    """The process is about to exit: move every object to the permanent generation, so the
    interpreter's shutdown does not walk them (their memory goes back with the process; ``atexit``
    functions and flushes run as before)."""
    gc.freeze()
