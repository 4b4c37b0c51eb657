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
new one. The new model file and its data file get the replaced model file's
permissions (a new one the umask's), and a target that is a mount point is
refused before anything is written (a rename cannot replace it).

A save deletes only what opreg wrote for this path. The model records the
data file it owns under the metadata key :data:`OWNED_DATA_KEY`; a data file is
removed only when its name is one a save of this path writes, the model being
replaced names it as its own (or a crashed save's journal names it), and no
other file in the folder references it (a copy of the model keeps its data).
A model from elsewhere, whatever its external-data locations, loses nothing.

SIGTERM is turned into ``KeyboardInterrupt`` for the duration, so it cleans up
like Ctrl-C. An interrupt before the switch takes back the new data file (the
old pair stays, nothing of the new one is left) and goes on as a
``KeyboardInterrupt``; one at or after the switch lets the save finish its
clean-up and goes on as :class:`opreg.InterruptedAfterSave`, so the caller can
say truthfully that the new model is in place. The journal is removed when a
save's clean-up is done; if that clean-up is itself cut short (a second
interrupt), the journal stays in the staging folder.

Each save holds an exclusive ``flock`` on a file in its staging folder (not its
PID, which means nothing in another PID namespace, such as another container
sharing the volume); after a SIGKILL the lock is free, and the next save in that
folder removes the staging folder and the data files its journal names that
nothing references. A live save's folder is never removed.

Every ``OSError`` a save meets (a name too long, a full disk, a read-only
folder) becomes one :class:`opreg.SaveError` line; names the folder's file
system cannot hold are refused before anything is written.
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
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from opreg.errors import ExportError, InterruptedAfterSave, InvalidArgumentError, SaveError
from opreg.exporter._mounts import mounts_at_or_under

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".opreg-staging-"
"""Hidden staging folders are named ``.opreg-staging-<pid>-<random>``."""
LOCK_NAME = "lock"
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
INLINE_LIMIT_BYTES = 256
"""With external data, tensors of at most this many bytes stay inside the model file (onnx_ir's default)."""
_TOKEN_BYTES = 4
PAUSE_ENV = "OPREG_SAVE_PAUSE"
"""For tests of interrupts: stages among ``staged``, ``data-moved``, ``model-moved`` and
``settle`` (the clean-up after an interrupt), comma-separated, make :func:`save_model`
print a line to stderr and wait there for a signal (and ``folder-staged``,
``folder-swapped``: :func:`opreg.llm._folder.write_folder`)."""


def data_file_pattern(model_name: str) -> re.Pattern[str]:
    """Data files a save of ``model_name`` writes: ``<model_name>.<8 hex digits>.data``."""
    return re.compile(rf"^{re.escape(model_name)}\.[0-9a-f]{{{2 * _TOKEN_BYTES}}}{re.escape(DATA_SUFFIX)}$")


def check_output_path(path: str | os.PathLike[str], *, external_data: bool = False) -> Path:
    """The file a model will be written to (a symlink is followed), or a
    :class:`SaveError` saying why it cannot be: checked before an export starts.
    ``external_data``: the data file's name (``<name>.<8 hex>.data``) must fit too."""
    given = as_path(path)
    try:
        _check_name_length(given, given, external_data)
        target = Path(os.path.realpath(given)) if given.is_symlink() else given
        if target.name in ("", ".", ".."):
            raise SaveError(f"cannot save to {given}: give a file name such as model.onnx")
        if target != given:
            _check_name_length(given, target, external_data)
        if target.is_dir():
            raise SaveError(
                f"cannot save to {given}: it is a directory; give a file name such as {given / 'model.onnx'}"
            )
        parent = target.parent
        if not parent.exists():
            raise SaveError(f"cannot save to {given}: directory {parent} does not exist; create it first")
        if not parent.is_dir():
            raise SaveError(f"cannot save to {given}: {parent} is not a directory")
        if target.exists() and not target.is_file():
            raise SaveError(f"cannot save to {given}: it exists and is not a regular file")
        if target.exists() and target in mounts_at_or_under(target):
            raise SaveError(
                f"cannot save to {given}: it is a mount point (a file mounted there), which a save cannot replace by "
                f"a rename; save to another path, e.g. {target.parent / ('new-' + target.name)}"
            )
        # the one sure test: permissions, read-only mounts and /proc all fail here
        with tempfile.TemporaryFile(dir=parent, prefix=STAGING_PREFIX):
            pass
    except SaveError:
        raise
    except OSError as e:
        raise _save_error(given, e) from e
    return target


def as_path(path: Any) -> Path:
    """``path`` (a ``str``, ``bytes`` or ``os.PathLike``) as a :class:`Path`, or an
    :class:`InvalidArgumentError` saying what a path is."""
    if isinstance(path, (str, bytes, os.PathLike)):
        try:
            text = os.fsdecode(path)
        except (TypeError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"cannot use {path!r} as a file path: {e}") from e
        if not text:
            raise InvalidArgumentError("the path is empty: give a file name such as 'model.onnx'")
        if "\0" in text:
            raise InvalidArgumentError(
                f"the path {text!r} holds a NUL character, which no file name may hold: give a file name such as "
                "'model.onnx'"
            )
        return Path(text)
    raise InvalidArgumentError(
        f"a path is a str or a pathlib.Path such as 'model.onnx', got {type(path).__name__} {path!r}"
    )


def _check_name_length(given: Path, target: Path, external_data: bool) -> None:
    """Refuse a file name (or, with external data, a data file name) the folder's file system
    cannot hold, before anything is written."""
    limit = _name_max(target.parent)
    size = len(os.fsencode(target.name))
    if size > limit:
        raise SaveError(
            f"cannot save to {_short(given)}: the file name is {size} bytes, more than the {limit} the file system "
            "allows; choose a shorter one"
        )
    extra = len(f".{'0' * 2 * _TOKEN_BYTES}{DATA_SUFFIX}")
    if external_data and size + extra > limit:
        raise SaveError(
            f"cannot save to {_short(given)} with external data: the data file's name ({target.name[:20]}"
            f"....<8 hex digits>.data) would be {size + extra} bytes, more than the {limit} the file system allows; "
            f"choose a model file name of at most {limit - extra} bytes"
        )


def _name_max(folder: Path) -> int:
    """The longest file name, in bytes, ``folder``'s file system holds (255 when it cannot say)."""
    while True:
        try:
            return int(os.pathconf(folder, "PC_NAME_MAX"))
        except (OSError, ValueError):
            if folder == folder.parent:
                return 255
            folder = folder.parent


def _short(path: Path, keep: int = 60) -> str:
    """A path fit for a one-line message: a very long one is cut in the middle."""
    text = str(path)
    return text if len(text) <= 2 * keep else f"{text[:keep]}...{text[-keep:]}"


def save_model(model: ir.Model, path: str | os.PathLike[str], *, external_data: bool, check: bool) -> Path:
    """Write ``model`` to ``path`` (weights to a side file when ``external_data``)
    as described in the module docstring; returns the model's path.

    ``check`` runs ``onnx.checker.check_model(full_check=True)`` on the written
    file before it replaces anything. Raises :class:`SaveError` (nothing is
    changed at ``path``) for every ``OSError`` met before the switch. An interrupt
    (Ctrl-C, SIGTERM) before the switch leaves the old pair and raises
    ``KeyboardInterrupt``; one at or after the switch finishes the save and raises
    :class:`InterruptedAfterSave` (a ``KeyboardInterrupt``): the new pair is in place.
    """
    target = check_output_path(path, external_data=external_data)
    if external_data and as_path(path).is_symlink():
        raise SaveError(
            f"cannot save to {path} with external data: it is a symbolic link, and runtimes look for a model's "
            f"data beside the path they open, so the pair would not load through the link; save to {target}"
        )
    written: list[tuple[int, int]] = []  # the new model file's identity, once it is written
    try:
        _save(model, target, external_data, check, written)
    except SaveError:
        raise
    except OSError as e:
        raise _save_error(target, e) from e
    except KeyboardInterrupt as e:  # one that hit after the clean-up, in the last instructions of the save
        if not isinstance(e, InterruptedAfterSave) and written and file_id(target) == written[0]:
            raise InterruptedAfterSave(target) from e
        raise
    return target


def file_id(path: Path) -> tuple[int, int] | None:
    """Which file ``path`` is (a rename keeps it): device and inode, or ``None`` if none is there."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _save(model: ir.Model, target: Path, external_data: bool, check: bool, written: list[tuple[int, int]]) -> None:
    folder = target.parent
    remove_stale_staging(folder)
    data_name = f"{target.name}.{secrets.token_hex(_TOKEN_BYTES)}{DATA_SUFFIX}" if external_data else None
    with terminate_as_interrupt(), _staging(folder, target) as scratch:
        staged = scratch / target.name
        _write(model, staged, data_name)
        written.extend(filter(None, [file_id(staged)]))
        pause("staged")
        if check:
            try:
                onnx.checker.check_model(str(staged), full_check=True)
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
                raise ExportError(f"not saving {target}: the model is not valid ONNX: {e}") from e
        written = scratch / data_name if data_name else None
        new_refs = {data_name} if written is not None and written.is_file() and written.stat().st_size else set()
        keep_mode(target, [staged, *(scratch / name for name in new_refs)])
        with _folder_lock(folder):
            owned = owned_data(target)
            _write_journal(scratch, target.name, new_refs, owned)
            try:
                for name in new_refs:
                    os.replace(scratch / name, folder / name)
                _fsync(folder)
                pause("data-moved")
                os.replace(staged, target)  # the switch
                _fsync(folder)
                pause("model-moved")
                _remove_unreferenced(folder, target.name, owned - new_refs)
                (scratch / _JOURNAL_NAME).unlink()  # done: nothing is left for a later save to clean
            except BaseException as e:
                if _settle(folder, target, scratch, new_refs, owned):  # the new pair is in place
                    if isinstance(e, KeyboardInterrupt):
                        raise InterruptedAfterSave(target) from e
                    logger.warning("saved %s, but its clean-up failed: %s", target, e)
                    return
                raise


def keep_mode(old: Path, made: list[Path]) -> None:
    """Give the files ``made`` to replace the file ``old`` its permissions (a model and its data file):
    a save never makes readable what the file it replaces kept private. Nothing where ``old`` does
    not exist: a new file keeps what the umask gives it."""
    try:
        mode = stat.S_IMODE(os.stat(old).st_mode)
    except FileNotFoundError:
        return
    for path in made:
        os.chmod(path, mode)


def _settle(folder: Path, target: Path, scratch: Path, new_refs: set[str], owned: set[str]) -> bool:
    """After a fault or an interrupt between the journal and the end of the clean-up: whether
    the switch happened (the staged model was moved). Before it the new data files are taken
    back (the old pair stays); after it the old data file is removed. If this is interrupted
    too, the journal stays, and the next save in ``folder`` finishes the work."""
    switched = not (scratch / target.name).exists()
    try:
        pause("settle")
        if switched:
            _remove_unreferenced(folder, target.name, owned - new_refs)
        else:
            moved = {name for name in new_refs if (folder / name).exists()}  # new names: ours
            for name in moved - referenced_data(target):
                (folder / name).unlink()
        (scratch / _JOURNAL_NAME).unlink(missing_ok=True)
    except BaseException:  # a second interrupt: the journal is the record
        logger.info("left the journal in %s for the next save in %s", scratch, folder)
    return switched


def _write(model: ir.Model, path: Path, data_name: str | None) -> None:
    """``ir.save`` with :data:`OWNED_DATA_KEY` naming the data file (and only while saving)."""
    props = model.metadata_props
    previous = props.pop(OWNED_DATA_KEY, None)
    try:
        if data_name is None:
            ir.save(model, path)
        else:
            props[OWNED_DATA_KEY] = data_name
            ir.save(model, path, external_data=data_name, size_threshold_bytes=INLINE_LIMIT_BYTES)
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
        with stale_lock(entry) as stale:
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
def stale_lock(scratch: Path) -> Iterator[bool]:
    """Whether the save that made ``scratch`` is gone: its lock can be taken (and is held
    while the caller removes the folder)."""
    try:
        fd = os.open(scratch / LOCK_NAME, os.O_RDWR)
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
    """A new staging folder, locked while the save runs. Removed afterwards, unless its
    journal is still there (a clean-up did not finish): then only the journal and the lock
    file stay, for the next save in ``folder`` to act on once the lock is free."""
    try:
        scratch = Path(tempfile.mkdtemp(dir=folder, prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
        lock = os.open(scratch / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise _save_error(target, e) from e
    try:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the folder is gone: the save is alive
        yield scratch
    finally:
        try:
            if (scratch / _JOURNAL_NAME).exists():
                for entry in scratch.iterdir():
                    if entry.name not in (_JOURNAL_NAME, LOCK_NAME):
                        entry.unlink(missing_ok=True)
            else:
                shutil.rmtree(scratch, ignore_errors=True)
        finally:
            os.close(lock)


def _save_error(target: Path, error: OSError) -> SaveError:
    """One line for an ``OSError`` met while saving to ``target``: what happened, and what to do."""
    where = _short(target)
    code = error.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        why = "no space left on the device" if code == errno.ENOSPC else "the disk quota is used up"
        return SaveError(f"cannot write {where}: {why}; free some or choose another location")
    if code == errno.ENAMETOOLONG:
        return SaveError(f"cannot write {where}: the file name or path is too long; choose a shorter one")
    reason = os.strerror(code).lower() if code else (str(error) or type(error).__name__)
    if code in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR):
        return SaveError(
            f"cannot write {where}: cannot create files in {_short(target.parent)} ({reason}); "
            "choose a writable location"
        )
    return SaveError(f"cannot write {where}: {reason}; check the location and the device, or choose another location")


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
def terminate_as_interrupt() -> Iterator[None]:
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


def pause(stage: str) -> None:
    if stage in os.environ.get(PAUSE_ENV, "").split(","):
        sys.stderr.write(f"opreg: save paused at {stage}\n")
        sys.stderr.flush()
        time.sleep(120)
