"""Saving a model so that the file on disk is always usable.

A model with external data is two files. Replacing them one after the other
leaves an instant (or, after a crash, forever) where the old model reads the
new weights: ONNX Runtime loads such a pair without complaint and computes
wrong answers. So every save writes its weights to a data file of a new name
(``model.onnx.<token>.data``) that only the new model references:

1. write the model and its data into a hidden staging folder beside the target;
2. write a journal there naming the data file about to be moved in and the
   data file the old model owns, then move the data file into place (no file
   the old model reads is touched);
3. move the model file over the old one (one atomic rename: the switch);
4. remove the data file the old model owned.

At every instant the target path holds the complete old pair or the complete
new one.

A save deletes only what opreg wrote for this path. The model records the
data file it owns under the metadata key :data:`OWNED_DATA_KEY`; a data file is
removed only when its name is one a save of this path writes, the model being
replaced names it as its own (or a crashed save's journal names it), and no
other file in the folder references it (a copy of the model keeps its data).
A model from elsewhere, whatever its external-data locations, loses nothing.

SIGTERM is turned into ``KeyboardInterrupt`` for the duration, so it cleans up
like Ctrl-C. Each save holds an exclusive ``flock`` on a file in its staging
folder; after a SIGKILL the lock is free, and the next save in that folder
removes the staging folder and the data files its journal names that nothing
references. A live save's folder is never removed, whatever PID namespace it
runs in.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import mmap
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
_LOCK_NAME = "lock"
"""The file in a staging folder its save holds an exclusive ``flock`` on."""
_JOURNAL_NAME = "journal.json"
"""What a save moves into its folder: ``{"model": name, "added": [...], "replaced": [...]}``."""
_UNLOCKED_GRACE_SECONDS = 600
"""A staging folder without a lock file is a save's only for the instant between creating the
folder and its lock file (or one from an older opreg): younger than this, it is left alone."""
_SCAN_LIMIT = 1 << 30
"""Files larger than this are not searched for references to a data file (a model with
external data is small; a larger file is a data file or not a model)."""
OWNED_DATA_KEY = "opreg.external_data"
"""Model metadata: the data file this save wrote for the model (the only one a later save of
the same path may remove)."""
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
            _write(model, staged, data_name)
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
            owned = owned_data(target)
            _write_journal(scratch, target.name, new_refs, owned)
            try:
                for name in new_refs:
                    os.replace(scratch / name, folder / name)
                _fsync(folder)
                _pause("data-moved")
                os.replace(staged, target)
                _fsync(folder)
            except BaseException as e:  # before the switch the old pair stays: take back the new data
                moved = {name for name in new_refs if (folder / name).exists()}  # new names: ours
                for name in moved - referenced_data(target):  # (after the switch, the new model needs it)
                    with contextlib.suppress(OSError):
                        (folder / name).unlink()
                if isinstance(e, OSError):
                    raise _save_error(target, e) from e
                raise
            try:  # the new pair is in place: an interrupt from here on still removes the old data
                _pause("model-moved")
            finally:
                _remove_unreferenced(folder, target.name, owned - new_refs)
    return target


def _write(model: ir.Model, path: Path, data_name: str | None) -> None:
    """``ir.save`` with :data:`OWNED_DATA_KEY` naming the data file (and only while saving)."""
    props = model.metadata_props
    previous = props.pop(OWNED_DATA_KEY, None)
    try:
        if data_name is None:
            ir.save(model, path)
        else:
            props[OWNED_DATA_KEY] = data_name
            ir.save(model, path, external_data=data_name)
    finally:
        props.pop(OWNED_DATA_KEY, None)
        if previous is not None:
            props[OWNED_DATA_KEY] = previous


def owned_data(model_path: Path) -> set[str]:
    """The data file opreg wrote for the model at ``model_path``: the one its metadata names
    as its own, if the model references it and its name is one a save of this path writes.
    ``set()`` for a model from elsewhere, or when no such file lies beside it."""
    pattern = data_file_pattern(model_path.name)
    try:
        if not any(pattern.match(p.name) for p in model_path.parent.iterdir()):
            return set()  # cheap: no candidate, so the (maybe large) old model is not read
        proto = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # missing, unreadable or not a model: it owns nothing we may remove
        return set()
    owner = next((p.value for p in proto.metadata_props if p.key == OWNED_DATA_KEY), None)
    if owner is None or not pattern.match(owner):
        return set()
    return {owner} if owner in _locations(proto) else set()


def referenced_data(model_path: Path) -> set[str]:
    """The external data files ``model_path`` references (``set()`` if it does not exist)."""
    if not model_path.is_file():
        return set()
    try:
        proto = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # not a model we can read: it references nothing we know of
        return set()
    return _locations(proto)


def _locations(proto: onnx.ModelProto) -> set[str]:
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


def _remove_unreferenced(folder: Path, model_name: str, names: set[str]) -> None:
    """Remove the data files ``names`` (a save of ``model_name`` wrote them) unless the model at
    ``model_name`` or any other file in ``folder`` references them (a copy keeps its data)."""
    pattern = data_file_pattern(model_name)
    names = {n for n in names if pattern.match(n) and (folder / n).is_file()}
    if not names:
        return
    names -= referenced_data(folder / model_name)
    for name in sorted(names):
        if _referenced_elsewhere(folder, name, skip={model_name}):
            logger.info("keeping %s: another file in %s references it", name, folder)
            continue
        try:
            (folder / name).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("could not remove the replaced data file %s: %s", folder / name, e)


def _referenced_elsewhere(folder: Path, data_name: str, skip: set[str]) -> bool:
    """Whether a file in ``folder`` other than ``skip`` and data files holds ``data_name``
    (a model referencing it as an external-data location holds the name's bytes)."""
    needle = data_name.encode()
    for entry in folder.iterdir():
        if entry.name in skip or entry.name.endswith(DATA_SUFFIX) or entry.name.startswith(STAGING_PREFIX):
            continue
        try:
            if not entry.is_file() or not 0 < entry.stat().st_size <= _SCAN_LIMIT:
                continue
            with open(entry, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data.find(needle) != -1:
                    return True
        except (OSError, ValueError):
            continue
    return False


def _write_journal(scratch: Path, model_name: str, added: set[str], replaced: set[str]) -> None:
    journal = {"model": model_name, "added": sorted(added), "replaced": sorted(replaced)}
    (scratch / _JOURNAL_NAME).write_text(json.dumps(journal))


def remove_stale_staging(folder: Path) -> None:
    """Remove staging folders of saves that no longer run (killed mid-save), and the data
    files their journals name that nothing references. A folder whose save still holds its
    lock is left alone."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(STAGING_PREFIX) or not entry.is_dir() or entry.is_symlink():
            continue
        with _stale(entry) as stale:
            if not stale:
                continue
            logger.info("removing %s, left by a save that did not finish", entry)
            journal = _read_journal(entry)
            if journal is not None:
                model, added, replaced = journal
                _remove_unreferenced(folder, model, added | replaced)
            shutil.rmtree(entry, ignore_errors=True)


def _read_journal(scratch: Path) -> tuple[str, set[str], set[str]] | None:
    try:
        journal = json.loads((scratch / _JOURNAL_NAME).read_text())
        model = journal["model"]
        added, replaced = set(journal["added"]), set(journal["replaced"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(model, str) or "/" in model or os.sep in model:
        return None
    return model, {n for n in added if isinstance(n, str)}, {n for n in replaced if isinstance(n, str)}


@contextlib.contextmanager
def _stale(scratch: Path) -> Iterator[bool]:
    """Whether the save that made ``scratch`` is gone: its lock can be taken (and is held
    while the caller removes the folder)."""
    try:
        fd = os.open(scratch / _LOCK_NAME, os.O_RDWR)
    except FileNotFoundError:
        try:
            age = time.time() - scratch.stat().st_mtime
        except OSError:
            age = 0.0
        yield age > _UNLOCKED_GRACE_SECONDS
        return
    except OSError:
        yield False
        return
    try:
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False  # a live save holds it
            return
        yield True
    finally:
        os.close(fd)


@contextlib.contextmanager
def _staging(folder: Path, target: Path) -> Iterator[Path]:
    try:
        scratch = Path(tempfile.mkdtemp(dir=folder, prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
        lock = os.open(scratch / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise _save_error(target, e) from e
    try:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the folder is gone: the save is alive
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.close(lock)


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
