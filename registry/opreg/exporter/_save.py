"""Saving a model so that the file on disk is always usable.

A model with external data is two files. Replacing them one after the other
leaves an instant (or, after a crash, forever) where the old model reads the
new weights: ONNX Runtime loads such a pair without complaint and computes
wrong answers. So every save writes its weights to a data file of a new name
(``model.onnx.<token>.data``) that only the new model references:

1. write the model and its data into a hidden staging folder beside the target;
2. move the data file into place (no file the old model reads is touched);
3. move the model file over the old one (one atomic rename: the switch);
4. remove the data file the old model referenced.

At every instant the target path holds the complete old pair or the complete
new one. SIGTERM is turned into ``KeyboardInterrupt`` for the duration, so it
cleans up like Ctrl-C; after a SIGKILL the next save in that folder removes
the staging folders and unreferenced data files that crashed saves left.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

from opreg.errors import ExportError, SaveError

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".opreg-staging-"
"""Hidden staging folders are named ``.opreg-staging-<pid>-<random>``."""
_STAGING = re.compile(rf"^{re.escape(STAGING_PREFIX)}(?P<pid>\d+)-")
DATA_SUFFIX = ".data"
_TOKEN_BYTES = 4
PAUSE_ENV = "OPREG_SAVE_PAUSE"
"""For tests of interrupts: ``staged``, ``data-moved`` or ``model-moved`` makes
:func:`save_model` print a line to stderr and wait there for a signal."""


def data_file_pattern(model_name: str) -> re.Pattern[str]:
    """Data files a save of ``model_name`` writes: ``<model_name>.<8 hex digits>.data``."""
    return re.compile(rf"^{re.escape(model_name)}\.[0-9a-f]{{{2 * _TOKEN_BYTES}}}{re.escape(DATA_SUFFIX)}$")


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """The file a model will be written to (a symlink is followed), or a
    :class:`SaveError` saying why it cannot be: checked before an export starts."""
    given = Path(path)
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    if target.name in ("", ".", ".."):
        raise SaveError(f"cannot save to {given}: give a file name such as model.onnx")
    if target.is_dir():
        raise SaveError(f"cannot save to {given}: it is a directory; give a file name such as {given / 'model.onnx'}")
    parent = target.parent
    if not parent.exists():
        raise SaveError(f"cannot save to {given}: directory {parent} does not exist; create it first")
    if not parent.is_dir():
        raise SaveError(f"cannot save to {given}: {parent} is not a directory")
    if target.exists() and not target.is_file():
        raise SaveError(f"cannot save to {given}: it exists and is not a regular file")
    try:  # the one sure test: permissions, read-only mounts and /proc all fail here
        with tempfile.TemporaryFile(dir=parent, prefix=STAGING_PREFIX):
            pass
    except OSError as e:
        raise _save_error(target, e) from e
    return target


def save_model(model: ir.Model, path: str | os.PathLike[str], *, external_data: bool, check: bool) -> Path:
    """Write ``model`` to ``path`` (weights to a side file when ``external_data``)
    as described in the module docstring; returns the model's path.

    ``check`` runs ``onnx.checker.check_model(full_check=True)`` on the written
    file before it replaces anything. Raises :class:`SaveError` (nothing is
    changed at ``path``) when the location cannot be written.
    """
    target = check_output_path(path)
    if external_data and Path(path).is_symlink():
        raise SaveError(
            f"cannot save to {path} with external data: it is a symbolic link, and runtimes look for a model's "
            f"data beside the path they open, so the pair would not load through the link; save to {target}"
        )
    folder = target.parent
    remove_stale_staging(folder)
    data_name = f"{target.name}.{secrets.token_hex(_TOKEN_BYTES)}{DATA_SUFFIX}" if external_data else None
    with _terminate_as_interrupt(), _staging(folder, target) as scratch:
        staged = scratch / target.name
        try:
            if data_name is None:
                ir.save(model, staged)
            else:
                ir.save(model, staged, external_data=data_name)
        except OSError as e:
            raise _save_error(target, e) from e
        _pause("staged")
        if check:
            try:
                onnx.checker.check_model(str(staged), full_check=True)
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
                raise ExportError(f"not saving {target}: the model is not valid ONNX: {e}") from e
        written = scratch / data_name if data_name else None
        new_refs = {data_name} if written is not None and written.is_file() and written.stat().st_size else set()
        with _folder_lock(folder):
            old_refs = referenced_data(target) if _has_data_files(folder, target.name) else set()
            try:
                for name in new_refs:
                    os.replace(scratch / name, folder / name)
                _fsync(folder)
                _pause("data-moved")
                os.replace(staged, target)
                _fsync(folder)
            except OSError as e:
                for name in new_refs - old_refs:
                    with contextlib.suppress(OSError):
                        (folder / name).unlink()
                raise _save_error(target, e) from e
            _pause("model-moved")
            _remove_old_data(folder, target.name, old_refs, new_refs)
    return target


def referenced_data(model_path: Path) -> set[str]:
    """The external data files ``model_path`` references (``set()`` if it does not exist)."""
    if not model_path.is_file():
        return set()
    try:
        proto = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # not a model we can read: it references nothing we know of
        return set()
    found = set()
    for tensor in iter_tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    found.add(entry.value)
    return found


def iter_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of ``graph``: initializers, and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            if attr.HasField("g"):
                yield from iter_tensors(attr.g)
            for sub in attr.graphs:
                yield from iter_tensors(sub)


def _has_data_files(folder: Path, model_name: str) -> bool:
    pattern = data_file_pattern(model_name)
    legacy = f"{model_name}{DATA_SUFFIX}"
    return any(p.name == legacy or pattern.match(p.name) for p in folder.iterdir())


def _remove_old_data(folder: Path, model_name: str, old_refs: set[str], new_refs: set[str]) -> None:
    """Remove what the replaced model referenced, and data files of earlier saves of this
    model that nothing references (a crash between the switch and this clean-up)."""
    pattern = data_file_pattern(model_name)
    doomed = {name for name in old_refs if "/" not in name and os.sep not in name}
    doomed |= {p.name for p in folder.iterdir() if pattern.match(p.name)}
    for name in sorted(doomed - new_refs):
        try:
            (folder / name).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("could not remove the replaced data file %s: %s", folder / name, e)


def remove_stale_staging(folder: Path) -> None:
    """Remove staging folders of saves whose process no longer runs (killed mid-save)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _STAGING.match(entry.name)
        if match is None or not entry.is_dir() or _alive(int(match["pid"])):
            continue
        logger.info("removing %s, left by a save that did not finish", entry)
        shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _staging(folder: Path, target: Path) -> Iterator[Path]:
    try:
        scratch = Path(tempfile.mkdtemp(dir=folder, prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
    except OSError as e:
        raise _save_error(target, e) from e
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _save_error(target: Path, error: OSError) -> SaveError:
    if error.errno == errno.ENOSPC:
        return SaveError(f"cannot write {target}: no space left on the device; free some or choose another location")
    if error.errno == errno.ENAMETOOLONG:
        return SaveError(f"cannot write {target}: the file name is too long; choose a shorter one")
    reason = os.strerror(error.errno).lower() if error.errno else str(error)
    return SaveError(
        f"cannot write {target}: cannot create files in {target.parent} ({reason}); choose a writable location"
    )


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Serialise the switch and clean-up of saves into one folder (POSIX ``flock``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fsync(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` (as SIGINT does), so a save cleans up either way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _pause(stage: str) -> None:
    if os.environ.get(PAUSE_ENV) == stage:
        sys.stderr.write(f"opreg: save paused at {stage}\n")
        sys.stderr.flush()
        time.sleep(120)
